// Shape ops: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
// Concat, Split, Slice, Expand, Tile, ConstantOfShape, Range, Pad.
//
// Symbolic shapes flow through these ops in two ways: output dims are Exprs
// over the input dims, and small integer tensors computed in the graph (the
// output of Shape, Gather on it, Concat of such, ...) carry their element
// values as a sym_value. Reshape, Expand, ConstantOfShape, Tile, Slice and Pad
// read their shape-like inputs from the constant or the sym_value, so the
// chains PyTorch's exporter emits (Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape) resolve to symbolic dims instead of unknowns.
//
// When a shape-like input is not known at compile time, Reshape,
// ConstantOfShape and Expand still know the output rank from the static length
// of that input; their dims then become fresh symbols (InferContext::
// fresh_symbol), i.e. data-dependent dims bound when the op runs. Range with a
// length not known symbolically falls back to its runtime kernel.
//
// View ops (Reshape, Flatten, Squeeze, Unsqueeze) alias their input at run
// time; they also have a lowering (a copy) for when a view has to be
// materialized.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {

// Elements of sym_values propagated at most (shape tensors are short).
constexpr size_t kMaxSymElements = 64;

Expr product(const std::vector<Expr>& dims) {
  Expr p = Expr(1);
  for (const Expr& d : dims) p = p * d;
  return p;
}

// Splits a simplified integer expression into a constant coefficient and
// its remaining factors (atoms of a product).
void factorize(const Expr& e, int64_t& coef, std::vector<Expr>& atoms) {
  if (auto c = e.as_const()) {
    coef *= *c;
  } else if (e.kind() == ExprKind::kMul) {
    for (const Expr& a : e->args) factorize(a, coef, atoms);
  } else {
    atoms.push_back(e);
  }
}

// prod(num) / prod(den) for a division known to be exact (Reshape's -1):
// equal factors cancel, so [a*b] reshaped to [a, -1] gives b, not
// (a*b) floordiv a. Falls back to a floordiv when factors do not cancel.
Expr exact_quotient(const std::vector<Expr>& num, const std::vector<Expr>& den, const SymbolBounds& bounds) {
  int64_t nc = 1, dc = 1;
  std::vector<Expr> na, da;
  for (const Expr& e : num) factorize(simplify(e, bounds), nc, na);
  for (const Expr& e : den) factorize(simplify(e, bounds), dc, da);
  std::vector<Expr> left;
  for (const Expr& d : da) {
    auto it = std::find_if(na.begin(), na.end(), [&](const Expr& x) { return x.same_as(d); });
    if (it != na.end()) {
      na.erase(it);
    } else {
      left.push_back(d);
    }
  }
  if (left.empty() && dc != 0 && nc % dc == 0) return simplify(product(na) * (nc / dc), bounds);
  return simplify(floordiv(product(na) * nc, product(left) * dc), bounds);
}

// Row-major flat index of `idx` in `shape`, and the inverse.
Expr ravel(const std::vector<Expr>& idx, const std::vector<Expr>& shape) {
  Expr flat = Expr(0);
  for (size_t k = 0; k < idx.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

std::vector<Expr> unravel(const Expr& flat, const std::vector<Expr>& shape) {
  std::vector<Expr> idx(shape.size());
  Expr stride = Expr(1);
  for (size_t k = shape.size(); k-- > 0;) {
    Expr q = k + 1 == shape.size() ? flat : floordiv(flat, stride);
    idx[k] = k == 0 ? q : mod(q, shape[k]);
    stride = stride * shape[k];
  }
  return idx;
}


void set_sym(Node& n, size_t i, std::optional<std::vector<Expr>> v, const InferContext& ctx) {
  if (i >= n.num_outputs() || n.output(i) == nullptr) return;
  if (v && v->size() <= kMaxSymElements) {
    for (Expr& e : *v) e = simplify(e, ctx.bounds);
    n.output(i)->set_sym_value(std::move(v));
  }
}

// A copy of input 0 into output 0 with the same elements in the same row-major
// order: the materialized form of a view op.
Result<std::vector<tir::ComputeDef>> lower_view_copy(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> in_idx;
  bool same = x.shape.size() == y.shape.size();
  for (size_t k = 0; same && k < x.shape.size(); ++k) same = prove_equal(x.shape[k], y.shape[k]);
  if (same) {
    in_idx = iv;
  } else {
    in_idx = unravel(ravel(iv, y.shape), x.shape);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, in_idx)));
  return stages;
}

// ---- Shape, Size ---------------------------------------------------------------------

std::pair<int64_t, int64_t> shape_range(const Node& n, int64_t rank) {
  auto norm = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  int64_t start = norm(n.attr_int("start", 0));
  int64_t end = norm(n.attr_int("end", rank));
  return {start, std::max(start, end)};
}

Status infer_shape(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  auto [start, end] = shape_range(n, static_cast<int64_t>(x.size()));
  std::vector<Expr> dims(x.begin() + start, x.begin() + end);
  set_output(n, 0, DType::kInt64, {Expr(end - start)}, ctx);
  set_sym(n, 0, dims, ctx);
  return Status::ok();
}

// Element i of a short vector of Exprs: a select chain on the index.
Expr select_element(const Expr& i, const std::vector<Expr>& values) {
  Expr body = values.back();
  for (size_t k = values.size() - 1; k-- > 0;) body = select(eq(i, Expr(static_cast<int64_t>(k))), values[k], body);
  return body;
}

Result<std::vector<tir::ComputeDef>> lower_shape(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  auto [start, end] = shape_range(n, static_cast<int64_t>(x.shape.size()));
  std::vector<std::string> axes = fresh_axes(ctx, 1, "i");
  std::vector<Expr> dims(x.shape.begin() + start, x.shape.begin() + end);
  Expr body = dims.empty() ? int_imm(0) : select_element(var(axes[0]), dims);
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, DType::kInt64, axes, y.shape, cast_if_needed(DType::kInt64, body)));
  return stages;
}

Status infer_size(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  set_output(n, 0, DType::kInt64, {}, ctx);
  set_sym(n, 0, std::vector<Expr>{product(x)}, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_size(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, DType::kInt64, {}, {}, simplify(product(ctx.inputs[0].shape))));
  return stages;
}

// ---- Reshape, Flatten ----------------------------------------------------------------

// The static element count of input i's type when it is 1-D with a constant
// length: the rank of the shape it holds. A length past kMaxInferredRank (a
// file's absurd dim) is left to run time, where the shape tensor's values
// must exist, instead of making millions of symbols here.
std::optional<int64_t> static_length(const Node& n, size_t i) {
  if (!has_input(n, i)) return std::nullopt;
  const TensorType& t = n.input(i)->type();
  if (!t.has_shape() || t.shape->size() != 1) return std::nullopt;
  auto len = simplify((*t.shape)[0]).as_const();
  return len && *len <= kMaxInferredRank ? len : std::nullopt;
}

// Output of an op whose shape-like input `i` is only known at run time: the
// rank is `rank` (when >= 0) and every dim a fresh data-dependent symbol; the
// runtime kernel computes the actual shape.
void set_data_dependent_output(Node& n, size_t out, DType dtype, int64_t rank, InferContext& ctx) {
  if (rank < 0) {
    set_output_unknown_rank(n, out, dtype);
    return;
  }
  Shape s;
  for (int64_t k = 0; k < rank; ++k) s.push_back(ctx.fresh_symbol());
  set_output(n, out, dtype, std::move(s), ctx);
}

// True when every present input in [first, last) has known element values.
bool inputs_known(const Node& n, size_t first, size_t last) {
  for (size_t i = first; i < last; ++i) {
    if (has_input(n, i) && !sym_values(n, i)) return false;
  }
  return true;
}

Status infer_reshape(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  bool allow_zero = n.attr_int("allowzero", 0) != 0;
  std::optional<std::vector<Expr>> target = sym_values(n, 1);
  if (!target && !has_input(n, 1) && n.has_attr("shape")) {  // Reshape-1
    std::vector<Expr> v;
    for (int64_t s : n.attr_ints("shape")) v.push_back(Expr(s));
    target = v;
  }
  if (!target) {
    auto len = static_length(n, 1);
    set_data_dependent_output(n, 0, xt.dtype, len ? *len : -1, ctx);
    return Status::ok();
  }
  Shape out;
  int infer_at = -1;
  for (size_t k = 0; k < target->size(); ++k) {
    Expr v = simplify((*target)[k], ctx.bounds);
    auto c = v.as_const();
    if (c && *c == 0 && !allow_zero) {
      if (!xt.has_shape() || k >= xt.shape->size()) return node_invalid(n) << "shape entry 0 at " << k << " has no input dim";
      out.push_back((*xt.shape)[k]);
    } else if (c && *c == -1) {
      if (infer_at >= 0) return node_invalid(n) << "more than one -1 in the shape";
      infer_at = static_cast<int>(k);
      out.push_back(Expr(1));
    } else if (c && *c < 0) {
      return node_invalid(n) << "invalid shape entry " << *c;
    } else {
      out.push_back(v);
    }
  }
  if (infer_at >= 0) {
    if (!xt.has_shape()) {
      out[infer_at] = ctx.fresh_symbol();
    } else {
      std::vector<Expr> others;
      for (size_t k = 0; k < out.size(); ++k) {
        if (static_cast<int>(k) != infer_at) others.push_back(out[k]);
      }
      out[infer_at] = exact_quotient(*xt.shape, others, ctx.bounds);
    }
  }
  if (xt.has_shape()) {
    auto a = simplify(product(*xt.shape), ctx.bounds).as_const();
    auto b = simplify(product(out), ctx.bounds).as_const();
    if (a && b && *a != *b) {
      return node_invalid(n) << "cannot reshape " << shape_to_string(*xt.shape) << " (" << *a << " elements) to "
                             << shape_to_string(out) << " (" << *b << " elements)";
    }
  }
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  set_sym(n, 0, n.input(0)->sym_value(), ctx);
  return Status::ok();
}

