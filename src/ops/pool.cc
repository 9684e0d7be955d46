// Pooling: MaxPool (with the optional Indices output), AveragePool, LpPool and
// their global forms. Each lowers to a reduction over the window; padded or
// out-of-range positions are excluded with a select on the bounds and their
// load index is clamped into the tensor.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <map>

#include "ops/common.h"

namespace kiln::ops {

namespace {

enum class PoolKind { kMax, kAverage, kLp };

struct PoolGeometry {
  std::vector<Expr> in, out, pad_begin;
  std::vector<int64_t> kernel, stride, dilation;
  bool needs_bounds = false;  // some window may reach outside the input
};

Result<std::vector<int64_t>> positive_ints(const Node& n, const std::string& name, size_t rank, int64_t def) {
  std::vector<int64_t> v = n.attr_ints(name, std::vector<int64_t>(rank, def));
  if (v.size() != rank) {
    return node_invalid(n) << "attribute '" << name << "' has " << v.size() << " values, expected " << rank;
  }
  for (int64_t x : v) {
    if (x <= 0) return node_invalid(n) << "attribute '" << name << "' must be positive";
  }
  return v;
}

// Output extents per the ONNX formulas. With ceil_mode, a window that would
// start in the end padding is dropped (as PyTorch and ONNX Runtime do).
Result<PoolGeometry> pool_geometry(const Node& n, const Shape& x, const SymbolBounds& bounds) {
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  size_t rank = x.size() - 2;
  PoolGeometry g;
  g.in.assign(x.begin() + 2, x.end());
  g.kernel = n.attr_ints("kernel_shape");
  if (g.kernel.size() != rank) return node_invalid(n) << "kernel_shape needs " << rank << " values";
  KILN_ASSIGN_OR_RETURN(g.stride, positive_ints(n, "strides", rank, 1));
  KILN_ASSIGN_OR_RETURN(g.dilation, positive_ints(n, "dilations", rank, 1));
  bool ceil_mode = n.attr_int("ceil_mode", 0) != 0;
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * rank, 0));
  if (pads.size() != 2 * rank) return node_invalid(n) << "attribute 'pads' needs " << 2 * rank << " values";
  g.needs_bounds = ceil_mode;
  for (size_t d = 0; d < rank; ++d) {
    int64_t span = 0;
    if (g.kernel[d] < 1 || __builtin_mul_overflow(g.dilation[d], g.kernel[d] - 1, &span) || span == INT64_MAX)
      return node_invalid(n) << "kernel_shape " << g.kernel[d] << " with dilation " << g.dilation[d]
                             << " on spatial dim " << d << " is not a valid window";
    span += 1;
    KILN_RETURN_IF_ERROR(check_window_span(n, d, Expr(span), g.in[d], bounds));
    int64_t s = g.stride[d];
    if (auto_pad == "NOTSET" || auto_pad == "VALID") {
      int64_t pb = auto_pad == "VALID" ? 0 : pads[d];
      int64_t pe = auto_pad == "VALID" ? 0 : pads[d + rank];
      if (pb != 0 || pe != 0) g.needs_bounds = true;
      g.pad_begin.push_back(Expr(pb));
      Expr extent = g.in[d] + (pb + pe - span);
      if (ceil_mode) {
        Expr out = floordiv(extent + (s - 1), Expr(s)) + 1;
        Expr last_start = floordiv(g.in[d] + (pb - 1), Expr(s)) + 1;
        g.out.push_back(simplify(min(out, last_start), bounds));
      } else {
        g.out.push_back(simplify(floordiv(extent, Expr(s)) + 1, bounds));
      }
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      Expr out = simplify(floordiv(g.in[d] + (s - 1), Expr(s)), bounds);
      Expr total = simplify(max(Expr(0), (out - 1) * s + span - g.in[d]), bounds);
      Expr half = floordiv(total, 2);
      Expr pb = simplify(auto_pad == "SAME_UPPER" ? half : total - half, bounds);
      g.pad_begin.push_back(pb);
      g.out.push_back(out);
      g.needs_bounds = true;
    } else {
      return node_invalid(n) << "unknown auto_pad '" << auto_pad << "'";
    }
  }
  return g;
}

