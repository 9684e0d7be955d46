#include "passes/eliminate_dead_code.h"

#include <unordered_set>

#include "passes/rewrite.h"

namespace kiln::passes {

int remove_unused_nodes(Graph& g) {
  std::unordered_set<const Value*> captured;
  for (const Node* n : g.nodes())
    for (const Value* v : g.implicit_inputs(n)) captured.insert(v);
  std::unordered_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  int removed = 0;
  // Last to first: removing a consumer can make its producers dead.
  std::vector<Node*> nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool live = false;
    for (const Value* o : n->outputs()) live |= !o->uses().empty() || outputs.count(o) || captured.count(o);
    if (live) continue;
    g.remove_node(n);
    ++removed;
  }
  return removed;
}

namespace {

int eliminate_in(Graph& g) {
  int removed = 0;
  for (Node* n : g.nodes())
    for (const auto& [key, attr] : n->attrs()) {
      if (attr.g) removed += eliminate_in(*attr.g);
      for (const auto& sg : attr.graphs)
        if (sg) removed += eliminate_in(*sg);
    }
  removed += remove_unused_nodes(g);
  size_t values_before = g.values().size();
  g.remove_dead_values();
  return removed + static_cast<int>(values_before - g.values().size());
}

}  // namespace

Result<int> eliminate_dead_code(Graph& g, PassContext&) { return eliminate_in(g); }

}  // namespace kiln::passes
