// Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSumExp/SumSquare/LogSum
// and ArgMax/ArgMin.
//
// Axes come from the `axes` attribute (before opset 13 for ReduceSum, before
// 18 for the others) or from the optional second input, which must then be
// known at compile time (a constant, or a sym_value of constants).
//
// ReduceLogSumExp is two stages (max, then log(sum(exp(x - max))) + max).
// ArgMax/ArgMin are two stages: the max (min) over the axis, then the
// smallest (select_last_index: largest) index whose element equals it, as a
// min (max) reduction over select(x == m, k, sentinel).
#include <cmath>

#include "ops/common.h"

namespace kiln::ops {

namespace {

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSumExp, kSumSquare, kLogSum };

struct ReduceAxes {
  std::vector<bool> reduced;  // per input dim
  bool noop = false;          // empty axes with noop_with_empty_axes: identity
};

Result<ReduceAxes> reduce_axes(const Node& n, int64_t rank) {
  std::vector<int64_t> axes;
  if (n.has_attr("axes")) {
    axes = n.attr_ints("axes");
  } else if (has_input(n, 1)) {
    auto c = const_ints(n, 1);
    if (!c) return node_unsupported(n) << "axes that are not known at compile time";
    axes = *c;
  }
  ReduceAxes r;
  r.reduced.assign(static_cast<size_t>(rank), axes.empty());
  if (axes.empty() && n.attr_int("noop_with_empty_axes", 0) != 0) {
    r.noop = true;
    r.reduced.assign(static_cast<size_t>(rank), false);
    return r;
  }
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(n, a, rank));
    r.reduced[static_cast<size_t>(ax)] = true;
  }
  return r;
}

Shape reduced_shape(const Shape& in, const std::vector<bool>& reduced, bool keep_dims) {
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!reduced[d]) {
      out.push_back(in[d]);
    } else if (keep_dims) {
      out.push_back(Expr(1));
    }
  }
  return out;
}

