// Signal ops: DFT (opsets 17 and 20), STFT and MelWeightMatrix (opset 17).
// Runtime kernels on the host, computed in double precision. Transforms of
// any length take O(n log n): radix-2 for powers of two, Bluestein's
// chirp-z (a power-of-two circular convolution) for the rest.
//
// Complex tensors follow ONNX: a trailing dim of 2 (real, imaginary); a
// trailing dim of 1 is a real signal.

#include <cmath>
#include <complex>
#include <numbers>
#include <optional>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

using Complex = std::complex<double>;

Expr known_or_fresh(InferContext& ctx, std::optional<int64_t> v) { return v ? Expr(*v) : ctx.fresh_symbol(); }

bool is_power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }

// In-place radix-2 transform; a.size() a power of two. Unscaled either way.
void fft_radix2(std::vector<Complex>& a, bool inverse) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {  // bit-reversal permutation
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    const double angle = (inverse ? 2.0 : -2.0) * std::numbers::pi / static_cast<double>(len);
    const size_t half = len / 2;
    std::vector<Complex> tw(half);
    for (size_t k = 0; k < half; ++k) tw[k] = std::polar(1.0, angle * static_cast<double>(k));
    for (size_t i = 0; i < n; i += len)
      for (size_t k = 0; k < half; ++k) {
        Complex u = a[i + k], v = a[i + k + half] * tw[k];
        a[i + k] = u + v;
        a[i + k + half] = u - v;
      }
  }
}

// X_k = sum_j x_j e^(-+2 pi i jk/n) for any n (unscaled).
void dft_any(std::vector<Complex>& a, bool inverse) {
  const size_t n = a.size();
  if (n <= 1) return;
  if (is_power_of_two(n)) {
    fft_radix2(a, inverse);
    return;
  }
  // Bluestein: jk = (j^2 + k^2 - (k-j)^2) / 2, so the transform is a chirp
  // times the circular convolution of (x times chirp) with the conjugate chirp.
  size_t m = 1;
  while (m < 2 * n - 1) m <<= 1;
  const double sign = inverse ? 1.0 : -1.0;
  std::vector<Complex> chirp(n);
  for (size_t k = 0; k < n; ++k) {
    // k^2 mod 2n keeps the angle small (exact in integers).
    uint64_t k2 = (static_cast<uint64_t>(k) * k) % (2 * n);
    chirp[k] = std::polar(1.0, sign * std::numbers::pi * static_cast<double>(k2) / static_cast<double>(n));
  }
  std::vector<Complex> x(m), y(m);
  for (size_t k = 0; k < n; ++k) x[k] = a[k] * chirp[k];
  y[0] = std::conj(chirp[0]);
  for (size_t k = 1; k < n; ++k) y[k] = y[m - k] = std::conj(chirp[k]);
  fft_radix2(x, false);
  fft_radix2(y, false);
  for (size_t k = 0; k < m; ++k) x[k] *= y[k];
  fft_radix2(x, true);
  const double scale = 1.0 / static_cast<double>(m);
  for (size_t k = 0; k < n; ++k) a[k] = x[k] * scale * chirp[k];
}

// Run-time checks; the VM prefixes their errors with the node.
Status check_signal_dtype(const Tensor& t, const char* what) {
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat64 && t.dtype() != DType::kFloat16)
    return unsupported() << what << " of dtype " << dtype_name(t.dtype())
                               << " (float16, float32 and float64 are supported)";
  return Status::ok();
}

// A scalar (or one-element) integer input's value at run time.
Result<int64_t> scalar_int(const Tensor& t, const char* what) {
  if (t.numel() != 1) return invalid_argument() << what << " must be a scalar, got " << t.describe();
  if (!dtype_is_int(t.dtype())) return invalid_argument() << what << " must be an integer, got " << t.describe();
  return t.get_i64(0);
}

Result<int64_t> normalize_run_axis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return invalid_argument() << "axis " << axis << " is out of range for rank " << rank;
  return axis < 0 ? axis + rank : axis;
}

// ---- DFT ----------------------------------------------------------------------------------------

// The axis: the attribute (opsets 17-19; infer fills in its default 1), else
// the axis input (opset 20), else -2 (opset 20's default).
std::optional<int64_t> dft_axis(const Node& n) {
  if (n.has_attr("axis")) return n.attr_int("axis", 1);
  if (has_input(n, 2)) {
    auto v = const_ints(n, 2);
    if (v && v->size() == 1) return (*v)[0];
    return std::nullopt;
  }
  return -2;
}