Expr clamp_index(const Expr& i, const Expr& extent) { return max(min(i, extent - 1), Expr(0)); }

Expr ceildiv(const Expr& a, int64_t d) { return d == 1 ? a : floordiv(a + (d - 1), Expr(d)); }

// Number of kernel taps r in [0, k) with lo <= start + r*dil < hi.
Expr tap_count(const Expr& start, int64_t k, int64_t dil, const Expr& lo, const Expr& hi) {
  Expr r_lo = max(Expr(0), ceildiv(lo - start, dil));
  Expr r_hi = min(Expr(k), ceildiv(hi - start, dil));
  return max(Expr(0), r_hi - r_lo);
}

// The divisor of an average pool at output position iv: the whole window
// when count_include_pad (every tap, even those ceil_mode pushes past the
// end padding, as the ONNX reference counts) or when no window reaches
// outside the input; otherwise the taps inside the input (at least 1: an
// all-padding window divides by 1 instead of 0).
Expr average_count(const Node& n, const PoolGeometry& g, const std::vector<Expr>& iv) {
  if (!g.needs_bounds || n.attr_int("count_include_pad", 0) != 0) {
    int64_t c = 1;
    for (int64_t k : g.kernel) c *= k;
    return Expr(c);
  }
  Expr count;
  for (size_t d = 0; d < g.kernel.size(); ++d) {
    Expr start = iv[d + 2] * g.stride[d] - g.pad_begin[d];
    Expr c = tap_count(start, g.kernel[d], g.dilation[d], Expr(0), g.in[d]);
    count = count.defined() ? count * c : c;
  }
  return max(count, Expr(1));
}

