// eliminate_common_subexpressions: two nodes with the same op, domain,
// attributes and inputs compute the same outputs; the later one's uses move
// to the earlier one and it becomes dead. Nodes with subgraphs and random ops
// (RandomNormal, Bernoulli, ...: two draws are two values) are left alone.
// Constants with equal contents count as equal inputs only after
// deduplicate-constants, which the default pipeline runs first.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> eliminate_common_subexpressions(Graph& g, PassContext& ctx);

// Attributes of two nodes equal (graphs never compare equal).
bool same_attributes(const Node& a, const Node& b);

}  // namespace kiln::passes
