// Reverse mode (src/train/autodiff.cc) against float64 central differences:
// per op with a gradient rule, a small graph (symbolic dims where the op
// allows) whose loss is sum(y * sin(1.3 y)) (its gradient varies from
// element to element), compiled and run like any graph; every element of
// every parameter's gradient compared with (L(p + h) - L(p - h)) / 2h.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "driver/compile.h"
#include "ops/registry.h"
#include "train/autodiff.h"

namespace kiln::train {
namespace {

struct Case {
  const char* name;
  const char* graph;                  // defines %y from the inputs
  std::vector<std::string> params;    // inputs to differentiate
  std::map<std::string, int64_t> dims;  // symbol values at run time
};

// The forward graph with the loss appended; with `grads`, the gradients of
// the loss for `params` as extra outputs.
Result<std::unique_ptr<Graph>> build(const Case& c, bool grads) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, parse_graph(c.graph));
  g->source = c.name;
  Value* y = g->find_value("y");
  if (y == nullptr) return internal_error() << c.name << ": no %y";
  Tensor k(DType::kFloat64, {});
  k.data_as<double>()[0] = 1.3;
  Value* kc = g->add_constant("loss_k", k);
  Node* t = g->add_node("Mul", {y, kc}, {"loss_t"});
  Node* s = g->add_node("Sin", {t->output(0)}, {"loss_s"});
  Node* p = g->add_node("Mul", {y, s->output(0)}, {"loss_p"});
  Node* l = g->add_node("ReduceSum", {p->output(0)}, {"loss"});
  l->set_attr("keepdims", Attribute::of_int(0));
  std::vector<Value*> outs = {l->output(0)};
  ops::InferContext ctx;
  ctx.graph = g.get();
  ctx.bounds = g->bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ctx));
  if (grads) {
    std::vector<Value*> params;
    for (const std::string& name : c.params) params.push_back(g->find_value(name));
    KILN_ASSIGN_OR_RETURN(std::vector<Value*> gs, append_gradients(*g, l->output(0), params));
    outs.insert(outs.end(), gs.begin(), gs.end());
  }
  g->set_outputs(outs);
  return g;
}

Result<driver::CompiledProgram> compile(std::unique_ptr<Graph> g) {
  CompileOptions options;
  options.threads = 1;
  options.no_db = true;
  return driver::compile_graph(std::move(g), options);
}

std::vector<Tensor> random_inputs(const Graph& g, const std::map<std::string, int64_t>& dims, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.5, 1.5);
  std::vector<Tensor> out;
  for (const Value* v : g.inputs()) {
    if (v->is_constant()) continue;
    std::vector<int64_t> shape;
    for (const Expr& d : *v->type().shape) shape.push_back(d.as_const() ? *d.as_const() : dims.at(d->name));
    Tensor t(v->dtype(), shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      double x = dist(rng);
      // Away from 0 (Log, Sqrt, Div, Pow, Relu's kink).
      t.set_f64(i, x < 0 ? x - 0.3 : x + 0.3);
    }
    out.push_back(std::move(t));
  }
  return out;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  auto with = build(c, true);
  ASSERT_TRUE(with.is_ok()) << with.status().to_string();
  std::vector<std::string> input_names;
  for (const Value* v : (*with)->inputs())
    if (!v->is_constant()) input_names.push_back(v->name());
  auto inputs = random_inputs(**with, c.dims, 7);
  auto grad_prog = compile(std::move(*with));
  ASSERT_TRUE(grad_prog.is_ok()) << grad_prog.status().to_string();
  runtime::VM gvm(grad_prog->program, 1);
  auto analytic = gvm.run(inputs);
  ASSERT_TRUE(analytic.is_ok()) << analytic.status().to_string();

  auto fwd = build(c, false);
  ASSERT_TRUE(fwd.is_ok()) << fwd.status().to_string();
  auto fwd_prog = compile(std::move(*fwd));
  ASSERT_TRUE(fwd_prog.is_ok()) << fwd_prog.status().to_string();
  runtime::VM fvm(fwd_prog->program, 1);
  auto loss_at = [&](const std::vector<Tensor>& in) {
    auto out = fvm.run(in);
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    return out.is_ok() ? (*out)[0].get_f64(0) : NAN;
  };
  EXPECT_NEAR(loss_at(inputs), (*analytic)[0].get_f64(0), 1e-12 * (1 + std::fabs((*analytic)[0].get_f64(0))));

  for (size_t p = 0; p < c.params.size(); ++p) {
    size_t at = std::find(input_names.begin(), input_names.end(), c.params[p]) - input_names.begin();
    ASSERT_LT(at, inputs.size());
    const Tensor& g = (*analytic)[1 + p];
    ASSERT_EQ(g.shape(), inputs[at].shape()) << "gradient of " << c.params[p];
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < g.numel(); ++i) {
      std::vector<Tensor> plus = inputs, minus = inputs;
      plus[at] = inputs[at].clone();
      minus[at] = inputs[at].clone();
      const double x = inputs[at].get_f64(i), h = 1e-6 * std::max(1.0, std::fabs(x));
      plus[at].set_f64(i, x + h);
      minus[at].set_f64(i, x - h);
      const double fd = (loss_at(plus) - loss_at(minus)) / (2 * h);
      const double an = g.get_f64(i);
      EXPECT_NEAR(an, fd, 1e-6 + 1e-5 * std::fabs(fd)) << c.params[p] << "[" << i << "]";
      lo = std::min(lo, an);
      hi = std::max(hi, an);
    }
    // An informative comparison: the gradient varies (a scalar's: it is not 0).
    if (g.numel() == 1) EXPECT_GT(std::fabs(hi), 1e-3) << "the gradient of " << c.params[p] << " is 0";
    else EXPECT_GT(hi - lo, 1e-3) << "the gradient of " << c.params[p] << " has no spread";
  }
}

