// A training step as one graph: the model's forward, its backward
// (autodiff.h), gradient clipping and the optimizer's update, compiled like
// any graph (CompileOptions::train; Python kiln.Trainer). The parameters
// become graph inputs of their names; the step takes, beside the model's
// inputs, the optimizer's state per parameter ("<p>.momentum" for SGD with
// momentum, "<p>.adam_m" and "<p>.adam_v" for Adam and AdamW, zeros at the
// start), "kiln.lr" (the learning rate: a schedule is the caller's) and
// "kiln.step" (the 1-based step count, for Adam's bias correction), both
// scalars of the loss's dtype. Its outputs are the loss, then "<p>.next" per
// parameter, then "<s>.next" per state value, then "<r>.next" per running
// statistic of a BatchNormalization in training form (an input "<r>" that
// starts at the initializer's value): the next step's inputs.
#pragma once

#include "graph/graph.h"
#include "kiln/kiln.h"
#include "support/status.h"

namespace kiln::train {

inline constexpr const char* kLearningRateInput = "kiln.lr";
inline constexpr const char* kStepInput = "kiln.step";
// The loss output of a step whose loss Kiln appends (TrainOptions::loss_kind).
inline constexpr const char* kLossOutput = "kiln.loss";
inline constexpr const char* kLossKinds[] = {"mse", "l1", "bce", "cross_entropy"};
// Optimizer state inputs: the parameter's name and one of these.
inline constexpr const char* kMomentumSuffix = ".momentum";
inline constexpr const char* kAdamMSuffix = ".adam_m";
inline constexpr const char* kAdamVSuffix = ".adam_v";
inline constexpr const char* kStateSuffixes[] = {kMomentumSuffix, kAdamMSuffix, kAdamVSuffix};

// Rewrites `g` (types inferred) into the training step `options` asks for.
// Parameters: those named, else every float constant of two or more
// elements the loss depends on. Errors name what is wrong (an unknown
// optimizer, loss or parameter; an op without a gradient rule).
Status make_training_step(Graph& g, const TrainOptions& options);

}  // namespace kiln::train
