// Code generation through the real JIT: hand-built PrimFuncs are compiled and
// run, and their results compared with C++ computations. Output buffers carry
// sentinel values after their end to catch out-of-bounds writes; every buffer
// base is 64-byte aligned as the runtime guarantees.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "codegen/llvm/jit.h"
#include "support/thread_pool.h"

namespace kiln::codegen {
namespace {

using tir::Buffer;
using tir::ForKind;
using tir::PrimFunc;
using tir::Stmt;

constexpr DType f32 = DType::kFloat32;
constexpr DType f64 = DType::kFloat64;
constexpr DType i64t = DType::kInt64;
constexpr DType i32t = DType::kInt32;
constexpr DType u8t = DType::kUInt8;
constexpr DType boolt = DType::kBool;

constexpr int kPad = 16;  // sentinel elements after each buffer

// A 64-byte aligned array of n elements followed by kPad sentinels.
template <typename T>
class Aligned {
 public:
  explicit Aligned(size_t n, T fill = T(), T sentinel = T()) : n_(n), sentinel_(sentinel) {
    size_t bytes = ((n + kPad) * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    for (size_t i = 0; i < n; ++i) data_[i] = fill;
    for (size_t i = n; i < n + kPad; ++i) data_[i] = sentinel;
  }
  ~Aligned() { std::free(data_); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  T& operator[](size_t i) { return data_[i]; }
  T* data() { return data_; }
  size_t size() const { return n_; }
  bool sentinels_intact() const {
    for (size_t i = n_; i < n_ + kPad; ++i)
      if (std::memcmp(&data_[i], &sentinel_, sizeof(T)) != 0) return false;
    return true;
  }

 private:
  size_t n_;
  T sentinel_;
  T* data_;
};

Buffer buf(std::string name, std::vector<Expr> shape, DType t = f32) {
  return Buffer{std::move(name), t, std::move(shape)};
}

Expr ld(const std::string& name, int index, std::vector<Expr> idx, DType t = f32) {
  return load(name, index, t, std::move(idx));
}

int64_t floor_div_ref(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t floor_mod_ref(int64_t a, int64_t b) { return a - floor_div_ref(a, b) * b; }

std::unique_ptr<CompiledModule> compile_ok(const std::vector<PrimFunc>& funcs) {
  auto r = compile(funcs);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return nullptr;
  return std::move(r).value();
}

// c[i] = a[i] + b[i] for i < n, with the loop of the given kind.
PrimFunc add_func(int64_t n, ForKind kind) {
  Expr i = var("i");
  PrimFunc f;
  f.name = std::string("add_") + tir::for_kind_name(kind) + "_" + std::to_string(n);
  f.params = {buf("a", {n}), buf("b", {n}), buf("c", {n})};
  f.body = tir::make_for("i", n, kind,
                         tir::make_store("c", 2, {i}, ld("a", 0, {i}) + ld("b", 1, {i})));
  return f;
}

TEST(CodegenJit, ElementwiseAddAllLoopKinds) {
  set_current_thread_pool(shared_thread_pool(2));
  for (ForKind kind : {ForKind::kSerial, ForKind::kVectorized, ForKind::kParallel, ForKind::kUnrolled}) {
    for (int64_t n : {1, 3, 17, 1023}) {
      if (kind == ForKind::kUnrolled && n > 17) continue;  // full unrolling of 1023 is pointless
      SCOPED_TRACE(std::string(tir::for_kind_name(kind)) + " n=" + std::to_string(n));
      PrimFunc f = add_func(n, kind);
      auto mod = compile_ok({f});
      ASSERT_TRUE(mod);
      KernelFn fn = mod->lookup(f.name);
      ASSERT_NE(fn, nullptr);
      Aligned<float> a(n), b(n), c(n, 0.0f, -7777.0f);
      for (int64_t k = 0; k < n; ++k) {
        a[k] = 0.5f * k - 3.0f;
        b[k] = 1.0f / (k + 1);
      }
      void* bufs[] = {a.data(), b.data(), c.data()};
      fn(bufs, nullptr);
      for (int64_t k = 0; k < n; ++k) ASSERT_EQ(c[k], a[k] + b[k]) << "at " << k;
      EXPECT_TRUE(c.sentinels_intact());
    }
  }
  set_current_thread_pool(nullptr);
}

// A vectorized loop that is not innermost cannot be vectorized by LLVM: it
// still computes the right thing, and LLVM's warning is not printed.
TEST(CodegenJit, VectorizedOuterLoopIsQuiet) {
  Expr m = var("m"), n = var("n"), i = var("i"), j = var("j");
  PrimFunc f;
  f.name = "outer";
  f.params = {buf("a", {m, n}), buf("out", {m, n})};
  f.sym_names = {"m", "n"};
  f.body = tir::make_for("i", m, ForKind::kVectorized,
                         tir::make_for("j", n, ForKind::kSerial,
                                       tir::make_store("out", 1, {i, j}, ld("a", 0, {i, j}) - float_imm(1.0))));
  testing::internal::CaptureStderr();
  auto mod = compile_ok({f});
  std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(mod);
  EXPECT_EQ(err, "");
  Aligned<float> a(3 * 5), out(3 * 5, 0, 2.0f);
  for (int t = 0; t < 15; ++t) a[t] = static_cast<float>(t);
  void* bufs[] = {a.data(), out.data()};
  int64_t syms[] = {3, 5};
  mod->lookup("outer")(bufs, syms);
  for (int t = 0; t < 15; ++t) EXPECT_EQ(out[t], t - 1.0f);
  EXPECT_TRUE(out.sentinels_intact());
}

// Lower optimization levels give the same results (exp is exact enough to compare loosely).
TEST(CodegenJit, OptLevels) {
  Expr i = var("i");
  const int64_t n = 33;
  PrimFunc f;
  f.name = "lv";
  f.params = {buf("a", {n}), buf("out", {n})};
  f.body = tir::make_for("i", n, ForKind::kVectorized,
                         tir::make_store("out", 1, {i}, call("exp", f32, {ld("a", 0, {i})}) +
                                                            cast(f32, floordiv(i - int_imm(7), int_imm(3)))));
  for (int level : {0, 1, 2, 3}) {
    SCOPED_TRACE(level);
    CodegenOptions options;
    options.opt_level = level;
    auto r = compile({f}, options);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    Aligned<float> a(n), out(n, 0, 6.0f);
    for (int t = 0; t < n; ++t) a[t] = 0.3f * t - 4.0f;
    void* bufs[] = {a.data(), out.data()};
    (*r)->lookup("lv")(bufs, nullptr);
    for (int t = 0; t < n; ++t) {
      float want = static_cast<float>(std::exp(static_cast<double>(a[t])) + floor_div_ref(t - 7, 3));
      EXPECT_NEAR(out[t], want, 4e-7f * std::fabs(want) + 1e-6f) << t;
    }
    EXPECT_TRUE(out.sentinels_intact());
  }
}

TEST(CodegenJit, LookupUnknownAndSeveralFunctions) {
  auto mod = compile_ok({add_func(5, ForKind::kSerial), add_func(7, ForKind::kVectorized)});
  ASSERT_TRUE(mod);
  EXPECT_NE(mod->lookup("add_serial_5"), nullptr);
  EXPECT_NE(mod->lookup("add_vectorized_7"), nullptr);
  EXPECT_EQ(mod->lookup("nope"), nullptr);
  EXPECT_FALSE(mod->llvm_ir().empty());
}

// out[i, j] = a[i, j] * 2 + b[j] over symbolic [m, n].
TEST(CodegenJit, SymbolicExtents2D) {
  Expr m = var("m"), n = var("n"), i = var("i"), j = var("j");
  PrimFunc f;
  f.name = "sym2d";
  f.params = {buf("a", {m, n}), buf("b", {n}), buf("out", {m, n})};
  f.sym_names = {"m", "n"};
  Expr value = ld("a", 0, {i, j}) * float_imm(2.0) + ld("b", 1, {j});
  f.body = tir::make_for("i", m, ForKind::kSerial,
                         tir::make_for("j", n, ForKind::kVectorized,
                                       tir::make_store("out", 2, {i, j}, value)));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  KernelFn fn = mod->lookup("sym2d");
  for (auto [mv, nv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 5}, {2, 17}, {4, 1023}}) {
    SCOPED_TRACE(std::to_string(mv) + "x" + std::to_string(nv));
    Aligned<float> a(mv * nv), b(nv), out(mv * nv, 0.0f, 31337.0f);
    for (int64_t k = 0; k < mv * nv; ++k) a[k] = static_cast<float>(k % 97) - 40.0f;
    for (int64_t k = 0; k < nv; ++k) b[k] = static_cast<float>(k) * 0.25f;
    void* bufs[] = {a.data(), b.data(), out.data()};
    int64_t syms[] = {mv, nv};
    fn(bufs, syms);
    for (int64_t r = 0; r < mv; ++r)
      for (int64_t k = 0; k < nv; ++k)
        ASSERT_EQ(out[r * nv + k], a[r * nv + k] * 2.0f + b[k]) << r << "," << k;
    EXPECT_TRUE(out.sentinels_intact());
  }
}


TEST(CodegenJit, IntegerFloorDivModNegative) {
  for (DType t : {i64t, i32t}) {
    SCOPED_TRACE(dtype_name(t));
    Expr i = var("i");
    const int64_t n = 37;
    PrimFunc f;
    f.name = std::string("divmod_") + dtype_name(t);
    f.params = {buf("a", {n}, t), buf("b", {n}, t), buf("q", {n}, t), buf("r", {n}, t),
                buf("mn", {n}, t), buf("mx", {n}, t)};
    Expr a = ld("a", 0, {i}, t), b = ld("b", 1, {i}, t);
    f.body = tir::make_for(
        "i", n, ForKind::kVectorized,
        tir::make_seq({tir::make_store("q", 2, {i}, floordiv(a, b)),
                       tir::make_store("r", 3, {i}, mod(a, b)),
                       tir::make_store("mn", 4, {i}, min(a, b)),
                       tir::make_store("mx", 5, {i}, max(a, b))}));
    auto mod_ = compile_ok({f});
    ASSERT_TRUE(mod_);
    KernelFn fn = mod_->lookup(f.name);
    auto run = [&](auto zero) {
      using T = decltype(zero);
      Aligned<T> av(n), bv(n), q(n, 0, 99), r(n, 0, 99), mn(n, 0, 99), mx(n, 0, 99);
      const int64_t divisors[] = {1, -1, 2, -2, 3, -3, 7, -7, 10};
      for (int64_t k = 0; k < n; ++k) {
        av[k] = static_cast<T>(k * 5 - 90);
        bv[k] = static_cast<T>(divisors[k % 9]);
      }
      void* bufs[] = {av.data(), bv.data(), q.data(), r.data(), mn.data(), mx.data()};
      fn(bufs, nullptr);
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(q[k], floor_div_ref(av[k], bv[k])) << av[k] << " floordiv " << bv[k];
        EXPECT_EQ(r[k], floor_mod_ref(av[k], bv[k])) << av[k] << " mod " << bv[k];
        EXPECT_EQ(mn[k], std::min(av[k], bv[k]));
        EXPECT_EQ(mx[k], std::max(av[k], bv[k]));
      }
      EXPECT_TRUE(q.sentinels_intact() && r.sentinels_intact() && mn.sentinels_intact() &&
                  mx.sentinels_intact());
    };
    if (t == i64t) run(int64_t{0});
    else run(int32_t{0});
  }
}

// Casts between f32, f64, i32, u8 and bool; comparisons, logic and select.
TEST(CodegenJit, CastsCompareSelectBool) {
  Expr i = var("i");
  const int64_t n = 19;
  PrimFunc f;
  f.name = "casts";
  f.params = {buf("x", {n}, f32),     buf("u", {n}, u8t),      buf("to_i32", {n}, i32t),
              buf("to_bool", {n}, boolt), buf("u_to_f", {n}, f32), buf("u_sum", {n}, u8t),
              buf("to_f64", {n}, f64),  buf("logic", {n}, boolt), buf("sel", {n}, f32),
              buf("bool_to_f", {n}, f32), buf("i_to_f", {n}, f32)};
  Expr x = ld("x", 0, {i}, f32), u = ld("u", 1, {i}, u8t);
  Expr xb = cast(boolt, x);
  Expr pos = lt(float_imm(0.0), x);
  Expr small = le(x, float_imm(2.0));
  Expr logic = logical_or(logical_and(pos, small), logical_not(eq(x, x)));  // (0 < x <= 2) || isnan
  f.body = tir::make_for(
      "i", n, ForKind::kVectorized,
      tir::make_seq({
          tir::make_store("to_i32", 2, {i}, cast(i32t, x)),
          tir::make_store("to_bool", 3, {i}, xb),
          tir::make_store("u_to_f", 4, {i}, cast(f32, u)),
          tir::make_store("u_sum", 5, {i}, u + int_imm(100, u8t)),
          tir::make_store("to_f64", 6, {i}, cast(f64, x) * float_imm(3.0, f64)),
          tir::make_store("logic", 7, {i}, logic),
          tir::make_store("sel", 8, {i}, select(ne(x, float_imm(1.5)), x * x, float_imm(-1.0))),
          tir::make_store("bool_to_f", 9, {i}, cast(f32, ld("to_bool", 3, {i}, boolt))),
          tir::make_store("i_to_f", 10, {i}, cast(f32, cast(i64t, cast(i32t, x)) * int_imm(-3))),
      }));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  Aligned<float> x_(n), u_to_f(n, 0, 5.5f), sel(n, 0, 5.5f), bool_to_f(n, 0, 5.5f), i_to_f(n, 0, 5.5f);
  Aligned<uint8_t> u_(n), u_sum(n, 0, 0xAB);
  Aligned<int32_t> to_i32(n, 0, 4242);
  Aligned<uint8_t> to_bool(n, 7, 0xCD), logic_(n, 7, 0xCD);  // bool is one byte
  Aligned<double> to_f64(n, 0, 1e300);
  const float xs[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.5f, 2.0f, 2.5f, -2.7f, 100.9f, -100.9f,
                      NAN,  INFINITY, -INFINITY, 1e-30f, 3.0e9f, -3.0e9f, 7.0f, 1.0f, 2.0000002f};
  for (int64_t k = 0; k < n; ++k) {
    x_[k] = xs[k];
    u_[k] = static_cast<uint8_t>(k * 14);
  }
  void* bufs[] = {x_.data(), u_.data(), to_i32.data(), to_bool.data(), u_to_f.data(), u_sum.data(),
                  to_f64.data(), logic_.data(), sel.data(), bool_to_f.data(), i_to_f.data()};
  mod->lookup("casts")(bufs, nullptr);
  for (int64_t k = 0; k < n; ++k) {
    float xv = xs[k];
    SCOPED_TRACE("x=" + std::to_string(xv));
    int32_t want_i = std::isnan(xv) ? 0
                     : xv >= 2147483647.0f ? std::numeric_limits<int32_t>::max()
                     : xv <= -2147483648.0f ? std::numeric_limits<int32_t>::min()
                                            : static_cast<int32_t>(xv);
    EXPECT_EQ(to_i32[k], want_i);  // saturating, truncating toward zero
    EXPECT_EQ(to_bool[k], (xv != 0.0f) ? 1 : 0);
    EXPECT_EQ(u_to_f[k], static_cast<float>(u_[k]));  // unsigned: 252 stays 252
    EXPECT_EQ(u_sum[k], static_cast<uint8_t>(u_[k] + 100));  // wraps
    if (std::isnan(xv)) EXPECT_TRUE(std::isnan(to_f64[k]));
    else EXPECT_EQ(to_f64[k], static_cast<double>(xv) * 3.0);
    EXPECT_EQ(logic_[k], ((0.0f < xv && xv <= 2.0f) || std::isnan(xv)) ? 1 : 0);
    float want_sel = xv != 1.5f ? xv * xv : -1.0f;
    if (std::isnan(xv)) EXPECT_TRUE(std::isnan(sel[k]));
    else EXPECT_EQ(sel[k], want_sel);
    EXPECT_EQ(bool_to_f[k], xv != 0.0f ? 1.0f : 0.0f);
    EXPECT_EQ(i_to_f[k], static_cast<float>(static_cast<int64_t>(want_i) * -3));
  }
  EXPECT_TRUE(to_i32.sentinels_intact() && to_bool.sentinels_intact() && u_to_f.sentinels_intact() &&
              u_sum.sentinels_intact() && to_f64.sentinels_intact() && logic_.sentinels_intact() &&
              sel.sentinels_intact() && bool_to_f.sentinels_intact() && i_to_f.sentinels_intact());
}

// A bool mask read in a vector loop (a Where after a product: attention's
// causal mask) is one byte-vector load compared with zero, not a byte load
// per lane; any nonzero byte is true, as in scalar code. Also inside a select
// arm (a masked byte load).
TEST(CodegenJit, BoolLoadsInVectorLoopsAreByteVectors) {
  Expr i = var("i");
  for (int64_t n : {16, 64}) {
    PrimFunc f;
    f.name = "mask" + std::to_string(n);
    f.params = {buf("m", {n}, boolt), buf("a", {n}, f32), buf("out", {n}, f32), buf("arm", {n}, f32)};
    Expr m = ld("m", 0, {i}, boolt), a = ld("a", 1, {i}, f32);
    f.body = tir::make_for("i", n, ForKind::kVectorized,
                           tir::make_seq({
                               tir::make_store("out", 2, {i}, select(m, a, float_imm(-1e9))),
                               tir::make_store("arm", 3, {i},
                                               select(lt(float_imm(0.0), a), cast(f32, m), float_imm(-1.0))),
                           }));
    auto mod = compile_ok({f});
    ASSERT_TRUE(mod);
    const std::string& ir = mod->llvm_ir();
    EXPECT_NE(ir.find(" x i8>"), std::string::npos) << ir;
    EXPECT_EQ(ir.find("load i8,"), std::string::npos) << ir;
    Aligned<uint8_t> m_(n);
    Aligned<float> a_(n), out(n, 0, 5.5f), arm(n, 0, 5.5f);
    const uint8_t bytes[] = {0, 1, 2, 255, 0, 0, 1, 7};
    for (int64_t k = 0; k < n; ++k) {
      m_[k] = bytes[k % 8];
      a_[k] = static_cast<float>(k % 3) - 1.0f;  // -1, 0, 1
    }
    void* bufs[] = {m_.data(), a_.data(), out.data(), arm.data()};
    mod->lookup(f.name)(bufs, nullptr);
    for (int64_t k = 0; k < n; ++k) {
      EXPECT_EQ(out[k], m_[k] != 0 ? a_[k] : -1e9f) << "lane " << k;
      EXPECT_EQ(arm[k], a_[k] > 0 ? (m_[k] != 0 ? 1.0f : 0.0f) : -1.0f) << "lane " << k;
    }
    EXPECT_TRUE(out.sentinels_intact() && arm.sentinels_intact());
  }
}

// f64 arithmetic and libm-backed math; f32 min/max propagate NaN; float mod is fmod.
TEST(CodegenJit, Float64AndMinMaxNaN) {
  Expr i = var("i");
  const int64_t n = 9;
  PrimFunc f;
  f.name = "f64ops";
  f.params = {buf("a", {n}, f64), buf("b", {n}, f64), buf("o", {n}, f64), buf("e", {n}, f64),
              buf("x", {n}, f32), buf("y", {n}, f32), buf("mn", {n}, f32), buf("mx", {n}, f32),
              buf("fm", {n}, f32), buf("rd", {n}, f32)};
  Expr a = ld("a", 0, {i}, f64), b = ld("b", 1, {i}, f64);
  Expr x = ld("x", 4, {i}, f32), y = ld("y", 5, {i}, f32);
  f.body = tir::make_for(
      "i", n, ForKind::kSerial,
      tir::make_seq({
          tir::make_store("o", 2, {i}, div(a * b - a, b + float_imm(0.5, f64))),
          tir::make_store("e", 3, {i}, call("exp", f64, {a}) + call("sqrt", f64, {call("abs", f64, {b})})),
          tir::make_store("mn", 6, {i}, min(x, y)),
          tir::make_store("mx", 7, {i}, max(x, y)),
          tir::make_store("fm", 8, {i}, mod(x, y)),
          tir::make_store("rd", 9, {i}, call("round", f32, {x})),
      }));
  auto mod_ = compile_ok({f});
  ASSERT_TRUE(mod_);
  Aligned<double> av(n), bv(n), o(n, 0, -1.0), e(n, 0, -1.0);
  Aligned<float> xv(n), yv(n), mn(n, 0, -1.0f), mx(n, 0, -1.0f), fm(n, 0, -1.0f), rd(n, 0, -1.0f);
  const float xs[] = {1.0f, NAN, 3.0f, -2.5f, 0.5f, 1.5f, 2.5f, -7.5f, -0.0f};
  const float ys[] = {NAN, 2.0f, 3.0f, 2.0f, -4.0f, 2.0f, 2.0f, 2.0f, 0.0f};
  for (int64_t k = 0; k < n; ++k) {
    av[k] = 0.37 * k - 1.1;
    bv[k] = 1.9 - 0.51 * k;
    xv[k] = xs[k];
    yv[k] = ys[k];
  }
  void* bufs[] = {av.data(), bv.data(), o.data(), e.data(), xv.data(),
                  yv.data(), mn.data(), mx.data(), fm.data(), rd.data()};
  mod_->lookup("f64ops")(bufs, nullptr);
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_DOUBLE_EQ(o[k], (av[k] * bv[k] - av[k]) / (bv[k] + 0.5));
    EXPECT_DOUBLE_EQ(e[k], std::exp(av[k]) + std::sqrt(std::fabs(bv[k])));
    if (std::isnan(xs[k]) || std::isnan(ys[k])) {
      EXPECT_TRUE(std::isnan(mn[k]) && std::isnan(mx[k])) << "NaN must propagate at " << k;
    } else {
      EXPECT_EQ(mn[k], std::min(xs[k], ys[k]));
      EXPECT_EQ(mx[k], std::max(xs[k], ys[k]));
    }
    float want_fm = std::fmod(xs[k], ys[k]);
    if (std::isnan(want_fm)) EXPECT_TRUE(std::isnan(fm[k]));
    else EXPECT_EQ(fm[k], want_fm);
    if (std::isnan(xs[k])) EXPECT_TRUE(std::isnan(rd[k]));
    else EXPECT_EQ(rd[k], std::nearbyint(xs[k])) << xs[k];  // half to even
  }
  EXPECT_TRUE(o.sentinels_intact() && e.sentinels_intact() && mn.sentinels_intact() &&
              mx.sentinels_intact() && fm.sentinels_intact() && rd.sentinels_intact());
}

// Max and min reductions (max pooling, ReduceMax, softmax's row max) take a
// cheaper form than elementwise Max/Min: a NaN still propagates, from any
// position of the reduced range (first, last, middle), whether the reduction
// runs in vector lanes (columns) or serially (rows); infinities are ordinary.
TEST(CodegenJit, MaxMinReductionsPropagateNaN) {
  Expr m = var("m"), n = var("n"), i = var("i"), j = var("j");
  PrimFunc f;
  f.name = "maxmin";
  f.params = {buf("a", {m, n}), buf("cmax", {n}), buf("cmin", {n}), buf("rmax", {m})};
  f.sym_names = {"m", "n"};
  const double inf = std::numeric_limits<double>::infinity();
  auto column = [&](const char* name, int index, double init, bool is_max) {
    Expr acc = ld(name, index, {j}), x = ld("a", 0, {i, j});
    return tir::make_seq({
        tir::make_for("j", n, ForKind::kVectorized, tir::make_store(name, index, {j}, float_imm(init))),
        tir::make_for("i", m, ForKind::kSerial,
                      tir::make_for("j", n, ForKind::kVectorized,
                                    tir::make_store(name, index, {j}, is_max ? max(acc, x) : min(acc, x)))),
    });
  };
  f.body = tir::make_seq({
      column("cmax", 1, -inf, true),
      column("cmin", 2, inf, false),
      tir::make_for("i", m, ForKind::kSerial,
                    tir::make_seq({tir::make_store("rmax", 3, {i}, float_imm(-inf)),
                                   tir::make_for("j", n, ForKind::kSerial,
                                                 tir::make_store("rmax", 3, {i},
                                                                 max(ld("rmax", 3, {i}), ld("a", 0, {i, j}))))})),
  });
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  const int64_t mv = 5, nv = 37;
  Aligned<float> a(mv * nv), cmax(nv, 0, -1.0f), cmin(nv, 0, -1.0f), rmax(mv, 0, -1.0f);
  for (int64_t t = 0; t < mv * nv; ++t) a[t] = std::sin(0.37f * static_cast<float>(t));
  // NaN first in its column (row 0), last (row 4), in the middle, and
  // first/last in its row; infinities in columns without a NaN.
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {4, 5}, {2, 17}, {1, 0}, {3, 36}})
    a[r * nv + c] = NAN;
  a[2 * nv + 20] = static_cast<float>(inf);
  a[0 * nv + 21] = static_cast<float>(-inf);
  void* bufs[] = {a.data(), cmax.data(), cmin.data(), rmax.data()};
  int64_t syms[] = {mv, nv};
  mod->lookup("maxmin")(bufs, syms);
  for (int64_t c = 0; c < nv; ++c) {
    bool nan = false;
    float hi = -INFINITY, lo = INFINITY;
    for (int64_t r = 0; r < mv; ++r) {
      float v = a[r * nv + c];
      nan = nan || std::isnan(v);
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
    if (nan) {
      EXPECT_TRUE(std::isnan(cmax[c]) && std::isnan(cmin[c])) << "column " << c;
    } else {
      EXPECT_EQ(cmax[c], hi) << "column " << c;
      EXPECT_EQ(cmin[c], lo) << "column " << c;
    }
  }
  for (int64_t r = 0; r < mv; ++r) EXPECT_TRUE(std::isnan(rmax[r])) << "row " << r;  // each row holds a NaN
  EXPECT_TRUE(cmax.sentinels_intact() && cmin.sentinels_intact() && rmax.sentinels_intact());
}

// A tile of U rows x V vector lanes stored across its lanes (each lane a
// run of U contiguous elements, lanes W >= U apart: conv.panels' pixels x
// output channels into NCHW) is transposed in registers and stored as runs,
// not scattered, for power-of-two and odd U and V; elements between the runs
// are untouched. Where the runs would overlap (W < U), the lane-wise stores
// remain, and the later row still wins.
TEST(CodegenJit, TransposedTileStore) {
  struct Case {
    int64_t rows, lanes, stride;
    bool transposed;
  };
  for (Case c : {Case{8, 32, 11, true}, Case{6, 16, 9, true}, Case{3, 24, 3, true}, Case{16, 16, 19, true},
                 Case{2, 5, 4, true}, Case{8, 16, 5, false}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.lanes) + " stride " + std::to_string(c.stride));
    Expr u = var("u"), v = var("v");
    PrimFunc f;
    f.name = "tile";
    const int64_t size = c.lanes * c.stride + c.rows;
    f.params = {buf("a", {c.rows, c.lanes}), buf("out", {size})};
    Expr value = ld("a", 0, {u, v}) * float_imm(2.0) + float_imm(1.0);
    f.body = tir::make_for("u", c.rows, ForKind::kUnrolled,
                           tir::make_for("v", c.lanes, ForKind::kVectorized,
                                         tir::make_store("out", 1, {v * int_imm(c.stride) + u}, value)));
    auto mod = compile_ok({f});
    ASSERT_TRUE(mod);
    EXPECT_EQ(mod->llvm_ir().find("masked.scatter") == std::string::npos, c.transposed);
    Aligned<float> a(c.rows * c.lanes), out(size, -7.0f, -1.0f);
    for (int64_t t = 0; t < c.rows * c.lanes; ++t) a[t] = 0.25f * static_cast<float>(t) - 3.0f;
    void* bufs[] = {a.data(), out.data()};
    mod->lookup("tile")(bufs, nullptr);
    std::vector<float> want(static_cast<size_t>(size), -7.0f);
    for (int64_t uu = 0; uu < c.rows; ++uu)  // the loop order: a later row wins an overlap
      for (int64_t vv = 0; vv < c.lanes; ++vv)
        want[static_cast<size_t>(vv * c.stride + uu)] = 2.0f * a[uu * c.lanes + vv] + 1.0f;
    for (int64_t t = 0; t < size; ++t) EXPECT_EQ(out[t], want[static_cast<size_t>(t)]) << "element " << t;
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// Row sums with a one-element scratch accumulator, and column sums accumulated
// directly into the output; both inner loops vectorized.
TEST(CodegenJit, ReductionWithScratchAllocate) {
  Expr m = var("m"), n = var("n"), i = var("i"), k = var("k");
  PrimFunc f;
  f.name = "rowsum";
  f.params = {buf("a", {m, n}), buf("out", {m})};
  f.sym_names = {"m", "n"};
  Stmt inner = tir::make_seq({
      tir::make_store("acc", -1, {0}, float_imm(0.0)),
      tir::make_for("k", n, ForKind::kVectorized,
                    tir::make_store("acc", -1, {0},
                                    ld("acc", -1, {0}) + ld("a", 0, {i, k}) * float_imm(0.5))),
      tir::make_store("out", 1, {i}, ld("acc", -1, {0})),
  });
  f.body = tir::make_for("i", m, ForKind::kSerial, tir::make_allocate(buf("acc", {1}), inner));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  EXPECT_NE(mod->llvm_ir().find("reduce.fadd"), std::string::npos)
      << "the reduction loop was not vectorized";
  for (auto [mv, nv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {2, 1023}, {5, 0}}) {
    SCOPED_TRACE(std::to_string(mv) + "x" + std::to_string(nv));
    Aligned<float> a(mv * nv), out(mv, 0.0f, -5.0f);
    for (int64_t t = 0; t < mv * nv; ++t) a[t] = std::sin(0.1f * t) + 0.25f;
    void* bufs[] = {a.data(), out.data()};
    int64_t syms[] = {mv, nv};
    mod->lookup("rowsum")(bufs, syms);
    for (int64_t r = 0; r < mv; ++r) {
      double want = 0;
      for (int64_t c = 0; c < nv; ++c) want += 0.5 * a[r * nv + c];
      EXPECT_NEAR(out[r], want, 1e-5 * (1 + std::abs(want)) + 1e-4) << "row " << r;
    }
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// A scratch buffer larger than 64 KiB (heap) and one of symbolic size.
TEST(CodegenJit, LargeAndSymbolicAllocate) {
  Expr n = var("n"), i = var("i");
  const int64_t big = 100000;
  PrimFunc f;
  f.name = "scratch";
  f.params = {buf("a", {n}), buf("out", {n})};
  f.sym_names = {"n"};
  // big[j] = j for j < big; tmp[i] = a[i] * 3; out[i] = tmp[i] + big[i mod big]
  Stmt body = tir::make_seq({
      tir::make_for("j", big, ForKind::kVectorized,
                    tir::make_store("big", -1, {var("j")}, cast(f32, var("j")))),
      tir::make_for("i", n, ForKind::kSerial,
                    tir::make_store("tmp", -1, {i}, ld("a", 0, {i}) * float_imm(3.0))),
      tir::make_for("i", n, ForKind::kSerial,
                    tir::make_store("out", 1, {i},
                                    ld("tmp", -1, {i}) + ld("big", -1, {mod(i, int_imm(big))}))),
  });
  f.body = tir::make_allocate(buf("big", {big}), tir::make_allocate(buf("tmp", {n}), body));
  auto mod_ = compile_ok({f});
  ASSERT_TRUE(mod_);
  for (int64_t nv : {1, 17, 200001}) {
    Aligned<float> a(nv), out(nv, 0, 8.0f);
    for (int64_t t = 0; t < nv; ++t) a[t] = static_cast<float>(t % 13);
    void* bufs[] = {a.data(), out.data()};
    int64_t syms[] = {nv};
    mod_->lookup("scratch")(bufs, syms);
    for (int64_t t = 0; t < nv; ++t)
      ASSERT_EQ(out[t], a[t] * 3.0f + static_cast<float>(t % big)) << t;
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// Parallel loops: one inside a serial loop capturing its variable and a
// scratch buffer, and a parallel loop nested in a parallel loop (runs serially).
TEST(CodegenJit, ParallelWithThreadPool) {
  set_current_thread_pool(shared_thread_pool(2));
  Expr m = var("m"), n = var("n"), i = var("i"), j = var("j");
  PrimFunc f;
  f.name = "par";
  f.params = {buf("a", {m, n}), buf("out", {m, n}), buf("grid", {m, n}, i64t)};
  f.sym_names = {"m", "n"};
  Stmt first = tir::make_for(
      "i", m, ForKind::kSerial,
      tir::make_allocate(
          buf("tmp", {n}),
          tir::make_seq({
              tir::make_for("j", n, ForKind::kParallel,
                            tir::make_store("tmp", -1, {j}, ld("a", 0, {i, j}) * float_imm(2.0))),
              tir::make_for("j", n, ForKind::kParallel,
                            tir::make_store("out", 1, {i, j},
                                            ld("tmp", -1, {j}) + cast(f32, i))),
          })));
  Stmt second = tir::make_for(
      "i", m, ForKind::kParallel,
      tir::make_for("j", n, ForKind::kParallel,
                    tir::make_store("grid", 2, {i, j}, i * int_imm(1000) + j + n)));
  f.body = tir::make_seq({first, second});
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  for (auto [mv, nv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 17}, {7, 1023}}) {
    Aligned<float> a(mv * nv), out(mv * nv, 0, 3.25f);
    Aligned<int64_t> grid(mv * nv, 0, -1);
    for (int64_t t = 0; t < mv * nv; ++t) a[t] = static_cast<float>(t) * 0.5f;
    void* bufs[] = {a.data(), out.data(), grid.data()};
    int64_t syms[] = {mv, nv};
    mod->lookup("par")(bufs, syms);
    for (int64_t r = 0; r < mv; ++r)
      for (int64_t c = 0; c < nv; ++c) {
        ASSERT_EQ(out[r * nv + c], a[r * nv + c] * 2.0f + static_cast<float>(r));
        ASSERT_EQ(grid[r * nv + c], r * 1000 + c + nv);
      }
    EXPECT_TRUE(out.sentinels_intact() && grid.sentinels_intact());
  }
  set_current_thread_pool(nullptr);
}

// A select whose arm loads out of bounds unless the guard holds (padding).
TEST(CodegenJit, GuardedLoadInSelect) {
  Expr n = var("n"), i = var("i");
  PrimFunc f;
  f.name = "pad";
  f.params = {buf("a", {n}), buf("out", {n + 2})};
  f.sym_names = {"n"};
  Expr inside = logical_and(le(int_imm(1), i), le(i, n));
  f.body = tir::make_for("i", n + 2, ForKind::kVectorized,
                         tir::make_store("out", 1, {i},
                                         select(inside, ld("a", 0, {i - 1}), float_imm(-1.0))));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  for (int64_t nv : {1, 3, 17, 1023}) {
    Aligned<float> a(nv), out(nv + 2, 0, 9.0f);
    for (int64_t t = 0; t < nv; ++t) a[t] = static_cast<float>(t + 1);
    void* bufs[] = {a.data(), out.data()};
    int64_t syms[] = {nv};
    mod->lookup("pad")(bufs, syms);
    EXPECT_EQ(out[0], -1.0f);
    EXPECT_EQ(out[nv + 1], -1.0f);
    for (int64_t t = 1; t <= nv; ++t) ASSERT_EQ(out[t], static_cast<float>(t));
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// A zero-padded stride-2 read of a row of symbolic length n, its clamp in the
// form the simplifier writes (the offset outside the min: max(0, min(n, 2i) -
// 1)): the select's condition implies the clamp is the identity on the lanes
// it takes, so the vector is one masked span load, no gather. Without the
// select (an edge-replicating read, the clamp acting) the edge lanes are
// gathered. Both match the scalar definition at every length.
TEST(CodegenJit, ClampedStridedLoads) {
  // Vectors of 16 outputs, the last one guarded: i = 16 o + l.
  Expr n = var("n"), i = int_imm(16) * var("o") + var("l");
  Expr at = int_imm(2) * i - int_imm(1);
  Expr clamped = max(int_imm(0), min(n, int_imm(2) * i) - int_imm(1));
  Expr m = floordiv(n - int_imm(1), int_imm(2)) + int_imm(1);
  for (bool padded : {true, false}) {
    PrimFunc f;
    f.name = padded ? "zero_pad_s2" : "edge_s2";
    f.params = {buf("a", {n}), buf("out", {m})};
    f.sym_names = {"n"};
    Expr value = ld("a", 0, {clamped});
    if (padded) value = select(logical_and(le(int_imm(0), at), lt(at, n)), value, float_imm(0.0));
    f.body = tir::make_for(
        "o", floordiv(m + int_imm(15), int_imm(16)), ForKind::kSerial,
        tir::make_for("l", int_imm(16), ForKind::kVectorized,
                      tir::make_if(lt(i, m), tir::make_store("out", 1, {i}, value))));
    auto mod = compile_ok({f});
    ASSERT_TRUE(mod);
    EXPECT_EQ(mod->llvm_ir().find("masked.gather") == std::string::npos, padded) << f.name;
    for (int64_t nv : {1, 2, 3, 17, 40, 1023}) {
      int64_t mv = (nv - 1) / 2 + 1;
      Aligned<float> a(nv), out(mv, 0, 9.0f);
      for (int64_t t = 0; t < nv; ++t) a[t] = static_cast<float>(t + 1);
      void* bufs[] = {a.data(), out.data()};
      int64_t syms[] = {nv};
      mod->lookup(f.name)(bufs, syms);
      for (int64_t t = 0; t < mv; ++t) {
        int64_t j = 2 * t - 1;
        float want = j >= 0 && j < nv ? a[j] : padded ? 0.f : a[std::clamp<int64_t>(j, 0, nv - 1)];
        ASSERT_EQ(out[t], want) << f.name << " n " << nv << " i " << t;
      }
      EXPECT_TRUE(out.sentinels_intact());
    }
  }
}

// Lanes at constant distances that are not a constant stride (the lane
// variable's floordiv and mod) are one masked span load and a shuffle, not a
// gather: out[v] = a[v mod 4, v floordiv 4] (Winograd output tiles, 56 lanes),
// out[v] = a[v floordiv 2] (a nearest upsampling: lanes share elements), and
// and a 64-lane one under a select whose arm skips every fourth lane, with a
// buffer of 3 planes placed just before a page the process may not read: the
// skipped lanes' plane would lie in it, so reading it would fault.
TEST(CodegenJit, PermutedLoadsAreShuffles) {
  Expr v = var("v");
  struct Case {
    std::string name;
    int64_t planes, width, lanes;
    bool upsample, guarded;
  };
  for (const Case& c : {Case{"tiles", 4, 14, 56, false, false}, Case{"upsample", 1, 8, 16, true, false},
                        Case{"tiles_arm", 3, 16, 64, false, true}}) {
    PrimFunc f;
    f.name = c.name;
    f.params = {buf("a", {int_imm(c.planes), int_imm(c.width)}), buf("out", {int_imm(c.lanes)})};
    Expr value = c.upsample ? ld("a", 0, {int_imm(0), floordiv(v, int_imm(2))})
                            : ld("a", 0, {mod(v, int_imm(4)), floordiv(v, int_imm(4))});
    if (c.guarded) value = select(lt(mod(v, int_imm(4)), int_imm(3)), value, float_imm(-1.0));
    f.body = tir::make_for("v", int_imm(c.lanes), ForKind::kVectorized, tir::make_store("out", 1, {v}, value));
    auto mod_ = compile_ok({f});
    ASSERT_TRUE(mod_);
    EXPECT_EQ(mod_->llvm_ir().find("masked.gather"), std::string::npos) << c.name;
    // All of a span read: one plain load; in the arm, one masked load.
    EXPECT_NE(mod_->llvm_ir().find(c.guarded ? "masked.load" : "shufflevector"), std::string::npos) << c.name;
    // a starts 64-byte aligned and, when its size is a multiple of 64 bytes
    // (tiles_arm), its last element ends where a PROT_NONE page begins.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    ASSERT_EQ(mprotect(static_cast<char*>(map) + page, page, PROT_NONE), 0);
    float* a = reinterpret_cast<float*>(static_cast<char*>(map) + page) - (c.planes * c.width + 15) / 16 * 16;
    Aligned<float> out(c.lanes, 0, 9.0f);
    for (int64_t t = 0; t < c.planes * c.width; ++t) a[t] = static_cast<float>(t + 1);
    void* bufs[] = {a, out.data()};
    mod_->lookup(f.name)(bufs, nullptr);
    for (int64_t t = 0; t < c.lanes; ++t) {
      float want = c.upsample ? a[t / 2] : c.guarded && t % 4 == 3 ? -1.f : a[(t % 4) * c.width + t / 4];
      ASSERT_EQ(out[t], want) << c.name << " lane " << t;
    }
    munmap(map, 2 * page);
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// A guarded store in a vectorized loop (the tail of a split axis) is one
// store masked to the lanes in range, its loads masked too: nothing past n is
// read or written (the sentinels stay), and every element below n is.
TEST(CodegenJit, GuardedStoreInVectorLoopIsMasked) {
  Expr n = var("n"), o = var("o"), i = var("i");
  PrimFunc f;
  f.name = "tail";
  f.params = {buf("a", {n}), buf("out", {n})};
  f.sym_names = {"n"};
  Expr at = i + o * 16;
  Stmt store = tir::make_store("out", 1, {at}, ld("a", 0, {at}) * float_imm(2.0));
  f.body = tir::make_for("o", floordiv(n + 15, int_imm(16)), ForKind::kSerial,
                         tir::make_for("i", int_imm(16), ForKind::kVectorized, tir::make_if(lt(at, n), store)));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  EXPECT_NE(mod->llvm_ir().find("llvm.masked.store"), std::string::npos);
  for (int64_t nv : {1, 3, 16, 17, 1023}) {
    Aligned<float> a(nv, 0.0f, NAN), out(nv, 0.0f, 9.0f);
    for (int64_t t = 0; t < nv; ++t) a[t] = static_cast<float>(t + 1);
    void* bufs[] = {a.data(), out.data()};
    int64_t syms[] = {nv};
    mod->lookup("tail")(bufs, syms);
    for (int64_t t = 0; t < nv; ++t) ASSERT_EQ(out[t], 2.0f * static_cast<float>(t + 1)) << "n=" << nv;
    EXPECT_TRUE(out.sentinels_intact());
  }
}

// A select whose condition is the same for every lane of a vectorized loop
// (a Concat choosing its part by the outer channel loop) branches to the arm
// it takes, on any vector width (56: not a power of two), with no masked
// loads of the arm it does not take: out[c, j] is a[c, j]
// for c < 2 and b[c - 2, j] after, and neither input is read past its end
// (their sentinels stay; the clamped index keeps the other arm in bounds).
TEST(CodegenJit, UniformSelectInVectorLoopBranches) {
  Expr c = var("c"), j = var("j");
  for (int64_t width : {56, 16}) {
    PrimFunc f;
    f.name = "concat" + std::to_string(width);
    Expr w = int_imm(width);
    f.params = {buf("a", {int_imm(2), w}), buf("b", {int_imm(3), w}), buf("out", {int_imm(5), w})};
    Expr from_a = ld("a", 0, {min(c, int_imm(1)), j});
    Expr from_b = ld("b", 1, {max(int_imm(0), c - int_imm(2)), j});
    f.body = tir::make_for("c", int_imm(5), ForKind::kSerial,
                           tir::make_for("j", w, ForKind::kVectorized,
                                         tir::make_store("out", 2, {c, j}, select(lt(c, int_imm(2)), from_a, from_b))));
    auto mod = compile_ok({f});
    ASSERT_TRUE(mod);
    EXPECT_EQ(mod->llvm_ir().find("llvm.masked.load"), std::string::npos) << width;
    Aligned<float> a(2 * width, 0.0f, NAN), b(3 * width, 0.0f, NAN), out(5 * width, 0.0f, 9.0f);
    for (int64_t t = 0; t < 2 * width; ++t) a[t] = static_cast<float>(t + 1);
    for (int64_t t = 0; t < 3 * width; ++t) b[t] = static_cast<float>(-t - 1);
    void* bufs[] = {a.data(), b.data(), out.data()};
    mod->lookup(f.name)(bufs, nullptr);
    for (int64_t t = 0; t < 5 * width; ++t) ASSERT_EQ(out[t], t < 2 * width ? a[t] : b[t - 2 * width]) << width << " " << t;
    EXPECT_TRUE(out.sentinels_intact());
    EXPECT_TRUE(a.sentinels_intact());
    EXPECT_TRUE(b.sentinels_intact());
  }
}

// f32 math calls in a vectorized loop of constant width (an activation in a
// convolution's write-back, 14 lanes for a 14-wide plane) are emitted on
// vectors of that width, and give what the scalar expansions give.
TEST(CodegenJit, MathCallsInVectorLoop) {
  Expr i = var("i");
  PrimFunc f;
  f.name = "act14";
  f.params = {buf("a", {int_imm(14)}), buf("out", {int_imm(14)})};
  Expr a = ld("a", 0, {i});
  Expr v = call("sigmoid", f32, {a}) + call("exp", f32, {a}) * call("tanh", f32, {a}) + call("erf", f32, {a});
  f.body = tir::make_for("i", int_imm(14), ForKind::kVectorized, tir::make_store("out", 1, {i}, v));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  EXPECT_NE(mod->llvm_ir().find("<14 x float>"), std::string::npos);
  Aligned<float> x(14), out(14, 0, 9.0f);
  for (int t = 0; t < 14; ++t) x[t] = -6.5f + t;
  void* bufs[] = {x.data(), out.data()};
  mod->lookup("act14")(bufs, nullptr);
  for (int t = 0; t < 14; ++t) {
    double xv = x[t];
    double want = 1 / (1 + std::exp(-xv)) + std::exp(xv) * std::tanh(xv) + std::erf(xv);
    EXPECT_NEAR(out[t], want, 1e-5 * (1 + std::fabs(want))) << "x=" << xv;
  }
  EXPECT_TRUE(out.sentinels_intact());
}

// A prefetch is a hint: one llvm.prefetch per 64-byte line of its span, no
// effect on results, and no fault when it points past the end of the buffer.
TEST(CodegenJit, PrefetchIsAHint) {
  Expr i = var("i");
  PrimFunc f;
  f.name = "pf";
  f.params = {buf("a", {int_imm(64)}), buf("out", {int_imm(64)})};
  Stmt pf = tir::make_prefetch("a", 0, f32, {i + int_imm(1 << 20)}, 32);  // far past the end
  f.body = tir::make_for("i", int_imm(64), ForKind::kSerial,
                         tir::make_seq({pf, tir::make_store("out", 1, {i}, ld("a", 0, {i}) + float_imm(1.0))}));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  const std::string& ir = mod->llvm_ir();
  EXPECT_NE(ir.find("llvm.prefetch"), std::string::npos);
  EXPECT_NE(tir::print_stmt(f.body).find("prefetch a#0[i + 1048576] x32"), std::string::npos) << tir::print_stmt(f.body);
  Aligned<float> a(64), out(64, 0, 9.0f);
  for (int t = 0; t < 64; ++t) a[t] = static_cast<float>(t);
  void* bufs[] = {a.data(), out.data()};
  mod->lookup("pf")(bufs, nullptr);
  for (int t = 0; t < 64; ++t) ASSERT_EQ(out[t], static_cast<float>(t + 1));
  EXPECT_TRUE(out.sentinels_intact());
}

// compile() may run on several threads at once (LLVM is initialized once).
TEST(CodegenJit, ConcurrentCompiles) {
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &ok] {
      PrimFunc f = add_func(17 + t, ForKind::kVectorized);
      auto r = compile({f});
      if (!r.is_ok()) return;
      Aligned<float> a(17 + t, 1.0f), b(17 + t, 2.0f), c(17 + t, 0.0f, -1.0f);
      void* bufs[] = {a.data(), b.data(), c.data()};
      (*r)->lookup(f.name)(bufs, nullptr);
      bool good = c.sentinels_intact();
      for (int k = 0; k < 17 + t; ++k) good = good && c[k] == 3.0f;
      ok[t] = good ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
}

TEST(CodegenJit, ErrorsAreStatuses) {
  Expr i = var("i");
  PrimFunc f;
  f.name = "bad";
  f.params = {buf("out", {4})};
  f.body = tir::make_for("i", 4, ForKind::kSerial,
                         tir::make_store("out", 0, {i}, cast(f32, var("nobody"))));
  auto r = compile({f});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("nobody"), std::string::npos) << r.status().message();

  PrimFunc g;
  g.name = "bad_scratch";
  g.params = {buf("out", {4})};
  g.body = tir::make_for("i", 4, ForKind::kSerial,
                         tir::make_store("out", 0, {i}, ld("missing", -1, {i})));
  auto r2 = compile({g});
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("missing"), std::string::npos) << r2.status().message();

  auto r3 = compile({add_func(3, ForKind::kSerial), add_func(3, ForKind::kSerial)});
  ASSERT_FALSE(r3.is_ok());
  EXPECT_NE(r3.status().message().find("duplicate"), std::string::npos);
}

TEST(CodegenJit, HostTargetString) {
  std::string s = host_target_string();
  std::printf("host target: %s\n", s.c_str());
  ASSERT_NE(s.find('-'), std::string::npos);
  EXPECT_EQ(s, host_target_string());
#if defined(__x86_64__)
  EXPECT_EQ(s.rfind("x86_64-", 0), 0u);
#endif
}

// ---------------------------------------------------------------------------
// Narrow float storage types: loads decode to f32, stores encode (round to
// nearest even), casts round; compared with the support/dtype.h conversions.

TEST(CodegenJit, NarrowFloatLoadStoreCast) {
  const DType narrow[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ,
                          DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ};
  std::vector<float> xs;
  for (int k = -3000; k <= 3000; ++k) xs.push_back(k * 0.37f + k * k * 0.011f);
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-6f, -3e-8f, 65504.0f, 65520.0f, 70000.0f, 448.0f,
                  464.0f, 465.0f, 57344.0f, 61440.0f, 1e30f, 1.00390625f, 1.005859375f})
    xs.push_back(v);
  size_t count = xs.size();
  Expr n = var("n"), i = var("i");
  for (DType t : narrow) {
    SCOPED_TRACE(dtype_name(t));
    // store: narrow[i] = cast(x[i]); twice: out[i] = f32(narrow[i]) * 2 computed in t,
    // nosat (float8 only): raw[i] = cast_nosat(x[i]).
    PrimFunc f;
    f.name = std::string("narrow_") + dtype_name(t);
    f.params = {buf("x", {n}), buf("q", {n}, t), buf("back", {n}), buf("twice", {n}, t)};
    f.sym_names = {"n"};
    std::vector<tir::Stmt> body = {
        tir::make_store("q", 1, {i}, cast(t, ld("x", 0, {i}))),
        tir::make_store("back", 2, {i}, cast(f32, ld("q", 1, {i}, t))),
        tir::make_store("twice", 3, {i}, ld("q", 1, {i}, t) * float_imm(2.0, t)),
    };
    f.body = tir::make_for("i", n, ForKind::kVectorized, tir::make_seq(body));
    auto mod = compile_ok({f});
    ASSERT_TRUE(mod);
    int64_t size = dtype_size(t);
    Aligned<float> x(count), back(count);
    // Kernels assume 64-byte aligned buffers (the runtime guarantees it).
    Aligned<unsigned char> q((count + kPad) * size), twice((count + kPad) * size);
    std::memcpy(x.data(), xs.data(), count * 4);
    void* bufs[] = {x.data(), q.data(), back.data(), twice.data()};
    int64_t syms[] = {static_cast<int64_t>(count)};
    mod->lookup(f.name)(bufs, syms);
    for (size_t k = 0; k < count; ++k) {
      float want = round_to_narrow_float(xs[k], t);
      unsigned char want_bits[2];
      narrow_float_store(want_bits, t, want);
      ASSERT_EQ(std::memcmp(&q[k * size], want_bits, size), 0) << "x=" << xs[k];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(back[k])) << "x=" << xs[k];
      } else {
        ASSERT_EQ(back[k], want) << "x=" << xs[k];
      }
      unsigned char twice_bits[2];
      narrow_float_store(twice_bits, t, want * 2.0f);
      ASSERT_EQ(std::memcmp(&twice[k * size], twice_bits, size), 0) << "x=" << xs[k];
    }
  }
  // Known encodings: f16 and bf16 round to nearest even, float8 saturates.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3C00);      // tie, to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3C02);      // tie, to even (up)
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);                // rounds to infinity
  EXPECT_EQ(f32_to_f16(5.96046448e-8f), 0x0001);          // smallest subnormal
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);            // tie, to even
  EXPECT_EQ(f32_to_f8(1000.0f, DType::kFloat8E4M3FN, true), 0x7E);   // 448
  EXPECT_EQ(f32_to_f8(1000.0f, DType::kFloat8E4M3FN, false), 0x7F);  // NaN
  EXPECT_EQ(f32_to_f8(1e6f, DType::kFloat8E5M2, false), 0x7C);       // inf
  EXPECT_EQ(f8_to_f32(0x7E, DType::kFloat8E4M3FN), 448.0f);
  EXPECT_EQ(f8_to_f32(0x7B, DType::kFloat8E5M2), 57344.0f);
  EXPECT_EQ(f8_to_f32(0x01, DType::kFloat8E4M3FNUZ), std::ldexp(1.0f, -10));
}

// ---------------------------------------------------------------------------
// Accuracy of the f32 polynomial expansions.

// Compiles out[i] = name(x[i]) (vectorized) and applies it to xs.
std::vector<float> run_unary(const std::string& name, const std::vector<float>& xs,
                             std::string* ir = nullptr) {
  Expr n = var("n"), i = var("i");
  PrimFunc f;
  f.name = "math_" + name;
  f.params = {buf("x", {n}), buf("out", {n})};
  f.sym_names = {"n"};
  f.body = tir::make_for("i", n, ForKind::kVectorized,
                         tir::make_store("out", 1, {i}, call(name, f32, {ld("x", 0, {i})})));
  auto mod = compile_ok({f});
  if (!mod) return {};
  if (ir) *ir = mod->llvm_ir();
  Aligned<float> x(xs.size()), out(xs.size(), 0, 1234.5f);
  std::memcpy(x.data(), xs.data(), xs.size() * sizeof(float));
  void* bufs[] = {x.data(), out.data()};
  int64_t syms[] = {static_cast<int64_t>(xs.size())};
  mod->lookup(f.name)(bufs, syms);
  EXPECT_TRUE(out.sentinels_intact());
  return std::vector<float>(out.data(), out.data() + xs.size());
}

// Error of got against the exact ref in units of the float spacing at ref.
double ulp_error(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  if (std::isnan(got)) return INFINITY;
  if (std::isinf(ref)) return got == ref ? 0 : INFINITY;
  double g = got;
  if (std::isinf(got)) g = std::copysign(std::ldexp(1.0, 128), got);  // one step past FLT_MAX
  double a = std::fabs(ref);
  int e = a < std::ldexp(1.0, -126) ? -126 : std::ilogb(a);
  double ulp = std::ldexp(1.0, std::max(e, -126) - 23);
  if (a >= std::ldexp(1.0, 128)) return (g == std::copysign(std::ldexp(1.0, 128), ref)) ? 0 : INFINITY;
  return std::fabs(g - ref) / ulp;
}

// Dense inputs: a sweep through all float bit patterns (both signs, subnormals,
// inf, nan), a fine linear grid near zero, and special values.
std::vector<float> dense_inputs() {
  std::vector<float> xs;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 997) {
    uint32_t b = static_cast<uint32_t>(bits);
    float v;
    std::memcpy(&v, &b, 4);
    xs.push_back(v);
  }
  for (int k = -1000000; k <= 1000000; ++k) xs.push_back(k * 2e-5f);
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 1.17549435e-38f,
                  88.72283f, 88.7228394f, -87.33654f, -103.9f, -104.0f, 89.0f, 0.625f, -0.625f,
                  9.0f, -9.0f, 1.0f, -1.0f, 3.4028235e38f, -3.4028235e38f})
    xs.push_back(v);
  return xs;
}

