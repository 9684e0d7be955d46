#include "partition/fuse_elementwise.h"

#include <map>

#include "ops/registry.h"
#include "strategy/strategy.h"

namespace kiln::partition {

namespace {
// Elementwise ops, and views the driver chose to compile between two of them;
// also BatchNormalization in inference form (one output), an affine map per
// channel: densenet's BN -> ReLU before each convolution was two passes over
// the activation.
bool is_elementwise(const Node* n) {
  const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
  if (def == nullptr || !def->lower) return false;
  for (const Value* v : n->inputs())
    if (v != nullptr && v->type().is_container()) return false;
  if (def->is_elementwise || def->is_view) return true;
  return n->domain().empty() && n->op_type() == "BatchNormalization" && n->num_outputs() == 1;
}

// A reduction over its input 0 read at the reduced point (ReduceSum,
// ReduceMean, ...): an elementwise tree producing that input is computed in
// its loads (ReduceSum(dy * xhat) in a normalization's backward read two
// tensors instead of writing and reading a third).
bool is_plain_reduction(const Node* n) {
  return n->domain().empty() && n->op_type().rfind("Reduce", 0) == 0 && ops::find_op("", n->op_type()) != nullptr;
}

// A Slice (a copy of a region) and the copies that may read it in place:
// both are index maps, so the consumer's loads take the slice's offsets.
bool is_slice_into_copy(const Node* n) {
  return n->domain().empty() && n->op_type() == "Slice" && n->num_outputs() == 1;
}
bool reads_slices(const Node* n) {
  return (n->domain().empty() && n->op_type() == "Transpose") || (n->domain() == "kiln" && n->op_type() == "Im2Col");
}

bool is_graph_output(const Graph& g, const Value* v) {
  for (const Value* o : g.outputs())
    if (o == v) return true;
  return false;
}

// Values some node's subgraph (If branch, Loop/Scan body) reads from this
// graph: they must exist as values, like graph outputs, so no kernel may keep
// them internal (their top-level uses do not count those reads).
std::set<const Value*> captured_values(const Graph& g) {
  std::set<const Value*> out;
  for (const Node* n : g.nodes())
    for (const Value* v : g.implicit_inputs(n)) out.insert(v);
  return out;
}
}  // namespace

bool is_anchor(const Node* n, bool candidates_are_anchors) {
  if (n->num_outputs() != 1) return false;
  if (n->has_attr(strategy::kImplAttr)) return true;
  return candidates_are_anchors && !strategy::candidates_for(n->domain(), n->op_type()).empty();
}

std::vector<FusedGroup> fuse_elementwise(const Graph& g, const std::set<const Node*>& compiled, bool enable,
                                         bool candidates_are_anchors) {
  const std::set<const Value*> captured = captured_values(g);
  auto must_exist = [&](const Value* v) { return is_graph_output(g, v) || captured.count(v) != 0; };
  std::vector<Node*> order;
  for (Node* n : g.nodes())
    if (compiled.count(n)) order.push_back(n);

  // group_of[n] = the root node whose group n belongs to. Walk consumers
  // before producers (reverse order) so a producer can look up its consumer's root.
  std::map<const Node*, const Node*> root_of;
  std::set<const Node*> anchored_roots;  // groups that already took an anchor (one per kernel)
  std::set<const Node*> reduction_roots;  // groups whose root is a reduction: no anchor joins them
  // The attention chain of a matmul.attention choice (the score MatMul, the
  // elementwise ops on the scores, the Softmax) joins that MatMul's group.
  std::map<const Node*, const Node*> chain_anchor;
  if (enable) {
    for (Node* n : order) {
      std::vector<const Node*> chain = strategy::attention_nodes(*n);
      bool all = !chain.empty();
      for (const Node* c : chain) all = all && compiled.count(c) && !must_exist(c->output(0));
      if (all)
        for (const Node* c : chain) chain_anchor[c] = n;
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    root_of[n] = n;
    if (auto ca = chain_anchor.find(n); ca != chain_anchor.end()) {
      root_of[n] = root_of[ca->second];
      continue;
    }
    if (enable && is_anchor(n, candidates_are_anchors)) {
      // A MatMul/Gemm/Conv with a chosen implementation joins the elementwise
      // group that reads it, when every use is in that one group: its
      // template computes the group in the tile's write-back.
      const Value* out = n->output(0);
      if (out == nullptr || out->uses().empty() || must_exist(out)) continue;
      const Node* root = nullptr;
      bool one_group = true;
      for (const auto& use : out->uses()) {
        const Node* user = use.first;
        if (!compiled.count(user) || !is_elementwise(user) || is_anchor(user, candidates_are_anchors)) {
          one_group = false;
          break;
        }
        const Node* r = root_of[user];
        if ((root != nullptr && r != root) || reduction_roots.count(r)) one_group = false;
        root = r;
      }
      if (one_group && root != nullptr && anchored_roots.insert(root).second) root_of[n] = root;
      continue;
    }
    if (enable && is_slice_into_copy(n)) {
      // A Slice read only by a Transpose or kiln:Im2Col at its input: the
      // copy reads the slice's region of the whole tensor (a training step's
      // chunks of the batch), no sliced copy in between.
      const Value* out = n->output(0);
      if (out != nullptr && out->uses().size() == 1 && !must_exist(out)) {
        const auto [consumer, slot] = out->uses()[0];
        if (compiled.count(consumer) && slot == 0 && root_of[consumer] == consumer && reads_slices(consumer))
          root_of[n] = consumer;
      }
      continue;
    }
    if (!enable || !is_elementwise(n) || n->num_outputs() != 1) continue;
    const Value* out = n->output(0);
    if (out == nullptr || out->uses().size() != 1 || must_exist(out)) continue;
    const auto [consumer, slot] = out->uses()[0];
    if (!compiled.count(consumer)) continue;
    if (is_plain_reduction(consumer) && slot == 0 && root_of[consumer] == consumer) {
      reduction_roots.insert(consumer);
    } else if (!is_elementwise(consumer)) {
      continue;
    }
    root_of[n] = root_of[consumer];
  }

  std::vector<FusedGroup> groups;
  // Roots appear after all their members, so collect members first, then order by root.
  std::map<const Node*, std::vector<Node*>> members;
  for (Node* n : order) members[root_of[n]].push_back(n);
  for (Node* n : order)
    if (root_of[n] == n) groups.push_back(FusedGroup{members[n]});
  return groups;
}

}  // namespace kiln::partition
