// Reductions and normalizations: inferred shapes (axes as attribute or input,
// keepdims, noop_with_empty_axes) and numerics of the multi-stage lowerings
// (naive and default schedules, interpreted) against C++ references.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::expect_close;
using testing::make_tensor;
using testing::ramp;
using testing::run_node;
using testing::tt;

std::unique_ptr<Graph> new_graph(int64_t opset) {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = opset;
  return g;
}

Tensor i64s(std::vector<int64_t> vals) {
  Tensor t(DType::kInt64, {static_cast<int64_t>(vals.size())});
  for (size_t i = 0; i < vals.size(); ++i) t.data_as<int64_t>()[i] = vals[i];
  return t;
}

// Reference reduction of a row-major tensor over `axes`, keepdims layout-free
// (the output is in row-major order of the kept dims).
std::vector<double> ref_reduce(const std::vector<int64_t>& shape, const std::vector<double>& x,
                               const std::vector<bool>& reduced, double init,
                               const std::function<double(double, double)>& combine,
                               const std::function<double(double, int64_t)>& finalize = nullptr) {
  std::vector<int64_t> out_dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d]) out_dims.push_back(shape[d]);
  }
  int64_t out_n = 1, count = 1;
  for (int64_t d : out_dims) out_n *= d;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) count *= shape[d];
  }
  std::vector<double> acc(static_cast<size_t>(out_n), init);
  for (size_t i = 0; i < x.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), o = 0, stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      int64_t c = rem % shape[d];
      rem /= shape[d];
      if (!reduced[d]) {
        o += c * stride;
        stride *= shape[d];
      }
    }
    acc[static_cast<size_t>(o)] = combine(acc[static_cast<size_t>(o)], x[i]);
  }
  if (finalize) {
    for (double& a : acc) a = finalize(a, count);
  }
  return acc;
}

