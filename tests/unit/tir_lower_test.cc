// Lowering and schedules checked numerically: every kernel is lowered under the
// naive schedule, the default schedule, hand-written and random legal
// schedules, run through the loop-IR interpreter, and compared with a direct
// C++ computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <limits>
#include <functional>

#include "tir/interpret.h"
#include "tir/winograd.h"
#include "tir/schedule.h"

namespace kiln::tir {
namespace {

using Env = std::map<std::string, int64_t, std::less<>>;

const DType f32 = DType::kFloat32;

Expr ld(const std::string& name, int index, std::vector<Expr> idx, DType t = f32) {
  return load(name, index, t, std::move(idx));
}

Buffer buf(std::string name, std::vector<Expr> shape, DType t = f32) {
  return Buffer{std::move(name), t, std::move(shape)};
}

ComputeDef stage(std::string name, std::vector<std::string> axes, std::vector<Expr> shape, Expr body,
                 DType t = f32) {
  ComputeDef d;
  d.name = std::move(name);
  d.dtype = t;
  d.axes = std::move(axes);
  d.shape = std::move(shape);
  d.body = std::move(body);
  return d;
}

ComputeDef reduce_stage(std::string name, std::vector<std::string> axes, std::vector<Expr> shape,
                        std::vector<std::string> raxes, std::vector<Expr> rext, Combiner c,
                        Expr body, DType t = f32) {
  ComputeDef d = stage(std::move(name), std::move(axes), std::move(shape), std::move(body), t);
  d.reduce_axes = std::move(raxes);
  d.reduce_extents = std::move(rext);
  d.combiner = c;
  return d;
}

// Host data for every param of a kernel, as float or int32 values.
struct HostData {
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<int64_t> sizes;
};

int64_t numel(const Buffer& b, const Env& env) {
  int64_t n = 1;
  for (const Expr& d : b.shape) {
    auto v = evaluate(d, env);
    KILN_CHECK(v.is_ok()) << v.status().to_string();
    n *= v.value();
  }
  return n;
}

// Fills inputs deterministically from `seed`, outputs with a NaN / sentinel pattern.
HostData make_inputs(const KernelDef& k, const Env& env, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uf(-2.0f, 2.0f);
  std::uniform_int_distribution<int32_t> ui(-50, 50);
  HostData r;
  for (size_t p = 0; p < k.params.size(); ++p) {
    const Buffer& b = k.params[p];
    int64_t n = numel(b, env);
    r.sizes.push_back(n);
    std::vector<unsigned char> data(static_cast<size_t>(n * dtype_size(b.dtype)), 0xff);
    if (static_cast<int>(p) < k.num_inputs) {
      for (int64_t i = 0; i < n; ++i) {
        if (b.dtype == f32) {
          float v = uf(rng);
          std::memcpy(data.data() + i * 4, &v, 4);
        } else {
          int32_t v = ui(rng);
          std::memcpy(data.data() + i * 4, &v, 4);
        }
      }
    }
    r.bytes.push_back(std::move(data));
  }
  return r;
}

std::vector<float> as_floats(const std::vector<unsigned char>& b) {
  std::vector<float> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::vector<int32_t> as_ints(const std::vector<unsigned char>& b) {
  std::vector<int32_t> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Lowers and interprets; returns the params' bytes after the run.
Result<HostData> run_kernel(const KernelDef& k, const Schedule& s, const Env& env, uint32_t seed) {
  KILN_ASSIGN_OR_RETURN(PrimFunc f, lower(k, s));
  HostData r = make_inputs(k, env, seed);
  std::vector<void*> ptrs;
  for (auto& b : r.bytes) ptrs.push_back(b.data());
  std::vector<int64_t> syms;
  for (const auto& name : f.sym_names) {
    auto it = env.find(name);
    if (it == env.end()) return invalid_argument() << "test: no value for sym " << name;
    syms.push_back(it->second);
  }
  Status st = interpret(f, ptrs, syms);
  if (!st.is_ok()) return st.with_context(print_func(f));
  return r;
}

// A C++ reference: given the inputs (as floats), returns each output's values.
using Reference = std::function<std::vector<std::vector<float>>(const HostData&)>;

void expect_matches(const KernelDef& k, const Schedule& s, const Env& env, const Reference& ref,
                    uint32_t seed = 7) {
  SCOPED_TRACE("schedule:\n" + s.to_string());
  auto r = run_kernel(k, s, env, seed);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<std::vector<float>> want = ref(*r);
  ASSERT_EQ(want.size(), k.params.size() - static_cast<size_t>(k.num_inputs));
  for (size_t o = 0; o < want.size(); ++o) {
    size_t p = static_cast<size_t>(k.num_inputs) + o;
    std::vector<float> got;
    if (k.params[p].dtype == f32) {
      got = as_floats(r->bytes[p]);
    } else {
      for (int32_t v : as_ints(r->bytes[p])) got.push_back(static_cast<float>(v));
    }
    ASSERT_EQ(got.size(), want[o].size());
    for (size_t i = 0; i < got.size(); ++i) {
      float tol = 1e-5f * std::max(1.0f, std::fabs(want[o][i]));
      ASSERT_NEAR(got[i], want[o][i], tol) << "output " << k.params[p].name << " element " << i;
    }
  }
}

// ---- kernels ----------------------------------------------------------------

// C[i, j] = A[i, j] + B[j]
KernelDef add_broadcast(Expr n, Expr m) {
  KernelDef k;
  k.name = "add_bcast";
  k.params = {buf("A", {n, m}), buf("B", {m}), buf("C", {n, m})};
  k.num_inputs = 2;
  k.stages = {stage("C", {"i", "j"}, {n, m},
                    ld("A", 0, {var("i"), var("j")}) + ld("B", 1, {var("j")}))};
  return k;
}

std::vector<std::vector<float>> add_broadcast_ref(const HostData& r, int64_t n, int64_t m) {
  auto a = as_floats(r.bytes[0]), b = as_floats(r.bytes[1]);
  std::vector<float> c(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) c[i * m + j] = a[i * m + j] + b[j];
  }
  return {c};
}

// t1 = A * 2; t2 = t1 - B; Out = exp(max(t2, 0.5))
KernelDef chain(Expr n, Expr m) {
  KernelDef k;
  k.name = "chain";
  k.params = {buf("A", {n, m}), buf("B", {n, m}), buf("Out", {n, m})};
  k.num_inputs = 2;
  Expr i = var("i"), j = var("j");
  k.stages = {
      stage("t1", {"i", "j"}, {n, m}, ld("A", 0, {i, j}) * float_imm(2.0)),
      stage("t2", {"i", "j"}, {n, m}, ld("t1", -1, {i, j}) - ld("B", 1, {i, j})),
      stage("Out", {"i", "j"}, {n, m},
            call("exp", f32, {max(ld("t2", -1, {i, j}), float_imm(0.5))})),
  };
  return k;
}

std::vector<std::vector<float>> chain_ref(const HostData& r) {
  auto a = as_floats(r.bytes[0]), b = as_floats(r.bytes[1]);
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    float t2 = a[i] * 2.0f - b[i];
    out[i] = static_cast<float>(std::exp(static_cast<double>(std::max(t2, 0.5f))));
  }
  return {out};
}

// C[i, j] = sum_k A[i, k] * B[k, j]
KernelDef matmul(Expr m, Expr n, Expr kk) {
  KernelDef k;
  k.name = "matmul";
  k.params = {buf("A", {m, kk}), buf("B", {kk, n}), buf("C", {m, n})};
  k.num_inputs = 2;
  k.stages = {reduce_stage("C", {"i", "j"}, {m, n}, {"k"}, {kk}, Combiner::kSum,
                           ld("A", 0, {var("i"), var("k")}) * ld("B", 1, {var("k"), var("j")}))};
  return k;
}

std::vector<std::vector<float>> matmul_ref(const HostData& r, int64_t m, int64_t n, int64_t kk) {
  auto a = as_floats(r.bytes[0]), b = as_floats(r.bytes[1]);
  std::vector<float> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < kk; ++k) acc += a[i * kk + k] * b[k * n + j];
      c[i * n + j] = acc;
    }
  }
  return {c};
}

// mx[i] = max_k X[i, k]; e[i, j] = exp(X[i, j] - mx[i]); s[i] = sum_k e[i, k];
// Y[i, j] = e[i, j] / s[i]; Mean[i] = (sum_k X[i, k]) / cols (a finalize).
KernelDef softmax(Expr rows, Expr cols) {
  KernelDef k;
  k.name = "softmax";
  k.params = {buf("X", {rows, cols}), buf("Y", {rows, cols}), buf("Mean", {rows})};
  k.num_inputs = 1;
  Expr i = var("i"), j = var("j"), kv = var("k");
  ComputeDef mean = reduce_stage("Mean", {"i"}, {rows}, {"k"}, {cols}, Combiner::kSum,
                                 ld("X", 0, {i, kv}));
  mean.finalize = div(var("acc", f32), cast(f32, cols));
  k.stages = {
      reduce_stage("mx", {"i"}, {rows}, {"k"}, {cols}, Combiner::kMax, ld("X", 0, {i, kv})),
      stage("e", {"i", "j"}, {rows, cols},
            call("exp", f32, {ld("X", 0, {i, j}) - ld("mx", -1, {i})})),
      reduce_stage("s", {"i"}, {rows}, {"k"}, {cols}, Combiner::kSum, ld("e", -1, {i, kv})),
      stage("Y", {"i", "j"}, {rows, cols}, div(ld("e", -1, {i, j}), ld("s", -1, {i}))),
      mean,
  };
  return k;
}

std::vector<std::vector<float>> softmax_ref(const HostData& r, int64_t rows, int64_t cols) {
  auto x = as_floats(r.bytes[0]);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    float mx = -INFINITY, s = 0.0f, sum = 0.0f;
    for (int64_t k = 0; k < cols; ++k) mx = std::max(mx, x[i * cols + k]);
    std::vector<float> e(static_cast<size_t>(cols));
    for (int64_t k = 0; k < cols; ++k) {
      e[k] = static_cast<float>(std::exp(static_cast<double>(x[i * cols + k] - mx)));
      s += e[k];
      sum += x[i * cols + k];
    }
    for (int64_t j = 0; j < cols; ++j) y[i * cols + j] = e[j] / s;
    mean[i] = sum / static_cast<float>(cols);
  }
  return {y, mean};
}

// Int32: Out[b, i] = min over (r, q) of (A[b, i, r] * 3 + q) floordiv 4 - (A[b, i, r] mod 5)
KernelDef int_reduce(Expr nb, Expr ni, Expr nr, Expr nq) {
  const DType i32 = DType::kInt32;
  KernelDef k;
  k.name = "int_reduce";
  k.params = {buf("A", {nb, ni, nr}, i32), buf("Out", {nb, ni}, i32)};
  k.num_inputs = 1;
  Expr a = ld("A", 0, {var("b"), var("i"), var("r")}, i32);
  Expr body = floordiv(a * int_imm(3, i32) + cast(i32, var("q")), int_imm(4, i32)) -
              mod(a, int_imm(5, i32));
  k.stages = {reduce_stage("Out", {"b", "i"}, {nb, ni}, {"r", "q"}, {nr, nq}, Combiner::kMin, body,
                           i32)};
  return k;
}