Status infer_pool(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, pool_geometry(n, x, ctx.bounds));
  Shape out = {x[0], x[1]};
  out.insert(out.end(), g.out.begin(), g.out.end());
  if (n.num_outputs() > 1 && n.output(1) != nullptr && !n.output(1)->name().empty()) {
    if (n.op_type() != "MaxPool") return node_invalid(n) << "has more than one output";
    set_output(n, 1, DType::kInt64, out, ctx);
  }
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_pool(const Node& n, LowerContext& ctx, PoolKind kind) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType dt = y.dtype;
  Shape xs(x.shape.begin(), x.shape.end());
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, pool_geometry(n, xs, {}));
  size_t rank = g.kernel.size();
  if (kind != PoolKind::kMax && !dtype_is_float(dt)) {
    return node_unsupported(n) << "needs a floating-point input, got " << dtype_name(dt);
  }

  std::vector<std::string> axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank, "k");
  std::vector<Expr> rv = axis_vars(raxes);
  std::vector<Expr> rext(g.kernel.begin(), g.kernel.end());

  std::vector<Expr> x_idx = {iv[0], iv[1]};
  std::vector<Expr> pos(rank);
  Expr valid;
  for (size_t d = 0; d < rank; ++d) {
    pos[d] = iv[d + 2] * g.stride[d] - g.pad_begin[d] + rv[d] * g.dilation[d];
    if (g.needs_bounds) {
      Expr ok = logical_and(le(Expr(0), pos[d]), lt(pos[d], g.in[d]));
      valid = valid.defined() ? logical_and(valid, ok) : ok;
      x_idx.push_back(clamp_index(pos[d], g.in[d]));
    } else {
      x_idx.push_back(pos[d]);
    }
  }
  Expr xv = ctx.load_input(0, x_idx);
  std::vector<tir::ComputeDef> stages;

  const bool want_indices = ctx.outputs.size() > 1 && !ctx.outputs[1].name.empty();
  if ((kind == PoolKind::kMax || kind == PoolKind::kAverage) && rank == 2 && !want_indices && g.kernel[0] >= 2 &&
      g.kernel[1] >= 2 && n.attr_int("kiln_separable", 0) != 0) {
    // Separable: the window's rows reduced at every input column (the rows
    // stage, [N, C, OH, W]), then its columns. A k x k window then takes 2k
    // steps per output instead of k^2, and the strided column taps (a span
    // load and a shuffle each) read the rows stage once per column tap
    // instead of once per tap. Padding is excluded per axis (the neutral
    // value: -inf or lowest for max, 0 for the sum).
    const bool is_max = kind == PoolKind::kMax;
    const Expr neutral = is_max ? lowest_of(dt) : const_of(dt, 0);
    const tir::Combiner comb = is_max ? tir::Combiner::kMax : tir::Combiner::kSum;
    std::vector<std::string> ra = fresh_axes(ctx, 4, "i");
    std::vector<Expr> rvv = axis_vars(ra);
    std::vector<std::string> rk = fresh_axes(ctx, 1, "k");
    Expr row = rvv[2] * g.stride[0] - g.pad_begin[0] + var(rk[0]) * g.dilation[0];
    Expr rx = ctx.load_input(0, {rvv[0], rvv[1], g.needs_bounds ? clamp_index(row, g.in[0]) : row, rvv[3]});
    Expr rbody = g.needs_bounds ? select(logical_and(le(Expr(0), row), lt(row, g.in[0])), rx, neutral) : rx;
    std::vector<Expr> rows_shape = {y.shape[0], y.shape[1], y.shape[2], x.shape[3]};
    stages.push_back(make_reduce_stage(y.name + ".rows", dt, ra, rows_shape, rk, {Expr(g.kernel[0])}, comb, neutral,
                                       rbody));
    std::vector<std::string> ck = fresh_axes(ctx, 1, "k");
    Expr col = iv[3] * g.stride[1] - g.pad_begin[1] + var(ck[0]) * g.dilation[1];
    Expr cx = stage_load(stages[0], {iv[0], iv[1], iv[2], g.needs_bounds ? clamp_index(col, g.in[1]) : col});
    Expr cbody = g.needs_bounds ? select(logical_and(le(Expr(0), col), lt(col, g.in[1])), cx, neutral) : cx;
    Expr finalize;
    if (!is_max) finalize = div(var("acc", dt), cast(dt, simplify(average_count(n, g, iv))));
    stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, ck, {Expr(g.kernel[1])}, comb, neutral, cbody,
                                       finalize));
    return stages;
  }
  if (kind == PoolKind::kMax) {
    Expr body = valid.defined() ? select(valid, xv, lowest_of(dt)) : xv;
    stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kMax, lowest_of(dt),
                                       body));
    if (want_indices) {
      // Indices: the smallest flat index (row-major over the whole input, or
      // column-major within each plane for storage_order 1) holding the max.
      const tir::Buffer& ind = ctx.outputs[1];
      std::vector<std::string> axes2 = fresh_axes(ctx, rank + 2, "i");
      std::vector<Expr> iv2 = axis_vars(axes2);
      std::vector<std::string> raxes2 = fresh_axes(ctx, rank, "k");
      std::vector<Expr> rv2 = axis_vars(raxes2);
      std::map<std::string, Expr, std::less<>> repl;
      for (size_t k = 0; k < axes.size(); ++k) repl[axes[k]] = iv2[k];
      for (size_t k = 0; k < raxes.size(); ++k) repl[raxes[k]] = rv2[k];
      Expr flat = iv2[0] * x.shape[1] + iv2[1];
      bool col_major = n.attr_int("storage_order", 0) != 0;
      for (size_t k = 0; k < rank; ++k) {
        size_t d = col_major ? rank - 1 - k : k;
        flat = flat * g.in[d] + substitute(pos[d], repl);
      }
      Expr is_max = eq(substitute(xv, repl), stage_load(stages[0], iv2));
      Expr none = int_imm(std::numeric_limits<int64_t>::max());
      // flat = the window's first position (taps at 0) + the tap's offset: the
      // taps reduce over their constant offsets, the position added once.
      std::map<std::string, Expr, std::less<>> at_origin;
      for (const std::string& r : raxes2) at_origin[r] = Expr(0);
      Expr origin = simplify(substitute(flat, at_origin));
      Expr offset = simplify(flat - origin);
      // The padding test apart from the comparison, as the values' stage
      // has it: tiles that read no padding drop it (tir lower, strip_padding).
      Expr tap = select(is_max, offset, none);
      if (valid.defined()) tap = select(substitute(valid, repl), tap, none);
      stages.push_back(make_reduce_stage(ind.name, DType::kInt64, axes2, ind.shape, raxes2, rext, tir::Combiner::kMin,
                                         none, tap, var("acc", DType::kInt64) + origin));
    }
    return stages;
  }

  Expr zero = const_of(dt, 0);
  Expr acc = var("acc", dt);
  if (kind == PoolKind::kAverage) {
    Expr body = valid.defined() ? select(valid, xv, zero) : xv;
    Expr finalize = div(acc, cast(dt, simplify(average_count(n, g, iv))));
    stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kSum, zero, body,
                                       finalize));
    return stages;
  }

  double p = static_cast<double>(n.attr_int("p", 2));
  Expr term, finalize;
  if (p == 1) {
    term = call("abs", dt, {xv});
  } else if (p == 2) {
    term = xv * xv;
    finalize = call("sqrt", dt, {acc});
  } else {
    term = call("pow", dt, {call("abs", dt, {xv}), const_of(dt, p)});
    finalize = call("pow", dt, {acc, const_of(dt, 1.0 / p)});
  }
  Expr body = valid.defined() ? select(valid, term, zero) : term;
  stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kSum, zero, body,
                                     finalize));
  return stages;
}