std::vector<double> f32(std::vector<double> v) {
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

// ---- reduce: inference ------------------------------------------------------------------

TEST(ReduceInfer, AxesAttributeInputKeepdimsAndNoop) {
  auto g = new_graph(18);
  Value* x = g->add_input("x", tt(DType::kFloat32, {var("n"), 3, 5}));
  Value* axes = g->add_constant("axes", i64s({-1, 0}));
  Value* empty = g->add_constant("empty", Tensor(DType::kInt64, {0}));
  Node* a = g->add_node("ReduceSum", {x, axes}, {"a"});
  Node* b = g->add_node("ReduceMax", {x, axes}, {"b"});
  b->set_attr("keepdims", Attribute::of_int(0));
  Node* c = g->add_node("ReduceMean", {x}, {"c"});
  Node* d = g->add_node("ReduceProd", {x, empty}, {"d"});
  d->set_attr("noop_with_empty_axes", Attribute::of_int(1));
  Node* e = g->add_node("ArgMax", {x}, {"e"});
  e->set_attr("axis", Attribute::of_int(1));
  e->set_attr("keepdims", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(a->output(0)->type().to_string(), "f32[1, 3, 1]");
  EXPECT_EQ(b->output(0)->type().to_string(), "f32[3]");
  EXPECT_EQ(c->output(0)->type().to_string(), "f32[1, 1, 1]");
  EXPECT_EQ(d->output(0)->type().to_string(), "f32[n, 3, 5]");
  EXPECT_EQ(e->output(0)->type().to_string(), "i64[n, 5]");

  auto old = new_graph(11);
  Value* y = old->add_input("y", tt(DType::kInt32, {2, 3, 4}));
  Node* f = old->add_node("ReduceL1", {y}, {"f"});
  f->set_attr("axes", Attribute::of_ints({1}));
  f->set_attr("keepdims", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(*old).is_ok());
  EXPECT_EQ(f->output(0)->type().to_string(), "i32[2, 4]");
}

TEST(ReduceInfer, DynamicAxesGiveFreshDimsAndBadAxisIsAnError) {
  // Axes known only at run time: keepdims keeps the rank, the dims are fresh
  // (data-dependent) symbols; the runtime kernel computes the result.
  auto g = new_graph(18);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
  Value* axes = g->add_input("axes", tt(DType::kInt64, {1}));
  Node* dyn = g->add_node("ReduceSum", {x, axes}, {"a"}, "", "dyn");
  Value* bad_axes = g->add_input("bad_axes", tt(DType::kInt32, {1}));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  ASSERT_EQ(dyn->output(0)->type().rank(), 2);
  EXPECT_FALSE(dyn->output(0)->type().is_static());
  g->add_node("ReduceSum", {x, bad_axes}, {"b"}, "", "int32_axes");
  Status st = testing::infer(*g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("int32_axes"), std::string::npos) << st.message();

  auto g2 = new_graph(11);
  Value* y = g2->add_input("y", tt(DType::kFloat32, {2, 3}));
  Node* r = g2->add_node("ReduceMin", {y}, {"r"});
  r->set_attr("axes", Attribute::of_ints({2}));
  EXPECT_FALSE(testing::infer(*g2).is_ok());
}

TEST(ReduceInfer, ShapeProductSymValue) {
  auto g = new_graph(18);
  Value* s = g->add_input("s", tt(DType::kInt64, {3}));
  s->set_sym_value(std::vector<Expr>{var("n"), Expr(3), Expr(4)});
  Node* p = g->add_node("ReduceProd", {s}, {"p"});
  p->set_attr("keepdims", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  ASSERT_TRUE(p->output(0)->sym_value().has_value());
  EXPECT_TRUE(prove_equal((*p->output(0)->sym_value())[0], mul(var("n"), Expr(12))));
}

// ---- reduce: numerics ------------------------------------------------------------------------

struct ReduceCase {
  const char* op;
  double init;
  std::function<double(double, double)> combine;
  std::function<double(double, int64_t)> finalize;
  double lo = -2, hi = 2;
};

void PrintTo(const ReduceCase& c, std::ostream* os) { *os << c.op; }

class ReduceNumeric : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceNumeric, AxesVariants) {
  const ReduceCase& c = GetParam();
  const std::vector<int64_t> shape{3, 5, 7};
  std::vector<double> x = f32(ramp(105, c.lo, c.hi, 7));
  struct Variant {
    std::vector<int64_t> axes;
    bool keep;
  };
  for (const Variant& v : {Variant{{1}, true}, Variant{{0, 2}, false}, Variant{{}, false}, Variant{{-1}, true}}) {
    auto g = new_graph(13);
    Value* in = g->add_input("x", tt(DType::kFloat32, {var("a"), 5, 7}));
    Node* n = g->add_node(c.op, {in}, {"y"});
    if (!v.axes.empty()) n->set_attr("axes", Attribute::of_ints(v.axes));
    n->set_attr("keepdims", Attribute::of_int(v.keep ? 1 : 0));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    std::vector<bool> reduced(3, v.axes.empty());
    for (int64_t a : v.axes) reduced[static_cast<size_t>(a < 0 ? a + 3 : a)] = true;
    auto want = ref_reduce(shape, x, reduced, c.init, c.combine, c.finalize);
    auto out = run_node(*g, *n, {make_tensor(DType::kFloat32, shape, x)}, {{"a", 3}});
    ASSERT_EQ(out.size(), 1u);
    expect_close(out[0], want, 3e-6, std::string(c.op) + " axes " + std::to_string(v.axes.size()));
  }
}

const double kInf = std::numeric_limits<double>::infinity();

INSTANTIATE_TEST_SUITE_P(
    Ops, ReduceNumeric,
    ::testing::Values(
        ReduceCase{"ReduceSum", 0, [](double a, double x) { return a + x; }, nullptr},
        ReduceCase{"ReduceMean", 0, [](double a, double x) { return a + x; },
                   [](double a, int64_t n) { return a / static_cast<double>(n); }},
        ReduceCase{"ReduceMax", -kInf, [](double a, double x) { return std::max(a, x); }, nullptr},
        ReduceCase{"ReduceMin", kInf, [](double a, double x) { return std::min(a, x); }, nullptr},
        ReduceCase{"ReduceProd", 1, [](double a, double x) { return a * x; }, nullptr, 0.8, 1.2},
        ReduceCase{"ReduceL1", 0, [](double a, double x) { return a + std::fabs(x); }, nullptr},
        ReduceCase{"ReduceL2", 0, [](double a, double x) { return a + x * x; },
                   [](double a, int64_t) { return std::sqrt(a); }},
        ReduceCase{"ReduceSumSquare", 0, [](double a, double x) { return a + x * x; }, nullptr},
        ReduceCase{"ReduceLogSum", 0, [](double a, double x) { return a + x; },
                   [](double a, int64_t) { return std::log(a); }, 0.1, 2},
        ReduceCase{"ReduceLogSumExp", 0, [](double a, double x) { return a + std::exp(x); },
                   [](double a, int64_t) { return std::log(a); }, -5, 5}),
    [](const ::testing::TestParamInfo<ReduceCase>& info) { return std::string(info.param.op); });

TEST(ReduceNumeric, IntegerSumMeanMaxWithAxesInput) {
  auto g = new_graph(18);
  Value* x = g->add_input("x", tt(DType::kInt32, {2, 3}));
  Value* axes = g->add_constant("axes", i64s({1}));
  Node* s = g->add_node("ReduceSum", {x, axes}, {"s"});
  Node* m = g->add_node("ReduceMean", {x, axes}, {"m"});
  Node* mx = g->add_node("ReduceMax", {x, axes}, {"mx"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> xv{-7, 2, 0, 5, 9, -1};
  std::vector<Tensor> in{make_tensor(DType::kInt32, {2, 3}, xv), i64s({1})};
  expect_close(run_node(*g, *s, in).at(0), {-5, 13}, 0, "int sum");
  expect_close(run_node(*g, *m, in).at(0), {-1, 4}, 0, "int mean truncates");
  expect_close(run_node(*g, *mx, in).at(0), {2, 9}, 0, "int max");
}

TEST(ReduceNumeric, NoopWithEmptyAxes) {
  auto g = new_graph(18);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 2}));
  Node* n = g->add_node("ReduceSum", {x}, {"y"});
  n->set_attr("noop_with_empty_axes", Attribute::of_int(1));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  expect_close(run_node(*g, *n, {make_tensor(DType::kFloat32, {2, 2}, {1, 2, 3, 4})}).at(0), {1, 2, 3, 4}, 0, "noop");
}

TEST(ReduceNumeric, ArgMaxArgMinTiesAndLastIndex) {
  auto g = new_graph(13);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 5}));
  Node* amax = g->add_node("ArgMax", {x}, {"amax"});
  amax->set_attr("axis", Attribute::of_int(1));
  Node* amax_last = g->add_node("ArgMax", {x}, {"amax_last"});
  amax_last->set_attr("axis", Attribute::of_int(-1));
  amax_last->set_attr("select_last_index", Attribute::of_int(1));
  amax_last->set_attr("keepdims", Attribute::of_int(0));
  Node* amin = g->add_node("ArgMin", {x}, {"amin"});
  amin->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(amax->output(0)->type().to_string(), "i64[2, 1]");
  EXPECT_EQ(amax_last->output(0)->type().to_string(), "i64[2]");
  EXPECT_EQ(amin->output(0)->type().to_string(), "i64[1, 5]");
  Tensor xt = make_tensor(DType::kFloat32, {2, 5}, {1, 3, 3, -1, 2, -4, -4, 0, 7, 7});
  expect_close(run_node(*g, *amax, {xt}).at(0), {1, 3}, 0, "argmax first");
  expect_close(run_node(*g, *amax_last, {xt}).at(0), {2, 4}, 0, "argmax last");
  expect_close(run_node(*g, *amin, {xt}).at(0), {1, 1, 1, 0, 0}, 0, "argmin axis 0");
}

