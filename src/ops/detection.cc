// Detection ops, as runtime kernels.
//
// RoiAlign (opsets 10, 16, 22): Y[r, c, ph, pw] pools X[batch_indices[r], c]
// over bin (ph, pw) of roi r = (x1, y1, x2, y2) (scaled by spatial_scale),
// sampling a grid of grid_h x grid_w points per bin (sampling_ratio, or
// ceil(roi extent / output extent) when it is 0) with bilinear interpolation.
// "avg" averages the samples; "max" takes, like the ONNX reference and ONNX
// Runtime, the largest of the four weighted corner terms of every sample (not
// the largest interpolated value). Samples more than one pixel outside X
// count as 0. "half_pixel" shifts the scaled coordinates by -0.5 and lets an
// roi be smaller than a pixel; "output_half_pixel" does not shift and makes
// every roi at least 1 x 1. Opset 10 had no coordinate_transformation_mode
// and behaved as output_half_pixel; from opset 16 the default is half_pixel.
// Geometry and accumulation are computed in X's type (f16 / bf16 as f32), as
// the reference and ONNX Runtime do, so sample grids and bin edges agree.
//
// DeformConv (opset 19; v1, and v2 with the mask): a convolution whose every
// kernel tap at every output position samples X at its usual place plus a
// learned offset (per offset group of input channels), bilinearly (linear
// along each of the 1 to 3 spatial dims), scaled by the mask when there is
// one. Pixels outside X read as 0, as the reference's GridSample with zeros
// padding: a sample more than one pixel outside, or at a NaN position, is 0.
// Per (image, group, tile of output positions) the masked samples are
// gathered into a column matrix [C/group * kernel size, tile], which W's rows
// of the group multiply; work items are split across the model's threads,
// and every output element is summed in one order, so the result does not
// depend on the split. f16 / bf16 are computed in f32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common.h"
#include "support/thread_pool.h"