TEST(Autodiff, Elementwise) {
  check_case({"add_sub_mul_div", R"(graph g(%a: f64[n, 3], %b: f64[3], %c: f64[n, 1]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %s: f64[n, 3] = Add(%a, %b)
    %d: f64[n, 3] = Sub(%s, %c)
    %m: f64[n, 3] = Mul(%d, %a)
    %y: f64[n, 3] = Div(%m, %c)
  })", {"a", "b", "c"}, {{"n", 4}}});
  check_case({"unary", R"(graph g(%a: f64[2, 5]) -> (%y) {
    opset "" 17
    %e: f64[2, 5] = Exp(%a)
    %t: f64[2, 5] = Tanh(%a)
    %s: f64[2, 5] = Sigmoid(%t)
    %r: f64[2, 5] = Relu(%a)
    %q: f64[2, 5] = Abs(%a)
    %l: f64[2, 5] = Log(%q)
    %w: f64[2, 5] = Sqrt(%q)
    %f: f64[2, 5] = Erf(%a)
    %n: f64[2, 5] = Neg(%f)
    %i: f64[2, 5] = Reciprocal(%a)
    %c: f64[2, 5] = Cos(%a)
    %x: f64[2, 5] = Sin(%c)
    %p: f64[2, 5] = Pow(%q, %e)
    %k: f64[2, 5] = Identity(%p)
    %y: f64[2, 5] = Sum(%e, %s, %r, %l, %w, %n, %i, %x, %k)
  })", {"a"}, {}});
}

TEST(Autodiff, WhereMaxMin) {
  check_case({"where_max_min", R"(graph g(%a: f64[4, 3], %b: f64[3], %c: bool[4, 3]) -> (%y) {
    opset "" 17
    %w: f64[4, 3] = Where(%c, %a, %b)
    %x: f64[4, 3] = Max(%a, %b)
    %m: f64[4, 3] = Min(%a, %b)
    %m2: f64[4, 3] = Mul(%m, %m)
    %y: f64[4, 3] = Sum(%w, %x, %m2)
  })", {"a", "b"}, {}});
}

// Clip with both bounds as inputs (which then get gradients; min > max in
// some draws, where max wins), one bound, and the bounds as attributes (opset 6).
TEST(Autodiff, Clip) {
  check_case({"clip_inputs", R"(graph g(%a: f64[4, 3], %lo: f64[], %hi: f64[]) -> (%y) {
    opset "" 17
    %c: f64[4, 3] = Clip(%a, %lo, %hi)
    %y: f64[4, 3] = Mul(%c, %a)
  })", {"a", "lo", "hi"}, {}});
  check_case({"clip_min_only", R"(graph g(%a: f64[4, 3], %lo: f64[]) -> (%y) {
    opset "" 17
    %y: f64[4, 3] = Clip(%a, %lo)
  })", {"a", "lo"}, {}});
  check_case({"clip_attributes", R"(graph g(%a: f64[4, 3]) -> (%y) {
    opset "" 6
    %y: f64[4, 3] = Clip(%a) {max = 0.8, min = -0.9}
  })", {"a"}, {}});
}