// ---- normalization ------------------------------------------------------------------------------

// Softmax of x [rows, cols] along cols (row-major rows of length `cols`).
std::vector<double> ref_softmax_rows(const std::vector<double>& x, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / cols; ++r) {
    double m = -kInf, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = log ? x[r * cols + c] - m - std::log(s) : std::exp(x[r * cols + c] - m) / s;
    }
  }
  return y;
}

// Moves axis 1 of a [a, b, c] tensor last: [a, c, b].
std::vector<double> swap12(const std::vector<double>& x, int64_t a, int64_t b, int64_t c) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < c; ++k) y[(i * c + k) * b + j] = x[(i * b + j) * c + k];
  return y;
}

TEST(NormNumeric, SoftmaxOpset13PerAxis) {
  auto g = new_graph(13);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3, 5}));
  Node* last = g->add_node("Softmax", {x}, {"last"});
  Node* mid = g->add_node("Softmax", {x}, {"mid"});
  mid->set_attr("axis", Attribute::of_int(1));
  Node* lmid = g->add_node("LogSoftmax", {x}, {"lmid"});
  lmid->set_attr("axis", Attribute::of_int(1));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> xv = f32(ramp(30, -4, 4, 5));
  Tensor xt = make_tensor(DType::kFloat32, {2, 3, 5}, xv);
  expect_close(run_node(*g, *last, {xt}).at(0), ref_softmax_rows(xv, 5, false), 1e-6, "softmax -1");
  // axis 1: softmax of the transposed rows, transposed back.
  auto t = swap12(xv, 2, 3, 5);
  expect_close(run_node(*g, *mid, {xt}).at(0), swap12(ref_softmax_rows(t, 3, false), 2, 5, 3), 1e-6, "softmax 1");
  expect_close(run_node(*g, *lmid, {xt}).at(0), swap12(ref_softmax_rows(t, 3, true), 2, 5, 3), 2e-6,
               "logsoftmax 1");
}