// ---- Global pools -----------------------------------------------------------------

Status infer_global_pool(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  Shape out = {x[0], x[1]};
  out.resize(x.size(), Expr(1));
  set_output(n, 0, xt.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_global_pool(const Node& n, LowerContext& ctx, PoolKind kind) {
  const tir::Buffer& x = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType dt = y.dtype;
  if (kind != PoolKind::kMax && !dtype_is_float(dt)) {
    return node_unsupported(n) << "needs a floating-point input, got " << dtype_name(dt);
  }
  size_t rank = x.shape.size() - 2;
  std::vector<std::string> axes = fresh_axes(ctx, rank + 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::vector<std::string> raxes = fresh_axes(ctx, rank, "k");
  std::vector<Expr> rv = axis_vars(raxes);
  std::vector<Expr> rext(x.shape.begin() + 2, x.shape.end());
  std::vector<Expr> x_idx = {iv[0], iv[1]};
  x_idx.insert(x_idx.end(), rv.begin(), rv.end());
  Expr xv = ctx.load_input(0, x_idx);
  Expr acc = var("acc", dt);
  std::vector<tir::ComputeDef> stages;
  if (kind == PoolKind::kMax) {
    stages.push_back(
        make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kMax, lowest_of(dt), xv));
  } else if (kind == PoolKind::kAverage) {
    Expr count = Expr(1);
    for (const Expr& e : rext) count = count * e;
    stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kSum, const_of(dt, 0),
                                       xv, div(acc, cast(dt, simplify(count)))));
  } else {
    double p = static_cast<double>(n.attr_int("p", 2));
    Expr term = call("pow", dt, {call("abs", dt, {xv}), const_of(dt, p)});
    Expr finalize = call("pow", dt, {acc, const_of(dt, 1.0 / p)});
    if (p == 2) {
      term = xv * xv;
      finalize = call("sqrt", dt, {acc});
    }
    stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, raxes, rext, tir::Combiner::kSum, const_of(dt, 0),
                                       term, finalize));
  }
  return stages;
}