TEST(Autodiff, MatMulAndGemm) {
  // A 1-D operand on either side (and both), against a matrix and a batch.
  check_case({"matmul_vector_matrix", R"(graph g(%a: f64[3], %b: f64[3, 4]) -> (%y) {
    opset "" 17
    %y: f64[4] = MatMul(%a, %b)
  })", {"a", "b"}, {}});
  check_case({"matmul_vector_batch", R"(graph g(%a: f64[3], %b: f64[2, 3, 4]) -> (%y) {
    opset "" 17
    %y: f64[2, 4] = MatMul(%a, %b)
  })", {"a", "b"}, {}});
  check_case({"matmul_matrix_vector", R"(graph g(%a: f64[4, 3], %b: f64[3]) -> (%y) {
    opset "" 17
    %y: f64[4] = MatMul(%a, %b)
  })", {"a", "b"}, {}});
  check_case({"matmul_batch_vector", R"(graph g(%a: f64[2, n, 3], %b: f64[3]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %y: f64[2, n] = MatMul(%a, %b)
  })", {"a", "b"}, {{"n", 3}}});
  check_case({"matmul_dot", R"(graph g(%a: f64[5], %b: f64[5]) -> (%y) {
    opset "" 17
    %y: f64[] = MatMul(%a, %b)
  })", {"a", "b"}, {}});
  check_case({"matmul_batched", R"(graph g(%a: f64[2, n, 3], %b: f64[3, 4]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %y: f64[2, n, 4] = MatMul(%a, %b)
  })", {"a", "b"}, {{"n", 3}}});
  for (const char* attrs : {"", " {transA = 1}", " {transB = 1}", " {alpha = 0.5, beta = 2, transA = 1, transB = 1}"}) {
    std::string ta = std::string(attrs).find("transA") != std::string::npos ? "3, 2" : "2, 3";
    std::string tb = std::string(attrs).find("transB") != std::string::npos ? "4, 3" : "3, 4";
    std::string text = "graph g(%a: f64[" + ta + "], %b: f64[" + tb + "], %c: f64[4]) -> (%y) {\n  opset \"\" 17\n"
                       "  %y: f64[2, 4] = Gemm(%a, %b, %c)" + attrs + "\n}";
    check_case({"gemm", text.c_str(), {"a", "b", "c"}, {}});
  }
}

TEST(Autodiff, SoftmaxAndReductions) {
  check_case({"softmax", R"(graph g(%a: f64[n, 5]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %s: f64[n, 5] = Softmax(%a) {axis = 1}
    %l: f64[n, 5] = LogSoftmax(%a)
    %t: f64[n, 5] = Softmax(%a) {axis = 0}
    %u: f64[n, 5] = Add(%s, %l)
    %y: f64[n, 5] = Add(%u, %t)
  })", {"a"}, {{"n", 3}}});
  check_case({"reduce", R"(graph g(%a: f64[n, 4, 3]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %ax: i64[1] = const<i64[1] [1]>
    %s: f64[n, 3] = ReduceSum(%a, %ax) {keepdims = 0}
    %m: f64[n, 1, 3] = ReduceMean(%a, %ax)
    %k: f64[1, 1, 1] = ReduceMean(%a)
    %sm: f64[n, 1, 3] = Unsqueeze(%s, %ax)
    %t: f64[n, 1, 3] = Add(%sm, %m)
    %y: f64[n, 1, 3] = Mul(%t, %k)
  })", {"a"}, {{"n", 2}}});
}

TEST(Autodiff, ShapeOps) {
  check_case({"shape_ops", R"(graph g(%a: f64[n, 2, 3], %b: f64[n, 2, 1]) -> (%y) {
    opset "" 18
    bound n [1, inf]
    %wide: i64[3] = const<i64[3] [1, 1, 3]>
    %e: f64[n, 2, 3] = Expand(%b, %wide)
    %ea: f64[n, 2, 3] = Mul(%e, %a)
    %c: f64[n, 2, 4] = Concat(%ea, %b) {axis = 2}
    %t: f64[4, 2, n] = Transpose(%c) {perm = [2, 1, 0]}
    %f: f64[4, 2 * n] = Flatten(%t)
    %shape: i64[2] = const<i64[2] [2, -1]>
    %r: f64[2, 4 * n] = Reshape(%f, %shape)
    %p: f64[2, 2 * n], %q: f64[2, 2 * n] = Split(%r) {axis = 1, num_outputs = 2}
    %y: f64[2, 2 * n] = Identity(%q)
  })", {"a", "b"}, {{"n", 3}}});
}

