// Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
// QLinearMatMul, QLinearConv, MatMulInteger and ConvInteger. All compiled.
//
// Scales and zero points are per tensor (one element, rank 0 or 1), per axis
// (1-D along `axis`) or, from opset 21, blocked (same rank as x, dim `axis`
// of ceil(x_dim / block_size); element i along the axis uses block
// i floordiv block_size). Quantization follows the ONNX reference:
//   QuantizeLinear:   y = saturate(round_half_even(x / scale) + zero_point)
//   DequantizeLinear: y = (f32(x) - f32(zero_point)) * scale
// Integer targets are u8/i8/u16/i16/u4/i4 (i32 for DequantizeLinear's
// input; 4-bit values are one per byte in memory); float8 targets are not
// supported.
//
// The integer products (MatMulInteger, ConvInteger, QLinear*) accumulate
// (a - a_zero_point) * (b - b_zero_point) in i32 in one reduction stage, the
// structure of matmul.cc and conv.cc; QLinear* then requantize in f64:
//   y = saturate(round_half_even(f64(acc) * f64(a_scale * b_scale / y_scale)) + y_zero_point)
// which is the reference's order of operations (an i32 array times an f32
// array is f64 in numpy), so that ties round the same way.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {

bool is_quant_int(DType t) {
  return t == DType::kUInt8 || t == DType::kInt8 || t == DType::kUInt16 || t == DType::kInt16 ||
         t == DType::kUInt4 || t == DType::kInt4;
}

// The float8 formats: QuantizeLinear scales and converts without rounding
// to an integer (saturating unless saturate=0); DequantizeLinear widens.
bool is_quant_float8(DType t) {
  return t == DType::kFloat8E4M3FN || t == DType::kFloat8E4M3FNUZ || t == DType::kFloat8E5M2 ||
         t == DType::kFloat8E5M2FNUZ;
}

Status check_dtype(const Node& n, DType t, bool allow_i32, const char* what, bool allow_float8 = false) {
  if (is_quant_int(t) || (allow_i32 && t == DType::kInt32) || (allow_float8 && is_quant_float8(t)))
    return Status::ok();
  return node_unsupported(n) << what << " of dtype " << dtype_name(t) << " (u8/i8/u16/i16/u4/i4"
                             << (allow_i32 ? "/i32" : "") << (allow_float8 ? "/float8" : "") << " supported)";
}

// Numeric element count of a shape when static.
std::optional<int64_t> static_numel(const std::vector<Expr>& shape) {
  int64_t n = 1;
  for (const Expr& d : shape) {
    auto c = simplify(d).as_const();
    if (!c) return std::nullopt;
    n *= *c;
  }
  return n;
}

// Optional input i is one element (rank 0 or 1), or exactly `per` (a
// per-axis / per-row / blocked parameter): anything else would be read out
// of bounds by the kernel.
Status check_param(const Node& n, size_t i, const Shape& per, const char* what, const SymbolBounds& bounds) {
  if (!has_input(n, i)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, i));
  auto numel = static_numel(s);
  if (s.size() <= 1 && numel && *numel == 1) return Status::ok();
  return require_param_shape(n, i, per, what, bounds);
}

// The shape a per-axis or blocked scale of x must have.
Result<Shape> quant_param_shape(const Node& n, const Shape& x) {
  int64_t rank = static_cast<int64_t>(x.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 1), std::max<int64_t>(rank, 1)));
  int64_t bs = n.attr_int("block_size", 0);
  if (bs <= 0 || axis >= rank) return Shape{axis < rank ? x[static_cast<size_t>(axis)] : Expr(1)};
  Shape out = x;
  out[static_cast<size_t>(axis)] = floordiv(x[static_cast<size_t>(axis)] + (bs - 1), Expr(bs));
  return out;
}