Status infer_flatten(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = n.attr_int("axis", 1);
  if (axis < -rank || axis > rank) return node_invalid(n) << "axis " << axis << " out of range for rank " << rank;
  if (axis < 0) axis += rank;
  Shape outer(x.begin(), x.begin() + axis), inner(x.begin() + axis, x.end());
  set_output(n, 0, xt.dtype, {product(outer), product(inner)}, ctx);
  set_sym(n, 0, n.input(0)->sym_value(), ctx);
  return Status::ok();
}

// ---- Squeeze, Unsqueeze ----------------------------------------------------------------

// Axes from input 1 (opset 13+) or the attribute (before 13).
std::optional<std::vector<int64_t>> axes_of(const Node& n) {
  if (has_input(n, 1)) return const_ints(n, 1);
  if (n.has_attr("axes")) return n.attr_ints("axes");
  return std::vector<int64_t>{};
}

Result<std::vector<bool>> squeezed_dims(const Node& n, const Shape& x, const SymbolBounds& bounds) {
  auto axes = axes_of(n);
  if (!axes) return node_unsupported(n) << "axes are not known at compile time";
  int64_t rank = static_cast<int64_t>(x.size());
  std::vector<bool> drop(x.size(), false);
  if (axes->empty()) {
    // Every dim of size 1 goes: a symbolic dim must be provably not 1, or
    // the output's rank would depend on its value at run time (a dim
    // assumed kept would give [1, 5] where ONNX gives [5]).
    for (size_t k = 0; k < x.size(); ++k) {
      Expr d = simplify(x[k], bounds);
      auto c = d.as_const();
      if (!c) {
        Interval b = bound_of(d, bounds);
        if ((b.lo && *b.lo >= 2) || (b.hi && *b.hi <= 0)) continue;
        return node_unsupported(n) << "no axes, and dim " << k << " (" << print_expr(d)
                                   << ") may be 1 at run time, so the output's rank would depend on it (give the axes)";
      }
      drop[k] = *c == 1;
    }
    return drop;
  }
  for (int64_t a : *axes) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(n, a, rank));
    auto c = simplify(x[ax], bounds).as_const();
    if (c && *c != 1) return node_invalid(n) << "cannot squeeze axis " << a << " of size " << *c;
    drop[ax] = true;
  }
  return drop;
}

// Concat's inputs must agree with the output on every axis but the
// concatenated one; those inference could not prove are checked at run time.
std::vector<DimCheck> concat_dim_checks(const Node& n, const SymbolBounds& bounds) {
  std::vector<DimCheck> checks;
  const Value* y = n.output(0);
  if (y == nullptr || !y->type().shape) return checks;
  const Shape& out = *y->type().shape;
  int64_t rank = static_cast<int64_t>(out.size());
  auto axis = normalize_axis(n, n.attr_int("axis", 0), rank);
  if (!axis.is_ok()) return checks;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v == nullptr || !v->type().shape || static_cast<int64_t>(v->type().shape->size()) != rank) continue;
    for (int64_t k = 0; k < rank; ++k) {
      const Expr& d = (*v->type().shape)[static_cast<size_t>(k)];
      if (k != *axis && !prove_equal(d, out[static_cast<size_t>(k)], bounds))
        checks.push_back({i, k, d, out[static_cast<size_t>(k)], true});
    }
  }
  return checks;
}

// A compiled Squeeze (fused into a kernel, where no view checks the element
// count) drops its axes as given: a symbolic one must be 1 at run time.
std::vector<DimCheck> squeeze_dim_checks(const Node& n, const SymbolBounds&) {
  std::vector<DimCheck> checks;
  auto axes = axes_of(n);
  const Value* x = n.input(0);
  if (!axes || x == nullptr || !x->type().shape) return checks;
  const Shape& xs = *x->type().shape;
  for (int64_t a : *axes) {
    auto k = normalize_axis(n, a, static_cast<int64_t>(xs.size()));
    if (!k.is_ok()) continue;  // inference rejected it already
    auto c = xs[static_cast<size_t>(*k)].as_const();
    if (!c || *c != 1) checks.push_back({0, *k, xs[static_cast<size_t>(*k)], Expr(int64_t{1})});
  }
  return checks;
}

Status infer_squeeze(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (!axes_of(n)) {
    auto len = static_length(n, 1);
    set_data_dependent_output(n, 0, xt.dtype, len ? static_cast<int64_t>(x.size()) - *len : -1, ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<bool> drop, squeezed_dims(n, x, ctx.bounds));
  Shape out;
  for (size_t k = 0; k < x.size(); ++k) {
    if (!drop[k]) out.push_back(x[k]);
  }
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  set_sym(n, 0, n.input(0)->sym_value(), ctx);
  return Status::ok();
}

Result<std::vector<bool>> unsqueezed_dims(const Node& n, size_t in_rank) {
  auto axes = axes_of(n);
  if (!axes) return node_unsupported(n) << "axes are not known at compile time";
  int64_t out_rank = static_cast<int64_t>(in_rank + axes->size());
  std::vector<bool> inserted(static_cast<size_t>(out_rank), false);
  for (int64_t a : *axes) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(n, a, out_rank));
    if (inserted[ax]) return node_invalid(n) << "axis " << a << " repeated";
    inserted[ax] = true;
  }
  return inserted;
}

Status infer_unsqueeze(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (!axes_of(n)) {
    auto len = static_length(n, 1);
    set_data_dependent_output(n, 0, xt.dtype, len ? static_cast<int64_t>(x.size()) + *len : -1, ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<bool> inserted, unsqueezed_dims(n, x.size()));
  Shape out;
  size_t next = 0;
  for (bool ins : inserted) out.push_back(ins ? Expr(1) : x[next++]);
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  set_sym(n, 0, n.input(0)->sym_value(), ctx);
  return Status::ok();
}

// Squeeze and Unsqueeze only drop or insert unit dims: the copy maps axes directly.
Result<std::vector<tir::ComputeDef>> lower_unit_dims(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> in_idx;
  if (n.op_type() == "Squeeze") {
    Shape xs(x.shape.begin(), x.shape.end());
    KILN_ASSIGN_OR_RETURN(std::vector<bool> drop, squeezed_dims(n, xs, {}));
    size_t next = 0;
    for (bool d : drop) in_idx.push_back(d ? Expr(0) : iv[next++]);
  } else {
    KILN_ASSIGN_OR_RETURN(std::vector<bool> inserted, unsqueezed_dims(n, x.shape.size()));
    for (size_t k = 0; k < inserted.size(); ++k) {
      if (!inserted[k]) in_idx.push_back(iv[k]);
    }
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, in_idx)));
  return stages;
}

// ---- Transpose ---------------------------------------------------------------------------

Result<std::vector<int64_t>> transpose_perm(const Node& n, size_t rank) {
  std::vector<int64_t> perm = n.attr_ints("perm");
  if (perm.empty()) {
    for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  }
  if (perm.size() != rank) return node_invalid(n) << "perm has " << perm.size() << " entries for rank " << rank;
  std::vector<bool> seen(rank, false);
  for (int64_t& p : perm) {
    KILN_ASSIGN_OR_RETURN(p, normalize_axis(n, p, static_cast<int64_t>(rank)));
    if (seen[p]) return node_invalid(n) << "perm is not a permutation";
    seen[p] = true;
  }
  return perm;
}

Status infer_transpose(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose_perm(n, x.size()));
  Shape out;
  for (int64_t p : perm) out.push_back(x[p]);
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  if (x.size() <= 1) set_sym(n, 0, n.input(0)->sym_value(), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_transpose(const Node& n, LowerContext& ctx) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose_perm(n, x.shape.size()));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> in_idx(x.shape.size());
  for (size_t k = 0; k < perm.size(); ++k) in_idx[perm[k]] = iv[k];
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, in_idx)));
  return stages;
}

// ---- Concat ------------------------------------------------------------------------------

