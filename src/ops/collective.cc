// kiln:AllReduceMean(x): the mean of x over the processes of a data-parallel
// job (support/collective.h), the same on every process; x itself without a
// collective. A training step's gradients and loss go through it when
// TrainOptions::data_parallel is set (train/step.cc). Host kernel.
#include <string>
#include <vector>

#include "ops/common.h"
#include "support/collective.h"

namespace kiln::ops {

namespace {

Status infer_all_reduce_mean(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat64)
    return node_invalid(n) << "input must be f32 or f64, not " << dtype_name(t.dtype);
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  set_output(n, 0, t.dtype, std::move(s), ctx);
  return Status::ok();
}

Result<RuntimeKernel> all_reduce_mean_kernel(const Node& n) {
  const std::string name = n.name();
  return RuntimeKernel([name](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    out[0] = in[0].clone();
    std::shared_ptr<const Collective> c = collective();
    if (c == nullptr || c->size <= 1) return Status::ok();
    Tensor& y = out[0];
    Status st = c->all_reduce_sum(y.data(), y.numel(), y.dtype());
    if (!st.is_ok()) return st.with_context("kiln:AllReduceMean '" + name + "'");
    const double scale = 1.0 / c->size;
    if (y.dtype() == DType::kFloat32) {
      float* p = y.data_as<float>();
      for (int64_t i = 0; i < y.numel(); ++i) p[i] = static_cast<float>(p[i] * scale);
    } else {
      double* p = y.data_as<double>();
      for (int64_t i = 0; i < y.numel(); ++i) p[i] *= scale;
    }
    return Status::ok();
  });
}

}  // namespace

void register_collective_ops() {
  OpDef def = kernel_op("AllReduceMean", infer_all_reduce_mean, all_reduce_mean_kernel);
  def.domain = "kiln";
  register_op(std::move(def));
}

}  // namespace kiln::ops
