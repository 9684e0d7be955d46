// Elementwise ops: shape inference with broadcasting and symbols, sym_value
// propagation through shape arithmetic, and numerics of the lowering (naive
// and default schedules, interpreted) against C++ references.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::expect_close;
using testing::make_tensor;
using testing::ramp;
using testing::run_node;
using testing::tt;

std::unique_ptr<Graph> new_graph(int64_t opset = 17) {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = opset;
  g->source = "test.onnx";
  return g;
}

// ---- inference ------------------------------------------------------------------

TEST(ElementwiseInfer, BroadcastWithSymbols) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {var("n"), 1, 4}));
  Value* y = g->add_input("y", tt(DType::kFloat32, {3, 1}));
  Node* n = g->add_node("Add", {x, y}, {"z"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "f32[n, 3, 4]");
}

TEST(ElementwiseInfer, ComparisonGivesBoolAndVariadicBroadcasts) {
  auto g = new_graph();
  Value* a = g->add_input("a", tt(DType::kInt32, {5, 1}));
  Value* b = g->add_input("b", tt(DType::kInt32, {1, 7}));
  Value* c = g->add_input("c", tt(DType::kInt32, {7}));
  Node* lt = g->add_node("Less", {a, b}, {"lt"});
  Node* mx = g->add_node("Max", {a, b, c}, {"mx"});
  Node* w = g->add_node("Where", {lt->output(0), a, c}, {"w"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(lt->output(0)->type().to_string(), "bool[5, 7]");
  EXPECT_EQ(mx->output(0)->type().to_string(), "i32[5, 7]");
  EXPECT_EQ(w->output(0)->type().to_string(), "i32[5, 7]");
}

TEST(ElementwiseInfer, IncompatibleShapesNameTheNodeAndFile) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {3}));
  Value* y = g->add_input("y", tt(DType::kFloat32, {4}));
  g->add_node("Mul", {x, y}, {"z"}, "", "my_mul");
  Status st = testing::infer(*g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("my_mul"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Mul"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("test.onnx"), std::string::npos) << st.message();
}

TEST(ElementwiseInfer, MixedDtypesRejected) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {3}));
  Value* y = g->add_input("y", tt(DType::kInt64, {3}));
  g->add_node("Add", {x, y}, {"z"});
  EXPECT_FALSE(testing::infer(*g).is_ok());
}

TEST(ElementwiseInfer, UnknownOpIsSkipped) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {3}));
  Node* u = g->add_node("NoSuchOp", {x}, {"u"});
  Node* r = g->add_node("Relu", {x}, {"r"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(u->output(0)->type().dtype, DType::kUndefined);
  EXPECT_EQ(r->output(0)->type().to_string(), "f32[3]");
}

TEST(ElementwiseInfer, CastAndUnsupportedGeluMode) {
  auto g = new_graph(20);
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, var("m")}));
  Node* c = g->add_node("Cast", {x}, {"c"});
  c->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt32)));
  Node* ge = g->add_node("Gelu", {x}, {"ge"});
  ge->set_attr("approximate", Attribute::of_string("cubic"));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(c->output(0)->type().to_string(), "i32[2, m]");
  auto r = find_op("", "Gelu")->lower;
  LowerContext ctx;
  int counter = 0;
  ctx.name_counter = &counter;
  ctx.inputs.push_back(tir::Buffer{"x", DType::kFloat32, {2, var("m")}});
  ctx.input_index.push_back(0);
  ctx.outputs.push_back(tir::Buffer{"ge", DType::kFloat32, {2, var("m")}});
  auto res = r(*ge, ctx);
  ASSERT_FALSE(res.is_ok());
  EXPECT_EQ(res.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(res.status().message().find("Gelu"), std::string::npos);
}

// ---- sym_value propagation ---------------------------------------------------------

Tensor i64s(std::vector<int64_t> shape, std::vector<int64_t> vals) {
  Tensor t(DType::kInt64, std::move(shape));
  for (size_t i = 0; i < vals.size(); ++i) t.data_as<int64_t>()[i] = vals[i];
  return t;
}

std::string sym_string(const Value* v) {
  if (!v->sym_value()) return "none";
  std::string s = "[";
  for (size_t i = 0; i < v->sym_value()->size(); ++i) {
    if (i) s += ", ";
    s += (*v->sym_value())[i].to_string();
  }
  return s + "]";
}

