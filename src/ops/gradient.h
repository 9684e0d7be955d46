// Gradient rules: what an op's reverse-mode rule sees and builds. A rule is
// registered beside the op's inference (OpDef::gradient, ops/registry.h);
// train/autodiff.cc calls it once per node that lies on a path from a
// parameter to the loss, in reverse order, with the gradients of the node's
// outputs, and the rule adds the nodes computing its inputs' gradients to the
// graph (ordinary ONNX ops: the gradient graph goes through the same passes,
// fusion, operator strategy and kernels as any graph).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"

namespace kiln::ops {

class GradBuilder {
 public:
  virtual ~GradBuilder() = default;
  virtual const Node& node() const = 0;
  // The gradient of the loss with respect to the node's output i, of its
  // type; null where none flows.
  virtual Value* output_grad(size_t i) const = 0;
  // True when input i needs a gradient (a parameter lies behind it).
  virtual bool wants(size_t i) const = 0;
  // Adds a node and infers its outputs' types; returns its outputs.
  virtual Result<std::vector<Value*>> add(const std::string& op_type, const std::vector<Value*>& inputs,
                                          const std::map<std::string, Attribute>& attrs = {},
                                          size_t num_outputs = 1, const std::string& domain = "") = 0;
  // A constant.
  virtual Value* constant(Tensor t) = 0;
  // The graph's ai.onnx opset (where an op's inputs and attributes moved:
  // ReduceSum's axes became an input at 13).
  virtual int64_t opset() const = 0;
  // The gradient of input i (of input i's type).
  virtual Status set_input_grad(size_t i, Value* grad) = 0;
  // The values of the enclosing graph the node's subgraphs capture
  // (Graph::implicit_inputs), whether each needs a gradient, and giving it one.
  virtual std::vector<Value*> implicit_inputs() const = 0;
  virtual bool wants_value(const Value* v) const = 0;
  virtual Status add_value_grad(Value* v, Value* grad) = 0;
  // Reverse mode over another graph (a subgraph the rule builds; types
  // inferred here): the gradients of `loss` (one float element) with
  // respect to `params` (its inputs, captures or constants), appended to it.
  virtual Result<std::vector<Value*>> differentiate(Graph& sub, Value* loss, const std::vector<Value*>& params) = 0;

  // Helpers built on the above.
  Result<Value*> add1(const std::string& op_type, const std::vector<Value*>& inputs,
                      const std::map<std::string, Attribute>& attrs = {});
  // A scalar constant of `like`'s dtype.
  Value* scalar(double v, const Value* like);
  // An i64 vector constant (axes, shapes).
  Value* ints(const std::vector<int64_t>& v);
  // `grad` (of the node's output shape after broadcasting) summed over the
  // axes input i was broadcast along, then given input i's shape: the
  // gradient of an input of a broadcasting op. Error when the broadcast
  // cannot be read from the types (an unproven symbolic broadcast).
  // `full` (default: the node's output 0's shape) is grad's shape.
  Result<Value*> unbroadcast(Value* grad, size_t i, const Shape* full = nullptr);
  // unbroadcast, then set_input_grad, when input i wants a gradient.
  Status give(size_t i, Value* grad, const Shape* full = nullptr);
  // Transpose swapping the last two axes of a value of rank `rank`.
  Result<Value*> transpose_last2(Value* x, int64_t rank);
  // ReduceSum over `axes`, keeping them (as the opset spells it).
  Result<Value*> reduce_sum(Value* x, const std::vector<int64_t>& axes, bool keepdims);
  // ReduceMean over `axes`, keeping them (as the opset spells it).
  Result<Value*> reduce_mean(Value* x, const std::vector<int64_t>& axes);
  // Unsqueeze at `axes` (as the opset spells it).
  Result<Value*> unsqueeze(Value* x, const std::vector<int64_t>& axes);
  // `x` reshaped to the shape of `like` (Reshape by Shape(like): symbolic dims too).
  Result<Value*> reshape_like(Value* x, Value* like);
};

using GradientRule = std::function<Status(GradBuilder&)>;

}  // namespace kiln::ops