Status infer_concat(Node& n, InferContext& ctx) {
  if (n.num_inputs() == 0) return node_invalid(n) << "no inputs";
  KILN_ASSIGN_OR_RETURN(TensorType t0, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape out, input_shape(n, 0));
  int64_t rank = static_cast<int64_t>(out.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), rank));
  if (rank == 0) return node_invalid(n) << "inputs must have rank >= 1";
  for (size_t i = 1; i < n.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, i));
    if (static_cast<int64_t>(s.size()) != rank) return node_invalid(n) << "input " << i << " has a different rank";
    for (int64_t k = 0; k < rank; ++k) {
      if (k == axis) continue;
      auto a = simplify(out[k], ctx.bounds).as_const(), b = simplify(s[k], ctx.bounds).as_const();
      if (a && b && *a != *b) return node_invalid(n) << "input " << i << " differs in dim " << k;
      if (!a && b) out[k] = s[k];  // a constant is the more precise description
    }
    out[axis] = out[axis] + s[axis];
  }
  set_output(n, 0, t0.dtype, std::move(out), ctx);
  if (rank == 1) {
    std::vector<Expr> vals;
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      auto v = sym_values(n, i);
      if (!v) return Status::ok();
      vals.insert(vals.end(), v->begin(), v->end());
    }
    set_sym(n, 0, vals, ctx);
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_concat(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  int64_t rank = static_cast<int64_t>(y.shape.size());
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  // Inputs that may be non-empty along the axis, with their offsets.
  std::vector<size_t> parts;
  std::vector<Expr> offsets;
  Expr off = Expr(0);
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    Expr len = ctx.inputs[i].shape[axis];
    auto c = simplify(len).as_const();
    if (c && *c == 0) continue;
    parts.push_back(i);
    offsets.push_back(simplify(off));
    off = off + len;
  }
  if (parts.empty()) return node_unsupported(n) << "all inputs are empty along the axis";
  auto load_part = [&](size_t p) {
    std::vector<Expr> idx = iv;
    idx[axis] = clamp_index(iv[axis] - offsets[p], ctx.inputs[parts[p]].shape[axis]);
    return ctx.load_input(parts[p], idx);
  };
  Expr body = load_part(parts.size() - 1);
  for (size_t p = parts.size() - 1; p-- > 0;) body = select(lt(iv[axis], offsets[p + 1]), load_part(p), body);
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, body));
  return stages;
}

// ---- Split -------------------------------------------------------------------------------

Result<std::vector<Expr>> split_sizes(const Node& n, const Expr& dim, size_t num_outputs, const SymbolBounds& bounds) {
  std::optional<std::vector<Expr>> split;
  if (has_input(n, 1)) {
    split = sym_values(n, 1);
    if (!split) return node_unsupported(n) << "split sizes are not known at compile time";
  } else if (n.has_attr("split")) {
    std::vector<Expr> v;
    for (int64_t s : n.attr_ints("split")) v.push_back(Expr(s));
    split = v;
  }
  if (split) {
    if (split->size() != num_outputs) {
      return node_invalid(n) << "split has " << split->size() << " entries for " << num_outputs << " outputs";
    }
    // The parts must tile the axis exactly: a larger sum would read out of bounds.
    Expr total = 0;
    for (const Expr& e : *split) {
      auto c = simplify(e, bounds).as_const();
      if (c && *c < 0) return node_invalid(n) << "negative split size " << *c;
      total = total + e;
    }
    if (!prove_equal(total, dim, bounds)) {
      // Not provably equal, not provably different (a traced split [1] of an
      // axis inferred as a data-dependent symbol): the caller runs the
      // runtime kernel, which checks the sum (kUnsupported marks this case).
      auto ct = simplify(total, bounds).as_const(), cd = simplify(dim, bounds).as_const();
      if (!(ct && cd))
        return node_unsupported(n) << "split sizes sum to " << print_expr(simplify(total, bounds)) << ", the axis has "
                                   << print_expr(simplify(dim, bounds));
      return node_invalid(n) << "split sizes sum to " << print_expr(simplify(total, bounds)) << ", the axis has "
                             << print_expr(simplify(dim, bounds));
    }
    return *split;
  }
  int64_t parts = n.attr_int("num_outputs", static_cast<int64_t>(num_outputs));
  if (parts <= 0 || static_cast<size_t>(parts) != num_outputs) {
    return node_invalid(n) << "num_outputs " << parts << " but " << num_outputs << " outputs";
  }
  std::vector<Expr> sizes;
  if (n.has_attr("num_outputs")) {
    // Opset 18: chunks of ceil(dim / parts); the last one takes the rest.
    Expr chunk = simplify(floordiv(dim + (parts - 1), Expr(parts)), bounds);
    for (int64_t k = 0; k + 1 < parts; ++k) sizes.push_back(chunk);
    sizes.push_back(simplify(dim - chunk * (parts - 1), bounds));
  } else {
    auto c = simplify(dim, bounds).as_const();
    if (c && *c % parts != 0) return node_invalid(n) << "dim " << *c << " does not split evenly into " << parts;
    for (int64_t k = 0; k < parts; ++k) sizes.push_back(simplify(floordiv(dim, Expr(parts)), bounds));
  }
  return sizes;
}