TEST(ElementwiseSym, ShapeArithmetic) {
  auto g = new_graph();
  g->bounds["n"] = Interval{1, std::nullopt};
  g->bounds["s"] = Interval{1, std::nullopt};
  Value* shape = g->add_input("shape", tt(DType::kInt64, {3}));
  shape->set_sym_value(std::vector<Expr>{var("n"), var("s"), Expr(64)});
  Value* two = g->add_constant("two", i64s({}, {2}));
  Value* heads = g->add_constant("heads", i64s({3}, {1, 1, 8}));
  Node* mul = g->add_node("Mul", {shape, two}, {"mul"});
  Node* div = g->add_node("Div", {shape, heads}, {"div"});
  Node* add = g->add_node("Add", {mul->output(0), div->output(0)}, {"add"});
  Node* neg = g->add_node("Neg", {add->output(0)}, {"neg"});
  Node* sub = g->add_node("Sub", {add->output(0), mul->output(0)}, {"sub"});
  Node* mx = g->add_node("Max", {shape, two}, {"mx"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(sym_string(mul->output(0)), "[2*n, 2*s, 128]");
  EXPECT_EQ(sym_string(div->output(0)), "[n, s, 8]");
  EXPECT_EQ(sym_string(add->output(0)), "[3*n, 3*s, 136]");
  EXPECT_EQ(sym_string(neg->output(0)), "[-3*n, -3*s, -136]");
  EXPECT_EQ(sym_string(sub->output(0)), "[n, s, 8]");
  EXPECT_EQ(sym_string(mx->output(0)), "[max(n, 2), max(s, 2), 64]");
}

TEST(ElementwiseSym, EqualWhereCastPattern) {
  // PyTorch's reshape-with--1 pattern: Where(Equal(shape, -1), ones, shape).
  auto g = new_graph();
  g->bounds["n"] = Interval{1, std::nullopt};
  Value* shape = g->add_input("shape", tt(DType::kInt64, {2}));
  shape->set_sym_value(std::vector<Expr>{var("n"), Expr(-1)});
  Value* minus1 = g->add_constant("minus1", i64s({}, {-1}));
  Value* ones = g->add_constant("ones", i64s({2}, {1, 1}));
  Node* eq = g->add_node("Equal", {shape, minus1}, {"eq"});
  Node* w = g->add_node("Where", {eq->output(0), ones, shape}, {"w"});
  Node* c = g->add_node("Cast", {w->output(0)}, {"c"});
  c->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt32)));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(eq->output(0)->type().to_string(), "bool[2]");
  EXPECT_EQ(sym_string(eq->output(0)), "[0, 1]");
  EXPECT_EQ(sym_string(w->output(0)), "[n, 1]");
  EXPECT_EQ(sym_string(c->output(0)), "[n, 1]");
}

