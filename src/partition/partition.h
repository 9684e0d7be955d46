// Partitioning: the compile stage after kernel choice. Every live node of a
// graph, and of the subgraphs its control flow runs, is classified by how it
// will run (a compiled kernel, a view of its input, a C++ host kernel, a shape
// computation, control flow), and the compiled nodes are grouped into fused
// kernels (fuse_elementwise.h). Later stages read the result: kernel
// definitions (src/kernels) per group, bytecode (src/bytecode) per node.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "partition/fuse_elementwise.h"
#include "shape/expr.h"
#include "support/status.h"

namespace kiln::partition {

enum class NodeKind {
  kSkip,      // dead: nothing live reads its outputs
  kCompiled,  // lowered into a kernel (alone or in a fused group)
  kView,      // a view of its input (Reshape, ...), no kernel
  kHost,      // a C++ host kernel (data-dependent outputs, strings, ...)
  kShape,     // every needed output known symbolically: computed from shapes
  kControl,   // If / Loop / Scan / SequenceMap: its subgraphs become VM code
};

// If / Loop / Scan / SequenceMap.
bool is_control_flow(const Node* n);

// Every element of an integer output is known symbolically (sym_value): it
// is computed from the shapes at run time (NodeKind::kShape).
bool has_complete_sym_value(const Value* v);

// The partition of one graph (the model's, an If branch, a loop body).
struct GraphPartition {
  Graph* graph = nullptr;
  // Where the graph sits, outermost first ("Loop 'l' body"): the context of
  // errors about its nodes. Empty for the model's graph.
  std::vector<std::string> where;
  std::map<const Node*, NodeKind> kind;
  std::vector<FusedGroup> groups;  // in the order of their roots
  std::map<const Node*, size_t> group_of_root;
  // Symbols whose values are known before each node runs (graph input dims,
  // then every earlier node's outputs).
  std::map<const Node*, std::set<std::string>> bound_before;
  std::set<const Value*> graph_outputs;
  // Values of this graph read by subgraphs (implicit inputs of control-flow nodes).
  std::set<const Value*> captured;
  // The partitions of the subgraphs a control-flow node runs, by attribute
  // name ("then_branch", "body"). An If whose condition is known at compile
  // time has only its taken branch.
  std::map<const Node*, std::vector<std::pair<std::string, const GraphPartition*>>> subgraphs;

  NodeKind kind_of(const Node* n) const {
    auto it = kind.find(n);
    return it == kind.end() ? NodeKind::kSkip : it->second;
  }
  // Applies `where` to an error about this graph's nodes.
  Status in_context(Status st) const;
};

struct Partition {
  std::vector<std::unique_ptr<GraphPartition>> graphs;  // graphs[0]: the model's
  // Nodes with candidates were grouped as if their implementation were
  // chosen (partition_graph's candidates_are_anchors).
  bool candidates_are_anchors = false;
  const GraphPartition& top() const { return *graphs.front(); }
  // Visits graph partitions in program order: a graph's nodes in order, with
  // a control-flow node's subgraphs where the node is (then before else).
  // Stops at the first error `f` returns.
  Status for_each_group(const std::function<Status(const GraphPartition&, const FusedGroup&)>& f) const;
};

// Partitions `g` and the subgraphs its live control flow runs. `fuse`:
// elementwise fusion on (off with --naive or --disable=fuse-elementwise).
// `candidates_are_anchors`: group nodes that have candidates as if their
// implementation were chosen (fuse_elementwise.h), for kernel choice.
Result<Partition> partition_graph(Graph& g, const SymbolBounds& bounds, bool fuse, bool candidates_are_anchors = false);

}  // namespace kiln::partition