Status infer_split(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(x.size())));
  if (has_input(n, 1) && !sym_values(n, 1)) {
    for (size_t k = 0; k < n.num_outputs(); ++k) {
      Shape s = x;
      s[axis] = ctx.fresh_symbol();
      set_output(n, k, xt.dtype, std::move(s), ctx);
    }
    return Status::ok();
  }
  Result<std::vector<Expr>> checked = split_sizes(n, x[axis], n.num_outputs(), ctx.bounds);
  if (!checked.is_ok() && checked.status().code() == StatusCode::kUnsupported && (has_input(n, 1) || n.has_attr("split"))) {
    for (size_t k = 0; k < n.num_outputs(); ++k) {
      Shape s = x;
      s[axis] = ctx.fresh_symbol();
      set_output(n, k, xt.dtype, std::move(s), ctx);
    }
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Expr> sizes, std::move(checked));
  auto xv = n.input(0)->sym_value();
  Expr off = Expr(0);
  for (size_t k = 0; k < n.num_outputs(); ++k) {
    Shape s = x;
    s[axis] = sizes[k];
    set_output(n, k, xt.dtype, s, ctx);
    auto o = simplify(off).as_const();
    auto len = simplify(sizes[k], ctx.bounds).as_const();
    if (xv && x.size() == 1 && o && len && *o >= 0 && *len >= 0 && *o + *len <= static_cast<int64_t>(xv->size())) {
      set_sym(n, k, std::vector<Expr>(xv->begin() + *o, xv->begin() + *o + *len), ctx);
    }
    off = off + sizes[k];
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_split(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  std::vector<tir::ComputeDef> stages;
  Expr off = Expr(0);
  for (const tir::Buffer& y : ctx.outputs) {
    Expr len = y.shape[axis];
    if (!y.name.empty()) {
      std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
      std::vector<Expr> idx = axis_vars(axes);
      idx[axis] = idx[axis] + off;
      stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
    }
    off = simplify(off + len);
  }
  return stages;
}

// ---- Slice -------------------------------------------------------------------------------

// Ends past INT32_MAX (PyTorch exports INT64_MAX) mean "to the end"; starts or
// ends below -INT32_MAX "before the beginning".
constexpr int64_t kHuge = std::numeric_limits<int32_t>::max();

struct SliceParams {
  std::vector<int64_t> axes;
  std::vector<Expr> starts, ends;
  std::vector<int64_t> steps;
};

Result<SliceParams> slice_params(const Node& n, int64_t rank) {
  SliceParams p;
  if (has_input(n, 1)) {
    auto s = sym_values(n, 1);
    auto e = sym_values(n, 2);
    if (!s || !e) return node_unsupported(n) << "starts/ends are not known at compile time";
    p.starts = *s;
    p.ends = *e;
    if (has_input(n, 3)) {
      auto a = const_ints(n, 3);
      if (!a) return node_unsupported(n) << "axes are not known at compile time";
      p.axes = *a;
    }
    if (has_input(n, 4)) {
      auto st = const_ints(n, 4);
      if (!st) return node_unsupported(n) << "steps are not known at compile time";
      p.steps = *st;
    }
  } else {
    for (int64_t v : n.attr_ints("starts")) p.starts.push_back(Expr(v));
    for (int64_t v : n.attr_ints("ends")) p.ends.push_back(Expr(v));
    p.axes = n.attr_ints("axes");
  }
  size_t count = p.starts.size();
  if (p.ends.size() != count) return node_invalid(n) << "starts and ends differ in length";
  if (p.axes.empty()) {
    for (size_t k = 0; k < count; ++k) p.axes.push_back(static_cast<int64_t>(k));
  }
  if (p.steps.empty()) p.steps.assign(count, 1);
  if (p.axes.size() != count || p.steps.size() != count) return node_invalid(n) << "axes/steps length mismatch";
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (size_t k = 0; k < count; ++k) {
    KILN_ASSIGN_OR_RETURN(p.axes[k], normalize_axis(n, p.axes[k], rank));
    if (p.steps[k] == 0) return node_invalid(n) << "step 0";
    if (seen[static_cast<size_t>(p.axes[k])]) return node_invalid(n) << "axis " << p.axes[k] << " repeated";
    seen[static_cast<size_t>(p.axes[k])] = true;
  }
  return p;
}

struct SliceDim {
  Expr start;   // first input index read (in range when length > 0)
  Expr length;  // output extent
  int64_t step = 1;
};

// Clamping per the spec: negative values count from the end; then starts are
// clamped to [0, d] ([0, d-1] for negative steps) and ends to [0, d] ([-1, d-1]).
Result<SliceDim> slice_dim(const Node& n, const Expr& d, const Expr& start, const Expr& end, int64_t step,
                           const SymbolBounds& bounds) {
  enum class Where { kValue, kPastEnd, kBeforeBegin };
  auto normalize = [&](const Expr& v, Where& where) -> Result<Expr> {
    Expr e = simplify(v, bounds);
    where = Where::kValue;
    if (auto c = e.as_const()) {
      if (*c >= kHuge) where = Where::kPastEnd;
      if (*c <= -kHuge) where = Where::kBeforeBegin;
      return *c < 0 ? simplify(d + *c, bounds) : e;
    }
    Interval b = bound_of(e, bounds);
    if (b.lo && *b.lo >= 0) return e;
    if (b.hi && *b.hi < 0) return simplify(d + e, bounds);
    return node_unsupported(n) << "slice bound " << print_expr(e) << " has an unknown sign";
  };
  Where ws, we;
  KILN_ASSIGN_OR_RETURN(Expr s, normalize(start, ws));
  KILN_ASSIGN_OR_RETURN(Expr e, normalize(end, we));
  SliceDim r;
  r.step = step;
  if (step > 0) {
    s = ws == Where::kPastEnd ? d : ws == Where::kBeforeBegin ? Expr(0) : min(max(s, Expr(0)), d);
    e = we == Where::kPastEnd ? d : we == Where::kBeforeBegin ? Expr(0) : min(max(e, Expr(0)), d);
    r.length = max(Expr(0), floordiv(e - s + (step - 1), Expr(step)));
  } else {
    s = ws == Where::kPastEnd ? d - 1 : ws == Where::kBeforeBegin ? Expr(-1) : min(max(s, Expr(0)), d - 1);
    e = we == Where::kPastEnd ? d - 1 : we == Where::kBeforeBegin ? Expr(-1) : min(max(e, Expr(-1)), d - 1);
    r.length = max(Expr(0), floordiv(s - e + (-step - 1), Expr(-step)));
  }
  r.start = simplify(s, bounds);
  r.length = simplify(r.length, bounds);
  return r;
}

Status infer_slice(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (!inputs_known(n, 1, 5)) {
    set_data_dependent_output(n, 0, xt.dtype, static_cast<int64_t>(x.size()), ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(SliceParams p, slice_params(n, static_cast<int64_t>(x.size())));
  Shape out = x;
  std::vector<SliceDim> dims(x.size());
  for (size_t k = 0; k < x.size(); ++k) dims[k] = SliceDim{Expr(0), x[k], 1};
  for (size_t k = 0; k < p.axes.size(); ++k) {
    int64_t a = p.axes[k];
    Result<SliceDim> sd = slice_dim(n, x[a], p.starts[k], p.ends[k], p.steps[k], ctx.bounds);
    if (!sd.is_ok() && sd.status().code() == StatusCode::kUnsupported) {
      // A bound whose sign the bounds cannot settle (Faster R-CNN's anchor
      // count 15*(a + 1)*(b + 1) over floor divisions that may be -1): the
      // slice runs its runtime kernel, which clamps the values it is given.
      set_data_dependent_output(n, 0, xt.dtype, static_cast<int64_t>(x.size()), ctx);
      return Status::ok();
    }
    KILN_ASSIGN_OR_RETURN(dims[a], std::move(sd));
    out[a] = dims[a].length;
  }
  set_output(n, 0, xt.dtype, out, ctx);
  auto xv = n.input(0)->sym_value();
  if (xv && x.size() == 1) {
    auto s = dims[0].start.as_const();
    auto len = simplify(dims[0].length, ctx.bounds).as_const();
    if (s && len) {
      std::vector<Expr> vals;
      for (int64_t i = 0; i < *len; ++i) vals.push_back((*xv)[*s + i * dims[0].step]);
      set_sym(n, 0, vals, ctx);
    }
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_slice(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  // Starts and ends come from the lowering context's constants / sym_values.
  SliceParams p;
  auto values_of = [&](size_t i) -> std::optional<std::vector<Expr>> {
    if (i < ctx.sym_values.size() && ctx.sym_values[i]) return ctx.sym_values[i];
    if (i < ctx.constants.size() && ctx.constants[i] != nullptr) {
      std::vector<Expr> v;
      for (int64_t k = 0; k < ctx.constants[i]->numel(); ++k) v.push_back(Expr(ctx.constants[i]->get_i64(k)));
      return v;
    }
    return std::nullopt;
  };
  int64_t rank = static_cast<int64_t>(x.shape.size());
  if (has_input(n, 1)) {
    auto s = values_of(1), e = values_of(2);
    if (!s || !e) return node_unsupported(n) << "starts/ends are not known at compile time";
    p.starts = *s;
    p.ends = *e;
    auto to_ints = [&](size_t i, std::vector<int64_t>& out) -> Status {
      if (!has_input(n, i)) return Status::ok();
      auto v = values_of(i);
      if (!v) return node_unsupported(n) << "input " << i << " is not known at compile time";
      for (const Expr& e2 : *v) {
        auto c = simplify(e2).as_const();
        if (!c) return node_unsupported(n) << "input " << i << " is not constant";
        out.push_back(*c);
      }
      return Status::ok();
    };
    KILN_RETURN_IF_ERROR(to_ints(3, p.axes));
    KILN_RETURN_IF_ERROR(to_ints(4, p.steps));
    if (p.axes.empty()) {
      for (size_t k = 0; k < p.starts.size(); ++k) p.axes.push_back(static_cast<int64_t>(k));
    }
    if (p.steps.empty()) p.steps.assign(p.starts.size(), 1);
    for (int64_t& a : p.axes) {
      if (a < 0) a += rank;
    }
  } else {
    KILN_ASSIGN_OR_RETURN(p, slice_params(n, rank));
  }
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> idx = axis_vars(axes);
  for (size_t k = 0; k < p.axes.size(); ++k) {
    int64_t a = p.axes[k];
    KILN_ASSIGN_OR_RETURN(SliceDim sd, slice_dim(n, x.shape[a], p.starts[k], p.ends[k], p.steps[k], ctx.bounds));
    idx[a] = sd.start + idx[a] * sd.step;
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
  return stages;
}

// ---- Expand, Tile ------------------------------------------------------------------------

Status infer_expand(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  auto target = sym_values(n, 1);
  if (!target) {
    auto len = static_length(n, 1);
    if (!len) {
      set_output_unknown_rank(n, 0, xt.dtype);
      return Status::ok();
    }
    Shape out;
    for (int64_t k = 0; k < std::max<int64_t>(*len, static_cast<int64_t>(x.size())); ++k) {
      out.push_back(ctx.fresh_symbol());
    }
    set_output(n, 0, xt.dtype, std::move(out), ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Shape out, broadcast_all(n, {x, *target}, ctx.bounds));
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_expand(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, load_broadcast(ctx, 0, iv, y.shape)));
  return stages;
}

Status infer_tile(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  auto reps = sym_values(n, 1);
  Shape out;
  if (reps && reps->size() != x.size()) return node_invalid(n) << "repeats has the wrong length";
  for (size_t k = 0; k < x.size(); ++k) out.push_back(reps ? x[k] * (*reps)[k] : ctx.fresh_symbol());
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_tile(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> idx = axis_vars(axes);
  for (size_t k = 0; k < idx.size(); ++k) {
    if (!prove_equal(x.shape[k], y.shape[k])) idx[k] = mod(idx[k], x.shape[k]);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, ctx.load_input(0, idx)));
  return stages;
}

// ---- ConstantOfShape, Range ---------------------------------------------------------------

Tensor constant_of_shape_value(const Node& n) {
  const Attribute* a = n.attr("value");
  if (a != nullptr && a->kind == Attribute::Kind::kTensor && a->t.defined()) return a->t;
  return Tensor(DType::kFloat32, {1});
}

Status infer_constant_of_shape(Node& n, InferContext& ctx) {
  Tensor value = constant_of_shape_value(n);
  if (value.numel() != 1) return node_invalid(n) << "value must have one element";
  auto target = sym_values(n, 0);
  Shape out;
  if (target) {
    out = *target;
  } else {
    auto len = static_length(n, 0);
    if (!len) {
      set_output_unknown_rank(n, 0, value.dtype());
      return Status::ok();
    }
    for (int64_t k = 0; k < *len; ++k) out.push_back(ctx.fresh_symbol());
  }
  if (out.size() <= 1 && dtype_is_int(value.dtype())) {
    auto len = out.empty() ? std::optional<int64_t>(1) : simplify(out[0], ctx.bounds).as_const();
    if (len && *len >= 0 && *len <= static_cast<int64_t>(kMaxSymElements)) {
      set_sym(n, 0, std::vector<Expr>(static_cast<size_t>(*len), Expr(value.get_i64(0))), ctx);
    }
  }
  set_output(n, 0, value.dtype(), std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_constant_of_shape(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& y = ctx.outputs[0];
  Tensor value = constant_of_shape_value(n);
  if (!dtype_is_compilable(value.dtype())) return node_unsupported(n) << "value dtype " << dtype_name(value.dtype());
  Expr v = dtype_is_int(value.dtype()) ? int_imm(value.get_i64(0), value.dtype()) : const_of(value.dtype(), value.get_f64(0));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, v));
  return stages;
}

// The length of Range(start, limit, delta) when it is known: from constant
// inputs, or for integer ranges from symbolic start/limit and a constant delta.
std::optional<Expr> range_length(const Node& n, DType dt, const SymbolBounds& bounds) {
  auto s = const_scalar(n, 0), l = const_scalar(n, 1), d = const_scalar(n, 2);
  if (s && l && d && *d != 0) {
    return Expr(std::max<int64_t>(0, static_cast<int64_t>(std::ceil((*l - *s) / *d))));
  }
  if (!dtype_is_int(dt) || !d || *d == 0) return std::nullopt;
  auto sv = sym_values(n, 0), lv = sym_values(n, 1);
  if (!sv || !lv || sv->size() != 1 || lv->size() != 1) return std::nullopt;
  int64_t delta = static_cast<int64_t>(*d);
  Expr span = delta > 0 ? (*lv)[0] - (*sv)[0] : (*sv)[0] - (*lv)[0];
  int64_t step = delta > 0 ? delta : -delta;
  return simplify(max(Expr(0), floordiv(span + (step - 1), Expr(step))), bounds);
}

Status infer_range(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType st, input_type(n, 0));
  auto len = range_length(n, st.dtype, ctx.bounds);
  Expr length = len ? *len : ctx.fresh_symbol();
  set_output(n, 0, st.dtype, {length}, ctx);
  if (len && dtype_is_int(st.dtype)) {
    auto c = len->as_const();
    auto sv = sym_values(n, 0);
    auto d = const_scalar(n, 2);
    if (c && sv && sv->size() == 1 && d && *c <= static_cast<int64_t>(kMaxSymElements)) {
      std::vector<Expr> vals;
      for (int64_t i = 0; i < *c; ++i) vals.push_back((*sv)[0] + i * static_cast<int64_t>(*d));
      set_sym(n, 0, vals, ctx);
    }
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_range(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  std::vector<std::string> axes = fresh_axes(ctx, 1, "i");
  DType dt = y.dtype;
  Expr body = ctx.load_input(0, {}) + cast_if_needed(dt, var(axes[0])) * ctx.load_input(2, {});
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, dt, axes, y.shape, body));
  return stages;
}

Result<RuntimeKernel> range_kernel(const Node& n) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.size() != 3) return invalid_argument() << "Range needs 3 inputs";
    DType dt = in[0].dtype();
    out.resize(1);
    if (dtype_is_int(dt)) {
      int64_t s = in[0].get_i64(0), l = in[1].get_i64(0), d = in[2].get_i64(0);
      if (d == 0) return invalid_argument() << "Range with delta 0";
      // In 128 bits: limit - start and the rounding overflow 64 (a file's INT64_MAX).
      const __int128 span = static_cast<__int128>(l) - s, step = d;
      __int128 len128 = 0;
      if (d > 0 && span > 0) len128 = (span + step - 1) / step;
      if (d < 0 && span < 0) len128 = (-span - step - 1) / -step;
      if (len128 > std::numeric_limits<int64_t>::max())
        return invalid_argument() << "Range from " << s << " to " << l << " by " << d << " has too many elements";
      const int64_t len = static_cast<int64_t>(len128);
      KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(dt, {len}));
      for (int64_t i = 0; i < len; ++i) {
        int64_t v = s + i * d;
        switch (dtype_size(dt)) {
          case 1: out[0].data_as<int8_t>()[i] = static_cast<int8_t>(v); break;
          case 2: out[0].data_as<int16_t>()[i] = static_cast<int16_t>(v); break;
          case 4: out[0].data_as<int32_t>()[i] = static_cast<int32_t>(v); break;
          default: out[0].data_as<int64_t>()[i] = v; break;
        }
      }
      return Status::ok();
    }
    double s = in[0].get_f64(0), l = in[1].get_f64(0), d = in[2].get_f64(0);
    if (d == 0) return invalid_argument() << "Range with delta 0";
    int64_t len = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((l - s) / d)));
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(dt, {len}));
    for (int64_t i = 0; i < len; ++i) out[0].set_f64(i, s + static_cast<double>(i) * d);
    return Status::ok();
  });
}