Status check_quant_params(const Node& n, const Shape& x, const SymbolBounds& bounds) {
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 1));
  auto numel = static_numel(s);
  if (s.size() <= 1 && numel && *numel == 1 && n.attr_int("block_size", 0) == 0) {
    return check_param(n, 2, {}, "zero point", bounds);  // per tensor: the zero point too
  }
  KILN_ASSIGN_OR_RETURN(Shape per, quant_param_shape(n, x));
  KILN_RETURN_IF_ERROR(check_param(n, 1, per, "scale", bounds));
  return check_param(n, 2, per, "zero point", bounds);
}

// How a scale / zero-point input maps onto the elements of x.
struct QuantParamLayout {
  enum Kind { kPerTensor, kPerAxis, kBlocked } kind = kPerTensor;
  int64_t axis = 0;
  int64_t block_size = 0;
};

Result<QuantParamLayout> param_layout(const Node& n, const std::vector<Expr>& x_shape,
                                      const std::vector<Expr>& p_shape, int64_t default_axis) {
  QuantParamLayout l;
  auto numel = static_numel(p_shape);
  if (p_shape.empty() || (p_shape.size() == 1 && numel && *numel == 1 && n.attr_int("block_size", 0) == 0)) {
    return l;
  }
  int64_t rank = static_cast<int64_t>(x_shape.size());
  KILN_ASSIGN_OR_RETURN(l.axis, normalize_axis(n, n.attr_int("axis", default_axis), rank));
  l.block_size = n.attr_int("block_size", 0);
  if (l.block_size > 0) {
    if (p_shape.size() != x_shape.size()) {
      return node_invalid(n) << "blocked scale must have the rank of x (" << rank << ")";
    }
    l.kind = QuantParamLayout::kBlocked;
    return l;
  }
  if (l.block_size < 0) return node_invalid(n) << "block_size must be positive";
  if (p_shape.size() != 1) return node_invalid(n) << "per-axis scale / zero point must be 1-D";
  l.kind = QuantParamLayout::kPerAxis;
  return l;
}

// Loads a scale / zero-point input at the element `idx` of x.
Expr load_param(const LowerContext& ctx, size_t i, const QuantParamLayout& l, const std::vector<Expr>& idx) {
  const std::vector<Expr>& ps = ctx.inputs[i].shape;
  switch (l.kind) {
    case QuantParamLayout::kPerTensor: return ctx.load_input(i, std::vector<Expr>(ps.size(), Expr(0)));
    case QuantParamLayout::kPerAxis: return ctx.load_input(i, {idx[static_cast<size_t>(l.axis)]});
    case QuantParamLayout::kBlocked: {
      std::vector<Expr> pi = idx;
      pi[static_cast<size_t>(l.axis)] = floordiv(idx[static_cast<size_t>(l.axis)], Expr(l.block_size));
      return ctx.load_input(i, pi);
    }
  }
  return Expr();
}

// Integer range of a quantized dtype.
std::pair<double, double> quant_range(DType t) {
  switch (t) {
    case DType::kUInt8: return {0, 255};
    case DType::kInt8: return {-128, 127};
    case DType::kUInt16: return {0, 65535};
    case DType::kInt16: return {-32768, 32767};
    case DType::kUInt4: return {0, 15};
    case DType::kInt4: return {-8, 7};
    default: return {-2147483648.0, 2147483647.0};
  }
}

// round_half_even(v) (float) saturated into `out`'s range and converted.
Expr saturate_round(DType out, const Expr& v) {
  DType f = v.dtype();
  auto [lo, hi] = quant_range(out);
  Expr r = call("round", f, {v});
  r = min(max(r, float_imm(lo, f)), float_imm(hi, f));
  return cast(out, r);
}

// ---- QuantizeLinear ------------------------------------------------------------

DType quantize_out_dtype(const Node& n) {
  if (has_input(n, 2)) return n.input(2)->dtype();
  int64_t od = n.attr_int("output_dtype", 0);
  return od != 0 ? static_cast<DType>(od) : DType::kUInt8;
}

