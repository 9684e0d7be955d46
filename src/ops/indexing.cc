// Indexing ops. Compiled: Gather, GatherElements, GatherND, Trilu, CumSum,
// OneHot, Resize (nearest and linear). Runtime kernels (data-dependent
// output shapes or scattered writes): ScatterND, ScatterElements, NonZero, TopK.
//
// Indices read from a tensor are wrapped when negative (i + dim). Gather,
// GatherElements and GatherND declare index checks (OpDef::index_checks): the
// VM rejects an index outside [-dim, dim) with an error naming the node, as
// ONNX Runtime does. The kernels still clamp the wrapped index into the dim,
// so that no load can leave the buffer even if a check were missing.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {


// An index value loaded from an indices tensor, wrapped and clamped into [0, dim).
Expr wrap_index(const Expr& loaded, const Expr& dim) {
  Expr i = cast_if_needed(DType::kInt64, loaded);
  return clamp_index(select(lt(i, Expr(0)), i + dim, i), dim);
}

// ---- Gather --------------------------------------------------------------------------

Status infer_gather(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType dt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape d, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape q, input_shape(n, 1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(d.size())));
  if (d.empty()) return node_invalid(n) << "data must have rank >= 1";
  KILN_ASSIGN_OR_RETURN(TensorType it, input_type(n, 1));
  if (it.dtype != DType::kInt64 && it.dtype != DType::kInt32)
    return node_invalid(n) << "indices must be int32 or int64, not " << dtype_name(it.dtype);
  Shape out(d.begin(), d.begin() + axis);
  out.insert(out.end(), q.begin(), q.end());
  out.insert(out.end(), d.begin() + axis + 1, d.end());
  set_output(n, 0, dt.dtype, std::move(out), ctx);
  // Shape arithmetic: gathering constant positions of a known vector.
  auto data = n.input(0)->sym_value();
  auto idx = const_ints(n, 1);
  if (data && d.size() == 1 && idx && q.size() <= 1) {
    int64_t len = static_cast<int64_t>(data->size());
    std::vector<Expr> vals;
    for (int64_t i : *idx) {
      if (i < -len || i >= len) return node_invalid(n) << "index " << i << " out of range for " << len;
      vals.push_back((*data)[i < 0 ? i + len : i]);
    }
    n.output(0)->set_sym_value(std::move(vals));
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_gather(const Node& n, LowerContext& ctx) {
  const tir::Buffer& data = ctx.inputs[0];
  const tir::Buffer& ind = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(data.shape.size());
  size_t q = ind.shape.size();
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> ind_idx(iv.begin() + axis, iv.begin() + axis + q);
  std::vector<Expr> idx(iv.begin(), iv.begin() + axis);
  idx.push_back(wrap_index(ctx.load_input(1, ind_idx), data.shape[axis]));
  idx.insert(idx.end(), iv.begin() + axis + q, iv.end());
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
  return stages;
}

Status infer_gather_elements(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType dt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape d, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape q, input_shape(n, 1));
  if (d.size() != q.size()) return node_invalid(n) << "data and indices differ in rank";
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(d.size())));
  KILN_ASSIGN_OR_RETURN(TensorType it, input_type(n, 1));
  if (it.dtype != DType::kInt64 && it.dtype != DType::kInt32)
    return node_invalid(n) << "indices must be int32 or int64, not " << dtype_name(it.dtype);
  // Off the axis, indices positions address data directly: they must fit
  // (symbolic dims that cannot be compared here are clamped by the lowering).
  for (size_t k = 0; k < d.size(); ++k) {
    if (static_cast<int64_t>(k) == axis) continue;
    auto dk = simplify(d[k], ctx.bounds).as_const(), qk = simplify(q[k], ctx.bounds).as_const();
    if (dk && qk && *qk > *dk)
      return node_invalid(n) << "indices dim " << k << " (" << *qk << ") exceeds data dim (" << *dk << ")";
  }
  set_output(n, 0, dt.dtype, q, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_gather_elements(const Node& n, LowerContext& ctx) {
  const tir::Buffer& data = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(data.shape.size());
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> idx = iv;
  idx[axis] = wrap_index(ctx.load_input(1, iv), data.shape[axis]);
  // Off the axis an indices dim that is not provably within the data dim (a
  // symbolic one) is clamped, so no load leaves the buffer.
  for (size_t k = 0; k < idx.size(); ++k) {
    if (static_cast<int64_t>(k) == axis) continue;
    Interval slack = bound_of(simplify(data.shape[k] - y.shape[k], ctx.bounds), ctx.bounds);
    if (!slack.lo || *slack.lo < 0) idx[k] = clamp_index(iv[k], data.shape[k]);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
  return stages;
}

Status infer_gather_nd(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType dt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape d, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape q, input_shape(n, 1));
  int64_t b = n.attr_int("batch_dims", 0);
  if (q.empty()) return node_invalid(n) << "indices must have rank >= 1";
  auto m = simplify(q.back(), ctx.bounds).as_const();
  if (!m) return node_unsupported(n) << "the last dim of indices must be a constant";
  if (b < 0 || b + *m > static_cast<int64_t>(d.size()) || b >= static_cast<int64_t>(q.size())) {
    return node_invalid(n) << "batch_dims " << b << " and index depth " << *m << " do not fit the data rank";
  }
  Shape out(q.begin(), q.end() - 1);
  out.insert(out.end(), d.begin() + b + *m, d.end());
  set_output(n, 0, dt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_gather_nd(const Node& n, LowerContext& ctx) {
  const tir::Buffer& data = ctx.inputs[0];
  const tir::Buffer& ind = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  int64_t b = n.attr_int("batch_dims", 0);
  auto mc = simplify(ind.shape.back()).as_const();
  if (!mc) return node_unsupported(n) << "the last dim of indices must be a constant";
  int64_t m = *mc;
  size_t lead = ind.shape.size() - 1;
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> idx(iv.begin(), iv.begin() + b);
  for (int64_t j = 0; j < m; ++j) {
    std::vector<Expr> ii(iv.begin(), iv.begin() + lead);
    ii.push_back(Expr(j));
    idx.push_back(wrap_index(ctx.load_input(1, ii), data.shape[b + j]));
  }
  idx.insert(idx.end(), iv.begin() + lead, iv.end());
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
  return stages;
}

// Index checks: Gather and GatherElements index the data's `axis`; GatherND's
// index tuples address dims batch_dims .. batch_dims + m - 1.
Result<std::vector<IndexCheck>> gather_index_checks(const Node& n) {
  KILN_ASSIGN_OR_RETURN(Shape d, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(d.size())));
  return std::vector<IndexCheck>{IndexCheck{1, {d[axis]}}};
}

Result<std::vector<IndexCheck>> gather_nd_index_checks(const Node& n) {
  KILN_ASSIGN_OR_RETURN(Shape d, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape q, input_shape(n, 1));
  int64_t b = n.attr_int("batch_dims", 0);
  auto m = q.empty() ? std::nullopt : simplify(q.back()).as_const();
  if (!m || b < 0 || b + *m > static_cast<int64_t>(d.size()))
    return node_invalid(n) << "indices do not fit the data rank";
  return std::vector<IndexCheck>{IndexCheck{1, Shape(d.begin() + b, d.begin() + b + *m)}};
}

// ---- Trilu, CumSum, OneHot -----------------------------------------------------------------

Status infer_same_as_input(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  set_output(n, 0, t.dtype, std::move(s), ctx);
  return Status::ok();
}

Status infer_trilu(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() < 2) return node_invalid(n) << "input must have rank >= 2";
  return infer_same_as_input(n, ctx);
}

Result<std::vector<tir::ComputeDef>> lower_trilu(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  size_t r = y.shape.size();
  std::vector<std::string> axes = fresh_axes(ctx, r, "i");
  std::vector<Expr> iv = axis_vars(axes);
  Expr k = Expr(0);
  if (has_input(n, 1)) {
    if (ctx.constants.size() > 1 && ctx.constants[1] != nullptr) {
      k = Expr(ctx.constants[1]->get_i64(0));
    } else {
      k = cast_if_needed(DType::kInt64, ctx.load_input(1, {}));
    }
  }
  Expr diff = iv[r - 1] - iv[r - 2];  // column - row
  Expr keep = n.attr_int("upper", 1) != 0 ? le(k, diff) : le(diff, k);
  std::vector<tir::ComputeDef> stages;
  stages.push_back(
      make_stage(y.name, y.dtype, axes, y.shape, select(keep, ctx.load_input(0, iv), const_of(y.dtype, 0))));
  return stages;
}

Status infer_cumsum(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  // An axis known only at run time leaves the shape unchanged; the node then
  // runs as the runtime kernel.
  auto axis = const_ints(n, 1);
  if (axis && axis->size() != 1) return node_invalid(n) << "axis must hold one value, not " << axis->size();
  if (axis) KILN_RETURN_IF_ERROR(normalize_axis(n, (*axis)[0], static_cast<int64_t>(s.size())).status());
  return infer_same_as_input(n, ctx);
}

// out[.., i, ..] = sum over r of x[.., r, ..] masked to r <= i (< i when
// exclusive; >= / > when reverse). Quadratic in the axis length.
Result<std::vector<tir::ComputeDef>> lower_cumsum(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  if (ctx.constants.size() < 2 || ctx.constants[1] == nullptr) {
    return node_unsupported(n) << "axis must be a constant scalar";
  }
  int64_t rank = static_cast<int64_t>(y.shape.size());
  if (ctx.constants[1]->numel() != 1) return node_invalid(n) << "axis must hold one value";
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, ctx.constants[1]->get_i64(0), rank));
  bool exclusive = n.attr_int("exclusive", 0) != 0, reverse = n.attr_int("reverse", 0) != 0;
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::string r = ctx.fresh("k");
  Expr rv = var(r);
  std::vector<Expr> idx = iv;
  idx[axis] = rv;
  Expr i = iv[axis];
  Expr cond = reverse ? (exclusive ? lt(i, rv) : le(i, rv)) : (exclusive ? lt(rv, i) : le(rv, i));
  Expr body = select(cond, ctx.load_input(0, idx), const_of(y.dtype, 0));
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_reduce_stage(y.name, y.dtype, axes, y.shape, {r}, {y.shape[axis]}, tir::Combiner::kSum,
                                     const_of(y.dtype, 0), body));
  return stages;
}