TEST(NormNumeric, SoftmaxOpset11FlattensAtAxis) {
  auto g = new_graph(11);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3, 5}));
  Node* dflt = g->add_node("Softmax", {x}, {"dflt"});  // axis 1: rows of 15
  Node* hm = g->add_node("Hardmax", {x}, {"hm"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> xv = f32(ramp(30, -4, 4, 6));
  Tensor xt = make_tensor(DType::kFloat32, {2, 3, 5}, xv);
  expect_close(run_node(*g, *dflt, {xt}).at(0), ref_softmax_rows(xv, 15, false), 1e-6, "softmax opset 11");
  std::vector<double> want(30, 0);
  for (int r = 0; r < 2; ++r) {
    int best = 0;
    for (int c = 1; c < 15; ++c) {
      if (xv[r * 15 + c] > xv[r * 15 + best]) best = c;
    }
    want[r * 15 + best] = 1;
  }
  expect_close(run_node(*g, *hm, {xt}).at(0), want, 0, "hardmax opset 11");
}

TEST(NormNumeric, SoftmaxWithoutOpsetFailsOnlyWhenAmbiguous) {
  auto g = new_graph(11);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3, 5}));
  Node* amb = g->add_node("Softmax", {x}, {"amb"});
  Node* last = g->add_node("Softmax", {x}, {"last"});
  last->set_attr("axis", Attribute::of_int(2));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  g->opsets.clear();
  const OpDef* def = find_op("", "Softmax");
  for (Node* n : {amb, last}) {
    int counter = 0;
    LowerContext ctx;
    ctx.name_counter = &counter;
    ctx.inputs.push_back(tir::Buffer{"x", DType::kFloat32, {2, 3, 5}});
    ctx.input_index.push_back(0);
    ctx.outputs.push_back(tir::Buffer{n->output(0)->name(), DType::kFloat32, {2, 3, 5}});
    auto r = def->lower(*n, ctx);
    EXPECT_EQ(r.is_ok(), n == last) << n->output(0)->name();
  }
}

TEST(NormNumeric, LayerNormalizationWithStatistics) {
  auto g = new_graph(17);
  Value* x = g->add_input("x", tt(DType::kFloat32, {var("b"), 3, 4}));
  Value* scale = g->add_input("scale", tt(DType::kFloat32, {3, 4}));
  Value* bias = g->add_input("bias", tt(DType::kFloat32, {4}));
  Node* n = g->add_node("LayerNormalization", {x, scale, bias}, {"y", "mean", "rstd"});
  n->set_attr("axis", Attribute::of_int(1));
  n->set_attr("epsilon", Attribute::of_float(1e-3));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "f32[b, 3, 4]");
  EXPECT_EQ(n->output(1)->type().to_string(), "f32[b, 1, 1]");
  std::vector<double> xv = f32(ramp(24, -3, 3, 8)), sv = f32(ramp(12, 0.5, 2, 9)), bv = f32(ramp(4, -1, 1, 10));
  std::vector<double> want, wmean, wrstd;
  for (int r = 0; r < 2; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < 12; ++i) m += xv[r * 12 + i];
    m /= 12;
    for (int i = 0; i < 12; ++i) v += (xv[r * 12 + i] - m) * (xv[r * 12 + i] - m);
    v /= 12;
    double rs = 1 / std::sqrt(v + static_cast<float>(1e-3));
    wmean.push_back(m);
    wrstd.push_back(rs);
    for (int i = 0; i < 12; ++i) want.push_back((xv[r * 12 + i] - m) * rs * sv[i] + bv[i % 4]);
  }
  auto out = run_node(*g, *n,
                      {make_tensor(DType::kFloat32, {2, 3, 4}, xv), make_tensor(DType::kFloat32, {3, 4}, sv),
                       make_tensor(DType::kFloat32, {4}, bv)},
                      {{"b", 2}});
  ASSERT_EQ(out.size(), 3u);
  expect_close(out[0], want, 1e-5, "layernorm y");
  expect_close(out[1], wmean, 1e-6, "layernorm mean");
  expect_close(out[2], wrstd, 1e-5, "layernorm rstd");
}

