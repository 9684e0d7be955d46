// Normalizations: Softmax, LogSoftmax, Hardmax, LayerNormalization,
// BatchNormalization (inference), InstanceNormalization, GroupNormalization,
// LpNormalization, MeanVarianceNormalization.
//
// Each is a few stages: reductions for the statistics (max and sum of exp for
// Softmax; mean, then the sum of squared deviations for the norms: two passes,
// which is more accurate than E[x^2] - E[x]^2), then one elementwise stage.
//
// Softmax, LogSoftmax and Hardmax before opset 13 flatten the input to 2-D at
// `axis` (default 1) and normalize over all dims from `axis` on; from opset 13
// they normalize over the single dim `axis` (default -1).
#include <cmath>

#include "ops/common.h"

namespace kiln::ops {

namespace {

Status check_float_input(const Node& n, DType dt) {
  if (!dtype_is_float(dt) || !dtype_is_compilable(dt)) {
    return node_unsupported(n) << "dtype " << dtype_name(dt) << " (f32 or f64 expected)";
  }
  return Status::ok();
}

Expr product(const std::vector<Expr>& shape, const std::vector<bool>& reduced) {
  Expr p = Expr(1);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) p = mul(p, shape[d]);
  }
  return simplify(p);
}

Status infer_same_shape(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape()) {
    set_output(n, 0, t.dtype, *t.shape, ctx);
  } else {
    set_output_unknown_rank(n, 0, t.dtype);
  }
  return Status::ok();
}

// Mean and 1/sqrt(var + eps) of x over `reduced` dims, as two reduction stages
// whose shapes drop the reduced dims (keep_dims false) or keep them as 1.
struct Moments {
  tir::ComputeDef mean, rstd;
};

Moments moments(LowerContext& ctx, const std::string& base, DType dt, const std::vector<Expr>& shape,
                const std::vector<bool>& reduced, bool keep_dims, const std::function<Expr(const std::vector<Expr>&)>& x_at,
                double eps, const std::string& mean_name = "", const std::string& rstd_name = "") {
  Expr count = cast(dt, product(shape, reduced));
  Moments m;
  m.mean = reduce_over_dims(ctx, mean_name.empty() ? ctx.fresh(base + "_mean") : mean_name, dt, shape, reduced,
                            keep_dims, tir::Combiner::kSum, const_of(dt, 0), x_at,
                            [&](const Expr& acc, const std::vector<Expr>&) { return div(acc, count); });
  const tir::ComputeDef& mean = m.mean;
  m.rstd = reduce_over_dims(
      ctx, rstd_name.empty() ? ctx.fresh(base + "_rstd") : rstd_name, dt, shape, reduced, keep_dims,
      tir::Combiner::kSum, const_of(dt, 0),
      [&](const std::vector<Expr>& idx) {
        Expr d = sub(x_at(idx), stage_load(mean, reduced_index(idx, reduced, keep_dims)));
        return mul(d, d);
      },
      [&](const Expr& acc, const std::vector<Expr>&) {
        return div(const_of(dt, 1), call("sqrt", dt, {add(div(acc, count), const_of(dt, eps))}));
      });
  return m;
}

// ---- Softmax, LogSoftmax, Hardmax ------------------------------------------------

enum class SoftmaxKind { kSoftmax, kLogSoftmax, kHardmax };

// The dims normalized over, per the opset rules in the file comment.
Result<std::vector<bool>> softmax_dims(const Node& n, int64_t rank, int64_t opset) {
  auto dims_for = [&](bool legacy) -> Result<std::vector<bool>> {
    int64_t axis = n.attr_int("axis", legacy ? 1 : -1);
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(n, axis, rank));
    std::vector<bool> r(static_cast<size_t>(rank), false);
    for (int64_t d = a; d < (legacy ? rank : a + 1); ++d) r[static_cast<size_t>(d)] = true;
    return r;
  };
  if (rank == 0) return node_invalid(n) << "input of rank 0";
  if (opset > 0) return dims_for(opset < 13);
  KILN_ASSIGN_OR_RETURN(std::vector<bool> modern, dims_for(false));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> legacy, dims_for(true));
  if (modern != legacy) {
    return internal_error() << n.describe() << ": semantics depend on the opset, which was not given to lowering";
  }
  return modern;
}

Status infer_softmax(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape()) {
    KILN_ASSIGN_OR_RETURN(std::vector<bool> dims, softmax_dims(n, t.rank(), onnx_opset(ctx) > 0 ? onnx_opset(ctx) : 13));
    (void)dims;
  }
  return infer_same_shape(n, ctx);
}