namespace kiln::ops {

namespace {

// ---- RoiAlign ------------------------------------------------------------------------------------

constexpr const char* kCoordinateMode = "coordinate_transformation_mode";

// Samples one output element may take, at most (a 4096 x 4096 grid). An roi
// that needs more is far larger than any feature map; it is rejected rather
// than left to run for hours.
constexpr double kMaxSamplesPerBin = 1 << 24;

// The checked attributes of one RoiAlign node.
struct RoiAlignParams {
  bool max_mode = false;
  bool half_pixel = true;
  int64_t out_h = 1, out_w = 1;
  int64_t sampling_ratio = 0;  // 0: adaptive
  double spatial_scale = 1.0;
};

Result<RoiAlignParams> roi_align_params(const Node& n) {
  RoiAlignParams p;
  std::string mode = n.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") return node_invalid(n) << "mode must be 'avg' or 'max', got '" << mode << "'";
  p.max_mode = mode == "max";
  std::string coords = n.attr_string(kCoordinateMode, "half_pixel");
  if (coords != "half_pixel" && coords != "output_half_pixel")
    return node_invalid(n) << kCoordinateMode << " must be 'half_pixel' or 'output_half_pixel', got '" << coords << "'";
  p.half_pixel = coords == "half_pixel";
  p.out_h = n.attr_int("output_height", 1);
  p.out_w = n.attr_int("output_width", 1);
  if (p.out_h < 1 || p.out_w < 1)
    return node_invalid(n) << "output_height and output_width must be >= 1, got " << p.out_h << " and " << p.out_w;
  p.sampling_ratio = n.attr_int("sampling_ratio", 0);
  if (p.sampling_ratio < 0) return node_invalid(n) << "sampling_ratio must be >= 0, got " << p.sampling_ratio;
  if (static_cast<double>(p.sampling_ratio) * static_cast<double>(p.sampling_ratio) > kMaxSamplesPerBin)
    return node_unsupported(n) << "sampling_ratio " << p.sampling_ratio << " (more than " << kMaxSamplesPerBin
                               << " samples per output element)";
  p.spatial_scale = n.attr_float("spatial_scale", 1.0);
  if (!std::isfinite(p.spatial_scale)) return node_invalid(n) << "spatial_scale must be finite";
  return p;
}

bool roi_align_dtype_supported(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

Status infer_roi_align(Node& n, InferContext& ctx) {
  // The kernel is built from the node alone, which does not know the opset:
  // an opset before 16 (no attribute, output_half_pixel behaviour) is made
  // explicit here.
  int64_t opset = onnx_opset(ctx);
  if (opset > 0 && opset < 16 && !n.has_attr(kCoordinateMode))
    n.set_attr(kCoordinateMode, Attribute::of_string("output_half_pixel"));
  KILN_ASSIGN_OR_RETURN(RoiAlignParams p, roi_align_params(n));
  KILN_ASSIGN_OR_RETURN(TensorType x, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType rois, input_type(n, 1));
  KILN_ASSIGN_OR_RETURN(TensorType indices, input_type(n, 2));
  if (!dtype_is_float(x.dtype)) return node_invalid(n) << "X must be a float tensor, got " << x.to_string();
  if (!roi_align_dtype_supported(x.dtype)) return node_unsupported(n) << "X of dtype " << dtype_name(x.dtype);
  if (rois.dtype != x.dtype)
    return node_invalid(n) << "rois must have X's dtype " << dtype_name(x.dtype) << ", got " << rois.to_string();
  if (!dtype_is_int(indices.dtype))
    return node_invalid(n) << "batch_indices must be an integer tensor, got " << indices.to_string();
  if (x.rank() >= 0 && x.rank() != 4) return node_invalid(n) << "X must be 4-D [N, C, H, W], got " << x.to_string();
  if (rois.rank() >= 0) {
    auto cols = rois.rank() == 2 ? (*rois.shape)[1].as_const() : std::nullopt;
    if (rois.rank() != 2 || (cols && *cols != 4))
      return node_invalid(n) << "rois must be [num_rois, 4], got " << rois.to_string();
  }
  if (indices.rank() >= 0 && indices.rank() != 1)
    return node_invalid(n) << "batch_indices must be 1-D [num_rois], got " << indices.to_string();
  if (rois.rank() == 2 && indices.rank() == 1) {
    auto a = (*rois.shape)[0].as_const(), b = (*indices.shape)[0].as_const();
    if (a && b && *a != *b)
      return node_invalid(n) << "rois " << rois.to_string() << " and batch_indices " << indices.to_string()
                             << " differ in the number of rois";
  }
  Expr num_rois = rois.rank() == 2 ? (*rois.shape)[0] : indices.rank() == 1 ? (*indices.shape)[0] : ctx.fresh_symbol();
  Expr channels = x.rank() == 4 ? (*x.shape)[1] : ctx.fresh_symbol();
  set_output(n, 0, x.dtype, {num_rois, channels, Expr(p.out_h), Expr(p.out_w)}, ctx);
  return Status::ok();
}

// One roi in X's coordinates: where its bins start, their size, the
// sampling grid per bin, and its image.
template <typename T>
struct RoiGeometry {
  T start_h = 0, start_w = 0;
  T bin_h = 0, bin_w = 0;
  int64_t grid_h = 0, grid_w = 0;  // 0 when the roi is empty (half_pixel, x2 <= x1)
  int64_t batch = 0;
};

// Checks roi r and computes its geometry; errors for a batch index outside
// [0, batches), a non-finite coordinate, or a grid over kMaxSamplesPerBin.
template <typename T>
Result<RoiGeometry<T>> roi_geometry(const RoiAlignParams& p, const Tensor& rois, const Tensor& indices, int64_t r,
                                    int64_t batches) {
  RoiGeometry<T> g;
  g.batch = indices.get_i64(r);
  if (g.batch < 0 || g.batch >= batches)
    return invalid_argument() << "RoiAlign: batch_indices[" << r << "] = " << g.batch << " is outside [0, " << batches
                              << ") (X has " << batches << " images)";
  T scale = static_cast<T>(p.spatial_scale);
  T offset = static_cast<T>(p.half_pixel ? 0.5 : 0.0);
  T c[4];
  for (int k = 0; k < 4; ++k) {
    c[k] = static_cast<T>(rois.get_f64(r * 4 + k)) * scale - offset;
    if (!std::isfinite(c[k])) return invalid_argument() << "RoiAlign: roi " << r << " has a non-finite coordinate";
  }
  g.start_w = c[0];
  g.start_h = c[1];
  T roi_w = c[2] - c[0], roi_h = c[3] - c[1];
  if (!p.half_pixel) {
    roi_w = std::max(roi_w, T(1));
    roi_h = std::max(roi_h, T(1));
  }
  T out_h = static_cast<T>(p.out_h), out_w = static_cast<T>(p.out_w);
  g.bin_h = roi_h / out_h;
  g.bin_w = roi_w / out_w;
  double grid_h = p.sampling_ratio > 0 ? static_cast<double>(p.sampling_ratio) : std::ceil(roi_h / out_h);
  double grid_w = p.sampling_ratio > 0 ? static_cast<double>(p.sampling_ratio) : std::ceil(roi_w / out_w);
  if (!std::isfinite(grid_h) || !std::isfinite(grid_w) ||
      std::max(grid_h, 0.0) * std::max(grid_w, 0.0) > kMaxSamplesPerBin)
    return invalid_argument() << "RoiAlign: roi " << r << " needs a " << grid_h << " x " << grid_w
                              << " sampling grid per output element (more than " << kMaxSamplesPerBin
                              << " samples); it is far larger than the feature map";
  // A negative grid (an inverted roi under half_pixel) samples nothing, as an empty one does.
  g.grid_h = static_cast<int64_t>(std::max(grid_h, 0.0));
  g.grid_w = static_cast<int64_t>(std::max(grid_w, 0.0));
  return g;
}

// One interpolation point along one axis: the two neighbouring pixels and
// their weights. `outside`: more than one pixel outside the image; the
// sample then counts as 0 (every weight 0, read at pixel 0).
template <typename T>
struct AxisSample {
  bool outside = false;
  int64_t low = 0, high = 0;
  T w_low = 0, w_high = 0;
};

template <typename T>
AxisSample<T> axis_sample(T v, int64_t extent) {
  AxisSample<T> s;
  if (v < T(-1) || v > static_cast<T>(extent)) {
    s.outside = true;
    return s;
  }
  v = std::max(v, T(0));
  s.low = static_cast<int64_t>(v);
  if (s.low >= extent - 1) {
    s.low = s.high = extent - 1;
    v = static_cast<T>(s.low);
  } else {
    s.high = s.low + 1;
  }
  T frac = v - static_cast<T>(s.low);
  s.w_low = T(1) - frac;
  s.w_high = frac;
  return s;
}

// Computes Y for rois [begin, end); independent per roi, so chunks may run in parallel.
template <typename T>
struct RoiAlignJob {
  const T* x = nullptr;
  T* y = nullptr;
  const std::vector<RoiGeometry<T>>* rois = nullptr;
  int64_t channels = 0, height = 0, width = 0;
  RoiAlignParams p;

  static void chunk(int64_t begin, int64_t end, void* env) { static_cast<const RoiAlignJob*>(env)->run(begin, end); }

  void run(int64_t begin, int64_t end) const {
    int64_t plane = height * width, out_plane = p.out_h * p.out_w;
    std::vector<T> acc(static_cast<size_t>(channels));
    for (int64_t r = begin; r < end; ++r) {
      const RoiGeometry<T>& g = (*rois)[static_cast<size_t>(r)];
      const T* image = x + g.batch * channels * plane;
      T* out = y + r * channels * out_plane;
      int64_t count = std::max<int64_t>(g.grid_h * g.grid_w, 1);
      for (int64_t ph = 0; ph < p.out_h; ++ph) {
        for (int64_t pw = 0; pw < p.out_w; ++pw) {
          std::fill(acc.begin(), acc.end(), T(0));
          bool first = true;
          for (int64_t iy = 0; iy < g.grid_h; ++iy) {
            T yy = g.start_h + static_cast<T>(ph) * g.bin_h +
                   static_cast<T>(static_cast<double>(iy) + 0.5) * g.bin_h / static_cast<T>(g.grid_h);
            AxisSample<T> sy = axis_sample(yy, height);
            for (int64_t ix = 0; ix < g.grid_w; ++ix) {
              T xx = g.start_w + static_cast<T>(pw) * g.bin_w +
                     static_cast<T>(static_cast<double>(ix) + 0.5) * g.bin_w / static_cast<T>(g.grid_w);
              AxisSample<T> sx = axis_sample(xx, width);
              int64_t pos[4] = {0, 0, 0, 0};
              T w[4] = {0, 0, 0, 0};
              if (!sy.outside && !sx.outside) {
                pos[0] = sy.low * width + sx.low;
                pos[1] = sy.low * width + sx.high;
                pos[2] = sy.high * width + sx.low;
                pos[3] = sy.high * width + sx.high;
                w[0] = sy.w_low * sx.w_low;
                w[1] = sy.w_low * sx.w_high;
                w[2] = sy.w_high * sx.w_low;
                w[3] = sy.w_high * sx.w_high;
              }
              for (int64_t c = 0; c < channels; ++c) {
                const T* v = image + c * plane;
                T& a = acc[static_cast<size_t>(c)];
                if (p.max_mode) {
                  T m = std::max(std::max(std::max(w[0] * v[pos[0]], w[1] * v[pos[1]]), w[2] * v[pos[2]]),
                                 w[3] * v[pos[3]]);
                  a = first ? m : std::max(a, m);
                } else {
                  a += w[0] * v[pos[0]] + w[1] * v[pos[1]] + w[2] * v[pos[2]] + w[3] * v[pos[3]];
                }
              }
              first = false;
            }
          }
          for (int64_t c = 0; c < channels; ++c) {
            T a = acc[static_cast<size_t>(c)];
            out[c * out_plane + ph * p.out_w + pw] = p.max_mode ? a : a / static_cast<T>(count);
          }
        }
      }
    }
  }
};

// Y for X and rois of element type T (already checked for shape).
template <typename T>
Status roi_align_typed(const RoiAlignParams& p, const T* x, const std::vector<int64_t>& x_shape, const Tensor& rois,
                       const Tensor& indices, T* y) {
  int64_t num_rois = rois.shape()[0];
  std::vector<RoiGeometry<T>> geometry;
  geometry.reserve(static_cast<size_t>(num_rois));
  for (int64_t r = 0; r < num_rois; ++r) {
    KILN_ASSIGN_OR_RETURN(RoiGeometry<T> g, roi_geometry<T>(p, rois, indices, r, x_shape[0]));
    geometry.push_back(g);
  }
  RoiAlignJob<T> job;
  job.x = x;
  job.y = y;
  job.rois = &geometry;
  job.channels = x_shape[1];
  job.height = x_shape[2];
  job.width = x_shape[3];
  job.p = p;
  ThreadPool* pool = current_thread_pool();
  if (pool != nullptr && num_rois > 1) pool->parallel_for(num_rois, &RoiAlignJob<T>::chunk, &job);
  else job.run(0, num_rois);
  return Status::ok();
}

Result<RuntimeKernel> roi_align_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(RoiAlignParams p, roi_align_params(n));
  return RuntimeKernel([p](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.size() < 3 || !in[0].defined() || !in[1].defined() || !in[2].defined())
      return invalid_argument() << "RoiAlign: X, rois and batch_indices are required";
    const Tensor& x = in[0];
    const Tensor& rois = in[1];
    const Tensor& indices = in[2];
    if (!roi_align_dtype_supported(x.dtype()))
      return invalid_argument() << "RoiAlign: X must be f32, f64, f16 or bf16, got " << x.describe();
    if (rois.dtype() != x.dtype())
      return invalid_argument() << "RoiAlign: rois " << rois.describe() << " must have X's dtype " << x.describe();
    if (!dtype_is_int(indices.dtype()))
      return invalid_argument() << "RoiAlign: batch_indices must be integers, got " << indices.describe();
    if (x.rank() != 4) return invalid_argument() << "RoiAlign: X must be 4-D [N, C, H, W], got " << x.describe();
    if (rois.rank() != 2 || rois.shape()[1] != 4)
      return invalid_argument() << "RoiAlign: rois must be [num_rois, 4], got " << rois.describe();
    if (indices.rank() != 1 || indices.shape()[0] != rois.shape()[0])
      return invalid_argument() << "RoiAlign: batch_indices must be [num_rois] = [" << rois.shape()[0] << "], got "
                                << indices.describe();
    const std::vector<int64_t>& xs = x.shape();
    int64_t num_rois = rois.shape()[0];
    if (num_rois > 0 && xs[1] > 0 && (xs[2] == 0 || xs[3] == 0))
      return invalid_argument() << "RoiAlign: X " << x.describe() << " has no pixels to sample";
    out.resize(1);
    std::vector<int64_t> y_shape = {num_rois, xs[1], p.out_h, p.out_w};
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), y_shape, "the RoiAlign output"));
    switch (x.dtype()) {
      case DType::kFloat32:
        return roi_align_typed<float>(p, x.data_as<float>(), xs, rois, indices, out[0].data_as<float>());
      case DType::kFloat64:
        return roi_align_typed<double>(p, x.data_as<double>(), xs, rois, indices, out[0].data_as<double>());
      default: {
        // f16 / bf16: computed in f32, as the compiled kernels compute them.
        KILN_ASSIGN_OR_RETURN(Tensor x32, Tensor::allocate(DType::kFloat32, xs, "RoiAlign's f32 copy of X"));
        for (int64_t i = 0; i < x.numel(); ++i) x32.data_as<float>()[i] = static_cast<float>(x.get_f64(i));
        KILN_ASSIGN_OR_RETURN(Tensor y32, Tensor::allocate(DType::kFloat32, y_shape, "the RoiAlign output"));
        KILN_RETURN_IF_ERROR(roi_align_typed<float>(p, x32.data_as<float>(), xs, rois, indices, y32.data_as<float>()));
        for (int64_t i = 0; i < y32.numel(); ++i) out[0].set_f64(i, y32.data_as<float>()[i]);
        return Status::ok();
      }
    }
  });
}

