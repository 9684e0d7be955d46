// Miscellaneous ops. Compiled: EyeLike, DepthToSpace, SpaceToDepth, LRN.
// Runtime kernels (data-dependent output sizes, or irregular access that a
// plain loop in C++ expresses best): Compress, Unique, NonMaxSuppression,
// Det, MaxUnpool, GridSample, AffineGrid, CenterCropPad, Col2Im,
// ReverseSequence, Upsample, and the Hann/Hamming/Blackman windows.
// Kiln's own (domain "kiln"): CheckInRange, the run-time check passes insert
// where they rewrite a node whose input they would otherwise read unchecked.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>

#include "ops/common.h"

namespace kiln::ops {

namespace {

OpDef compiled_op(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
                  std::function<Result<std::vector<tir::ComputeDef>>(const Node&, LowerContext&)> lower) {
  OpDef def;
  def.name = name;
  def.infer = std::move(infer);
  def.lower = std::move(lower);
  return def;
}

// A dim that is a compile-time constant, or a fresh data-dependent symbol.
Expr dim_or_fresh(InferContext& ctx, std::optional<int64_t> v, std::optional<int64_t> bound = std::nullopt) {
  if (v) return Expr(*v);
  return ctx.fresh_symbol(bound);
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// Copies element si of src to element di of dst (same dtype, any numeric type).
void copy_elem(Tensor& dst, int64_t di, const Tensor& src, int64_t si) {
  int64_t size = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.data()) + di * size, static_cast<const char*>(src.data()) + si * size,
              static_cast<size_t>(size));
}

Status check_numeric(const Tensor& t, const char* op) {
  if (t.dtype() == DType::kString || !dtype_is_compilable(t.dtype()))
    return unsupported() << op << " on " << dtype_name(t.dtype()) << " tensors";
  return Status::ok();
}

// ---- EyeLike -----------------------------------------------------------------------------

Status infer_eye_like(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() != 2) return node_invalid(n) << "input must be 2-D";
  KILN_ASSIGN_OR_RETURN(DType out, elem_type_attr(n, "dtype", t.dtype));
  set_output(n, 0, out, s, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_eye_like(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, 2);
  std::vector<Expr> iv = axis_vars(axes);
  Expr on = eq(iv[1] - iv[0], Expr(n.attr_int("k", 0)));
  return std::vector<tir::ComputeDef>{
      make_stage(y.name, y.dtype, axes, y.shape, select(on, const_of(y.dtype, 1), const_of(y.dtype, 0)))};
}

// ---- DepthToSpace / SpaceToDepth ---------------------------------------------------------------

Status infer_depth_space(Node& n, InferContext& ctx, bool to_space) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() != 4) return node_invalid(n) << "input must be 4-D";
  int64_t b = n.attr_int("blocksize", 0);
  if (b <= 0 || b > (int64_t{1} << 31)) return node_invalid(n) << "blocksize " << b << " must be in [1, 2^31]";
  Shape out = s;
  if (to_space) {
    out[1] = floordiv(s[1], Expr(b * b));
    out[2] = s[2] * Expr(b);
    out[3] = s[3] * Expr(b);
  } else {
    out[1] = s[1] * Expr(b * b);
    out[2] = floordiv(s[2], Expr(b));
    out[3] = floordiv(s[3], Expr(b));
  }
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_depth_to_space(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  Expr b(n.attr_int("blocksize", 1));
  std::vector<std::string> axes = fresh_axes(ctx, 4);
  std::vector<Expr> iv = axis_vars(axes);
  Expr c_out = y.shape[1];
  Expr hb = mod(iv[2], b), wb = mod(iv[3], b);
  Expr c_in = n.attr_string("mode", "DCR") == "CRD" ? iv[1] * b * b + hb * b + wb
                                                    : hb * b * c_out + wb * c_out + iv[1];
  Expr v = ctx.load_input(0, {iv[0], c_in, floordiv(iv[2], b), floordiv(iv[3], b)});
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, v)};
}

Result<std::vector<tir::ComputeDef>> lower_space_to_depth(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  Expr b(n.attr_int("blocksize", 1));
  std::vector<std::string> axes = fresh_axes(ctx, 4);
  std::vector<Expr> iv = axis_vars(axes);
  Expr c_in = ctx.inputs[0].shape[1];
  Expr off = floordiv(iv[1], c_in);
  Expr v = ctx.load_input(0, {iv[0], mod(iv[1], c_in), iv[2] * b + floordiv(off, b), iv[3] * b + mod(off, b)});
  return std::vector<tir::ComputeDef>{make_stage(y.name, y.dtype, axes, y.shape, v)};
}

// ---- LRN ------------------------------------------------------------------------------------

Status infer_same(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  set_output(n, 0, t.dtype, s, ctx);
  return Status::ok();
}

// y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta; the
// window is [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to the channels.
Result<std::vector<tir::ComputeDef>> lower_lrn(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  if (!dtype_is_float(y.dtype) || y.shape.size() < 2) return node_unsupported(n) << "LRN needs a float input of rank >= 2";
  int64_t size = n.attr_int("size", 0);
  if (size <= 0) return node_invalid(n) << "size must be positive";
  double alpha = n.attr_float("alpha", 1e-4), beta = n.attr_float("beta", 0.75), bias = n.attr_float("bias", 1.0);
  size_t r = y.shape.size();
  std::vector<std::string> axes = fresh_axes(ctx, r);
  std::vector<Expr> iv = axis_vars(axes);
  std::string k = ctx.fresh("k");
  Expr channels = y.shape[1];
  const Expr first = iv[1] - Expr((size - 1) / 2);
  // A window longer than the channels (a file's absurd size) walks the
  // channels instead, keeping those inside the window: the same sum.
  auto cc = simplify(channels, ctx.bounds).as_const();
  bool over_channels = cc ? size > *cc : size > 1024;
  Expr c = over_channels ? var(k) : first + var(k);
  Expr inside = over_channels ? logical_and(le(first, c), le(c, first + Expr(size - 1)))
                              : logical_and(le(Expr(0), c), lt(c, channels));
  std::vector<Expr> idx = iv;
  idx[1] = over_channels ? c : max(min(c, channels - Expr(1)), Expr(0));
  Expr x = ctx.load_input(0, idx);
  Expr sq = select(inside, x * x, const_of(y.dtype, 0));
  tir::ComputeDef sum = make_reduce_stage(ctx.fresh("lrn_sum"), y.dtype, axes, y.shape, {k},
                                          {over_channels ? channels : Expr(size)}, tir::Combiner::kSum,
                                          const_of(y.dtype, 0), sq);
  Expr base = const_of(y.dtype, bias) + const_of(y.dtype, alpha / static_cast<double>(size)) * stage_load(sum, iv);
  Expr out = div(ctx.load_input(0, iv), call("pow", y.dtype, {base, const_of(y.dtype, beta)}));
  std::vector<tir::ComputeDef> stages;
  stages.push_back(sum);
  stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, out));
  return stages;
}