Result<std::vector<tir::ComputeDef>> lower_softmax(SoftmaxKind kind, const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  int64_t rank = static_cast<int64_t>(in.shape.size());
  KILN_ASSIGN_OR_RETURN(std::vector<bool> reduced, softmax_dims(n, rank, ctx.opset));
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  std::vector<tir::ComputeDef> stages;
  tir::ComputeDef mx = reduce_over_dims(ctx, ctx.fresh(out.name + "_max"), dt, in.shape, reduced, false,
                                        tir::Combiner::kMax, lowest_of(dt), x_at);
  stages.push_back(mx);
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  Expr m_at_idx = stage_load(mx, reduced_index(idx, reduced, false));

  if (kind == SoftmaxKind::kHardmax) {
    // Linear index over the normalized dims; the first maximum gets 1.
    auto linear = [&](const std::vector<Expr>& full) {
      Expr l = Expr(0);
      for (size_t d = 0; d < full.size(); ++d) {
        if (reduced[d]) l = add(mul(l, in.shape[d]), full[d]);
      }
      return l;
    };
    Expr total = product(in.shape, reduced);
    tir::ComputeDef first = reduce_over_dims(
        ctx, ctx.fresh(out.name + "_argmax"), DType::kInt64, in.shape, reduced, false, tir::Combiner::kMin,
        highest_of(DType::kInt64), [&](const std::vector<Expr>& full) {
          return select(eq(x_at(full), stage_load(mx, reduced_index(full, reduced, false))), linear(full), total);
        });
    stages.push_back(first);
    Expr hit = eq(linear(idx), stage_load(first, reduced_index(idx, reduced, false)));
    stages.push_back(make_stage(out.name, dt, axes, out.shape, select(hit, const_of(dt, 1), const_of(dt, 0))));
    return stages;
  }

  tir::ComputeDef sum = reduce_over_dims(ctx, ctx.fresh(out.name + "_sum"), dt, in.shape, reduced, false,
                                         tir::Combiner::kSum, const_of(dt, 0), [&](const std::vector<Expr>& full) {
                                           Expr m = stage_load(mx, reduced_index(full, reduced, false));
                                           return call("exp", dt, {sub(x_at(full), m)});
                                         });
  stages.push_back(sum);
  Expr s = stage_load(sum, reduced_index(idx, reduced, false));
  Expr shifted = sub(x_at(idx), m_at_idx);
  Expr body = kind == SoftmaxKind::kSoftmax ? div(call("exp", dt, {shifted}), s) : sub(shifted, call("log", dt, {s}));
  stages.push_back(make_stage(out.name, dt, axes, out.shape, body));
  return stages;
}

// ---- LayerNormalization -------------------------------------------------------------