std::vector<std::vector<float>> int_reduce_ref(const HostData& r, int64_t nb, int64_t ni, int64_t nr,
                                               int64_t nq) {
  auto a = as_ints(r.bytes[0]);
  auto fdiv = [](int32_t x, int32_t y) {
    int32_t q = x / y;
    return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
  };
  auto fmod_ = [](int32_t x, int32_t y) {
    int32_t m = x % y;
    return (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
  };
  std::vector<float> out;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < ni; ++i) {
      int32_t acc = std::numeric_limits<int32_t>::max();
      for (int64_t rr = 0; rr < nr; ++rr) {
        for (int64_t q = 0; q < nq; ++q) {
          int32_t v = a[(b * ni + i) * nr + rr];
          acc = std::min(acc, fdiv(v * 3 + static_cast<int32_t>(q), 4) - fmod_(v, 5));
        }
      }
      out.push_back(static_cast<float>(acc));
    }
  }
  return {out};
}

// ---- random legal schedules ---------------------------------------------------

bool is_reduction(const ComputeDef& st) { return st.combiner != Combiner::kNone; }

Schedule random_schedule(const KernelDef& k, std::mt19937& rng) {
  auto coin = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  std::set<std::string> params;
  for (const auto& b : k.params) params.insert(b.name);
  Schedule s;
  auto add = [&](std::string kind, const std::string& st, std::vector<std::string> axes,
                 int64_t factor = 0) {
    s.prims.push_back(Primitive{std::move(kind), st, std::move(axes), factor});
  };
  for (const ComputeDef& st : k.stages) {
    if (!params.count(st.name) && !is_reduction(st) && coin(50)) {
      add("inline", st.name, {});
      continue;
    }
    std::vector<std::string> sp = st.axes, rd = st.reduce_axes;
    auto split_some = [&](std::vector<std::string>& loops) {
      for (int t = 0; t < 2; ++t) {
        if (loops.empty() || !coin(60)) continue;
        size_t pos = rng() % loops.size();
        std::string a = loops[pos];
        int64_t factor = 1 + static_cast<int64_t>(rng() % 7);
        add("split", st.name, {a}, factor);
        loops[pos] = a + ".o";
        loops.insert(loops.begin() + static_cast<long>(pos) + 1, a + ".i");
      }
    };
    split_some(sp);
    split_some(rd);
    if (sp.size() >= 2 && coin(60)) {
      std::shuffle(sp.begin(), sp.end(), rng);
      add("reorder", st.name, sp);
    }
    if (rd.size() >= 2 && coin(60)) {
      std::shuffle(rd.begin(), rd.end(), rng);
      add("reorder", st.name, rd);
    }
    size_t cache_pos = sp.size();  // spatial loops after this one are inside the cache
    if (is_reduction(st) && !sp.empty() && coin(60)) {
      cache_pos = rng() % sp.size();
      add("cache_write", st.name, {sp[cache_pos]});
    }
    bool vectorized = false;
    bool can_vectorize = !sp.empty() && (!is_reduction(st) || cache_pos + 1 < sp.size());
    if (can_vectorize && coin(70)) {
      add("vectorize", st.name, {sp.back()});
      vectorized = true;
    }
    if (!sp.empty() && !(vectorized && sp.size() == 1) && coin(60)) {
      add("parallel", st.name, {sp[0]});
    }
    if (!rd.empty() && coin(50)) add("unroll", st.name, {rd.back()});
    if (sp.size() >= 3 && coin(50)) add("unroll", st.name, {sp[1]});
  }
  return s;
}

// ---- tests ------------------------------------------------------------------

TEST(TirLower, ElementwiseBroadcastAllSchedules) {
  KernelDef k = add_broadcast(5, 7);
  auto ref = [](const HostData& r) { return add_broadcast_ref(r, 5, 7); };
  expect_matches(k, naive_schedule(k), {}, ref);
  expect_matches(k, default_schedule(k), {}, ref);
  auto s = parse_schedule("split(C, j, 3)\nreorder(C, j.o, i, j.i)\nvectorize(C, j.i)\nparallel(C, j.o)\n");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  expect_matches(k, *s, {}, ref);
  std::mt19937 rng(1);
  for (int t = 0; t < 30; ++t) expect_matches(k, random_schedule(k, rng), {}, ref, t);
}

TEST(TirLower, ChainOfThreeStagesFusedAndMaterialized) {
  KernelDef k = chain(6, 9);
  expect_matches(k, naive_schedule(k), {}, chain_ref);
  expect_matches(k, default_schedule(k), {}, chain_ref);
  // The default schedule inlines both intermediates: one loop nest, no allocation.
  auto f = lower(k, default_schedule(k));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  EXPECT_EQ(text.find("allocate"), std::string::npos) << text;
  EXPECT_EQ(text.find("t1"), std::string::npos) << text;
  // Naive: both intermediates allocated.
  auto g = lower(k, naive_schedule(k));
  ASSERT_TRUE(g.is_ok());
  EXPECT_NE(print_func(*g).find("allocate t1:f32[6, 9]"), std::string::npos) << print_func(*g);
  std::mt19937 rng(2);
  for (int t = 0; t < 30; ++t) expect_matches(k, random_schedule(k, rng), {}, chain_ref, t);
}

// C[i, j] = A[j, i] (square): reads A away from the point it writes.
KernelDef transpose_square(int64_t n) {
  KernelDef k;
  k.name = "transpose";
  k.params = {buf("A", {n, n}), buf("C", {n, n})};
  k.num_inputs = 1;
  k.stages = {stage("C", {"i", "j"}, {n, n}, ld("A", 0, {var("j"), var("i")}))};
  return k;
}

// The output written over input `in` (one buffer passed for both) under
// `s`: it must equal the reference computed from the untouched inputs.
void expect_in_place_matches(const KernelDef& k, int in, const Schedule& s, const Reference& ref, uint32_t seed) {
  SCOPED_TRACE("in place over param " + std::to_string(in) + ", schedule:\n" + s.to_string());
  auto f = lower(k, s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  HostData r = make_inputs(k, {}, seed);
  const HostData original = r;
  std::vector<void*> ptrs;
  for (auto& b : r.bytes) ptrs.push_back(b.data());
  const size_t out = k.params.size() - 1;
  ptrs[out] = ptrs[static_cast<size_t>(in)];
  ASSERT_TRUE(interpret(*f, ptrs, {}).is_ok());
  std::vector<float> want = ref(original)[0];
  std::vector<float> got = as_floats(r.bytes[static_cast<size_t>(in)]);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::fabs(want[i]))) << "element " << i;
}

TEST(TirInPlace, PointwiseKernelsOnlyAndEverySchedule) {
  using Pairs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(in_place_pairs(add_broadcast(5, 7)), (Pairs{{0, 2}}));  // B is broadcast: not its size
  EXPECT_EQ(in_place_pairs(chain(6, 9)), (Pairs{{0, 2}, {1, 2}}));
  EXPECT_TRUE(in_place_pairs(transpose_square(6)).empty());
  EXPECT_TRUE(in_place_pairs(matmul(4, 4, 4)).empty());
  EXPECT_TRUE(in_place_pairs(softmax(4, 8)).empty());
  // A per-channel factor stage that does not read A is free; a row sum of A is not.
  KernelDef scaled;
  scaled.name = "scaled";
  scaled.params = {buf("A", {4, 8}), buf("B", {8}), buf("C", {4, 8})};
  scaled.num_inputs = 2;
  scaled.stages = {stage("f", {"j"}, {8}, ld("B", 1, {var("j")}) * float_imm(2.0)),
                   stage("C", {"i", "j"}, {4, 8}, ld("A", 0, {var("i"), var("j")}) * ld("f", -1, {var("j")}))};
  EXPECT_EQ(in_place_pairs(scaled), (Pairs{{0, 2}}));
  KernelDef centered = scaled;
  centered.stages = {reduce_stage("m", {"i"}, {4}, {"r"}, {8}, Combiner::kSum, ld("A", 0, {var("i"), var("r")})),
                     stage("C", {"i", "j"}, {4, 8}, ld("A", 0, {var("i"), var("j")}) - ld("m", -1, {var("i")}))};
  EXPECT_TRUE(in_place_pairs(centered).empty());
  std::mt19937 rng(11);
  for (int in : {0, 1}) {
    KernelDef k = chain(6, 9);
    expect_in_place_matches(k, in, naive_schedule(k), chain_ref, 3);
    expect_in_place_matches(k, in, default_schedule(k), chain_ref, 3);
    for (int t = 0; t < 30; ++t) expect_in_place_matches(k, in, random_schedule(k, rng), chain_ref, t);
  }
  KernelDef b = add_broadcast(5, 7);
  auto bref = [](const HostData& r) { return add_broadcast_ref(r, 5, 7); };
  for (int t = 0; t < 30; ++t) expect_in_place_matches(b, 0, random_schedule(b, rng), bref, t);
}

TEST(TirLower, MatmulSchedules) {
  KernelDef k = matmul(7, 19, 5);
  auto ref = [](const HostData& r) { return matmul_ref(r, 7, 19, 5); };
  expect_matches(k, naive_schedule(k), {}, ref);
  Schedule d = default_schedule(k);
  // Register tiled: all 7 rows x 16 columns (the last column tile overlaps the first).
  EXPECT_EQ(d.to_string(),
            "split_overlap(C, j, 16)\nreorder(C, j.o, i, j.i)\ncache_write(C, j.o)\nunroll(C, i)\n"
            "vectorize(C, j.i)\nparallel(C, j.o)\n");
  expect_matches(k, d, {}, ref);
  // The default schedule keeps the reduce loop outside the tile loops.
  auto f = lower(k, d);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  size_t kpos = text.find("for k in 0..5 {");
  ASSERT_NE(kpos, std::string::npos) << text;
  size_t ipos = text.find("for i in 0..7 unrolled", kpos);
  ASSERT_NE(ipos, std::string::npos) << text;
  EXPECT_NE(text.find("for j.i in 0..16 vectorized", ipos), std::string::npos) << text;
  EXPECT_EQ(text.find("if ("), std::string::npos) << "overlapping tiles need no guard\n" << text;
  for (const char* hand : {
           "split(C, k, 2)\nunroll(C, k.i)\n",
           "split(C, i, 4)\nsplit(C, j, 8)\nreorder(C, i.o, j.o, i.i, j.i)\ncache_write(C, j.o)\n"
           "vectorize(C, j.i)\nparallel(C, i.o)\n",
           "reorder(C, j, i)\ncache_write(C, j)\nvectorize(C, i)\n",
           "split(C, j, 5)\ncache_write(C, i)\nvectorize(C, j.i)\nunroll(C, j.o)\n",
           "split_overlap(C, j, 4)\nsplit_overlap(C, i, 3)\nreorder(C, i.o, j.o, i.i, j.i)\n"
           "cache_write(C, j.o)\nunroll(C, i.i)\nvectorize(C, j.i)\nparallel(C, i.o)\n",
           "split_overlap(C, j, 19)\nsplit(C, j.i, 6)\ncache_write(C, j.i.o)\n",
       }) {
    auto s = parse_schedule(hand);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
  }
  std::mt19937 rng(3);
  for (int t = 0; t < 40; ++t) expect_matches(k, random_schedule(k, rng), {}, ref, t);
}