// ---- windows ----------------------------------------------------------------------------------

Status infer_window(Node& n, InferContext& ctx) {
  if (!has_input(n, 0)) return node_invalid(n) << "needs its input 'size'";
  auto size = const_ints(n, 0);
  KILN_ASSIGN_OR_RETURN(DType out, elem_type_attr(n, "output_datatype", DType::kFloat32));
  set_output(n, 0, out, {dim_or_fresh(ctx, size && size->size() == 1 ? std::optional((*size)[0]) : std::nullopt)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> window_kernel(const Node& n, std::vector<double> coeffs) {
  bool periodic = n.attr_int("periodic", 1) != 0;
  DType out_t = static_cast<DType>(n.attr_int("output_datatype", 1));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.empty() || in[0].numel() != 1) return invalid_argument() << "window size must be a scalar";
    int64_t size = in[0].get_i64(0);
    if (size < 0) return invalid_argument() << "window size must be >= 0";
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(out_t, {size}));
    double denom = static_cast<double>(periodic ? size : size - 1);
    for (int64_t i = 0; i < size; ++i) {
      double v = 0;
      for (size_t k = 0; k < coeffs.size(); ++k) {
        double term = coeffs[k] * std::cos(2.0 * std::numbers::pi * static_cast<double>(k * i) / denom);
        v += (k % 2 ? -term : term);
      }
      out[0].set_f64(i, v);
    }
    return Status::ok();
  });
}

// ---- ReverseSequence ----------------------------------------------------------------------------

Result<RuntimeKernel> reverse_sequence_kernel(const Node& n) {
  int64_t batch_axis = n.attr_int("batch_axis", 1), time_axis = n.attr_int("time_axis", 0);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "ReverseSequence"));
    if (x.rank() < 2 || batch_axis < 0 || batch_axis > 1 || time_axis < 0 || time_axis > 1 || batch_axis == time_axis)
      return invalid_argument() << "batch_axis " << batch_axis << " and time_axis " << time_axis
                                << " must be 0 and 1 (in either order) of an input of rank 2 or more, not "
                                << x.describe();
    if (in[1].numel() != x.shape()[batch_axis])
      return invalid_argument() << "sequence_lens has " << in[1].numel() << " values for a batch of "
                                << x.shape()[batch_axis];
    for (int64_t b = 0; b < in[1].numel(); ++b)
      if (int64_t len = in[1].get_i64(b); len < 0 || len > x.shape()[time_axis])
        return invalid_argument() << "sequence_lens[" << b << "] = " << len << " is outside [0, "
                                  << x.shape()[time_axis] << "]";
    out.resize(1);
    out[0] = x.clone();
    std::vector<int64_t> st = strides_of(x.shape());
    std::vector<int64_t> idx(x.rank(), 0);
    for (int64_t e = 0; e < x.numel(); ++e) {
      int64_t rem = e;
      for (int64_t d = 0; d < x.rank(); ++d) {
        idx[d] = rem / st[d];
        rem %= st[d];
      }
      int64_t len = in[1].get_i64(idx[batch_axis]);
      int64_t t = idx[time_axis];
      if (t < len) {
        int64_t src = e + (len - 1 - 2 * t) * st[time_axis];
        copy_elem(out[0], e, x, src);
      }
    }
    return Status::ok();
  });
}

// ---- Compress -----------------------------------------------------------------------------------

Status infer_compress(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (!n.has_attr("axis")) {
    Expr numel(1);
    for (const Expr& d : s) numel = numel * d;
    set_output(n, 0, t.dtype, {ctx.fresh_symbol(simplify(numel, ctx.bounds).as_const())}, ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(s.size())));
  Shape out = s;
  out[axis] = ctx.fresh_symbol(simplify(s[axis], ctx.bounds).as_const());
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> compress_kernel(const Node& n) {
  bool has_axis = n.has_attr("axis");
  int64_t axis_attr = n.attr_int("axis", 0);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    const Tensor& cond = in[1];
    KILN_RETURN_IF_ERROR(check_numeric(x, "Compress"));
    Tensor flat = has_axis ? x : x.reshaped({x.numel()});
    int64_t axis = has_axis ? (axis_attr < 0 ? axis_attr + x.rank() : axis_attr) : 0;
    int64_t dim = flat.shape()[axis];
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < std::min(dim, cond.numel()); ++i)
      if (cond.get_f64(i) != 0) keep.push_back(i);
    std::vector<int64_t> shape = flat.shape();
    shape[axis] = static_cast<int64_t>(keep.size());
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    int64_t inner = 1, outer = 1;
    for (int64_t d = axis + 1; d < flat.rank(); ++d) inner *= flat.shape()[d];
    for (int64_t d = 0; d < axis; ++d) outer *= flat.shape()[d];
    int64_t k = static_cast<int64_t>(keep.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t i = 0; i < inner; ++i) copy_elem(out[0], (o * k + j) * inner + i, flat, (o * dim + keep[j]) * inner + i);
    return Status::ok();
  });
}

// ---- Unique ------------------------------------------------------------------------------------