Status infer_layer_norm(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_RETURN_IF_ERROR(input_type(n, 1).status());
  if (!t.has_shape()) {
    for (size_t i = 0; i < n.num_outputs(); ++i) set_output_unknown_rank(n, i, i == 0 ? t.dtype : DType::kFloat32);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", -1), t.rank()));
  Shape normalized(t.shape->begin() + axis, t.shape->end());
  KILN_RETURN_IF_ERROR(require_broadcastable_to(n, 1, normalized, "Scale", ctx.bounds));
  KILN_RETURN_IF_ERROR(require_broadcastable_to(n, 2, normalized, "B", ctx.bounds));
  set_output(n, 0, t.dtype, *t.shape, ctx);
  Shape stat = *t.shape;
  for (int64_t d = axis; d < t.rank(); ++d) stat[static_cast<size_t>(d)] = Expr(1);
  DType stash = n.attr_int("stash_type", 1) == 1 ? DType::kFloat32 : t.dtype;
  for (size_t i = 1; i < n.num_outputs() && i < 3; ++i) set_output(n, i, stash, stat, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_layer_norm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  int64_t rank = static_cast<int64_t>(in.shape.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", -1), rank));
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t d = axis; d < rank; ++d) reduced[static_cast<size_t>(d)] = true;
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  // Optional outputs Mean and InvStdDev are the statistic stages themselves
  // when their dtype is the compute dtype, otherwise converted copies.
  auto wanted = [&](size_t i) { return i < ctx.outputs.size() && !ctx.outputs[i].name.empty(); };
  auto direct = [&](size_t i) { return wanted(i) && ctx.outputs[i].dtype == dt ? ctx.outputs[i].name : std::string(); };
  Moments m = moments(ctx, out.name, dt, in.shape, reduced, true, x_at, n.attr_float("epsilon", 1e-5), direct(1),
                      direct(2));
  std::vector<tir::ComputeDef> stages{m.mean, m.rstd};
  for (size_t i = 1; i <= 2; ++i) {
    if (!wanted(i) || !direct(i).empty()) continue;
    const tir::Buffer& b = ctx.outputs[i];
    std::vector<std::string> axes = fresh_axes(ctx, b.shape.size());
    const tir::ComputeDef& src = i == 1 ? m.mean : m.rstd;
    stages.push_back(make_stage(b.name, b.dtype, axes, b.shape, cast_if_needed(b.dtype, stage_load(src, axis_vars(axes)))));
  }
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  std::vector<Expr> sidx = reduced_index(idx, reduced, true);
  Expr y = mul(sub(x_at(idx), stage_load(m.mean, sidx)), stage_load(m.rstd, sidx));
  y = mul(y, cast_if_needed(dt, load_broadcast(ctx, 1, idx, in.shape)));
  if (has_input(n, 2)) y = add(y, cast_if_needed(dt, load_broadcast(ctx, 2, idx, in.shape)));
  stages.push_back(make_stage(out.name, dt, axes, out.shape, y));
  return stages;
}

// ---- BatchNormalization (inference) ----------------------------------------------------

Status infer_batch_norm(Node& n, InferContext& ctx) {
  const bool training = n.attr_int("training_mode", 0) != 0;
  if (n.has_attr("spatial") && n.attr_int("spatial", 1) == 0) return node_unsupported(n) << "spatial=0";
  if (training && n.num_outputs() > 3) return node_invalid(n) << n.num_outputs() << " outputs (at most 3 in training mode)";
  for (size_t i = 1; i < n.num_outputs() && !training; ++i) {
    if (n.output(i) != nullptr && !n.output(i)->name().empty()) {
      return node_unsupported(n) << "running statistics outputs without training_mode=1 (the opset 6-9 training form)";
    }
  }
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape() && t.rank() < 2) return node_invalid(n) << "input of rank " << t.rank() << " (>= 2 expected)";
  // scale, B, mean and var are [C]: anything else would be read out of bounds.
  static const char* kNames[] = {"", "scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(TensorType p, input_type(n, i));
    if (!t.has_shape()) continue;
    if (!p.has_shape() || p.rank() != 1 || !prove_equal((*p.shape)[0], (*t.shape)[1], ctx.bounds))
      return node_invalid(n) << kNames[i] << " has type " << p.to_string() << ", expected ["
                             << print_expr((*t.shape)[1]) << "] (one value per channel)";
  }
  if (training) {  // running_mean and running_var: [C], like input_mean
    KILN_ASSIGN_OR_RETURN(TensorType p, input_type(n, 3));
    for (size_t i = 1; i < n.num_outputs(); ++i)
      if (n.output(i) != nullptr && !n.output(i)->name().empty()) set_output(n, i, t.dtype, *p.shape, ctx);
  }
  return infer_same_shape(n, ctx);
}

// Loads a per-channel parameter (shape [C]) for channel index c, in dtype dt.
Expr channel_param(const LowerContext& ctx, size_t i, const Expr& c, DType dt) {
  return cast_if_needed(dt, ctx.load_input(i, {c}));
}

// Training mode (opset 14+): normalized with the batch's own statistics per
// channel (mean, and the population variance over every dim but 1), and the
// running statistics updated as input * momentum + batch * (1 - momentum).
Result<std::vector<tir::ComputeDef>> lower_batch_norm_training(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  std::vector<bool> reduced(in.shape.size(), true);
  reduced[1] = false;
  Expr count = cast(dt, product(in.shape, reduced));
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  tir::ComputeDef mean =
      reduce_over_dims(ctx, ctx.fresh(out.name + "_mean"), dt, in.shape, reduced, false, tir::Combiner::kSum,
                       const_of(dt, 0), x_at, [&](const Expr& acc, const std::vector<Expr>&) { return div(acc, count); });
  tir::ComputeDef var = reduce_over_dims(
      ctx, ctx.fresh(out.name + "_var"), dt, in.shape, reduced, false, tir::Combiner::kSum, const_of(dt, 0),
      [&](const std::vector<Expr>& idx) {
        Expr d = sub(x_at(idx), stage_load(mean, {idx[1]}));
        return mul(d, d);
      },
      [&](const Expr& acc, const std::vector<Expr>&) { return div(acc, count); });
  std::vector<tir::ComputeDef> stages{mean, var};
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  Expr c = idx[1];
  Expr eps = const_of(dt, n.attr_float("epsilon", 1e-5));
  Expr inv = div(const_of(dt, 1), call("sqrt", dt, {add(stage_load(var, {c}), eps)}));
  Expr y = mul(mul(sub(ctx.load_input(0, idx), stage_load(mean, {c})), inv), channel_param(ctx, 1, c, dt));
  stages.push_back(make_stage(out.name, dt, axes, out.shape, add(y, channel_param(ctx, 2, c, dt))));
  const double momentum = n.attr_float("momentum", 0.9);
  for (size_t i = 1; i < 3 && i < ctx.outputs.size(); ++i) {
    const tir::Buffer& b = ctx.outputs[i];
    if (b.name.empty()) continue;
    std::vector<std::string> ca = fresh_axes(ctx, 1);
    Expr k = axis_vars(ca)[0];
    Expr batch = stage_load(i == 1 ? mean : var, {k});
    Expr running = add(mul(channel_param(ctx, i == 1 ? 3 : 4, k, dt), const_of(dt, momentum)),
                       mul(batch, const_of(dt, 1.0 - momentum)));
    stages.push_back(make_stage(b.name, b.dtype, ca, b.shape, running));
  }
  return stages;
}

Result<std::vector<tir::ComputeDef>> lower_batch_norm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  if (in.shape.size() < 2) return node_invalid(n) << "input of rank " << in.shape.size();
  if (n.attr_int("training_mode", 0) != 0) return lower_batch_norm_training(n, ctx);
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  Expr c = idx[1];
  Expr eps = const_of(dt, n.attr_float("epsilon", 1e-5));
  Expr inv = div(const_of(dt, 1), call("sqrt", dt, {add(channel_param(ctx, 4, c, dt), eps)}));
  Expr y = mul(mul(sub(ctx.load_input(0, idx), channel_param(ctx, 3, c, dt)), inv), channel_param(ctx, 1, c, dt));
  y = add(y, channel_param(ctx, 2, c, dt));
  return std::vector<tir::ComputeDef>{make_stage(out.name, dt, axes, out.shape, y)};
}

