#include "passes/scan8_to_loop.h"

#include <algorithm>
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

// A Scan of opset 8 with a body and valid counts. With sequence_lens (int64),
// every scan output of the body has a known rank and a dtype Pad fills with
// zeros (its elements past a length are zero, as in the batched form).
bool applies(const Graph& g, const Node* n) {
  if (!n->domain().empty() || n->op_type() != "Scan" || n->has_attr(kScanOpset9Attr)) return false;
  auto opset = g.opsets.find("");
  if (opset == g.opsets.end() || opset->second >= 9 || opset->second <= 0) return false;
  const Attribute* body = n->attr("body");
  if (body == nullptr || !body->g) return false;
  int64_t num_scan_in = n->attr_int("num_scan_inputs", -1);
  if (n->num_inputs() < 2 || num_scan_in < 1 || static_cast<size_t>(num_scan_in) + 1 > n->num_inputs()) return false;
  for (size_t i = 1; i < n->num_inputs(); ++i)
    if (n->input(i) == nullptr) return false;
  const size_t num_state = n->num_inputs() - 1 - static_cast<size_t>(num_scan_in);
  const Graph& b = *body->g;
  if (b.inputs().size() != num_state + static_cast<size_t>(num_scan_in) || b.outputs().size() != n->num_outputs() ||
      b.outputs().size() < num_state)
    return false;
  // The outer values the Loop body captures keep their names: none may
  // start like its own values ("<base>.b", "<x>.elem", ...).
  const std::string base = n->output(0) != nullptr ? n->output(0)->name() : n->input(1)->name();
  std::vector<std::string> taken;
  for (const Value* v : n->inputs())
    if (v != nullptr) taken.push_back(v->name());
  for (const Value* c : b.captures()) taken.push_back(c->name());
  for (const std::string& name : taken) {
    if (name.rfind(base + ".", 0) == 0) return false;
    for (const std::string& other : taken)
      if (name.rfind(other + ".", 0) == 0) return false;
  }
  if (n->input(0) == nullptr) return true;
  // sequence_lens [B]: a lens of another rank stays with the batched form,
  // whose inference refuses it (CheckInRange counts elements only).
  if (n->input(0)->dtype() != DType::kInt64 || n->input(0)->type().rank() != 1) return false;
  for (size_t k = num_state; k < b.outputs().size(); ++k) {
    const Value* o = b.outputs()[k];
    if (o == nullptr || !o->type().shape || o->dtype() == DType::kString || o->type().is_container() ||
        !dtype_is_compilable(o->dtype()))
      return false;
  }
  return true;
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
    // Every other batched input has that batch (the batched form checked it).
    for (size_t i = 2; i < n->num_inputs(); ++i) {
      Value* x = n->input(i);
      Value* xs = g.insert_node_before(n, "Shape", {x}, {g.unique_name(x->name() + ".batched_shape")})->output(0);
      Value* xb = g.insert_node_before(n, "Gather", {xs, zero}, {g.unique_name(x->name() + ".batch")})->output(0);
      trips = insert_range_check(g, n, {xb, trips, trips}, base + ".batch_agrees",
                                 "the batch of input " + std::to_string(i));
    }

    // The loop body: element i of every batched input, one Scan over its steps.
    auto lb = std::make_shared<Graph>();
    lb->opsets = g.opsets;
    lb->source = g.source;
    Value* iter = lb->add_input(lb->unique_name(base + ".b"), TensorType{DType::kInt64, Shape{}});
    Value* cond_in = lb->add_input(lb->unique_name(base + ".cond"), TensorType{DType::kBool, Shape{}});
    for (const Value* c : body->captures())
      if (lb->find_value(c->name()) == nullptr) lb->add_capture(c->name(), c->type());
    const size_t num_state = n->num_inputs() - 1 - num_scan_in;
    // With sequence_lens: element b scans the first lens[b] steps of its
    // scan inputs (Slice) and its scan outputs are padded with zeros to the
    // steps (Pad). The lengths are checked first, as the batched form
    // did: lens has one element per batch element, each within [0, steps];
    // the scan inputs share their steps.
    Value* lens = nullptr;
    Value* steps = nullptr;
    if (n->input(0) != nullptr) {
      Value* one = g.add_constant(g.unique_name(base + ".one"), int64_scalar(1));
      auto steps_of = [&](Value* x) {
        Value* s = g.insert_node_before(n, "Shape", {x}, {g.unique_name(x->name() + ".shape")})->output(0);
        return g.insert_node_before(n, "Gather", {s, one}, {g.unique_name(x->name() + ".steps")})->output(0);
      };
      steps = steps_of(n->input(1 + num_state));
      for (size_t j = 1; j < num_scan_in; ++j) {
        steps = insert_range_check(g, n, {steps_of(n->input(1 + num_state + j)), steps, steps},
                                   base + ".steps_agree", "the steps of scan input " + std::to_string(j));
      }
      lens = insert_range_check(g, n, {n->input(0), zero, steps, trips}, base + ".lens", "sequence_lens");
      // The body slices and pads with inputs (Slice-10, Pad-11 on).
      auto& op = lb->opsets[""];
      op = std::max<int64_t>(op, 13);
    }
    auto capture = [&](Value* outer) {
      Value* cap = lb->find_value(outer->name());
      return cap != nullptr ? cap : lb->add_capture(outer->name(), outer->type());
    };
    auto lb_const = [&](const std::string& name, Tensor t) { return lb->add_constant(lb->unique_name(base + name), std::move(t)); };
    Value* len = nullptr;
    Value* len1 = nullptr;
    if (lens != nullptr) {
      len = lb->add_node("Gather", {capture(lens), iter}, {lb->unique_name(base + ".len")})->output(0);
      len1 = lb->add_node("Reshape", {len, lb_const(".shape1", int64_vector({1}))}, {lb->unique_name(base + ".len1")})->output(0);
    }
    std::vector<Value*> inner_ins;
    for (size_t i = 1; i < n->num_inputs(); ++i) {
      const Value* outer = n->input(i);
      Node* pick = lb->add_node("Gather", {capture(n->input(i)), iter}, {lb->unique_name(outer->name() + ".elem")});
      pick->set_attr("axis", Attribute::of_int(0));
      Value* e = pick->output(0);
      if (len1 != nullptr && i > num_state) {
        Value* start = lb_const(".start", int64_vector({0}));
        e = lb->add_node("Slice", {e, start, len1, start}, {lb->unique_name(outer->name() + ".first")})->output(0);
      }
      inner_ins.push_back(e);
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
    if (lens != nullptr) {
      // pads: 0 before every dim, steps - lens[b] after dim 0, 0 after the others.
      Value* rest = lb->add_node("Sub", {capture(steps), len}, {lb->unique_name(base + ".rest")})->output(0);
      Value* rest1 = lb->add_node("Reshape", {rest, lb_const(".shape1", int64_vector({1}))}, {lb->unique_name(base + ".rest1")})->output(0);
      for (size_t k = num_state; k < n->num_outputs(); ++k) {
        const int64_t rank = static_cast<int64_t>(body->outputs()[k]->type().shape->size()) + 1;
        Value* pads = lb->add_node("Concat",
                                   {lb_const(".pads_begin", int64_vector(std::vector<int64_t>(static_cast<size_t>(rank), 0))),
                                    rest1,
                                    lb_const(".pads_end", int64_vector(std::vector<int64_t>(static_cast<size_t>(rank - 1), 0)))},
                                   {lb->unique_name(base + ".pads" + std::to_string(k))})->output(0);
        pads->producer()->set_attr("axis", Attribute::of_int(0));
        outs[1 + k] = lb->add_node("Pad", {outs[1 + k], pads}, {lb->unique_name(base + ".padded" + std::to_string(k))})->output(0);
      }
    }
    lb->set_outputs(outs);

    // No carried values: every Scan output is a scan output of the Loop,
    // stacked along a new axis 0, the batch.
    std::vector<std::string> loop_outs;
    for (size_t k = 0; k < n->num_outputs(); ++k) loop_outs.push_back(g.unique_name(base + ".batched" + std::to_string(k)));
    Node* loop = g.insert_node_before(n, "Loop", {trips, nullptr}, loop_outs);
    loop->set_attr("body", Attribute::of_graph(lb));
    loop->set_name(n->name());  // errors inside name the node
    KILN_RETURN_IF_ERROR(replace_outputs(g, n, loop, "scan8-to-loop"));
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