TEST(ElementwiseSym, UnknownComparisonLeavesNoValue) {
  auto g = new_graph();
  Value* shape = g->add_input("shape", tt(DType::kInt64, {1}));
  shape->set_sym_value(std::vector<Expr>{var("q")});  // q unbounded
  Value* five = g->add_constant("five", i64s({1}, {5}));
  Node* eq = g->add_node("Equal", {shape, five}, {"eq"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_FALSE(eq->output(0)->sym_value().has_value());
}

// ---- numerics: unary -----------------------------------------------------------------

struct UnaryCase {
  const char* op;
  std::function<double(double)> ref;
  double lo, hi;
  std::map<std::string, double> attrs = {};
  int64_t opset = 17;
};

double erf_gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double softplus(double x) { return std::log1p(std::exp(x)); }

void PrintTo(const UnaryCase& c, std::ostream* os) { *os << c.op; }

class UnaryFloat : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryFloat, MatchesReference) {
  const UnaryCase& c = GetParam();
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    auto g = new_graph(c.opset);
    Value* x = g->add_input("x", tt(dt, {3, 17}));
    Node* n = g->add_node(c.op, {x}, {"y"});
    for (const auto& [k, v] : c.attrs) n->set_attr(k, Attribute::of_float(v));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    ASSERT_EQ(n->output(0)->type().to_string(), std::string(dtype_name(dt)) + "[3, 17]");
    std::vector<double> in = ramp(51, c.lo, c.hi);
    if (dt == DType::kFloat32) {
      for (double& v : in) v = static_cast<float>(v);
    }
    std::vector<double> want;
    for (double v : in) want.push_back(c.ref(v));
    auto out = run_node(*g, *n, {make_tensor(dt, {3, 17}, in)});
    ASSERT_EQ(out.size(), 1u);
    expect_close(out[0], want, dt == DType::kFloat32 ? 2e-5 : 1e-10, std::string(c.op) + " " + dtype_name(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, UnaryFloat,
    ::testing::Values(
        UnaryCase{"Relu", [](double x) { return x > 0 ? x : 0; }, -3, 3},
        UnaryCase{"LeakyRelu", [](double x) { return x < 0 ? 0.1 * x : x; }, -3, 3, {{"alpha", 0.1}}},
        UnaryCase{"Elu", [](double x) { return x < 0 ? 0.7 * (std::exp(x) - 1) : x; }, -3, 3, {{"alpha", 0.7}}},
        UnaryCase{"Selu",
                  [](double x) {
                    // The attribute defaults are f32 values.
                    const double alpha = 1.67326319217681884765625, gamma = 1.05070102214813232421875;
                    return gamma * (x <= 0 ? alpha * std::exp(x) - alpha : x);
                  },
                  -3, 3},
        UnaryCase{"Celu", [](double x) { return std::max(0.0, x) + std::min(0.0, 2 * (std::exp(x / 2) - 1)); }, -3, 3,
                  {{"alpha", 2.0}}},
        UnaryCase{"Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -8, 8},
        UnaryCase{"HardSigmoid", [](double x) { return std::max(0.0, std::min(1.0, 0.2 * x + 0.5)); }, -4, 4},
        UnaryCase{"HardSwish", [](double x) { return x * std::max(0.0, std::min(1.0, x / 6 + 0.5)); }, -5, 5},
        UnaryCase{"Tanh", [](double x) { return std::tanh(x); }, -4, 4},
        UnaryCase{"Exp", [](double x) { return std::exp(x); }, -5, 5},
        UnaryCase{"Log", [](double x) { return std::log(x); }, 0.01, 10},
        UnaryCase{"Sqrt", [](double x) { return std::sqrt(x); }, 0, 10},
        UnaryCase{"Reciprocal", [](double x) { return 1 / x; }, 0.5, 4},
        UnaryCase{"Neg", [](double x) { return -x; }, -3, 3},
        UnaryCase{"Abs", [](double x) { return std::fabs(x); }, -3, 3},
        UnaryCase{"Erf", [](double x) { return std::erf(x); }, -3, 3},
        UnaryCase{"Floor", [](double x) { return std::floor(x); }, -3, 3},
        UnaryCase{"Ceil", [](double x) { return std::ceil(x); }, -3, 3},
        UnaryCase{"Sign", [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }, -3, 3},
        UnaryCase{"Softplus", softplus, -10, 10},
        UnaryCase{"Softsign", [](double x) { return x / (1 + std::fabs(x)); }, -5, 5},
        UnaryCase{"Sin", [](double x) { return std::sin(x); }, -3, 3},
        UnaryCase{"Cos", [](double x) { return std::cos(x); }, -3, 3},
        UnaryCase{"Tan", [](double x) { return std::tan(x); }, -1.2, 1.2},
        UnaryCase{"Mish", [](double x) { return x * std::tanh(softplus(x)); }, -5, 5},
        UnaryCase{"Gelu", erf_gelu, -4, 4, {}, 20},
        UnaryCase{"ThresholdedRelu", [](double x) { return x > 0.5 ? x : 0; }, -2, 2, {{"alpha", 0.5}}},
        UnaryCase{"Shrink", [](double x) { return x < -1 ? x + 0.25 : (x > 1 ? x - 0.25 : 0); }, -3, 3,
                  {{"lambd", 1.0}, {"bias", 0.25}}},
        UnaryCase{"Identity", [](double x) { return x; }, -3, 3}),
    [](const ::testing::TestParamInfo<UnaryCase>& info) { return std::string(info.param.op); });

TEST(ElementwiseNumeric, GeluTanhAndRound) {
  auto g = new_graph(20);
  Value* x = g->add_input("x", tt(DType::kFloat32, {8}));
  Node* ge = g->add_node("Gelu", {x}, {"ge"});
  ge->set_attr("approximate", Attribute::of_string("tanh"));
  Node* r = g->add_node("Round", {x}, {"r"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> in{-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -3.7};
  std::vector<double> want_gelu, want_round{-2, -2, -0, 0, 2, 2, 0, -4};  // round half to even
  for (double v : in) {
    want_gelu.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v))));
  }
  expect_close(run_node(*g, *ge, {make_tensor(DType::kFloat32, {8}, in)}).at(0), want_gelu, 2e-5, "gelu tanh");
  expect_close(run_node(*g, *r, {make_tensor(DType::kFloat32, {8}, in)}).at(0), want_round, 0, "round");
}

TEST(ElementwiseNumeric, IsNaNIsInf) {
  auto g = new_graph(20);
  Value* x = g->add_input("x", tt(DType::kFloat32, {5}));
  Node* nan = g->add_node("IsNaN", {x}, {"nan"});
  Node* inf = g->add_node("IsInf", {x}, {"inf"});
  Node* pos = g->add_node("IsInf", {x}, {"pos"});
  pos->set_attr("detect_negative", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(nan->output(0)->type().to_string(), "bool[5]");
  Tensor in = make_tensor(DType::kFloat32, {5}, {1.0, NAN, INFINITY, -INFINITY, 0.0});
  expect_close(run_node(*g, *nan, {in}).at(0), {0, 1, 0, 0, 0}, 0, "isnan");
  expect_close(run_node(*g, *inf, {in}).at(0), {0, 0, 1, 1, 0}, 0, "isinf");
  expect_close(run_node(*g, *pos, {in}).at(0), {0, 0, 1, 0, 0}, 0, "isinf positive");
}

// ---- numerics: binary with broadcasting ----------------------------------------------------

// Reference broadcast of a binary function over static shapes.
std::vector<double> ref_broadcast(const std::vector<int64_t>& out, const std::vector<int64_t>& as,
                                  const std::vector<double>& a, const std::vector<int64_t>& bs,
                                  const std::vector<double>& b, const std::function<double(double, double)>& f) {
  int64_t numel = 1;
  for (int64_t d : out) numel *= d;
  auto flat = [&](int64_t o, const std::vector<int64_t>& s) {
    int64_t idx = 0, rem = o;
    std::vector<int64_t> coord(out.size());
    for (size_t k = out.size(); k-- > 0;) {
      coord[k] = rem % out[k];
      rem /= out[k];
    }
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t c = coord[out.size() - s.size() + k];
      idx = idx * s[k] + (s[k] == 1 ? 0 : c);
    }
    return idx;
  };
  std::vector<double> r;
  for (int64_t o = 0; o < numel; ++o) r.push_back(f(a[flat(o, as)], b[flat(o, bs)]));
  return r;
}

struct BinaryCase {
  const char* op;
  DType dtype;
  std::function<double(double, double)> ref;
  double lo, hi;
  DType out_dtype = DType::kUndefined;
};

void PrintTo(const BinaryCase& c, std::ostream* os) { *os << c.op << " " << dtype_name(c.dtype); }

class BinaryBroadcast : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryBroadcast, SymbolicBroadcast) {
  const BinaryCase& c = GetParam();
  auto g = new_graph();
  Value* a = g->add_input("a", tt(c.dtype, {var("n"), 1, 5}));
  Value* b = g->add_input("b", tt(c.dtype, {3, 1}));
  Node* n = g->add_node(c.op, {a, b}, {"y"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  DType out_dt = c.out_dtype == DType::kUndefined ? c.dtype : c.out_dtype;
  ASSERT_EQ(n->output(0)->type().to_string(), std::string(dtype_name(out_dt)) + "[n, 3, 5]");
  std::vector<double> av = ramp(10, c.lo, c.hi, 3), bv = ramp(3, c.lo, c.hi, 4);
  if (!dtype_is_float(c.dtype)) {
    for (double& v : av) v = std::round(v);
    for (double& v : bv) v = std::round(v);
    if (std::string(c.op) == "Div" || std::string(c.op) == "Mod") bv = {-3, 2, 5};
  } else if (c.dtype == DType::kFloat32) {
    for (double& v : av) v = static_cast<float>(v);
    for (double& v : bv) v = static_cast<float>(v);
  }
  auto want = ref_broadcast({2, 3, 5}, {2, 1, 5}, av, {3, 1}, bv, c.ref);
  auto out = run_node(*g, *n, {make_tensor(c.dtype, {2, 1, 5}, av), make_tensor(c.dtype, {3, 1}, bv)}, {{"n", 2}});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0], want, dtype_is_float(c.dtype) ? 1e-6 : 0, c.op);
}

double trunc_div(double a, double b) { return std::trunc(a / b); }

INSTANTIATE_TEST_SUITE_P(
    Ops, BinaryBroadcast,
    ::testing::Values(
        BinaryCase{"Add", DType::kFloat32, [](double a, double b) { return a + b; }, -3, 3},
        BinaryCase{"Sub", DType::kFloat64, [](double a, double b) { return a - b; }, -3, 3},
        BinaryCase{"Mul", DType::kFloat32, [](double a, double b) { return a * b; }, -3, 3},
        BinaryCase{"Div", DType::kFloat32, [](double a, double b) { return a / b; }, 0.5, 3},
        BinaryCase{"Pow", DType::kFloat32, [](double a, double b) { return std::pow(a, b); }, 0.5, 2},
        BinaryCase{"Add", DType::kInt32, [](double a, double b) { return a + b; }, -20, 20},
        BinaryCase{"Mul", DType::kInt64, [](double a, double b) { return a * b; }, -20, 20},
        BinaryCase{"Div", DType::kInt32, trunc_div, -20, 20},
        BinaryCase{"Div", DType::kInt64, trunc_div, -20, 20},
        BinaryCase{"Mod", DType::kInt32,
                   [](double a, double b) {
                     double r = std::fmod(a, b);
                     return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
                   },
                   -20, 20},
        BinaryCase{"Max", DType::kInt32, [](double a, double b) { return std::max(a, b); }, -20, 20},
        BinaryCase{"Min", DType::kFloat32, [](double a, double b) { return std::min(a, b); }, -3, 3},
        BinaryCase{"PRelu", DType::kFloat32, [](double x, double s) { return x < 0 ? s * x : x; }, -3, 3},
        BinaryCase{"Equal", DType::kInt64, [](double a, double b) { return a == b; }, -2, 2, DType::kBool},
        BinaryCase{"Less", DType::kFloat32, [](double a, double b) { return a < b; }, -3, 3, DType::kBool},
        BinaryCase{"Greater", DType::kInt32, [](double a, double b) { return a > b; }, -3, 3, DType::kBool},
        BinaryCase{"LessOrEqual", DType::kInt32, [](double a, double b) { return a <= b; }, -3, 3, DType::kBool},
        BinaryCase{"GreaterOrEqual", DType::kFloat64, [](double a, double b) { return a >= b; }, -3, 3,
                   DType::kBool},
        BinaryCase{"BitwiseAnd", DType::kInt32,
                   [](double a, double b) { return static_cast<double>(int64_t(a) & int64_t(b)); }, -20, 20},
        BinaryCase{"BitwiseOr", DType::kUInt8,
                   [](double a, double b) { return static_cast<double>(int64_t(a) | int64_t(b)); }, 0, 200},
        BinaryCase{"BitwiseXor", DType::kInt64,
                   [](double a, double b) { return static_cast<double>(int64_t(a) ^ int64_t(b)); }, -20, 20}),
    [](const ::testing::TestParamInfo<BinaryCase>& info) {
      return std::string(info.param.op) + "_" + dtype_name(info.param.dtype);
    });

TEST(ElementwiseNumeric, ModFmodAndFloatMod) {
  auto g = new_graph();
  Value* a = g->add_input("a", tt(DType::kInt32, {6}));
  Value* b = g->add_input("b", tt(DType::kInt32, {6}));
  Value* fa = g->add_input("fa", tt(DType::kFloat32, {6}));
  Value* fb = g->add_input("fb", tt(DType::kFloat32, {6}));
  Node* im = g->add_node("Mod", {a, b}, {"im"});
  im->set_attr("fmod", Attribute::of_int(1));
  Node* fm = g->add_node("Mod", {fa, fb}, {"fm"});
  fm->set_attr("fmod", Attribute::of_int(1));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> av{7, -7, 7, -7, 0, 13}, bv{3, 3, -3, -3, 5, 4};
  expect_close(run_node(*g, *im, {make_tensor(DType::kInt32, {6}, av), make_tensor(DType::kInt32, {6}, bv)}).at(0),
               {1, -1, 1, -1, 0, 1}, 0, "int fmod");
  std::vector<double> fav{7.5, -7.5, 7.5, -7.5, 0, 1.25}, fbv{2, 2, -2, -2, 3, 0.5};
  expect_close(
      run_node(*g, *fm, {make_tensor(DType::kFloat32, {6}, fav), make_tensor(DType::kFloat32, {6}, fbv)}).at(0),
      {1.5, -1.5, 1.5, -1.5, 0, 0.25}, 1e-6, "float fmod");
}

// Host kernels store doubles into integer tensors saturating, NaN as 0, and
// truncating toward zero (a C++ conversion out of range is undefined).
TEST(TensorElements, SetF64SaturatesIntegers) {
  const double nan = std::nan("");
  auto stored = [](DType dt, double v) {
    Tensor t(dt, {1});
    t.set_f64(0, v);
    return t.get_f64(0);
  };
  EXPECT_EQ(stored(DType::kInt8, 1e30), 127);
  EXPECT_EQ(stored(DType::kInt8, -1e30), -128);
  EXPECT_EQ(stored(DType::kInt8, -7.9), -7);
  EXPECT_EQ(stored(DType::kUInt8, -3), 0);
  EXPECT_EQ(stored(DType::kUInt8, 300), 255);
  EXPECT_EQ(stored(DType::kInt32, nan), 0);
  EXPECT_EQ(stored(DType::kUInt32, 1e10), 4294967295.0);
  EXPECT_EQ(stored(DType::kUInt64, -1), 0);
  EXPECT_EQ(stored(DType::kUInt64, nan), 0);
  EXPECT_EQ(stored(DType::kUInt64, 1e30), 18446744073709551615.0);
  EXPECT_EQ(stored(DType::kUInt64, 1e19), 1e19);  // above INT64_MAX, in range
  Tensor i64(DType::kInt64, {2});
  i64.set_f64(0, 1e30);
  i64.set_f64(1, -1e30);
  EXPECT_EQ(i64.get_i64(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64.get_i64(1), std::numeric_limits<int64_t>::min());
  Tensor f(DType::kFloat32, {1});
  f.set_f64(0, -1e30);
  EXPECT_EQ(f.get_i64(0), std::numeric_limits<int64_t>::min());
}

// Integer division never traps (SIGFPE): a zero divisor gives 0 for Div and
// both Mods, and the signed minimum divided by -1 wraps to itself with
// remainder 0. 37 elements: vector bodies and a scalar tail.
TEST(ElementwiseNumeric, IntegerDivisionByZeroIsDefined) {
  for (DType dt : {DType::kInt32, DType::kInt64, DType::kUInt8, DType::kInt8}) {
    auto g = new_graph();
    const int64_t n = 37;
    Value* a = g->add_input("a", tt(dt, {n}));
    Value* b = g->add_input("b", tt(dt, {n}));
    Node* div = g->add_node("Div", {a, b}, {"q"});
    Node* mod = g->add_node("Mod", {a, b}, {"r"});
    Node* fmod = g->add_node("Mod", {a, b}, {"f"});
    fmod->set_attr("fmod", Attribute::of_int(1));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    bool is_signed = dtype_is_signed(dt);
    double lo = dt == DType::kInt32 ? -2147483648.0 : dt == DType::kInt8 ? -128.0 : dt == DType::kInt64 ? -1e15 : 0;
    std::vector<double> av, bv, wq, wr, wf;
    const double divisors[] = {0, 3, -1, 0, 7, -2};
    for (int64_t i = 0; i < n; ++i) {
      double x = i % 5 == 0 ? lo : static_cast<double>((i * 7) % 23) - (is_signed ? 11 : 0);
      double d = divisors[i % 6];
      if (!is_signed && d < 0) d = 5;
      av.push_back(x);
      bv.push_back(d);
      if (d == 0) {
        wq.push_back(0);
        wr.push_back(0);
        wf.push_back(0);
        continue;
      }
      double q = std::trunc(x / d);
      if (d == -1 && x == lo && dt != DType::kInt64) q = lo;  // wraps
      double f = x - std::trunc(x / d) * d;
      double r = (f != 0 && ((f < 0) != (d < 0))) ? f + d : f;
      wq.push_back(q);
      wr.push_back(r);
      wf.push_back(f);
    }
    std::vector<Tensor> ins = {make_tensor(dt, {n}, av), make_tensor(dt, {n}, bv)};
    std::string what = dtype_name(dt);
    expect_close(run_node(*g, *div, ins).at(0), wq, 0, what + " Div");
    expect_close(run_node(*g, *mod, ins).at(0), wr, 0, what + " Mod");
    expect_close(run_node(*g, *fmod, ins).at(0), wf, 0, what + " Mod fmod=1");
  }
  auto g = new_graph();
  Value* a = g->add_input("a", tt(DType::kInt64, {2}));
  Value* b = g->add_input("b", tt(DType::kInt64, {2}));
  Node* div = g->add_node("Div", {a, b}, {"q"});
  Node* mod = g->add_node("Mod", {a, b}, {"r"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  const double min64 = -9223372036854775808.0;
  std::vector<Tensor> ins = {make_tensor(DType::kInt64, {2}, {min64, 5}), make_tensor(DType::kInt64, {2}, {-1, 0})};
  expect_close(run_node(*g, *div, ins).at(0), {min64, 0}, 0, "INT64_MIN / -1");
  expect_close(run_node(*g, *mod, ins).at(0), {0, 0}, 0, "INT64_MIN mod -1");
}

TEST(ElementwiseNumeric, VariadicSumMeanMinAndLogic) {
  auto g = new_graph();
  Value* a = g->add_input("a", tt(DType::kFloat32, {2, 3}));
  Value* b = g->add_input("b", tt(DType::kFloat32, {3}));
  Value* c = g->add_input("c", tt(DType::kFloat32, {2, 1}));
  Node* sum = g->add_node("Sum", {a, b, c}, {"sum"});
  Node* mean = g->add_node("Mean", {a, b, c}, {"mean"});
  Node* mn = g->add_node("Min", {a, b, c}, {"mn"});
  Node* one = g->add_node("Sum", {a}, {"one"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> av{1, -2, 3, 4, 5, -6}, bv{10, 20, 30}, cv{-1, 2};
  std::vector<double> ws, wm, wn;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      double x = av[i * 3 + j], y = bv[j], z = cv[i];
      ws.push_back(x + y + z);
      wm.push_back((x + y + z) / 3);
      wn.push_back(std::min({x, y, z}));
    }
  }
  std::vector<Tensor> ins{make_tensor(DType::kFloat32, {2, 3}, av), make_tensor(DType::kFloat32, {3}, bv),
                          make_tensor(DType::kFloat32, {2, 1}, cv)};
  expect_close(run_node(*g, *sum, ins).at(0), ws, 1e-6, "sum");
  expect_close(run_node(*g, *mean, ins).at(0), wm, 1e-6, "mean");
  expect_close(run_node(*g, *mn, ins).at(0), wn, 0, "min");
  expect_close(run_node(*g, *one, {ins[0]}).at(0), av, 0, "sum of one");

  auto lg = new_graph();
  Value* p = lg->add_input("p", tt(DType::kBool, {4}));
  Value* q = lg->add_input("q", tt(DType::kBool, {4}));
  Node* nand = lg->add_node("And", {p, q}, {"and"});
  Node* nor = lg->add_node("Or", {p, q}, {"or"});
  Node* nxor = lg->add_node("Xor", {p, q}, {"xor"});
  Node* nnot = lg->add_node("Not", {p}, {"not"});
  ASSERT_TRUE(testing::infer(*lg).is_ok());
  std::vector<Tensor> bins{make_tensor(DType::kBool, {4}, {0, 0, 1, 1}), make_tensor(DType::kBool, {4}, {0, 1, 0, 1})};
  expect_close(run_node(*lg, *nand, bins).at(0), {0, 0, 0, 1}, 0, "and");
  expect_close(run_node(*lg, *nor, bins).at(0), {0, 1, 1, 1}, 0, "or");
  expect_close(run_node(*lg, *nxor, bins).at(0), {0, 1, 1, 0}, 0, "xor");
  expect_close(run_node(*lg, *nnot, {bins[0]}).at(0), {1, 1, 0, 0}, 0, "not");
}

TEST(ElementwiseNumeric, WhereBroadcastsThreeWays) {
  auto g = new_graph();
  Value* cnd = g->add_input("c", tt(DType::kBool, {3, 1}));
  Value* x = g->add_input("x", tt(DType::kInt64, {1, 4}));
  Value* y = g->add_input("y", tt(DType::kInt64, {}));
  Node* w = g->add_node("Where", {cnd, x, y}, {"w"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(w->output(0)->type().to_string(), "i64[3, 4]");
  auto out = run_node(*g, *w,
                      {make_tensor(DType::kBool, {3, 1}, {1, 0, 1}), make_tensor(DType::kInt64, {1, 4}, {1, 2, 3, 4}),
                       make_tensor(DType::kInt64, {}, {-9})});
  expect_close(out.at(0), {1, 2, 3, 4, -9, -9, -9, -9, 1, 2, 3, 4}, 0, "where");
}

TEST(ElementwiseNumeric, CastTruncatesAndToBool) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {6}));
  Node* ci = g->add_node("Cast", {x}, {"ci"});
  ci->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt32)));
  Node* cb = g->add_node("Cast", {x}, {"cb"});
  cb->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kBool)));
  Node* back = g->add_node("Cast", {cb->output(0)}, {"back"});
  back->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kFloat64)));
  Node* u8 = g->add_node("Cast", {ci->output(0)}, {"u8"});
  u8->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kUInt8)));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> in{-2.7, -0.5, 0, 0.25, 2.9, 300};
  auto xt = make_tensor(DType::kFloat32, {6}, in);
  expect_close(run_node(*g, *ci, {xt}).at(0), {-2, 0, 0, 0, 2, 300}, 0, "to i32");
  Tensor b = run_node(*g, *cb, {xt}).at(0);
  expect_close(b, {1, 1, 0, 1, 1, 1}, 0, "to bool");
  expect_close(run_node(*g, *back, {b}).at(0), {1, 1, 0, 1, 1, 1}, 0, "bool to f64");
  expect_close(run_node(*g, *u8, {make_tensor(DType::kInt32, {6}, {-2, 0, 0, 0, 2, 300})}).at(0),
               {254, 0, 0, 0, 2, 44}, 0, "i32 to u8 wraps");
}

