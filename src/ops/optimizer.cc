// Optimizer update rules of the ai.onnx.preview.training domain, as runtime
// kernels: Adagrad, Momentum (standard and Nesterov) and Adam. Inputs are
// the learning rate R and the update count T (scalars), then n tensors per
// group (X..., G..., and the optimizer's state: H... for Adagrad, V... for
// Momentum, V... and H... for Adam); outputs are the new X... and the new
// state, each shaped like its input. Arithmetic as the ONNX reference
// (onnx/reference/ops/aionnx_preview_training): per element in the tensors'
// float type, the scalar factors in double.
#include <cmath>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// Groups after R and T: Adagrad and Momentum 3 (X, G, state), Adam 4.
Status infer_optimizer(Node& n, InferContext& ctx, size_t groups) {
  if (n.num_inputs() < 2 + groups || (n.num_inputs() - 2) % groups != 0)
    return node_invalid(n) << "expected R, T and " << groups << " groups of tensors, got " << n.num_inputs()
                           << " inputs";
  size_t count = (n.num_inputs() - 2) / groups;
  size_t outputs = count * (groups - 1);  // X and the state groups (not G)
  if (n.num_outputs() != outputs)
    return node_invalid(n) << "expected " << outputs << " outputs for " << count << " tensors, got " << n.num_outputs();
  for (size_t i = 0; i < 2; ++i) {
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, i));
    if (!s.empty() && !(s.size() == 1 && s[0].as_const() == std::optional<int64_t>(1)))
      return node_invalid(n) << (i == 0 ? "R" : "T") << " must be a scalar";
  }
  for (size_t k = 0; k < count; ++k) {
    KILN_ASSIGN_OR_RETURN(TensorType x, input_type(n, 2 + k));
    if (!dtype_is_float(x.dtype)) return node_invalid(n) << "X_" << k << " must be a float tensor";
    KILN_ASSIGN_OR_RETURN(Shape xs, input_shape(n, 2 + k));
    for (size_t g = 1; g < groups; ++g) {
      KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 2 + g * count + k));
      if (s.size() != xs.size()) return node_invalid(n) << "input " << 2 + g * count + k << " differs in rank from X_" << k;
    }
    // Output group o (0: X, then the state groups) of tensor k.
    for (size_t o = 0; o + 1 < groups; ++o) set_output(n, o * count + k, x.dtype, xs, ctx);
  }
  return Status::ok();
}

struct Scalars {
  double r = 0;
  int64_t t = 0;
};

Status check_group(const std::vector<Tensor>& in, size_t count, size_t groups, size_t k, const char* op) {
  const Tensor& x = in[2 + k];
  for (size_t g = 1; g < groups; ++g) {
    const Tensor& o = in[2 + g * count + k];
    if (o.shape() != x.shape())
      return invalid_argument() << op << ": input " << 2 + g * count + k << " has shape " << shape_to_string(o.shape())
                                << ", X_" << k << " " << shape_to_string(x.shape());
  }
  return Status::ok();
}

Scalars scalars(const std::vector<Tensor>& in) { return {in[0].get_f64(0), in[1].get_i64(0)}; }

// Runs `step(e, x, g, state..., outputs...)` per element of each tensor k.
template <typename F>
Status per_element(const std::vector<Tensor>& in, std::vector<Tensor>& out, size_t groups, const char* op, F step) {
  size_t count = (in.size() - 2) / groups;
  out.resize(count * (groups - 1));
  for (size_t k = 0; k < count; ++k) {
    KILN_RETURN_IF_ERROR(check_group(in, count, groups, k, op));
    for (size_t o = 0; o + 1 < groups; ++o) {
      KILN_ASSIGN_OR_RETURN(out[o * count + k], Tensor::allocate(in[2 + k].dtype(), in[2 + k].shape(), std::string(op) + " output"));
    }
    for (int64_t e = 0; e < in[2 + k].numel(); ++e) step(k, count, e);
  }
  return Status::ok();
}

// Rounds to the tensor's float type, as the reference's float32 arithmetic does per step.
double as_type(const Tensor& t, double v) { return t.dtype() == DType::kFloat64 ? v : static_cast<float>(v); }

Result<RuntimeKernel> adagrad_kernel(const Node& n) {
  double decay = n.attr_float("decay_factor", 0.0), eps = n.attr_float("epsilon", 1e-6),
         norm = n.attr_float("norm_coefficient", 0.0);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    Scalars s = scalars(in);
    double r = s.r / (1 + static_cast<double>(s.t) * decay);
    return per_element(in, out, 3, "Adagrad", [&](size_t k, size_t count, int64_t e) {
      const Tensor& xt = in[2 + k];
      double x = xt.get_f64(e), g = in[2 + count + k].get_f64(e), h = in[2 + 2 * count + k].get_f64(e);
      double gr = as_type(xt, norm * x + g);
      double h_new = as_type(xt, h + gr * gr);
      double h_sqrt = as_type(xt, std::sqrt(h_new) + eps);
      out[k].set_f64(e, x - r * gr / h_sqrt);
      out[count + k].set_f64(e, h_new);
    });
  });
}

