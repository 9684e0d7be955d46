#include "tune/trial.h"

#include <map>

#include "graph/copy.h"
#include "ops/registry.h"
#include "partition/partition.h"
#include "strategy/strategy.h"
#include "tune/features.h"

namespace kiln::tune {

namespace {

// Copies `nodes` into `g` (graph/copy.h), their names kept; a constant
// outside the map is added to `g`.
Status copy_nodes(const std::vector<const Node*>& nodes, Graph& g, std::map<const Value*, Value*>& map) {
  return kiln::copy_nodes(
      nodes, g, map, [](const Value* o) { return o->name(); },
      [&g](const Value* v) -> Value* { return v->is_constant() ? g.add_constant(v->name(), v->constant()) : nullptr; });
}

// A graph without subgraphs, copied: the same constants (tensors are shared,
// never written: candidates' transforms make new ones), inputs, nodes and outputs.
Result<std::unique_ptr<Graph>> copy_graph(const Graph& src) {
  auto g = std::make_unique<Graph>();
  g->name = src.name;
  g->source = src.source;
  g->opsets = src.opsets;
  g->bounds = src.bounds;
  std::map<const Value*, Value*> map;
  for (const Value* v : src.inputs())
    map[v] = v->is_constant() ? g->add_constant(v->name(), v->constant()) : g->add_input(v->name(), v->type());
  const std::vector<Node*> all = src.nodes();
  std::vector<const Node*> nodes(all.begin(), all.end());
  KILN_RETURN_IF_ERROR(copy_nodes(nodes, *g, map));
  std::vector<Value*> outs;
  for (const Value* v : src.outputs()) outs.push_back(map.at(v));
  g->set_outputs(outs);
  return g;
}

}  // namespace

Result<std::unique_ptr<Graph>> group_graph(const Graph& parent, const kernels::GroupWorkload& gw, size_t* anchor_index) {
  auto g = std::make_unique<Graph>();
  g->name = "group";
  g->source = parent.source + " (" + gw.anchor->describe() + ")";
  g->opsets = parent.opsets;
  std::map<const Value*, Value*> map;
  for (const Value* v : gw.inputs) {
    if (v->is_constant()) {
      map[v] = g->add_constant(v->name(), v->constant());
      continue;
    }
    if (!v->type().is_static())
      return unsupported() << gw.anchor->describe() << ": input '" << v->name()
                           << "' has a symbolic shape; bind its dims (--dim NAME=VALUE) to tune it";
    map[v] = g->add_input(v->name(), v->type());
  }
  std::vector<const Node*> nodes(gw.group.begin(), gw.group.end());
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i] == gw.anchor && anchor_index) *anchor_index = i;
  KILN_RETURN_IF_ERROR(copy_nodes(nodes, *g, map));
  std::vector<Value*> outs;
  for (const Value* v : gw.outputs) outs.push_back(map.at(v));
  g->set_outputs(outs);
  ops::InferContext ictx;
  ictx.graph = g.get();
  ictx.bounds = g->bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ictx).with_context(g->source));
  return g;
}

Result<std::unique_ptr<Graph>> trial_graph(const Graph& group, size_t anchor_index, const Trial* trial,
                                           SymbolBounds* bounds) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, copy_graph(group));
  ops::InferContext ictx;
  ictx.graph = g.get();
  ictx.bounds = g->bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ictx));
  if (trial != nullptr && trial->candidate == strategy::kGenericCandidate) {
    // A kernel without a candidate: the point of the generic space, on the group's last node.
    if (anchor_index >= g->nodes().size()) return invalid_argument() << "anchor index out of range";
    KILN_ASSIGN_OR_RETURN(tir::Knobs knobs, tir::parse_knobs(trial->knobs));
    strategy::record_generic_choice(*g->nodes()[anchor_index], strategy::Choice{trial->candidate, knobs, "tuning", ""});
  } else if (trial != nullptr && !trial->candidate.empty()) {
    if (anchor_index >= g->nodes().size()) return invalid_argument() << "anchor index out of range";
    Node* anchor = g->nodes()[anchor_index];
    const strategy::Candidate* c = strategy::find_candidate(trial->candidate);
    if (c == nullptr) return invalid_argument() << "no candidate '" << trial->candidate << "'";
    KILN_ASSIGN_OR_RETURN(tir::Knobs knobs, tir::parse_knobs(trial->knobs));
    strategy::record_choice(*anchor, strategy::Choice{trial->candidate, knobs, "tuning", ""});
    if (c->transform) KILN_RETURN_IF_ERROR(c->transform(*g, *anchor, knobs));
    g->remove_dead_values();
    ops::InferContext again;
    again.graph = g.get();
    again.bounds = ictx.bounds;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, again));
    ictx.bounds = again.bounds;
  }
  *bounds = ictx.bounds;
  return g;
}

Result<std::vector<float>> trial_features(const Graph& group, size_t anchor_index, const Trial& trial, int threads) {
  SymbolBounds bounds;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, trial_graph(group, anchor_index, &trial, &bounds));
  KILN_ASSIGN_OR_RETURN(partition::Partition parts, partition::partition_graph(*g, bounds, true));
  KILN_ASSIGN_OR_RETURN(kernels::KernelSet ks, kernels::define_kernels(parts, bounds));
  KILN_RETURN_IF_ERROR(kernels::schedule_kernels(ks, false));
  KILN_RETURN_IF_ERROR(kernels::lower_kernels(ks, false));
  const std::string impl = trial.candidate.empty() ? "default" : trial.candidate;
  for (const kernels::Kernel& k : ks.kernels)
    if (k.info.impl == impl) return kernel_features(k.func, trial.candidate, trial.knobs, threads, Target::host());
  if (ks.kernels.empty()) return invalid_argument() << "the group compiles to no kernel";
  return kernel_features(ks.kernels.back().func, trial.candidate, trial.knobs, threads, Target::host());
}

}  // namespace kiln::tune