Status infer_unique(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  Expr numel(1);
  for (const Expr& d : s) numel = numel * d;
  Expr u;
  Shape out;
  Expr in_len;
  if (n.has_attr("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, n.attr_int("axis", 0), static_cast<int64_t>(s.size())));
    u = ctx.fresh_symbol(simplify(s[axis], ctx.bounds).as_const());
    out = s;
    out[axis] = u;
    in_len = s[axis];
  } else {
    u = ctx.fresh_symbol(simplify(numel, ctx.bounds).as_const());
    out = {u};
    in_len = numel;
  }
  set_output(n, 0, t.dtype, out, ctx);
  if (n.num_outputs() > 1) set_output(n, 1, DType::kInt64, {u}, ctx);
  if (n.num_outputs() > 2) set_output(n, 2, DType::kInt64, {in_len}, ctx);
  if (n.num_outputs() > 3) set_output(n, 3, DType::kInt64, {u}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> unique_kernel(const Node& n) {
  bool has_axis = n.has_attr("axis");
  int64_t axis_attr = n.attr_int("axis", 0);
  bool sorted = n.attr_int("sorted", 1) != 0;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x0 = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x0, "Unique"));
    Tensor x = has_axis ? x0 : x0.reshaped({x0.numel()});
    int64_t axis = has_axis ? (axis_attr < 0 ? axis_attr + x.rank() : axis_attr) : 0;
    int64_t dim = x.shape()[axis];
    int64_t inner = 1, outer = 1;
    for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape()[d];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    // Slice j along the axis as a vector of values (compared lexicographically).
    auto slice = [&](int64_t j) {
      std::vector<double> v;
      v.reserve(static_cast<size_t>(outer * inner));
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) v.push_back(x.get_f64((o * dim + j) * inner + i));
      return v;
    };
    std::vector<std::vector<double>> slices;
    for (int64_t j = 0; j < dim; ++j) slices.push_back(slice(j));
    std::vector<int64_t> firsts;  // first occurrence of each distinct slice, in order of appearance
    std::vector<int64_t> inverse(dim);
    std::map<std::vector<double>, int64_t> seen;
    for (int64_t j = 0; j < dim; ++j) {
      auto it = seen.find(slices[j]);
      if (it == seen.end()) {
        seen.emplace(slices[j], static_cast<int64_t>(firsts.size()));
        firsts.push_back(j);
      }
    }
    std::vector<int64_t> order(firsts.size());
    for (size_t u = 0; u < order.size(); ++u) order[u] = static_cast<int64_t>(u);
    if (sorted) {
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return slices[firsts[a]] < slices[firsts[b]]; });
    }
    std::vector<int64_t> rank_of(order.size());
    for (size_t r = 0; r < order.size(); ++r) rank_of[order[r]] = static_cast<int64_t>(r);
    int64_t u = static_cast<int64_t>(order.size());
    std::vector<int64_t> counts(u, 0);
    for (int64_t j = 0; j < dim; ++j) {
      inverse[j] = rank_of[seen[slices[j]]];
      ++counts[inverse[j]];
    }
    std::vector<int64_t> shape = x.shape();
    shape[axis] = u;
    out.resize(4);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t r = 0; r < u; ++r)
        for (int64_t i = 0; i < inner; ++i)
          copy_elem(out[0], (o * u + r) * inner + i, x, (o * dim + firsts[order[r]]) * inner + i);
    KILN_ASSIGN_OR_RETURN(out[1], Tensor::allocate(DType::kInt64, {u}));
    KILN_ASSIGN_OR_RETURN(out[2], Tensor::allocate(DType::kInt64, {dim}));
    KILN_ASSIGN_OR_RETURN(out[3], Tensor::allocate(DType::kInt64, {u}));
    for (int64_t r = 0; r < u; ++r) {
      out[1].data_as<int64_t>()[r] = firsts[order[r]];
      out[3].data_as<int64_t>()[r] = counts[r];
    }
    for (int64_t j = 0; j < dim; ++j) out[2].data_as<int64_t>()[j] = inverse[j];
    return Status::ok();
  });
}

// ---- NonMaxSuppression ----------------------------------------------------------------------------

Status infer_nms(Node& n, InferContext& ctx) {
  set_output(n, 0, DType::kInt64, {ctx.fresh_symbol(), Expr(3)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> nms_kernel(const Node& n) {
  bool center = n.attr_int("center_point_box", 0) != 0;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& boxes = in[0];
    const Tensor& scores = in[1];
    if (boxes.rank() != 3 || scores.rank() != 3 || boxes.shape()[2] != 4)
      return invalid_argument() << "NonMaxSuppression: boxes [B,N,4] and scores [B,C,N] expected";
    int64_t max_out = in.size() > 2 && in[2].defined() && in[2].numel() > 0 ? in[2].get_i64(0) : 0;
    double iou_th = in.size() > 3 && in[3].defined() && in[3].numel() > 0 ? in[3].get_f64(0) : 0.0;
    bool has_score_th = in.size() > 4 && in[4].defined() && in[4].numel() > 0;
    double score_th = has_score_th ? in[4].get_f64(0) : 0.0;
    int64_t batches = boxes.shape()[0], count = boxes.shape()[1], classes = scores.shape()[1];
    if (scores.shape()[0] != batches || scores.shape()[2] != count)
      return invalid_argument() << "NonMaxSuppression: scores " << scores.describe() << " do not match boxes "
                                << boxes.describe() << " (scores [B, C, N] for boxes [B, N, 4])";
    std::vector<int64_t> result;
    // Corners (y1, x1, y2, x2, normalized so 1 <= 2) and areas of a batch's
    // boxes in float, as arrays: the suppression test of a candidate against
    // every kept box is a branch-free loop over them (a detector's batched
    // NMS runs tens of thousands of boxes through one class). IoU in float,
    // in the order ONNX Runtime computes it, so ties at the threshold agree.
    std::vector<float> y1(count), x1(count), y2(count), x2(count), area(count);
    std::vector<float> ky1, kx1, ky2, kx2, karea;
    std::vector<std::vector<int32_t>> cells;  // kept boxes (indices into k*) by grid cell
    std::vector<int> touched;                 // cells holding some, cleared per class
    std::vector<int32_t> wide;                // kept boxes spanning more than kMaxSpan cells
    constexpr int kMaxSpan = 32;
    std::vector<double> sc(count);
    for (int64_t b = 0; b < batches; ++b) {
      for (int64_t i = 0; i < count; ++i) {
        float v[4];
        for (int k = 0; k < 4; ++k) v[k] = static_cast<float>(boxes.get_f64((b * count + i) * 4 + k));
        if (center) {
          y1[i] = v[1] - v[3] / 2;
          x1[i] = v[0] - v[2] / 2;
          y2[i] = v[1] + v[3] / 2;
          x2[i] = v[0] + v[2] / 2;
        } else {
          y1[i] = std::min(v[0], v[2]);
          x1[i] = std::min(v[1], v[3]);
          y2[i] = std::max(v[0], v[2]);
          x2[i] = std::max(v[1], v[3]);
        }
        area[i] = (y2[i] - y1[i]) * (x2[i] - x1[i]);
      }
      // The grid over x (see below): cells of equal width over the batch's extent.
      float gx0 = std::numeric_limits<float>::infinity(), gx1 = -gx0;
      bool finite = true;
      for (int64_t i = 0; i < count; ++i) {
        finite = finite && std::isfinite(x1[i]) && std::isfinite(x2[i]) && std::isfinite(y1[i]) && std::isfinite(y2[i]);
        gx0 = std::min(gx0, x1[i]);
        gx1 = std::max(gx1, x2[i]);
      }
      const int grid = static_cast<int>(std::clamp<int64_t>(count / 4, 1, 4096));
      // In double: a float span can overflow (coordinates near FLT_MAX) or a
      // cell width underflow to 0; then the grid is off.
      const double cell_w = (static_cast<double>(gx1) - static_cast<double>(gx0)) / grid;
      const bool use_grid = finite && count > 64 && gx1 > gx0 && std::isfinite(cell_w) && cell_w > 0;
      cells.assign(use_grid ? static_cast<size_t>(grid) : 0, {});
      touched.clear();
      auto cell_of = [&](float x) {
        double f = (static_cast<double>(x) - static_cast<double>(gx0)) / cell_w;
        if (!(f >= 0)) return 0;  // also NaN
        return f >= grid - 1 ? grid - 1 : static_cast<int>(f);
      };
      for (int64_t c = 0; c < classes; ++c) {
        std::vector<int64_t> cand;
        for (int64_t i = 0; i < count; ++i) {
          sc[i] = scores.get_f64((b * classes + c) * count + i);
          if (!has_score_th || sc[i] > score_th) cand.push_back(i);
        }
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
        ky1.clear(), kx1.clear(), ky2.clear(), kx2.clear(), karea.clear();
        const float th = static_cast<float>(iou_th);
        // Kept boxes by the cells of a grid over x they span: boxes that do
        // not overlap along x have IoU 0, which suppresses nothing unless the
        // threshold is negative (then, or with non-finite corners, every kept
        // box is tested). Batched NMS offsets each class's boxes apart, so a
        // candidate meets only its own class's kept boxes.
        if (use_grid) {
          for (int cell : touched) cells[static_cast<size_t>(cell)].clear();
          touched.clear();
          wide.clear();
        }
        auto test = [&](int64_t i, size_t k) {
          float ih = std::max(0.0f, std::min(y2[i], ky2[k]) - std::max(y1[i], ky1[k]));
          float iw = std::max(0.0f, std::min(x2[i], kx2[k]) - std::max(x1[i], kx1[k]));
          float inter = ih * iw;
          float uni = area[i] + karea[k] - inter;
          return karea[k] > 0 && uni > 0 && inter / uni > th;
        };
        for (int64_t i : cand) {
          if (static_cast<int64_t>(ky1.size()) >= max_out) break;
          bool suppressed = false;
          int c0 = 0, c1 = 0;
          bool in_grid = use_grid && th >= 0;
          if (in_grid) {
            c0 = cell_of(x1[i]);
            c1 = cell_of(x2[i]);
            in_grid = c1 - c0 <= kMaxSpan;
          }
          if (area[i] > 0 && in_grid) {
            for (int cell = c0; cell <= c1 && !suppressed; ++cell)
              for (int32_t k : cells[static_cast<size_t>(cell)])
                if (test(i, static_cast<size_t>(k))) {
                  suppressed = true;
                  break;
                }
            for (size_t w = 0; w < wide.size() && !suppressed; ++w) suppressed = test(i, static_cast<size_t>(wide[w]));
          } else if (area[i] > 0) {
            const size_t nk = ky1.size();
            for (size_t k0 = 0; k0 < nk && !suppressed; k0 += 64) {
              const size_t k1 = std::min(nk, k0 + 64);
              int hit = 0;
              for (size_t k = k0; k < k1; ++k) hit |= test(i, k);
              suppressed = hit != 0;
            }
          }
          if (suppressed) continue;
          if (use_grid) {
            int32_t k = static_cast<int32_t>(ky1.size());
            int k0 = cell_of(x1[i]), k1 = cell_of(x2[i]);
            if (k1 - k0 > kMaxSpan) {
              wide.push_back(k);
            } else {
              for (int cell = k0; cell <= k1; ++cell) {
                if (cells[static_cast<size_t>(cell)].empty()) touched.push_back(cell);
                cells[static_cast<size_t>(cell)].push_back(k);
              }
            }
          }
          ky1.push_back(y1[i]), kx1.push_back(x1[i]), ky2.push_back(y2[i]), kx2.push_back(x2[i]);
          karea.push_back(area[i]);
          result.insert(result.end(), {b, c, i});
        }
      }
    }
    out.resize(1);
    int64_t rows = static_cast<int64_t>(result.size()) / 3;
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kInt64, {rows, 3}));
    std::copy(result.begin(), result.end(), out[0].data_as<int64_t>());
    return Status::ok();
  });
}