// ---- InstanceNormalization ----------------------------------------------------------------

Status infer_instance_norm(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape()) {
    if (t.rank() < 2) return node_invalid(n) << "input of rank " << t.rank() << " (>= 2 expected)";
    KILN_RETURN_IF_ERROR(require_param_shape(n, 1, {(*t.shape)[1]}, "scale", ctx.bounds));
    KILN_RETURN_IF_ERROR(require_param_shape(n, 2, {(*t.shape)[1]}, "B", ctx.bounds));
  }
  return infer_same_shape(n, ctx);
}

Result<std::vector<tir::ComputeDef>> lower_instance_norm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  if (in.shape.size() < 3) return node_invalid(n) << "input of rank " << in.shape.size() << " (>= 3 expected)";
  std::vector<bool> reduced(in.shape.size(), true);
  reduced[0] = reduced[1] = false;
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  Moments m = moments(ctx, out.name, dt, in.shape, reduced, false, x_at, n.attr_float("epsilon", 1e-5));
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  std::vector<Expr> sidx = reduced_index(idx, reduced, false);
  Expr y = mul(mul(sub(x_at(idx), stage_load(m.mean, sidx)), stage_load(m.rstd, sidx)), channel_param(ctx, 1, idx[1], dt));
  y = add(y, channel_param(ctx, 2, idx[1], dt));
  return std::vector<tir::ComputeDef>{m.mean, m.rstd, make_stage(out.name, dt, axes, out.shape, y)};
}

// ---- GroupNormalization ---------------------------------------------------------------------
// Statistics per (n, group) over the group's C/G channels and all spatial
// dims. Scale and bias are per channel ([C], opset 21) or per group ([G],
// opset 18); which one is decided from their shape.

Status infer_group_norm(Node& n, InferContext& ctx) {
  if (!n.has_attr("num_groups")) return node_invalid(n) << "missing attribute num_groups";
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape() && t.rank() < 2) return node_invalid(n) << "input of rank " << t.rank();
  return infer_same_shape(n, ctx);
}

Result<std::vector<tir::ComputeDef>> lower_group_norm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  size_t rank = in.shape.size();
  if (rank < 2) return node_invalid(n) << "input of rank " << rank;
  int64_t groups = n.attr_int("num_groups", 0);
  if (groups <= 0) return node_invalid(n) << "num_groups " << groups;
  Expr channels = in.shape[1];
  Expr per_group = simplify(floordiv(channels, Expr(groups)));
  if (auto c = channels.as_const(); c && *c % groups != 0) {
    return node_invalid(n) << "channels " << *c << " not divisible by num_groups " << groups;
  }
  // The input viewed as [N, G, C/G, spatial...]; statistics reduce all but dims 0 and 1.
  std::vector<Expr> view{in.shape[0], Expr(groups), per_group};
  for (size_t d = 2; d < rank; ++d) view.push_back(in.shape[d]);
  std::vector<bool> reduced(view.size(), true);
  reduced[0] = reduced[1] = false;
  auto x_view = [&](const std::vector<Expr>& v) {
    std::vector<Expr> idx{v[0], add(mul(v[1], per_group), v[2])};
    for (size_t d = 3; d < v.size(); ++d) idx.push_back(v[d]);
    return ctx.load_input(0, idx);
  };
  Moments m = moments(ctx, out.name, dt, view, reduced, false, x_view, n.attr_float("epsilon", 1e-5));

  auto param_per_channel = [&](size_t i) -> Result<bool> {
    const auto& s = ctx.inputs[i].shape;
    if (s.size() != 1) return node_invalid(n) << "scale/bias of rank " << s.size() << " (1 expected)";
    if (prove_equal(s[0], channels)) return true;
    if (prove_equal(s[0], Expr(groups))) return false;
    return node_invalid(n) << "scale/bias of size " << s[0].to_string() << " (C or num_groups expected)";
  };
  KILN_ASSIGN_OR_RETURN(bool scale_c, param_per_channel(1));
  KILN_ASSIGN_OR_RETURN(bool bias_c, param_per_channel(2));

  std::vector<std::string> axes = fresh_axes(ctx, rank);
  std::vector<Expr> idx = axis_vars(axes);
  Expr g = floordiv(idx[1], per_group);
  std::vector<Expr> sidx{idx[0], g};
  Expr y = mul(sub(ctx.load_input(0, idx), stage_load(m.mean, sidx)), stage_load(m.rstd, sidx));
  y = mul(y, channel_param(ctx, 1, scale_c ? idx[1] : g, dt));
  y = add(y, channel_param(ctx, 2, bias_c ? idx[1] : g, dt));
  return std::vector<tir::ComputeDef>{m.mean, m.rstd, make_stage(out.name, dt, axes, out.shape, y)};
}