Status infer_dft(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!dtype_is_float(t.dtype)) return node_unsupported(n) << "input of dtype " << dtype_name(t.dtype);
  if (!n.has_attr("axis") && onnx_opset(ctx) != 0 && onnx_opset(ctx) < 20) n.set_attr("axis", Attribute::of_int(1));
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  const int64_t rank = static_cast<int64_t>(s.size());
  if (rank < 2) return node_invalid(n) << "input must have rank >= 2 (signal dims and a last dim of 1 or 2), got rank " << rank;
  if (auto last = s.back().as_const(); last && *last != 1 && *last != 2)
    return node_invalid(n) << "the last dim of the input must be 1 (real) or 2 (complex), got " << *last;
  bool onesided = n.attr_int("onesided", 0) != 0;
  std::optional<int64_t> length;
  if (has_input(n, 1)) {
    auto v = const_ints(n, 1);
    if (v && v->size() == 1) length = (*v)[0];
  }
  Shape out = s;
  out.back() = Expr(2);
  auto axis = dft_axis(n);
  if (!axis) {  // an axis known only at run time: every signal dim may change
    for (int64_t d = 0; d + 1 < rank; ++d) out[d] = ctx.fresh_symbol();
  } else {
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(n, *axis, rank));
    if (a == rank - 1) return node_invalid(n) << "axis " << *axis << " is the real/imaginary dim";
    if (length && *length <= 0) return node_invalid(n) << "dft_length must be positive, got " << *length;
    if (onesided && !length) {
      auto in_len = s[a].as_const();
      out[a] = known_or_fresh(ctx, in_len ? std::optional<int64_t>(*in_len / 2 + 1) : std::nullopt);
    } else if (length) {
      out[a] = Expr(onesided ? *length / 2 + 1 : *length);
    }
  }
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> dft_kernel(const Node& node) {
  bool inverse = node.attr_int("inverse", 0) != 0, onesided = node.attr_int("onesided", 0) != 0;
  std::optional<int64_t> attr_axis;
  if (node.has_attr("axis")) attr_axis = node.attr_int("axis", 1);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_signal_dtype(x, "input"));
    const int64_t rank = x.rank();
    if (rank < 2 || (x.shape().back() != 1 && x.shape().back() != 2))
      return invalid_argument() << "input must be [..., 1 or 2], got " << x.describe();
    int64_t axis = -2;
    if (attr_axis) {
      axis = *attr_axis;
    } else if (in.size() > 2 && in[2].defined()) {
      KILN_ASSIGN_OR_RETURN(axis, scalar_int(in[2], "axis"));
    }
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_run_axis(axis, rank));
    if (a == rank - 1) return invalid_argument() << "axis " << axis << " is the real/imaginary dim";
    const int64_t in_len = x.shape()[a];
    int64_t len = in_len;
    if (in.size() > 1 && in[1].defined()) {
      KILN_ASSIGN_OR_RETURN(len, scalar_int(in[1], "dft_length"));
    }
    if (len <= 0) return invalid_argument() << "dft_length must be positive, got " << len;
    const int64_t out_len = onesided ? len / 2 + 1 : len;
    std::vector<int64_t> shape = x.shape();
    shape[a] = out_len;
    shape.back() = 2;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape, "the DFT output"));
    const bool complex_in = x.shape().back() == 2;
    // Lines along the axis: outer index (dims before a) x inner (dims after a, without the last).
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < a; ++d) outer *= x.shape()[d];
    for (int64_t d = a + 1; d + 1 < rank; ++d) inner *= x.shape()[d];
    const int64_t cin = x.shape().back();
    std::vector<Complex> line(static_cast<size_t>(len));
    const double scale = inverse ? 1.0 / static_cast<double>(len) : 1.0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        std::fill(line.begin(), line.end(), Complex(0.0, 0.0));
        for (int64_t k = 0; k < std::min(in_len, len); ++k) {
          int64_t e = ((o * in_len + k) * inner + i) * cin;
          line[static_cast<size_t>(k)] = Complex(x.get_f64(e), complex_in ? x.get_f64(e + 1) : 0.0);
        }
        dft_any(line, inverse);
        for (int64_t k = 0; k < out_len; ++k) {
          int64_t e = ((o * out_len + k) * inner + i) * 2;
          out[0].set_f64(e, line[static_cast<size_t>(k)].real() * scale);
          out[0].set_f64(e + 1, line[static_cast<size_t>(k)].imag() * scale);
        }
      }
    return Status::ok();
  });
}