Status infer_quantize(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType st, input_type(n, 1));
  (void)st;
  KILN_RETURN_IF_ERROR(check_quant_params(n, x, ctx.bounds));
  int64_t od = n.attr_int("output_dtype", 0);
  if (od != 0) KILN_RETURN_IF_ERROR(elem_type_attr(n, "output_dtype", DType::kUInt8).status());
  DType out = quantize_out_dtype(n);
  if (has_input(n, 2) && od != 0 && od != static_cast<int64_t>(out)) {
    return node_invalid(n) << "output_dtype differs from the zero point's dtype";
  }
  set_output(n, 0, out, std::move(x), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_quantize(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& s = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_dtype(n, y.dtype, false, "output", true));
  if (!dtype_is_float(s.dtype) || !dtype_is_compilable(s.dtype)) {
    return node_unsupported(n) << "scale of dtype " << dtype_name(s.dtype);
  }
  int64_t default_axis = 1;
  KILN_ASSIGN_OR_RETURN(QuantParamLayout sl, param_layout(n, x.shape, s.shape, default_axis));
  QuantParamLayout zl;
  if (has_input(n, 2)) {
    KILN_ASSIGN_OR_RETURN(zl, param_layout(n, x.shape, ctx.inputs[2].shape, default_axis));
  }
  std::vector<std::string> axes = fresh_axes(ctx, x.shape.size());
  std::vector<Expr> iv = axis_vars(axes);
  DType f = s.dtype;
  Expr xv = cast_if_needed(f, ctx.load_input(0, iv));
  if (is_quant_float8(y.dtype)) {
    Expr v = div(xv, load_param(ctx, 1, sl, iv));
    if (has_input(n, 2)) v = add(v, cast(f, load_param(ctx, 2, zl, iv)));
    Expr out = n.attr_int("saturate", 1) != 0 ? cast(y.dtype, v)
                                              : call("cast_nosat", y.dtype, {cast_if_needed(DType::kFloat32, v)});
    return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, out)};
  }
  Expr q = call("round", f, {div(xv, load_param(ctx, 1, sl, iv))});
  // As the reference: round to an integer, add the zero point, saturate.
  // Working in f64 keeps every integer of the i32 range exact.
  Expr v = cast_if_needed(DType::kFloat64, q);
  if (has_input(n, 2)) v = add(v, cast(DType::kFloat64, load_param(ctx, 2, zl, iv)));
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, saturate_round(y.dtype, v)));
  return stages;
}

// ---- DequantizeLinear ------------------------------------------------------------

Status infer_dequantize(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType st, input_type(n, 1));
  KILN_RETURN_IF_ERROR(check_quant_params(n, x, ctx.bounds));
  set_output(n, 0, st.dtype, std::move(x), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_dequantize(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& s = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_dtype(n, x.dtype, true, "input", true));
  if (!dtype_is_float(s.dtype) || !dtype_is_compilable(s.dtype)) {
    return node_unsupported(n) << "scale of dtype " << dtype_name(s.dtype);
  }
  KILN_ASSIGN_OR_RETURN(QuantParamLayout sl, param_layout(n, x.shape, s.shape, 1));
  std::vector<std::string> axes = fresh_axes(ctx, x.shape.size());
  std::vector<Expr> iv = axis_vars(axes);
  if (is_quant_float8(x.dtype)) {  // widen, subtract, scale in the scale's dtype
    Expr d = cast(s.dtype, ctx.load_input(0, iv));
    if (has_input(n, 2)) {
      KILN_ASSIGN_OR_RETURN(QuantParamLayout zl, param_layout(n, x.shape, ctx.inputs[2].shape, 1));
      d = sub(d, cast(s.dtype, load_param(ctx, 2, zl, iv)));
    }
    return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, mul(d, load_param(ctx, 1, sl, iv)))};
  }
  // x - zero_point is exact in i64; then one conversion and one product in the scale's dtype.
  Expr d = cast(DType::kInt64, ctx.load_input(0, iv));
  if (has_input(n, 2)) {
    KILN_ASSIGN_OR_RETURN(QuantParamLayout zl, param_layout(n, x.shape, ctx.inputs[2].shape, 1));
    d = sub(d, cast(DType::kInt64, load_param(ctx, 2, zl, iv)));
  }
  Expr body = mul(cast(s.dtype, d), load_param(ctx, 1, sl, iv));
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, body));
  return stages;
}