// ---- LpNormalization, MeanVarianceNormalization ------------------------------------------------

Result<std::vector<tir::ComputeDef>> lower_lp_norm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  int64_t p = n.attr_int("p", 2);
  if (p != 1 && p != 2) return node_unsupported(n) << "p=" << p << " (1 or 2 supported)";
  int64_t rank = static_cast<int64_t>(in.shape.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", -1), rank));
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  reduced[static_cast<size_t>(axis)] = true;
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  tir::ComputeDef norm = reduce_over_dims(
      ctx, ctx.fresh(out.name + "_norm"), dt, in.shape, reduced, false, tir::Combiner::kSum, const_of(dt, 0),
      [&](const std::vector<Expr>& idx) {
        Expr x = x_at(idx);
        return p == 1 ? call("abs", dt, {x}) : mul(x, x);
      },
      [&](const Expr& acc, const std::vector<Expr>&) { return p == 1 ? acc : call("sqrt", dt, {acc}); });
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  Expr y = div(x_at(idx), stage_load(norm, reduced_index(idx, reduced, false)));
  return std::vector<tir::ComputeDef>{norm, make_stage(out.name, dt, axes, out.shape, y)};
}

Result<std::vector<bool>> mvn_dims(const Node& n, int64_t rank) {
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t a : n.attr_ints("axes", {0, 2, 3})) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(n, a, rank));
    reduced[static_cast<size_t>(ax)] = true;
  }
  return reduced;
}

Status infer_mvn(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape()) KILN_RETURN_IF_ERROR(mvn_dims(n, t.rank()).status());
  return infer_same_shape(n, ctx);
}

// Y = (X - E[X]) / (sqrt(Var[X]) + 1e-9), as the ONNX function body.
Result<std::vector<tir::ComputeDef>> lower_mvn(const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  KILN_RETURN_IF_ERROR(check_float_input(n, dt));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> reduced, mvn_dims(n, static_cast<int64_t>(in.shape.size())));
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  Expr count = cast(dt, product(in.shape, reduced));
  tir::ComputeDef mean = reduce_over_dims(ctx, ctx.fresh(out.name + "_mean"), dt, in.shape, reduced, false,
                                          tir::Combiner::kSum, const_of(dt, 0), x_at,
                                          [&](const Expr& acc, const std::vector<Expr>&) { return div(acc, count); });
  tir::ComputeDef denom = reduce_over_dims(
      ctx, ctx.fresh(out.name + "_std"), dt, in.shape, reduced, false, tir::Combiner::kSum, const_of(dt, 0),
      [&](const std::vector<Expr>& idx) {
        Expr d = sub(x_at(idx), stage_load(mean, reduced_index(idx, reduced, false)));
        return mul(d, d);
      },
      [&](const Expr& acc, const std::vector<Expr>&) {
        return add(call("sqrt", dt, {div(acc, count)}), const_of(dt, 1e-9));
      });
  std::vector<std::string> axes = fresh_axes(ctx, in.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  std::vector<Expr> sidx = reduced_index(idx, reduced, false);
  Expr y = div(sub(x_at(idx), stage_load(mean, sidx)), stage_load(denom, sidx));
  return std::vector<tir::ComputeDef>{mean, denom, make_stage(out.name, dt, axes, out.shape, y)};
}

void register_norm(const char* name, std::function<Status(Node&, InferContext&)> infer,
                   std::function<Result<std::vector<tir::ComputeDef>>(const Node&, LowerContext&)> lower) {
  register_op(make_def(name, std::move(infer), std::move(lower)));
}

// Scale and B dims that inference could not prove 1 or equal to the
// normalized dims: checked at run time before the kernel reads them.
std::vector<DimCheck> layer_norm_dim_checks(const Node& n, const SymbolBounds& bounds) {
  const Value* x = n.input(0);
  if (x == nullptr || !x->type().shape) return {};
  auto axis = normalize_axis(n, n.attr_int("axis", -1), x->type().rank());
  if (!axis.is_ok()) return {};
  Shape normalized(x->type().shape->begin() + *axis, x->type().shape->end());
  std::vector<DimCheck> checks = broadcast_dim_checks(n, 1, normalized, bounds);
  for (DimCheck& c : broadcast_dim_checks(n, 2, normalized, bounds)) checks.push_back(std::move(c));
  return checks;
}