// ---- Det -------------------------------------------------------------------------------------------

Status infer_det(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() < 2) return node_invalid(n) << "input must have rank >= 2";
  set_output(n, 0, t.dtype, Shape(s.begin(), s.end() - 2), ctx);
  return Status::ok();
}

Result<RuntimeKernel> det_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "Det"));
    int64_t m = x.shape()[x.rank() - 1];
    if (x.shape()[x.rank() - 2] != m) return invalid_argument() << "Det: matrices must be square";
    std::vector<int64_t> shape(x.shape().begin(), x.shape().end() - 2);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape));
    for (int64_t b = 0; b < out[0].numel(); ++b) {
      // LU decomposition with partial pivoting.
      std::vector<double> a(static_cast<size_t>(m * m));
      for (int64_t e = 0; e < m * m; ++e) a[e] = x.get_f64(b * m * m + e);
      double det = 1;
      for (int64_t c = 0; c < m; ++c) {
        int64_t p = c;
        for (int64_t r = c + 1; r < m; ++r)
          if (std::fabs(a[r * m + c]) > std::fabs(a[p * m + c])) p = r;
        if (a[p * m + c] == 0) {
          det = 0;
          break;
        }
        if (p != c) {
          for (int64_t k = 0; k < m; ++k) std::swap(a[p * m + k], a[c * m + k]);
          det = -det;
        }
        det *= a[c * m + c];
        for (int64_t r = c + 1; r < m; ++r) {
          double f = a[r * m + c] / a[c * m + c];
          for (int64_t k = c; k < m; ++k) a[r * m + k] -= f * a[c * m + k];
        }
      }
      out[0].set_f64(b, det);
    }
    return Status::ok();
  });
}


// ---- shared helpers for kernels with shape inputs -------------------------------------------------

// Multi-index of flat position e in a row-major shape.
void unravel(int64_t e, const std::vector<int64_t>& shape, std::vector<int64_t>& idx) {
  idx.resize(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? e % shape[d] : 0;
    if (shape[d]) e /= shape[d];
  }
}

// Output dims from a shape-valued input when constant, else fresh symbols.
Shape dims_from_input(const Node& n, size_t i, size_t count, InferContext& ctx) {
  auto v = const_ints(n, i);
  Shape out;
  for (size_t k = 0; k < count; ++k)
    out.push_back(v && v->size() == count ? Expr((*v)[k]) : ctx.fresh_symbol());
  return out;
}

// ---- GridSample ----------------------------------------------------------------------------------

Status infer_grid_sample(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape g, input_shape(n, 1));
  if (x.size() < 3 || g.size() != x.size()) return node_invalid(n) << "X [N,C,...] and grid [N,...,r] expected";
  Shape out = {x[0], x[1]};
  out.insert(out.end(), g.begin() + 1, g.end() - 1);
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

// Reflects x into [lo, hi] by the nearer border (ONNX reference _gs_reflect).
// x is finite; the counts of reflections stay doubles (no conversion of a
// huge quotient to an integer).
double reflect(double x, double lo, double hi) {
  double rng = hi - lo;
  if (!(rng > 0)) return lo;
  if (x < lo) {
    double dx = lo - x;
    double k = std::floor(dx / rng);
    double r = std::clamp(dx - k * rng, 0.0, rng);
    return std::fmod(k, 2.0) == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    double dx = x - hi;
    double k = std::floor(dx / rng);
    double r = std::clamp(dx - k * rng, 0.0, rng);
    return std::fmod(k, 2.0) == 0 ? hi - r : lo + r;
  }
  return x;
}

