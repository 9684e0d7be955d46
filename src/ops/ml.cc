// ai.onnx.ml ops as runtime kernels (LabelEncoder is with the string ops in
// strings.cc): Binarizer and ArrayFeatureExtractor.
#include <cstring>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

OpDef ml_op(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
            std::function<Result<RuntimeKernel>(const Node&)> kernel) {
  OpDef def = kernel_op(name, std::move(infer), std::move(kernel));
  def.domain = "ai.onnx.ml";
  return def;
}

bool numeric(DType t) { return t != DType::kString && t != DType::kBool && dtype_is_compilable(t); }

// ---- Binarizer: y = x > threshold ? 1 : 0, in x's dtype ----------------------------------------------

Status infer_binarizer(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (!numeric(t.dtype)) return node_unsupported(n) << "input of dtype " << dtype_name(t.dtype);
  if (t.has_shape()) set_output(n, 0, t.dtype, *t.shape, ctx);
  else set_output_unknown_rank(n, 0, t.dtype);
  return Status::ok();
}

Result<RuntimeKernel> binarizer_kernel(const Node& n) {
  double threshold = n.attr_float("threshold", 0.0);
  return RuntimeKernel([threshold](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (!numeric(x.dtype())) return unsupported() << "Binarizer on " << x.describe();
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), x.shape(), "the Binarizer output"));
    for (int64_t i = 0; i < x.numel(); ++i) out[0].set_f64(i, x.get_f64(i) > threshold ? 1.0 : 0.0);
    return Status::ok();
  });
}

// ---- ArrayFeatureExtractor: Y = X[..., indices] -------------------------------------------------------
// Indices (int64, any shape, flattened) select along X's last axis; a 1-D X
// gives a [1, k] result, as ONNX Runtime and the reference do.

Status infer_feature_extractor(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType it, input_type(n, 1));
  if (it.dtype != DType::kInt64) return node_invalid(n) << "indices must be int64, got " << dtype_name(it.dtype);
  if (!t.has_shape() || !it.has_shape()) {
    set_output_unknown_rank(n, 0, t.dtype);
    return Status::ok();
  }
  if (t.rank() < 1) return node_invalid(n) << "input must have rank >= 1";
  Expr k(1);
  for (const Expr& d : *it.shape) k = k * d;
  Shape out = t.rank() == 1 ? Shape{Expr(1), simplify(k)} : *t.shape;
  out.back() = simplify(k);
  set_output(n, 0, t.dtype, out, ctx);
  return Status::ok();
}

Result<RuntimeKernel> feature_extractor_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor &x = in[0], &idx = in[1];
    if (x.rank() < 1) return invalid_argument() << "input must have rank >= 1, got " << x.describe();
    const int64_t last = x.shape().back(), rows = last == 0 ? 0 : x.numel() / last, k = idx.numel();
    for (int64_t j = 0; j < k; ++j) {
      int64_t v = idx.get_i64(j);
      if (v < 0 || v >= last)
        return invalid_argument() << "index " << v << " at position " << j << " is outside [0, " << last << ")";
    }
    std::vector<int64_t> shape = x.rank() == 1 ? std::vector<int64_t>{1, k} : x.shape();
    shape.back() = k;
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(x.dtype(), shape, "the ArrayFeatureExtractor output"));
    const int64_t size = dtype_size(x.dtype());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j) {
        int64_t src = r * last + idx.get_i64(j), dst = r * k + j;
        if (x.dtype() == DType::kString) out[0].data_as<std::string>()[dst] = x.data_as<std::string>()[src];
        else std::memcpy(static_cast<char*>(out[0].data()) + dst * size, static_cast<const char*>(x.data()) + src * size,
                         static_cast<size_t>(size));
      }
    return Status::ok();
  });
}

}  // namespace

void register_ml_ops() {
  register_op(ml_op("Binarizer", infer_binarizer, binarizer_kernel));
  register_op(ml_op("ArrayFeatureExtractor", infer_feature_extractor, feature_extractor_kernel));
}

}  // namespace kiln::ops