Status infer_one_hot(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape q, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType vt, input_type(n, 2));
  int64_t rank = static_cast<int64_t>(q.size()) + 1;
  int64_t axis = n.attr_int("axis", -1);
  if (axis < -rank || axis >= rank) return node_invalid(n) << "axis " << axis << " out of range";
  if (axis < 0) axis += rank;
  Expr depth;
  if (auto c = const_scalar(n, 1)) {
    depth = Expr(static_cast<int64_t>(*c));
  } else if (auto v = sym_values(n, 1); v && v->size() == 1) {
    depth = (*v)[0];
  } else {
    depth = ctx.fresh_symbol();  // known at run time: the runtime kernel
  }
  Shape out = q;
  out.insert(out.begin() + axis, depth);
  set_output(n, 0, vt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_one_hot(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& y = ctx.outputs[0];
  int64_t rank = static_cast<int64_t>(y.shape.size());
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> ind_idx = iv;
  ind_idx.erase(ind_idx.begin() + axis);
  Expr depth = y.shape[axis];
  Expr i = cast_if_needed(DType::kInt64, ctx.load_input(0, ind_idx));
  Expr wrapped = select(lt(i, Expr(0)), i + depth, i);
  Expr body = select(eq(wrapped, iv[axis]), ctx.load_input(2, {Expr(1)}), ctx.load_input(2, {Expr(0)}));
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, body));
  return stages;
}

// ---- Resize ------------------------------------------------------------------------------

// Inputs: X, roi, scales, sizes (opset 11+); X, scales (opset 10).
struct ResizeParams {
  std::string mode, coord, nearest;
  std::vector<Expr> out;      // output dims
  std::vector<double> scale;  // per dim; 0 when taken from sizes (out / in at run time)
};

Result<ResizeParams> resize_params(const Node& n, const Shape& x, const SymbolBounds& bounds) {
  ResizeParams p;
  p.mode = n.attr_string("mode", "nearest");
  p.coord = n.attr_string("coordinate_transformation_mode", "half_pixel");
  p.nearest = n.attr_string("nearest_mode", "round_prefer_floor");
  if (p.mode != "nearest" && p.mode != "linear" && p.mode != "cubic")
    return node_unsupported(n) << "mode '" << p.mode << "'";
  if (p.coord != "half_pixel" && p.coord != "asymmetric" && p.coord != "align_corners" &&
      p.coord != "pytorch_half_pixel" && p.coord != "half_pixel_symmetric") {
    return node_unsupported(n) << "coordinate_transformation_mode '" << p.coord << "'";
  }
  if (n.has_attr("axes")) return node_unsupported(n) << "the axes attribute";
  if (n.attr_int("antialias", 0) != 0 && p.mode != "nearest") return node_unsupported(n) << "antialias";
  if (n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") {
    return node_unsupported(n) << "keep_aspect_ratio_policy other than stretch";
  }
  size_t scales_in = n.num_inputs() == 2 ? 1 : 2;
  std::optional<std::vector<Expr>> sizes = has_input(n, 3) ? sym_values(n, 3) : std::nullopt;
  if (has_input(n, 3) && !sizes) return node_unsupported(n) << "sizes are not known at compile time";
  if (sizes) {
    if (sizes->size() != x.size()) return node_invalid(n) << "sizes has the wrong length";
    p.out = *sizes;
    p.scale.assign(x.size(), 0.0);
    for (size_t k = 0; k < x.size(); ++k) {
      if (prove_equal(x[k], p.out[k], bounds)) p.scale[k] = 1.0;
    }
    return p;
  }
  if (!has_input(n, scales_in) || !n.input(scales_in)->is_constant()) {
    return node_unsupported(n) << "scales are not known at compile time";
  }
  const Tensor& s = n.input(scales_in)->constant();
  if (s.numel() != static_cast<int64_t>(x.size())) return node_invalid(n) << "scales has the wrong length";
  for (size_t k = 0; k < x.size(); ++k) {
    double sc = s.get_f64(static_cast<int64_t>(k));
    if (sc <= 0) return node_invalid(n) << "scale " << sc << " must be positive";
    p.scale.push_back(sc);
    auto c = simplify(x[k], bounds).as_const();
    if (sc == 1.0) {
      p.out.push_back(x[k]);
    } else if (c) {
      p.out.push_back(Expr(static_cast<int64_t>(std::floor(static_cast<double>(*c) * sc))));
    } else if (sc == std::floor(sc)) {
      p.out.push_back(x[k] * static_cast<int64_t>(sc));
    } else {
      return node_unsupported(n) << "a non-integer scale on the symbolic dim " << print_expr(x[k]);
    }
  }
  return p;
}