// 4-bit targets saturate, floats rounded half to even first (NaN to 0);
// 4-bit sources widen (int4 sign-extended). Values are one per byte.
TEST(ElementwiseNumeric, CastToAndFromFourBitIntegers) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {8}));
  Node* i4 = g->add_node("Cast", {x}, {"i4"});
  i4->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt4)));
  Node* u4 = g->add_node("Cast", {x}, {"u4"});
  u4->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kUInt4)));
  Node* back = g->add_node("Cast", {i4->output(0)}, {"back"});
  back->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kFloat32)));
  Value* w = g->add_input("w", tt(DType::kInt32, {4}));
  Node* wi4 = g->add_node("Cast", {w}, {"wi4"});
  wi4->set_attr("to", Attribute::of_int(static_cast<int64_t>(DType::kInt4)));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  auto xt = make_tensor(DType::kFloat32, {8}, {-9, -8.5, -2.5, 0.5, 1.5, 6.6, 20, NAN});
  Tensor a = run_node(*g, *i4, {xt}).at(0);
  expect_close(a, {-8, -8, -2, 0, 2, 7, 7, 0}, 0, "to i4");
  expect_close(run_node(*g, *u4, {xt}).at(0), {0, 0, 0, 0, 2, 7, 15, 0}, 0, "to u4");
  expect_close(run_node(*g, *back, {a}).at(0), {-8, -8, -2, 0, 2, 7, 7, 0}, 0, "i4 to f32");
  expect_close(run_node(*g, *wi4, {make_tensor(DType::kInt32, {4}, {-100, -3, 9, 100})}).at(0), {-8, -3, 7, 7}, 0,
               "i32 to i4 saturates");
}