// ---- Pad -----------------------------------------------------------------------------------

struct PadParams {
  std::vector<Expr> begin, end;  // per dim
  std::string mode;
};

Result<PadParams> pad_params(const Node& n, size_t rank, const std::function<std::optional<std::vector<Expr>>(size_t)>& values) {
  PadParams p;
  p.mode = n.attr_string("mode", "constant");
  if (p.mode != "constant" && p.mode != "reflect" && p.mode != "edge" && p.mode != "wrap") {
    return node_unsupported(n) << "mode '" << p.mode << "'";
  }
  std::vector<Expr> pads;
  if (has_input(n, 1)) {
    auto v = values(1);
    if (!v) return node_unsupported(n) << "pads are not known at compile time";
    pads = *v;
  } else {
    for (int64_t v : n.attr_ints("pads")) pads.push_back(Expr(v));
  }
  std::vector<int64_t> axes;
  if (has_input(n, 3)) {
    auto v = values(3);
    if (!v) return node_unsupported(n) << "axes are not known at compile time";
    for (const Expr& e : *v) {
      auto c = simplify(e).as_const();
      if (!c) return node_unsupported(n) << "axes are not constant";
      KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(n, *c, static_cast<int64_t>(rank)));
      axes.push_back(a);
    }
  } else {
    for (size_t k = 0; k < rank; ++k) axes.push_back(static_cast<int64_t>(k));
  }
  if (pads.size() != 2 * axes.size()) {
    return node_invalid(n) << "pads has " << pads.size() << " entries, expected " << 2 * axes.size();
  }
  p.begin.assign(rank, Expr(0));
  p.end.assign(rank, Expr(0));
  for (size_t k = 0; k < axes.size(); ++k) {
    p.begin[axes[k]] = pads[k];
    p.end[axes[k]] = pads[k + axes.size()];
  }
  return p;
}

Status infer_pad(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (!inputs_known(n, 1, 2) || !inputs_known(n, 3, 4)) {
    set_data_dependent_output(n, 0, xt.dtype, static_cast<int64_t>(x.size()), ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(PadParams p, pad_params(n, x.size(), [&](size_t i) { return sym_values(n, i); }));
  Shape out;
  for (size_t k = 0; k < x.size(); ++k) out.push_back(x[k] + p.begin[k] + p.end[k]);
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_pad(const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(require_dims_from_inputs(n, ctx));
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  auto values = [&](size_t i) -> std::optional<std::vector<Expr>> {
    if (i < ctx.sym_values.size() && ctx.sym_values[i]) return ctx.sym_values[i];
    if (i < ctx.constants.size() && ctx.constants[i] != nullptr) {
      std::vector<Expr> v;
      for (int64_t k = 0; k < ctx.constants[i]->numel(); ++k) v.push_back(Expr(ctx.constants[i]->get_i64(k)));
      return v;
    }
    return std::nullopt;
  };
  KILN_ASSIGN_OR_RETURN(PadParams p, pad_params(n, x.shape.size(), values));
  std::vector<std::string> axes = fresh_axes(ctx, y.shape.size(), "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<Expr> idx;
  Expr valid;
  for (size_t k = 0; k < iv.size(); ++k) {
    Expr d = x.shape[k];
    Expr pos = iv[k] - p.begin[k];
    auto pb = simplify(p.begin[k]).as_const(), pe = simplify(p.end[k]).as_const();
    bool unpadded = pb && pe && *pb <= 0 && *pe <= 0;  // cropping only: always in range
    if (unpadded) {
      idx.push_back(pos);
    } else if (p.mode == "constant") {
      Expr ok = logical_and(le(Expr(0), pos), lt(pos, d));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      idx.push_back(clamp_index(pos, d));
    } else if (p.mode == "edge") {
      idx.push_back(clamp_index(pos, d));
    } else if (p.mode == "wrap") {
      idx.push_back(mod(pos, d));
    } else {
      // reflect (pads < d): |pos| folds the front, (d-1) - |(d-1) - |pos|| the back.
      Expr a = max(pos, Expr(0) - pos);
      Expr last = d - 1;
      Expr r = last - max(last - a, a - last);
      idx.push_back(clamp_index(r, d));
    }
  }
  Expr body = ctx.load_input(0, idx);
  if (valid.defined()) {
    Expr fill = const_of(y.dtype, n.attr_float("value", 0.0));
    if (has_input(n, 2)) fill = cast_if_needed(y.dtype, ctx.load_input(2, {}));
    body = select(valid, body, fill);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, body));
  return stages;
}

// ---- Runtime kernels ---------------------------------------------------------------------
//
// For nodes whose shape-like inputs (starts, pads, repeats, a target shape,
// split sizes, axes) are only known at run time: the output shape is
// data-dependent, so these run as C++ kernels with the same semantics as the
// lowerings above. Elements are copied bytewise (any fixed-size dtype).

std::vector<int64_t> row_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

// Calls f(flat, idx) for every element of `shape`, in row-major order.
template <typename F>
void for_each_index(const std::vector<int64_t>& shape, F&& f) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t e = 0; e < total; ++e) {
    f(e, idx);
    for (size_t k = shape.size(); k-- > 0;) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
}

void copy_element(Tensor& dst, int64_t di, const Tensor& src, int64_t si) {
  int64_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.data()) + di * es, static_cast<const char*>(src.data()) + si * es,
              static_cast<size_t>(es));
}

