// eliminate_dead_code: removes nodes none of whose outputs is used (by a node,
// a subgraph's capture or the graph's outputs), then constants and values that
// nothing reads. Every ONNX op is free of side effects, random ones included
// (an unused random draw changes nothing observable), so a node is dead
// exactly when its outputs are. Subgraphs (If branches, Loop and Scan bodies)
// are cleaned the same way; their declared outputs stay.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> eliminate_dead_code(Graph& g, PassContext& ctx);

// The node removal alone (used by the rewrite driver): returns nodes removed.
int remove_unused_nodes(Graph& g);

}  // namespace kiln::passes