// Softmax: dx = y * (dy - sum(dy * y)); LogSoftmax: dx = dy - exp(y) * sum(dy),
// the sums over the axis (kept). Before opset 13 the op flattens to 2-D at
// its axis: the same rule when that axis is the last.
Status grad_softmax(GradBuilder& b, bool log) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  const int64_t rank = n.input(0)->type().rank();
  if (rank < 1) return node_unsupported(n) << "the gradient of a softmax of unknown rank";
  const bool old = b.opset() > 0 && b.opset() < 13;
  int64_t axis = n.attr_int("axis", old ? 1 : -1);
  if (axis < 0) axis += rank;
  if (old && axis != rank - 1)
    return node_unsupported(n) << "the gradient of " << n.op_type() << " before opset 13 over axes other than the last";
  Value* y = n.output(0);
  Value* gy = b.output_grad(0);
  Value* g = nullptr;
  if (log) {
    KILN_ASSIGN_OR_RETURN(Value* s, b.reduce_sum(gy, {axis}, true));
    KILN_ASSIGN_OR_RETURN(Value* p, b.add1("Exp", {y}));
    KILN_ASSIGN_OR_RETURN(Value* ps, b.add1("Mul", {p, s}));
    KILN_ASSIGN_OR_RETURN(g, b.add1("Sub", {gy, ps}));
  } else {
    KILN_ASSIGN_OR_RETURN(Value* gyy, b.add1("Mul", {gy, y}));
    KILN_ASSIGN_OR_RETURN(Value* s, b.reduce_sum(gyy, {axis}, true));
    KILN_ASSIGN_OR_RETURN(Value* d, b.add1("Sub", {gy, s}));
    KILN_ASSIGN_OR_RETURN(g, b.add1("Mul", {y, d}));
  }
  return b.set_input_grad(0, g);
}

// The statistics of x over `axes` (kept), recomputed for a backward:
// xhat = (x - mean) rstd with rstd = 1 / sqrt(var + eps).
struct Normalized {
  Value* xhat = nullptr;
  Value* rstd = nullptr;
};

Result<Normalized> normalize_again(GradBuilder& b, Value* x, const std::vector<int64_t>& axes, double eps) {
  KILN_ASSIGN_OR_RETURN(Value* mu, b.reduce_mean(x, axes));
  KILN_ASSIGN_OR_RETURN(Value* xc, b.add1("Sub", {x, mu}));
  KILN_ASSIGN_OR_RETURN(Value* sq, b.add1("Mul", {xc, xc}));
  KILN_ASSIGN_OR_RETURN(Value* var, b.reduce_mean(sq, axes));
  KILN_ASSIGN_OR_RETURN(Value* ve, b.add1("Add", {var, b.scalar(eps, x)}));
  KILN_ASSIGN_OR_RETURN(Value* sd, b.add1("Sqrt", {ve}));
  Normalized out;
  KILN_ASSIGN_OR_RETURN(out.rstd, b.add1("Reciprocal", {sd}));
  KILN_ASSIGN_OR_RETURN(out.xhat, b.add1("Mul", {xc, out.rstd}));
  return out;
}

// The input gradient of a normalization over `axes` whose normalized value's
// gradient is g: rstd (g - mean g - xhat mean(g xhat)).
Result<Value*> normalized_input_grad(GradBuilder& b, Value* g, const Normalized& s, const std::vector<int64_t>& axes) {
  KILN_ASSIGN_OR_RETURN(Value* m1, b.reduce_mean(g, axes));
  KILN_ASSIGN_OR_RETURN(Value* gx, b.add1("Mul", {g, s.xhat}));
  KILN_ASSIGN_OR_RETURN(Value* m2, b.reduce_mean(gx, axes));
  KILN_ASSIGN_OR_RETURN(Value* xm2, b.add1("Mul", {s.xhat, m2}));
  KILN_ASSIGN_OR_RETURN(Value* d1, b.add1("Sub", {g, m1}));
  KILN_ASSIGN_OR_RETURN(Value* d2, b.add1("Sub", {d1, xm2}));
  return b.add1("Mul", {d2, s.rstd});
}

// LayerNormalization, y = xhat * scale + b with xhat = (x - mean) / sqrt(var +
// eps) over the axes from `axis`: the statistics recomputed from x, then
// db = sum dy, dscale = sum dy * xhat (over the leading axes), and
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * scale.
Status grad_layer_norm(GradBuilder& b) {
  const Node& n = b.node();
  for (size_t i = 1; i < n.num_outputs(); ++i)
    if (b.output_grad(i) != nullptr) return node_unsupported(n) << "the gradient through its Mean or InvStdDev output";
  Value* x = n.input(0);
  const int64_t rank = x->type().rank();
  if (rank < 1) return node_unsupported(n) << "the gradient of a LayerNormalization of unknown rank";
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", -1), rank));
  std::vector<int64_t> axes;
  for (int64_t d = axis; d < rank; ++d) axes.push_back(d);
  Value* dy = b.output_grad(0);
  KILN_ASSIGN_OR_RETURN(Normalized st, normalize_again(b, x, axes, n.attr_float("epsilon", 1e-5)));
  if (n.num_inputs() > 2 && n.input(2) != nullptr) KILN_RETURN_IF_ERROR(b.give(2, dy));
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* ds, b.add1("Mul", {dy, st.xhat}));
    KILN_RETURN_IF_ERROR(b.give(1, ds));
  }
  if (!b.wants(0)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {dy, n.input(1)}));
  KILN_ASSIGN_OR_RETURN(Value* dx, normalized_input_grad(b, g, st, axes));
  return b.set_input_grad(0, dx);
}