TEST(Autodiff, LayerNormAndGather) {
  check_case({"layer_norm", R"(graph g(%x: f64[n, 3, 4], %s: f64[4], %b: f64[4]) -> (%y) {
    opset "" 17
    bound n [1, inf]
    %y: f64[n, 3, 4] = LayerNormalization(%x, %s, %b) {epsilon = 0.01}
  })", {"x", "s", "b"}, {{"n", 2}}});
  check_case({"layer_norm_axis1", R"(graph g(%x: f64[2, 3, 4], %s: f64[3, 4]) -> (%y) {
    opset "" 17
    %y: f64[2, 3, 4] = LayerNormalization(%x, %s) {axis = 1}
  })", {"x", "s"}, {}});
  // Repeated and negative indices: their rows add up.
  check_case({"gather", R"(graph g(%e: f64[5, 3]) -> (%y) {
    opset "" 17
    %i: i64[2, 3] = const<i64[2, 3] [0, 4, -1, 2, 0, 2]>
    %y: f64[2, 3, 3] = Gather(%e, %i)
  })", {"e"}, {}});
  // Along a middle and the last axis, a scalar index (a token of a sequence), repeats.
  check_case({"gather_axis1", R"(graph g(%e: f64[2, 4, 3]) -> (%y) {
    opset "" 17
    %i: i64[3] = const<i64[3] [3, 0, 3]>
    %y: f64[2, 3, 3] = Gather(%e, %i) {axis = 1}
  })", {"e"}, {}});
  check_case({"gather_axis1_scalar", R"(graph g(%e: f64[n, 4, 3]) -> (%y) {
    opset "" 17
    %i: i64[] = const<i64[] [0]>
    %y: f64[n, 3] = Gather(%e, %i) {axis = 1}
  })", {"e"}, {{"n", 2}}});
  // GatherElements along either axis: repeated and negative indices.
  check_case({"gather_elements_axis1", R"(graph g(%e: f64[3, 4]) -> (%y) {
    opset "" 17
    %i: i64[3, 5] = const<i64[3, 5] [0, 3, 3, -1, 1, 2, 2, 0, -4, 1, 3, 0, 1, 2, 2]>
    %y: f64[3, 5] = GatherElements(%e, %i) {axis = 1}
  })", {"e"}, {}});
  check_case({"gather_elements_axis0", R"(graph g(%e: f64[3, 4]) -> (%y) {
    opset "" 17
    %i: i32[2, 4] = const<i32[2, 4] [2, 0, 0, -1, 2, 1, 0, 2]>
    %y: f64[2, 4] = GatherElements(%e, %i) {axis = 0}
  })", {"e"}, {}});
  check_case({"gather_last_axis", R"(graph g(%e: f64[2, 3, 5]) -> (%y) {
    opset "" 17
    %i: i64[2, 2] = const<i64[2, 2] [4, -1, 1, 0]>
    %y: f64[2, 3, 2, 2] = Gather(%e, %i) {axis = 2}
  })", {"e"}, {}});
}

TEST(Autodiff, ConvAndPool) {
  for (const char* attrs : {"", " {pads = [1, 1, 1, 1]}", " {pads = [1, 0, 2, 1], strides = [2, 2]}",
                            " {dilations = [2, 1], strides = [1, 2]}", " {pads = [0, 2, 1, 2]}"}) {
    std::string text = std::string(R"(graph g(%x: f64[2, 3, 7, 6], %w: f64[4, 3, 3, 2], %b: f64[4]) -> (%y) {
    opset "" 17
    %c: f64[?] = Conv(%x, %w, %b))") + attrs + R"(
    %p: f64[?] = GlobalAveragePool(%c)
    %y: f64[?] = Add(%c, %p)
  })";
    check_case({"conv", text.c_str(), {"x", "w", "b"}, {}});
  }
  // A symbolic batch dim (a data-parallel step's share): at stride 1 and strided.
  for (const char* attrs : {" {pads = [1, 1, 1, 1]}", " {strides = [2, 2]}"}) {
    std::string text = std::string(R"(graph g(%x: f64[n, 3, 7, 6], %w: f64[4, 3, 3, 2]) -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w))") + attrs + R"(
  })";
    check_case({"conv_batch", text.c_str(), {"x", "w"}, {{"n", 3}}});
  }
  // dW over chunks of the batch (C K / M = 3 here: chunks of 2, 2 and 1 images).
  check_case({"conv_chunks", R"(graph g(%x: f64[5, 1, 6, 6], %w: f64[3, 1, 3, 3]) -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w) {pads = [1, 1, 1, 1]}
  })", {"x", "w"}, {}});
  // Groups: two groups of 3 input and 2 output channels, depthwise, and
  // depthwise with 2 outputs per channel; at stride 1 (dX as a grouped Conv)
  // and strided (per-group products into kiln:Col2Im; a depthwise one's dY
  // spread with zeros into the stride-1 Conv, its trailing zeros taken by
  // the end pad or, with more end padding than that allows, sliced off); a
  // batch of 5 takes dW in chunks (the depthwise columns are 9 times dY).
  for (const char* attrs : {"group = 2, pads = [1, 1, 1, 1]", "group = 2, pads = [1, 0, 2, 1], strides = [2, 2]"}) {
    std::string text = std::string(R"(graph g(%x: f64[2, 6, 7, 6], %w: f64[4, 3, 3, 2], %b: f64[4]) -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w, %b) {)") + attrs + R"(}
  })";
    check_case({"conv_grouped", text.c_str(), {"x", "w", "b"}, {}});
  }
  for (const char* attrs : {"group = 4, pads = [1, 1, 1, 1]", "group = 4, pads = [1, 1, 1, 1], strides = [2, 2]",
                            "dilations = [2, 2], group = 4, pads = [2, 2, 2, 2]",
                            "group = 4, pads = [0, 0, 2, 2], strides = [2, 2]"}) {
    for (const char* shapes : {"%x: f64[5, 4, 5, 7], %w: f64[4, 1, 3, 3]", "%x: f64[2, 4, 7, 6], %w: f64[8, 1, 3, 3]"}) {
      std::string text = std::string("graph g(") + shapes + R"() -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w) {)" + attrs + R"(}
  })";
      check_case({"conv_depthwise", text.c_str(), {"x", "w"}, {}});
    }
  }
  // One and three spatial dims (kiln:Im2Col and kiln:Col2Im are rank-generic).
  check_case({"conv1d", R"(graph g(%x: f64[2, 3, 9], %w: f64[2, 3, 3]) -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w) {pads = [1, 2], strides = [2]}
  })", {"x", "w"}, {}});
  check_case({"conv3d", R"(graph g(%x: f64[1, 2, 4, 3, 5], %w: f64[3, 2, 2, 2, 3]) -> (%y) {
    opset "" 17
    %y: f64[?] = Conv(%x, %w) {pads = [1, 0, 1, 0, 1, 1]}
  })", {"x", "w"}, {}});
}