// ---- DeformConv ----------------------------------------------------------------------------------

// Spatial dims DeformConv takes (X of rank 3 to 5); each sample interpolates
// between at most 2^kMaxSpatial pixels.
constexpr int64_t kMaxSpatial = 3;
constexpr int64_t kMaxCorners = int64_t{1} << kMaxSpatial;

// Elements of one column tile (input channels of a group x kernel positions
// rows, a run of output positions as columns): 128 KiB of f32.
constexpr int64_t kColumnTileElements = int64_t{1} << 15;

// The attributes of one DeformConv node, checked for their values; their
// lengths are checked against X's rank (resolve_lengths) once it is known.
struct DeformConvParams {
  int64_t group = 1, offset_group = 1;
  std::vector<int64_t> kernel_shape;  // empty: W's spatial dims
  std::vector<int64_t> strides, dilations, pads;  // empty: all 1, all 1, all 0
};

Result<DeformConvParams> deform_conv_params(const Node& n) {
  DeformConvParams p;
  p.group = n.attr_int("group", 1);
  if (p.group < 1) return node_invalid(n) << "group must be >= 1, got " << p.group;
  p.offset_group = n.attr_int("offset_group", 1);
  if (p.offset_group < 1) return node_invalid(n) << "offset_group must be >= 1, got " << p.offset_group;
  p.kernel_shape = n.attr_ints("kernel_shape");
  p.strides = n.attr_ints("strides");
  p.dilations = n.attr_ints("dilations");
  p.pads = n.attr_ints("pads");
  for (int64_t v : p.kernel_shape)
    if (v < 1) return node_invalid(n) << "kernel_shape values must be >= 1, got " << v;
  for (int64_t v : p.strides)
    if (v < 1) return node_invalid(n) << "strides must be >= 1, got " << v;
  for (int64_t v : p.dilations)
    if (v < 1) return node_invalid(n) << "dilations must be >= 1, got " << v;
  for (int64_t v : p.pads)
    if (v < 0) return node_invalid(n) << "pads must be >= 0, got " << v;
  return p;
}