TEST(ElementwiseNumeric, ClipAttributesConstantsAndRuntimeScalar) {
  // Opset 6: bounds as attributes.
  {
    auto g = new_graph(6);
    Value* x = g->add_input("x", tt(DType::kFloat32, {5}));
    Node* c = g->add_node("Clip", {x}, {"y"});
    c->set_attr("min", Attribute::of_float(-1));
    c->set_attr("max", Attribute::of_float(2));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    expect_close(run_node(*g, *c, {make_tensor(DType::kFloat32, {5}, {-3, -1, 0, 2, 5})}).at(0), {-1, -1, 0, 2, 2}, 0,
                 "clip attrs");
  }
  // Opset 13: constant min, omitted max, and a run-time max.
  {
    auto g = new_graph(13);
    Value* x = g->add_input("x", tt(DType::kInt32, {5}));
    Tensor lo(DType::kInt32, {});
    lo.data_as<int32_t>()[0] = -1;
    Value* vlo = g->add_constant("lo", lo);
    Value* vhi = g->add_input("hi", tt(DType::kInt32, {}));
    Node* c1 = g->add_node("Clip", {x, vlo}, {"y1"});
    Node* c2 = g->add_node("Clip", {x, nullptr, vhi}, {"y2"});
    Node* c3 = g->add_node("Clip", {x, vlo, vhi}, {"y3"});
    ASSERT_TRUE(testing::infer(*g).is_ok());
    Tensor xt = make_tensor(DType::kInt32, {5}, {-3, -1, 0, 2, 5});
    Tensor hi = make_tensor(DType::kInt32, {}, {1});
    expect_close(run_node(*g, *c1, {xt, lo}).at(0), {-1, -1, 0, 2, 5}, 0, "clip min");
    expect_close(run_node(*g, *c2, {xt, Tensor(), hi}).at(0), {-3, -1, 0, 1, 1}, 0, "clip runtime max");
    expect_close(run_node(*g, *c3, {xt, lo, hi}).at(0), {-1, -1, 0, 1, 1}, 0, "clip both");
  }
}