// Resize with scales or sizes known only at run time, the axes attribute,
// keep_aspect_ratio_policy or tf_crop_and_resize (whose roi is read at run
// time), and antialiased linear or cubic downsampling: modes nearest, linear
// and cubic.
Status check_resize_kernel_support(const Node& n) {
  std::string mode = n.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic") return node_unsupported(n) << "mode '" << mode << "'";
  if (n.attr_string("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" && !has_input(n, 1))
    return node_invalid(n) << "coordinate_transformation_mode 'tf_crop_and_resize' without a roi input";
  return Status::ok();
}

Status infer_resize(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  auto params = resize_params(n, x, ctx.bounds);
  if (!params.is_ok() && params.status().code() == StatusCode::kUnsupported && check_resize_kernel_support(n).is_ok()) {
    // Not compilable as given (run-time scales or sizes, axes, aspect-ratio
    // policies): data-dependent dims, computed by the runtime kernel.
    Shape out;
    for (size_t k = 0; k < x.size(); ++k) out.push_back(ctx.fresh_symbol());
    set_output(n, 0, xt.dtype, std::move(out), ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(ResizeParams p, std::move(params));
  set_output(n, 0, xt.dtype, p.out, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_resize(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType dt = y.dtype;
  if (!dtype_is_float(dt)) return node_unsupported(n) << "needs a floating-point input";
  Shape xs(x.shape.begin(), x.shape.end());
  KILN_ASSIGN_OR_RETURN(ResizeParams p, resize_params(n, xs, {}));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  const DType ft = DType::kFloat32;  // coordinate arithmetic
  auto f = [&](const Expr& e) { return cast(ft, e); };
  auto fc = [&](double v) { return float_imm(v, ft); };

  // Per resized dim: the source coordinate of output index iv[k].
  std::vector<size_t> resized;
  std::vector<Expr> coord(iv.size());
  for (size_t k = 0; k < iv.size(); ++k) {
    if (p.scale[k] == 1.0) continue;
    resized.push_back(k);
    Expr in = f(x.shape[k]), out = f(y.shape[k]);
    Expr scale = p.scale[k] != 0.0 ? fc(p.scale[k]) : div(out, in);
    Expr o = f(iv[k]);
    Expr width = scale * in;  // the spec's output width (fractional for uneven scales)
    Expr c;
    if (p.coord == "asymmetric") {
      c = div(o, scale);
    } else if (p.coord == "align_corners") {
      c = select(eq(width, fc(1)), fc(0), div(o * (in - fc(1)), width - fc(1)));
    } else if (p.coord == "pytorch_half_pixel") {
      c = select(eq(width, fc(1)), fc(-0.5), div(o + fc(0.5), scale) - fc(0.5));
    } else if (p.coord == "half_pixel_symmetric") {
      Expr adj = div(out, scale * in);
      Expr center = div(in, fc(2));
      Expr offset = center * (fc(1) - adj);
      c = offset + div(o + fc(0.5), scale) - fc(0.5);
    } else {
      c = div(o + fc(0.5), scale) - fc(0.5);
    }
    coord[k] = c;
  }
  auto to_index = [&](const Expr& e, size_t k) { return clamp_index(cast(DType::kInt64, e), x.shape[k]); };

  Expr body;
  if (p.mode == "nearest") {
    std::vector<Expr> idx = iv;
    for (size_t k : resized) {
      Expr c = coord[k];
      Expr r;
      if (p.nearest == "floor") {
        r = call("floor", ft, {c});
      } else if (p.nearest == "ceil") {
        r = call("ceil", ft, {c});
      } else if (p.nearest == "round_prefer_ceil") {
        r = call("floor", ft, {c + fc(0.5)});
      } else {
        r = call("ceil", ft, {c - fc(0.5)});
      }
      idx[k] = to_index(r, k);
    }
    body = ctx.load_input(0, idx);
  } else if (p.mode == "cubic") {
    // Bicubic (Keys) over every resized dim: 4^k taps at floor(c) - 1 .. floor(c) + 2
    // from the unclamped coordinate. Taps outside the input read the edge, or,
    // with exclude_outside, get weight 0 and the others are renormalized.
    double a = n.attr_float("cubic_coeff_a", -0.75);
    bool exclude = n.attr_int("exclude_outside", 0) != 0;
    std::vector<std::array<Expr, 4>> tap_idx(iv.size()), tap_w(iv.size());
    for (size_t k : resized) {
      Expr c0 = call("floor", ft, {coord[k]});
      Expr t = coord[k] - c0;
      Expr base = cast(DType::kInt64, c0) - 1;
      auto w_far = [&](const Expr& d) {  // |d| in [1, 2)
        return ((fc(a) * d - fc(5 * a)) * d + fc(8 * a)) * d - fc(4 * a);
      };
      auto w_near = [&](const Expr& d) {  // |d| in [0, 1)
        return ((fc(a + 2) * d - fc(a + 3)) * d) * d + fc(1);
      };
      std::array<Expr, 4> w = {w_far(t + fc(1)), w_near(t), w_near(fc(1) - t), w_far(fc(2) - t)};
      Expr total;
      for (int j = 0; j < 4; ++j) {
        Expr pos = base + j;
        tap_idx[k][j] = clamp_index(pos, x.shape[k]);
        if (exclude) {
          Expr inside = logical_and(le(Expr(0), pos), lt(pos, x.shape[k]));
          w[j] = select(inside, w[j], fc(0));
        }
        total = total.defined() ? total + w[j] : w[j];
      }
      for (int j = 0; j < 4; ++j) tap_w[k][j] = exclude ? div(w[j], total) : w[j];
    }
    size_t taps = 1;
    for (size_t b = 0; b < resized.size(); ++b) taps *= 4;
    for (size_t t = 0; t < taps; ++t) {
      std::vector<Expr> idx = iv;
      Expr weight;
      size_t rest = t;
      for (size_t k : resized) {
        size_t j = rest % 4;
        rest /= 4;
        idx[k] = tap_idx[k][j];
        weight = weight.defined() ? weight * tap_w[k][j] : tap_w[k][j];
      }
      Expr term = cast_if_needed(ft, ctx.load_input(0, idx));
      if (weight.defined()) term = weight * term;
      body = body.defined() ? body + term : term;
    }
    body = cast_if_needed(dt, body);
  } else {
    // Linear over every resized dim: 2^k taps, weights from the clamped coordinate.
    std::vector<Expr> lo(iv.size()), hi(iv.size()), w(iv.size());
    for (size_t k : resized) {
      Expr in_last = f(x.shape[k] - 1);
      Expr c = max(min(coord[k], in_last), fc(0));
      Expr c0 = call("floor", ft, {c});
      lo[k] = to_index(c0, k);
      hi[k] = min(lo[k] + 1, x.shape[k] - 1);
      w[k] = c - c0;
    }
    size_t taps = size_t{1} << resized.size();
    for (size_t t = 0; t < taps; ++t) {
      std::vector<Expr> idx = iv;
      Expr weight;
      for (size_t b = 0; b < resized.size(); ++b) {
        size_t k = resized[b];
        bool upper = (t >> b) & 1;
        idx[k] = upper ? hi[k] : lo[k];
        Expr wk = upper ? w[k] : fc(1) - w[k];
        weight = weight.defined() ? weight * wk : wk;
      }
      Expr term = cast_if_needed(ft, ctx.load_input(0, idx));
      if (weight.defined()) term = weight * term;
      body = body.defined() ? body + term : term;
    }
    body = cast_if_needed(dt, body);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, dt, axes, y.shape, body));
  return stages;
}

// ---- Runtime kernels -------------------------------------------------------------------

// Row-major strides of a shape, in elements.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

// Writes update element `src` of `upd` into element `dst` of `out`, combining per `reduction`.
void scatter_one(Tensor& out, int64_t dst, const Tensor& upd, int64_t src, const std::string& reduction) {
  if (reduction == "none") {
    int64_t es = dtype_size(out.dtype());
    std::memcpy(static_cast<char*>(out.data()) + dst * es, static_cast<const char*>(upd.data()) + src * es,
                static_cast<size_t>(es));
    return;
  }
  double a = out.get_f64(dst), b = upd.get_f64(src);
  double r = reduction == "add" ? a + b : reduction == "mul" ? a * b : reduction == "max" ? std::max(a, b) : std::min(a, b);
  out.set_f64(dst, r);
}

Status check_reduction(const Node& n, const std::string& reduction) {
  if (reduction != "none" && reduction != "add" && reduction != "mul" && reduction != "max" && reduction != "min") {
    return node_unsupported(n) << "reduction '" << reduction << "'";
  }
  return Status::ok();
}

Status infer_scatter(Node& n, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_reduction(n, n.attr_string("reduction", "none")));
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.dtype == DType::kString) return node_unsupported(n) << "string tensors";
  if (!t.has_shape()) {
    set_output_unknown_rank(n, 0, t.dtype);
    return Status::ok();
  }
  set_output(n, 0, t.dtype, *t.shape, ctx);
  return Status::ok();
}

Result<RuntimeKernel> scatter_elements_kernel(const Node& n) {
  int64_t axis_attr = n.attr_int("axis", 0);
  std::string reduction = n.attr_string("reduction", "none");
  KILN_RETURN_IF_ERROR(check_reduction(n, reduction));
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& data = in[0];
    const Tensor& ind = in[1];
    const Tensor& upd = in[2];
    int64_t rank = data.rank();
    int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
    if (axis < 0 || axis >= rank || ind.rank() != rank || ind.shape() != upd.shape()) {
      return invalid_argument() << who << ": bad shapes " << data.describe() << ", " << ind.describe() << ", "
                                << upd.describe();
    }
    if (upd.dtype() != data.dtype())
      return invalid_argument() << who << ": updates " << upd.describe() << " do not have the data's dtype "
                                << dtype_name(data.dtype());
    for (int64_t k = 0; k < rank; ++k)
      if (k != axis && ind.shape()[k] > data.shape()[k])
        return invalid_argument() << who << ": indices " << ind.describe() << " exceed data " << data.describe()
                                  << " on axis " << k;
    out.resize(1);
    out[0] = data.clone();
    std::vector<int64_t> ds = strides_of(data.shape());
    // The destination offset without the axis term, kept as the position
    // advances (an odometer over the indices' shape): a detector scatters
    // millions of RoI features, and a division per dim per element was most
    // of the time.
    std::vector<int64_t> pos(static_cast<size_t>(rank), 0);
    int64_t base = 0;
    const int64_t dim = data.shape()[axis], n_ind = ind.numel();
    const bool plain = reduction == "none";
    const int64_t es = dtype_size(data.dtype());
    char* dst_bytes = static_cast<char*>(out[0].data());
    const char* src_bytes = static_cast<const char*>(upd.data());
    const int64_t* i64 = ind.dtype() == DType::kInt64 ? ind.data_as<int64_t>() : nullptr;
    if (plain && axis != rank - 1 && n_ind > 0) {
      // Row by row along the last dim: a row whose indices are all equal (a
      // detector's RoI features scattered to their level's slots: an index
      // per RoI expanded over [C, H, W]) is one copy of contiguous bytes;
      // any other row goes element by element, in the same order.
      const int64_t len = ind.shape()[rank - 1];
      const int64_t rows = n_ind / len;
      std::vector<int64_t> rpos(static_cast<size_t>(rank - 1), 0);
      int64_t rbase = 0;  // the row's destination offset without the axis term
      auto index_at = [&](int64_t e) { return i64 ? i64[e] : ind.get_i64(e); };
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t e0 = r * len;
        const int64_t first = index_at(e0);
        bool same = true;
        if (i64) {
          for (int64_t j = 1; j < len; ++j) same &= i64[e0 + j] == first;
        } else {
          for (int64_t j = 1; j < len && same; ++j) same = ind.get_i64(e0 + j) == first;
        }
        for (int64_t j = 0; j < (same ? 1 : len); ++j) {
          int64_t i = same ? first : index_at(e0 + j);
          if (i < 0) i += dim;
          if (i < 0 || i >= dim) return invalid_argument() << who << ": index " << index_at(e0 + j) << " out of range";
          const int64_t dst = rbase + i * ds[axis] + j;
          std::memcpy(dst_bytes + dst * es, src_bytes + (e0 + j) * es, static_cast<size_t>(same ? len * es : es));
        }
        for (int64_t k = rank - 1; k-- > 0;) {
          if (++rpos[k] < ind.shape()[k]) {
            if (k != axis) rbase += ds[k];
            break;
          }
          if (k != axis) rbase -= (rpos[k] - 1) * ds[k];
          rpos[k] = 0;
        }
      }
      return Status::ok();
    }
    for (int64_t e = 0; e < n_ind; ++e) {
      int64_t i = i64 ? i64[e] : ind.get_i64(e);
      if (i < 0) i += dim;
      if (i < 0 || i >= dim) return invalid_argument() << who << ": index " << ind.get_i64(e) << " out of range";
      int64_t dst = base + i * ds[axis];
      if (plain) {
        switch (es) {
          case 4: std::memcpy(dst_bytes + dst * 4, src_bytes + e * 4, 4); break;
          case 8: std::memcpy(dst_bytes + dst * 8, src_bytes + e * 8, 8); break;
          default: std::memcpy(dst_bytes + dst * es, src_bytes + e * es, static_cast<size_t>(es));
        }
      } else {
        scatter_one(out[0], dst, upd, e, reduction);
      }
      for (int64_t k = rank; k-- > 0;) {
        if (++pos[k] < ind.shape()[k]) {
          if (k != axis) base += ds[k];
          break;
        }
        if (k != axis) base -= (pos[k] - 1) * ds[k];
        pos[k] = 0;
      }
    }
    return Status::ok();
  });
}