bool present(const std::vector<Tensor>& in, size_t i) { return i < in.size() && in[i].defined(); }

std::vector<int64_t> tensor_ints(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_i64(i));
  return v;
}

Status check_fixed_size(const std::string& who, const Tensor& t) {
  if (t.dtype() == DType::kString) return unsupported() << who << ": string tensors";
  return Status::ok();
}

// Axes given at run time, normalized into [0, rank).
Result<std::vector<int64_t>> runtime_axes(const std::string& who, std::vector<int64_t> axes, int64_t rank) {
  for (int64_t& a : axes) {
    if (a < -rank || a >= rank) return invalid_argument() << who << ": axis " << a << " out of range";
    if (a < 0) a += rank;
  }
  std::vector<int64_t> sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return invalid_argument() << who << ": axes " << shape_to_string(axes) << " repeat an axis";
  return axes;
}

Result<RuntimeKernel> slice_kernel(const Node& n) {
  std::string who = n.describe();
  std::vector<int64_t> attr_starts = n.attr_ints("starts"), attr_ends = n.attr_ints("ends"),
                       attr_axes = n.attr_ints("axes");
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_fixed_size(who, x));
    bool from_inputs = present(in, 1);
    std::vector<int64_t> starts = from_inputs ? tensor_ints(in[1]) : attr_starts;
    std::vector<int64_t> ends = from_inputs ? tensor_ints(in[2]) : attr_ends;
    std::vector<int64_t> axes = from_inputs ? (present(in, 3) ? tensor_ints(in[3]) : std::vector<int64_t>{}) : attr_axes;
    std::vector<int64_t> steps = from_inputs && present(in, 4) ? tensor_ints(in[4]) : std::vector<int64_t>{};
    if (axes.empty()) {
      for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
    }
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
      return invalid_argument() << who << ": starts, ends, axes and steps differ in length";
    }
    KILN_ASSIGN_OR_RETURN(axes, runtime_axes(who, axes, x.rank()));
    std::vector<int64_t> first(static_cast<size_t>(x.rank()), 0), step(static_cast<size_t>(x.rank()), 1);
    std::vector<int64_t> shape = x.shape();
    for (size_t k = 0; k < axes.size(); ++k) {
      int64_t a = axes[k], d = x.shape()[a], st = steps[k];
      if (st == 0) return invalid_argument() << who << ": step 0";
      int64_t b = starts[k] < 0 ? starts[k] + d : starts[k];
      int64_t e = ends[k] < 0 ? ends[k] + d : ends[k];
      int64_t len;
      if (st > 0) {
        b = std::clamp<int64_t>(b, 0, d);
        e = std::clamp<int64_t>(e, 0, d);
        len = e > b ? (e - b + st - 1) / st : 0;
      } else {
        b = std::clamp<int64_t>(b, 0, d - 1);
        e = std::clamp<int64_t>(e, -1, d - 1);
        len = b > e ? (b - e - st - 1) / -st : 0;
      }
      first[a] = b;
      step[a] = st;
      shape[a] = len;
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    std::vector<int64_t> xs = row_strides(x.shape());
    for_each_index(shape, [&](int64_t e, const std::vector<int64_t>& idx) {
      int64_t src = 0;
      for (size_t k = 0; k < idx.size(); ++k) src += (first[k] + idx[k] * step[k]) * xs[k];
      copy_element(out[0], e, x, src);
    });
    return Status::ok();
  });
}

Result<RuntimeKernel> pad_kernel(const Node& n) {
  std::string who = n.describe();
  std::string mode = n.attr_string("mode", "constant");
  std::vector<int64_t> attr_pads = n.attr_ints("pads");
  double attr_value = n.attr_float("value", 0.0);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_fixed_size(who, x));
    int64_t rank = x.rank();
    std::vector<int64_t> pads = present(in, 1) ? tensor_ints(in[1]) : attr_pads;
    std::vector<int64_t> axes;
    if (present(in, 3)) {
      KILN_ASSIGN_OR_RETURN(axes, runtime_axes(who, tensor_ints(in[3]), rank));
    } else {
      for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
    }
    if (pads.size() != 2 * axes.size()) return invalid_argument() << who << ": pads has the wrong length";
    std::vector<int64_t> begin(static_cast<size_t>(rank), 0), shape = x.shape();
    for (size_t k = 0; k < axes.size(); ++k) {
      begin[axes[k]] = pads[k];
      shape[axes[k]] += pads[k] + pads[k + axes.size()];
      if (shape[axes[k]] < 0) return invalid_argument() << who << ": pads crop more than the dim";
    }
    Tensor fill(x.dtype(), {1});
    if (present(in, 2) && in[2].numel() == 1) {
      copy_element(fill, 0, in[2], 0);
    } else if (x.dtype() != DType::kBool && dtype_is_compilable(x.dtype())) {
      fill.set_f64(0, attr_value);
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    Tensor& y = out[0];
    if (y.numel() == 0) return Status::ok();
    if (rank == 0) {
      copy_elements(y, 0, x, 0, 1);
      return Status::ok();
    }
    // Per axis, the source index of each output index (-1: the fill value).
    std::vector<std::vector<int64_t>> from(static_cast<size_t>(rank));
    for (int64_t k = 0; k < rank; ++k) {
      int64_t d = x.shape()[k];
      for (int64_t i = 0; i < shape[k]; ++i) {
        int64_t p = i - begin[k];
        if (p < 0 || p >= d) {
          if (mode == "constant" || d == 0) {
            p = -1;
          } else if (mode == "edge") {
            p = std::clamp<int64_t>(p, 0, d - 1);
          } else if (mode == "wrap") {
            p = ((p % d) + d) % d;
          } else {
            int64_t period = 2 * (d - 1);
            p = period == 0 ? 0 : ((p % period) + period) % period;
            if (p >= d) p = period - p;
          }
        }
        from[k].push_back(p);
      }
    }
    // Output rows along the last axis: a row whose outer indices read the
    // fill is the fill; the others are runs of consecutive source elements
    // (one copy each: the whole interior of a constant pad) and of the fill.
    const int64_t inner = shape[rank - 1];
    const std::vector<int64_t>& last = from.back();
    KILN_ASSIGN_OR_RETURN(Tensor fill_row, Tensor::allocate(x.dtype(), {inner}));
    for (int64_t j = 0; j < inner; ++j) copy_elements(fill_row, j, fill, 0, 1);
    std::vector<int64_t> xs = row_strides(x.shape());
    std::vector<int64_t> idx(static_cast<size_t>(rank - 1), 0);
    for (int64_t row = 0, rows = y.numel() / inner; row < rows; ++row) {
      int64_t src = 0;
      bool inside = true;
      for (size_t k = 0; k < idx.size(); ++k) {
        int64_t p = from[k][idx[k]];
        inside = inside && p >= 0;
        src += p * xs[k];
      }
      if (!inside) {
        copy_elements(y, row * inner, fill_row, 0, inner);
      } else {
        for (int64_t j = 0; j < inner;) {
          int64_t e = j + 1;
          if (last[j] < 0) {
            while (e < inner && last[e] < 0) ++e;
            copy_elements(y, row * inner + j, fill_row, 0, e - j);
          } else {
            while (e < inner && last[e] == last[e - 1] + 1) ++e;
            copy_elements(y, row * inner + j, x, src + last[j], e - j);
          }
          j = e;
        }
      }
      for (size_t k = idx.size(); k-- > 0;) {
        if (++idx[k] < shape[k]) break;
        idx[k] = 0;
      }
    }
    return Status::ok();
  });
}

