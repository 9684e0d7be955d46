// fold_constants: nodes whose inputs are all constants run once, at compile
// time, through the same compiled kernels a run would use
// (PassContext::evaluator, supplied by the driver), and their results become
// constants. Values whose symbolic value is fully known and constant (the
// Shape of a static tensor and arithmetic on it) become constants without
// running anything.
//
// Left alone: random ops, nodes with subgraphs, values of unknown or symbolic
// shape, graph outputs, and values larger than PassContext::fold_limit_bytes
// unless no larger than the node's inputs (folding never grows the model by
// more than the limit: Expand or ConstantOfShape of a large shape stays a node).
// A failure to evaluate leaves the graph unchanged: the run reports it where
// it happens, if that code runs at all.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> fold_constants(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