// The attributes with their defaults for `spatial` spatial dims; an error
// message when one has the wrong number of values.
std::string resolve_lengths(DeformConvParams& p, size_t spatial) {
  auto fill = [&](std::vector<int64_t>& v, const char* name, size_t want, int64_t def) -> std::string {
    if (v.empty()) v.assign(want, def);
    if (v.size() == want) return "";
    return std::string(name) + " has " + std::to_string(v.size()) + " values, expected " + std::to_string(want) +
           " for " + std::to_string(spatial) + " spatial dims";
  };
  std::string e = fill(p.strides, "strides", spatial, 1);
  if (e.empty()) e = fill(p.dilations, "dilations", spatial, 1);
  if (e.empty()) e = fill(p.pads, "pads", 2 * spatial, 0);
  if (e.empty() && !p.kernel_shape.empty() && p.kernel_shape.size() != spatial)
    e = "kernel_shape has " + std::to_string(p.kernel_shape.size()) + " values, expected " + std::to_string(spatial);
  return e;
}

bool deform_conv_dtype_supported(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

const char* const kDeformConvInputs[] = {"X", "W", "offset", "B", "mask"};

// Output extent along one dim: floor((in + pads - ((k - 1) * dilation + 1)) / stride) + 1,
// or -1 when it is below 1 or the arithmetic overflows.
int64_t deform_conv_out_extent(int64_t in, int64_t k, int64_t stride, int64_t dilation, int64_t pad_sum) {
  int64_t span = 0, total = 0;
  if (__builtin_mul_overflow(k - 1, dilation, &span) || __builtin_add_overflow(in, pad_sum, &total)) return -1;
  total = total - span - 1;  // both >= 0 before: no overflow
  if (total < 0) return -1;
  return total / stride + 1;
}

Status infer_deform_conv(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DeformConvParams p, deform_conv_params(n));
  std::vector<std::optional<TensorType>> t(5);
  for (size_t i = 0; i < 5; ++i) {
    if (i >= 3 && !has_input(n, i)) continue;
    KILN_ASSIGN_OR_RETURN(TensorType ti, input_type(n, i));
    t[i] = std::move(ti);
  }
  const TensorType& x = *t[0];
  if (!dtype_is_float(x.dtype)) return node_invalid(n) << "X must be a float tensor, got " << x.to_string();
  if (!deform_conv_dtype_supported(x.dtype)) return node_unsupported(n) << "X of dtype " << dtype_name(x.dtype);
  for (size_t i = 1; i < 5; ++i) {
    if (t[i] && t[i]->dtype != x.dtype)
      return node_invalid(n) << kDeformConvInputs[i] << " must have X's dtype " << dtype_name(x.dtype) << ", got "
                             << t[i]->to_string();
  }
  // One rank for X, W, offset and mask; B is 1-D.
  int64_t rank = -1;
  for (size_t i : {0, 1, 2, 4}) {
    if (!t[i] || t[i]->rank() < 0) continue;
    if (rank < 0) rank = t[i]->rank();
    else if (t[i]->rank() != rank)
      return node_invalid(n) << "X, W, offset and mask must have one rank, got " << kDeformConvInputs[i] << " "
                             << t[i]->to_string() << " against rank " << rank;
  }
  if (t[3] && t[3]->rank() >= 0 && t[3]->rank() != 1)
    return node_invalid(n) << "B must be 1-D [oC], got " << t[3]->to_string();
  if (rank >= 0 && rank < 3)
    return node_invalid(n) << "X must be [N, C, D1, ...] with at least one spatial dim, got rank " << rank;
  if (rank > kMaxSpatial + 2)
    return node_unsupported(n) << rank - 2 << " spatial dims (1 to " << kMaxSpatial << " are supported)";
  if (rank < 0) {
    set_output_unknown_rank(n, 0, x.dtype);
    return Status::ok();
  }
  size_t spatial = static_cast<size_t>(rank - 2);
  std::string e = resolve_lengths(p, spatial);
  if (!e.empty()) return node_invalid(n) << e;

  auto dim = [&](size_t i, size_t d) -> std::optional<Expr> {
    if (!t[i] || !t[i]->has_shape()) return std::nullopt;
    return simplify((*t[i]->shape)[d], ctx.bounds);
  };
  auto cst = [](const std::optional<Expr>& d) -> std::optional<int64_t> {
    return d ? d->as_const() : std::nullopt;
  };
  // Kernel extents: kernel_shape, which must agree with W's spatial dims.
  std::vector<std::optional<int64_t>> kernel(spatial);
  for (size_t d = 0; d < spatial; ++d) {
    std::optional<int64_t> wk = cst(dim(1, d + 2));
    if (wk && *wk < 1) return node_invalid(n) << "W " << t[1]->to_string() << " has an empty kernel";
    if (!p.kernel_shape.empty()) {
      if (wk && *wk != p.kernel_shape[d])
        return node_invalid(n) << "kernel_shape dim " << d << " is " << p.kernel_shape[d] << ", W "
                               << t[1]->to_string() << " has " << *wk;
      kernel[d] = p.kernel_shape[d];
    } else {
      kernel[d] = wk;
    }
  }
  // Kernel positions; nullopt when some extent is unknown (or the product overflows).
  int64_t positions = 1;
  bool positions_known = true;
  for (const auto& k : kernel) positions_known = positions_known && k && !__builtin_mul_overflow(*k, positions, &positions);
  int64_t kernel_size = positions_known ? positions : -1;  // -1: unknown

  // Channels: C = group * W[1], divisible by offset_group; oC divisible by group.
  std::optional<int64_t> c = cst(dim(0, 1)), wc = cst(dim(1, 1)), oc = cst(dim(1, 0));
  if (c && *c % p.group != 0)
    return node_invalid(n) << "X has " << *c << " channels, not divisible by group " << p.group;
  if (c && *c % p.offset_group != 0)
    return node_invalid(n) << "X has " << *c << " channels, not divisible by offset_group " << p.offset_group;
  if (c && wc && *c != p.group * *wc)
    return node_invalid(n) << "W " << t[1]->to_string() << " expects " << p.group * *wc << " input channels (group "
                           << p.group << "), X " << x.to_string() << " has " << *c;
  if (oc && *oc % p.group != 0)
    return node_invalid(n) << "W " << t[1]->to_string() << " has " << *oc << " output channels, not divisible by group "
                           << p.group;

  // Output extents from X and the attributes.
  std::vector<std::optional<Expr>> out(spatial);
  for (size_t d = 0; d < spatial; ++d) {
    std::optional<Expr> in = dim(0, d + 2);
    if (!in || !kernel[d]) continue;
    int64_t pad_sum = 0, span = 0;
    if (__builtin_add_overflow(p.pads[d], p.pads[d + spatial], &pad_sum) ||
        __builtin_mul_overflow(*kernel[d] - 1, p.dilations[d], &span))
      return node_invalid(n) << "pads or dilations along dim " << d << " overflow";
    std::optional<int64_t> in_c = in->as_const();
    if (in_c) {
      int64_t o = deform_conv_out_extent(*in_c, *kernel[d], p.strides[d], p.dilations[d], pad_sum);
      if (o < 1)
        return node_invalid(n) << "output dim " << d << " would be empty: X " << x.to_string() << ", kernel "
                               << *kernel[d] << ", stride " << p.strides[d] << ", dilation " << p.dilations[d]
                               << ", pads " << p.pads[d] << " and " << p.pads[d + spatial];
      out[d] = Expr(o);
    } else {
      out[d] = simplify(floordiv(*in + Expr(pad_sum) - Expr(span) - Expr(1), Expr(p.strides[d])) + Expr(1),
                        ctx.bounds);
    }
  }

  // offset [N, offset_group * spatial * K, out...], mask [N, offset_group * K, out...], B [oC].
  auto check_map = [&](size_t i, std::optional<int64_t> channels, const char* layout) -> Status {
    if (!t[i] || !t[i]->has_shape()) return Status::ok();
    auto differ = [](const std::optional<Expr>& a, const std::optional<Expr>& b) {
      std::optional<int64_t> ca = a ? a->as_const() : std::nullopt, cb = b ? b->as_const() : std::nullopt;
      return ca && cb && *ca != *cb;
    };
    bool bad = differ(dim(i, 0), dim(0, 0)) || (channels && differ(dim(i, 1), Expr(*channels)));
    for (size_t d = 0; d < spatial; ++d) bad = bad || differ(dim(i, d + 2), out[d]);
    if (!bad) return Status::ok();
    StatusBuilder b = node_invalid(n);
    b << kDeformConvInputs[i] << " must be " << layout << " = [";
    b << (dim(0, 0) ? dim(0, 0)->to_string() : std::string("N")) << ", "
      << (channels ? std::to_string(*channels) : std::string("?"));
    for (size_t d = 0; d < spatial; ++d) b << ", " << (out[d] ? out[d]->to_string() : std::string("?"));
    b << "], got " << t[i]->to_string();
    return b;
  };
  auto times = [&](int64_t f) -> std::optional<int64_t> {
    int64_t a = 0, b = 0;
    if (kernel_size < 0 || __builtin_mul_overflow(p.offset_group, f, &a) || __builtin_mul_overflow(a, kernel_size, &b))
      return std::nullopt;
    return b;
  };
  KILN_RETURN_IF_ERROR(check_map(2, times(static_cast<int64_t>(spatial)),
                                 "[N, offset_group * spatial dims * kernel size, output dims...]"));
  KILN_RETURN_IF_ERROR(check_map(4, times(1), "[N, offset_group * kernel size, output dims...]"));
  if (t[3] && t[3]->has_shape()) {
    std::optional<int64_t> bc = cst(dim(3, 0));
    if (bc && oc && *bc != *oc)
      return node_invalid(n) << "B must be [oC] = [" << *oc << "], got " << t[3]->to_string();
  }

  // Y [N, oC, out...]: each dim from whichever input knows it best.
  auto pick = [&](std::initializer_list<std::optional<Expr>> candidates) -> Expr {
    std::optional<Expr> best;
    for (const auto& c : candidates) {
      if (!c) continue;
      if (c->as_const()) return *c;
      if (!best) best = c;
    }
    return best ? *best : ctx.fresh_symbol();
  };
  Shape y = {pick({dim(0, 0), dim(2, 0), dim(4, 0)}), pick({dim(1, 0), dim(3, 0)})};
  for (size_t d = 0; d < spatial; ++d) y.push_back(pick({out[d], dim(2, d + 2), dim(4, d + 2)}));
  set_output(n, 0, x.dtype, std::move(y), ctx);
  return Status::ok();
}

