// A trial: one candidate with knob values on one fused group. The group
// alone as a graph, the graph with the trial's choice applied, and the cost
// model's features of the kernel it compiles to (stages 6-9, no code
// generation): what measurement (measure.h), the search (tuner.h) and the
// database's zero-shot picks (driver/database_source.cc) share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "kernels/kernels.h"
#include "support/status.h"

namespace kiln::tune {

struct Trial {
  std::string candidate;  // empty: the default schedule (no candidate); "generic": strategy.h's generic space
  std::string knobs;      // "mr=8 nr=32"
};

// The group of `gw` as a graph of its own: its external inputs (constants
// copied, the others graph inputs, which must have static shapes), its nodes
// (attributes included) and the values leaving the group as outputs.
// *anchor_index is the anchor's position among the nodes.
Result<std::unique_ptr<Graph>> group_graph(const Graph& parent, const kernels::GroupWorkload& gw, size_t* anchor_index);

// A copy of a group graph (group_graph's) with `trial`'s choice recorded on
// the anchor and its transform applied (null: none), inferred; *bounds gets
// the symbol bounds.
Result<std::unique_ptr<Graph>> trial_graph(const Graph& group, size_t anchor_index, const Trial* trial,
                                           SymbolBounds* bounds);
// The cost model's features of the kernel `trial` gives the group: stages
// 5-8 (no code generation), then features.h on the anchor's loop IR.
Result<std::vector<float>> trial_features(const Graph& group, size_t anchor_index, const Trial& trial, int threads);

}  // namespace kiln::tune
