// Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss. Compiled.
//
// Both read an input of shape [N, C, d1, ..., dk] (log-probabilities for
// NegativeLogLikelihoodLoss, scores for SoftmaxCrossEntropyLoss) and integer
// targets of shape [N, d1, ..., dk]. Per target element, with c = target and
// w = weight[c] (1 without weights):
//   loss[n, d] = -input[n, c, d] * w,  or 0 when c == ignore_index
// and the reduction is
//   none: loss itself; sum: sum(loss);
//   mean: sum(loss) / sum(w over targets that are not ignored) when there are
//         weights or an ignore_index (the ONNX spec), else sum(loss) / count.
// A target's class index is clamped into [0, C) for the loads, so that an
// ignored target outside the class range reads nothing out of bounds (its
// contribution is 0 by the select above).
//
// SoftmaxCrossEntropyLoss first computes log_softmax over dim 1 (max, sum of
// exp(x - max), then x - max - log(sum)): three stages, the last of which is
// the optional second output log_prob. The loss then reads it as above.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/gradient.h"

namespace kiln::ops {

namespace {

enum class LossKind { kNll, kSoftmaxCrossEntropy };

Result<std::string> loss_reduction(const Node& n) {
  std::string r = n.attr_string("reduction", "mean");
  if (r != "none" && r != "sum" && r != "mean") return node_invalid(n) << "unknown reduction '" << r << "'";
  return r;
}

Status infer_loss(LossKind kind, Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType tt, input_type(n, 1));
  KILN_ASSIGN_OR_RETURN(Shape t, input_shape(n, 1));
  if (x.size() < 2) return node_invalid(n) << "input must have rank >= 2 ([N, C, ...])";
  if (t.size() + 1 != x.size()) {
    return node_invalid(n) << "target rank " << t.size() << " must be input rank " << x.size() << " - 1";
  }
  if (tt.dtype != DType::kInt32 && tt.dtype != DType::kInt64) {
    return node_invalid(n) << "target must be i32 or i64, not " << dtype_name(tt.dtype);
  }
  KILN_ASSIGN_OR_RETURN(std::string red, loss_reduction(n));
  KILN_RETURN_IF_ERROR(require_param_shape(n, 2, {x[1]}, "weight", ctx.bounds));
  for (size_t d = 0; d < t.size(); ++d) {
    Expr xd = x[d == 0 ? 0 : d + 1];
    auto a = simplify(xd, ctx.bounds).as_const(), b = simplify(t[d], ctx.bounds).as_const();
    if (a && b && *a != *b) return node_invalid(n) << "target dim " << d << " is " << *b << ", input's is " << *a;
  }
  set_output(n, 0, xt.dtype, red == "none" ? t : Shape{}, ctx);
  if (kind == LossKind::kSoftmaxCrossEntropy && n.num_outputs() > 1) set_output(n, 1, xt.dtype, x, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_loss(LossKind kind, const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType dt = x.dtype;
  if (!dtype_is_float(dt) || !dtype_is_compilable(dt)) {
    return node_unsupported(n) << "dtype " << dtype_name(dt) << " (f32 or f64 expected)";
  }
  KILN_ASSIGN_OR_RETURN(std::string red, loss_reduction(n));
  const std::vector<Expr>& t_shape = ctx.inputs[1].shape;
  Expr classes = x.shape[1];
  bool weighted = has_input(n, 2);
  bool has_ignore = n.has_attr("ignore_index");
  int64_t ignore = n.attr_int("ignore_index", 0);
  std::vector<tir::ComputeDef> stages;

  // The log-probability at a full index [n, c, d...].
  std::function<Expr(const std::vector<Expr>&)> logp_at = [&](const std::vector<Expr>& idx) {
    return ctx.load_input(0, idx);
  };
  if (kind == LossKind::kSoftmaxCrossEntropy) {
    std::vector<bool> over_c(x.shape.size(), false);
    over_c[1] = true;
    auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
    tir::ComputeDef mx = reduce_over_dims(ctx, ctx.fresh(y.name + "_max"), dt, x.shape, over_c, false,
                                          tir::Combiner::kMax, lowest_of(dt), x_at);
    tir::ComputeDef se = reduce_over_dims(
        ctx, ctx.fresh(y.name + "_sumexp"), dt, x.shape, over_c, false, tir::Combiner::kSum, const_of(dt, 0),
        [&](const std::vector<Expr>& idx) {
          return call("exp", dt, {sub(x_at(idx), stage_load(mx, reduced_index(idx, over_c, false)))});
        });
    std::vector<std::string> axes = fresh_axes(ctx, x.shape.size());
    std::vector<Expr> iv = axis_vars(axes);
    std::vector<Expr> ri = reduced_index(iv, over_c, false);
    std::string lp_name =
        ctx.outputs.size() > 1 && !ctx.outputs[1].name.empty() ? ctx.outputs[1].name : ctx.fresh(y.name + "_logp");
    Expr lp = sub(sub(x_at(iv), stage_load(mx, ri)), call("log", dt, {stage_load(se, ri)}));
    stages.push_back(mx);
    stages.push_back(se);
    stages.push_back(make_stage(lp_name, dt, axes, x.shape, lp));
    tir::ComputeDef lp_stage = stages.back();
    logp_at = [lp_stage](const std::vector<Expr>& idx) { return stage_load(lp_stage, idx); };
  }

  // Per target element (index [n, d...]): the class, whether it is ignored, its weight.
  auto target_at = [&](const std::vector<Expr>& tidx) { return cast_if_needed(DType::kInt64, ctx.load_input(1, tidx)); };
  auto ignored_at = [&](const std::vector<Expr>& tidx) -> Expr {
    return has_ignore ? eq(target_at(tidx), Expr(ignore)) : Expr();
  };
  auto class_at = [&](const std::vector<Expr>& tidx) { return max(min(target_at(tidx), classes - 1), Expr(0)); };
  auto weight_at = [&](const std::vector<Expr>& tidx) -> Expr {
    Expr w = weighted ? ctx.load_input(2, {class_at(tidx)}) : const_of(dt, 1);
    Expr ig = ignored_at(tidx);
    return ig.defined() ? select(ig, const_of(dt, 0), w) : w;
  };
  auto loss_at = [&](const std::vector<Expr>& tidx) -> Expr {
    std::vector<Expr> full = {tidx[0], class_at(tidx)};
    full.insert(full.end(), tidx.begin() + 1, tidx.end());
    Expr v = sub(const_of(dt, 0), logp_at(full));
    if (weighted) v = mul(v, ctx.load_input(2, {class_at(tidx)}));
    Expr ig = ignored_at(tidx);
    return ig.defined() ? select(ig, const_of(dt, 0), v) : v;
  };

  if (red == "none") {
    std::vector<std::string> axes = fresh_axes(ctx, t_shape.size());
    stages.push_back(make_stage(y.name, dt, axes, y.shape, loss_at(axis_vars(axes))));
    return stages;
  }
  std::vector<bool> all(t_shape.size(), true);
  if (red == "sum") {
    stages.push_back(reduce_over_dims(ctx, y.name, dt, t_shape, all, false, tir::Combiner::kSum, const_of(dt, 0),
                                      loss_at));
    return stages;
  }
  Expr denom;
  if (weighted || has_ignore) {
    stages.push_back(reduce_over_dims(ctx, ctx.fresh(y.name + "_wsum"), dt, t_shape, all, false,
                                      tir::Combiner::kSum, const_of(dt, 0), weight_at));
    denom = stage_load(stages.back(), {});
  } else {
    Expr count = Expr(1);
    for (const Expr& d : t_shape) count = mul(count, d);
    denom = cast(dt, simplify(count));
  }
  stages.push_back(reduce_over_dims(ctx, y.name, dt, t_shape, all, false, tir::Combiner::kSum, const_of(dt, 0),
                                    loss_at,
                                    [&](const Expr& acc, const std::vector<Expr>&) { return div(acc, denom); }));
  return stages;
}

// The gradient with respect to the input (the class weights and the
// targets get none). With m[n, c, d] = w[c] (1 without weights) where c is
// the target and not ignore_index, else 0, and s the output gradient spread
// over the target elements (none: dloss[n, d]; sum: dloss; mean: dloss over
// the sum of m, which is the count without weights or ignore_index):
//   NegativeLogLikelihoodLoss: dx = -m s
//   SoftmaxCrossEntropyLoss:   dx = (softmax(x) sum_c m - m) s
// (the log-softmax's backward of -m s), softmax from the log_prob output of
// a loss node of the same attributes.
Status grad_loss(LossKind kind, GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  if (b.wants(2)) return node_unsupported(n) << "a gradient with respect to the class weights";
  if (n.num_outputs() > 1 && b.output_grad(1) != nullptr) return node_unsupported(n) << "a gradient through log_prob";
  Value* x = n.input(0);
  Value* t = n.input(1);
  const int64_t rank = x->type().rank();
  if (rank < 2) return node_unsupported(n) << "an input of unknown rank";
  KILN_ASSIGN_OR_RETURN(std::string red, loss_reduction(n));
  // The classes [0, C) as [1, C, 1...], and the targets as [N, 1, d...].
  std::vector<int64_t> class_shape(static_cast<size_t>(rank), 1);
  class_shape[1] = -1;
  KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {x}));
  KILN_ASSIGN_OR_RETURN(Value* c, b.add1("Gather", {shape, b.ints({1})}));
  KILN_ASSIGN_OR_RETURN(Value* c0, b.add1("Squeeze", {c}));
  Tensor zero(DType::kInt64, {}), one(DType::kInt64, {});
  zero.set_f64(0, 0);
  one.set_f64(0, 1);
  KILN_ASSIGN_OR_RETURN(Value* range, b.add1("Range", {b.constant(zero), c0, b.constant(one)}));
  KILN_ASSIGN_OR_RETURN(Value* classes, b.add1("Reshape", {range, b.ints(class_shape)}));
  Value* t64 = t;
  if (t->dtype() != DType::kInt64) {
    KILN_ASSIGN_OR_RETURN(t64, b.add1("Cast", {t}, {{"to", Attribute::of_int(static_cast<int64_t>(DType::kInt64))}}));
  }
  KILN_ASSIGN_OR_RETURN(Value* tu, b.unsqueeze(t64, {1}));
  KILN_ASSIGN_OR_RETURN(Value* hit, b.add1("Equal", {tu, classes}));
  Value* on = b.scalar(1, x);
  if (has_input(n, 2)) {
    KILN_ASSIGN_OR_RETURN(on, b.add1("Reshape", {n.input(2), b.ints(class_shape)}));
  }
  KILN_ASSIGN_OR_RETURN(Value* m, b.add1("Where", {hit, on, b.scalar(0, x)}));
  if (n.has_attr("ignore_index")) {
    Tensor ig(DType::kInt64, {});
    ig.set_f64(0, static_cast<double>(n.attr_int("ignore_index", 0)));
    KILN_ASSIGN_OR_RETURN(Value* ignored, b.add1("Equal", {tu, b.constant(ig)}));
    KILN_ASSIGN_OR_RETURN(m, b.add1("Where", {ignored, b.scalar(0, x), m}));
  }
  Value* dloss = b.output_grad(0);
  Value* s = dloss;
  if (red == "none") {
    KILN_ASSIGN_OR_RETURN(s, b.unsqueeze(dloss, {1}));
  } else if (red == "mean") {
    KILN_ASSIGN_OR_RETURN(Value* total, b.add1("ReduceSum", {m}, {{"keepdims", Attribute::of_int(0)}}));
    KILN_ASSIGN_OR_RETURN(s, b.add1("Div", {dloss, total}));
  }
  KILN_ASSIGN_OR_RETURN(Value* ms, b.add1("Mul", {m, s}));
  Value* dx = nullptr;
  if (kind == LossKind::kNll) {
    KILN_ASSIGN_OR_RETURN(dx, b.add1("Neg", {ms}));
  } else {
    std::map<std::string, Attribute> attrs(n.attrs().begin(), n.attrs().end());
    std::vector<Value*> ins = {x, t};
    if (has_input(n, 2)) ins.push_back(n.input(2));
    KILN_ASSIGN_OR_RETURN(std::vector<Value*> again, b.add("SoftmaxCrossEntropyLoss", ins, attrs, 2));
    KILN_ASSIGN_OR_RETURN(Value* prob, b.add1("Exp", {again[1]}));
    KILN_ASSIGN_OR_RETURN(Value* msum, b.reduce_sum(ms, {1}, true));
    KILN_ASSIGN_OR_RETURN(Value* spread, b.add1("Mul", {prob, msum}));
    KILN_ASSIGN_OR_RETURN(dx, b.add1("Sub", {spread, ms}));
  }
  return b.set_input_grad(0, dx);
}

void register_loss(const char* name, LossKind kind) {
  OpDef def;
  def.name = name;
  def.infer = [kind](Node& n, InferContext& ctx) { return infer_loss(kind, n, ctx); };
  def.lower = [kind](const Node& n, LowerContext& ctx) { return lower_loss(kind, n, ctx); };
  def.gradient = [kind](GradBuilder& b) { return grad_loss(kind, b); };
  register_op(std::move(def));
}

}  // namespace

void register_loss_ops() {
  register_loss("NegativeLogLikelihoodLoss", LossKind::kNll);
  register_loss("SoftmaxCrossEntropyLoss", LossKind::kSoftmaxCrossEntropy);
}

}  // namespace kiln::ops