void cubic_coeffs(double x, double c[4]) {
  const double a = -0.75;
  x = std::fabs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

Result<RuntimeKernel> grid_sample_kernel(const Node& n) {
  std::string mode = n.attr_string("mode", "linear");
  if (mode == "bilinear") mode = "linear";
  if (mode == "bicubic") mode = "cubic";
  std::string padding = n.attr_string("padding_mode", "zeros");
  bool align = n.attr_int("align_corners", 0) != 0;
  if (mode != "linear" && mode != "nearest" && mode != "cubic") return node_unsupported(n) << "mode " << mode;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    const Tensor& grid = in[1];
    KILN_RETURN_IF_ERROR(check_numeric(x, "GridSample"));
    KILN_RETURN_IF_ERROR(check_numeric(grid, "GridSample"));
    if (x.rank() < 3 || grid.rank() != x.rank() || grid.shape()[0] != x.shape()[0] ||
        grid.shape().back() != x.rank() - 2)
      return invalid_argument() << "grid " << grid.describe() << " does not match input " << x.describe()
                                << " ([N, D1.., r] for an input [N, C, D1.., Dr])";
    for (int64_t d = 2; d < x.rank(); ++d)
      if (x.shape()[d] == 0 && grid.numel() > 0)
        return invalid_argument() << "input " << x.describe() << " is empty along a sampled dim";
    size_t r = static_cast<size_t>(x.rank() - 2);
    std::vector<int64_t> dims(x.shape().begin() + 2, x.shape().end());
    std::vector<int64_t> oshape = {x.shape()[0], x.shape()[1]};
    oshape.insert(oshape.end(), grid.shape().begin() + 1, grid.shape().end() - 1);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    int64_t spatial = 1;
    for (int64_t d : dims) spatial *= d;
    int64_t points = 1;
    for (size_t d = 2; d < oshape.size(); ++d) points *= oshape[d];
    std::vector<double> lo(r), hi(r);
    for (size_t d = 0; d < r; ++d) {
      lo[d] = align ? 0.0 : -0.5;
      hi[d] = align ? dims[d] - 1.0 : dims[d] - 0.5;
    }
    int taps = mode == "cubic" ? 4 : mode == "linear" ? 2 : 1;
    std::vector<double> pos(r);
    std::vector<std::vector<int64_t>> tap_idx(r, std::vector<int64_t>(4));
    std::vector<std::vector<double>> tap_w(r, std::vector<double>(4));
    // Pixel index along dim d with padding; -1 when it reads zero.
    auto fix = [&](int64_t i, size_t d) -> int64_t {
      if (padding == "zeros") return (i >= 0 && i < dims[d]) ? i : -1;
      if (padding == "border") return std::clamp<int64_t>(i, 0, dims[d] - 1);
      return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo[d], hi[d])), 0, dims[d] - 1);
    };
    for (int64_t b = 0; b < x.shape()[0]; ++b) {
      for (int64_t p = 0; p < points; ++p) {
        for (size_t d = 0; d < r; ++d) {
          // Grid components are (x, y, z): the last spatial dim first.
          double g = grid.get_f64((b * points + p) * static_cast<int64_t>(r) + static_cast<int64_t>(r - 1 - d));
          double v = align ? (g + 1) / 2.0 * (dims[d] - 1) : ((g + 1) * dims[d] - 1) / 2.0;
          v = static_cast<float>(v);
          // A non-finite coordinate (or one past any index) samples zero.
          if (!std::isfinite(v) || std::fabs(v) > 1e15) {
            for (int k = 0; k < 4; ++k) {
              tap_idx[d][k] = -1;
              tap_w[d][k] = 0;
            }
            continue;
          }
          if (mode == "nearest") v = std::nearbyint(v);
          if (v < lo[d] || v > hi[d]) {
            if (padding == "border") v = std::clamp(v, 0.0, dims[d] - 1.0);
            else if (padding == "reflection") v = reflect(v, lo[d], hi[d]);
          }
          pos[d] = v;
          if (mode == "nearest") {
            tap_idx[d][0] = fix(static_cast<int64_t>(v), d);
            tap_w[d][0] = 1;
          } else {
            int64_t i0 = static_cast<int64_t>(std::floor(v));
            double f = v - static_cast<double>(i0);
            if (mode == "linear") {
              tap_idx[d][0] = fix(i0, d);
              tap_idx[d][1] = fix(i0 + 1, d);
              tap_w[d][0] = 1 - f;
              tap_w[d][1] = f;
            } else {
              double c[4];
              cubic_coeffs(f, c);
              for (int k = 0; k < 4; ++k) {
                tap_idx[d][k] = fix(i0 - 1 + k, d);
                tap_w[d][k] = c[k];
              }
            }
          }
        }
        int64_t combos = 1;
        for (size_t d = 0; d < r; ++d) combos *= taps;
        for (int64_t c = 0; c < x.shape()[1]; ++c) {
          int64_t base = (b * x.shape()[1] + c) * spatial;
          double acc = 0;
          for (int64_t k = 0; k < combos; ++k) {
            int64_t rem = k, flat = 0;
            double w = 1;
            bool zero = false;
            for (size_t d = 0; d < r; ++d) {
              int64_t t = rem % taps;
              rem /= taps;
              int64_t i = tap_idx[d][t];
              if (i < 0) zero = true;
              flat = flat * dims[d] + std::max<int64_t>(i, 0);
              w *= tap_w[d][t];
            }
            if (!zero && w != 0) acc += w * x.get_f64(base + flat);
          }
          out[0].set_f64((b * x.shape()[1] + c) * points + p, acc);
        }
      }
    }
    return Status::ok();
  });
}

// ---- AffineGrid ---------------------------------------------------------------------------------