// ---- DynamicQuantizeLinear --------------------------------------------------------

Status infer_dynamic_quantize(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (xt.dtype != DType::kFloat32) return node_unsupported(n) << "input of dtype " << dtype_name(xt.dtype);
  set_output(n, 0, DType::kUInt8, std::move(x), ctx);
  if (n.num_outputs() > 1) set_output(n, 1, DType::kFloat32, {}, ctx);
  if (n.num_outputs() > 2) set_output(n, 2, DType::kUInt8, {}, ctx);
  return Status::ok();
}

// The reference: min/max of x extended to include 0, scale = (max - min) / 255,
// zero_point = saturate(round(0 - min / scale)), y = saturate(round(x / scale) + zero_point).
Result<std::vector<tir::ComputeDef>> lower_dynamic_quantize(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType f = DType::kFloat32;
  std::vector<bool> all(x.shape.size(), true);
  auto x_at = [&](const std::vector<Expr>& idx) { return ctx.load_input(0, idx); };
  std::vector<tir::ComputeDef> stages;
  stages.push_back(reduce_over_dims(ctx, ctx.fresh(y.name + "_max"), f, x.shape, all, false, tir::Combiner::kMax,
                                    float_imm(0.0, f), x_at));
  tir::ComputeDef mx = stages.back();
  stages.push_back(reduce_over_dims(ctx, ctx.fresh(y.name + "_min"), f, x.shape, all, false, tir::Combiner::kMin,
                                    float_imm(0.0, f), x_at));
  tir::ComputeDef mn = stages.back();
  std::string scale_name = ctx.outputs.size() > 1 && !ctx.outputs[1].name.empty() ? ctx.outputs[1].name
                                                                                    : ctx.fresh(y.name + "_scale");
  stages.push_back(make_stage(scale_name, f, {}, {},
                              div(sub(stage_load(mx, {}), stage_load(mn, {})), float_imm(255.0, f))));
  tir::ComputeDef scale = stages.back();
  std::string zp_name = ctx.outputs.size() > 2 && !ctx.outputs[2].name.empty() ? ctx.outputs[2].name
                                                                                 : ctx.fresh(y.name + "_zp");
  stages.push_back(make_stage(zp_name, DType::kUInt8, {}, {},
                              saturate_round(DType::kUInt8, sub(float_imm(0.0, f),
                                                                div(stage_load(mn, {}), stage_load(scale, {}))))));
  tir::ComputeDef zp = stages.back();
  std::vector<std::string> axes = fresh_axes(ctx, x.shape.size());
  std::vector<Expr> iv = axis_vars(axes);
  Expr q = call("round", f, {div(x_at(iv), stage_load(scale, {}))});
  stages.push_back(make_stage(y.name, DType::kUInt8, axes, y.shape,
                              saturate_round(DType::kUInt8, add(q, cast(f, stage_load(zp, {}))))));
  return stages;
}

// ---- Integer matrix products ---------------------------------------------------------

// Operands of MatMulInteger / QLinearMatMul by input position.
struct MatMulInputs {
  size_t a, a_zp, b, b_zp;
};