// C[i, j] = sum_k A[i, k] * B[k, j]; Y = C * sigmoid(C) (a SiLU epilogue).
KernelDef matmul_silu(Expr m, Expr n, Expr kk) {
  KernelDef k = matmul(m, n, kk);
  k.params.back().name = "Y";
  Expr c = ld("C", -1, {var("i"), var("j")});
  k.stages.push_back(stage("Y", {"i", "j"}, {m, n}, c * call("sigmoid", f32, {c})));
  return k;
}

// fuse_epilogue(stage) computes the epilogue in the register tile's
// write-back; fuse_epilogue(stage, axis) after each iteration of `axis`, from
// the stage's own buffer (also over overlapping tiles, which it recomputes
// from that buffer). Both match the reference; an axis inside the tile, a
// reduce axis or an unknown one is an error.
TEST(TirLower, DeferredEpilogue) {
  KernelDef k = matmul_silu(7, 19, 5);
  auto ref = [](const HostData& r) {
    auto c = matmul_ref(r, 7, 19, 5)[0];
    for (float& v : c) v = static_cast<float>(v / (1.0 + std::exp(-static_cast<double>(v))));
    return std::vector<std::vector<float>>{c};
  };
  const std::string tile =
      "split_overlap(C, j, 16)\nsplit(C, i, 4)\nreorder(C, j.o, i.o, i.i, j.i)\ncache_write(C, i.o)\n"
      "unroll(C, i.i)\nvectorize(C, j.i)\nparallel(C, j.o)\n";
  for (const std::string& epi : {std::string("fuse_epilogue(C)\n"), std::string("fuse_epilogue(C, j.o)\n"),
                                 std::string("fuse_epilogue(C, i.o)\n")}) {
    auto s = parse_schedule(tile + epi);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
    auto f = lower(k, *s);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    std::string text = print_func(*f);
    bool deferred = epi.find(',') != std::string::npos;
    // In the tile, the sigmoid reads the accumulator; deferred, C's buffer.
    EXPECT_EQ(text.find("sigmoid:f32(load(C.acc") != std::string::npos, !deferred) << text;
    EXPECT_EQ(text.find("sigmoid:f32(load(C#-1") != std::string::npos, deferred) << text;
  }
  // After each row (the epilogue's axis fixes C's first dim): C's buffer
  // holds that row alone, allocated inside the row's loop, not the whole C.
  {
    auto s = parse_schedule("split_overlap(C, j, 16)\nreorder(C, i, j.o, j.i)\ncache_write(C, j.o)\nvectorize(C, j.i)\n"
                            "fuse_epilogue(C, i)\n");
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
    auto f = lower(k, *s);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    std::string text = print_func(*f);
    EXPECT_NE(text.find("allocate C:f32[1, 19]"), std::string::npos) << text;
    EXPECT_LT(text.find("for i in"), text.find("allocate C:f32")) << text;
    EXPECT_EQ(text.find("allocate C:f32[7, 19]"), std::string::npos) << text;
  }
  for (const char* bad : {"fuse_epilogue(C, i.i)\n", "fuse_epilogue(C, k)\n", "fuse_epilogue(C, q)\n"}) {
    auto s = parse_schedule(tile + bad);
    ASSERT_TRUE(s.is_ok()) << bad;
    EXPECT_FALSE(lower(k, *s).is_ok()) << bad;
  }
  EXPECT_FALSE(parse_schedule("fuse_epilogue(C, i, j)\n").is_ok());
}

// Y[c, i] = sum_t X[c, i + t - 1] * W[c, t] over a zero-padded row of n
// (t < 3): the padding inlined as select(in range, load(clamped index), 0).
// A 3-tap window over a row padded by one on each side: a convolution
// (zero padding, sum of x * w) or a max pooling (-inf padding, max of x;
// W unused).
KernelDef padded_window1d(int64_t channels, int64_t n, bool max_pool) {
  KernelDef k;
  k.name = max_pool ? "maxpool1d" : "conv1d";
  k.params = {buf("X", {channels, n}), buf("W", {channels, 3}), buf("Y", {channels, n})};
  k.num_inputs = 2;
  Expr c = var("c"), i = var("i"), t = var("t");
  Expr at = i + t - int_imm(1);
  Expr pad = float_imm(max_pool ? -std::numeric_limits<double>::infinity() : 0.0);
  Expr x = select(logical_and(le(int_imm(0), at), lt(at, int_imm(n))),
                  ld("X", 0, {c, max(int_imm(0), min(int_imm(n - 1), at))}), pad);
  k.stages = {max_pool ? reduce_stage("Y", {"c", "i"}, {channels, n}, {"t"}, {3}, Combiner::kMax, x)
                       : reduce_stage("Y", {"c", "i"}, {channels, n}, {"t"}, {3}, Combiner::kSum,
                                      x * ld("W", 1, {c, t}))};
  return k;
}

std::vector<std::vector<float>> padded_window1d_ref(const HostData& r, int64_t channels, int64_t n, bool max_pool) {
  auto x = as_floats(r.bytes[0]), w = as_floats(r.bytes[1]);
  std::vector<float> y(static_cast<size_t>(channels * n));
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < n; ++i) {
      float acc = max_pool ? -std::numeric_limits<float>::infinity() : 0.0f;
      for (int64_t t = 0; t < 3; ++t) {
        int64_t j = i + t - 1;
        if (j < 0 || j >= n) continue;
        acc = max_pool ? std::max(acc, x[c * n + j]) : acc + x[c * n + j] * w[c * 3 + t];
      }
      y[c * n + i] = acc;
    }
  return {y};
}

// A 3x3 stride-2 max pool (no padding) under the default schedule, whose
// tiles stay row-major (no operand the row tile reuses): matches the
// reference at odd sizes, with partial row and column tiles.
TEST(TirLower, StridedMaxPoolDefaultScheduleMatchesReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 3}, {17, 35}, {41, 41}, {9, 1023}}) {
    const int64_t h = rows, w = cols;  // plain copies: clang 14 lambdas cannot capture bindings
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    const int64_t channels = 3, oh = (h - 3) / 2 + 1, ow = (w - 3) / 2 + 1;
    KernelDef k;
    k.name = "maxpool2d";
    k.params = {buf("X", {channels, h, w}), buf("Y", {channels, oh, ow})};
    k.num_inputs = 1;
    Expr c = var("c"), i = var("i"), j = var("j"), u = var("u"), v = var("v");
    k.stages = {reduce_stage("Y", {"c", "i", "j"}, {channels, oh, ow}, {"u", "v"}, {3, 3}, Combiner::kMax,
                             ld("X", 0, {c, i * int_imm(2) + u, j * int_imm(2) + v}))};
    Schedule d = default_schedule(k);
    std::string text = d.to_string();
    // Where both output axes are tiled, row tiles are the outer loop.
    if (text.find("i.o") != std::string::npos && text.find("j.o") != std::string::npos)
      EXPECT_NE(text.find("reorder(Y, c, i.o, j.o,"), std::string::npos) << text;
    expect_matches(k, d, {}, [&](const HostData& r) {
      auto x = as_floats(r.bytes[0]);
      std::vector<float> y(static_cast<size_t>(channels * oh * ow));
      for (int64_t cc = 0; cc < channels; ++cc)
        for (int64_t a = 0; a < oh; ++a)
          for (int64_t b = 0; b < ow; ++b) {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t du = 0; du < 3; ++du)
              for (int64_t dv = 0; dv < 3; ++dv) m = std::max(m, x[(cc * h + 2 * a + du) * w + 2 * b + dv]);
            y[(cc * oh + a) * ow + b] = m;
          }
      return std::vector<std::vector<float>>{y};
    });
  }
}

// Register tiles that read no padding run a copy whose loads have neither
// the select nor the clamps (plain vector loads instead of masked ones); edge
// tiles keep them. Both match the reference at sizes with and without
// interior tiles, for zero (convolution) and -inf (max pooling) padding.
TEST(TirLower, InteriorTilesDropPaddingSelects) {
  for (bool max_pool : {false, true})
    for (int64_t n : {1, 3, 17, 40, 1023}) {
      SCOPED_TRACE(std::string(max_pool ? "max pool" : "conv") + ", n = " + std::to_string(n));
      KernelDef k = padded_window1d(3, n, max_pool);
      auto ref = [n, max_pool](const HostData& r) { return padded_window1d_ref(r, 3, n, max_pool); };
      std::string text = n >= 8 ? "split_overlap(Y, i, 8)\nreorder(Y, c, i.o, i.i)\ncache_write(Y, i.o)\n"
                                  "unroll(Y, t)\nvectorize(Y, i.i)\n"
                                : "cache_write(Y, c)\nvectorize(Y, i)\n";
      auto s = parse_schedule(text);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      expect_matches(k, *s, {}, ref);
      auto f = lower(k, *s);
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      std::string printed = print_func(*f);
      // Some tile of 8 lies inside the row from n = 17 on: a guarded fast copy.
      bool interior = n >= 17;
      EXPECT_EQ(printed.find("if (") != std::string::npos, interior) << printed;
      EXPECT_EQ(printed.find("load(X#0:f32, c, i.i + ") != std::string::npos, interior) << printed;
      EXPECT_NE(printed.find("select("), std::string::npos) << printed;  // the edge tiles
    }
}

// A 3-tap convolution over an explicit zero-padded copy P (width n + 2)
// that the window reads, so the copy is kept as its own stage.
KernelDef conv1d_padded_copy(int64_t channels, int64_t n) {
  KernelDef k;
  k.name = "conv1d_copy";
  k.params = {buf("X", {channels, n}), buf("W", {channels, 3}), buf("Y", {channels, n})};
  k.num_inputs = 2;
  Expr c = var("c"), p = var("p"), i = var("i"), t = var("t");
  Expr at = p - int_imm(1);
  Expr padded = select(logical_and(le(int_imm(0), at), lt(at, int_imm(n))),
                       ld("X", 0, {c, max(int_imm(0), min(int_imm(n - 1), at))}), float_imm(0.0));
  k.stages = {stage("P", {"c", "p"}, {channels, n + 2}, padded),
              reduce_stage("Y", {"c", "i"}, {channels, n}, {"t"}, {3}, Combiner::kSum,
                           ld("P", -1, {c, i + t}) * ld("W", 1, {c, t}))};
  return k;
}

