#include "passes/eliminate_common_subexpressions.h"

#include <map>
#include <set>
#include <tuple>

#include "passes/eliminate_dead_code.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool same_attribute(const Attribute& a, const Attribute& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Attribute::Kind::kFloat: return a.f == b.f || (a.f != a.f && b.f != b.f);
    case Attribute::Kind::kInt: return a.i == b.i;
    case Attribute::Kind::kString: return a.s == b.s;
    case Attribute::Kind::kTensor: return same_contents(a.t, b.t);
    case Attribute::Kind::kFloats: return a.floats == b.floats;
    case Attribute::Kind::kInts: return a.ints == b.ints;
    case Attribute::Kind::kStrings: return a.strings == b.strings;
    case Attribute::Kind::kTensors:
      if (a.tensors.size() != b.tensors.size()) return false;
      for (size_t i = 0; i < a.tensors.size(); ++i)
        if (!same_contents(a.tensors[i], b.tensors[i])) return false;
      return true;
    case Attribute::Kind::kGraph:
    case Attribute::Kind::kGraphs: return false;
  }
  return false;
}

}  // namespace

bool same_attributes(const Node& a, const Node& b) {
  if (a.attrs().size() != b.attrs().size()) return false;
  auto ia = a.attrs().begin();
  for (auto ib = b.attrs().begin(); ib != b.attrs().end(); ++ia, ++ib)
    if (ia->first != ib->first || !same_attribute(ia->second, ib->second)) return false;
  return true;
}

Result<int> eliminate_common_subexpressions(Graph& g, PassContext&) {
  // Candidates keyed by what can be compared cheaply; attributes checked on a hit.
  using Key = std::tuple<std::string, std::string, std::vector<const Value*>, size_t>;
  std::map<Key, std::vector<Node*>> seen;
  int rewrites = 0;
  for (Node* n : g.nodes()) {
    if (is_random_op(*n) || has_subgraph(*n)) continue;
    Key key{n->domain(), n->op_type(), {n->inputs().begin(), n->inputs().end()}, n->num_outputs()};
    std::vector<Node*>& same = seen[key];
    Node* earlier = nullptr;
    for (Node* m : same)
      if (same_attributes(*m, *n)) earlier = m;
    if (earlier == nullptr) {
      same.push_back(n);
      continue;
    }
    bool all = true;
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      Value* o = n->output(i);
      if (o == nullptr || earlier->output(i) == nullptr) continue;
      all &= replace_value(g, o, earlier->output(i));
    }
    rewrites += all ? 1 : 0;
  }
  remove_unused_nodes(g);
  return rewrites;
}

}  // namespace kiln::passes