Status infer_matmul_shape(Node& n, InferContext& ctx, size_t ai, size_t bi, DType out_dtype) {
  KILN_ASSIGN_OR_RETURN(Shape a, input_shape(n, ai));
  KILN_ASSIGN_OR_RETURN(Shape b, input_shape(n, bi));
  if (a.empty() || b.empty()) return node_invalid(n) << "operands must have rank >= 1";
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), Expr(1));
  if (b_vec) b.push_back(Expr(1));
  auto ca = simplify(a.back(), ctx.bounds).as_const(), cb = simplify(b[b.size() - 2], ctx.bounds).as_const();
  if (ca && cb && *ca != *cb) return node_invalid(n) << "inner dims differ: " << *ca << " vs " << *cb;
  Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  KILN_ASSIGN_OR_RETURN(Shape out, broadcast_all(n, {a_batch, b_batch}, ctx.bounds));
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b[b.size() - 1]);
  set_output(n, 0, out_dtype, std::move(out), ctx);
  // Per-row parameters of A have M elements, per-column ones of B N elements.
  Shape rows = {a[a.size() - 2]}, cols = {b[b.size() - 1]};
  if (bi == 1) {  // MatMulInteger: A, B, a_zero_point, b_zero_point
    KILN_RETURN_IF_ERROR(check_param(n, 2, rows, "a_zero_point", ctx.bounds));
    return check_param(n, 3, cols, "b_zero_point", ctx.bounds);
  }
  KILN_RETURN_IF_ERROR(check_param(n, 1, rows, "a_scale", ctx.bounds));
  KILN_RETURN_IF_ERROR(check_param(n, 2, rows, "a_zero_point", ctx.bounds));
  KILN_RETURN_IF_ERROR(check_param(n, 4, cols, "b_scale", ctx.bounds));
  KILN_RETURN_IF_ERROR(check_param(n, 5, cols, "b_zero_point", ctx.bounds));
  KILN_RETURN_IF_ERROR(check_param(n, 6, {}, "y_scale", ctx.bounds));
  return check_param(n, 7, {}, "y_zero_point", ctx.bounds);
}

// An i32 zero point of an operand: per tensor, or per row of A (index m) / per
// column of B (index n).
Expr load_zero_point(const LowerContext& ctx, size_t i, const Expr& row_or_col) {
  const std::vector<Expr>& s = ctx.inputs[i].shape;
  auto numel = static_numel(s);
  if (s.empty() || (numel && *numel == 1)) {
    return cast(DType::kInt32, ctx.load_input(i, std::vector<Expr>(s.size(), Expr(0))));
  }
  return cast(DType::kInt32, ctx.load_input(i, {row_or_col}));
}

// The i32 accumulation sum_k (a[.., m, k] - a_zp) * (b[.., k, n] - b_zp) as a
// reduction stage named `name` with the output's shape; m / n for
// per-row / per-column parameters are returned through `m_out` / `n_out`.
Result<tir::ComputeDef> integer_matmul_stage(const Node& n, LowerContext& ctx, const MatMulInputs& mi,
                                             const std::string& name, std::vector<std::string>& axes,
                                             Expr& m_out, Expr& n_out) {
  const tir::Buffer& a = ctx.inputs[mi.a];
  const tir::Buffer& b = ctx.inputs[mi.b];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_dtype(n, a.dtype, false, "A"));
  KILN_RETURN_IF_ERROR(check_dtype(n, b.dtype, false, "B"));
  MatMulIndices ix = matmul_indices(ctx, a, b, y);
  axes = ix.axes;
  m_out = ix.m;
  n_out = ix.n;
  Expr av = cast(DType::kInt32, ctx.load_input(mi.a, ix.a));
  Expr bv = cast(DType::kInt32, ctx.load_input(mi.b, ix.b));
  if (has_input(n, mi.a_zp)) av = sub(av, load_zero_point(ctx, mi.a_zp, m_out));
  if (has_input(n, mi.b_zp)) bv = sub(bv, load_zero_point(ctx, mi.b_zp, n_out));
  return make_reduce_stage(name, DType::kInt32, axes, y.shape, {ix.k}, {a.shape.back()}, tir::Combiner::kSum,
                           int_imm(0, DType::kInt32), mul(av, bv));
}

Status infer_matmul_integer(Node& n, InferContext& ctx) { return infer_matmul_shape(n, ctx, 0, 1, DType::kInt32); }