// The default schedule vectorizes a kept padded copy whose rows are not a
// power of two wide 16 lanes at a time (one 58-lane vector could not mask
// its select's loads and ran as a scalar loop); a power-of-two row stays one
// vector. Both match the reference.
TEST(TirLower, PaddedCopyVectorsOf16) {
  for (int64_t n : {56, 62, 14}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    KernelDef k = conv1d_padded_copy(3, n);
    auto ref = [n](const HostData& r) { return padded_window1d_ref(r, 3, n, false); };
    Schedule d = default_schedule(k);
    std::string text = d.to_string();
    bool odd = n + 2 > 16 && ((n + 2) & (n + 1)) != 0;
    EXPECT_EQ(text.find("split_overlap(P, p, 16)\nvectorize(P, p.i)") != std::string::npos, odd) << text;
    if (!odd) EXPECT_NE(text.find("vectorize(P, p)"), std::string::npos) << text;
    expect_matches(k, d, {}, ref);
  }
}

// A fused epilogue that reads a param along the tile's vector (a residual
// add) has that param prefetched at the start of each tile, before the
// reduction: one prefetch per unrolled row, spanning the vector; a load that
// is constant along the vector (a per-row bias) is not prefetched. Results
// match the reference.
TEST(TirLower, EpilogueReadsArePrefetchedAtTileStart) {
  const int64_t m = 7, n = 19, kk = 5;
  KernelDef k = matmul(m, n, kk);
  k.params.insert(k.params.begin() + 2, {buf("R", {m, n}), buf("Bias", {m})});
  k.num_inputs = 4;
  k.params.back().name = "Y";
  k.stages[0].body = ld("A", 0, {var("i"), var("k")}) * ld("B", 1, {var("k"), var("j")});
  Expr c = ld("C", -1, {var("i"), var("j")});
  k.stages.push_back(stage("Y", {"i", "j"}, {m, n}, c + ld("R", 2, {var("i"), var("j")}) + ld("Bias", 3, {var("i")})));
  auto ref = [&](const HostData& r) {
    auto c = matmul_ref(r, m, n, kk)[0];
    auto res = as_floats(r.bytes[2]), bias = as_floats(r.bytes[3]);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[static_cast<size_t>(i * n + j)] += res[static_cast<size_t>(i * n + j)] + bias[static_cast<size_t>(i)];
    return std::vector<std::vector<float>>{c};
  };
  auto s = parse_schedule(
      "split_overlap(C, j, 16)\nsplit(C, i, 4)\nreorder(C, j.o, i.o, i.i, j.i)\ncache_write(C, i.o)\n"
      "unroll(C, i.i)\nvectorize(C, j.i)\nfuse_epilogue(C)\n");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  expect_matches(k, *s, {}, ref);
  auto f = lower(k, *s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  // In each copy of the tile (full, guarded), four rows of R between the
  // accumulator's allocation and the reduction, each a 16-lane span.
  size_t rows = 0;
  for (size_t at = text.find("prefetch R#2["); at != std::string::npos; at = text.find("prefetch R#2[", at + 1)) {
    size_t alloc = text.rfind("allocate C.acc", at), red = text.rfind("for k in", at);
    ASSERT_NE(alloc, std::string::npos) << text;
    EXPECT_TRUE(red == std::string::npos || red < alloc) << text;
    EXPECT_EQ(text.substr(text.find(']', at), 6), "] x16\n") << text;
    ++rows;
  }
  EXPECT_EQ(rows, 8u) << text;
  EXPECT_EQ(text.find("prefetch Bias"), std::string::npos) << text;
}

// rfactor (a reduce axis in vector lanes, with a guarded tail) and prefetch
// (a hint at the top of each reduce step, with or without rfactor) give the
// same results as the reference, and print where the schedule put them.
TEST(TirLower, RfactorAndPrefetch) {
  KernelDef k = matmul(7, 19, 5);
  auto ref = [](const HostData& r) { return matmul_ref(r, 7, 19, 5); };
  for (const char* hand : {
           "rfactor(C, k)\n",
           "split(C, k, 2)\nrfactor(C, k.i)\n",
           "split(C, k, 4)\nrfactor(C, k.i)\ncache_write(C, j)\nparallel(C, i)\n",
           "split_overlap(C, j, 4)\nreorder(C, j.o, i, j.i)\ncache_write(C, j.o)\nprefetch(C, j.o)\n"
           "vectorize(C, j.i)\n",
           "split(C, k, 2)\nrfactor(C, k.i)\nprefetch(C, j)\n",
       }) {
    auto s = parse_schedule(hand);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
  }
  auto f = lower(k, *parse_schedule("split(C, k, 2)\nrfactor(C, k.i)\nprefetch(C, j)\n"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  // Two full vectors of k, then the last one (k = 4) with its lane guard.
  size_t ko = text.find("for k.o in 0..2 {");
  ASSERT_NE(ko, std::string::npos) << text;
  EXPECT_NE(text.find("prefetch B#1[2*k.o, j + 1] x1", ko), std::string::npos) << text;
  EXPECT_NE(text.find("for k.i in 0..2 vectorized", ko), std::string::npos) << text;
  EXPECT_NE(text.find("if (k.i + 4 < 5)", ko), std::string::npos) << text;
  // rfactor of a spatial axis, or of a reduce axis without a small constant extent, is an error.
  for (const char* bad : {"rfactor(C, i)\n", "split(C, k, 2)\nrfactor(C, k.o)\nrfactor(C, k.i)\n"}) {
    auto s = parse_schedule(bad);
    ASSERT_TRUE(s.is_ok());
    EXPECT_FALSE(lower(k, *s).is_ok()) << bad;
  }
}

// hoist_reduce: blocks of the reduction run outside the register tile, which
// starts from the init at the first block, resumes from the partial sums
// saved in C otherwise (with the SiLU fused, C is a scratch buffer and the
// epilogue runs at the last block only): K = 5 in blocks of 2 (a guarded
// last block) and 3, the place outermost or inside j.o, columns guarded or
// padded, rows guarded. A spatial axis, a place inside the tile, overlapping
// tiles and a deferred epilogue are errors.
TEST(TirLower, HoistedReduceBlocks) {
  KernelDef k = matmul(7, 19, 5);
  auto ref = [](const HostData& r) { return matmul_ref(r, 7, 19, 5); };
  const std::string tile =
      "split(C, j, 16)\nsplit(C, i, 4)\nreorder(C, j.o, i.o, i.i, j.i)\ncache_write(C, i.o)\n"
      "unroll(C, i.i)\nvectorize(C, j.i)\n";
  for (const std::string& hand : {
           std::string("split(C, k, 2)\nhoist_reduce(C, k.o)\n"),
           "split(C, k, 2)\n" + tile + "hoist_reduce(C, k.o, j.o)\nparallel(C, j.o)\n",
           "split(C, k, 3)\n" + tile + "hoist_reduce(C, k.o)\nparallel(C, i.o)\n",
           std::string("split(C, k, 2)\nsplit(C, k.i, 2)\nrfactor(C, k.i.i)\nhoist_reduce(C, k.o)\n"),
       }) {
    auto s = parse_schedule(hand);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
  }
  auto f = lower(k, *parse_schedule("split(C, k, 2)\n" + tile + "hoist_reduce(C, k.o, j.o)\n"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  size_t ko = text.find("for k.o in 0..3 {");
  ASSERT_NE(ko, std::string::npos) << text;
  EXPECT_LT(text.find("for j.o in 0..1"), ko) << text;  // the full column tile; the guarded last one follows
  EXPECT_NE(text.find("for i.o in 0..2", ko), std::string::npos) << text;
  EXPECT_NE(text.find("if (k.o == 0)", ko), std::string::npos) << text;
  EXPECT_NE(text.find("if (k.o == 2)", ko), std::string::npos) << text;

  KernelDef ks = matmul_silu(7, 19, 5);
  auto ref_silu = [](const HostData& r) {
    auto c = matmul_ref(r, 7, 19, 5)[0];
    for (float& v : c) v = static_cast<float>(v / (1.0 + std::exp(-static_cast<double>(v))));
    return std::vector<std::vector<float>>{c};
  };
  auto s = parse_schedule("split(C, k, 2)\n" + tile + "hoist_reduce(C, k.o, j.o)\nfuse_epilogue(C)\n");
  ASSERT_TRUE(s.is_ok());
  expect_matches(ks, *s, {}, ref_silu);
  f = lower(ks, *s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  text = print_func(*f);
  EXPECT_NE(text.find("allocate C:f32[7, 19]"), std::string::npos) << text;  // partial sums
  EXPECT_NE(text.find("sigmoid:f32(load(C.acc"), std::string::npos) << text;

  for (const std::string& bad : {
           std::string("hoist_reduce(C, i)\n"),
           "split(C, k, 2)\n" + tile + "hoist_reduce(C, k.o, i.i)\n",
           std::string("split(C, k, 2)\nsplit_overlap(C, j, 16)\nhoist_reduce(C, k.o)\n"),
           std::string("split(C, k, 2)\nhoist_reduce(C, k.o)\nhoist_reduce(C, k.i)\n"),
           std::string("split(C, k, 2)\nhoist_reduce(C, k.o)\nsplit(C, k.o, 2)\n"),
       }) {
    auto b = parse_schedule(bad);
    ASSERT_TRUE(b.is_ok()) << bad;
    EXPECT_FALSE(lower(k, *b).is_ok()) << bad;
  }
  auto deferred = parse_schedule("split(C, k, 2)\n" + tile + "hoist_reduce(C, k.o, j.o)\nfuse_epilogue(C, j.o)\n");
  ASSERT_TRUE(deferred.is_ok());
  EXPECT_FALSE(lower(ks, *deferred).is_ok());
  EXPECT_FALSE(parse_schedule("hoist_reduce(C)\n").is_ok());
  // A symbolic number of blocks may be 0, when the tile (init, write-back) would never run.
  KernelDef sym = matmul(7, 19, var("kk"));
  EXPECT_FALSE(lower(sym, *parse_schedule("split(C, k, 2)\nhoist_reduce(C, k.o)\n")).is_ok());
}

// pack: an input's region below a loop copied into a local buffer at each of
// its iterations (dims: the loops below that index it, in nest order) and
// read from there. A's rows outside the column tiles (region [k][rows of a
// tile], rows guarded), A per hoisted block of K (a guarded last block), B
// per row tile with its contiguous columns copied in vectors (whole, and in
// steps of 4), against the reference; the buffers the printer shows; places
// inside the tile, outputs and unknown buffers are errors.
TEST(TirLower, PackedOperandBlocks) {
  KernelDef k = matmul(7, 19, 5);
  auto ref = [](const HostData& r) { return matmul_ref(r, 7, 19, 5); };
  const std::string rows_outer =
      "split(C, j, 16)\nsplit(C, i, 2)\nreorder(C, i.o, j.o, i.i, j.i)\ncache_write(C, j.o)\n"
      "unroll(C, i.i)\nvectorize(C, j.i)\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {rows_outer + "pack(C, A, i.o)\n", "allocate A.pack:f32[5, 2]"},
      {rows_outer + "pack(C, A, i.o)\nparallel(C, i.o)\n", "allocate A.pack:f32[5, 2]"},
      {"split(C, k, 2)\n" + rows_outer + "hoist_reduce(C, k.o, i.o)\npack(C, A, k.o)\n", "allocate A.pack:f32[2, 2]"},
      {rows_outer + "pack(C, B, i.o, 16)\n", "allocate B.pack:f32[2, 5, 16]"},
      {rows_outer + "pack(C, B, i.o, 4)\n", "for j.i.pl in 0..4 vectorized"},
  };
  for (const auto& [hand, shows] : cases) {
    auto s = parse_schedule(hand);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
    auto f = lower(k, *s);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    std::string text = print_func(*f);
    EXPECT_NE(text.find(shows), std::string::npos) << hand << text;
    EXPECT_EQ(parse_schedule(s->to_string())->to_string(), s->to_string());
  }
  for (const std::string& bad : {
           rows_outer + "pack(C, A, i.i)\n",  // inside the register tile
           rows_outer + "pack(C, C, i.o)\n",  // an output
           rows_outer + "pack(C, X, i.o)\n",
           rows_outer + "pack(C, A, q)\n",
           rows_outer + "pack(C, A, i.o)\npack(C, B, i.o)\n",
       }) {
    auto b = parse_schedule(bad);
    ASSERT_TRUE(b.is_ok()) << bad;
    EXPECT_FALSE(lower(k, *b).is_ok()) << bad;
  }
  EXPECT_FALSE(parse_schedule("pack(C, A)\n").is_ok());
  EXPECT_FALSE(parse_schedule("pack(C, A, i, x)\n").is_ok());
  EXPECT_FALSE(parse_schedule("prefetch(C, j, 0)\n").is_ok());
  // prefetch's distance: the panel two ahead.
  auto f = lower(k, *parse_schedule("split_overlap(C, j, 4)\nreorder(C, j.o, i, j.i)\ncache_write(C, j.o)\n"
                                    "prefetch(C, j.o, 2)\nvectorize(C, j.i)\n"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_NE(print_func(*f).find("prefetch B#1[k, min(15, 4*j.o + 8)]"), std::string::npos) << print_func(*f);
}

// fuse: C's rows and columns as one loop of 7 * 19, split, vectorized and
// tiled like any other axis, gives the reference's results.
TEST(TirLower, FuseAdjacentSpatialLoops) {
  KernelDef k = matmul(7, 19, 5);
  auto ref = [](const HostData& r) { return matmul_ref(r, 7, 19, 5); };
  for (const char* hand : {
           "fuse(C, i, j)\n",
           "fuse(C, i, j)\nsplit(C, i_j, 16)\ncache_write(C, i_j.o)\nvectorize(C, i_j.i)\nparallel(C, i_j.o)\n",
           "fuse(C, i, j)\nsplit_overlap(C, i_j, 32)\ncache_write(C, i_j.o)\nvectorize(C, i_j.i)\n",
           "split(C, j, 4)\nfuse(C, i, j.o)\nreorder(C, i_j.o, j.i)\ncache_write(C, i_j.o)\nunroll(C, j.i)\n",
       }) {
    auto s = parse_schedule(hand);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    expect_matches(k, *s, {}, ref);
  }
  auto f = lower(k, *parse_schedule("fuse(C, i, j)\nsplit(C, i_j, 16)\ncache_write(C, i_j.o)\nvectorize(C, i_j.i)\n"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  EXPECT_NE(text.find("for i_j.o in 0..8 {"), std::string::npos) << text;
  EXPECT_NE(text.find("if (i_j.i + 128 < 133)"), std::string::npos) << text;
  // Not adjacent, the wrong order, a reduce axis, a name that exists, a
  // marked or cached loop: errors.
  for (const char* bad : {"reorder(C, j, i)\nfuse(C, i, j)\n", "fuse(C, j, i)\n", "fuse(C, j, k)\n",
                          "fuse(C, i, j)\nfuse(C, i_j, i_j)\n", "vectorize(C, j)\nfuse(C, i, j)\n",
                          "cache_write(C, j)\nfuse(C, i, j)\n"}) {
    auto s = parse_schedule(bad);
    ASSERT_TRUE(s.is_ok()) << bad;
    EXPECT_FALSE(lower(k, *s).is_ok()) << bad;
  }
}

TEST(TirLower, SoftmaxLikeMultiStage) {
  KernelDef k = softmax(4, 11);
  auto ref = [](const HostData& r) { return softmax_ref(r, 4, 11); };
  expect_matches(k, naive_schedule(k), {}, ref);
  expect_matches(k, default_schedule(k), {}, ref);
  std::mt19937 rng(4);
  for (int t = 0; t < 40; ++t) expect_matches(k, random_schedule(k, rng), {}, ref, t);
}

// Attention over H heads: S = Q Kt * 0.5, softmax over its rows, O = P V.
// Q [H, M, K], Kt [H, K, N], V [H, N, D], O [H, M, D].
KernelDef attention(Expr h, Expr m, Expr n, Expr kk, Expr d) {
  KernelDef k;
  k.name = "attention";
  k.params = {buf("Q", {h, m, kk}), buf("Kt", {h, kk, n}), buf("V", {h, n, d}), buf("O", {h, m, d})};
  k.num_inputs = 3;
  Expr a0 = var("a0"), a1 = var("a1"), a2 = var("a2"), r0 = var("r0");
  k.stages = {
      reduce_stage("S", {"a0", "a1", "a2"}, {h, m, n}, {"r0"}, {kk}, Combiner::kSum,
                   ld("Q", 0, {a0, a1, r0}) * ld("Kt", 1, {a0, r0, a2})),
      stage("T", {"a0", "a1", "a2"}, {h, m, n}, ld("S", -1, {a0, a1, a2}) * float_imm(0.5, f32)),
      reduce_stage("mx", {"a0", "a1"}, {h, m}, {"r0"}, {n}, Combiner::kMax, ld("T", -1, {a0, a1, r0})),
      reduce_stage("sm", {"a0", "a1"}, {h, m}, {"r0"}, {n}, Combiner::kSum,
                   call("exp", f32, {ld("T", -1, {a0, a1, r0}) - ld("mx", -1, {a0, a1})})),
      stage("P", {"a0", "a1", "a2"}, {h, m, n},
            div(call("exp", f32, {ld("T", -1, {a0, a1, a2}) - ld("mx", -1, {a0, a1})}), ld("sm", -1, {a0, a1}))),
      reduce_stage("O", {"a0", "a1", "a2"}, {h, m, d}, {"r0"}, {n}, Combiner::kSum,
                   ld("P", -1, {a0, a1, r0}) * ld("V", 2, {a0, r0, a2})),
  };
  return k;
}

std::vector<std::vector<float>> attention_ref(const HostData& r, int64_t h, int64_t m, int64_t n, int64_t kk,
                                              int64_t d) {
  auto q = as_floats(r.bytes[0]), kt = as_floats(r.bytes[1]), v = as_floats(r.bytes[2]);
  std::vector<float> o(static_cast<size_t>(h * m * d));
  for (int64_t a = 0; a < h; ++a)
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> s(static_cast<size_t>(n));
      float mx = -INFINITY, sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t x = 0; x < kk; ++x) acc += q[(a * m + i) * kk + x] * kt[(a * kk + x) * n + j];
        s[j] = acc * 0.5f;
        mx = std::max(mx, s[j]);
      }
      for (int64_t j = 0; j < n; ++j) sum += static_cast<float>(std::exp(static_cast<double>(s[j] - mx)));
      for (int64_t c = 0; c < d; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j)
          acc += static_cast<float>(std::exp(static_cast<double>(s[j] - mx))) / sum * v[(a * n + j) * d + c];
        o[(a * m + i) * d + c] = acc;
      }
    }
  return {o};
}

// Row blocks of `rb` rows: every stage before O split alike along its row
// axis and computed inside O's row-block loop, so only rb rows of scores
// exist at a time (the scratch buffers are rb x n, not m x n).
std::string attention_rows_schedule(int64_t rb, bool tiles) {
  std::string s = "inline(T)\n";
  for (const char* st : {"S", "mx", "sm", "P", "O"}) {
    s += std::string("split(") + st + ", a1, " + std::to_string(rb) + ")\n";
    s += std::string("parallel(") + st + ", a0)\n";
  }
  for (const char* st : {"S", "mx", "sm", "P"}) s += std::string("compute_at(") + st + ", O, a1.o)\n";
  if (tiles) {
    s += "split(S, a2, 4)\nreorder(S, a0, a1.o, a2.o, a1.i, a2.i)\ncache_write(S, a2.o)\nvectorize(S, a2.i)\n";
    s += "split(O, a2, 4)\nreorder(O, a0, a1.o, a2.o, a1.i, a2.i)\ncache_write(O, a2.o)\nvectorize(O, a2.i)\n";
    s += "split(mx, r0, 4)\nrfactor(mx, r0.i)\nvectorize(P, a2)\n";
  }
  return s;
}

// Finds the Allocate of `name` in s.
const StmtNode* find_allocate(const Stmt& s, const std::string& name) {
  if (!s) return nullptr;
  if (s->kind == StmtKind::kAllocate && s->buffer.name == name) return s.get();
  for (const Stmt* c : {&s->body, &s->then_case, &s->else_case})
    if (const StmtNode* f = find_allocate(*c, name)) return f;
  for (const Stmt& c : s->seq)
    if (const StmtNode* f = find_allocate(c, name)) return f;
  return nullptr;
}

TEST(TirLower, ComputeAtRowBlocks) {
  for (const std::array<int64_t, 5>& sizes : std::vector<std::array<int64_t, 5>>{{2, 8, 8, 4, 8}, {1, 7, 5, 3, 4}, {3, 1, 17, 2, 3}}) {
    const int64_t h = sizes[0], m = sizes[1], n = sizes[2], kk = sizes[3], d = sizes[4];
    KernelDef k = attention(h, m, n, kk, d);
    auto ref = [=](const HostData& r) { return attention_ref(r, h, m, n, kk, d); };
    for (int64_t rb : {1, 2, 4}) {
      for (bool tiles : {false, true}) {
        auto s = parse_schedule(attention_rows_schedule(rb, tiles));
        ASSERT_TRUE(s.is_ok()) << s.status().to_string();
        expect_matches(k, *s, {}, ref);
        auto f = lower(k, *s);
        ASSERT_TRUE(f.is_ok()) << f.status().to_string();
        const StmtNode* a = find_allocate(f->body, "S");
        ASSERT_NE(a, nullptr) << print_func(*f);
        // One block of rows: [1, rb, n] (the whole dim where it is shorter).
        ASSERT_EQ(a->buffer.shape.size(), 3u);
        EXPECT_EQ(a->buffer.shape[0].as_const(), 1);
        EXPECT_EQ(a->buffer.shape[1].as_const(), std::min(rb, m));
        EXPECT_EQ(a->buffer.shape[2].as_const(), n);
      }
    }
  }
  // Symbolic rows and columns: the blocks are constant in rows, whole in columns.
  Expr m = var("m"), n = var("n");
  KernelDef k = attention(2, m, n, 3, 4);
  auto s = parse_schedule(attention_rows_schedule(4, true));
  ASSERT_TRUE(s.is_ok());
  for (auto [mv, nv] : std::vector<std::pair<int64_t, int64_t>>{{9, 5}, {1, 1}, {4, 16}}) {
    auto ref = [mv = mv, nv = nv](const HostData& r) { return attention_ref(r, 2, mv, nv, 3, 4); };
    expect_matches(k, *s, {{"m", mv}, {"n", nv}}, ref);
  }
}

// Two producers computed at two loops of one consumer (the outer one's
// region a row, the inner one's a point): either order of the primitives.
TEST(TirLower, ComputeAtTwoLoopsOfOneConsumer) {
  KernelDef k;
  k.name = "two_at";
  k.params = {buf("X", {4, 6}), buf("Y", {4, 6}), buf("Z", {4, 6})};
  k.num_inputs = 2;
  Expr i = var("a0"), j = var("a1");
  k.stages = {
      stage("A", {"a0", "a1"}, {4, 6}, ld("X", 0, {i, j}) * float_imm(2.0, f32)),
      stage("B", {"a0", "a1"}, {4, 6}, ld("Y", 1, {i, j}) + float_imm(1.0, f32)),
      stage("Z", {"a0", "a1"}, {4, 6}, ld("A", -1, {i, j}) - ld("B", -1, {i, j})),
  };
  auto ref = [](const HostData& r) {
    auto x = as_floats(r.bytes[0]), y = as_floats(r.bytes[1]);
    std::vector<float> z(24);
    for (size_t e = 0; e < 24; ++e) z[e] = x[e] * 2.0f - (y[e] + 1.0f);
    return std::vector<std::vector<float>>{z};
  };
  for (const char* text : {"compute_at(A, Z, a0)\ncompute_at(B, Z, a1)\n", "compute_at(B, Z, a1)\ncompute_at(A, Z, a0)\n",
                           "compute_at(A, Z, a1)\ncompute_at(B, Z, a0)\n"}) {
    auto s = parse_schedule(text);
    ASSERT_TRUE(s.is_ok());
    expect_matches(k, *s, {}, ref);
  }
}

TEST(TirLower, ComputeAtIllegalPlacementsAreErrors) {
  KernelDef k = attention(2, 8, 8, 4, 8);
  auto fails = [&](const std::string& text, const std::string& why) {
    auto s = parse_schedule(text);
    ASSERT_TRUE(s.is_ok()) << text;
    auto f = lower(k, *s);
    ASSERT_FALSE(f.is_ok()) << text;
    EXPECT_NE(f.status().message().find(why), std::string::npos) << f.status().message();
  };
  // The consumer's row loop is split, S's is not: their loops differ.
  fails("split(O, a1, 2)\ncompute_at(S, O, a1.o)\n", "their extents differ");
  // P reads S too, and P is not computed at O.
  fails("inline(T)\nsplit(S, a1, 2)\nsplit(O, a1, 2)\ncompute_at(S, O, a1.o)\n", "reads it outside");
  // Rows split differently: a block of P is not a block of O.
  fails("inline(T)\nsplit(S, a1, 2)\nsplit(mx, a1, 2)\nsplit(sm, a1, 2)\nsplit(P, a1, 4)\nsplit(O, a1, 2)\n"
        "compute_at(S, O, a1.o)\ncompute_at(mx, O, a1.o)\ncompute_at(sm, O, a1.o)\ncompute_at(P, O, a1.o)\n",
        "not at the stage's own index");
  fails("compute_at(O, S, a0)\n", "kernel output");
  fails("compute_at(T, S, a0)\n", "later stage");
  fails("compute_at(S, O, q)\n", "no spatial loop");
  fails("compute_at(S, O, a0)\ncompute_at(S, O, a0)\n", "twice");
}

TEST(TirLower, IntegerReductionTwoReduceAxes) {
  KernelDef k = int_reduce(2, 3, 5, 3);
  auto ref = [](const HostData& r) { return int_reduce_ref(r, 2, 3, 5, 3); };
  expect_matches(k, naive_schedule(k), {}, ref);
  expect_matches(k, default_schedule(k), {}, ref);
  std::mt19937 rng(5);
  for (int t = 0; t < 30; ++t) expect_matches(k, random_schedule(k, rng), {}, ref, t);
}

TEST(TirLower, SymbolicExtents) {
  Expr n = var("n"), m = var("m"), kk = var("kk");
  {
    KernelDef k = add_broadcast(n, m);
    auto f = lower(k, default_schedule(k));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ(f->sym_names, (std::vector<std::string>{"m", "n"}));
    std::mt19937 rng(6);
    for (auto [nv, mv] : std::vector<std::pair<int64_t, int64_t>>{{3, 17}, {1, 1}, {0, 4}, {6, 8}}) {
      Env env{{"n", nv}, {"m", mv}};
      auto ref = [nv = nv, mv = mv](const HostData& r) { return add_broadcast_ref(r, nv, mv); };
      expect_matches(k, naive_schedule(k), env, ref);
      expect_matches(k, default_schedule(k), env, ref);
      for (int t = 0; t < 10; ++t) expect_matches(k, random_schedule(k, rng), env, ref, t);
    }
  }
  {
    KernelDef k = matmul(n, m, kk);
    std::mt19937 rng(7);
    for (auto [nv, mv, kv] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {3, 17, 4}, {5, 8, 1}, {2, 3, 0}}) {
      Env env{{"n", nv}, {"m", mv}, {"kk", kv}};
      auto ref = [nv = nv, mv = mv, kv = kv](const HostData& r) { return matmul_ref(r, nv, mv, kv); };
      expect_matches(k, naive_schedule(k), env, ref);
      expect_matches(k, default_schedule(k), env, ref);
      for (int t = 0; t < 10; ++t) expect_matches(k, random_schedule(k, rng), env, ref, t);
    }
  }
  {
    KernelDef k = softmax(n, m);
    for (auto [nv, mv] : std::vector<std::pair<int64_t, int64_t>>{{2, 9}, {3, 1}}) {
      Env env{{"n", nv}, {"m", mv}};
      auto ref = [nv = nv, mv = mv](const HostData& r) { return softmax_ref(r, nv, mv); };
      expect_matches(k, default_schedule(k), env, ref);
      expect_matches(k, *parse_schedule("split(Y, j, 4)\nvectorize(Y, j.i)\nsplit(s, k, 3)\n"), env,
                     ref);
    }
  }
}

// A register tile whose columns (the vector lanes) and rows a symbolic
// extent cuts: the accumulator's init and update keep every lane, selecting
// the old value where the guards fail (their loads masked), so no store to the
// tile is conditional; only the write-back is guarded. Matches the reference
// at sizes below, at and above the tile.
TEST(TirLower, PartialTilesSelectInsteadOfGuardingTheAccumulator) {
  Expr n = var("n"), m = var("m");
  KernelDef k = matmul(n, m, 5);
  Schedule s = *parse_schedule(
      "split(C, j, 16)\nsplit(C, i, 4)\nreorder(C, i.o, j.o, i.i, j.i)\ncache_write(C, j.o)\nunroll(C, i.i)\n"
      "vectorize(C, j.i)\n");
  auto f = lower(k, s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  EXPECT_NE(text.find("C.acc#-1[i.i, j.i] = select(j.i + 16*j.o < m && i.i + 4*i.o < n"), std::string::npos) << text;
  // No store to the tile right under an if (the vector loop's header between).
  std::vector<std::string> lines;
  for (size_t at = 0, nl; at < text.size(); at = nl + 1) {
    nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(at, nl - at));
  }
  for (size_t l = 2; l < lines.size(); ++l) {
    if (lines[l].find("C.acc#-1[") == std::string::npos || lines[l].find("C.acc#-1[") > lines[l].find('=')) continue;
    EXPECT_EQ(lines[l - 2].find("if ("), std::string::npos) << lines[l - 2] << "\n" << lines[l] << "\n" << text;
  }
  for (auto [nv, mv] : std::vector<std::pair<int64_t, int64_t>>{{3, 14}, {4, 16}, {9, 35}, {1, 1}}) {
    Env env{{"n", nv}, {"m", mv}};
    auto ref = [nv = nv, mv = mv](const HostData& r) { return matmul_ref(r, nv, mv, 5); };
    expect_matches(k, s, env, ref);
  }
}

// C[i, j] = A[i, j] + B[j mod d]: B's dim d broadcast against the output's
// m, as ops lower an input whose dim may be 1. The kernel runs a copy without
// the modulo when m <= d (then j mod d = j), checked once per call, and the
// general one otherwise; both give the reference's results.
TEST(TirLower, SymbolicModuloIsSpecializedAtRunTime) {
  Expr n = var("n"), m = var("m"), d = var("d");
  KernelDef k;
  k.name = "bcast_mod";
  k.params = {buf("A", {n, m}), buf("B", {d}), buf("C", {n, m})};
  k.num_inputs = 2;
  k.stages = {stage("C", {"i", "j"}, {n, m}, ld("A", 0, {var("i"), var("j")}) + ld("B", 1, {mod(var("j"), d)}))};
  auto f = lower(k, default_schedule(k));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  size_t fast = text.find("if (m <= d) {");
  size_t general = text.find("} else {", fast);
  ASSERT_NE(fast, std::string::npos) << text;
  ASSERT_NE(general, std::string::npos) << text;
  EXPECT_EQ(text.substr(fast, general - fast).find(" mod "), std::string::npos) << text;
  EXPECT_NE(text.find(" mod d", general), std::string::npos) << text;
  for (auto [nv, mv, dv] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{3, 17, 17}, {2, 17, 1}, {4, 5, 1}, {1, 1, 1}}) {
    Env env{{"n", nv}, {"m", mv}, {"d", dv}};
    auto ref = [nv = nv, mv = mv, dv = dv](const HostData& r) {
      auto a = as_floats(r.bytes[0]), b = as_floats(r.bytes[1]);
      std::vector<float> c(static_cast<size_t>(nv * mv));
      for (int64_t i = 0; i < nv; ++i)
        for (int64_t j = 0; j < mv; ++j) c[i * mv + j] = a[i * mv + j] + b[j % dv];
      return std::vector<std::vector<float>>{c};
    };
    expect_matches(k, default_schedule(k), env, ref);
    expect_matches(k, naive_schedule(k), env, ref);
  }
  // A divisor that depends on an axis is not a per-call condition: no copy.
  KernelDef by_row = k;
  by_row.params[1] = buf("B", {m});
  by_row.stages[0].body = ld("A", 0, {var("i"), var("j")}) + ld("B", 1, {mod(var("j"), var("i") + 1)});
  auto r = lower(by_row, default_schedule(by_row));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(print_func(*r).find("if (m <="), std::string::npos) << print_func(*r);
  expect_matches(by_row, default_schedule(by_row), Env{{"n", 3}, {"m", 5}}, [](const HostData& hd) {
    auto a = as_floats(hd.bytes[0]), b = as_floats(hd.bytes[1]);
    std::vector<float> c(15);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) c[i * 5 + j] = a[i * 5 + j] + b[j % (i + 1)];
    return std::vector<std::vector<float>>{c};
  });
  // A modulo the extent provably fits in needs no second copy.
  KernelDef fixed = k;
  fixed.params[1] = buf("B", {m});
  fixed.stages[0].body = ld("A", 0, {var("i"), var("j")}) + ld("B", 1, {mod(var("j"), m)});
  auto g = lower(fixed, default_schedule(fixed));
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(print_func(*g).find(" mod "), std::string::npos) << print_func(*g);
  EXPECT_EQ(print_func(*g).find("if (m <="), std::string::npos) << print_func(*g);
}

// A reduction vectorized along a symbolic row keeps its lane guard only in
// the last iterations: the loop over full vectors runs unmasked.
TEST(TirLower, LaneTailsOfSymbolicRowsArePeeled) {
  Expr n = var("n"), m = var("m");
  KernelDef k = softmax(n, m);
  Schedule s = *parse_schedule("split(s, k, 4)\nrfactor(s, k.i)\n");
  auto f = lower(k, s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  std::string text = print_func(*f);
  // The first k.o loop has no guard below it; the second one does.
  size_t first = text.find("for k.o in ");
  size_t second = text.find("for k.o in ", first + 1);
  ASSERT_NE(second, std::string::npos) << text;
  EXPECT_EQ(text.substr(first, second - first).find("if ("), std::string::npos) << text;
  EXPECT_NE(text.find("if (k.i + 4*", second), std::string::npos) << text;
  for (auto [nv, mv] : std::vector<std::pair<int64_t, int64_t>>{{2, 9}, {3, 1}, {2, 4}, {1, 16}, {2, 3}}) {
    Env env{{"n", nv}, {"m", mv}};
    auto ref = [nv = nv, mv = mv](const HostData& r) { return softmax_ref(r, nv, mv); };
    expect_matches(k, s, env, ref);
    expect_matches(k, default_schedule(k), env, ref);
  }
}

TEST(TirLower, GoldenLoopIr) {
  KernelDef k = add_broadcast(2, 3);
  auto f = lower(k, *parse_schedule("split(C, j, 2)\nparallel(C, i)\nvectorize(C, j.i)\n"));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  // The split index as the shared simplifier prints it (its term order is the
  // expression printer's business, not the loop IR's). The full vector runs
  // unguarded; the last, half-full one (j.o = 1) keeps its lane guard.
  const std::string jj = print_expr(simplify(var("j.o") * 2 + var("j.i")));
  const std::string tail = print_expr(simplify(var("j.i") + 2));
  EXPECT_EQ(print_func(*f),
            "func add_bcast(A:f32[2, 3], B:f32[3], C:f32[2, 3]) syms() {\n"
            "  for i in 0..2 parallel {\n"
            "    for j.o in 0..1 {\n"
            "      for j.i in 0..2 vectorized {\n"
            "        C#2[i, " + jj + "] = load(A#0:f32, i, " + jj + ") + load(B#1:f32, " + jj + ")\n"
            "      }\n"
            "    }\n"
            "    for j.i in 0..2 vectorized {\n"
            "      if (" + tail + " < 3) {\n"
            "        C#2[i, " + tail + "] = load(A#0:f32, i, " + tail + ") + load(B#1:f32, " + tail + ")\n"
            "      }\n"
            "    }\n"
            "  }\n"
            "}\n");
  KernelDef mm = matmul(2, 8, 3);
  auto g = lower(mm, default_schedule(mm));
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(print_func(*g),
            "func matmul(A:f32[2, 3], B:f32[3, 8], C:f32[2, 8]) syms() {\n"
            "  for i in 0..2 parallel {\n"
            "    allocate C.acc:f32[8] {\n"
            "      for j in 0..8 vectorized {\n"
            "        C.acc#-1[j] = 0.0f\n"
            "      }\n"
            "      for k in 0..3 {\n"
            "        for j in 0..8 vectorized {\n"
            "          C.acc#-1[j] = load(C.acc#-1:f32, j) + load(A#0:f32, i, k)*load(B#1:f32, k, j)\n"
            "        }\n"
            "      }\n"
            "      for j in 0..8 vectorized {\n"
            "        C#2[i, j] = load(C.acc#-1:f32, j)\n"
            "      }\n"
            "    }\n"
            "  }\n"
            "}\n");
}

TEST(TirSchedule, PrintParseRoundTrip) {
  std::string text =
      "inline(t1)\nsplit(C, j, 3)\nreorder(C, j.o, i, j.i)\nparallel(C, j.o)\n"
      "vectorize(C, j.i)\nunroll(C, k)\ncache_write(C, j.o)\n";
  auto s = parse_schedule(text);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_EQ(s->prims.size(), 7u);
  EXPECT_EQ(s->prims[1].factor, 3);
  EXPECT_EQ(s->prims[2].axes, (std::vector<std::string>{"j.o", "i", "j.i"}));
  EXPECT_EQ(s->to_string(), text);
  auto spaced = parse_schedule("  split( C , j , 3 )  \n\n# comment\n");
  ASSERT_TRUE(spaced.is_ok());
  EXPECT_EQ(spaced->to_string(), "split(C, j, 3)\n");
  std::mt19937 rng(9);
  KernelDef k = softmax(4, 11);
  for (int t = 0; t < 20; ++t) {
    Schedule r = random_schedule(k, rng);
    auto back = parse_schedule(r.to_string());
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(back->to_string(), r.to_string());
  }
  for (const char* bad : {"split(C, j)", "split(C, j, x)", "frobnicate(C, i)", "vectorize C i",
                          "parallel(C, )", "inline()"}) {
    EXPECT_FALSE(parse_schedule(bad).is_ok()) << bad;
  }
}

TEST(TirSchedule, IllegalSchedulesAreErrors) {
  KernelDef mm = matmul(4, 8, 3);
  KernelDef ch = chain(4, 8);
  auto fails = [](const KernelDef& k, const char* text) {
    auto s = parse_schedule(text);
    KILN_CHECK(s.is_ok()) << text;
    auto f = lower(k, *s);
    EXPECT_FALSE(f.is_ok()) << text;
    if (!f.is_ok()) {
      EXPECT_FALSE(f.status().message().empty());
    }
  };
  fails(mm, "vectorize(C, k)\n");
  fails(mm, "parallel(C, k)\n");
  fails(mm, "vectorize(C, j)\n");  // reduce loop inside without cache_write
  fails(mm, "inline(C)\n");
  fails(mm, "split(C, q, 2)\n");
  fails(mm, "split(C, i, 0)\n");
  fails(mm, "split_overlap(C, k, 2)\n");   // a reduce axis
  fails(mm, "split_overlap(C, i, 8)\n");   // extent 4 < factor
  fails(mm, "split(D, i, 2)\n");
  fails(mm, "reorder(C, i, k)\n");
  fails(mm, "reorder(C, i, i)\n");
  fails(mm, "cache_write(C, k)\n");
  fails(mm, "cache_write(C, i)\nsplit(C, i, 2)\n");
  fails(mm, "parallel(C, i)\nvectorize(C, i)\n");
  fails(ch, "cache_write(Out, i)\n");
  fails(ch, "vectorize(Out, i)\n");
  fails(ch, "inline(Out)\n");
  fails(ch, "inline(t1)\nsplit(t1, i, 2)\n");
  fails(ch, "split(t1, i, 2)\ninline(t1)\n");
  KernelDef bad = chain(4, 8);
  bad.stages[1].body = ld("t2", -1, {var("i"), var("j")});  // reads itself
  EXPECT_FALSE(lower(bad, naive_schedule(bad)).is_ok());
}

// Canonical form: a kernel with other buffer, axis and symbol names (the same
// computation from another model) has the same text, so a schedule written
// for one lowers the other to the same loops; symbols map back to their
// names; bounds are part of the key.
TEST(TirHash, CanonicalKernelsReplayTraces) {
  KernelDef a = matmul(var("batch"), 19, 5);
  KernelDef b = matmul(var("N"), 19, 5);
  b.params[0].name = "lhs";
  b.stages[0].axes = {"y", "x"};
  b.stages[0].reduce_axes = {"r"};
  b.stages[0].body = ld("lhs", 0, {var("y"), var("r")}) * ld("B", 1, {var("r"), var("x")});
  CanonicalKernel ca = canonicalize(a), cb = canonicalize(b);
  EXPECT_EQ(ca.text, cb.text);
  EXPECT_EQ(ca.hash, cb.hash);
  EXPECT_EQ(ca.symbols, std::vector<std::string>{"batch"});
  EXPECT_EQ(cb.symbols, std::vector<std::string>{"N"});
  EXPECT_EQ(ca.names.at("C"), "p2");
  EXPECT_NE(ca.text.find("p2:f32[a0 < s0, a1 < 19] sum[r0 < 5]"), std::string::npos) << ca.text;
  Schedule s = *parse_schedule("split(p2, a1, 16)\nreorder(p2, a1.o, a0, a1.i)\ncache_write(p2, a1.o)\nvectorize(p2, a1.i)\n");
  auto fa = lower(ca.def, s), fb = lower(cb.def, s);
  ASSERT_TRUE(fa.is_ok()) << fa.status().to_string();
  ASSERT_TRUE(fb.is_ok()) << fb.status().to_string();
  EXPECT_EQ(print_func(*fa), print_func(*fb));
  EXPECT_EQ(fa->sym_names, std::vector<std::string>{"s0"});
  SymbolBounds small{{"batch", Interval{1, 8}}}, any{{"N", Interval{1, std::nullopt}}};
  EXPECT_NE(canonicalize(a, &small).text, canonicalize(b, &any).text);
  EXPECT_NE(canonicalize(a, &small).text.find("bound s0 in [1, 8]"), std::string::npos);
  // A stage named after a buffer keeps its suffix on the canonical name.
  KernelDef c = a;
  c.stages.insert(c.stages.begin(), c.stages[0]);
  c.stages[0].name = "C.pad";
  EXPECT_EQ(canonicalize(c).names.at("C.pad"), "p2.pad");
}

TEST(TirHash, RenamedKernelsHashEqual) {
  KernelDef a = matmul(7, 19, 5);
  KernelDef b = a;
  b.name = "other";
  b.params[0].name = "lhs";
  b.params[2].name = "out";
  b.stages[0].name = "out";
  b.stages[0].axes = {"y", "x"};
  b.stages[0].reduce_axes = {"r"};
  b.stages[0].body = ld("lhs", 0, {var("y"), var("r")}) * ld("B", 1, {var("r"), var("x")});
  EXPECT_EQ(structural_hash(a), structural_hash(b));
  EXPECT_NE(structural_hash(a), structural_hash(matmul(7, 19, 6)));
  EXPECT_NE(structural_hash(a), structural_hash(matmul(var("m"), 19, 5)));
  KernelDef c = a;
  c.stages[0].combiner = Combiner::kMax;
  EXPECT_NE(structural_hash(a), structural_hash(c));
  KernelDef s1 = softmax(4, 11), s2 = softmax(4, 11);
  s2.stages[1].name = "exps";
  s2.stages[2].body = ld("exps", -1, {var("i"), var("k")});
  s2.stages[3].body = div(ld("exps", -1, {var("i"), var("j")}), ld("s", -1, {var("i")}));
  EXPECT_EQ(structural_hash(s1), structural_hash(s2));
  EXPECT_NE(structural_hash(s1), structural_hash(softmax(4, 12)));
}

TEST(TirInterpret, IntegerSemanticsAndErrors) {
  // Out[i] = various integer and cast expressions of In[i] (i32), stored as i8 and f64.
  const DType i32 = DType::kInt32, i8 = DType::kInt8, f64 = DType::kFloat64;
  PrimFunc f;
  f.name = "ints";
  f.params = {buf("In", {4}, i32), buf("Div", {4}, i32), buf("Mod", {4}, i32),
              buf("Narrow", {4}, i8), buf("Wide", {4}, f64), buf("Sel", {4}, i32)};
  Expr x = ld("In", 0, {var("i")}, i32);
  Expr idx = var("i");
  f.body = make_for(
      "i", 4, ForKind::kSerial,
      make_seq({
          make_store("Div", 1, {idx}, floordiv(x, int_imm(-3, i32))),
          make_store("Mod", 2, {idx}, mod(x, int_imm(-3, i32))),
          make_store("Narrow", 3, {idx}, cast(i8, x * int_imm(100, i32))),
          make_store("Wide", 4, {idx}, cast(f64, div(cast(f32, x), float_imm(4.0)))),
          // The unselected branch would read out of bounds.
          make_store("Sel", 5, {idx},
                     select(lt(idx, 2), ld("In", 0, {idx + 2}, i32), ld("In", 0, {idx - 2}, i32))),
      }));
  std::vector<int32_t> in = {7, -7, 3, -1}, dv(4), md(4), sel(4);
  std::vector<int8_t> narrow(4);
  std::vector<double> wide(4);
  Status st = interpret(f, {in.data(), dv.data(), md.data(), narrow.data(), wide.data(), sel.data()}, {});
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(dv, (std::vector<int32_t>{-3, 2, -1, 0}));
  EXPECT_EQ(md, (std::vector<int32_t>{-2, -1, 0, -1}));
  EXPECT_EQ(narrow, (std::vector<int8_t>{static_cast<int8_t>(700), static_cast<int8_t>(-700), 44, -100}));
  EXPECT_EQ(wide, (std::vector<double>{1.75, -1.75, 0.75, -0.25}));
  EXPECT_EQ(sel, (std::vector<int32_t>{3, -1, 7, -7}));

  PrimFunc oob = f;
  oob.body = make_for("i", 5, ForKind::kSerial, make_store("Div", 1, {idx}, x));
  EXPECT_FALSE(interpret(oob, {in.data(), dv.data(), md.data(), narrow.data(), wide.data(), sel.data()}, {}).is_ok());
  // A zero divisor gives 0, as in the generated code.
  PrimFunc by_zero = f;
  by_zero.body = make_for("i", 4, ForKind::kSerial,
                          make_store("Div", 1, {idx}, floordiv(x, x - x)));
  EXPECT_TRUE(interpret(by_zero, {in.data(), dv.data(), md.data(), narrow.data(), wide.data(), sel.data()}, {}).is_ok());
  EXPECT_EQ(dv, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_FALSE(interpret(f, {in.data()}, {}).is_ok());
}


TEST(TirInterpret, MathIntrinsicsAndBitOps) {
  const DType f64 = DType::kFloat64, i32 = DType::kInt32, u8 = DType::kUInt8, b1 = DType::kBool;
  std::vector<float> in = {-2.5f, -0.5f, 0.25f, 1.5f, 3.0f};
  const int64_t n = static_cast<int64_t>(in.size());
  struct Case {
    const char* name;
    double (*ref)(double);
  };
  std::vector<Case> cases = {
      {"exp", [](double x) { return std::exp(x); }},
      {"tanh", [](double x) { return std::tanh(x); }},
      {"erf", [](double x) { return std::erf(x); }},
      {"sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
      {"abs", [](double x) { return std::fabs(x); }},
      {"neg", [](double x) { return -x; }},
      {"floor", [](double x) { return std::floor(x); }},
      {"ceil", [](double x) { return std::ceil(x); }},
      {"round", [](double x) { return std::nearbyint(x); }},
      {"sin", [](double x) { return std::sin(x); }},
      {"cos", [](double x) { return std::cos(x); }},
      {"log", [](double x) { return std::log(std::fabs(x)); }},
      {"sqrt", [](double x) { return std::sqrt(std::fabs(x)); }},
  };
  for (DType t : {f32, f64}) {
    for (const Case& c : cases) {
      PrimFunc f;
      f.name = c.name;
      f.params = {buf("X", {n}), buf("Y", {n}, t)};
      Expr x = cast(t, ld("X", 0, {var("i")}));
      std::string name = c.name;
      if (name == "log" || name == "sqrt") x = call("abs", t, {x});
      f.body = make_for("i", n, ForKind::kSerial, make_store("Y", 1, {var("i")}, call(name, t, {x})));
      std::vector<double> out64(in.size());
      std::vector<float> out32(in.size());
      void* out = t == f32 ? static_cast<void*>(out32.data()) : static_cast<void*>(out64.data());
      Status st = interpret(f, {in.data(), out}, {});
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      for (size_t i = 0; i < in.size(); ++i) {
        double want = c.ref(in[i]);
        double got = t == f32 ? out32[i] : out64[i];
        EXPECT_NEAR(got, want, t == f32 ? 1e-6 * std::max(1.0, std::fabs(want)) : 1e-15)
            << c.name << "(" << in[i] << ") as " << dtype_name(t);
      }
    }
  }
  // pow, isnan / isinf into bool, and integer bit operations.
  PrimFunc g;
  g.name = "bits";
  g.params = {buf("X", {n}), buf("P", {n}), buf("Nan", {n}, b1), buf("I", {n}, i32),
              buf("U", {n}, u8)};
  Expr i = var("i");
  Expr x = ld("X", 0, {i});
  Expr xi = cast(i32, x * float_imm(4.0));  // -10, -2, 1, 6, 12
  g.body = make_for(
      "i", n, ForKind::kSerial,
      make_seq({
          make_store("P", 1, {i}, call("pow", f32, {call("abs", f32, {x}), float_imm(1.5)})),
          make_store("Nan", 2, {i},
                     call("isnan", b1, {call("log", f32, {x})})),
          make_store("I", 3, {i},
                     call("bitxor", i32, {call("shr", i32, {xi, int_imm(1, i32)}),
                                          call("shl", i32, {xi, int_imm(2, i32)})})),
          make_store("U", 4, {i},
                     call("shr", u8, {call("bitand", u8, {cast(u8, xi), int_imm(0xf0, u8)}),
                                      int_imm(4, u8)})),
      }));
  std::vector<float> pw(in.size());
  std::vector<uint8_t> nan(in.size()), u(in.size());
  std::vector<int32_t> bits(in.size());
  Status st = interpret(g, {in.data(), pw.data(), nan.data(), bits.data(), u.data()}, {});
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (size_t k = 0; k < in.size(); ++k) {
    EXPECT_NEAR(pw[k], std::pow(std::fabs(in[k]), 1.5), 1e-5);
    EXPECT_EQ(nan[k], in[k] < 0 ? 1 : 0) << in[k];
    int32_t v = static_cast<int32_t>(in[k] * 4.0f);
    EXPECT_EQ(bits[k], (v >> 1) ^ (v * 4)) << v;
    EXPECT_EQ(u[k], (static_cast<uint8_t>(v) & 0xf0) >> 4) << v;
  }
}

// The Winograd matrices (Toom-Cook over their interpolation points) give the
// 2-D correlation y[r][c] = sum over i, k of d[r+i][c+k] g[i][k] exactly in
// double arithmetic through Y = AT [(G g GT) * (BT d B)] A.
TEST(TirWinograd, MatricesComputeTheCorrelation) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t m : {2, 4}) {
    const WinogradMatrices* t = winograd_matrices(m);
    ASSERT_NE(t, nullptr);
    const int64_t a = t->alpha;
    ASSERT_EQ(a, m + 2);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> d(a * a), g(9);
      for (double& v : d) v = dist(rng);
      for (double& v : g) v = dist(rng);
      // U = G g GT (a x a), V = BT d B (a x a), Y = AT (U * V) A (m x m).
      std::vector<double> gg(a * 3, 0.0), u(a * a, 0.0), bd(a * a, 0.0), v(a * a, 0.0), am(m * a, 0.0);
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t j = 0; j < 3; ++j) gg[r * 3 + c] += t->g[r * 3 + j] * g[j * 3 + c];
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < a; ++c)
          for (int64_t j = 0; j < 3; ++j) u[r * a + c] += gg[r * 3 + j] * t->g[c * 3 + j];
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < a; ++c)
          for (int64_t j = 0; j < a; ++j) bd[r * a + c] += t->bt[r * a + j] * d[j * a + c];
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < a; ++c)
          for (int64_t j = 0; j < a; ++j) v[r * a + c] += bd[r * a + j] * t->bt[c * a + j];
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < a; ++c)
          for (int64_t j = 0; j < a; ++j) am[r * a + c] += t->at[r * a + j] * u[j * a + c] * v[j * a + c];
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < m; ++c) {
          double y = 0, want = 0;
          for (int64_t j = 0; j < a; ++j) y += am[r * a + j] * t->at[c * a + j];
          for (int64_t i = 0; i < 3; ++i)
            for (int64_t k = 0; k < 3; ++k) want += d[(r + i) * a + c + k] * g[i * 3 + k];
          EXPECT_NEAR(y, want, 1e-12) << "m " << m << " output (" << r << ", " << c << ")";
        }
    }
  }
  EXPECT_EQ(winograd_matrices(3), nullptr);
}

}  // namespace
}  // namespace kiln::tir