TEST(Autodiff, AveragePool) {
  // Floor and ceil rounding (the last window past the end), with and without the padding in the
  // count, SAME padding, dilation.
  for (const char* attrs : {"{kernel_shape = [3, 2], strides = [2, 2]}",
                            "{kernel_shape = [3, 2], pads = [1, 0, 1, 1], strides = [2, 1]}",
                            "{count_include_pad = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1]}",
                            "{ceil_mode = 1, kernel_shape = [2, 2], strides = [2, 2]}",
                            "{ceil_mode = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}",
                            "{ceil_mode = 1, count_include_pad = 1, kernel_shape = [3, 2], pads = [1, 1, 0, 0], strides = [2, 3]}",
                            "{auto_pad = \"SAME_UPPER\", kernel_shape = [3, 2], strides = [2, 2]}",
                            "{auto_pad = \"SAME_LOWER\", count_include_pad = 1, kernel_shape = [2, 3], strides = [1, 2]}",
                            "{dilations = [2, 1], kernel_shape = [2, 2], pads = [1, 1, 1, 1]}"}) {
    std::string text = std::string(R"(graph g(%x: f64[2, 3, 7, 6]) -> (%y) {
    opset "" 17
    %y: f64[?] = AveragePool(%x) )") + attrs + R"(
  })";
    check_case({"average_pool", text.c_str(), {"x"}, {}});
  }
  // LpPool: p = 1, 2, 3 (sign(x), x, |x| x times the windows' dy y^(1-p)), with padding, SAME.
  for (const char* attrs : {"{kernel_shape = [3, 2], p = 2, pads = [1, 0, 1, 1], strides = [2, 1]}",
                            "{kernel_shape = [2, 2], p = 1, strides = [2, 2]}",
                            "{auto_pad = \"SAME_UPPER\", kernel_shape = [3, 3], p = 3, strides = [2, 2]}"}) {
    std::string text = std::string(R"(graph g(%x: f64[2, 3, 7, 6]) -> (%y) {
    opset "" 17
    %y: f64[?] = LpPool(%x) )") + attrs + R"(
  })";
    check_case({"lp_pool", text.c_str(), {"x"}, {}});
  }
  check_case({"average_pool_1d", R"(graph g(%x: f64[2, 2, 9]) -> (%y) {
    opset "" 17
    %y: f64[?] = AveragePool(%x) {kernel_shape = [4], pads = [2, 1], strides = [3]}
  })", {"x"}, {}});
}

