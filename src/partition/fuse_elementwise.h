// fuse_elementwise: partitions the nodes that will be compiled into fused
// groups. A chain (more precisely a tree) of elementwise ops becomes one
// group: a producer joins its consumer's group when its output has exactly
// one use, that use is in the group, and it is not a graph output. The group
// runs as one kernel in which the producers are inlined (no intermediate
// tensors in memory). A view (Reshape, Flatten, Squeeze, Unsqueeze) in
// `compiled` (the driver compiles one only between two elementwise nodes)
// joins like an elementwise op: its reindexing is inlined too. A node the
// operator strategy gave an implementation (kiln_impl: MatMul, Gemm, Conv)
// joins the group of its consumers when all of them are elementwise nodes of
// one group (at most one such node per group): its schedule
// (strategy::schedule_for) then computes the group's elementwise tail on the
// register tile (tir fuse_epilogue). Every other compiled node is a group of
// its own.
#pragma once

#include <set>
#include <vector>

#include "graph/graph.h"

namespace kiln::partition {

struct FusedGroup {
  std::vector<Node*> nodes;  // in graph order; the last one is the root
};

// `compiled` holds the nodes that will be lowered (not views, host kernels
// or shape computations). Groups are returned in the order of their roots.
std::vector<FusedGroup> fuse_elementwise(const Graph& g, const std::set<const Node*>& compiled, bool enable);

}  // namespace kiln::partition
