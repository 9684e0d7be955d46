// Random ops: RandomUniform, RandomNormal, RandomUniformLike,
// RandomNormalLike, Bernoulli, Multinomial, and Dropout in training mode
// (the compiled Dropout in elementwise.cc covers inference and ratio 0).
//
// Random numbers come from Philox4x32-10, a counter-based generator: element
// i of a run's stream is a pure function of (key, i), so a node with a `seed`
// attribute gives the same values on every run, from any thread, whatever
// else runs at the same time. Without a seed, each run draws a fresh key
// (process-wide entropy plus a run counter), as the ONNX spec leaves it.

#include <atomic>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// ---- Philox4x32-10 --------------------------------------------------------------------------------

struct Philox {
  uint32_t key[2];

  // Four 32-bit outputs for counter `ctr` (the block index).
  void block(uint64_t ctr, uint32_t out[4]) const {
    uint32_t c[4] = {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0, 0};
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0], p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
      uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
      c[0] = n0;
      c[1] = static_cast<uint32_t>(p1);
      c[2] = n2;
      c[3] = static_cast<uint32_t>(p0);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int i = 0; i < 4; ++i) out[i] = c[i];
  }
};

// A run's stream: uniform doubles in [0, 1) with 53 random bits, two 32-bit
// words each, in counter order.
class Stream {
 public:
  explicit Stream(Philox g) : g_(g) {}
  double uniform() {
    uint64_t hi = next() >> 5, lo = next() >> 6;  // 27 + 26 bits
    return (static_cast<double>(hi) * 67108864.0 + static_cast<double>(lo)) * (1.0 / 9007199254740992.0);
  }
  // Box-Muller; both values of a pair are used.
  double normal() {
    if (spare_) {
      spare_ = false;
      return saved_;
    }
    double u1 = uniform(), u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(1.0 - u1)), t = 2.0 * std::numbers::pi * u2;
    saved_ = r * std::sin(t);
    spare_ = true;
    return r * std::cos(t);
  }

 private:
  uint32_t next() {
    if (used_ == 4) {
      g_.block(ctr_++, buf_);
      used_ = 0;
    }
    return buf_[used_++];
  }
  Philox g_;
  uint64_t ctr_ = 0;
  uint32_t buf_[4] = {};
  int used_ = 4;
  bool spare_ = false;
  double saved_ = 0;
};

// The generator of one run: from the seed attribute (a float in ONNX; its
// bits, so 1.0 and 1.5 differ), else fresh.
class RunKeys {
 public:
  explicit RunKeys(const Node& n) {
    if (n.has_attr("seed")) {
      double s = n.attr_float("seed", 0.0);
      uint64_t bits;
      std::memcpy(&bits, &s, sizeof bits);
      fixed_ = bits ^ 0x5DEECE66Dull;
    }
  }
  Stream stream() const {
    uint64_t k = fixed_ ? *fixed_ : fresh();
    return Stream(Philox{{static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)}});
  }

 private:
  static uint64_t fresh() {
    static const uint64_t base = [] {
      std::random_device rd;
      return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    static std::atomic<uint64_t> counter{0};
    uint64_t x = base + 0x9E3779B97F4A7C15ull * counter.fetch_add(1, std::memory_order_relaxed);
    x ^= x >> 31;  // splitmix finalizer: neighbouring runs get unrelated keys
    x *= 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 29);
  }
  std::optional<uint64_t> fixed_;
};

bool is_float_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

Result<DType> dtype_attr(const Node& n, DType def, bool (*allowed)(DType), const char* what) {
  if (!n.has_attr("dtype")) return def;
  int64_t v = n.attr_int("dtype", 1);
  DType t = static_cast<DType>(v);
  if (v < 1 || v > static_cast<int64_t>(DType::kFloat4E2M1) || !allowed(t))
    return node_unsupported(n) << "dtype " << v << " (" << what << ")";
  return t;
}

// ---- RandomUniform, RandomNormal and their *Like forms ----------------------------------------------