TEST(ElementwiseNumeric, IntUnaryBitShiftAndBitwiseNot) {
  auto g = new_graph(18);
  Value* x = g->add_input("x", tt(DType::kInt32, {5}));
  Value* s = g->add_input("s", tt(DType::kUInt8, {5}));
  Value* t = g->add_input("t", tt(DType::kUInt8, {5}));
  Node* ab = g->add_node("Abs", {x}, {"abs"});
  Node* ng = g->add_node("Neg", {x}, {"neg"});
  Node* sg = g->add_node("Sign", {x}, {"sign"});
  Node* rl = g->add_node("Relu", {x}, {"relu"});
  Node* bn = g->add_node("BitwiseNot", {x}, {"bnot"});
  Node* shl = g->add_node("BitShift", {s, t}, {"shl"});
  shl->set_attr("direction", Attribute::of_string("LEFT"));
  Node* shr = g->add_node("BitShift", {s, t}, {"shr"});
  shr->set_attr("direction", Attribute::of_string("RIGHT"));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  Tensor xt = make_tensor(DType::kInt32, {5}, {-7, -1, 0, 3, 100});
  expect_close(run_node(*g, *ab, {xt}).at(0), {7, 1, 0, 3, 100}, 0, "abs");
  expect_close(run_node(*g, *ng, {xt}).at(0), {7, 1, 0, -3, -100}, 0, "neg");
  expect_close(run_node(*g, *sg, {xt}).at(0), {-1, -1, 0, 1, 1}, 0, "sign");
  expect_close(run_node(*g, *rl, {xt}).at(0), {0, 0, 0, 3, 100}, 0, "relu");
  expect_close(run_node(*g, *bn, {xt}).at(0), {6, 0, -1, -4, -101}, 0, "bitwise not");
  Tensor st = make_tensor(DType::kUInt8, {5}, {1, 3, 16, 255, 7});
  Tensor tt_ = make_tensor(DType::kUInt8, {5}, {1, 2, 3, 1, 0});
  expect_close(run_node(*g, *shl, {st, tt_}).at(0), {2, 12, 128, 254, 7}, 0, "shl");
  expect_close(run_node(*g, *shr, {st, tt_}).at(0), {0, 0, 2, 127, 7}, 0, "shr");
}