TEST(NormNumeric, BatchInstanceGroupNormalization) {
  const int64_t N = 2, C = 4, S = 3;
  std::vector<double> xv = f32(ramp(N * C * S, -2, 2, 11));
  std::vector<double> scale = f32(ramp(C, 0.5, 1.5, 12)), bias = f32(ramp(C, -1, 1, 13));
  std::vector<double> mean = f32(ramp(C, -0.5, 0.5, 14)), var = f32(ramp(C, 0.5, 2, 15));
  const double eps = static_cast<float>(1e-5);
  auto g = new_graph(15);
  Value* x = g->add_input("x", tt(DType::kFloat32, {N, C, S}));
  Value* vs = g->add_input("scale", tt(DType::kFloat32, {C}));
  Value* vb = g->add_input("bias", tt(DType::kFloat32, {C}));
  Value* vm = g->add_input("mean", tt(DType::kFloat32, {C}));
  Value* vv = g->add_input("var", tt(DType::kFloat32, {C}));
  Value* gs = g->add_input("gscale", tt(DType::kFloat32, {2}));
  Value* gb = g->add_input("gbias", tt(DType::kFloat32, {2}));
  Node* bn = g->add_node("BatchNormalization", {x, vs, vb, vm, vv}, {"bn"});
  Node* in = g->add_node("InstanceNormalization", {x, vs, vb}, {"in"});
  Node* gn = g->add_node("GroupNormalization", {x, vs, vb}, {"gn"});
  gn->set_attr("num_groups", Attribute::of_int(2));
  Node* gn18 = g->add_node("GroupNormalization", {x, gs, gb}, {"gn18"});
  gn18->set_attr("num_groups", Attribute::of_int(2));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  Tensor xt = make_tensor(DType::kFloat32, {N, C, S}, xv);
  Tensor st = make_tensor(DType::kFloat32, {C}, scale), bt = make_tensor(DType::kFloat32, {C}, bias);

  std::vector<double> want_bn;
  for (int64_t i = 0; i < N * C * S; ++i) {
    int64_t c = (i / S) % C;
    want_bn.push_back((xv[i] - mean[c]) / std::sqrt(var[c] + eps) * scale[c] + bias[c]);
  }
  expect_close(run_node(*g, *bn, {xt, st, bt, make_tensor(DType::kFloat32, {C}, mean),
                                  make_tensor(DType::kFloat32, {C}, var)})
                   .at(0),
               want_bn, 1e-5, "batchnorm");

  // Normalizes groups of `per` consecutive elements; param index from element index.
  auto ref_groups = [&](int64_t per, const std::function<double(int64_t)>& sc, const std::function<double(int64_t)>& bi) {
    std::vector<double> y(xv.size());
    for (size_t g0 = 0; g0 < xv.size(); g0 += per) {
      double m = 0, v = 0;
      for (int64_t k = 0; k < per; ++k) m += xv[g0 + k];
      m /= per;
      for (int64_t k = 0; k < per; ++k) v += (xv[g0 + k] - m) * (xv[g0 + k] - m);
      v /= per;
      for (int64_t k = 0; k < per; ++k) {
        int64_t i = static_cast<int64_t>(g0) + k;
        y[i] = (xv[i] - m) / std::sqrt(v + eps) * sc(i) + bi(i);
      }
    }
    return y;
  };
  auto chan = [&](int64_t i) { return (i / S) % C; };
  expect_close(run_node(*g, *in, {xt, st, bt}).at(0),
               ref_groups(S, [&](int64_t i) { return scale[chan(i)]; }, [&](int64_t i) { return bias[chan(i)]; }),
               1e-5, "instancenorm");
  expect_close(run_node(*g, *gn, {xt, st, bt}).at(0),
               ref_groups(2 * S, [&](int64_t i) { return scale[chan(i)]; }, [&](int64_t i) { return bias[chan(i)]; }),
               1e-5, "groupnorm per channel");
  std::vector<double> gsv{0.5, 2.0}, gbv{1.0, -1.0};
  expect_close(run_node(*g, *gn18, {xt, make_tensor(DType::kFloat32, {2}, gsv), make_tensor(DType::kFloat32, {2}, gbv)})
                   .at(0),
               ref_groups(2 * S, [&](int64_t i) { return gsv[chan(i) / 2]; }, [&](int64_t i) { return gbv[chan(i) / 2]; }),
               1e-5, "groupnorm per group");
}