Result<std::vector<tir::ComputeDef>> lower_matmul_integer(const Node& n, LowerContext& ctx) {
  std::vector<std::string> axes;
  Expr m, nn;
  KILN_ASSIGN_OR_RETURN(tir::ComputeDef acc,
                        integer_matmul_stage(n, ctx, {0, 2, 1, 3}, ctx.outputs[0].name, axes, m, nn));
  return std::vector<tir::ComputeDef>{acc};
}

// A float scale of input i at row/column index `rc` (per tensor or 1-D).
Expr load_scale(const LowerContext& ctx, size_t i, const Expr& rc) {
  const std::vector<Expr>& s = ctx.inputs[i].shape;
  auto numel = static_numel(s);
  if (s.empty() || (numel && *numel == 1)) return ctx.load_input(i, std::vector<Expr>(s.size(), Expr(0)));
  return ctx.load_input(i, {rc});
}

// Requantization of an i32 accumulator (see the file comment).
Expr requantize(const LowerContext& ctx, DType out, const Expr& acc, const Expr& scale_a, const Expr& scale_b,
                size_t y_scale, size_t y_zp, bool has_zp) {
  DType f = scale_a.dtype();
  Expr mult = div(mul(scale_a, scale_b), cast_if_needed(f, ctx.load_input(y_scale, std::vector<Expr>(
                                                                                       ctx.inputs[y_scale].shape.size(), Expr(0)))));
  Expr v = mul(cast(DType::kFloat64, acc), cast_if_needed(DType::kFloat64, mult));
  if (has_zp) {
    v = add(v, cast(DType::kFloat64,
                    ctx.load_input(y_zp, std::vector<Expr>(ctx.inputs[y_zp].shape.size(), Expr(0)))));
  }
  return saturate_round(out, v);
}

Status check_scale_dtypes(const Node& n, const LowerContext& ctx, std::vector<size_t> scales) {
  for (size_t i : scales) {
    DType t = ctx.inputs[i].dtype;
    if (!dtype_is_float(t) || !dtype_is_compilable(t)) {
      return node_unsupported(n) << "scale input " << i << " of dtype " << dtype_name(t);
    }
  }
  return Status::ok();
}

Status infer_qlinear_matmul(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType at, input_type(n, 0));
  DType out = has_input(n, 7) ? n.input(7)->dtype() : at.dtype;
  return infer_matmul_shape(n, ctx, 0, 3, out);
}

Result<std::vector<tir::ComputeDef>> lower_qlinear_matmul(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_scale_dtypes(n, ctx, {1, 4, 6}));
  KILN_RETURN_IF_ERROR(check_dtype(n, y.dtype, false, "output"));
  std::vector<std::string> axes;
  Expr m, nn;
  KILN_ASSIGN_OR_RETURN(tir::ComputeDef acc,
                        integer_matmul_stage(n, ctx, {0, 2, 3, 5}, ctx.fresh(y.name + "_acc"), axes, m, nn));
  std::vector<std::string> oaxes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> ov = axis_vars(oaxes);
  std::map<std::string, Expr, std::less<>> repl;
  for (size_t d = 0; d < axes.size(); ++d) repl[axes[d]] = ov[d];
  Expr mo = substitute(m, repl), no = substitute(nn, repl);
  Expr body = requantize(ctx, y.dtype, stage_load(acc, ov), load_scale(ctx, 1, mo), load_scale(ctx, 4, no), 6, 7,
                         has_input(n, 7));
  return std::vector<tir::ComputeDef>{acc, make_stage(y.name, y.dtype, oaxes, y.shape, body)};
}

// ---- Integer convolutions ---------------------------------------------------------------


// Operands of ConvInteger / QLinearConv by input position.
struct ConvInputs {
  size_t x, x_zp, w, w_zp;
};