// BatchNormalization in training form (training_mode = 1): the batch's
// statistics over every axis but the channels' (recomputed here: mean mu,
// xc = x - mu, rstd = 1 / sqrt(mean(xc^2) + eps)), the N elements per
// channel; with per-channel sums Sdy = sum dY and Sc = sum dY xc:
//   dB = Sdy, dscale = Sc rstd,
//   dX = scale rstd (dY - Sdy / N - xc rstd^2 Sc / N)
//      = k1 dY + k2 + k3 xc with per-channel k1 = scale rstd,
//        k2 = -k1 Sdy / N, k3 = -k1 rstd^2 Sc / N,
// so the backward reads x, xc and dY a few times and writes xc and dX
// (xhat and dY scale are never stored; the reductions compute their
// products in their loads). With a symbolic N, the means of dY and dY xc
// replace Sdy / N and Sc / N. The running statistics outputs carry no
// gradient.
Status grad_batch_norm_training(GradBuilder& b, const std::vector<int64_t>& per_channel,
                                const std::vector<int64_t>& others) {
  const Node& n = b.node();
  for (size_t i = 1; i < n.num_outputs(); ++i)
    if (b.output_grad(i) != nullptr) return node_unsupported(n) << "a gradient through the running statistics";
  if (b.wants(3) || b.wants(4)) return node_unsupported(n) << "the gradient with respect to the running statistics";
  Value* dy = b.output_grad(0);
  Value* x = n.input(0);
  KILN_ASSIGN_OR_RETURN(Value* mu, b.reduce_mean(x, others));
  KILN_ASSIGN_OR_RETURN(Value* xc, b.add1("Sub", {x, mu}));
  KILN_ASSIGN_OR_RETURN(Value* sq, b.add1("Mul", {xc, xc}));
  KILN_ASSIGN_OR_RETURN(Value* var, b.reduce_mean(sq, others));
  KILN_ASSIGN_OR_RETURN(Value* ve, b.add1("Add", {var, b.scalar(n.attr_float("epsilon", 1e-5), x)}));
  KILN_ASSIGN_OR_RETURN(Value* sd, b.add1("Sqrt", {ve}));
  KILN_ASSIGN_OR_RETURN(Value* rstd, b.add1("Reciprocal", {sd}));
  KILN_ASSIGN_OR_RETURN(Value* sdy, b.reduce_sum(dy, others, true));
  KILN_ASSIGN_OR_RETURN(Value* dyxc, b.add1("Mul", {dy, xc}));
  KILN_ASSIGN_OR_RETURN(Value* sc, b.reduce_sum(dyxc, others, true));
  Value* flat = b.ints({-1});
  if (b.wants(2)) {
    KILN_ASSIGN_OR_RETURN(Value* db, b.add1("Reshape", {sdy, flat}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(2, db));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* scr, b.add1("Mul", {sc, rstd}));
    KILN_ASSIGN_OR_RETURN(Value* ds, b.add1("Reshape", {scr, flat}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, ds));
  }
  if (!b.wants(0)) return Status::ok();
  // Sdy / N and Sc / N: by a constant 1 / N where every reduced dim is static.
  Value* mdy = nullptr;
  Value* mc = nullptr;
  std::optional<int64_t> count = 1;
  for (int64_t d : others) {
    auto c = (*x->type().shape)[static_cast<size_t>(d)].as_const();
    count = c && count ? std::optional<int64_t>(*count * *c) : std::nullopt;
  }
  if (count && *count > 0) {
    Value* inv_n = b.scalar(1.0 / static_cast<double>(*count), x);
    KILN_ASSIGN_OR_RETURN(mdy, b.add1("Mul", {sdy, inv_n}));
    KILN_ASSIGN_OR_RETURN(mc, b.add1("Mul", {sc, inv_n}));
  } else {
    KILN_ASSIGN_OR_RETURN(mdy, b.reduce_mean(dy, others));
    KILN_ASSIGN_OR_RETURN(mc, b.reduce_mean(dyxc, others));
  }
  KILN_ASSIGN_OR_RETURN(Value* scale_c, b.add1("Reshape", {n.input(1), b.ints(per_channel)}));
  KILN_ASSIGN_OR_RETURN(Value* k1, b.add1("Mul", {scale_c, rstd}));
  KILN_ASSIGN_OR_RETURN(Value* k1m, b.add1("Mul", {k1, mdy}));
  KILN_ASSIGN_OR_RETURN(Value* k2, b.add1("Neg", {k1m}));
  KILN_ASSIGN_OR_RETURN(Value* r2, b.add1("Mul", {rstd, rstd}));
  KILN_ASSIGN_OR_RETURN(Value* k1r2, b.add1("Mul", {k1, r2}));
  KILN_ASSIGN_OR_RETURN(Value* k1r2m, b.add1("Mul", {k1r2, mc}));
  KILN_ASSIGN_OR_RETURN(Value* k3, b.add1("Neg", {k1r2m}));
  KILN_ASSIGN_OR_RETURN(Value* t1, b.add1("Mul", {dy, k1}));
  KILN_ASSIGN_OR_RETURN(Value* t2, b.add1("Add", {t1, k2}));
  KILN_ASSIGN_OR_RETURN(Value* t3, b.add1("Mul", {xc, k3}));
  KILN_ASSIGN_OR_RETURN(Value* dx, b.add1("Add", {t2, t3}));
  return b.set_input_grad(0, dx);
}