// ScatterND's reduction of `n` updates into `out`, as scatter_one does it
// element by element (op: 0 none, 1 add, 2 mul, 3 max, 4 min).
template <typename T>
void scatter_slice(T* out, const T* upd, int64_t n, int op) {
  switch (op) {
    case 0: std::memcpy(out, upd, static_cast<size_t>(n) * sizeof(T)); return;
    case 1: for (int64_t e = 0; e < n; ++e) out[e] += upd[e]; return;
    case 2: for (int64_t e = 0; e < n; ++e) out[e] *= upd[e]; return;
    case 3: for (int64_t e = 0; e < n; ++e) out[e] = std::max(out[e], upd[e]); return;
    default: for (int64_t e = 0; e < n; ++e) out[e] = std::min(out[e], upd[e]); return;
  }
}

Result<RuntimeKernel> scatter_nd_kernel(const Node& n) {
  std::string reduction = n.attr_string("reduction", "none");
  KILN_RETURN_IF_ERROR(check_reduction(n, reduction));
  const int op = reduction == "none" ? 0 : reduction == "add" ? 1 : reduction == "mul" ? 2 : reduction == "max" ? 3 : 4;
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& data = in[0];
    const Tensor& ind = in[1];
    const Tensor& upd = in[2];
    if (ind.rank() < 1) return invalid_argument() << who << ": indices must have rank >= 1";
    int64_t m = ind.shape().back();
    if (m > data.rank()) return invalid_argument() << who << ": index depth " << m << " > data rank";
    int64_t slice = 1;
    for (int64_t k = m; k < data.rank(); ++k) slice *= data.shape()[k];
    int64_t count = m == 0 ? 1 : ind.numel() / m;
    if (upd.numel() != count * slice) return invalid_argument() << who << ": updates have the wrong size";
    out.resize(1);
    // The output is passed in where the memory plan holds it
    // (kernel_fills_outputs: no fresh pages each run), else allocated.
    if (out[0].defined() && out[0].dtype() == data.dtype() && out[0].shape() == data.shape()) {
      if (out[0].data() != data.data())
        std::memcpy(out[0].data(), data.data(), static_cast<size_t>(data.numel() * dtype_size(data.dtype())));
    } else {
      out[0] = data.clone();
    }
    std::vector<int64_t> ds = strides_of(data.shape());
    const bool f32 = data.dtype() == DType::kFloat32 && upd.dtype() == DType::kFloat32;
    const bool f64 = data.dtype() == DType::kFloat64 && upd.dtype() == DType::kFloat64;
    for (int64_t u = 0; u < count; ++u) {
      int64_t base = 0;
      for (int64_t j = 0; j < m; ++j) {
        int64_t i = ind.get_i64(u * m + j);
        int64_t dim = data.shape()[j];
        if (i < 0) i += dim;
        if (i < 0 || i >= dim) return invalid_argument() << who << ": index out of range";
        base += i * ds[j];
      }
      // Float slices (an embedding's gradient rows): one typed loop per slice.
      if (f32) {
        scatter_slice(out[0].data_as<float>() + base, upd.data_as<float>() + u * slice, slice, op);
      } else if (f64) {
        scatter_slice(out[0].data_as<double>() + base, upd.data_as<double>() + u * slice, slice, op);
      } else {
        for (int64_t e = 0; e < slice; ++e) scatter_one(out[0], base + e, upd, u * slice + e, reduction);
      }
    }
    return Status::ok();
  });
}

