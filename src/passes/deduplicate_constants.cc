#include "passes/deduplicate_constants.h"

#include <algorithm>
#include <unordered_map>

#include "passes/rewrite.h"

namespace kiln::passes {

Result<int> deduplicate_constants(Graph& g, PassContext&) {
  std::unordered_map<uint64_t, std::vector<Value*>> by_hash;
  int rewrites = 0;
  for (Value* c : g.constants()) {
    if (std::find(g.inputs().begin(), g.inputs().end(), c) != g.inputs().end()) continue;
    std::vector<Value*>& same = by_hash[content_hash(c->constant())];
    Value* first = nullptr;
    for (Value* d : same)
      if (same_contents(d->constant(), c->constant())) first = d;
    if (first == nullptr) {
      same.push_back(c);
      continue;
    }
    if (c->uses().empty() && !is_graph_output(g, c)) continue;
    if (replace_value(g, c, first)) ++rewrites;
  }
  g.remove_dead_values();
  return rewrites;
}

}  // namespace kiln::passes
