// Copying one graph's nodes into another (inlining a training algorithm,
// building a backward step from a loop body, a fused group alone for tuning).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"

namespace kiln {

// Copies `from`'s nodes into `into`, in order, with their attributes (nested
// graphs shared, not copied). Each node reads map[v] for its inputs, so `map`
// must hold `from`'s inputs, captures and constants; each copy's outputs are
// named name(original) (an omitted output stays omitted) and added to `map`.
// An input `map` lacks is an internal error naming the node.
Status copy_nodes(const Graph& from, Graph& into, std::map<const Value*, Value*>& map,
                  const std::function<std::string(const Value*)>& name);

// The same for `nodes` (in order; a fused group's, say). An input `map` lacks
// is given to `unmapped` (when set), whose value (non-null) is mapped and read;
// a null result, or no `unmapped`, is the internal error.
Status copy_nodes(const std::vector<const Node*>& nodes, Graph& into, std::map<const Value*, Value*>& map,
                  const std::function<std::string(const Value*)>& name,
                  const std::function<Value*(const Value*)>& unmapped = nullptr);

}  // namespace kiln