Result<RuntimeKernel> split_kernel(const Node& n) {
  std::string who = n.describe();
  int64_t axis_attr = n.attr_int("axis", 0);
  std::vector<int64_t> attr_split = n.attr_ints("split");
  int64_t num_outputs = n.attr_int("num_outputs", 0);
  size_t outputs = n.num_outputs();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_fixed_size(who, x));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ax, runtime_axes(who, {axis_attr}, x.rank()));
    int64_t axis = ax[0], d = x.shape()[axis];
    std::vector<int64_t> sizes = present(in, 1) ? tensor_ints(in[1]) : attr_split;
    if (sizes.empty()) {
      int64_t parts = static_cast<int64_t>(outputs);
      int64_t chunk = num_outputs > 0 ? (d + parts - 1) / parts : d / parts;
      for (int64_t k = 0; k < parts; ++k) sizes.push_back(std::min(chunk, d - k * chunk));
    }
    int64_t total = 0;
    for (int64_t v : sizes) total += v;
    if (sizes.size() != outputs || total != d) return invalid_argument() << who << ": split sizes do not match";
    out.resize(outputs);
    std::vector<int64_t> xs = row_strides(x.shape());
    int64_t off = 0;
    for (size_t o = 0; o < outputs; ++o) {
      std::vector<int64_t> shape = x.shape();
      shape[axis] = sizes[o];
      KILN_ASSIGN_OR_RETURN(out[o], Tensor::allocate(x.dtype(), shape));
      for_each_index(shape, [&](int64_t e, const std::vector<int64_t>& idx) {
        int64_t src = 0;
        for (size_t k = 0; k < idx.size(); ++k) src += (idx[k] + (static_cast<int64_t>(k) == axis ? off : 0)) * xs[k];
        copy_element(out[o], e, x, src);
      });
      off += sizes[o];
    }
    return Status::ok();
  });
}

// Expand and Tile: out[idx] = x[idx mapped per dim] with a computed output shape.
Result<RuntimeKernel> expand_kernel(const Node& n) {
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_fixed_size(who, x));
    std::vector<int64_t> target = tensor_ints(in[1]);
    size_t rank = std::max(target.size(), x.shape().size());
    std::vector<int64_t> shape(rank), xd(rank, 1);
    for (size_t k = 0; k < x.shape().size(); ++k) xd[rank - x.shape().size() + k] = x.shape()[k];
    for (size_t k = 0; k < rank; ++k) {
      int64_t t = k + target.size() >= rank ? target[k + target.size() - rank] : 1;
      if (xd[k] != t && xd[k] != 1 && t != 1) return invalid_argument() << who << ": cannot broadcast";
      shape[k] = xd[k] == 1 ? t : xd[k];
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    std::vector<int64_t> xs = row_strides(xd);
    for_each_index(shape, [&](int64_t e, const std::vector<int64_t>& idx) {
      int64_t src = 0;
      for (size_t k = 0; k < rank; ++k) src += (xd[k] == 1 ? 0 : idx[k]) * xs[k];
      copy_element(out[0], e, x, src);
    });
    return Status::ok();
  });
}

Result<RuntimeKernel> tile_kernel(const Node& n) {
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_fixed_size(who, x));
    std::vector<int64_t> reps = tensor_ints(in[1]);
    if (static_cast<int64_t>(reps.size()) != x.rank()) return invalid_argument() << who << ": repeats has the wrong length";
    std::vector<int64_t> shape = x.shape();
    for (size_t k = 0; k < shape.size(); ++k) {
      if (reps[k] < 0) return invalid_argument() << who << ": negative repeat";
      shape[k] *= reps[k];
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    std::vector<int64_t> xs = row_strides(x.shape());
    for_each_index(shape, [&](int64_t e, const std::vector<int64_t>& idx) {
      int64_t src = 0;
      for (size_t k = 0; k < idx.size(); ++k) src += (idx[k] % x.shape()[k]) * xs[k];
      copy_element(out[0], e, x, src);
    });
    return Status::ok();
  });
}

Result<RuntimeKernel> constant_of_shape_kernel(const Node& n) {
  Tensor value = constant_of_shape_value(n);
  std::string who = n.describe();
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_RETURN_IF_ERROR(check_fixed_size(who, value));
    std::vector<int64_t> shape = tensor_ints(in[0]);
    for (int64_t d : shape) {
      if (d < 0) return invalid_argument() << who << ": negative dim " << d;
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(value.dtype(), shape));
    for (int64_t e = 0; e < out[0].numel(); ++e) copy_element(out[0], e, value, 0);
    return Status::ok();
  });
}

// Reshape, Squeeze, Unsqueeze with run-time shape or axes: the same storage
// under the new shape.
Result<RuntimeKernel> reshape_kernel(const Node& n) {
  std::string who = n.describe();
  std::string op = n.op_type();
  bool allow_zero = n.attr_int("allowzero", 0) != 0;
  std::vector<int64_t> attr_axes = n.attr_ints("axes");
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    std::vector<int64_t> shape;
    if (op == "Reshape") {
      std::vector<int64_t> target = tensor_ints(in[1]);
      int64_t known = 1, infer_at = -1;
      for (size_t k = 0; k < target.size(); ++k) {
        int64_t v = target[k];
        if (v == 0 && !allow_zero) {
          if (static_cast<int64_t>(k) >= x.rank()) return invalid_argument() << who << ": 0 without an input dim";
          v = x.shape()[k];
        } else if (v == -1) {
          infer_at = static_cast<int64_t>(k);
          v = 1;
        } else if (v < 0) {
          return invalid_argument() << who << ": invalid shape entry " << v;
        }
        known *= v;
        shape.push_back(v);
      }
      if (infer_at >= 0) {
        if (known == 0 || x.numel() % known != 0) return invalid_argument() << who << ": cannot infer -1";
        shape[infer_at] = x.numel() / known;
      }
    } else {
      std::vector<int64_t> axes = present(in, 1) ? tensor_ints(in[1]) : attr_axes;
      if (op == "Squeeze") {
        KILN_ASSIGN_OR_RETURN(axes, runtime_axes(who, axes, x.rank()));
        for (int64_t k = 0; k < x.rank(); ++k) {
          bool listed = std::find(axes.begin(), axes.end(), k) != axes.end();
          if (axes.empty() ? x.shape()[k] != 1 : !listed) shape.push_back(x.shape()[k]);
        }
      } else {
        int64_t rank = x.rank() + static_cast<int64_t>(axes.size());
        KILN_ASSIGN_OR_RETURN(axes, runtime_axes(who, axes, rank));
        size_t next = 0;
        for (int64_t k = 0; k < rank; ++k) {
          bool listed = std::find(axes.begin(), axes.end(), k) != axes.end();
          shape.push_back(listed ? 1 : x.shape()[next++]);
        }
      }
    }
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    if (count != x.numel()) {
      return invalid_argument() << who << ": cannot reshape " << x.describe() << " to " << shape_to_string(shape);
    }
    out.resize(1);
    out[0] = x.reshaped(shape);
    return Status::ok();
  });
}

// ---- gradient rules (ops/gradient.h) ----

// Views and reshapes: dy given x's shape.
Status grad_reshape(GradBuilder& b) {
  if (!b.wants(0)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Value* g, b.reshape_like(b.output_grad(0), b.node().input(0)));
  return b.set_input_grad(0, g);
}

// Transpose: dy through the inverse permutation.
Status grad_transpose(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  const int64_t rank = n.input(0)->type().rank();
  if (rank < 0) return node_unsupported(n) << "the gradient of a Transpose of unknown rank";
  std::vector<int64_t> perm = n.attr_ints("perm");
  if (perm.empty())
    for (int64_t a = rank - 1; a >= 0; --a) perm.push_back(a);
  std::vector<int64_t> inverse(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inverse[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Transpose", {b.output_grad(0)}, {{"perm", Attribute::of_ints(inverse)}}));
  return b.set_input_grad(0, g);
}

// Concat: dy split along the axis into the inputs' extents.
Status grad_concat(GradBuilder& b) {
  const Node& n = b.node();
  const int64_t rank = n.output(0)->type().rank();
  if (rank < 0) return node_unsupported(n) << "the gradient of a Concat of unknown rank";
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  std::vector<int64_t> sizes;
  bool all_static = true;
  for (const Value* in : n.inputs()) {
    auto c = in->type().has_shape() ? (*in->type().shape)[static_cast<size_t>(axis)].as_const() : std::nullopt;
    all_static &= c.has_value();
    sizes.push_back(c.value_or(-1));
  }
  std::map<std::string, Attribute> attrs = {{"axis", Attribute::of_int(axis)}};
  std::vector<Value*> inputs = {b.output_grad(0)};
  if (b.opset() > 0 && b.opset() < 13) {
    if (!all_static) return node_unsupported(n) << "the gradient of a Concat of symbolic extents before opset 13";
    attrs["split"] = Attribute::of_ints(sizes);
  } else if (all_static) {
    inputs.push_back(b.ints(sizes));
  } else {
    std::vector<Value*> parts;
    for (Value* in : n.inputs()) {
      KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {in}));
      KILN_ASSIGN_OR_RETURN(Value* extent, b.add1("Gather", {shape, b.ints({axis})}));
      parts.push_back(extent);
    }
    KILN_ASSIGN_OR_RETURN(Value* split, b.add1("Concat", parts, {{"axis", Attribute::of_int(0)}}));
    inputs.push_back(split);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> pieces, b.add("Split", inputs, attrs, n.num_inputs()));
  for (size_t i = 0; i < n.num_inputs(); ++i) KILN_RETURN_IF_ERROR(b.set_input_grad(i, pieces[i]));
  return Status::ok();
}