TEST(Autodiff, SliceMaxPoolDropout) {
  check_case({"slice", R"(graph g(%x: f64[4, 6]) -> (%y) {
    opset "" 17
    %s: i64[2] = const<i64[2] [1, -5]>
    %e: i64[2] = const<i64[2] [3, 5]>
    %a: i64[2] = const<i64[2] [0, 1]>
    %y: f64[2, 4] = Slice(%x, %s, %e, %a)
  })", {"x"}, {}});
  // Steps: 2 forward and 3 backward (dy reversed, spread with zeros), every other row and column
  // from 1 (YOLO's space-to-depth slices), and a whole axis reversed.
  check_case({"slice_steps", R"(graph g(%x: f64[7, 10]) -> (%y) {
    opset "" 17
    %s: i64[2] = const<i64[2] [1, 8]>
    %e: i64[2] = const<i64[2] [7, 0]>
    %a: i64[2] = const<i64[2] [0, 1]>
    %t: i64[2] = const<i64[2] [2, -3]>
    %y: f64[?] = Slice(%x, %s, %e, %a, %t)
  })", {"x"}, {}});
  check_case({"slice_space_to_depth", R"(graph g(%x: f64[2, 3, 6, 7]) -> (%y) {
    opset "" 17
    %s: i64[2] = const<i64[2] [0, 1]>
    %e: i64[2] = const<i64[2] [6, 7]>
    %a: i64[2] = const<i64[2] [2, 3]>
    %t: i64[2] = const<i64[2] [2, 2]>
    %y: f64[?] = Slice(%x, %s, %e, %a, %t)
  })", {"x"}, {}});
  check_case({"slice_reversed", R"(graph g(%x: f64[3, 5]) -> (%y) {
    opset "" 17
    %s: i64[1] = const<i64[1] [-1]>
    %e: i64[1] = const<i64[1] [-9223372036854775808]>
    %a: i64[1] = const<i64[1] [1]>
    %t: i64[1] = const<i64[1] [-1]>
    %y: f64[?] = Slice(%x, %s, %e, %a, %t)
  })", {"x"}, {}});
  check_case({"max_pool", R"(graph g(%x: f64[2, 2, 6, 5]) -> (%y) {
    opset "" 17
    %p: f64[?] = MaxPool(%x) {kernel_shape = [3, 2], pads = [1, 0, 1, 1], strides = [2, 2]}
    %y: f64[?] = Dropout(%p)
  })", {"x"}, {}});
  // ceil_mode: windows past the input's end (ScatterElements, not kiln:MaxPoolGrad).
  check_case({"max_pool_ceil", R"(graph g(%x: f64[1, 2, 7, 6]) -> (%y) {
    opset "" 17
    %y: f64[?] = MaxPool(%x) {ceil_mode = 1, kernel_shape = [3, 3], strides = [2, 2]}
  })", {"x"}, {}});
}

TEST(Autodiff, Lstm) {
  // Every output in the loss (Y, and Y_h, Y_c stacked after it), biases and both initial states.
  check_case({"lstm_full", R"(graph g(%x: f64[4, 2, 3], %w: f64[1, 8, 3], %r: f64[1, 8, 2], %b: f64[1, 16],
                                      %h0: f64[1, 2, 2], %c0: f64[1, 2, 2]) -> (%y) {
    opset "" 17
    %ax: i64[1] = const<i64[1] [1]>
    %s: f64[4, 1, 2, 2], %sh: f64[1, 2, 2], %sc: f64[1, 2, 2] = LSTM(%x, %w, %r, %b, _, %h0, %c0) {hidden_size = 2}
    %uh: f64[1, 1, 2, 2] = Unsqueeze(%sh, %ax)
    %uc: f64[1, 1, 2, 2] = Unsqueeze(%sc, %ax)
    %y: f64[6, 1, 2, 2] = Concat(%s, %uh, %uc) {axis = 0}
  })", {"x", "w", "r", "b", "h0", "c0"}, {}});
  // Symbolic sequence and batch, no bias or initial states, only Y_c read.
  check_case({"lstm_symbolic_last_cell", R"(graph g(%x: f64[t, n, 3], %w: f64[1, 12, 3], %r: f64[1, 12, 3]) -> (%y) {
    opset "" 17
    bound t [1, inf]
    bound n [1, inf]
    %s: f64[t, 1, n, 3], %y: f64[1, n, 3] = LSTM(%x, %w, %r) {hidden_size = 3}
  })", {"x", "w", "r"}, {{"t", 3}, {"n", 2}}});
}

TEST(Autodiff, Scan) {
  // A recurrence h' = tanh(h W + x_t) with a scan output h' * x_t; W captured by the body;
  // the final state and every step's output in the loss.
  check_case({"scan_recurrence", R"(graph g(%x: f64[4, 2, 3], %h0: f64[2, 3], %w: f64[3, 3]) -> (%y) {
    opset "" 17
    %ht: f64[2, 3], %ys: f64[4, 2, 3] = Scan(%h0, %x) {body = graph b(%h: f64[2, 3], %xt: f64[2, 3]) -> (%h2, %o) {
      capture %w: f64[3, 3]
      %m: f64[2, 3] = MatMul(%h, %w)
      %a: f64[2, 3] = Add(%m, %xt)
      %h2: f64[2, 3] = Tanh(%a)
      %o: f64[2, 3] = Mul(%h2, %xt)
    }, num_scan_inputs = 1}
    %ax: i64[1] = const<i64[1] [0]>
    %u: f64[1, 2, 3] = Unsqueeze(%ht, %ax)
    %y: f64[5, 2, 3] = Concat(%ys, %u) {axis = 0}
  })", {"x", "h0", "w"}, {}});
  // Symbolic steps, an integer state beside the float one (a step counter scaling the
  // input), two scan inputs, a body constant; only the scan output in the loss.
  check_case({"scan_counter", R"(graph g(%x: f64[t, 3], %z: f64[t, 3], %s0: f64[3], %w: f64[3]) -> (%y) {
    opset "" 17
    bound t [1, inf]
    %k0: i64[] = const<i64[] [1]>
    %st: f64[3], %kt: i64[], %y: f64[t, 3] = Scan(%s0, %k0, %x, %z) {body = graph b(%s: f64[3], %k: i64[], %xt: f64[3], %zt: f64[3]) -> (%s2, %k2, %o) {
      capture %w: f64[3]
      %one: i64[] = const<i64[] [1]>
      %k2: i64[] = Add(%k, %one)
      %kf: f64[] = Cast(%k) {to = 11}
      %sx: f64[3] = Mul(%xt, %kf)
      %sw: f64[3] = Mul(%s, %w)
      %s2: f64[3] = Add(%sw, %sx)
      %o: f64[3] = Mul(%s2, %zt)
    }, num_scan_inputs = 2}
  })", {"x", "z", "s0", "w"}, {{"t", 3}}});
}

