// The pieces of a training step that Kiln's own step (step.h) and the ONNX
// training algorithm it writes (algorithm.h) share: the losses, the
// parameters a step trains, gradient clipping and Adam's direction, each
// emitted as ordinary ops with their types inferred as they are added.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "kiln/kiln.h"
#include "ops/registry.h"
#include "support/status.h"

namespace kiln::train {

bool is_float(DType t);

// Adds nodes to `g`, each node's types inferred as it is added.
class Emitter {
 public:
  explicit Emitter(Graph& g);
  Result<Value*> op(const std::string& type, const std::vector<Value*>& in,
                    const std::map<std::string, Attribute>& attrs = {}, const std::string& domain = "");
  // A node of several outputs, named `outputs`.
  Result<std::vector<Value*>> op_n(const std::string& type, const std::vector<Value*>& in,
                                   const std::vector<std::string>& outputs,
                                   const std::map<std::string, Attribute>& attrs, const std::string& domain);
  Value* scalar(double v, DType t);
  // a * x + b * y, a and b numbers.
  Result<Value*> lerp(double a, Value* x, double b, Value* y);

 private:
  Graph& g_;
  ops::InferContext ctx_;
};

// TrainOptions::loss_kind of `prediction` (a value of `g`) against a new
// input of `g` named `o.target`: the mean over the elements. `opset` is the
// model's ai.onnx opset (cross_entropy needs 12).
Result<Value*> append_loss(Graph& g, Value* prediction, const TrainOptions& o, int64_t opset);

// The model output the appended loss reads (TrainOptions::prediction, else the first).
Result<Value*> prediction_output(const Graph& g, const TrainOptions& o);

// What a step trains and what it only updates, of the model `g`.
struct Trainables {
  std::vector<Value*> params;  // the initializers TrainOptions::params names, else every float
                               // constant of two or more elements that something reads
  // Running statistics of BatchNormalizations in training form whose updated
  // values the node outputs: (the constant, the output with its update).
  std::vector<std::pair<Value*, Value*>> running;
};
Result<Trainables> trainables(const Graph& g, const TrainOptions& o);

// The checks on TrainOptions' numbers and names that do not need the model.
Status check_options(const TrainOptions& o);

// Each gradient scaled by min(1, max_norm / (||all gradients|| + 1e-6)).
Status clip_by_global_norm(Emitter& e, std::vector<Value*>& grads, double max_norm, DType dt);

// Adam's update direction (p' = p - lr * direction) and new moments, from
// the moments `m`, `v`, the gradient and the 1-based step count `step` (a
// scalar of the gradient's dtype).
struct AdamUpdate {
  Value* direction = nullptr;
  Value* m = nullptr;
  Value* v = nullptr;
};
Result<AdamUpdate> adam_update(Emitter& e, Value* m, Value* v, Value* grad, Value* step, const TrainOptions& o);

// p - lr * direction, p first decayed to p * (1 - lr * weight_decay) under AdamW.
Result<Value*> apply_update(Emitter& e, Value* p, Value* direction, Value* lr, const TrainOptions& o);

}  // namespace kiln::train