// Slice with constant starts, ends, axes and steps on static shapes: dy
// put back at the positions the slice read, zeros elsewhere. Per axis with
// a step other than 1: dy reversed where the step is negative, then spread
// with |step| - 1 zeros after each element (Reshape, Pad, Reshape, less the
// last element's trailing zeros); then one Pad with zeros up to the input's
// extent, before the lowest position read.
Status grad_slice(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* x = n.input(0);
  Value* y = n.output(0);
  if (!x->type().is_static() || !y->type().is_static() || n.num_inputs() < 3)
    return node_unsupported(n) << "the gradient of a Slice with symbolic shapes or attribute bounds (not yet)";
  const std::vector<int64_t> xs = x->type().static_shape();
  std::vector<int64_t> cur = y->type().static_shape();
  const int64_t rank = static_cast<int64_t>(xs.size());
  auto ints_of = [&](size_t i) -> std::optional<std::vector<int64_t>> {
    if (!has_input(n, i)) return std::nullopt;
    return const_ints(n, i);
  };
  auto starts = ints_of(1), ends = ints_of(2);
  if (!starts || !ends) return node_unsupported(n) << "the gradient of a Slice with bounds known only at run time";
  std::vector<int64_t> axes(starts->size());
  for (size_t k = 0; k < axes.size(); ++k) axes[k] = static_cast<int64_t>(k);
  if (has_input(n, 3)) {
    auto a = ints_of(3);
    if (!a) return node_unsupported(n) << "the gradient of a Slice with axes known only at run time";
    axes = *a;
  }
  std::vector<int64_t> steps(axes.size(), 1);
  if (has_input(n, 4)) {
    auto st = ints_of(4);
    if (!st) return node_unsupported(n) << "the gradient of a Slice with steps known only at run time";
    steps = *st;
  }
  if (steps.size() != axes.size() || starts->size() != axes.size())
    return node_invalid(n) << "starts, axes and steps of different lengths";
  Value* g = b.output_grad(0);
  std::vector<int64_t> pads(2 * static_cast<size_t>(rank), 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
    if (a < 0 || a >= rank) return node_invalid(n) << "axis " << axes[k] << " outside rank " << rank;
    const size_t ai = static_cast<size_t>(a);
    const int64_t d = xs[ai], step = steps[k], len = cur[ai];
    if (step == 0) return node_invalid(n) << "a step of 0";
    int64_t s0 = (*starts)[k] < 0 ? (*starts)[k] + d : (*starts)[k];
    s0 = step > 0 ? std::clamp<int64_t>(s0, 0, d) : std::clamp<int64_t>(s0, 0, d - 1);
    // The lowest position read along the axis, and the spacing of those read.
    const int64_t lowest = len == 0 ? 0 : step > 0 ? s0 : s0 + (len - 1) * step;
    const int64_t spacing = step > 0 ? step : -step;
    if (step < 0 && len > 1) {
      KILN_ASSIGN_OR_RETURN(g, b.add1("Slice", {g, b.ints({-1}), b.ints({std::numeric_limits<int64_t>::min()}),
                                                b.ints({a}), b.ints({-1})}));
    }
    if (spacing > 1 && len > 1) {
      std::vector<int64_t> unit = cur, spread_pads(2 * (cur.size() + 1), 0), spread = cur;
      unit.insert(unit.begin() + a + 1, 1);
      spread_pads[cur.size() + 1 + ai + 1] = spacing - 1;
      spread[ai] = len * spacing;
      KILN_ASSIGN_OR_RETURN(Value* u, b.add1("Reshape", {g, b.ints(unit)}));
      KILN_ASSIGN_OR_RETURN(Value* padded, b.add1("Pad", {u, b.ints(spread_pads)}));
      KILN_ASSIGN_OR_RETURN(g, b.add1("Reshape", {padded, b.ints(spread)}));
      KILN_ASSIGN_OR_RETURN(g, b.add1("Slice", {g, b.ints({0}), b.ints({(len - 1) * spacing + 1}), b.ints({a})}));
      cur[ai] = (len - 1) * spacing + 1;
    }
    pads[ai] = lowest;
    pads[ai + static_cast<size_t>(rank)] = d - lowest - cur[ai];
    if (pads[ai + static_cast<size_t>(rank)] < 0)
      return node_invalid(n) << "the slice reads past the input along axis " << a;
  }
  KILN_ASSIGN_OR_RETURN(g, b.add1("Pad", {g, b.ints(pads)}));
  return b.set_input_grad(0, g);
}

// Split: the outputs' gradients concatenated back along the axis (zeros of
// an output's shape where none flows).
Status grad_split(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  const int64_t rank = n.input(0)->type().rank();
  if (rank < 0) return node_unsupported(n) << "the gradient of a Split of unknown rank";
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += rank;
  std::vector<Value*> parts;
  for (size_t i = 0; i < n.num_outputs(); ++i) {
    Value* g = b.output_grad(i);
    if (g == nullptr) {
      KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {n.output(i)}));
      Tensor zero(n.output(i)->dtype(), {1});
      KILN_ASSIGN_OR_RETURN(g, b.add1("ConstantOfShape", {shape}, {{"value", Attribute::of_tensor(zero)}}));
    }
    parts.push_back(g);
  }
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Concat", parts, {{"axis", Attribute::of_int(axis)}}));
  return b.set_input_grad(0, g);
}

}  // namespace

// Ops with both a lowering and a runtime kernel use the kernel for nodes whose
// shape-like inputs are only known at run time (their outputs then have
// fresh, data-dependent dims, or lower() reports the input as unknown).
void register_shape_ops() {
  register_op(make_def("Shape", infer_shape, lower_shape));
  register_op(make_def("Size", infer_size, lower_size));
  OpDef reshape = make_def("Reshape", infer_reshape, lower_view_copy, true, reshape_kernel);
  reshape.gradient = grad_reshape;
  register_op(std::move(reshape));
  OpDef flatten = make_def("Flatten", infer_flatten, lower_view_copy, true);
  flatten.gradient = grad_reshape;
  register_op(std::move(flatten));
  OpDef squeeze = make_def("Squeeze", infer_squeeze, lower_unit_dims, true, reshape_kernel);
  squeeze.dim_checks = squeeze_dim_checks;
  squeeze.gradient = grad_reshape;
  register_op(std::move(squeeze));
  OpDef unsqueeze = make_def("Unsqueeze", infer_unsqueeze, lower_unit_dims, true, reshape_kernel);
  unsqueeze.gradient = grad_reshape;
  register_op(std::move(unsqueeze));
  OpDef transpose = make_def("Transpose", infer_transpose, lower_transpose);
  transpose.gradient = grad_transpose;
  register_op(std::move(transpose));
  OpDef concat = make_def("Concat", infer_concat, lower_concat);
  concat.dim_checks = concat_dim_checks;
  concat.gradient = grad_concat;
  register_op(std::move(concat));
  OpDef split = make_def("Split", infer_split, lower_split, false, split_kernel);
  split.gradient = grad_split;
  register_op(std::move(split));
  OpDef slice = make_def("Slice", infer_slice, lower_slice, false, slice_kernel);
  slice.gradient = grad_slice;
  register_op(std::move(slice));
  OpDef expand = make_def("Expand", infer_expand, lower_expand, false, expand_kernel);
  expand.gradient = [](GradBuilder& b) { return b.give(0, b.output_grad(0)); };
  register_op(std::move(expand));
  register_op(make_def("Tile", infer_tile, lower_tile, false, tile_kernel));
  register_op(make_def("ConstantOfShape", infer_constant_of_shape, lower_constant_of_shape, false,
                       constant_of_shape_kernel));
  register_op(make_def("Range", infer_range, lower_range, false, range_kernel));
  register_op(make_def("Pad", infer_pad, lower_pad, false, pad_kernel));
}

}  // namespace kiln::ops