TEST(Autodiff, Loop) {
  // A for-loop over a captured sequence (Gather at the iteration number): the final state and
  // every iteration's scan output in the loss; h0, W and the sequence get gradients.
  check_case({"loop_for", R"(graph g(%h0: f64[2, 3], %w: f64[3, 3], %x: f64[4, 2, 3]) -> (%y) {
    opset "" 17
    %m: i64[] = const<i64[] [4]>
    %ht: f64[?], %ys: f64[?] = Loop(%m, _, %h0) {body = graph b(%i: i64[], %c: bool[], %h: f64[2, 3]) -> (%c2, %h2, %o) {
      capture %w: f64[3, 3]
      capture %x: f64[4, 2, 3]
      %xt: f64[2, 3] = Gather(%x, %i)
      %hw: f64[2, 3] = MatMul(%h, %w)
      %a: f64[2, 3] = Add(%hw, %xt)
      %h2: f64[2, 3] = Tanh(%a)
      %o: f64[2, 3] = Mul(%h2, %xt)
      %c2: bool[] = Identity(%c)
    }}
    %ax: i64[1] = const<i64[1] [0]>
    %u: f64[?] = Unsqueeze(%ht, %ax)
    %y: f64[?] = Concat(%ys, %u) {axis = 0}
  })", {"h0", "w", "x"}, {}});
  // A while-loop: its condition from an integer counter (3 iterations of at most 10).
  check_case({"loop_while", R"(graph g(%s0: f64[3], %w: f64[3]) -> (%y) {
    opset "" 17
    %m: i64[] = const<i64[] [10]>
    %go: bool[] = const<bool[] [true]>
    %k0: i64[] = const<i64[] [0]>
    %st: f64[?], %kt: i64[?], %ys: f64[?] = Loop(%m, %go, %s0, %k0) {body = graph b(%i: i64[], %c: bool[], %s: f64[3], %k: i64[]) -> (%c2, %s2, %k2, %o) {
      capture %w: f64[3]
      %one: i64[] = const<i64[] [1]>
      %three: i64[] = const<i64[] [3]>
      %k2: i64[] = Add(%k, %one)
      %c2: bool[] = Less(%k2, %three)
      %sw: f64[3] = Mul(%s, %w)
      %s2: f64[3] = Sin(%sw)
      %o: f64[3] = Mul(%s2, %s)
    }}
    %y: f64[?] = Add(%ys, %st)
  })", {"s0", "w"}, {}});
}

TEST(Autodiff, LstmOutsideTheRuleIsNamed) {
  auto g = parse_graph(R"(graph g(%x: f64[4, 2, 3], %w: f64[2, 8, 3], %r: f64[2, 8, 2]) -> (%s) {
    opset "" 17
    %s: f64[4, 2, 2, 2] = LSTM(%x, %w, %r) {direction = "bidirectional", hidden_size = 2}
  })");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  ops::InferContext ctx;
  ctx.graph = g->get();
  ASSERT_TRUE(ops::infer_shapes(**g, ctx).is_ok());
  Node* sum = (*g)->add_node("ReduceSum", {(*g)->find_value("s")}, {"loss"});
  sum->set_attr("keepdims", Attribute::of_int(0));
  ASSERT_TRUE(ops::infer_node(*sum, ctx).is_ok());
  auto grads = append_gradients(**g, sum->output(0), {(*g)->find_value("w")});
  ASSERT_FALSE(grads.is_ok());
  EXPECT_EQ(grads.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(grads.status().message().find("the LSTM gradient covers direction forward"), std::string::npos)
      << grads.status().message();
}