Status infer_affine_grid(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape th, input_shape(n, 0));
  if (th.size() != 3) return node_invalid(n) << "theta must be 3-D";
  auto r = th[1].as_const();
  if (!r || (*r != 2 && *r != 3)) return node_unsupported(n) << "theta must be [N,2,3] or [N,3,4]";
  Shape size = dims_from_input(n, 1, static_cast<size_t>(*r + 2), ctx);
  Shape out = {th[0]};
  out.insert(out.end(), size.begin() + 2, size.end());
  out.push_back(Expr(*r));
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> affine_grid_kernel(const Node& n) {
  bool align = n.attr_int("align_corners", 0) != 0;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& theta = in[0];
    if (theta.rank() != 3 || theta.shape()[2] != theta.shape()[1] + 1)
      return invalid_argument() << "theta " << theta.describe() << " is not [N, r, r + 1]";
    int64_t r = theta.shape()[1];
    int64_t batch = theta.shape()[0];
    if (in[1].numel() != r + 2 || in[1].get_i64(0) != batch)
      return invalid_argument() << "size has " << in[1].numel() << " values; theta "
                                << theta.describe() << " needs " << r + 2 << " starting with its batch " << batch;
    std::vector<int64_t> dims;
    for (int64_t d = 2; d < in[1].numel(); ++d) {
      dims.push_back(in[1].get_i64(d));
      if (dims.back() < 0) return invalid_argument() << "size has a negative dim " << dims.back();
    }
    std::vector<int64_t> oshape = {batch};
    oshape.insert(oshape.end(), dims.begin(), dims.end());
    oshape.push_back(r);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(theta.dtype(), oshape));
    int64_t points = 1;
    for (int64_t d : dims) points *= d;
    auto coord = [&](int64_t i, int64_t len) {
      if (align) return len == 1 ? 0.0 : -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(len - 1);
      return (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(len) - 1.0;
    };
    std::vector<int64_t> idx;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t p = 0; p < points; ++p) {
        unravel(p, dims, idx);
        std::vector<double> src(static_cast<size_t>(r + 1), 1.0);  // (x, y[, z], 1)
        for (int64_t d = 0; d < r; ++d) src[d] = coord(idx[r - 1 - d], dims[r - 1 - d]);
        for (int64_t row = 0; row < r; ++row) {
          double acc = 0;
          for (int64_t k = 0; k <= r; ++k) acc += theta.get_f64((b * r + row) * (r + 1) + k) * src[k];
          out[0].set_f64((b * points + p) * r + row, acc);
        }
      }
    }
    return Status::ok();
  });
}

// ---- CenterCropPad ------------------------------------------------------------------------------

Status infer_center_crop_pad(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  std::vector<int64_t> axes = n.attr_ints("axes");
  if (axes.empty())
    for (size_t d = 0; d < x.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  Shape sizes = dims_from_input(n, 1, axes.size(), ctx);
  Shape out = x;
  for (size_t k = 0; k < axes.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(n, axes[k], static_cast<int64_t>(x.size())));
    out[a] = sizes[k];
  }
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> center_crop_pad_kernel(const Node& n) {
  std::vector<int64_t> axes_attr = n.attr_ints("axes");
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "CenterCropPad"));
    std::vector<int64_t> axes = axes_attr;
    if (axes.empty())
      for (int64_t d = 0; d < x.rank(); ++d) axes.push_back(d);
    std::vector<int64_t> oshape = x.shape();
    for (size_t k = 0; k < axes.size(); ++k) {
      int64_t a = axes[k] < 0 ? axes[k] + x.rank() : axes[k];
      oshape[a] = in[1].get_i64(static_cast<int64_t>(k));
    }
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    std::vector<int64_t> shift(x.rank());  // input index = output index + shift
    for (int64_t d = 0; d < x.rank(); ++d) {
      int64_t in_d = x.shape()[d], out_d = oshape[d];
      shift[d] = in_d >= out_d ? (in_d - out_d) / 2 : -((out_d - in_d) / 2);
    }
    std::vector<int64_t> st = strides_of(x.shape()), idx;
    for (int64_t e = 0; e < out[0].numel(); ++e) {
      unravel(e, oshape, idx);
      int64_t src = 0;
      bool inside = true;
      for (int64_t d = 0; d < x.rank(); ++d) {
        int64_t i = idx[d] + shift[d];
        if (i < 0 || i >= x.shape()[d]) inside = false;
        src += i * st[d];
      }
      if (inside) copy_elem(out[0], e, x, src);
    }
    return Status::ok();
  });
}

// ---- MaxUnpool ----------------------------------------------------------------------------------

Status infer_max_unpool(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  if (has_input(n, 2)) {
    set_output(n, 0, t.dtype, dims_from_input(n, 2, x.size(), ctx), ctx);
    return Status::ok();
  }
  std::vector<int64_t> k = n.attr_ints("kernel_shape");
  if (x.size() < 3) return node_invalid(n) << "input rank " << x.size() << " < 3";
  size_t r = x.size() - 2;
  if (k.size() != r) return node_invalid(n) << "kernel_shape must have " << r << " values";
  std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(r, 1));
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * r, 0));
  if (strides.size() != r || pads.size() != 2 * r)
    return node_invalid(n) << "strides and pads must have " << r << " and " << 2 * r << " values";
  Shape out = x;
  for (size_t d = 0; d < r; ++d)
    out[d + 2] = (x[d + 2] - Expr(1)) * Expr(strides[d]) - Expr(pads[d] + pads[d + r]) + Expr(k[d]);
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> max_unpool_kernel(const Node& n) {
  std::vector<int64_t> k = n.attr_ints("kernel_shape");
  std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(k.size(), 1));
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * k.size(), 0));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "MaxUnpool"));
    size_t r = k.size();
    if (x.rank() != static_cast<int64_t>(r) + 2 || strides.size() != r || pads.size() != 2 * r)
      return invalid_argument() << "input " << x.describe() << ", kernel_shape, strides and pads disagree in rank";
    if (in[1].numel() != x.numel())
      return invalid_argument() << "indices have " << in[1].numel() << " elements for " << x.numel() << " values";
    std::vector<int64_t> inferred = x.shape();
    for (size_t d = 0; d < r; ++d) {
      int64_t v = 0;
      bool overflow = __builtin_mul_overflow(x.shape()[d + 2] - 1, strides[d], &v) ||
                      __builtin_sub_overflow(v, pads[d], &v) || __builtin_sub_overflow(v, pads[d + r], &v) ||
                      __builtin_add_overflow(v, k[d], &v);
      if (overflow || v < 0)
        return invalid_argument() << "kernel_shape, strides and pads give no valid output size on spatial dim " << d;
      inferred[d + 2] = v;
    }
    // Indices are flat positions in a tensor of the inferred shape (as MaxPool
    // produces them); with an explicit output_shape that tensor is placed at the
    // output's origin (ONNX reference).
    KILN_ASSIGN_OR_RETURN(Tensor y, Tensor::allocate(x.dtype(), inferred));
    for (int64_t e = 0; e < x.numel(); ++e) {
      int64_t i = in[1].get_i64(e);
      if (i < 0 || i >= y.numel()) return invalid_argument() << "MaxUnpool: index out of range";
      copy_elem(y, i, x, e);
    }
    out.resize(1);
    if (in.size() <= 2 || !in[2].defined()) {
      out[0] = y;
      return Status::ok();
    }
    std::vector<int64_t> oshape(static_cast<size_t>(in[2].numel()));
    for (int64_t d = 0; d < in[2].numel(); ++d) oshape[d] = in[2].get_i64(d);
    if (oshape.size() != inferred.size()) return invalid_argument() << "MaxUnpool: output_shape has the wrong rank";
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    std::vector<int64_t> ost = strides_of(oshape), idx;
    for (int64_t e = 0; e < y.numel(); ++e) {
      unravel(e, inferred, idx);
      int64_t dst = 0;
      bool inside = true;
      for (size_t d = 0; d < idx.size(); ++d) {
        if (idx[d] >= oshape[d]) inside = false;
        dst += idx[d] * ost[d];
      }
      if (inside) copy_elem(out[0], dst, y, e);
    }
    return Status::ok();
  });
}