Status infer_non_zero(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  Expr numel = simplify(Expr(1));
  for (const Expr& d : x) numel = numel * d;
  auto bound = simplify(numel, ctx.bounds).as_const();
  set_output(n, 0, DType::kInt64, {Expr(static_cast<int64_t>(x.size())), ctx.fresh_symbol(bound)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> non_zero_kernel(const Node& n) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.dtype() == DType::kString) return unsupported() << "NonZero on strings";
    std::vector<int64_t> hits;
    for (int64_t e = 0; e < x.numel(); ++e) {
      if (x.get_f64(e) != 0.0) hits.push_back(e);
    }
    int64_t rank = x.rank();
    int64_t count = static_cast<int64_t>(hits.size());
    out.resize(1);
    // A scalar is treated as a 1-element 1-D tensor (as ONNX Runtime does).
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kInt64, {std::max<int64_t>(rank, 1), count}));
    int64_t* o = out[0].data_as<int64_t>();
    for (int64_t h = 0; h < count; ++h) {
      int64_t rem = hits[h];
      if (rank == 0) o[h] = 0;
      for (int64_t k = rank; k-- > 0;) {
        o[k * count + h] = rem % x.shape()[k];
        rem /= x.shape()[k];
      }
    }
    return Status::ok();
  });
}

Status infer_top_k(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", -1), static_cast<int64_t>(x.size())));
  Expr k;
  if (has_input(n, 1)) {
    auto v = sym_values(n, 1);
    if (v && v->size() == 1) k = (*v)[0];
  } else if (n.has_attr("k")) {  // TopK-1
    k = Expr(n.attr_int("k", 1));
  }
  if (!k.defined()) {
    auto bound = simplify(x[axis], ctx.bounds).as_const();
    k = ctx.fresh_symbol(bound);
  }
  Shape out = x;
  out[axis] = k;
  set_output(n, 0, xt.dtype, out, ctx);
  if (n.num_outputs() > 1) set_output(n, 1, DType::kInt64, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> top_k_kernel(const Node& n) {
  int64_t axis_attr = n.attr_int("axis", -1);
  bool largest = n.attr_int("largest", 1) != 0;
  bool has_k_input = has_input(n, 1);
  int64_t k_attr = n.attr_int("k", 1);
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    int64_t rank = x.rank();
    int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
    if (axis < 0 || axis >= rank) return invalid_argument() << who << ": axis out of range";
    int64_t k = has_k_input ? in[1].get_i64(0) : k_attr;
    int64_t dim = x.shape()[axis];
    if (k < 0 || k > dim) return invalid_argument() << who << ": k = " << k << " for a dim of " << dim;
    std::vector<int64_t> oshape = x.shape();
    oshape[axis] = k;
    out.resize(2);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    KILN_ASSIGN_OR_RETURN(out[1], Tensor::allocate(DType::kInt64, oshape));
    int64_t inner = 1, outer = 1;
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    int64_t es = dtype_size(x.dtype());
    std::vector<int64_t> order(static_cast<size_t>(dim));
    std::vector<double> vals(static_cast<size_t>(dim));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t base = o * dim * inner + i;
        for (int64_t j = 0; j < dim; ++j) vals[j] = x.get_f64(base + j * inner);
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the smaller index first (as ONNX Runtime does).
        auto before = [&](int64_t a, int64_t b) {
          if (vals[a] != vals[b]) return largest ? vals[a] > vals[b] : vals[a] < vals[b];
          return a < b;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        int64_t obase = o * k * inner + i;
        for (int64_t j = 0; j < k; ++j) {
          std::memcpy(static_cast<char*>(out[0].data()) + (obase + j * inner) * es,
                      static_cast<const char*>(x.data()) + (base + order[j] * inner) * es, static_cast<size_t>(es));
          out[1].data_as<int64_t>()[obase + j * inner] = order[j];
        }
      }
    }
    return Status::ok();
  });
}


Result<RuntimeKernel> cumsum_kernel(const Node& n) {
  bool exclusive = n.attr_int("exclusive", 0) != 0, reverse = n.attr_int("reverse", 0) != 0;
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (!dtype_is_compilable(x.dtype()) || x.dtype() == DType::kBool) {
      return unsupported() << who << ": dtype " << dtype_name(x.dtype());
    }
    int64_t rank = x.rank();
    int64_t axis = in[1].get_i64(0);
    if (axis < -rank || axis >= rank) return invalid_argument() << who << ": axis " << axis << " out of range";
    if (axis < 0) axis += rank;
    int64_t dim = x.shape()[axis], inner = 1, outer = 1;
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), x.shape()));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double acc = 0;
        for (int64_t step = 0; step < dim; ++step) {
          int64_t j = reverse ? dim - 1 - step : step;
          int64_t e = (o * dim + j) * inner + i;
          double v = x.get_f64(e);
          if (!exclusive) acc += v;
          out[0].set_f64(e, acc);
          if (exclusive) acc += v;
        }
      }
    }
    return Status::ok();
  });
}