// The geometry of one DeformConv call, checked against its tensors.
struct DeformConvGeometry {
  int64_t spatial = 0;
  int64_t batch = 0, channels = 0, out_channels = 0, group = 1, offset_group = 1;
  int64_t in[kMaxSpatial] = {}, kernel[kMaxSpatial] = {}, out[kMaxSpatial] = {};
  int64_t stride[kMaxSpatial] = {}, dilation[kMaxSpatial] = {}, pad[kMaxSpatial] = {};
  int64_t plane = 1;        // input positions per channel
  int64_t kernel_size = 1;  // kernel positions
  int64_t positions = 1;    // output positions per channel
};

Result<DeformConvGeometry> deform_conv_geometry(DeformConvParams p, const Tensor& x, const Tensor& w,
                                                const Tensor& offset, const Tensor* bias, const Tensor* mask) {
  if (x.rank() < 3)
    return invalid_argument() << "DeformConv: X must be [N, C, D1, ...] with at least one spatial dim, got "
                              << x.describe();
  if (x.rank() > kMaxSpatial + 2)
    return unsupported() << "DeformConv: X " << x.describe() << " has " << x.rank() - 2 << " spatial dims (1 to "
                         << kMaxSpatial << " are supported)";
  const Tensor* same_rank[] = {&w, &offset, mask};
  for (size_t i = 0; i < 3; ++i) {
    if (same_rank[i] != nullptr && same_rank[i]->rank() != x.rank())
      return invalid_argument() << "DeformConv: " << kDeformConvInputs[i == 2 ? 4 : i + 1] << " "
                                << same_rank[i]->describe() << " must have X's rank " << x.rank();
  }
  DeformConvGeometry g;
  g.spatial = x.rank() - 2;
  size_t spatial = static_cast<size_t>(g.spatial);
  std::string e = resolve_lengths(p, spatial);
  if (!e.empty()) return invalid_argument() << "DeformConv: " << e;
  const std::vector<int64_t>& xs = x.shape();
  const std::vector<int64_t>& ws = w.shape();
  g.batch = xs[0];
  g.channels = xs[1];
  g.out_channels = ws[0];
  g.group = p.group;
  g.offset_group = p.offset_group;
  if (g.channels % g.group != 0 || ws[1] * g.group != g.channels)
    return invalid_argument() << "DeformConv: W " << w.describe() << " with group " << g.group
                              << " does not fit X " << x.describe() << " (C must be group * W[1])";
  if (g.out_channels % g.group != 0)
    return invalid_argument() << "DeformConv: W " << w.describe() << " has " << g.out_channels
                              << " output channels, not divisible by group " << g.group;
  if (g.channels % g.offset_group != 0)
    return invalid_argument() << "DeformConv: X " << x.describe() << " has " << g.channels
                              << " channels, not divisible by offset_group " << g.offset_group;
  for (size_t d = 0; d < spatial; ++d) {
    g.in[d] = xs[d + 2];
    g.kernel[d] = ws[d + 2];
    if (g.kernel[d] < 1) return invalid_argument() << "DeformConv: W " << w.describe() << " has an empty kernel";
    if (!p.kernel_shape.empty() && p.kernel_shape[d] != g.kernel[d])
      return invalid_argument() << "DeformConv: kernel_shape dim " << d << " is " << p.kernel_shape[d] << ", W "
                                << w.describe() << " has " << g.kernel[d];
    g.stride[d] = p.strides[d];
    g.dilation[d] = p.dilations[d];
    g.pad[d] = p.pads[d];
    int64_t pad_sum = 0;
    if (__builtin_add_overflow(p.pads[d], p.pads[d + spatial], &pad_sum))
      return invalid_argument() << "DeformConv: pads overflow";
    g.out[d] = deform_conv_out_extent(g.in[d], g.kernel[d], g.stride[d], g.dilation[d], pad_sum);
    if (g.out[d] < 1)
      return invalid_argument() << "DeformConv: output dim " << d << " would be empty: X " << x.describe()
                                << ", kernel " << g.kernel[d] << ", stride " << g.stride[d] << ", dilation "
                                << g.dilation[d] << ", pads " << p.pads[d] << " and " << p.pads[d + spatial];
    if (__builtin_mul_overflow(g.plane, g.in[d], &g.plane) ||
        __builtin_mul_overflow(g.kernel_size, g.kernel[d], &g.kernel_size) ||
        __builtin_mul_overflow(g.positions, g.out[d], &g.positions))
      return invalid_argument() << "DeformConv: the kernel or output of X " << x.describe() << " and W "
                                << w.describe() << " is too large";
  }
  // offset [N, offset_group * spatial * K, out...], mask [N, offset_group * K, out...].
  auto check_map = [&](const Tensor& t, const char* name, int64_t per_group) -> Status {
    std::vector<int64_t> want = {g.batch, 0};
    bool ok = !__builtin_mul_overflow(g.offset_group, per_group, &want[1]);
    want.insert(want.end(), g.out, g.out + spatial);
    if (ok && t.shape() == want) return Status::ok();
    return invalid_argument() << "DeformConv: " << name << " must be " << shape_to_string(want) << " (N, offset_group "
                              << g.offset_group << " * " << per_group << ", output dims), got " << t.describe();
  };
  int64_t per_group = 0;
  if (__builtin_mul_overflow(g.spatial, g.kernel_size, &per_group))
    return invalid_argument() << "DeformConv: kernel of W " << w.describe() << " is too large";
  KILN_RETURN_IF_ERROR(check_map(offset, "offset", per_group));
  if (mask != nullptr) KILN_RETURN_IF_ERROR(check_map(*mask, "mask", g.kernel_size));
  if (bias != nullptr && (bias->rank() != 1 || bias->shape()[0] != g.out_channels))
    return invalid_argument() << "DeformConv: B must be [oC] = [" << g.out_channels << "], got " << bias->describe();
  return g;
}