// MaxPool: dy added into zeros at each window's maximum (the Indices of a
// MaxPool of the same attributes: flat over the whole input), ties to the
// first, as the indices say. Explicit padding and floor rounding: by
// kiln:MaxPoolGrad, a compiled kernel that sums, per input position, dy over
// the windows reaching it that chose it; otherwise ScatterElements with
// reduction add.
Status grad_max_pool(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  if (n.num_outputs() > 1 && b.output_grad(1) != nullptr) return node_unsupported(n) << "a gradient through Indices";
  Value* x = n.input(0);
  if (n.attr_int("storage_order", 0) != 0) return node_unsupported(n) << "the gradient of a column-major MaxPool";
  std::map<std::string, Attribute> attrs(n.attrs().begin(), n.attrs().end());
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> pooled, b.add("MaxPool", {x}, attrs, 2));
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (x->type().is_static() && n.attr_int("ceil_mode", 0) == 0 && (auto_pad == "NOTSET" || auto_pad == "VALID")) {
    std::vector<int64_t> xs = x->type().static_shape();
    std::map<std::string, Attribute> window;
    for (const char* name : {"kernel_shape", "strides", "dilations"})
      if (n.has_attr(name)) window.emplace(name, *n.attr(name));
    if (auto_pad == "NOTSET" && n.has_attr("pads")) window.emplace("pads", *n.attr("pads"));
    window.emplace("image_shape", Attribute::of_ints(std::vector<int64_t>(xs.begin() + 2, xs.end())));
    KILN_ASSIGN_OR_RETURN(std::vector<Value*> dx, b.add("MaxPoolGrad", {b.output_grad(0), pooled[1]}, window, 1, "kiln"));
    return b.set_input_grad(0, dx[0]);
  }
  Value* flat = b.ints({-1});
  KILN_ASSIGN_OR_RETURN(Value* idx, b.add1("Reshape", {pooled[1], flat}));
  KILN_ASSIGN_OR_RETURN(Value* upd, b.add1("Reshape", {b.output_grad(0), flat}));
  KILN_ASSIGN_OR_RETURN(Value* xflat, b.add1("Reshape", {x, flat}));
  KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {xflat}));
  Tensor zero(x->dtype(), {1});
  KILN_ASSIGN_OR_RETURN(Value* zeros, b.add1("ConstantOfShape", {shape}, {{"value", Attribute::of_tensor(zero)}}));
  KILN_ASSIGN_OR_RETURN(Value* sum, b.add1("ScatterElements", {zeros, idx, upd},
                                           {{"axis", Attribute::of_int(0)}, {"reduction", Attribute::of_string("add")}}));
  KILN_ASSIGN_OR_RETURN(Value* dx, b.reshape_like(sum, x));
  return b.set_input_grad(0, dx);
}

// The window of an AveragePool or LpPool for its gradient, static shapes:
// explicit pads (the node's, or what auto_pad implies, as conv_geometry
// works them out), the end pads set so that floor rounding gives the node's
// output extents (ceil_mode's last window reads past the input: taps outside
// it are zeros to kiln:Im2Col and dropped by kiln:Col2Im).
struct PoolWindow {
  std::vector<int64_t> xs, ys, kernel;
  std::map<std::string, Attribute> attrs;  // kernel_shape, pads, strides, dilations
};

Result<PoolWindow> pool_window(const Node& n) {
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (!x->type().is_static() || !y->type().is_static())
    return node_unsupported(n) << "the gradient of a " << n.op_type() << " with symbolic shapes (not yet)";
  PoolWindow w;
  w.xs = x->type().static_shape();
  w.ys = y->type().static_shape();
  if (w.xs.size() < 3) return node_invalid(n) << "input rank " << w.xs.size() << " < 3";
  const size_t sp = w.xs.size() - 2;
  w.kernel = n.attr_ints("kernel_shape", {});
  if (w.kernel.size() != sp) return node_invalid(n) << "kernel_shape needs one value per spatial dim";
  const std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  const std::vector<int64_t> dilations = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  if (strides.size() != sp || dilations.size() != sp)
    return node_invalid(n) << "strides and dilations need one value per spatial dim";
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> pads(2 * sp, 0);
  if (auto_pad == "NOTSET") {
    pads = n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
    if (pads.size() != 2 * sp) return node_invalid(n) << "pads needs two values per spatial dim";
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t d = 0; d < sp; ++d) {
      const int64_t span = dilations[d] * (w.kernel[d] - 1) + 1;
      const int64_t total = std::max<int64_t>(0, (w.ys[d + 2] - 1) * strides[d] + span - w.xs[d + 2]);
      pads[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    }
  } else if (auto_pad != "VALID") {
    return node_invalid(n) << "unknown auto_pad '" << auto_pad << "'";
  }
  for (size_t d = 0; d < sp; ++d) {
    if (strides[d] < 1 || dilations[d] < 1 || w.kernel[d] < 1) return node_invalid(n) << "non-positive window";
    const int64_t span = dilations[d] * (w.kernel[d] - 1) + 1;
    pads[d + sp] = std::max<int64_t>(0, (w.ys[d + 2] - 1) * strides[d] + span - w.xs[d + 2] - pads[d]);
  }
  w.attrs = {{"kernel_shape", Attribute::of_ints(w.kernel)},
             {"pads", Attribute::of_ints(pads)},
             {"strides", Attribute::of_ints(strides)},
             {"dilations", Attribute::of_ints(dilations)}};
  return w;
}