Result<RuntimeKernel> momentum_kernel(const Node& n) {
  // The spec gives Momentum no defaults.
  for (const char* a : {"alpha", "beta", "mode", "norm_coefficient"})
    if (!n.attr(a)) return node_invalid(n) << "missing attribute '" << a << "'";
  double alpha = n.attr_float("alpha", 0.0), beta = n.attr_float("beta", 0.0),
         norm = n.attr_float("norm_coefficient", 0.0);
  std::string mode = n.attr_string("mode", "standard");
  if (mode != "standard" && mode != "nesterov")
    return node_invalid(n) << "mode '" << mode << "' is neither 'standard' nor 'nesterov'";
  const bool nesterov = mode == "nesterov";
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    Scalars s = scalars(in);
    double beta_adjusted = s.t > 0 ? beta : 1.0;
    return per_element(in, out, 3, "Momentum", [&](size_t k, size_t count, int64_t e) {
      const Tensor& xt = in[2 + k];
      double x = xt.get_f64(e), g = in[2 + count + k].get_f64(e), v = in[2 + 2 * count + k].get_f64(e);
      double gr = as_type(xt, norm * x + g);
      double v_new = as_type(xt, alpha * v + beta_adjusted * gr);
      out[k].set_f64(e, nesterov ? x - s.r * as_type(xt, gr + alpha * v_new) : x - s.r * v_new);
      out[count + k].set_f64(e, v_new);
    });
  });
}

Result<RuntimeKernel> adam_kernel(const Node& n) {
  double alpha = n.attr_float("alpha", 0.9), beta = n.attr_float("beta", 0.999), eps = n.attr_float("epsilon", 1e-6),
         norm = n.attr_float("norm_coefficient", 0.0), norm_post = n.attr_float("norm_coefficient_post", 0.0);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    Scalars s = scalars(in);
    double t = static_cast<double>(s.t);
    double r = s.t > 0 ? s.r * std::sqrt(1 - std::pow(beta, t)) / (1 - std::pow(alpha, t)) : s.r;
    return per_element(in, out, 4, "Adam", [&](size_t k, size_t count, int64_t e) {
      const Tensor& xt = in[2 + k];
      double x = xt.get_f64(e), g = in[2 + count + k].get_f64(e), v = in[2 + 2 * count + k].get_f64(e),
             h = in[2 + 3 * count + k].get_f64(e);
      double gr = as_type(xt, norm * x + g);
      double v_new = as_type(xt, alpha * v + (1 - alpha) * gr);
      double h_new = as_type(xt, beta * h + (1 - beta) * as_type(xt, gr * gr));
      double h_sqrt = as_type(xt, std::sqrt(h_new) + eps);
      double x_new = as_type(xt, x - r * as_type(xt, v_new / h_sqrt));
      out[k].set_f64(e, (1 - norm_post) * x_new);
      out[count + k].set_f64(e, v_new);
      out[2 * count + k].set_f64(e, h_new);
    });
  });
}

OpDef training_op(const std::string& name, size_t groups, std::function<Result<RuntimeKernel>(const Node&)> kernel) {
  OpDef def = kernel_op(
      name, [groups](Node& n, InferContext& ctx) { return infer_optimizer(n, ctx, groups); }, std::move(kernel));
  def.domain = "ai.onnx.preview.training";
  return def;
}

// Gradient(xs..., zs...) {xs, zs, y}: the gradients of the value named y
// (summed over its elements when it has several) with respect to the values
// named xs, each typed like its x. The gradients stage replaces the node by
// the backward graph (train::expand_gradient_ops); here only its types.
Status infer_gradient(Node& n, InferContext& ctx) {
  const Attribute* xs = n.attr("xs");
  const Attribute* y = n.attr("y");
  if (xs == nullptr || xs->kind != Attribute::Kind::kStrings || y == nullptr || y->kind != Attribute::Kind::kString)
    return node_invalid(n) << "needs the attributes xs (strings) and y (a string)";
  if (n.num_outputs() != xs->strings.size())
    return node_invalid(n) << "has " << n.num_outputs() << " outputs for " << xs->strings.size() << " names in xs";
  if (ctx.graph == nullptr) return node_invalid(n) << "cannot find its xs without the graph";
  for (size_t i = 0; i < xs->strings.size(); ++i) {
    const Value* x = ctx.graph->find_value(xs->strings[i]);
    if (x == nullptr) return node_invalid(n) << "xs names '" << xs->strings[i] << "', which the graph does not have";
    if (!dtype_is_float(x->dtype()) || !x->type().has_shape())
      return node_invalid(n) << "xs '" << xs->strings[i] << "' is " << x->type().to_string()
                             << "; gradients are of float values of known rank";
    set_output(n, i, x->dtype(), *x->type().shape, ctx);
  }
  return Status::ok();
}

}  // namespace

void register_optimizer_ops() {
  OpDef gradient;
  gradient.name = "Gradient";
  gradient.domain = "ai.onnx.preview.training";
  gradient.infer = infer_gradient;
  gradient.expanded_by_autodiff = true;
  register_op(std::move(gradient));
  register_op(training_op("Adagrad", 3, adagrad_kernel));
  register_op(training_op("Momentum", 3, momentum_kernel));
  register_op(training_op("Adam", 4, adam_kernel));
}

}  // namespace kiln::ops