// ---- STFT ---------------------------------------------------------------------------------------

// Frame length: the frame_length input, else the window's length, else the signal's length.
Status infer_stft(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!dtype_is_float(t.dtype)) return node_unsupported(n) << "signal of dtype " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() != 3) return node_invalid(n) << "signal must be [batch, length, 1 or 2], got rank " << s.size();
  if (auto last = s[2].as_const(); last && *last != 1 && *last != 2)
    return node_invalid(n) << "the last dim of the signal must be 1 (real) or 2 (complex), got " << *last;
  bool onesided = n.attr_int("onesided", 1) != 0;
  std::optional<int64_t> frame_length, step, length = s[1].as_const();
  if (auto v = const_ints(n, 1); v && v->size() == 1) step = (*v)[0];
  if (has_input(n, 3)) {
    if (auto v = const_ints(n, 3); v && v->size() == 1) frame_length = (*v)[0];
  } else if (has_input(n, 2)) {
    KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 2));
    if (w.size() != 1) return node_invalid(n) << "window must be 1-D, got rank " << w.size();
    frame_length = w[0].as_const();
  } else {
    frame_length = length;
  }
  std::optional<int64_t> frames, bins;
  if (frame_length && *frame_length > 0) bins = onesided ? *frame_length / 2 + 1 : *frame_length;
  if (frame_length && step && length && *step > 0 && *frame_length <= *length)
    frames = 1 + (*length - *frame_length) / *step;
  set_output(n, 0, t.dtype, {s[0], known_or_fresh(ctx, frames), known_or_fresh(ctx, bins), Expr(2)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> stft_kernel(const Node& node) {
  bool onesided = node.attr_int("onesided", 1) != 0;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    KILN_RETURN_IF_ERROR(check_signal_dtype(x, "signal"));
    if (x.rank() != 3 || (x.shape()[2] != 1 && x.shape()[2] != 2))
      return invalid_argument() << "signal must be [batch, length, 1 or 2], got " << x.describe();
    const int64_t batch = x.shape()[0], length = x.shape()[1], cin = x.shape()[2];
    KILN_ASSIGN_OR_RETURN(int64_t step, scalar_int(in[1], "frame_step"));
    const bool has_window = in.size() > 2 && in[2].defined();
    if (has_window) {
      KILN_RETURN_IF_ERROR(check_signal_dtype(in[2], "window"));
      if (in[2].rank() != 1) return invalid_argument() << "window must be 1-D, got " << in[2].describe();
    }
    int64_t frame_length = has_window ? in[2].shape()[0] : length;
    if (in.size() > 3 && in[3].defined()) {
      KILN_ASSIGN_OR_RETURN(frame_length, scalar_int(in[3], "frame_length"));
      if (has_window && in[2].shape()[0] != frame_length)
        return invalid_argument() << "window length " << in[2].shape()[0] << " differs from frame_length " << frame_length;
    }
    if (step <= 0) return invalid_argument() << "frame_step must be positive, got " << step;
    if (frame_length <= 0 || frame_length > length)
      return invalid_argument() << "frame_length " << frame_length << " must be in [1, signal length " << length << "]";
    const int64_t frames = 1 + (length - frame_length) / step;
    const int64_t bins = onesided ? frame_length / 2 + 1 : frame_length;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), {batch, frames, bins, 2}, "the STFT output"));
    std::vector<double> window(static_cast<size_t>(frame_length), 1.0);
    if (has_window)
      for (int64_t k = 0; k < frame_length; ++k) window[static_cast<size_t>(k)] = in[2].get_f64(k);
    std::vector<Complex> line(static_cast<size_t>(frame_length));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t f = 0; f < frames; ++f) {
        for (int64_t k = 0; k < frame_length; ++k) {
          int64_t e = (b * length + f * step + k) * cin;
          double w = window[static_cast<size_t>(k)];
          line[static_cast<size_t>(k)] = Complex(x.get_f64(e) * w, cin == 2 ? x.get_f64(e + 1) * w : 0.0);
        }
        dft_any(line, false);
        for (int64_t k = 0; k < bins; ++k) {
          int64_t e = ((b * frames + f) * bins + k) * 2;
          out[0].set_f64(e, line[static_cast<size_t>(k)].real());
          out[0].set_f64(e + 1, line[static_cast<size_t>(k)].imag());
        }
      }
    return Status::ok();
  });
}