Result<RuntimeKernel> one_hot_kernel(const Node& n) {
  int64_t axis_attr = n.attr_int("axis", -1);
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& ind = in[0];
    const Tensor& values = in[2];
    int64_t depth = static_cast<int64_t>(in[1].get_f64(0));
    if (depth < 0) return invalid_argument() << who << ": negative depth";
    if (values.numel() != 2 || values.dtype() == DType::kString) return invalid_argument() << who << ": bad values";
    int64_t rank = ind.rank() + 1;
    int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
    if (axis < 0 || axis >= rank) return invalid_argument() << who << ": axis out of range";
    std::vector<int64_t> shape = ind.shape();
    shape.insert(shape.begin() + axis, depth);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(values.dtype(), shape));
    int64_t inner = 1;
    for (int64_t d = axis; d < ind.rank(); ++d) inner *= ind.shape()[d];
    int64_t es = dtype_size(values.dtype());
    for (int64_t e = 0; e < out[0].numel(); ++e) {
      int64_t i = e % inner, j = (e / inner) % depth, o = e / (inner * depth);
      int64_t v = static_cast<int64_t>(ind.get_f64(o * inner + i));
      if (v < 0) v += depth;
      std::memcpy(static_cast<char*>(out[0].data()) + e * es,
                  static_cast<const char*>(values.data()) + (v == j ? 1 : 0) * es, static_cast<size_t>(es));
    }
    return Status::ok();
  });
}