// Computes Y for work items [begin, end): item (n, group, tile of output
// positions). For each it fills the tile of the column matrix, rows (input
// channel of the group, kernel position), with the masked bilinear samples,
// then adds W's rows of the group times it into Y. Every element of Y is
// summed over the rows in the same order whatever the split into chunks.
template <typename T>
struct DeformConvJob {
  const T* x = nullptr;
  const T* w = nullptr;
  const T* offset = nullptr;
  const T* bias = nullptr;  // may be null
  const T* mask = nullptr;  // may be null: all ones
  T* y = nullptr;
  DeformConvGeometry g;
  int64_t tile = 1, tiles = 1;

  static void chunk(int64_t begin, int64_t end, void* env) { static_cast<const DeformConvJob*>(env)->run(begin, end); }

  int64_t group_channels() const { return g.channels / g.group; }
  int64_t rows() const { return group_channels() * g.kernel_size; }

  void run(int64_t begin, int64_t end) const {
    if (begin >= end) return;
    std::vector<T> col(static_cast<size_t>(rows() * tile));
    for (int64_t item = begin; item < end; ++item) {
      int64_t t = item % tiles;
      int64_t grp = (item / tiles) % g.group;
      int64_t n = item / (tiles * g.group);
      int64_t p0 = t * tile;
      int64_t width = std::min(tile, g.positions - p0);
      fill_columns(n, grp, p0, width, col.data());
      multiply(n, grp, p0, width, col.data());
    }
  }