Status infer_reduce(ReduceKind kind, Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!t.has_shape()) {
    set_output_unknown_rank(n, 0, t.dtype);
    return Status::ok();
  }
  if (!n.has_attr("axes") && has_input(n, 1) && !const_ints(n, 1)) {
    // Axes known only at run time: the runtime kernel computes the output,
    // whose dims are fresh symbols (its rank is known when keepdims is set or
    // the axes tensor has a known, non-zero length).
    KILN_ASSIGN_OR_RETURN(TensorType at, input_type(n, 1));
    if (at.dtype != DType::kInt64) return node_invalid(n) << "axes must be int64";
    int64_t out_rank = -1;
    if (n.attr_int("keepdims", 1) != 0) {
      out_rank = t.rank();
    } else if (at.is_static() && at.rank() == 1 && at.static_shape()[0] > 0) {
      out_rank = t.rank() - at.static_shape()[0];
    }
    if (out_rank < 0) {
      set_output_unknown_rank(n, 0, t.dtype);
      return Status::ok();
    }
    Shape out;
    for (int64_t d = 0; d < out_rank; ++d) out.push_back(ctx.fresh_symbol());
    set_output(n, 0, t.dtype, std::move(out), ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(ReduceAxes ax, reduce_axes(n, t.rank()));
  bool keep = n.attr_int("keepdims", 1) != 0;
  set_output(n, 0, t.dtype, reduced_shape(*t.shape, ax.reduced, keep || ax.noop), ctx);
  // Shape arithmetic: a full reduction of a rank-1 sym_value (e.g. ReduceProd(Shape(x))).
  auto vals = sym_values(n, 0);
  bool all = true;
  for (bool r : ax.reduced) all = all && r;
  if (vals && t.rank() == 1 && all && !vals->empty() && !ax.noop) {
    Expr acc = (*vals)[0];
    for (size_t i = 1; i < vals->size(); ++i) {
      const Expr& v = (*vals)[i];
      switch (kind) {
        case ReduceKind::kSum: acc = add(acc, v); break;
        case ReduceKind::kProd: acc = mul(acc, v); break;
        case ReduceKind::kMax: acc = max(acc, v); break;
        case ReduceKind::kMin: acc = min(acc, v); break;
        default: return Status::ok();
      }
    }
    if (kind != ReduceKind::kSum && kind != ReduceKind::kProd && kind != ReduceKind::kMax &&
        kind != ReduceKind::kMin) {
      return Status::ok();
    }
    n.output(0)->set_sym_value(std::vector<Expr>{simplify(acc, ctx.bounds)});
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_reduce(ReduceKind kind, const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  if (!dtype_is_compilable(in.dtype)) return node_unsupported(n) << "dtype " << dtype_name(in.dtype);
  KILN_ASSIGN_OR_RETURN(ReduceAxes ax, reduce_axes(n, static_cast<int64_t>(in.shape.size())));
  bool keep = n.attr_int("keepdims", 1) != 0 || ax.noop;
  DType dt = in.dtype;
  bool is_float = dtype_is_float(dt);
  if (dt == DType::kBool) return node_unsupported(n) << "reduction of bool";
  std::vector<tir::ComputeDef> stages;
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };

  if (ax.noop) {
    std::vector<std::string> axes = fresh_axes(ctx, out.shape.size());
    stages.push_back(make_stage(out.name, dt, axes, out.shape, x_at(axis_vars(axes))));
    return stages;
  }
  Expr count = Expr(1);
  for (size_t d = 0; d < in.shape.size(); ++d) {
    if (ax.reduced[d]) count = mul(count, in.shape[d]);
  }
  count = simplify(count);
  auto to_float = [&](const Expr& e, const char* fn) {
    // sqrt/log of an integer accumulator is computed in f64 and converted back.
    if (is_float) return call(fn, dt, {e});
    return cast(dt, call(fn, DType::kFloat64, {cast(DType::kFloat64, e)}));
  };

  using tir::Combiner;
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kSumSquare:
    case ReduceKind::kL1:
    case ReduceKind::kL2:
    case ReduceKind::kLogSum:
    case ReduceKind::kMean: {
      auto body = [&](const std::vector<Expr>& idx) -> Expr {
        Expr x = x_at(idx);
        if (kind == ReduceKind::kSumSquare || kind == ReduceKind::kL2) return mul(x, x);
        if (kind == ReduceKind::kL1) {
          if (is_float) return call("abs", dt, {x});
          if (!dtype_is_signed(dt)) return x;
          return select(lt(x, const_of(dt, 0)), sub(const_of(dt, 0), x), x);
        }
        return x;
      };
      std::function<Expr(const Expr&, const std::vector<Expr>&)> fin;
      if (kind == ReduceKind::kL2) fin = [&](const Expr& acc, const std::vector<Expr>&) { return to_float(acc, "sqrt"); };
      if (kind == ReduceKind::kLogSum) fin = [&](const Expr& acc, const std::vector<Expr>&) { return to_float(acc, "log"); };
      if (kind == ReduceKind::kMean) {
        fin = [&](const Expr& acc, const std::vector<Expr>&) -> Expr {
          if (is_float) return div(acc, cast(dt, count));
          // Integer mean truncates toward zero (as C division).
          Expr c = cast_if_needed(dt, count);
          Expr zero = const_of(dt, 0);
          return select(lt(acc, zero), sub(zero, floordiv(sub(zero, acc), c)), floordiv(acc, c));
        };
      }
      stages.push_back(reduce_over_dims(ctx, out.name, dt, in.shape, ax.reduced, keep, Combiner::kSum,
                                        const_of(dt, 0), body, fin));
      return stages;
    }
    case ReduceKind::kProd:
      stages.push_back(reduce_over_dims(ctx, out.name, dt, in.shape, ax.reduced, keep, Combiner::kProd,
                                        const_of(dt, 1), x_at));
      return stages;
    case ReduceKind::kMax:
      stages.push_back(reduce_over_dims(ctx, out.name, dt, in.shape, ax.reduced, keep, Combiner::kMax,
                                        lowest_of(dt), x_at));
      return stages;
    case ReduceKind::kMin:
      stages.push_back(reduce_over_dims(ctx, out.name, dt, in.shape, ax.reduced, keep, Combiner::kMin,
                                        highest_of(dt), x_at));
      return stages;
    case ReduceKind::kLogSumExp: {
      if (!is_float) return node_unsupported(n) << "ReduceLogSumExp of " << dtype_name(dt);
      tir::ComputeDef m = reduce_over_dims(ctx, ctx.fresh(out.name + "_max"), dt, in.shape, ax.reduced, keep,
                                           Combiner::kMax, lowest_of(dt), x_at);
      auto body = [&](const std::vector<Expr>& idx) {
        Expr mx = stage_load(m, reduced_index(idx, ax.reduced, keep));
        // An all -inf slice has max -inf: subtract 0 instead to keep exp(-inf) = 0.
        Expr safe = select(call("isinf", DType::kBool, {mx}), const_of(dt, 0), mx);
        return call("exp", dt, {sub(x_at(idx), safe)});
      };
      auto fin = [&](const Expr& acc, const std::vector<Expr>& out_idx) {
        Expr mx = stage_load(m, out_idx);
        Expr safe = select(call("isinf", DType::kBool, {mx}), const_of(dt, 0), mx);
        return add(call("log", dt, {acc}), safe);
      };
      stages.push_back(m);
      stages.push_back(reduce_over_dims(ctx, out.name, dt, in.shape, ax.reduced, keep, Combiner::kSum,
                                        const_of(dt, 0), body, fin));
      return stages;
    }
  }
  return internal_error() << n.describe() << ": unknown reduction";
}

// The runtime kernel, used when the axes are an input known only at run time:
// accumulates in double over the reduced positions of every output element.
Result<RuntimeKernel> reduce_kernel(ReduceKind kind, const Node& n) {
  bool keep = n.attr_int("keepdims", 1) != 0;
  bool noop_empty = n.attr_int("noop_with_empty_axes", 0) != 0;
  std::string where = n.describe();
  return RuntimeKernel([kind, keep, noop_empty, where](const std::vector<Tensor>& in,
                                                        std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    int64_t rank = x.rank();
    std::vector<bool> reduced(static_cast<size_t>(rank), false);
    bool have_axes = in.size() > 1 && in[1].defined() && in[1].numel() > 0;
    if (!have_axes) {
      if (noop_empty) {
        out.resize(1);
        out[0] = x.clone();
        return Status::ok();
      }
      reduced.assign(static_cast<size_t>(rank), true);
    } else {
      for (int64_t i = 0; i < in[1].numel(); ++i) {
        int64_t a = in[1].get_i64(i);
        if (a < -rank || a >= rank) return invalid_argument() << where << ": axis " << a << " out of range for rank " << rank;
        reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
      }
    }
    std::vector<int64_t> out_shape, kept_shape;
    for (int64_t d = 0; d < rank; ++d) {
      bool r = reduced[static_cast<size_t>(d)];
      kept_shape.push_back(r ? 1 : x.shape()[d]);
      if (!r || keep) out_shape.push_back(r ? 1 : x.shape()[d]);
    }
    KILN_ASSIGN_OR_RETURN(Tensor y, Tensor::allocate(x.dtype(), out_shape, where));
    int64_t count = 1;
    for (int64_t d = 0; d < rank; ++d)
      if (reduced[static_cast<size_t>(d)]) count *= x.shape()[d];
    int64_t outs = y.numel();
    double init = 0;
    if (kind == ReduceKind::kMax) init = -INFINITY;
    if (kind == ReduceKind::kMin) init = INFINITY;
    if (kind == ReduceKind::kProd) init = 1;
    std::vector<double> acc(static_cast<size_t>(outs), init), peak(static_cast<size_t>(outs), -INFINITY);
    // Output position of every input element (row-major over kept_shape).
    auto out_index = [&](int64_t flat) {
      int64_t o = 0;
      for (int64_t d = 0; d < rank; ++d) {
        int64_t stride = 1;
        for (int64_t e = d + 1; e < rank; ++e) stride *= x.shape()[e];
        int64_t i = (flat / stride) % x.shape()[d];
        o = o * kept_shape[d] + (reduced[static_cast<size_t>(d)] ? 0 : i);
      }
      return o;
    };
    std::vector<int64_t> target(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) target[i] = out_index(i);
    if (kind == ReduceKind::kLogSumExp)
      for (int64_t i = 0; i < x.numel(); ++i) peak[target[i]] = std::max(peak[target[i]], x.get_f64(i));
    for (int64_t i = 0; i < x.numel(); ++i) {
      double v = x.get_f64(i);
      double& a = acc[target[i]];
      switch (kind) {
        case ReduceKind::kSum: case ReduceKind::kMean: case ReduceKind::kLogSum: a += v; break;
        case ReduceKind::kMax: a = (std::isnan(v) || v > a) ? v : a; break;
        case ReduceKind::kMin: a = (std::isnan(v) || v < a) ? v : a; break;
        case ReduceKind::kProd: a *= v; break;
        case ReduceKind::kL1: a += std::fabs(v); break;
        case ReduceKind::kL2: case ReduceKind::kSumSquare: a += v * v; break;
        case ReduceKind::kLogSumExp: a += std::exp(v - peak[target[i]]); break;
      }
    }
    for (int64_t o = 0; o < outs; ++o) {
      double a = acc[o];
      switch (kind) {
        case ReduceKind::kMean: a = count > 0 ? a / static_cast<double>(count) : NAN; break;
        case ReduceKind::kL2: a = std::sqrt(a); break;
        case ReduceKind::kLogSum: a = std::log(a); break;
        case ReduceKind::kLogSumExp: a = a == 0 ? -INFINITY : std::log(a) + peak[o]; break;
        default: break;
      }
      y.set_f64(o, dtype_is_float(y.dtype()) ? a : std::trunc(a));
    }
    out.resize(1);
    out[0] = std::move(y);
    return Status::ok();
  });
}

// ReduceSum / ReduceMean: dy given the reduced axes back (unless kept) and
// expanded to x's shape; the mean's divided by the count reduced.
Status grad_reduce(GradBuilder& b, bool mean) {
  const Node& n = b.node();
  Value* x = n.input(0);
  if (!b.wants(0)) return Status::ok();
  if (!x->type().has_shape()) return node_unsupported(n) << "the gradient of a reduction of unknown rank";
  const Shape& xs = *x->type().shape;
  KILN_ASSIGN_OR_RETURN(ReduceAxes ax, reduce_axes(n, static_cast<int64_t>(xs.size())));
  Value* g = b.output_grad(0);
  if (ax.noop) return b.set_input_grad(0, g);
  std::vector<int64_t> axes;
  int64_t count = 1;
  bool static_count = true;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (!ax.reduced[d]) continue;
    axes.push_back(static_cast<int64_t>(d));
    auto c = xs[d].as_const();
    static_count &= c.has_value();
    if (c) count *= *c;
  }
  if (n.attr_int("keepdims", 1) == 0 && !axes.empty()) {
    KILN_ASSIGN_OR_RETURN(g, b.unsqueeze(g, axes));
  }
  Value* shape = nullptr;
  if (x->type().is_static()) {
    shape = b.ints(x->type().static_shape());
  } else {
    KILN_ASSIGN_OR_RETURN(shape, b.add1("Shape", {x}));
  }
  KILN_ASSIGN_OR_RETURN(g, b.add1("Expand", {g, shape}));
  if (mean && static_count) {
    KILN_ASSIGN_OR_RETURN(g, b.add1("Mul", {g, b.scalar(1.0 / static_cast<double>(count), g)}));
  } else if (mean) {
    KILN_ASSIGN_OR_RETURN(Value* dims, b.add1("Gather", {shape, b.ints(axes)}));
    KILN_ASSIGN_OR_RETURN(Value* total, b.add1("ReduceProd", {dims}, {{"keepdims", Attribute::of_int(0)}}));
    KILN_ASSIGN_OR_RETURN(Value* cnt, b.add1("Cast", {total}, {{"to", Attribute::of_int(static_cast<int64_t>(g->dtype()))}}));
    KILN_ASSIGN_OR_RETURN(g, b.add1("Div", {g, cnt}));
  }
  return b.set_input_grad(0, g);
}