// Training mode (opset 15): the batch's own mean and population variance per
// channel normalize the input (the given mean and var do not), and the
// running statistics are input * momentum + batch * (1 - momentum). An
// omitted running_var output is simply not computed.
TEST(NormNumeric, BatchNormTrainingModeUsesBatchStatistics) {
  const int64_t N = 3, C = 2, S = 5;
  std::vector<double> xv = f32(ramp(N * C * S, -3, 2, 21));
  std::vector<double> scale = f32(ramp(C, 0.5, 1.5, 22)), bias = f32(ramp(C, -1, 1, 23));
  std::vector<double> mean = f32(ramp(C, -0.5, 0.5, 24)), var = f32(ramp(C, 0.5, 2, 25));
  const double eps = static_cast<float>(1e-3), momentum = static_cast<float>(0.8);
  std::vector<double> bmean(C, 0), bvar(C, 0);
  for (int64_t i = 0; i < N * C * S; ++i) bmean[(i / S) % C] += xv[i] / (N * S);
  for (int64_t i = 0; i < N * C * S; ++i) bvar[(i / S) % C] += std::pow(xv[i] - bmean[(i / S) % C], 2) / (N * S);
  std::vector<double> want_y, want_rm, want_rv;
  for (int64_t i = 0; i < N * C * S; ++i) {
    int64_t c = (i / S) % C;
    want_y.push_back((xv[i] - bmean[c]) / std::sqrt(bvar[c] + eps) * scale[c] + bias[c]);
  }
  for (int64_t c = 0; c < C; ++c) {
    want_rm.push_back(mean[c] * momentum + bmean[c] * (1 - momentum));
    want_rv.push_back(var[c] * momentum + bvar[c] * (1 - momentum));
  }
  for (bool with_var : {true, false}) {
    auto g = new_graph(15);
    Value* x = g->add_input("x", tt(DType::kFloat32, {N, C, S}));
    std::vector<Value*> ps;
    for (const char* name : {"scale", "bias", "mean", "var"}) ps.push_back(g->add_input(name, tt(DType::kFloat32, {C})));
    std::vector<std::string> outs{"y", "running_mean"};
    if (with_var) outs.push_back("running_var");
    Node* bn = g->add_node("BatchNormalization", {x, ps[0], ps[1], ps[2], ps[3]}, outs, "", "bn_train");
    bn->set_attr("training_mode", Attribute::of_int(1));
    bn->set_attr("epsilon", Attribute::of_float(1e-3f));
    bn->set_attr("momentum", Attribute::of_float(0.8f));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    EXPECT_EQ(bn->output(1)->type().to_string(), "f32[2]");
    auto out = run_node(*g, *bn,
                        {make_tensor(DType::kFloat32, {N, C, S}, xv), make_tensor(DType::kFloat32, {C}, scale),
                         make_tensor(DType::kFloat32, {C}, bias), make_tensor(DType::kFloat32, {C}, mean),
                         make_tensor(DType::kFloat32, {C}, var)});
    ASSERT_EQ(out.size(), with_var ? 3u : 2u);
    expect_close(out[0], want_y, 2e-5, "y");
    expect_close(out[1], want_rm, 1e-6, "running_mean");
    if (with_var) expect_close(out[2], want_rv, 1e-6, "running_var");
  }
  // Without training_mode, running statistics outputs remain unsupported (opset 6-9 form).
  auto g = new_graph(15);
  Value* x = g->add_input("x", tt(DType::kFloat32, {1, 2}));
  Value* p = g->add_input("p", tt(DType::kFloat32, {2}));
  g->add_node("BatchNormalization", {x, p, p, p, p}, {"y", "rm"}, "", "bn_infer");
  Status st = testing::infer(*g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("bn_infer"), std::string::npos);
}