  void fill_columns(int64_t n, int64_t grp, int64_t p0, int64_t width, T* col) const {
    int64_t cg = group_channels();
    if (cg == 0) return;
    int64_t c_begin = grp * cg, c_end = c_begin + cg;
    int64_t per_offset_group = g.channels / g.offset_group;
    int64_t spatial = g.spatial, positions = g.positions, k_size = g.kernel_size;
    int64_t x_stride[kMaxSpatial] = {};  // element stride of each input dim
    int64_t s = 1;
    for (int64_t d = spatial - 1; d >= 0; --d) {
      x_stride[d] = s;
      s *= g.in[d];
    }
    for (int64_t og = c_begin / per_offset_group; og < g.offset_group && og * per_offset_group < c_end; ++og) {
      int64_t lo = std::max(c_begin, og * per_offset_group), hi = std::min(c_end, (og + 1) * per_offset_group);
      const T* off = offset + (n * g.offset_group + og) * k_size * spatial * positions;
      const T* msk = mask == nullptr ? nullptr : mask + (n * g.offset_group + og) * k_size * positions;
      for (int64_t k = 0; k < k_size; ++k) {
        int64_t kpos[kMaxSpatial] = {};
        for (int64_t d = spatial - 1, r = k; d >= 0; --d) {
          kpos[d] = r % g.kernel[d];
          r /= g.kernel[d];
        }
        for (int64_t q = 0; q < width; ++q) {
          int64_t p = p0 + q;
          // Along each dim: the pixel below the sample and the weight of the
          // one above it. Pixels outside X read as 0 (the reference's
          // GridSample with zeros padding), so a sample at or beyond one
          // pixel outside X is 0 (a NaN position too).
          int64_t low[kMaxSpatial];
          T frac[kMaxSpatial];
          bool inside = true;
          for (int64_t d = spatial - 1, r = p; d >= 0; --d) {
            int64_t o = r % g.out[d];
            r /= g.out[d];
            T pos = static_cast<T>(o * g.stride[d] - g.pad[d] + kpos[d] * g.dilation[d]) +
                    off[(k * spatial + d) * positions + p];
            if (!(pos > T(-1) && pos < static_cast<T>(g.in[d]))) {
              inside = false;
              break;
            }
            T fl = std::floor(pos);
            low[d] = static_cast<int64_t>(fl);
            frac[d] = pos - fl;
          }
          // The corners inside X (dim 0 slowest) and their weights.
          int64_t idx[kMaxCorners];
          T wt[kMaxCorners];
          int64_t corners = 0;
          for (int64_t b = 0; inside && b < (int64_t{1} << spatial); ++b) {
            int64_t at = 0;
            T weight = T(1);
            bool ok = true;
            for (int64_t d = 0; d < spatial && ok; ++d) {
              bool high = ((b >> (spatial - 1 - d)) & 1) != 0;
              int64_t i = low[d] + (high ? 1 : 0);
              ok = i >= 0 && i < g.in[d];
              at += i * x_stride[d];
              weight *= high ? frac[d] : T(1) - frac[d];
            }
            if (!ok) continue;
            idx[corners] = at;
            wt[corners] = weight;
            ++corners;
          }
          T m = msk == nullptr ? T(1) : msk[k * positions + p];
          for (int64_t c = lo; c < hi; ++c) {
            const T* image = x + (n * g.channels + c) * g.plane;
            T v = T(0);
            for (int64_t j = 0; j < corners; ++j) v += wt[j] * image[idx[j]];
            col[((c - c_begin) * k_size + k) * width + q] = v * m;
          }
        }
      }
    }
  }

  // Y[n, group's channels, p0 .. p0 + width) = W's rows of the group x col,
  // plus B; four output channels at a time, each element summed over the
  // rows in order.
  void multiply(int64_t n, int64_t grp, int64_t p0, int64_t width, const T* col) const {
    int64_t ocg = g.out_channels / g.group, r_count = rows();
    const T* wg = w + grp * ocg * r_count;
    T* yg = y + (n * g.out_channels + grp * ocg) * g.positions + p0;
    int64_t o = 0;
    for (; o + 4 <= ocg; o += 4) {
      T* y0 = yg + o * g.positions;
      T* y1 = y0 + g.positions;
      T* y2 = y1 + g.positions;
      T* y3 = y2 + g.positions;
      std::fill(y0, y0 + width, T(0));
      std::fill(y1, y1 + width, T(0));
      std::fill(y2, y2 + width, T(0));
      std::fill(y3, y3 + width, T(0));
      const T* w0 = wg + o * r_count;
      for (int64_t r = 0; r < r_count; ++r) {
        T a0 = w0[r], a1 = w0[r_count + r], a2 = w0[2 * r_count + r], a3 = w0[3 * r_count + r];
        const T* cr = col + r * width;
        for (int64_t q = 0; q < width; ++q) {
          T v = cr[q];
          y0[q] += a0 * v;
          y1[q] += a1 * v;
          y2[q] += a2 * v;
          y3[q] += a3 * v;
        }
      }
    }
    for (; o < ocg; ++o) {
      T* y0 = yg + o * g.positions;
      std::fill(y0, y0 + width, T(0));
      const T* w0 = wg + o * r_count;
      for (int64_t r = 0; r < r_count; ++r) {
        T a0 = w0[r];
        const T* cr = col + r * width;
        for (int64_t q = 0; q < width; ++q) y0[q] += a0 * cr[q];
      }
    }
    if (bias != nullptr) {
      for (o = 0; o < ocg; ++o) {
        T b = bias[grp * ocg + o];
        T* y0 = yg + o * g.positions;
        for (int64_t q = 0; q < width; ++q) y0[q] += b;
      }
    }
  }
};