Result<RuntimeKernel> resize_kernel(const Node& n) {
  KILN_RETURN_IF_ERROR(check_resize_kernel_support(n));
  std::string who = n.describe();
  std::string mode = n.attr_string("mode", "nearest");
  std::string coord = n.attr_string("coordinate_transformation_mode", "half_pixel");
  std::string nearest = n.attr_string("nearest_mode", "round_prefer_floor");
  std::string policy = n.attr_string("keep_aspect_ratio_policy", "stretch");
  std::vector<int64_t> axes_attr = n.attr_ints("axes");
  double cubic_a = n.attr_float("cubic_coeff_a", -0.75);
  bool exclude_outside = n.attr_int("exclude_outside", 0) != 0;
  double extrapolation = n.attr_float("extrapolation_value", 0.0);
  // antialias (opset 18): linear and cubic downsampling widen their filter by
  // 1 / scale (nearest ignores it).
  bool antialias = n.attr_int("antialias", 0) != 0 && mode != "nearest";
  size_t scales_in = n.num_inputs() == 2 ? 1 : 2;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (!dtype_is_compilable(x.dtype()) || x.dtype() == DType::kBool) {
      return unsupported() << who << ": dtype " << dtype_name(x.dtype());
    }
    int64_t rank = x.rank();
    std::vector<int64_t> axes = axes_attr;
    for (int64_t& a : axes) {
      if (a < -rank || a >= rank) return invalid_argument() << who << ": axis " << a << " out of range";
      if (a < 0) a += rank;
    }
    if (axes.empty()) {
      for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
    }
    std::vector<double> scale(static_cast<size_t>(rank), 1.0);
    std::vector<int64_t> shape = x.shape();
    bool has_sizes = in.size() > 3 && in[3].defined() && in[3].numel() > 0;
    if (has_sizes) {
      const Tensor& sz = in[3];
      if (sz.numel() != static_cast<int64_t>(axes.size())) return invalid_argument() << who << ": sizes length";
      if (policy == "stretch") {
        for (size_t k = 0; k < axes.size(); ++k) {
          shape[axes[k]] = sz.get_i64(static_cast<int64_t>(k));
          scale[axes[k]] = static_cast<double>(shape[axes[k]]) / static_cast<double>(x.shape()[axes[k]]);
        }
      } else {
        double s = policy == "not_larger" ? INFINITY : 0.0;
        for (size_t k = 0; k < axes.size(); ++k) {
          double r = static_cast<double>(sz.get_i64(static_cast<int64_t>(k))) / static_cast<double>(x.shape()[axes[k]]);
          s = policy == "not_larger" ? std::min(s, r) : std::max(s, r);
        }
        for (int64_t a : axes) {
          scale[a] = s;
          shape[a] = static_cast<int64_t>(std::round(s * static_cast<double>(x.shape()[a])));
        }
      }
    } else {
      if (in.size() <= scales_in || !in[scales_in].defined()) return invalid_argument() << who << ": no scales or sizes";
      const Tensor& sc = in[scales_in];
      if (sc.numel() != static_cast<int64_t>(axes.size())) return invalid_argument() << who << ": scales length";
      for (size_t k = 0; k < axes.size(); ++k) {
        scale[axes[k]] = sc.get_f64(static_cast<int64_t>(k));
        if (scale[axes[k]] <= 0) return invalid_argument() << who << ": scale must be positive";
        shape[axes[k]] = static_cast<int64_t>(std::floor(static_cast<double>(x.shape()[axes[k]]) * scale[axes[k]]));
      }
    }
    // tf_crop_and_resize: per resized dim, the crop [start, end] in
    // normalized input coordinates (roi = starts of the axes, then ends).
    const bool crop = coord == "tf_crop_and_resize";
    std::vector<double> roi_start(static_cast<size_t>(rank), 0.0), roi_end(static_cast<size_t>(rank), 1.0);
    std::vector<bool> cropped(static_cast<size_t>(rank), false);
    if (crop) {
      if (in.size() < 2 || !in[1].defined() || in[1].numel() != 2 * static_cast<int64_t>(axes.size()))
        return invalid_argument() << who << ": roi must hold " << 2 * axes.size() << " values (starts, then ends)";
      for (size_t k = 0; k < axes.size(); ++k) {
        roi_start[axes[k]] = in[1].get_f64(static_cast<int64_t>(k));
        roi_end[axes[k]] = in[1].get_f64(static_cast<int64_t>(k + axes.size()));
        cropped[axes[k]] = true;
      }
    }
    // Source coordinate of output index o along dim d.
    auto source = [&](int64_t d, int64_t o) {
      if (crop) {
        double len_in = static_cast<double>(x.shape()[d]), len_out = static_cast<double>(shape[d]);
        double a = roi_start[d], b = roi_end[d];
        return len_out > 1 ? a * (len_in - 1) + static_cast<double>(o) * (b - a) * (len_in - 1) / (len_out - 1)
                           : 0.5 * (a + b) * (len_in - 1);
      }
      // The output width as the spec uses it: scale * input width, fractional
      // when the scale does not divide evenly.
      double s = scale[d], len_in = static_cast<double>(x.shape()[d]), len_out = static_cast<double>(shape[d]);
      double width = s * len_in;
      double xo = static_cast<double>(o);
      if (coord == "asymmetric") return xo / s;
      if (coord == "align_corners") return width == 1 ? 0.0 : xo * (len_in - 1) / (width - 1);
      if (coord == "pytorch_half_pixel") return width == 1 ? -0.5 : (xo + 0.5) / s - 0.5;
      if (coord == "half_pixel_symmetric") {
        double adj = len_out / (s * len_in);
        return len_in / 2 * (1 - adj) + (xo + 0.5) / s - 0.5;
      }
      return (xo + 0.5) / s - 0.5;
    };
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    std::vector<int64_t> xs(static_cast<size_t>(rank), 1);
    for (int64_t k = rank - 1; k > 0; --k) xs[k - 1] = xs[k] * x.shape()[k];
    std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
    // Per dim: the taps (index, weight): up to four, more for an antialiased downsampling.
    std::vector<std::vector<std::pair<int64_t, double>>> taps(static_cast<size_t>(rank),
                                                              std::vector<std::pair<int64_t, double>>(4));
    std::vector<int> ntaps(static_cast<size_t>(rank), 1);
    // The taps of output index o along dim d (they depend on nothing else):
    // computed once per (d, o) into tables, not per element.
    auto fill = [&](int64_t d, int64_t o, bool& outside) -> Status {
      if (taps[d].size() < 4) taps[d].resize(4);
      int64_t len = x.shape()[d];
      if (!cropped[d] && scale[d] == 1.0 && shape[d] == len) {
        taps[d][0] = {o, 1.0};
        ntaps[d] = 1;
        return Status::ok();
      }
      double c = source(d, o);
      if (crop && (c < 0 || c > static_cast<double>(len - 1))) {
        outside = true;
        return Status::ok();
      }
      if (mode == "nearest") {
        double r = nearest == "floor" ? std::floor(c)
                   : nearest == "ceil" ? std::ceil(c)
                   : nearest == "round_prefer_ceil" ? std::floor(c + 0.5)
                                                    : std::ceil(c - 0.5);
        taps[d][0] = {std::clamp<int64_t>(static_cast<int64_t>(r), 0, len - 1), 1.0};
        ntaps[d] = 1;
      } else if (antialias && scale[d] < 1.0) {
        // The filter (triangle or Keys cubic) stretched by 1 / s over the
        // input: taps at b + i for i in [start, 1 - start], weight
        // filter(s (i - r)), normalized, where b + r = c with r in (0, 1]
        // (an integer c counts as the end of the pixel before it); taps off
        // the input read the edge or, with exclude_outside, drop out. As the
        // ONNX reference implementation computes them.
        const double s = scale[d];
        const bool cubic = mode == "cubic";
        double b = std::floor(c), r = c - b;
        if (r == 0) {
          r = 1;
          b -= 1;
        }
        int64_t start = static_cast<int64_t>(std::floor((cubic ? -2.0 : -1.0) / s)) + 1;
        int64_t count = 2 - 2 * start;
        if (count > (int64_t{1} << 20)) return unsupported() << who << ": antialias scale " << s << " too small";
        taps[d].resize(static_cast<size_t>(count));
        double total = 0;
        for (int64_t j = 0; j < count; ++j) {
          double u = std::fabs(s * (static_cast<double>(start + j) - r)), w;
          if (cubic) {
            double a = cubic_a;
            w = u <= 1 ? ((a + 2) * u - (a + 3)) * u * u + 1 : u < 2 ? ((a * u - 5 * a) * u + 8 * a) * u - 4 * a : 0;
          } else {
            w = std::max(0.0, 1 - u);
          }
          int64_t pos = static_cast<int64_t>(b) + start + j;
          if (exclude_outside && (pos < 0 || pos >= len)) w = 0;
          total += w;
          taps[d][static_cast<size_t>(j)] = {std::clamp<int64_t>(pos, 0, len - 1), w};
        }
        if (total != 0)
          for (auto& t : taps[d]) t.second /= total;
        ntaps[d] = static_cast<int>(count);
      } else if (mode == "cubic") {
        // Keys cubic convolution over floor(c) - 1 .. floor(c) + 2; outside
        // taps read the edge or, with exclude_outside, drop out (renormalized).
        double f = std::floor(c), t = c - f, a = cubic_a;
        auto far = [a](double x) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; };
        auto near = [a](double x) { return ((a + 2) * x - (a + 3)) * x * x + 1; };
        double w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
        double total = 0;
        for (int j = 0; j < 4; ++j) {
          int64_t pos = static_cast<int64_t>(f) - 1 + j;
          if (exclude_outside && (pos < 0 || pos >= len)) w[j] = 0;
          total += w[j];
          taps[d][j] = {std::clamp<int64_t>(pos, 0, len - 1), w[j]};
        }
        if (exclude_outside && total != 0)
          for (int j = 0; j < 4; ++j) taps[d][j].second /= total;
        ntaps[d] = 4;
      } else {
        c = std::clamp(c, 0.0, static_cast<double>(len - 1));
        int64_t lo = static_cast<int64_t>(std::floor(c));
        double w = c - static_cast<double>(lo);
        taps[d][0] = {lo, 1.0 - w};
        taps[d][1] = {std::min(lo + 1, len - 1), w};
        ntaps[d] = 2;
      }
          return Status::ok();
    };
    std::vector<std::vector<std::vector<std::pair<int64_t, double>>>> table(static_cast<size_t>(rank));
    std::vector<std::vector<char>> off_table(static_cast<size_t>(rank));
    for (int64_t d = 0; d < rank; ++d) {
      table[d].resize(static_cast<size_t>(shape[d]));
      off_table[d].assign(static_cast<size_t>(shape[d]), 0);
      for (int64_t o = 0; o < shape[d]; ++o) {
        bool off = false;
        KILN_RETURN_IF_ERROR(fill(d, o, off));
        off_table[d][o] = off;
        table[d][o].assign(taps[d].begin(), taps[d].begin() + (off ? 0 : ntaps[d]));
      }
    }
    const bool f32 = x.dtype() == DType::kFloat32;
    const float* xf = f32 ? x.data_as<float>() : nullptr;
    float* yf = f32 ? out[0].data_as<float>() : nullptr;
    const int64_t total_out = out[0].numel();
    // Fast path (an image resized in its last two dims, f32): the leading
    // dims copy through (one tap of weight 1 at the same index), and each
    // output is the same double sum, in the same order, as the general loop.
    bool planes = f32 && rank >= 2;
    for (int64_t d = 0; planes && d < rank - 2; ++d)
      planes = shape[d] == x.shape()[d];  // (nearest can map 3 -> 2 through identity taps)
    for (int64_t d = 0; planes && d < rank - 2; ++d)
      for (int64_t o = 0; planes && o < shape[d]; ++o)
        planes = off_table[d][o] == 0 && table[d][o].size() == 1 && table[d][o][0].first == o &&
                 table[d][o][0].second == 1.0;
    for (int64_t d = rank - 2; planes && d < rank; ++d)
      for (int64_t o = 0; planes && o < shape[d]; ++o) planes = off_table[d][o] == 0;
    if (planes) {
      const int64_t oh = shape[rank - 2], ow = shape[rank - 1];
      const int64_t ih = x.shape()[rank - 2], iw = x.shape()[rank - 1];
      const int64_t count = oh * ow == 0 ? 0 : total_out / (oh * ow);
      const auto& th = table[rank - 2];
      const auto& tw = table[rank - 1];
      for (int64_t p = 0; p < count; ++p) {
        const float* src = xf + p * ih * iw;
        float* dst = yf + p * oh * ow;
        for (int64_t r = 0; r < oh; ++r)
          for (int64_t c = 0; c < ow; ++c) {
            double acc = 0;
            for (const auto& [hi, hw] : th[r])
              for (const auto& [wi, ww] : tw[c]) acc += ww * hw * static_cast<double>(src[hi * iw + wi]);
            dst[r * ow + c] = static_cast<float>(acc);
          }
      }
      return Status::ok();
    }
    std::vector<int64_t> active;
    active.reserve(static_cast<size_t>(rank));
    for (int64_t e = 0; e < total_out; ++e) {
      if (e > 0)
        for (int64_t k = rank - 1; k >= 0; --k) {
          if (++idx[k] < shape[k]) break;
          idx[k] = 0;
        }
      bool outside = false;
      for (int64_t d = 0; d < rank && !outside; ++d) {
        outside = off_table[d][idx[d]] != 0;
        ntaps[d] = static_cast<int>(table[d][idx[d]].size());
      }
      if (outside) {
        out[0].set_f64(e, extrapolation);
        continue;
      }
      // Dims with one tap contribute a fixed offset and weight; the taps of
      // the others (the resized dims, usually two) are combined.
      int64_t base = 0;
      double w0 = 1.0;
      active.clear();
      for (int64_t d = 0; d < rank; ++d) {
        const auto& t = table[d][idx[d]];
        if (t.size() == 1) {
          base += t[0].first * xs[d];
          w0 *= t[0].second;
        } else {
          active.push_back(d);
        }
      }
      double acc = 0;
      int64_t combos = 1;
      for (int64_t d : active) combos *= ntaps[d];
      for (int64_t c = 0; c < combos; ++c) {
        int64_t rest = c, src = base;
        double w = w0;
        for (size_t a = active.size(); a-- > 0;) {
          int64_t d = active[a];
          const auto& tap = table[d][idx[d]][static_cast<size_t>(rest % ntaps[d])];
          rest /= ntaps[d];
          src += tap.first * xs[d];
          w *= tap.second;
        }
        acc += w * (f32 ? static_cast<double>(xf[src]) : x.get_f64(src));
      }
      if (f32) yf[e] = static_cast<float>(acc);
      else out[0].set_f64(e, acc);
    }
    return Status::ok();
  });
}
// Gather along axis 0 (embeddings): the rows of dy added into zeros of the
// data's shape at their indices (ScatterND with reduction add, so repeated
// indices sum), negative indices counted from the end.
Status grad_gather(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* data = n.input(0);
  Value* indices = n.input(1);
  const int64_t rank = data->type().rank();
  if (rank < 1 || indices->type().rank() < 0) return node_unsupported(n) << "the gradient of a Gather of unknown rank";
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  // Along another axis: the same with that axis first (data [a, rest...],
  // dy [indices..., rest...]), transposed back.
  const int64_t ri = indices->type().rank();
  Value* dy = b.output_grad(0);
  std::vector<int64_t> to_front = {axis}, back(static_cast<size_t>(rank));
  if (axis != 0) {
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis) to_front.push_back(d);
    for (int64_t d = 0; d < rank; ++d) back[static_cast<size_t>(to_front[static_cast<size_t>(d)])] = d;
    std::vector<int64_t> dy_perm;
    for (int64_t d = 0; d < ri; ++d) dy_perm.push_back(axis + d);
    for (int64_t d = 0; d < rank - 1 + ri; ++d)
      if (d < axis || d >= axis + ri) dy_perm.push_back(d);
    KILN_ASSIGN_OR_RETURN(data, b.add1("Transpose", {data}, {{"perm", Attribute::of_ints(to_front)}}));
    KILN_ASSIGN_OR_RETURN(dy, b.add1("Transpose", {dy}, {{"perm", Attribute::of_ints(dy_perm)}}));
  }
  KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {data}));
  Tensor zero(data->dtype(), {1});
  KILN_ASSIGN_OR_RETURN(Value* zeros, b.add1("ConstantOfShape", {shape}, {{"value", Attribute::of_tensor(zero)}}));
  Value* idx = indices;
  if (idx->dtype() != DType::kInt64) {
    KILN_ASSIGN_OR_RETURN(idx, b.add1("Cast", {idx}, {{"to", Attribute::of_int(static_cast<int64_t>(DType::kInt64))}}));
  }
  KILN_ASSIGN_OR_RETURN(Value* rows, b.add1("Gather", {shape, b.ints({0})}));
  KILN_ASSIGN_OR_RETURN(Value* wrapped, b.add1("Add", {idx, rows}));
  Tensor zero_i(DType::kInt64, {});
  KILN_ASSIGN_OR_RETURN(Value* negative, b.add1("Less", {idx, b.constant(zero_i)}));
  KILN_ASSIGN_OR_RETURN(Value* fixed, b.add1("Where", {negative, wrapped, idx}));
  KILN_ASSIGN_OR_RETURN(Value* tuples, b.unsqueeze(fixed, {ri}));
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("ScatterND", {zeros, tuples, dy}, {{"reduction", Attribute::of_string("add")}}));
  if (axis != 0) {
    KILN_ASSIGN_OR_RETURN(g, b.add1("Transpose", {g}, {{"perm", Attribute::of_ints(back)}}));
  }
  return b.set_input_grad(0, g);
}