// `like`: the output has input 0's shape (and dtype unless `dtype` is given);
// otherwise the `shape` attribute.
Status infer_random(Node& n, InferContext& ctx, bool like) {
  DType def = DType::kFloat32;
  Shape shape;
  if (like) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
    def = is_float_dtype(t.dtype) ? t.dtype : DType::kFloat32;
    KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(n, def, is_float_dtype, "float16, bfloat16, float or double"));
    if (!n.has_attr("dtype") && !is_float_dtype(t.dtype))
      return node_unsupported(n) << "input of dtype " << dtype_name(t.dtype) << " without a float dtype attribute";
    if (!t.has_shape()) {
      set_output_unknown_rank(n, 0, out);
      return Status::ok();
    }
    set_output(n, 0, out, *t.shape, ctx);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(n, def, is_float_dtype, "float16, bfloat16, float or double"));
  if (!n.has_attr("shape")) return node_invalid(n) << "missing attribute shape";
  for (int64_t d : n.attr_ints("shape")) {
    if (d < 0) return node_invalid(n) << "negative dim " << d << " in attribute shape";
    shape.push_back(Expr(d));
  }
  set_output(n, 0, out, shape, ctx);
  return Status::ok();
}

Result<RuntimeKernel> random_kernel(const Node& n, bool like, bool normal) {
  RunKeys keys(n);
  double a = normal ? n.attr_float("mean", 0.0) : n.attr_float("low", 0.0);
  double b = normal ? n.attr_float("scale", 1.0) : n.attr_float("high", 1.0);
  std::vector<int64_t> shape = like ? std::vector<int64_t>{} : n.attr_ints("shape");
  std::optional<DType> attr_dtype;
  if (n.has_attr("dtype")) attr_dtype = static_cast<DType>(n.attr_int("dtype", 1));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    DType t = attr_dtype ? *attr_dtype : like ? in[0].dtype() : DType::kFloat32;
    if (!is_float_dtype(t)) return unsupported() << "random values of dtype " << dtype_name(t);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(t, like ? in[0].shape() : shape, "the random output"));
    Stream s = keys.stream();
    for (int64_t i = 0; i < out[0].numel(); ++i) out[0].set_f64(i, normal ? a + b * s.normal() : a + (b - a) * s.uniform());
    return Status::ok();
  });
}

// ---- Bernoulli ----------------------------------------------------------------------------------

bool bernoulli_dtype(DType t) {
  return is_float_dtype(t) || t == DType::kBool || (dtype_is_int(t) && t != DType::kUInt4 && t != DType::kInt4);
}

Status infer_bernoulli(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat64 && t.dtype != DType::kFloat16)
    return node_unsupported(n) << "probabilities of dtype " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(n, t.dtype, bernoulli_dtype, "a number or bool"));
  if (t.has_shape()) set_output(n, 0, out, *t.shape, ctx);
  else set_output_unknown_rank(n, 0, out);
  return Status::ok();
}

Result<RuntimeKernel> bernoulli_kernel(const Node& n) {
  RunKeys keys(n);
  std::optional<DType> attr_dtype;
  if (n.has_attr("dtype")) attr_dtype = static_cast<DType>(n.attr_int("dtype", 1));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& p = in[0];
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(attr_dtype.value_or(p.dtype()), p.shape(), "the Bernoulli output"));
    Stream s = keys.stream();
    for (int64_t i = 0; i < p.numel(); ++i) {
      double pi = p.get_f64(i);
      if (!(pi >= 0.0 && pi <= 1.0))
        return invalid_argument() << "probability " << pi << " at element " << i << " is outside [0, 1]";
      out[0].set_f64(i, s.uniform() < pi ? 1.0 : 0.0);
    }
    return Status::ok();
  });
}

// ---- Multinomial --------------------------------------------------------------------------------

Status infer_multinomial(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!is_float_dtype(t.dtype)) return node_unsupported(n) << "input of dtype " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(
      DType out, dtype_attr(n, DType::kInt32, [](DType d) { return d == DType::kInt32 || d == DType::kInt64; },
                            "int32 or int64"));
  int64_t samples = n.attr_int("sample_size", 1);
  if (samples < 1) return node_invalid(n) << "sample_size " << samples << " (must be >= 1)";
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() != 2) return node_invalid(n) << "input must be [batch_size, class_size], got rank " << s.size();
  set_output(n, 0, out, {s[0], Expr(samples)}, ctx);
  return Status::ok();
}

