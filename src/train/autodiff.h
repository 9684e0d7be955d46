// Reverse-mode automatic differentiation over the graph IR. Depends only on
// graph/, shape/ and ops/ (each op's gradient rule: OpDef::gradient,
// ops/gradient.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"

namespace kiln::train {

// The dtypes gradients flow through: f32, f64, f16, bf16.
bool differentiable_dtype(DType t);

// Appends to `g` (whose types are inferred) the nodes computing the gradient
// of `loss` (a float value of one element) with respect to every value in
// `params` (graph inputs or constants of float dtype), and returns them in
// the order of `params`. A parameter the loss does not depend on gets a
// zero gradient of its shape. Every node on a path from a parameter to the
// loss needs a gradient rule: the ops without one are named, all at once, in
// one error (kUnsupported). The new nodes are ordinary ops after the forward
// graph's, with their types inferred: the result compiles like any graph.
// computed_params: params may also be values nodes compute, each taken as a
// leaf (the gradient flowing into it, its own producers held fixed); no
// param may then depend on another (gradient rules over a subgraph).
Result<std::vector<Value*>> append_gradients(Graph& g, Value* loss, const std::vector<Value*>& params,
                                             bool computed_params = false);

}  // namespace kiln::train