TEST(ElementwiseNumeric, DropoutIsIdentityWithTrueMask) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
  Node* d = g->add_node("Dropout", {x}, {"y", "mask"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(d->output(1)->type().to_string(), "bool[2, 3]");
  std::vector<double> in = ramp(6, -1, 1);
  auto out = run_node(*g, *d, {make_tensor(DType::kFloat32, {2, 3}, in)});
  ASSERT_EQ(out.size(), 2u);
  std::vector<double> want;
  for (double v : in) want.push_back(static_cast<float>(v));
  expect_close(out[0], want, 0, "dropout y");
  expect_close(out[1], {1, 1, 1, 1, 1, 1}, 0, "dropout mask");

  Tensor on(DType::kBool, {});
  on.data_as<bool>()[0] = true;
  Value* training = g->add_constant("training", on);
  Value* ratio = g->add_constant("ratio", make_tensor(DType::kFloat32, {}, {0.5}));
  Node* train = g->add_node("Dropout", {x, ratio, training}, {"y2"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  // Training with ratio 0.5 runs the random kernel (driver_random_ops_test); this one compiles.
  const OpDef* def = find_op("", "Dropout");
  ASSERT_TRUE(def != nullptr && def->runs_kernel);
  EXPECT_TRUE(def->runs_kernel(*train));
  EXPECT_FALSE(def->runs_kernel(*d));
}

// Training mode with a constant ratio of 0 drops nothing: an identity with an
// all-true mask. Training without a ratio (0.5 by default) runs the kernel.
TEST(ElementwiseNumeric, TrainingDropoutWithZeroRatioIsIdentity) {
  Tensor on(DType::kBool, {});
  on.data_as<bool>()[0] = true;
  {
    auto g = new_graph();
    Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
    Value* training = g->add_constant("training", on);
    Value* ratio = g->add_constant("ratio", make_tensor(DType::kFloat32, {}, {0.0}));
    Node* d = g->add_node("Dropout", {x, ratio, training}, {"y", "mask"});
    ASSERT_TRUE(testing::infer(*g).is_ok());
    std::vector<double> in = ramp(6, -1, 1);
    auto out = run_node(*g, *d, {make_tensor(DType::kFloat32, {2, 3}, in), ratio->constant(), on});
    ASSERT_EQ(out.size(), 2u);
    std::vector<double> want;
    for (double v : in) want.push_back(static_cast<float>(v));
    expect_close(out[0], want, 0, "training dropout y");
    expect_close(out[1], {1, 1, 1, 1, 1, 1}, 0, "training dropout mask");
  }
  {
    auto g = new_graph();
    Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
    Node* d = g->add_node("Dropout", {x, nullptr, g->add_constant("training", on)}, {"y"});
    ASSERT_TRUE(testing::infer(*g).is_ok());
    EXPECT_TRUE(find_op("", "Dropout")->runs_kernel(*d));
  }
}

TEST(ElementwiseRegistry, FlagsAndNames) {
  const OpDef* add = find_op("", "Add");
  ASSERT_NE(add, nullptr);
  EXPECT_TRUE(add->is_elementwise);
  EXPECT_FALSE(add->is_view);
  const OpDef* id = find_op("", "Identity");
  ASSERT_NE(id, nullptr);
  EXPECT_TRUE(id->is_view);
  EXPECT_EQ(find_op("", "NoSuchOp"), nullptr);
  auto names = registered_op_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "Softmax"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "ReduceSum"), names.end());
}

}  // namespace
}  // namespace kiln::ops