TEST(Autodiff, Losses) {
  check_case({"softmax_cross_entropy_mean", R"(graph g(%x: f64[3, 4]) -> (%y) {
    opset "" 17
    %t: i64[3] = const<i64[3] [1, 0, 3]>
    %y: f64[] = SoftmaxCrossEntropyLoss(%x, %t)
  })", {"x"}, {}});
  check_case({"softmax_cross_entropy_weighted_none", R"(graph g(%x: f64[2, 3, 2]) -> (%y) {
    opset "" 17
    %t: i32[2, 2] = const<i32[2, 2] [0, 2, 1, -1]>
    %w: f64[3] = const<f64[3] [0.5, 2, 1.25]>
    %y: f64[?] = SoftmaxCrossEntropyLoss(%x, %t, %w) {ignore_index = -1, reduction = "none"}
  })", {"x"}, {}});
  check_case({"nll_sum", R"(graph g(%x: f64[3, 4]) -> (%y) {
    opset "" 17
    %t: i64[3] = const<i64[3] [2, 2, 0]>
    %y: f64[] = NegativeLogLikelihoodLoss(%x, %t) {reduction = "sum"}
  })", {"x"}, {}});
  // ignore_index inside the class range, weights, mean over the weights kept.
  check_case({"nll_weighted_mean", R"(graph g(%x: f64[4, 3]) -> (%y) {
    opset "" 17
    %t: i64[4] = const<i64[4] [1, 0, 2, 0]>
    %w: f64[3] = const<f64[3] [0.5, 2, 1.25]>
    %y: f64[] = NegativeLogLikelihoodLoss(%x, %t, %w) {ignore_index = 1}
  })", {"x"}, {}});
}

TEST(Autodiff, BatchNormInference) {
  check_case({"batch_norm", R"(graph g(%x: f64[2, 3, 4, 2], %s: f64[3], %b: f64[3]) -> (%y) {
    opset "" 17
    %m: f64[3] = const<f64[3] [0.5, -0.25, 1]>
    %v: f64[3] = const<f64[3] [1.5, 0.75, 2]>
    %y: f64[2, 3, 4, 2] = BatchNormalization(%x, %s, %b, %m, %v) {epsilon = 0.01}
  })", {"x", "s", "b"}, {}});
}

TEST(Autodiff, BatchNormTraining) {
  check_case({"batch_norm_training", R"(graph g(%x: f64[3, 2, 2, 3], %s: f64[2], %b: f64[2]) -> (%y) {
    opset "" 15
    %m: f64[2] = const<f64[2] [0.5, -0.25]>
    %v: f64[2] = const<f64[2] [1.5, 0.75]>
    %y: f64[3, 2, 2, 3] = BatchNormalization(%x, %s, %b, %m, %v) {epsilon = 0.01, training_mode = 1}
  })", {"x", "s", "b"}, {}});
  // A symbolic batch: the means of dY and dY xc instead of sums over a constant count.
  check_case({"batch_norm_training_batch", R"(graph g(%x: f64[n, 2, 3], %s: f64[2], %b: f64[2]) -> (%y) {
    opset "" 15
    %m: f64[2] = const<f64[2] [0.5, -0.25]>
    %v: f64[2] = const<f64[2] [1.5, 0.75]>
    %y: f64[?] = BatchNormalization(%x, %s, %b, %m, %v) {epsilon = 0.01, training_mode = 1}
  })", {"x", "s", "b"}, {{"n", 4}}});
}

TEST(Autodiff, MissingRulesAreNamedAllAtOnce) {
  auto g = parse_graph(R"(graph g(%a: f32[4]) -> (%y) {
    opset "" 17
    %f: f32[4] = Floor(%a) {}
    %c: f32[4] = Ceil(%f)
    %d: f32[4] = Ceil(%a)
    %e: f32[4] = Add(%c, %d)
    %y: f32[] = ReduceSum(%e) {keepdims = 0}
  })");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  ops::InferContext ctx;
  ctx.graph = g->get();
  ASSERT_TRUE(ops::infer_shapes(**g, ctx).is_ok());
  auto r = append_gradients(**g, (*g)->find_value("y"), {(*g)->find_value("a")});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("no gradient rule for 2 ops between the parameters and the loss: "
                                      "Ceil ('c' and 1 more); Floor ('f')"),
            std::string::npos)
      << r.status().to_string();
}

TEST(Autodiff, LossMustBeOneFloatElement) {
  auto g = parse_graph(R"(graph g(%a: f32[4]) -> (%y) {
    opset "" 17
    %y: f32[4] = Relu(%a)
  })");
  ASSERT_TRUE(g.is_ok());
  ops::InferContext ctx;
  ctx.graph = g->get();
  ASSERT_TRUE(ops::infer_shapes(**g, ctx).is_ok());
  auto r = append_gradients(**g, (*g)->find_value("y"), {(*g)->find_value("a")});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("the loss must be a float value of one element"), std::string::npos);
}

}  // namespace
}  // namespace kiln::train