// ---- Col2Im -------------------------------------------------------------------------------------

Status infer_col2im(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape img, input_shape(n, 1));
  auto r = img.size() == 1 ? img[0].as_const() : std::nullopt;
  if (!r || x.size() != 3) return node_unsupported(n) << "Col2Im needs input [N, C*prod(block), L] and a static image rank";
  if (*r > kMaxInferredRank) return node_invalid(n) << "image_shape has " << *r << " dims";
  Shape out = {x[0]};
  auto block = const_ints(n, 2);
  Expr bprod(1);
  if (block && static_cast<int64_t>(block->size()) == *r) {
    for (int64_t b : *block) bprod = bprod * Expr(b);
    out.push_back(floordiv(x[1], bprod));
  } else {
    out.push_back(ctx.fresh_symbol());
  }
  Shape dims = dims_from_input(n, 1, static_cast<size_t>(*r), ctx);
  out.insert(out.end(), dims.begin(), dims.end());
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> col2im_kernel(const Node& n) {
  std::vector<int64_t> dil_a = n.attr_ints("dilations"), pads_a = n.attr_ints("pads"), str_a = n.attr_ints("strides");
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "Col2Im"));
    size_t r = static_cast<size_t>(in[1].numel());
    if (in[2].numel() != static_cast<int64_t>(r))
      return invalid_argument() << "Col2Im: block_shape has " << in[2].numel() << " values for " << r << " image dims";
    std::vector<int64_t> img(r), block(r);
    // Sizes are bounded (by the input's element count) before any product.
    const int64_t limit = std::max<int64_t>(x.numel(), 1);
    int64_t bprod = 1;
    for (size_t d = 0; d < r; ++d) {
      img[d] = in[1].get_i64(static_cast<int64_t>(d));
      block[d] = in[2].get_i64(static_cast<int64_t>(d));
      if (img[d] < 1 || block[d] < 1 || block[d] > limit || img[d] > (int64_t{1} << 31))
        return invalid_argument() << "Col2Im: image_shape " << img[d] << " and block_shape " << block[d]
                                  << " on dim " << d << " must be positive (block at most the input's size)";
      if (bprod > limit / block[d]) return invalid_argument() << "Col2Im: block_shape is larger than the input";
      bprod *= block[d];
    }
    std::vector<int64_t> dil = dil_a.empty() ? std::vector<int64_t>(r, 1) : dil_a;
    std::vector<int64_t> str = str_a.empty() ? std::vector<int64_t>(r, 1) : str_a;
    std::vector<int64_t> pads = pads_a.empty() ? std::vector<int64_t>(2 * r, 0) : pads_a;
    if (dil.size() != r || str.size() != r || pads.size() != 2 * r)
      return invalid_argument() << "Col2Im: dilations, strides and pads must have " << r << ", " << r << " and "
                                << 2 * r << " values";
    std::vector<int64_t> blocks(r);
    int64_t l_total = 1;
    for (size_t d = 0; d < r; ++d) {
      if (dil[d] < 1 || str[d] < 1 || dil[d] > (int64_t{1} << 31) || str[d] > (int64_t{1} << 31) ||
          pads[d] < 0 || pads[d + r] < 0 || pads[d] > (int64_t{1} << 31) || pads[d + r] > (int64_t{1} << 31))
        return invalid_argument() << "Col2Im: dilations and strides must be positive and pads non-negative (dim " << d
                                  << ")";
      blocks[d] = (img[d] + pads[d] + pads[d + r] - (dil[d] * (block[d] - 1) + 1)) / str[d] + 1;
      if (blocks[d] < 1) return invalid_argument() << "Col2Im: the block does not fit the padded image on dim " << d;
      if (l_total > limit / blocks[d]) return invalid_argument() << "Col2Im: input shape does not match image_shape and block_shape";
      l_total *= blocks[d];
    }
    int64_t n_batch = x.shape()[0], c_total = x.shape()[1] / bprod;
    if (x.shape()[1] != c_total * bprod || x.shape()[2] != l_total)
      return invalid_argument() << "Col2Im: input shape does not match image_shape and block_shape";
    std::vector<int64_t> oshape = {n_batch, c_total};
    oshape.insert(oshape.end(), img.begin(), img.end());
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    int64_t spatial = 1;
    for (int64_t v : img) spatial *= v;
    std::vector<double> acc(static_cast<size_t>(n_batch * c_total * spatial), 0.0);
    std::vector<int64_t> bi, li;
    for (int64_t b = 0; b < n_batch; ++b)
      for (int64_t c = 0; c < c_total; ++c)
        for (int64_t k = 0; k < bprod; ++k) {
          unravel(k, block, bi);
          for (int64_t l = 0; l < l_total; ++l) {
            unravel(l, blocks, li);
            int64_t flat = 0;
            bool inside = true;
            for (size_t d = 0; d < r; ++d) {
              int64_t p = li[d] * str[d] - pads[d] + bi[d] * dil[d];
              if (p < 0 || p >= img[d]) inside = false;
              flat = flat * img[d] + p;
            }
            if (inside)
              acc[(b * c_total + c) * spatial + flat] += x.get_f64(((b * c_total + c) * bprod + k) * l_total + l);
          }
        }
    for (int64_t e = 0; e < out[0].numel(); ++e) out[0].set_f64(e, acc[e]);
    return Status::ok();
  });
}

// ---- Upsample (opset 7-9): Resize with asymmetric coordinates ------------------------------------