// Per-output values [N, C, O...] copied to every tap of their window as
// columns [C, K..., N, O...] and summed back onto the input by kiln:Col2Im.
Result<Value*> sum_over_windows(GradBuilder& b, const PoolWindow& w, Value* per_output) {
  const size_t sp = w.xs.size() - 2;
  std::vector<int64_t> perm = {1, 0}, taps_axes, cols = {w.xs[1]};
  for (size_t d = 0; d < sp; ++d) {
    perm.push_back(static_cast<int64_t>(d + 2));
    taps_axes.push_back(static_cast<int64_t>(d + 1));
  }
  cols.insert(cols.end(), w.kernel.begin(), w.kernel.end());
  cols.push_back(w.xs[0]);
  cols.insert(cols.end(), w.ys.begin() + 2, w.ys.end());
  KILN_ASSIGN_OR_RETURN(Value* t, b.add1("Transpose", {per_output}, {{"perm", Attribute::of_ints(perm)}}));
  KILN_ASSIGN_OR_RETURN(Value* u, b.unsqueeze(t, taps_axes));
  KILN_ASSIGN_OR_RETURN(Value* spread, b.add1("Expand", {u, b.ints(cols)}));
  std::map<std::string, Attribute> window = w.attrs;
  window.emplace("image_shape", Attribute::of_ints(std::vector<int64_t>(w.xs.begin() + 2, w.xs.end())));
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> dx, b.add("Col2Im", {spread}, window, 1, "kiln"));
  return dx[0];
}

// AveragePool (static shapes; any padding, auto_pad, ceil_mode, dilations
// and count_include_pad): each output's dy times 1 / its count, summed back
// over its window's taps. The shares are the node's own AveragePool of ones
// (valid taps / count) over the number of valid taps (kiln:Im2Col of ones
// summed over the taps): constants, folded at compile time, that divide as
// the forward does.
Status grad_average_pool(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* x = n.input(0);
  KILN_ASSIGN_OR_RETURN(PoolWindow w, pool_window(n));
  const size_t sp = w.xs.size() - 2;
  std::vector<int64_t> one_shape = {1, 1};
  one_shape.insert(one_shape.end(), w.xs.begin() + 2, w.xs.end());
  Tensor ones(x->dtype(), one_shape);
  for (int64_t e = 0; e < ones.numel(); ++e) ones.set_f64(e, 1.0);
  Value* one = b.constant(std::move(ones));
  std::map<std::string, Attribute> attrs(n.attrs().begin(), n.attrs().end());
  KILN_ASSIGN_OR_RETURN(Value* mean_of_ones, b.add1("AveragePool", {one}, attrs));
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> one_cols, b.add("Im2Col", {one}, w.attrs, 1, "kiln"));
  std::vector<int64_t> taps_axes;  // the columns' taps: [1, K..., 1, O...]
  for (size_t d = 0; d < sp; ++d) taps_axes.push_back(static_cast<int64_t>(d + 1));
  KILN_ASSIGN_OR_RETURN(Value* valid, b.reduce_sum(one_cols[0], taps_axes, false));
  KILN_ASSIGN_OR_RETURN(Value* some, b.add1("Greater", {valid, b.scalar(0.0, valid)}));
  KILN_ASSIGN_OR_RETURN(Value* share, b.add1("Div", {mean_of_ones, valid}));
  KILN_ASSIGN_OR_RETURN(Value* kept, b.add1("Where", {some, share, b.scalar(0.0, share)}));
  KILN_ASSIGN_OR_RETURN(Value* scaled, b.add1("Mul", {b.output_grad(0), kept}));
  KILN_ASSIGN_OR_RETURN(Value* dx, sum_over_windows(b, w, scaled));
  return b.set_input_grad(0, dx);
}

