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
// register tile (tir fuse_epilogue). A reduction over its first input
// (ReduceSum, ReduceMean, ...) takes the elementwise tree producing that
// input into its group the same way, computed in its loads; no anchor joins
// such a group. A Slice read only by a Transpose or kiln:Im2Col joins that
// copy's group (its loads take the slice's offsets). Every other compiled
// node is a group of its own.
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
// `candidates_are_anchors`: a node with registered candidates counts as one
// whose implementation was chosen (kernel choice asks for the groups its
// choices will be compiled in, before it chooses: tune workloads).
std::vector<FusedGroup> fuse_elementwise(const Graph& g, const std::set<const Node*>& compiled, bool enable,
                                         bool candidates_are_anchors = false);

// A node whose implementation the operator strategy chose (kiln_impl), or,
// with candidates_are_anchors, one that has candidates: its schedule computes
// an elementwise tail in the write-back.
bool is_anchor(const Node* n, bool candidates_are_anchors);

}  // namespace kiln::partition