Status infer_upsample(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  std::vector<double> scales = n.attr_floats("scales");
  if (scales.empty() && has_input(n, 1)) {
    if (n.input(1)->is_constant()) {
      const Tensor& c = n.input(1)->constant();
      for (int64_t i = 0; i < c.numel(); ++i) scales.push_back(c.get_f64(i));
    }
  }
  Shape out;
  for (size_t d = 0; d < x.size(); ++d) {
    auto v = x[d].as_const();
    if (scales.size() == x.size() && v) {
      out.push_back(Expr(static_cast<int64_t>(std::floor(static_cast<double>(*v) * scales[d]))));
    } else {
      out.push_back(ctx.fresh_symbol());
    }
  }
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> upsample_kernel(const Node& n) {
  std::string mode = n.attr_string("mode", "nearest");
  std::vector<double> scales_attr = n.attr_floats("scales");
  if (mode != "nearest" && mode != "linear" && mode != "bilinear") return node_unsupported(n) << "mode " << mode;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_numeric(x, "Upsample"));
    std::vector<double> scales = scales_attr;
    if (scales.empty() && in.size() > 1)
      for (int64_t i = 0; i < in[1].numel(); ++i) scales.push_back(in[1].get_f64(i));
    if (static_cast<int64_t>(scales.size()) != x.rank()) return invalid_argument() << "Upsample: one scale per dim expected";
    std::vector<int64_t> oshape(x.rank());
    for (int64_t d = 0; d < x.rank(); ++d)
      oshape[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.shape()[d]) * scales[d]));
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), oshape));
    std::vector<int64_t> st = strides_of(x.shape()), idx;
    int64_t r = x.rank();
    for (int64_t e = 0; e < out[0].numel(); ++e) {
      unravel(e, oshape, idx);
      if (mode == "nearest") {
        int64_t src = 0;
        for (int64_t d = 0; d < r; ++d)
          src += std::min(static_cast<int64_t>(std::floor(idx[d] / scales[d])), x.shape()[d] - 1) * st[d];
        copy_elem(out[0], e, x, src);
        continue;
      }
      double acc = 0;
      for (int64_t k = 0; k < (int64_t{1} << r); ++k) {
        double w = 1;
        int64_t src = 0;
        for (int64_t d = 0; d < r; ++d) {
          double pos = std::min(idx[d] / scales[d], static_cast<double>(x.shape()[d] - 1));
          int64_t i0 = static_cast<int64_t>(std::floor(pos));
          double f = pos - static_cast<double>(i0);
          bool hi = (k >> d) & 1;
          int64_t i = std::min(i0 + (hi ? 1 : 0), x.shape()[d] - 1);
          w *= hi ? f : 1 - f;
          src += i * st[d];
        }
        if (w != 0) acc += w * x.get_f64(src);
      }
      out[0].set_f64(e, acc);
    }
    return Status::ok();
  });
}

// OptionalHasElement (opset 18): true for a tensor input, false for a
// missing one (no input, or an empty name). Optional-typed values are refused
// at import, so whether the element is there is known when compiling.
Status infer_optional_has_element(Node& n, InferContext& ctx) {
  set_output(n, 0, DType::kBool, {}, ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_optional_has_element(const Node& n, LowerContext& ctx) {
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(ctx.outputs[0].name, DType::kBool, {}, {}, bool_imm(has_input(n, 0))));
  return stages;
}

// ---- kiln::CheckInRange --------------------------------------------------------------------------

// kiln::CheckInRange(x, lo, hi[, count]) -> x: every element of the integer
// tensor x lies in [lo, hi] (scalars) and, where count is given, x has count
// elements; an error naming attribute `what` otherwise. Passes that rewrite
// a node into others insert it for what the node's own kernel checked
// (scan8-to-loop: sequence_lens within the steps; sequence-map-to-loop: the
// sequences' lengths agree).
Status infer_check_in_range(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!dtype_is_int(t.dtype)) return node_invalid(n) << "checks an integer tensor, got " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  set_output(n, 0, t.dtype, s, ctx);
  // The values pass through where the check provably holds (x between lo and
  // hi by the bounds). Not otherwise: a later pass could then read a value
  // from its expression instead of from this node, and skip the check.
  auto x = sym_values(n, 0), lo = sym_values(n, 1), hi = sym_values(n, 2);
  if (n.output(0) == nullptr || !x || !lo || !hi || lo->size() != 1 || hi->size() != 1) return Status::ok();
  if (n.num_inputs() > 3 && n.input(3) != nullptr) return Status::ok();  // the count is checked at run time only
  for (const Expr& e : *x) {
    std::optional<int64_t> above = bound_of(simplify(e - (*lo)[0], ctx.bounds), ctx.bounds).lo;
    std::optional<int64_t> below = bound_of(simplify((*hi)[0] - e, ctx.bounds), ctx.bounds).lo;
    if (!above || *above < 0 || !below || *below < 0) return Status::ok();
  }
  n.output(0)->set_sym_value(x);
  return Status::ok();
}

Result<RuntimeKernel> check_in_range_kernel(const Node& n) {
  const std::string what = n.attr_string("what", "value");
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].defined() && in[i].numel() != 1)
        return invalid_argument() << what << ": bound " << in[i].describe() << " is not a scalar";
    if (in.size() > 3 && in[3].defined() && x.numel() != in[3].get_i64(0))
      return invalid_argument() << what << " has " << x.numel() << " elements, expected " << in[3].get_i64(0);
    const int64_t lo = in[1].get_i64(0), hi = in[2].get_i64(0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t v = x.get_i64(i);
      if (v >= lo && v <= hi) continue;
      std::string at = x.rank() == 0 ? what : what + "[" + std::to_string(i) + "]";
      if (lo == hi) return invalid_argument() << at << " = " << v << ", expected " << lo;
      return invalid_argument() << at << " = " << v << " outside [" << lo << ", " << hi << "]";
    }
    out.resize(1);
    out[0] = x.clone();
    return Status::ok();
  });
}

}  // namespace

void register_misc_ops() {
  OpDef check = kernel_op("CheckInRange", infer_check_in_range, check_in_range_kernel);
  check.domain = "kiln";
  register_op(std::move(check));
  register_op(compiled_op("OptionalHasElement", infer_optional_has_element, lower_optional_has_element));
  register_op(compiled_op("EyeLike", infer_eye_like, lower_eye_like));
  register_op(compiled_op(
      "DepthToSpace", [](Node& n, InferContext& ctx) { return infer_depth_space(n, ctx, true); },
      lower_depth_to_space));
  register_op(compiled_op(
      "SpaceToDepth", [](Node& n, InferContext& ctx) { return infer_depth_space(n, ctx, false); },
      lower_space_to_depth));
  register_op(compiled_op("LRN", infer_same, lower_lrn));
  register_op(kernel_op("HannWindow", infer_window, [](const Node& n) { return window_kernel(n, {0.5, 0.5}); }));
  register_op(kernel_op("HammingWindow", infer_window,
                        [](const Node& n) { return window_kernel(n, {25.0 / 46, 1 - 25.0 / 46}); }));
  register_op(kernel_op("BlackmanWindow", infer_window,
                        [](const Node& n) { return window_kernel(n, {0.42, 0.5, 0.08}); }));
  register_op(kernel_op("ReverseSequence", infer_same, reverse_sequence_kernel));
  register_op(kernel_op("Compress", infer_compress, compress_kernel));
  register_op(kernel_op("Unique", infer_unique, unique_kernel));
  register_op(kernel_op("NonMaxSuppression", infer_nms, nms_kernel));
  register_op(kernel_op("Det", infer_det, det_kernel));
  register_op(kernel_op("GridSample", infer_grid_sample, grid_sample_kernel));
  register_op(kernel_op("AffineGrid", infer_affine_grid, affine_grid_kernel));
  register_op(kernel_op("CenterCropPad", infer_center_crop_pad, center_crop_pad_kernel));
  register_op(kernel_op("MaxUnpool", infer_max_unpool, max_unpool_kernel));
  register_op(kernel_op("Col2Im", infer_col2im, col2im_kernel));
  register_op(kernel_op("Upsample", infer_upsample, upsample_kernel));
}

}  // namespace kiln::ops