TEST(NormNumeric, LpAndMeanVarianceNormalization) {
  auto g = new_graph(13);
  Value* x = g->add_input("x", tt(DType::kFloat64, {3, 4}));
  Node* l2 = g->add_node("LpNormalization", {x}, {"l2"});
  Node* l1 = g->add_node("LpNormalization", {x}, {"l1"});
  l1->set_attr("axis", Attribute::of_int(0));
  l1->set_attr("p", Attribute::of_int(1));
  Node* mvn = g->add_node("MeanVarianceNormalization", {x}, {"mvn"});
  mvn->set_attr("axes", Attribute::of_ints({1}));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> xv = ramp(12, -3, 3, 16);
  Tensor xt = make_tensor(DType::kFloat64, {3, 4}, xv);
  std::vector<double> w2(12), w1(12), wm(12);
  for (int r = 0; r < 3; ++r) {
    double s = 0, m = 0, v = 0;
    for (int c = 0; c < 4; ++c) s += xv[r * 4 + c] * xv[r * 4 + c], m += xv[r * 4 + c];
    m /= 4;
    for (int c = 0; c < 4; ++c) v += (xv[r * 4 + c] - m) * (xv[r * 4 + c] - m);
    v /= 4;
    for (int c = 0; c < 4; ++c) {
      w2[r * 4 + c] = xv[r * 4 + c] / std::sqrt(s);
      wm[r * 4 + c] = (xv[r * 4 + c] - m) / (std::sqrt(v) + 1e-9);
    }
  }
  for (int c = 0; c < 4; ++c) {
    double s = 0;
    for (int r = 0; r < 3; ++r) s += std::fabs(xv[r * 4 + c]);
    for (int r = 0; r < 3; ++r) w1[r * 4 + c] = xv[r * 4 + c] / s;
  }
  expect_close(run_node(*g, *l2, {xt}).at(0), w2, 1e-12, "lp2");
  expect_close(run_node(*g, *l1, {xt}).at(0), w1, 1e-12, "lp1");
  expect_close(run_node(*g, *mvn, {xt}).at(0), wm, 1e-12, "mvn");
}

// Axes as a run-time input: inference gives fresh dims, the runtime kernel
// reduces; compared with the compiled reduction of the same axes.
TEST(Reduce, RuntimeAxesKernelMatchesCompiled) {
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"}) {
    SCOPED_TRACE(op);
    auto g = new_graph(18);
    Value* x = g->add_input("x", tt(DType::kFloat32, {3, 4, 5}));
    Value* axes_in = g->add_input("axes", tt(DType::kInt64, {2}));
    Node* dyn = g->add_node(op, {x, axes_in}, {"dyn"});
    dyn->set_attr("keepdims", Attribute::of_int(0));
    Tensor axes_const(DType::kInt64, {2});
    axes_const.data_as<int64_t>()[0] = -1;
    axes_const.data_as<int64_t>()[1] = 0;
    Value* axes_c = g->add_constant("axes_c", axes_const);
    Node* fixed = g->add_node(op, {x, axes_c}, {"fixed"});
    fixed->set_attr("keepdims", Attribute::of_int(0));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    ASSERT_EQ(dyn->output(0)->type().rank(), 1);
    EXPECT_FALSE(dyn->output(0)->type().is_static());
    Tensor xt = make_tensor(DType::kFloat32, {3, 4, 5}, ramp(60, -2, 2, 5));
    std::vector<Tensor> want = run_node(*g, *fixed, {xt, axes_const});
    auto kernel = find_op("", op)->kernel(*dyn);
    ASSERT_TRUE(kernel.is_ok());
    std::vector<Tensor> got;
    ASSERT_TRUE((*kernel)({xt, axes_const}, got).is_ok());
    ASSERT_EQ(got[0].shape(), (std::vector<int64_t>{4}));
    expect_close(got[0], testing::to_vector(want.at(0)), 1e-5, op);
  }
}

}  // namespace
}  // namespace kiln::ops