Status infer_integer_conv(Node& n, InferContext& ctx, const ConvInputs& ci, DType out_dtype) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, ci.x));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, ci.w));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  if (w.size() != x.size()) return node_invalid(n) << "weight rank " << w.size() << " != input rank " << x.size();
  int64_t group = n.attr_int("group", 1);
  if (group <= 0) return node_invalid(n) << "group must be positive";
  std::vector<Expr> kernel(w.begin() + 2, w.end());
  auto c = simplify(x[1], ctx.bounds).as_const();
  auto wc = simplify(w[1], ctx.bounds).as_const();
  if (c && wc && *c != group * *wc) {
    return node_invalid(n) << "input has " << *c << " channels, weight expects " << group * *wc;
  }
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, x, kernel, ctx.bounds));
  Shape out = {x[0], w[0]};
  out.insert(out.end(), g.out.begin(), g.out.end());
  set_output(n, 0, out_dtype, std::move(out), ctx);
  // x's parameters are per tensor; w's per tensor or per output channel.
  KILN_RETURN_IF_ERROR(check_param(n, ci.x_zp, {}, "x_zero_point", ctx.bounds));
  KILN_RETURN_IF_ERROR(check_param(n, ci.w_zp, {w[0]}, "w_zero_point", ctx.bounds));
  if (ci.w == 3) {  // QLinearConv
    KILN_RETURN_IF_ERROR(check_param(n, 1, {}, "x_scale", ctx.bounds));
    KILN_RETURN_IF_ERROR(check_param(n, 4, {w[0]}, "w_scale", ctx.bounds));
    KILN_RETURN_IF_ERROR(check_param(n, 6, {}, "y_scale", ctx.bounds));
    KILN_RETURN_IF_ERROR(check_param(n, 7, {}, "y_zero_point", ctx.bounds));
    KILN_RETURN_IF_ERROR(require_param_shape(n, 8, {w[0]}, "B", ctx.bounds));
  }
  return Status::ok();
}

// The i32 accumulation of (x - x_zp) * (w - w_zp) over a window, as a
// reduction stage named `name` (preceded by a padded copy of x - x_zp when
// padding is possible: padding contributes 0 after the zero-point shift).
// `axes` receives the output axes (output channel at index 1).
Result<std::vector<tir::ComputeDef>> integer_conv_stages(const Node& n, LowerContext& ctx, const ConvInputs& ci,
                                                         const std::string& name, std::vector<std::string>& axes) {
  const tir::Buffer& x = ctx.inputs[ci.x];
  const tir::Buffer& w = ctx.inputs[ci.w];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_dtype(n, x.dtype, false, "x"));
  KILN_RETURN_IF_ERROR(check_dtype(n, w.dtype, false, "w"));
  size_t rank = x.shape.size() - 2;
  std::vector<Expr> kernel(w.shape.begin() + 2, w.shape.end());
  Shape xs(x.shape.begin(), x.shape.end());
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, conv_geometry(n, xs, kernel, {}));
  int64_t group = n.attr_int("group", 1);

  axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank + 1, "k");
  std::vector<Expr> rv = axis_vars(raxes);
  std::vector<Expr> rext = {w.shape[1]};
  rext.insert(rext.end(), kernel.begin(), kernel.end());
  Expr chan = rv[0];
  if (group != 1) chan = floordiv(iv[1], floordiv(w.shape[0], group)) * w.shape[1] + rv[0];
  std::vector<Expr> x_idx = {iv[0], chan};
  std::vector<Expr> w_idx = {iv[1], rv[0]};
  for (size_t d = 0; d < rank; ++d) {
    Expr pos = iv[d + 2] * g.stride[d] + rv[d + 1] * g.dilation[d];
    x_idx.push_back(g.may_pad ? pos : pos - g.pad_begin[d]);
    w_idx.push_back(rv[d + 1]);
  }
  auto shifted_x = [&](const std::vector<Expr>& idx) {
    Expr v = cast(DType::kInt32, ctx.load_input(ci.x, idx));
    if (has_input(n, ci.x_zp)) v = sub(v, load_zero_point(ctx, ci.x_zp, Expr(0)));
    return v;
  };
  std::vector<tir::ComputeDef> stages;
  Expr x_value;
  if (g.may_pad) {
    std::vector<std::string> paxes = fresh_axes(ctx, rank + 2, "p");
    std::vector<Expr> pv = axis_vars(paxes);
    std::vector<Expr> pshape = {x.shape[0], x.shape[1]};
    std::vector<Expr> src = {pv[0], pv[1]};
    Expr valid;
    for (size_t d = 0; d < rank; ++d) {
      pshape.push_back(simplify((g.out[d] - 1) * g.stride[d] + (kernel[d] - 1) * g.dilation[d] + 1));
      Expr pos = pv[d + 2] - g.pad_begin[d];
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      src.push_back(max(min(pos, g.in[d] - 1), Expr(0)));
    }
    stages.push_back(make_stage(ctx.fresh(name + "_pad"), DType::kInt32, paxes, pshape,
                                select(valid, shifted_x(src), int_imm(0, DType::kInt32))));
    x_value = stage_load(stages.back(), x_idx);
  } else {
    x_value = shifted_x(x_idx);
  }
  Expr wv = cast(DType::kInt32, ctx.load_input(ci.w, w_idx));
  if (has_input(n, ci.w_zp)) wv = sub(wv, load_zero_point(ctx, ci.w_zp, iv[1]));
  stages.push_back(make_reduce_stage(name, DType::kInt32, axes, y.shape, raxes, rext, tir::Combiner::kSum,
                                     int_imm(0, DType::kInt32), mul(x_value, wv)));
  return stages;
}

