// ONNX's standard training form (ModelProto.training_info, Graph::
// training_info): its Gradient op, the step Kiln runs from a model's own
// training algorithm, and the algorithm Kiln writes for TrainOptions.
// Depends on graph/, shape/ and ops/ (through autodiff.h).
#pragma once

#include "graph/graph.h"
#include "kiln/kiln.h"
#include "support/status.h"

namespace kiln::train {

// The domain of ONNX's training ops (Gradient, Momentum, Adam, Adagrad).
inline constexpr const char* kTrainingDomain = "ai.onnx.preview.training";
// The training algorithm Kiln writes counts the steps it has taken in this
// i64 initializer (bound to the count plus one), for Adam's bias correction
// and the optimizer ops' T.
inline constexpr const char* kIterationsInitializer = "kiln.iterations";

// Replaces every ai.onnx.preview.training:Gradient node of `g` (types
// inferred) by the backward graph (autodiff.h) it stands for: the gradients
// of the value its attribute y names (summed over y's elements) with respect
// to the values xs names, which must be graph inputs or initializers. ONNX
// lets the node's inputs feed other values into xs and zs; Kiln takes the
// named values themselves (anything else is kUnsupported, naming the node),
// and no Gradient inside a subgraph. `data_parallel`: each gradient is
// averaged over the processes (kiln:AllReduceMean), as TrainOptions has it.
Status expand_gradient_ops(Graph& g, bool data_parallel = false);

// Rewrites `g` (types inferred), which holds exactly one training algorithm
// (Graph::training_info), into that algorithm's step in the form of
// make_training_step (step.h): the algorithm's nodes after the model's, its
// inputs added to the step's, its Gradient nodes expanded; each initializer
// named in update_binding becomes an input of its own name whose update the
// step outputs as "<initializer>.next". Outputs, in order: the loss (the y
// of the algorithm's first Gradient node; averaged over the processes when
// data_parallel), the algorithm's other outputs, then the "<name>.next"
// values. Initializers the initialization graph sets are inputs too (output
// unchanged as "<name>.next" where the step does not update them); running
// that graph once before the first step is the caller's
// (run_initialization in tools/kiln, kiln.Trainer).
Status make_step_from_training_info(Graph& g, bool data_parallel = false);

// Infers the types of g.training_info's graphs (after g's own): their
// captures take the types of g's values of their names.
Status infer_training_types(Graph& g);

// The initial value of a step's state input `name`: the model's initializer
// of that name, else its training algorithm's. Null when neither has it.
const Tensor* training_initializer(const Graph& g, const std::string& name);

// Sets g.training_info (types inferred) to the step `o` describes, in ONNX's
// standard form, so that another ONNX training runtime (and Kiln, through
// make_step_from_training_info) runs the same step: the loss as ai.onnx ops;
// ai.onnx.preview.training:Gradient over the parameters; weight decay and
// clipping as ai.onnx ops; SGD with momentum (and Nesterov) as the Momentum
// op (alpha = momentum, beta = 1, which is PyTorch's SGD); plain SGD, Adam
// and AdamW as ai.onnx ops, because ONNX's Adam op adds epsilon before the
// bias correction and decays weights after the step, unlike PyTorch's. The
// algorithm's input "kiln.lr" is the learning rate; its initializers are the
// optimizer state, named as make_training_step names the step's state inputs
// ("<p>.momentum", "<p>.adam_m", "<p>.adam_v", zeros) and the step count
// kiln.iterations (0); `state` gives them other values (a checkpoint's) by
// name. Every parameter, state tensor, running statistic and the count is
// bound to its update. Errors: as make_training_step's. data_parallel and a
// memory budget belong to a run, not to the algorithm, and are not written.
Status attach_training_algorithm(Graph& g, const TrainOptions& o,
                                 const std::map<std::string, Tensor>& state = {});

}  // namespace kiln::train
