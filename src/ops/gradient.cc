// GradBuilder's helpers (ops/gradient.h), shared by the gradient rules.
#include "ops/gradient.h"

#include "ops/common.h"

namespace kiln {
namespace ops {

Result<Value*> GradBuilder::add1(const std::string& op_type, const std::vector<Value*>& inputs,
                                 const std::map<std::string, Attribute>& attrs) {
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> outs, add(op_type, inputs, attrs, 1));
  return outs[0];
}

Value* GradBuilder::scalar(double v, const Value* like) {
  Tensor t(like->dtype(), {});
  t.set_f64(0, v);
  return constant(std::move(t));
}

Value* GradBuilder::ints(const std::vector<int64_t>& v) {
  Tensor t(DType::kInt64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data_as<int64_t>()[i] = v[i];
  return constant(std::move(t));
}

Result<Value*> GradBuilder::reduce_sum(Value* x, const std::vector<int64_t>& axes, bool keepdims) {
  std::map<std::string, Attribute> attrs = {{"keepdims", Attribute::of_int(keepdims ? 1 : 0)}};
  if (opset() < 13) {
    attrs["axes"] = Attribute::of_ints(axes);
    return add1("ReduceSum", {x}, attrs);
  }
  return add1("ReduceSum", {x, ints(axes)}, attrs);
}

Result<Value*> GradBuilder::reduce_mean(Value* x, const std::vector<int64_t>& axes) {
  std::map<std::string, Attribute> attrs = {{"keepdims", Attribute::of_int(1)}};
  if (opset() < 18) {
    attrs["axes"] = Attribute::of_ints(axes);
    return add1("ReduceMean", {x}, attrs);
  }
  return add1("ReduceMean", {x, ints(axes)}, attrs);
}

Result<Value*> GradBuilder::unsqueeze(Value* x, const std::vector<int64_t>& axes) {
  if (opset() < 13) return add1("Unsqueeze", {x}, {{"axes", Attribute::of_ints(axes)}});
  return add1("Unsqueeze", {x, ints(axes)});
}

Result<Value*> GradBuilder::reshape_like(Value* x, Value* like) {
  const TensorType& t = like->type();
  if (t.has_shape() && t.is_static()) return add1("Reshape", {x, ints(t.static_shape())});
  KILN_ASSIGN_OR_RETURN(Value* shape, add1("Shape", {like}));
  return add1("Reshape", {x, shape});
}

Status GradBuilder::give(size_t i, Value* grad, const Shape* full) {
  if (!wants(i) || grad == nullptr) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Value* g, unbroadcast(grad, i, full));
  return set_input_grad(i, g);
}

Result<Value*> GradBuilder::transpose_last2(Value* x, int64_t rank) {
  std::vector<int64_t> perm;
  for (int64_t a = 0; a < rank; ++a) perm.push_back(a);
  std::swap(perm[static_cast<size_t>(rank - 1)], perm[static_cast<size_t>(rank - 2)]);
  return add1("Transpose", {x}, {{"perm", Attribute::of_ints(perm)}});
}

Result<Value*> GradBuilder::unbroadcast(Value* grad, size_t i, const Shape* full) {
  const Node& n = node();
  const Value* in = n.input(i);
  const Value* out = n.output(0);
  if (!in->type().has_shape() || (!full && !out->type().has_shape()))
    return node_unsupported(n) << "gradient through a broadcast of unknown rank";
  const Shape& is = *in->type().shape;
  const Shape& os = full ? *full : *out->type().shape;
  if (os.size() < is.size()) return internal_error() << n.describe() << ": gradient of a higher rank than its input";
  const size_t lead = os.size() - is.size();
  std::vector<int64_t> axes;
  for (size_t a = 0; a < lead; ++a) axes.push_back(static_cast<int64_t>(a));
  for (size_t j = 0; j < is.size(); ++j) {
    const Expr& d = is[j];
    const Expr& o = os[lead + j];
    if (prove_equal(d, o)) continue;
    if (d.as_const() == 1) {
      axes.push_back(static_cast<int64_t>(lead + j));
      continue;
    }
    return node_unsupported(n) << "gradient of input " << i << " through a broadcast of dim " << print_expr(d)
                               << " to " << print_expr(o) << " that the types do not decide";
  }
  if (axes.empty()) return grad;
  KILN_ASSIGN_OR_RETURN(Value* summed, reduce_sum(grad, axes, true));
  if (lead == 0) return summed;
  return reshape_like(summed, const_cast<Value*>(in));
}

}  // namespace ops

}  // namespace kiln
