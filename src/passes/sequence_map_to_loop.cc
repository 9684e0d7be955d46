#include "passes/sequence_map_to_loop.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/copy.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

std::string base_name(const Node* n) { return n->output(0) != nullptr ? n->output(0)->name() : n->input(0)->name(); }

// True when a body node has a subgraph. Its captures name the body's values:
// the copy keeps every name then (see applies).
bool nests_subgraphs(const Graph& b) {
  for (const Node* m : b.nodes())
    if (has_subgraph(*m)) return true;
  return false;
}

bool applies(const Node* n) {
  if (!n->domain().empty() || n->op_type() != "SequenceMap") return false;
  const Attribute* body = n->attr("body");
  if (body == nullptr || !body->g || n->num_inputs() < 1) return false;
  const Graph& b = *body->g;
  if (b.inputs().size() != n->num_inputs() || b.outputs().size() != n->num_outputs()) return false;
  // The first input a sequence; the others sequences or tensors.
  for (size_t j = 0; j < n->num_inputs(); ++j) {
    const Value* v = n->input(j);
    if (v == nullptr || (j == 0 && v->dtype() != DType::kSequence) || v->dtype() == DType::kOptional) return false;
  }
  for (const Value* o : b.outputs())
    if (o == nullptr || o->dtype() == DType::kUndefined || o->type().is_container()) return false;
  // The outer values the Loop body captures keep their names: none may
  // start like the Loop body's own values ("<base>.i", "<base>.acc0", ...).
  std::set<std::string> taken;
  for (const Value* v : n->inputs()) taken.insert(v->name());
  for (const Value* c : b.captures()) taken.insert(c->name());
  const std::string prefix = base_name(n) + ".";
  for (const std::string& name : taken)
    if (name.rfind(prefix, 0) == 0) return false;
  if (!nests_subgraphs(b)) return true;
  // A nested subgraph captures body values by name, so the Loop body must
  // hold each under its own name: none may be a name the Loop body takes
  // for itself (the outer values it captures, its own "<base>." values).
  auto free = [&](const Value* v) { return v == nullptr || (!taken.count(v->name()) && v->name().rfind(prefix, 0) != 0); };
  for (const Value* v : b.inputs())
    if (!free(v)) return false;
  for (const Value* v : b.constants())
    if (!free(v)) return false;
  for (const Node* m : b.nodes())
    for (const Value* o : m->outputs())
      if (!free(o)) return false;
  return true;
}

}  // namespace

Result<int> sequence_map_to_loop(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(n)) todo.push_back(n);
  for (Node* n : todo) {
    const Graph& body = *n->attr("body")->g;
    const std::string base = base_name(n);
    const bool keep_names = nests_subgraphs(body);
    Value* count = g.insert_node_before(n, "SequenceLength", {n->input(0)}, {g.unique_name(base + ".count")})->output(0);
    // Every other sequence has as many elements (the trip count goes through
    // the checks, so they run before the loop).
    for (size_t j = 1; j < n->num_inputs(); ++j) {
      if (n->input(j)->dtype() != DType::kSequence) continue;
      const std::string tag = base + ".count" + std::to_string(j);
      Value* len = g.insert_node_before(n, "SequenceLength", {n->input(j)}, {g.unique_name(tag)})->output(0);
      count = insert_range_check(g, n, {len, count, count}, tag + "_checked",
                                 n->describe() + ": the length of sequence input " + std::to_string(j) +
                                     " (input 0's is the expected)");
    }
    std::vector<Value*> loop_ins = {count, nullptr};
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      Node* empty = g.insert_node_before(n, "SequenceEmpty", {}, {g.unique_name(base + ".empty" + std::to_string(k))});
      empty->set_attr("dtype", Attribute::of_int(static_cast<int64_t>(body.outputs()[k]->dtype())));
      loop_ins.push_back(empty->output(0));
    }

    auto lb = std::make_shared<Graph>();
    lb->opsets = body.opsets;
    lb->source = body.source;
    Value* iter = lb->add_input(lb->unique_name(base + ".i"), TensorType{DType::kInt64, Shape{}});
    Value* cond_in = lb->add_input(lb->unique_name(base + ".cond"), TensorType{DType::kBool, Shape{}});
    std::vector<Value*> acc;
    for (size_t k = 0; k < n->num_outputs(); ++k)
      acc.push_back(lb->add_input(lb->unique_name(base + ".acc" + std::to_string(k)), loop_ins[2 + k]->type()));
    // The body's values as the Loop body's.
    std::map<const Value*, Value*> map;
    auto capture = [&](const std::string& name, const TensorType& t) {
      Value* v = lb->find_value(name);
      return v != nullptr ? v : lb->add_capture(name, t);
    };
    for (size_t j = 0; j < n->num_inputs(); ++j) {
      Value* outer = n->input(j);
      Value* cap = capture(outer->name(), outer->type());
      // Element i of a sequence; a tensor as it is (under the body input's
      // name where a nested subgraph may capture it).
      const std::string name = keep_names ? body.inputs()[j]->name() : base + ".elem" + std::to_string(j);
      if (outer->dtype() == DType::kSequence) {
        cap = lb->add_node("SequenceAt", {cap, iter}, {lb->unique_name(name)})->output(0);
      } else if (keep_names && cap->name() != name) {
        cap = lb->add_node("Identity", {cap}, {lb->unique_name(name)})->output(0);
      }
      map[body.inputs()[j]] = cap;
    }
    for (const Value* c : body.captures()) map[c] = capture(c->name(), c->type());
    for (const Value* c : body.constants()) map[c] = lb->add_constant(lb->unique_name(c->name()), c->constant());
    auto mapped = [&](const Value* v) -> Value* {
      auto it = map.find(v);
      return it == map.end() ? nullptr : it->second;
    };
    Status copied = copy_nodes(body, *lb, map, [&](const Value* o) { return lb->unique_name(o->name()); });
    if (!copied.is_ok()) return copied.with_context(n->describe() + ": sequence-map-to-loop");
    std::vector<Value*> outs = {lb->add_node("Identity", {cond_in}, {lb->unique_name(base + ".cond_out")})->output(0)};
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      Value* r = mapped(body.outputs()[k]);
      if (r == nullptr)
        return internal_error() << n->describe() << ": sequence-map-to-loop: body output " << k << " is defined nowhere";
      outs.push_back(
          lb->add_node("SequenceInsert", {acc[k], r}, {lb->unique_name(base + ".acc_next" + std::to_string(k))})->output(0));
    }
    lb->set_outputs(outs);

    std::vector<std::string> loop_outs;
    for (size_t k = 0; k < n->num_outputs(); ++k) loop_outs.push_back(g.unique_name(base + ".mapped" + std::to_string(k)));
    Node* loop = g.insert_node_before(n, "Loop", loop_ins, loop_outs);
    loop->set_attr("body", Attribute::of_graph(lb));
    loop->set_name(n->name());  // errors inside name the node: "Loop 'map' iteration 3: ...
    KILN_RETURN_IF_ERROR(replace_outputs(g, n, loop, "sequence-map-to-loop"));
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
