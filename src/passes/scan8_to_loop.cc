#include "passes/scan8_to_loop.h"

#include <string>
#include <vector>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

Tensor int64_scalar(int64_t v) {
  Tensor t(DType::kInt64, {});
  t.data_as<int64_t>()[0] = v;
  return t;
}

// A Scan of opset 8 without sequence_lens, with a body and valid counts.
bool applies(const Graph& g, const Node* n) {
  if (!n->domain().empty() || n->op_type() != "Scan" || n->has_attr(kScanOpset9Attr)) return false;
  auto opset = g.opsets.find("");
  if (opset == g.opsets.end() || opset->second >= 9 || opset->second <= 0) return false;
  const Attribute* body = n->attr("body");
  if (body == nullptr || !body->g) return false;
  if (n->num_inputs() < 2 || n->input(0) != nullptr) return false;  // sequence_lens given: keep the batched form
  int64_t num_scan_in = n->attr_int("num_scan_inputs", -1);
  if (num_scan_in < 1 || static_cast<size_t>(num_scan_in) + 1 > n->num_inputs()) return false;
  for (size_t i = 1; i < n->num_inputs(); ++i)
    if (n->input(i) == nullptr) return false;
  const size_t num_state = n->num_inputs() - 1 - static_cast<size_t>(num_scan_in);
  return body->g->inputs().size() == num_state + static_cast<size_t>(num_scan_in) &&
         body->g->outputs().size() == n->num_outputs() && body->g->outputs().size() >= num_state;
}

}  // namespace

Result<int> scan8_to_loop(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(g, n)) todo.push_back(n);
  for (Node* n : todo) {
    const std::shared_ptr<Graph> body = n->attr("body")->g;
    const size_t num_scan_in = static_cast<size_t>(n->attr_int("num_scan_inputs", 0));
    const std::string base = n->output(0) != nullptr ? n->output(0)->name() : n->input(1)->name();

    // The batch: dim 0 of the first batched input, as the trip count.
    Value* shape = g.insert_node_before(n, "Shape", {n->input(1)}, {g.unique_name(base + ".batched_shape")})->output(0);
    Value* zero = g.add_constant(g.unique_name(base + ".zero"), int64_scalar(0));
    Value* trips = g.insert_node_before(n, "Gather", {shape, zero}, {g.unique_name(base + ".batch")})->output(0);

    // The loop body: element i of every batched input, one Scan over its steps.
    auto lb = std::make_shared<Graph>();
    lb->opsets = g.opsets;
    lb->source = g.source;
    Value* iter = lb->add_input(lb->unique_name(base + ".b"), TensorType{DType::kInt64, Shape{}});
    Value* cond_in = lb->add_input(lb->unique_name(base + ".cond"), TensorType{DType::kBool, Shape{}});
    for (const Value* c : body->captures())
      if (lb->find_value(c->name()) == nullptr) lb->add_capture(c->name(), c->type());
    std::vector<Value*> inner_ins;
    for (size_t i = 1; i < n->num_inputs(); ++i) {
      const Value* outer = n->input(i);
      Value* cap = lb->find_value(outer->name());
      if (cap == nullptr) cap = lb->add_capture(outer->name(), outer->type());
      Node* pick = lb->add_node("Gather", {cap, iter}, {lb->unique_name(outer->name() + ".elem")});
      pick->set_attr("axis", Attribute::of_int(0));
      inner_ins.push_back(pick->output(0));
    }
    std::vector<std::string> inner_outs;
    for (size_t k = 0; k < n->num_outputs(); ++k) inner_outs.push_back(lb->unique_name(base + ".elem_out" + std::to_string(k)));
    Node* scan = lb->add_node("Scan", inner_ins, inner_outs);
    scan->set_attr("body", Attribute::of_graph(body));
    scan->set_attr("num_scan_inputs", Attribute::of_int(static_cast<int64_t>(num_scan_in)));
    if (n->has_attr("directions")) scan->set_attr("scan_input_directions", Attribute::of_ints(n->attr_ints("directions")));
    scan->set_attr(kScanOpset9Attr, Attribute::of_int(1));
    Value* cond_out = lb->add_node("Identity", {cond_in}, {lb->unique_name(base + ".cond_out")})->output(0);
    std::vector<Value*> outs = {cond_out};
    for (Value* o : scan->outputs()) outs.push_back(o);
    lb->set_outputs(outs);

    // No carried values: every Scan output is a scan output of the Loop,
    // stacked along a new axis 0, the batch.
    std::vector<std::string> loop_outs;
    for (size_t k = 0; k < n->num_outputs(); ++k) loop_outs.push_back(g.unique_name(base + ".batched" + std::to_string(k)));
    Node* loop = g.insert_node_before(n, "Loop", {trips, nullptr}, loop_outs);
    loop->set_attr("body", Attribute::of_graph(lb));
    KILN_RETURN_IF_ERROR(replace_outputs(g, n, loop, "scan8-to-loop"));
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