// ---- MelWeightMatrix ----------------------------------------------------------------------------

// Triangular filters between mel-spaced points, as the ONNX reference
// computes them: num_mel_bins + 2 points spaced (high - low) / (num_mel_bins
// + 2) apart in mel, mapped to spectrogram bins by floor((dft_length + 1) *
// hz / sample_rate).
Status infer_mel(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DType out, elem_type_attr(n, "output_datatype", DType::kFloat32));
  if (!dtype_is_float(out)) return node_unsupported(n) << "output_datatype " << dtype_name(out);
  std::optional<int64_t> mel, dft;
  if (auto v = const_ints(n, 0); v && v->size() == 1) mel = (*v)[0];
  if (auto v = const_ints(n, 1); v && v->size() == 1) dft = (*v)[0];
  set_output(n, 0, out, {known_or_fresh(ctx, dft ? std::optional<int64_t>(*dft / 2 + 1) : std::nullopt),
                         known_or_fresh(ctx, mel)}, ctx);
  return Status::ok();
}

Result<RuntimeKernel> mel_kernel(const Node& node) {
  DType out_t = static_cast<DType>(node.attr_int("output_datatype", 1));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    KILN_ASSIGN_OR_RETURN(int64_t mel_bins, scalar_int(in[0], "num_mel_bins"));
    KILN_ASSIGN_OR_RETURN(int64_t dft_length, scalar_int(in[1], "dft_length"));
    KILN_ASSIGN_OR_RETURN(int64_t sample_rate, scalar_int(in[2], "sample_rate"));
    for (int i : {3, 4})
      if (in[i].numel() != 1 || !dtype_is_float(in[i].dtype()))
        return invalid_argument() << "edge frequencies must be float scalars, got " << in[i].describe();
    double low = in[3].get_f64(0), high = in[4].get_f64(0);
    if (mel_bins <= 0 || dft_length <= 0 || sample_rate <= 0)
      return invalid_argument() << "num_mel_bins, dft_length and sample_rate must be positive (got " << mel_bins << ", "
                             << dft_length << ", " << sample_rate << ")";
    if (!(low >= 0 && low < high) || !std::isfinite(high))
      return invalid_argument() << "need 0 <= lower_edge_hertz < upper_edge_hertz, got " << low << " and " << high;
    const int64_t spec_bins = dft_length / 2 + 1;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(out_t, {spec_bins, mel_bins}, "the mel weight matrix"));
    for (int64_t e = 0; e < out[0].numel(); ++e) out[0].set_f64(e, 0.0);
    auto to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
    const double low_mel = to_mel(low), step = (to_mel(high) - low_mel) / static_cast<double>(mel_bins + 2);
    std::vector<int64_t> point(static_cast<size_t>(mel_bins + 2));
    for (int64_t i = 0; i < mel_bins + 2; ++i) {
      double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * step + low_mel) / 2595.0) - 1.0);
      point[static_cast<size_t>(i)] =
          static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate)));
      if (point[static_cast<size_t>(i)] < 0 || point[static_cast<size_t>(i)] >= spec_bins)
        return invalid_argument() << "upper_edge_hertz " << high << " maps past the last spectrogram bin " << spec_bins - 1
                               << " (sample_rate " << sample_rate << ", dft_length " << dft_length << ")";
    }
    for (int64_t i = 0; i < mel_bins; ++i) {
      int64_t lo = point[static_cast<size_t>(i)], mid = point[static_cast<size_t>(i + 1)],
              hi = point[static_cast<size_t>(i + 2)];
      if (mid == lo) {
        out[0].set_f64(mid * mel_bins + i, 1.0);
      } else {
        for (int64_t j = lo; j <= mid; ++j)
          out[0].set_f64(j * mel_bins + i, static_cast<double>(j - lo) / static_cast<double>(mid - lo));
      }
      for (int64_t j = mid; j < hi; ++j)
        out[0].set_f64(j * mel_bins + i, static_cast<double>(hi - j) / static_cast<double>(hi - mid));
    }
    return Status::ok();
  });
}

}  // namespace

void register_signal_ops() {
  register_op(kernel_op("DFT", infer_dft, dft_kernel));
  register_op(kernel_op("STFT", infer_stft, stft_kernel));
  register_op(kernel_op("MelWeightMatrix", infer_mel, mel_kernel));
}

}  // namespace kiln::ops