// BatchNormalization with its running statistics (inference form): per
// channel an affine map, so dX = dY * scale / sqrt(var + eps), dscale =
// sum dY * xhat and dB = sum dY over every axis but the channels'.
Status grad_batch_norm(GradBuilder& b) {
  const Node& n = b.node();
  const int64_t rank = n.input(0)->type().rank();
  if (rank < 2) return node_unsupported(n) << "the gradient of a BatchNormalization of unknown rank";
  std::vector<int64_t> per_channel = {1, -1};
  std::vector<int64_t> others = {0};
  for (int64_t d = 2; d < rank; ++d) {
    per_channel.push_back(1);
    others.push_back(d);
  }
  if (n.attr_int("training_mode", 0) != 0) return grad_batch_norm_training(b, per_channel, others);
  Value* dy = b.output_grad(0);
  Value* x = n.input(0);
  auto channels = [&](Value* v) { return b.add1("Reshape", {v, b.ints(per_channel)}); };
  KILN_ASSIGN_OR_RETURN(Value* ve, b.add1("Add", {n.input(4), b.scalar(n.attr_float("epsilon", 1e-5), n.input(4))}));
  KILN_ASSIGN_OR_RETURN(Value* sd, b.add1("Sqrt", {ve}));
  KILN_ASSIGN_OR_RETURN(Value* rstd, b.add1("Reciprocal", {sd}));
  KILN_ASSIGN_OR_RETURN(Value* rstd_c, channels(rstd));
  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* k, b.add1("Mul", {n.input(1), rstd}));
    KILN_ASSIGN_OR_RETURN(Value* k_c, channels(k));
    KILN_ASSIGN_OR_RETURN(Value* dx, b.add1("Mul", {dy, k_c}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(0, dx));
  }
  if (b.wants(2)) {
    KILN_ASSIGN_OR_RETURN(Value* db, b.reduce_sum(dy, others, false));
    KILN_RETURN_IF_ERROR(b.set_input_grad(2, db));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* mean_c, channels(n.input(3)));
    KILN_ASSIGN_OR_RETURN(Value* xc, b.add1("Sub", {x, mean_c}));
    KILN_ASSIGN_OR_RETURN(Value* xhat, b.add1("Mul", {xc, rstd_c}));
    KILN_ASSIGN_OR_RETURN(Value* prod, b.add1("Mul", {dy, xhat}));
    KILN_ASSIGN_OR_RETURN(Value* ds, b.reduce_sum(prod, others, false));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, ds));
  }
  if (b.wants(3) || b.wants(4))
    return node_unsupported(n) << "the gradient with respect to the running statistics";
  return Status::ok();
}

}  // namespace

void register_norm_ops() {
  register_norm("Softmax", infer_softmax,
                [](const Node& n, LowerContext& ctx) { return lower_softmax(SoftmaxKind::kSoftmax, n, ctx); });
  register_norm("LogSoftmax", infer_softmax,
                [](const Node& n, LowerContext& ctx) { return lower_softmax(SoftmaxKind::kLogSoftmax, n, ctx); });
  extend_op("", "Softmax", [](OpDef& def) { def.gradient = [](GradBuilder& b) { return grad_softmax(b, false); }; });
  extend_op("", "LogSoftmax", [](OpDef& def) { def.gradient = [](GradBuilder& b) { return grad_softmax(b, true); }; });
  register_norm("Hardmax", infer_softmax,
                [](const Node& n, LowerContext& ctx) { return lower_softmax(SoftmaxKind::kHardmax, n, ctx); });
  register_norm("LayerNormalization", infer_layer_norm, lower_layer_norm);
  extend_op("", "LayerNormalization", [](OpDef& def) {
    def.dim_checks = layer_norm_dim_checks;
    def.gradient = grad_layer_norm;
  });
  register_norm("BatchNormalization", infer_batch_norm, lower_batch_norm);
  extend_op("", "BatchNormalization", [](OpDef& def) { def.gradient = grad_batch_norm; });
  register_norm("InstanceNormalization", infer_instance_norm, lower_instance_norm);
  register_norm("GroupNormalization", infer_group_norm, lower_group_norm);
  register_norm("LpNormalization", infer_same_shape, lower_lp_norm);
  register_norm("MeanVarianceNormalization", infer_mvn, lower_mvn);
}

}  // namespace kiln::ops