void register_reduce(const char* name, ReduceKind kind) {
  OpDef def;
  def.name = name;
  def.infer = [kind](Node& n, InferContext& ctx) { return infer_reduce(kind, n, ctx); };
  def.lower = [kind](const Node& n, LowerContext& ctx) { return lower_reduce(kind, n, ctx); };
  def.kernel = [kind](const Node& n) { return reduce_kernel(kind, n); };
  if (kind == ReduceKind::kSum || kind == ReduceKind::kMean)
    def.gradient = [kind](GradBuilder& b) { return grad_reduce(b, kind == ReduceKind::kMean); };
  register_op(std::move(def));
}

// ---- ArgMax / ArgMin -------------------------------------------------------------

Status infer_arg(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!t.has_shape()) {
    set_output_unknown_rank(n, 0, DType::kInt64);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), t.rank()));
  std::vector<bool> reduced(static_cast<size_t>(t.rank()), false);
  reduced[static_cast<size_t>(axis)] = true;
  set_output(n, 0, DType::kInt64, reduced_shape(*t.shape, reduced, n.attr_int("keepdims", 1) != 0), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_arg(bool is_max, const Node& n, LowerContext& ctx) {
  const tir::Buffer& in = ctx.inputs[0];
  const tir::Buffer& out = ctx.outputs[0];
  DType dt = in.dtype;
  if (!dtype_is_compilable(dt) || dt == DType::kBool) return node_unsupported(n) << "dtype " << dtype_name(dt);
  int64_t rank = static_cast<int64_t>(in.shape.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), rank));
  bool keep = n.attr_int("keepdims", 1) != 0;
  bool last = n.attr_int("select_last_index", 0) != 0;
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  reduced[static_cast<size_t>(axis)] = true;
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };

  tir::ComputeDef m =
      reduce_over_dims(ctx, ctx.fresh(out.name + (is_max ? "_max" : "_min")), dt, in.shape, reduced, keep,
                       is_max ? tir::Combiner::kMax : tir::Combiner::kMin, is_max ? lowest_of(dt) : highest_of(dt),
                       x_at);
  Expr extent = in.shape[static_cast<size_t>(axis)];
  auto body = [&](const std::vector<Expr>& idx) {
    Expr hit = eq(x_at(idx), stage_load(m, reduced_index(idx, reduced, keep)));
    Expr k = idx[static_cast<size_t>(axis)];
    return select(hit, k, last ? Expr(-1) : extent);
  };
  std::vector<tir::ComputeDef> stages{m};
  stages.push_back(reduce_over_dims(ctx, out.name, DType::kInt64, in.shape, reduced, keep,
                                    last ? tir::Combiner::kMax : tir::Combiner::kMin,
                                    last ? Expr(-1) : highest_of(DType::kInt64), body));
  return stages;
}

void register_arg(const char* name, bool is_max) {
  OpDef def;
  def.name = name;
  def.infer = infer_arg;
  def.lower = [is_max](const Node& n, LowerContext& ctx) { return lower_arg(is_max, n, ctx); };
  register_op(std::move(def));
}

}  // namespace

void register_reduce_ops() {
  register_reduce("ReduceSum", ReduceKind::kSum);
  register_reduce("ReduceMean", ReduceKind::kMean);
  register_reduce("ReduceMax", ReduceKind::kMax);
  register_reduce("ReduceMin", ReduceKind::kMin);
  register_reduce("ReduceProd", ReduceKind::kProd);
  register_reduce("ReduceL1", ReduceKind::kL1);
  register_reduce("ReduceL2", ReduceKind::kL2);
  register_reduce("ReduceLogSumExp", ReduceKind::kLogSumExp);
  register_reduce("ReduceSumSquare", ReduceKind::kSumSquare);
  register_reduce("ReduceLogSum", ReduceKind::kLogSum);
  register_arg("ArgMax", true);
  register_arg("ArgMin", false);
}

}  // namespace kiln::ops