// LpPool, y = (sum over the window of |x|^p)^(1/p) (static shapes, any
// padding): dx = |x|^(p-1) sign(x) times the sum over the windows reading x
// of dy y^(1-p); 0 where y is 0 (every tap 0: the subgradient 0).
Status grad_lp_pool(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* x = n.input(0);
  Value* y = n.output(0);
  const int64_t p = n.attr_int("p", 2);
  if (p < 1) return node_invalid(n) << "p must be at least 1, got " << p;
  KILN_ASSIGN_OR_RETURN(PoolWindow w, pool_window(n));
  Value* per_output = b.output_grad(0);
  if (p > 1) {
    KILN_ASSIGN_OR_RETURN(Value* positive, b.add1("Greater", {y, b.scalar(0.0, y)}));
    KILN_ASSIGN_OR_RETURN(Value* safe, b.add1("Where", {positive, y, b.scalar(1.0, y)}));
    KILN_ASSIGN_OR_RETURN(Value* power, b.add1("Pow", {safe, b.scalar(static_cast<double>(1 - p), y)}));
    KILN_ASSIGN_OR_RETURN(Value* scaled, b.add1("Mul", {per_output, power}));
    KILN_ASSIGN_OR_RETURN(per_output, b.add1("Where", {positive, scaled, b.scalar(0.0, y)}));
  }
  KILN_ASSIGN_OR_RETURN(Value* summed, sum_over_windows(b, w, per_output));
  // |x|^(p-1) sign(x): x itself for p = 2, sign(x) for p = 1.
  Value* factor = x;
  if (p == 1) {
    KILN_ASSIGN_OR_RETURN(factor, b.add1("Sign", {x}));
  } else if (p > 2) {
    KILN_ASSIGN_OR_RETURN(Value* ax, b.add1("Abs", {x}));
    KILN_ASSIGN_OR_RETURN(Value* ap, b.add1("Pow", {ax, b.scalar(static_cast<double>(p - 2), x)}));
    KILN_ASSIGN_OR_RETURN(factor, b.add1("Mul", {ap, x}));
  }
  KILN_ASSIGN_OR_RETURN(Value* dx, b.add1("Mul", {factor, summed}));
  return b.set_input_grad(0, dx);
}

void register_pool(const std::string& name, PoolKind kind) {
  OpDef def;
  def.name = name;
  def.infer = infer_pool;
  if (kind == PoolKind::kMax) def.gradient = grad_max_pool;
  if (kind == PoolKind::kAverage) def.gradient = grad_average_pool;
  if (kind == PoolKind::kLp) def.gradient = grad_lp_pool;
  def.lower = [kind](const Node& n, LowerContext& ctx) { return lower_pool(n, ctx, kind); };
  register_op(std::move(def));
}

// GlobalAveragePool: dy spread evenly over the spatial extent.
Status grad_global_average_pool(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* x = n.input(0);
  if (!x->type().is_static()) return node_unsupported(n) << "the gradient of a GlobalAveragePool with symbolic shapes";
  std::vector<int64_t> xs = x->type().static_shape();
  int64_t count = 1;
  for (size_t d = 2; d < xs.size(); ++d) count *= xs[d];
  Value* dy = b.output_grad(0);
  KILN_ASSIGN_OR_RETURN(Value* scaled, b.add1("Mul", {dy, b.scalar(1.0 / static_cast<double>(count), dy)}));
  KILN_ASSIGN_OR_RETURN(Value* dx, b.add1("Expand", {scaled, b.ints(xs)}));
  return b.set_input_grad(0, dx);
}

void register_global_pool(const std::string& name, PoolKind kind) {
  OpDef def;
  def.name = name;
  def.infer = infer_global_pool;
  def.lower = [kind](const Node& n, LowerContext& ctx) { return lower_global_pool(n, ctx, kind); };
  if (kind == PoolKind::kAverage) def.gradient = grad_global_average_pool;
  register_op(std::move(def));
}

}  // namespace

void register_pool_ops() {
  register_pool("MaxPool", PoolKind::kMax);
  register_pool("AveragePool", PoolKind::kAverage);
  register_pool("LpPool", PoolKind::kLp);
  register_global_pool("GlobalMaxPool", PoolKind::kMax);
  register_global_pool("GlobalAveragePool", PoolKind::kAverage);
  register_global_pool("GlobalLpPool", PoolKind::kLp);
}

}  // namespace kiln::ops