Status infer_conv_integer(Node& n, InferContext& ctx) {
  return infer_integer_conv(n, ctx, {0, 2, 1, 3}, DType::kInt32);
}

Result<std::vector<tir::ComputeDef>> lower_conv_integer(const Node& n, LowerContext& ctx) {
  std::vector<std::string> axes;
  return integer_conv_stages(n, ctx, {0, 2, 1, 3}, ctx.outputs[0].name, axes);
}

Status infer_qlinear_conv(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  DType out = has_input(n, 7) ? n.input(7)->dtype() : xt.dtype;
  return infer_integer_conv(n, ctx, {0, 2, 3, 5}, out);
}

Result<std::vector<tir::ComputeDef>> lower_qlinear_conv(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(check_scale_dtypes(n, ctx, {1, 4, 6}));
  KILN_RETURN_IF_ERROR(check_dtype(n, y.dtype, false, "output"));
  std::vector<std::string> axes;
  KILN_ASSIGN_OR_RETURN(std::vector<tir::ComputeDef> stages,
                        integer_conv_stages(n, ctx, {0, 2, 3, 5}, ctx.fresh(y.name + "_acc"), axes));
  const tir::ComputeDef& acc = stages.back();
  std::vector<std::string> oaxes = fresh_axes(ctx, y.shape.size());
  std::vector<Expr> ov = axis_vars(oaxes);
  Expr a = stage_load(acc, ov);
  if (has_input(n, 8)) a = add(a, cast(DType::kInt32, ctx.load_input(8, {ov[1]})));
  Expr body = requantize(ctx, y.dtype, a, load_scale(ctx, 1, Expr(0)), load_scale(ctx, 4, ov[1]), 6, 7,
                         has_input(n, 7));
  stages.push_back(make_stage(y.name, y.dtype, oaxes, y.shape, body));
  return stages;
}

}  // namespace

void register_quant_ops() {
  register_op(make_def("QuantizeLinear", infer_quantize, lower_quantize));
  register_op(make_def("DequantizeLinear", infer_dequantize, lower_dequantize));
  register_op(make_def("DynamicQuantizeLinear", infer_dynamic_quantize, lower_dynamic_quantize));
  register_op(make_def("MatMulInteger", infer_matmul_integer, lower_matmul_integer));
  register_op(make_def("QLinearMatMul", infer_qlinear_matmul, lower_qlinear_matmul));
  register_op(make_def("ConvInteger", infer_conv_integer, lower_conv_integer));
  register_op(make_def("QLinearConv", infer_qlinear_conv, lower_qlinear_conv));
}

}  // namespace kiln::ops