struct ErrorStats {
  double max_ulp = 0;
  float worst_x = 0;
  double max_abs = 0;
  double max_rel = 0;
};

TEST(CodegenJitMath, AccuracyF32) {
  const std::vector<float> xs = dense_inputs();
  struct Fn {
    const char* name;
    std::function<double(double)> ref;
  };
  const Fn fns[] = {
      {"exp", [](double x) { return std::exp(x); }},
      {"log", [](double x) { return std::log(x); }},
      {"tanh", [](double x) { return std::tanh(x); }},
      {"sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
      {"erf", [](double x) { return std::erf(x); }},
      {"sin", [](double x) { return std::sin(x); }},
      {"cos", [](double x) { return std::cos(x); }},
      {"atan", [](double x) { return std::atan(x); }},
      {"asin", [](double x) { return std::asin(x); }},
      {"acos", [](double x) { return std::acos(x); }},
  };
  for (const Fn& fn : fns) {
    SCOPED_TRACE(fn.name);
    std::vector<float> got = run_unary(fn.name, xs);
    ASSERT_EQ(got.size(), xs.size());
    ErrorStats st, st_sincos_range;
    for (size_t k = 0; k < xs.size(); ++k) {
      float x = xs[k];
      bool trig = std::string(fn.name) == "sin" || std::string(fn.name) == "cos";
      if (trig && !(std::fabs(x) <= 1e5f)) {  // reduction accurate to ~1e6; inf/nan give nan
        if (!std::isfinite(x)) {
          ASSERT_TRUE(std::isnan(got[k])) << fn.name << "(" << x << ")";
        }
        continue;
      }
      double ref = fn.ref(static_cast<double>(x));
      if ((std::string(fn.name) == "exp" || std::string(fn.name) == "sigmoid") && ref < 0x1p-126) {
        // Results below FLT_MIN are flushed to 0 (no subnormal arithmetic); see exp_f32.
        ASSERT_EQ(got[k], 0.0f) << fn.name << "(" << x << ")";
        continue;
      }
      double u = ulp_error(got[k], ref);
      if (std::string(fn.name) == "tanh" && std::fabs(x) < 0.625f && x != 0) {
        // Near 0 the relative error is the measure (tanh x ~ x).
        st.max_rel = std::max(st.max_rel, std::fabs(got[k] - ref) / std::fabs(ref));
        continue;
      }
      if (std::string(fn.name) == "erf") {
        if (std::isnan(ref)) ASSERT_TRUE(std::isnan(got[k]));
        else st.max_abs = std::max(st.max_abs, std::fabs(got[k] - ref));
      }
      if (u > st.max_ulp) {
        st.max_ulp = u;
        st.worst_x = x;
      }
    }
    std::printf("%-8s max ulp %.3g at x=%.9g; max rel (tanh near 0) %.3g; max abs %.3g\n", fn.name,
                st.max_ulp, st.worst_x, st.max_rel, st.max_abs);
    std::string name = fn.name;
    if (name == "erf") {
      EXPECT_LT(st.max_abs, 1e-6);
    } else {
      EXPECT_LE(st.max_ulp, 4.0) << "worst at x=" << st.worst_x;
    }
    if (name == "tanh") {
      EXPECT_LT(st.max_rel, 1e-6);
    }
  }
}

TEST(CodegenJitMath, PowF32) {
  Expr n = var("n"), i = var("i");
  PrimFunc f;
  f.name = "powk";
  f.params = {buf("x", {n}), buf("y", {n}), buf("out", {n})};
  f.sym_names = {"n"};
  f.body = tir::make_for("i", n, ForKind::kVectorized,
                         tir::make_store("out", 2, {i},
                                         call("pow", f32, {ld("x", 0, {i}), ld("y", 1, {i})})));
  auto mod = compile_ok({f});
  ASSERT_TRUE(mod);
  std::vector<float> xs, ys;
  for (int a = 0; a < 400; ++a)
    for (int b = 0; b < 400; ++b) {
      xs.push_back(std::ldexp(1.0f + a / 400.0f, a % 40 - 20));
      ys.push_back(-12.0f + b * 0.06f);
    }
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, -8.0f, INFINITY, -INFINITY,
                            NAN, 1e-40f, 3.0f, -3.0f};
  for (float x : specials)
    for (float y : specials) {
      xs.push_back(x);
      ys.push_back(y);
    }
  size_t total = xs.size();
  Aligned<float> x(total), y(total), out(total, 0, 77.0f);
  std::memcpy(x.data(), xs.data(), total * 4);
  std::memcpy(y.data(), ys.data(), total * 4);
  void* bufs[] = {x.data(), y.data(), out.data()};
  int64_t syms[] = {static_cast<int64_t>(total)};
  mod->lookup("powk")(bufs, syms);
  double max_ulp = 0;
  for (size_t k = 0; k < total; ++k) {
    double ref = std::pow(static_cast<double>(xs[k]), static_cast<double>(ys[k]));
    double u = ulp_error(out[k], ref);
    max_ulp = std::max(max_ulp, u);
    ASSERT_LE(u, 2.0) << "pow(" << xs[k] << ", " << ys[k] << ") = " << out[k] << ", want " << ref;
    if (ref == 0 || std::isinf(ref)) {
      EXPECT_EQ(std::signbit(out[k]), std::signbit(ref)) << "pow(" << xs[k] << ", " << ys[k] << ")";
    }
  }
  std::printf("pow      max ulp %.3g\n", max_ulp);
  EXPECT_TRUE(out.sentinels_intact());
}

TEST(CodegenJitMath, VectorizedExpHasNoLibmCall) {
  std::string ir;
  std::vector<float> xs(100, 1.0f);
  std::vector<float> got = run_unary("exp", xs, &ir);
  ASSERT_EQ(got.size(), xs.size());
  EXPECT_NEAR(got[0], 2.7182817f, 1e-6f);
  const bool avx512 = host_target_string().find("avx512f") != std::string::npos;
  EXPECT_NE(ir.find(avx512 ? "<16 x float>" : "<8 x float>"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("@expf"), std::string::npos);
  EXPECT_EQ(ir.find("@llvm.exp."), std::string::npos);
  EXPECT_EQ(ir.find("@exp("), std::string::npos);
}

}  // namespace
}  // namespace kiln::codegen