// GatherElements: dy added into zeros of the data's shape at the indices
// along the axis (ScatterElements with reduction add, so repeated indices
// sum; negative indices count from the end there too).
Status grad_gather_elements(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* data = n.input(0);
  Value* idx = n.input(1);
  KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {data}));
  Tensor zero(data->dtype(), {1});
  KILN_ASSIGN_OR_RETURN(Value* zeros, b.add1("ConstantOfShape", {shape}, {{"value", Attribute::of_tensor(zero)}}));
  if (idx->dtype() != DType::kInt64) {
    KILN_ASSIGN_OR_RETURN(idx, b.add1("Cast", {idx}, {{"to", Attribute::of_int(static_cast<int64_t>(DType::kInt64))}}));
  }
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("ScatterElements", {zeros, idx, b.output_grad(0)},
                                         {{"axis", Attribute::of_int(n.attr_int("axis", 0))},
                                          {"reduction", Attribute::of_string("add")}}));
  return b.set_input_grad(0, g);
}

}  // namespace

void register_indexing_ops() {
  OpDef gather = make_def("Gather", infer_gather, lower_gather);
  gather.index_checks = gather_index_checks;
  gather.gradient = grad_gather;
  register_op(std::move(gather));
  OpDef gather_elements = make_def("GatherElements", infer_gather_elements, lower_gather_elements);
  gather_elements.index_checks = gather_index_checks;
  gather_elements.gradient = grad_gather_elements;
  register_op(std::move(gather_elements));
  OpDef gather_nd = make_def("GatherND", infer_gather_nd, lower_gather_nd);
  gather_nd.index_checks = gather_nd_index_checks;
  register_op(std::move(gather_nd));
  register_op(make_def("Trilu", infer_trilu, lower_trilu));
  // CumSum and OneHot use their runtime kernels when the axis / depth is only
  // known at run time.
  OpDef cumsum = make_def("CumSum", infer_cumsum, lower_cumsum);
  cumsum.kernel = cumsum_kernel;
  register_op(std::move(cumsum));
  OpDef one_hot = make_def("OneHot", infer_one_hot, lower_one_hot);
  one_hot.kernel = one_hot_kernel;
  register_op(std::move(one_hot));
  OpDef resize = make_def("Resize", infer_resize, lower_resize);
  resize.kernel = resize_kernel;
  register_op(std::move(resize));

  OpDef scatter_elements;
  scatter_elements.name = "ScatterElements";
  scatter_elements.infer = infer_scatter;
  scatter_elements.kernel = scatter_elements_kernel;
  register_op(std::move(scatter_elements));

  // Scatter (deprecated in opset 11) is ScatterElements without reduction.
  OpDef scatter;
  scatter.name = "Scatter";
  scatter.infer = infer_scatter;
  scatter.kernel = scatter_elements_kernel;
  register_op(std::move(scatter));

  OpDef scatter_nd;
  scatter_nd.name = "ScatterND";
  scatter_nd.infer = infer_scatter;
  scatter_nd.kernel = scatter_nd_kernel;
  scatter_nd.kernel_fills_outputs = true;
  register_op(std::move(scatter_nd));

  OpDef non_zero;
  non_zero.name = "NonZero";
  non_zero.infer = infer_non_zero;
  non_zero.kernel = non_zero_kernel;
  register_op(std::move(non_zero));

  OpDef top_k;
  top_k.name = "TopK";
  top_k.infer = infer_top_k;
  top_k.kernel = top_k_kernel;
  register_op(std::move(top_k));
}

}  // namespace kiln::ops