// Each row holds unnormalized log-probabilities; samples by inverting the
// cumulative distribution of softmax(row).
Result<RuntimeKernel> multinomial_kernel(const Node& n) {
  RunKeys keys(n);
  DType out_t = n.has_attr("dtype") ? static_cast<DType>(n.attr_int("dtype", 6)) : DType::kInt32;
  int64_t samples = n.attr_int("sample_size", 1);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.rank() != 2 || x.shape()[1] < 1)
      return invalid_argument() << "input must be [batch_size, class_size >= 1], got " << x.describe();
    const int64_t batch = x.shape()[0], classes = x.shape()[1];
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(out_t, {batch, samples}, "the Multinomial output"));
    Stream s = keys.stream();
    std::vector<double> cdf(static_cast<size_t>(classes));
    for (int64_t b = 0; b < batch; ++b) {
      double mx = -INFINITY;
      for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, x.get_f64(b * classes + c));
      if (!std::isfinite(mx)) return invalid_argument() << "row " << b << " has no finite log-probability";
      double total = 0;
      for (int64_t c = 0; c < classes; ++c) {
        double v = x.get_f64(b * classes + c);
        if (std::isnan(v)) return invalid_argument() << "NaN log-probability in row " << b;
        total += std::exp(v - mx);
        cdf[static_cast<size_t>(c)] = total;
      }
      for (int64_t k = 0; k < samples; ++k) {
        double u = s.uniform() * total;
        int64_t c = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
        out[0].set_f64(b * samples + k, static_cast<double>(std::min(c, classes - 1)));
      }
    }
    return Status::ok();
  });
}

// ---- Dropout (training mode) ----------------------------------------------------------------------

// output = x * mask / (1 - ratio), mask[i] = uniform >= ratio; with
// training_mode false (read at run time) the identity and an all-true mask.
Result<RuntimeKernel> dropout_kernel(const Node& n) {
  RunKeys keys(n);
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (!is_float_dtype(x.dtype())) return unsupported() << "Dropout on " << dtype_name(x.dtype()) << " tensors";
    double ratio = 0.5;
    if (in.size() > 1 && in[1].defined()) {
      if (in[1].numel() != 1) return invalid_argument() << "ratio must be a scalar, got " << in[1].describe();
      ratio = in[1].get_f64(0);
    }
    bool training = in.size() > 2 && in[2].defined() && in[2].numel() == 1 && in[2].get_f64(0) != 0;
    if (in.size() > 2 && in[2].defined() && in[2].numel() != 1)
      return invalid_argument() << "training_mode must be a scalar, got " << in[2].describe();
    if (training && !(ratio >= 0.0 && ratio < 1.0)) return invalid_argument() << "ratio " << ratio << " is outside [0, 1)";
    out.resize(2);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), x.shape(), "the Dropout output"));
    KILN_ASSIGN_OR_RETURN(out[1], Tensor::allocate(DType::kBool, x.shape(), "the Dropout mask"));
    Stream s = keys.stream();
    const double scale = 1.0 / (1.0 - (training ? ratio : 0.0));
    for (int64_t i = 0; i < x.numel(); ++i) {
      bool keep = !training || ratio == 0.0 || s.uniform() >= ratio;
      out[0].set_f64(i, keep ? x.get_f64(i) * scale : 0.0);
      out[1].set_f64(i, keep ? 1.0 : 0.0);
    }
    return Status::ok();
  });
}

}  // namespace

// Used by elementwise.cc's Dropout (compiled identity otherwise).
Result<RuntimeKernel> dropout_training_kernel(const Node& n) { return dropout_kernel(n); }

void register_random_ops() {
  register_op(kernel_op("RandomUniform", [](Node& n, InferContext& c) { return infer_random(n, c, false); },
                      [](const Node& n) { return random_kernel(n, false, false); }));
  register_op(kernel_op("RandomNormal", [](Node& n, InferContext& c) { return infer_random(n, c, false); },
                      [](const Node& n) { return random_kernel(n, false, true); }));
  register_op(kernel_op("RandomUniformLike", [](Node& n, InferContext& c) { return infer_random(n, c, true); },
                      [](const Node& n) { return random_kernel(n, true, false); }));
  register_op(kernel_op("RandomNormalLike", [](Node& n, InferContext& c) { return infer_random(n, c, true); },
                      [](const Node& n) { return random_kernel(n, true, true); }));
  register_op(kernel_op("Bernoulli", infer_bernoulli, bernoulli_kernel));
  register_op(kernel_op("Multinomial", infer_multinomial, multinomial_kernel));
}

}  // namespace kiln::ops
