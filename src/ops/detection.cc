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

}  // namespace

void register_detection_ops() { register_op(kernel_op("RoiAlign", infer_roi_align, roi_align_kernel)); }

}  // namespace kiln::ops