// Y for inputs of element type T (already checked against g).
template <typename T>
void deform_conv_typed(const DeformConvGeometry& g, const T* x, const T* w, const T* offset, const T* bias,
                       const T* mask, T* y) {
  int64_t y_size = g.batch * g.out_channels * g.positions;
  if (g.batch == 0 || g.out_channels == 0) return;
  if (g.channels == 0 || g.plane == 0) {
    // Nothing to sample (no input channels, or every sample outside an empty
    // X): Y is B. Also keeps the column rows bounded by W's and X's sizes.
    for (int64_t i = 0; i < y_size; ++i)
      y[i] = bias == nullptr ? T(0) : bias[(i / g.positions) % g.out_channels];
    return;
  }
  DeformConvJob<T> job;
  job.x = x;
  job.w = w;
  job.offset = offset;
  job.bias = bias;
  job.mask = mask;
  job.y = y;
  job.g = g;
  int64_t rows = std::max<int64_t>(job.rows(), 1);
  job.tile = std::min(g.positions, std::clamp<int64_t>(kColumnTileElements / rows, 16, 256));
  job.tiles = (g.positions + job.tile - 1) / job.tile;
  int64_t items = g.batch * g.group * job.tiles;
  ThreadPool* pool = current_thread_pool();
  if (pool != nullptr && items > 1) pool->parallel_for(items, &DeformConvJob<T>::chunk, &job);
  else job.run(0, items);
}

// An f32 copy of a half-precision tensor (or of nothing).
Result<Tensor> deform_conv_f32(const Tensor* t, const char* what) {
  if (t == nullptr) return Tensor();
  KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::allocate(DType::kFloat32, t->shape(), what));
  for (int64_t i = 0; i < t->numel(); ++i) c.data_as<float>()[i] = static_cast<float>(t->get_f64(i));
  return c;
}

template <typename T>
const T* data_or_null(const Tensor* t) {
  return t == nullptr || !t->defined() ? nullptr : t->data_as<T>();
}

Result<RuntimeKernel> deform_conv_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(DeformConvParams p, deform_conv_params(n));
  return RuntimeKernel([p](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.size() < 3 || !in[0].defined() || !in[1].defined() || !in[2].defined())
      return invalid_argument() << "DeformConv: X, W and offset are required";
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    const Tensor& offset = in[2];
    const Tensor* bias = in.size() > 3 && in[3].defined() ? &in[3] : nullptr;
    const Tensor* mask = in.size() > 4 && in[4].defined() ? &in[4] : nullptr;
    if (!deform_conv_dtype_supported(x.dtype()))
      return invalid_argument() << "DeformConv: X must be f32, f64, f16 or bf16, got " << x.describe();
    const Tensor* others[] = {&w, &offset, bias, mask};
    for (size_t i = 0; i < 4; ++i) {
      if (others[i] != nullptr && others[i]->dtype() != x.dtype())
        return invalid_argument() << "DeformConv: " << kDeformConvInputs[i + 1] << " " << others[i]->describe()
                                  << " must have X's dtype " << x.describe();
    }
    KILN_ASSIGN_OR_RETURN(DeformConvGeometry g, deform_conv_geometry(p, x, w, offset, bias, mask));
    std::vector<int64_t> y_shape = {g.batch, g.out_channels};
    y_shape.insert(y_shape.end(), g.out, g.out + g.spatial);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), y_shape, "the DeformConv output"));
    switch (x.dtype()) {
      case DType::kFloat32:
        deform_conv_typed<float>(g, x.data_as<float>(), w.data_as<float>(), offset.data_as<float>(),
                                 data_or_null<float>(bias), data_or_null<float>(mask), out[0].data_as<float>());
        return Status::ok();
      case DType::kFloat64:
        deform_conv_typed<double>(g, x.data_as<double>(), w.data_as<double>(), offset.data_as<double>(),
                                  data_or_null<double>(bias), data_or_null<double>(mask), out[0].data_as<double>());
        return Status::ok();
      default: {
        // f16 / bf16: computed in f32, as RoiAlign computes them.
        KILN_ASSIGN_OR_RETURN(Tensor x32, deform_conv_f32(&x, "DeformConv's f32 copy of X"));
        KILN_ASSIGN_OR_RETURN(Tensor w32, deform_conv_f32(&w, "DeformConv's f32 copy of W"));
        KILN_ASSIGN_OR_RETURN(Tensor o32, deform_conv_f32(&offset, "DeformConv's f32 copy of offset"));
        KILN_ASSIGN_OR_RETURN(Tensor b32, deform_conv_f32(bias, "DeformConv's f32 copy of B"));
        KILN_ASSIGN_OR_RETURN(Tensor m32, deform_conv_f32(mask, "DeformConv's f32 copy of mask"));
        KILN_ASSIGN_OR_RETURN(Tensor y32, Tensor::allocate(DType::kFloat32, y_shape, "the DeformConv output"));
        deform_conv_typed<float>(g, x32.data_as<float>(), w32.data_as<float>(), o32.data_as<float>(),
                                 data_or_null<float>(&b32), data_or_null<float>(&m32), y32.data_as<float>());
        for (int64_t i = 0; i < y32.numel(); ++i) out[0].set_f64(i, y32.data_as<float>()[i]);
        return Status::ok();
      }
    }
  });
}

}  // namespace

void register_detection_ops() {
  register_op(kernel_op("RoiAlign", infer_roi_align, roi_align_kernel));
  register_op(kernel_op("DeformConv", infer_deform_conv, deform_conv_kernel));
}

}  // namespace kiln::ops
