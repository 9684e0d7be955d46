// Scan's gradient rule (opset 9 and later, axes 0, forward directions): the
// steps run again in a Scan that also outputs each step's incoming states
// (what a backward step needs, kept per iteration), then a reverse Scan whose
// body is the forward body followed by its own reverse mode: with the
// gradients of the step's outputs (carried for the states, sliced for the
// scan outputs) it gives the gradients of the step's incoming states (carried
// back), of its scan input slices and of the values the body captures (per
// step, summed afterwards).
#include <memory>

#include "graph/copy.h"
#include "ops/common.h"
#include "ops/gradient.h"
#include "ops/rnn_grad.h"

namespace kiln::ops {

namespace {

bool is_float_type(const TensorType& t) {
  return t.dtype == DType::kFloat32 || t.dtype == DType::kFloat64 || t.dtype == DType::kFloat16 ||
         t.dtype == DType::kBFloat16;
}

bool all_zero(const Node& n, const char* key) {
  const Attribute* a = n.attr(key);
  if (a == nullptr) return true;
  for (int64_t v : a->ints)
    if (v != 0) return false;
  return true;
}

// Copies the nodes of `from` into `into` (new values named prefix + name),
// reading map[v] for `from`'s inputs; its captures become `into`'s captures
// and its constants `into`'s constants.
Status copy_body(const Graph& from, Graph& into, std::map<const Value*, Value*>& map, const std::string& prefix) {
  for (const Value* c : from.captures()) {
    Value* existing = into.find_value(c->name());
    map[c] = existing != nullptr ? existing : into.add_capture(c->name(), c->type());
  }
  for (const Value* c : from.constants()) map[c] = into.add_constant(into.unique_name(prefix + c->name()), c->constant());
  return copy_nodes(from, into, map, [&](const Value* o) { return into.unique_name(prefix + o->name()); });
}

// Adds sum(out * seed) to `surrogate` (null: none yet): one term of the
// vector-Jacobian product a backward step differentiates.
void add_vjp_term(Graph& g, Value*& surrogate, Value* out, Value* seed, const std::string& base) {
  Value* prod = g.add_node("Mul", {out, seed}, {g.unique_name(base + ".vjp")})->output(0);
  Node* sum = g.add_node("ReduceSum", {prod}, {g.unique_name(base + ".vjp_sum")});
  sum->set_attr("keepdims", Attribute::of_int(0));
  Value* s = sum->output(0);
  surrogate = surrogate == nullptr ? s : g.add_node("Add", {surrogate, s}, {g.unique_name(base + ".vjp_total")})->output(0);
}

// Zeros of v's shape and dtype, in the enclosing graph.
Result<Value*> zeros_of_shape(GradBuilder& b, Value* v) {
  KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {v}));
  return b.add1("ConstantOfShape", {shape}, {{"value", Attribute::of_tensor(Tensor(v->dtype(), {1}))}});
}

// A copy of `body` that also outputs its `ns` state inputs (from input
// `first` on) as scan outputs after its own: each step's incoming states.
Result<std::shared_ptr<Graph>> keeping_states(const Graph& body, size_t first, size_t ns, const std::string& base) {
  auto save = std::make_shared<Graph>();
  save->opsets = body.opsets;
  std::map<const Value*, Value*> map;
  for (const Value* in : body.inputs()) map[in] = save->add_input(base + ".fwd." + in->name(), in->type());
  KILN_RETURN_IF_ERROR(copy_body(body, *save, map, base + ".fwd."));
  std::vector<Value*> outs;
  for (const Value* o : body.outputs()) outs.push_back(map.at(o));
  for (size_t j = 0; j < ns; ++j)
    outs.push_back(
        save->add_node("Identity", {map.at(body.inputs()[first + j])}, {save->unique_name(base + ".fwd.kept")})->output(0));
  save->set_outputs(outs);
  return save;
}

}  // namespace

Status grad_scan(GradBuilder& b) {
  const Node& n = b.node();
  const Attribute* body_attr = n.attr("body");
  const int64_t m = n.attr_int("num_scan_inputs", 0);
  if (body_attr == nullptr || body_attr->g == nullptr || m < 1 || static_cast<size_t>(m) > n.num_inputs())
    return node_invalid(n) << "needs a body and num_scan_inputs";
  if (b.opset() < 9 || n.has_attr("kiln_scan_opset9"))
    return unsupported() << n.describe() << ": the Scan gradient covers opset 9 and later";
  if (!all_zero(n, "scan_input_axes") || !all_zero(n, "scan_output_axes") || !all_zero(n, "scan_input_directions") ||
      !all_zero(n, "scan_output_directions"))
    return unsupported() << n.describe() << ": the Scan gradient covers axes 0 and forward directions";
  const Graph& body = *body_attr->g;
  const size_t ns = n.num_inputs() - static_cast<size_t>(m), nm = static_cast<size_t>(m);
  const size_t nk = n.num_outputs() - ns;
  if (body.inputs().size() != ns + nm || body.outputs().size() != ns + nk)
    return node_invalid(n) << "its body's inputs and outputs do not match the node's";
  for (const Value* v : body.inputs())
    if (!v->type().has_shape()) return unsupported() << n.describe() << ": the Scan gradient needs typed body inputs";
  const std::string base = (n.name().empty() ? std::string("scan") : n.name()) + ".bptt";

  auto zeros_like = [&](Value* v) { return zeros_of_shape(b, v); };

  // 1. The steps again, each step's incoming states kept: outputs as the
  // node's, then the N states before each step, [T, ...].
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> save, keeping_states(body, 0, ns, base));
  std::vector<Value*> inputs(n.inputs().begin(), n.inputs().end());
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> fwd,
                        b.add("Scan", inputs,
                              {{"body", Attribute::of_graph(save)}, {"num_scan_inputs", Attribute::of_int(m)}},
                              ns + nk + ns));
  // fwd[ns + nk + j]: state j before each step.

  // 2. The backward step: carries dS (float states), scan slices S_t, x_t,
  // dy_t; the forward step, the surrogate sum <out, d out>, its reverse mode.
  auto back = std::make_shared<Graph>();
  back->opsets = body.opsets;
  std::vector<size_t> float_states, float_inputs;
  for (size_t j = 0; j < ns; ++j)
    if (is_float_type(body.inputs()[j]->type())) float_states.push_back(j);
  for (size_t i = 0; i < nm; ++i)
    if (is_float_type(body.inputs()[ns + i]->type())) float_inputs.push_back(i);
  std::vector<Value*> carries;  // per float state
  for (size_t j : float_states)
    carries.push_back(back->add_input(base + ".dstate" + std::to_string(j), body.outputs()[j]->type()));
  std::map<const Value*, Value*> map;
  for (size_t j = 0; j < ns + nm; ++j) {
    const Value* in = body.inputs()[j];
    map[in] = back->add_input(base + ".bwd." + in->name(), in->type());
  }
  std::vector<Value*> dys;
  for (size_t k = 0; k < nk; ++k)
    dys.push_back(back->add_input(base + ".dy" + std::to_string(k), body.outputs()[ns + k]->type()));
  KILN_RETURN_IF_ERROR(copy_body(body, *back, map, base + ".bwd."));
  Value* surrogate = nullptr;
  auto add_term = [&](const Value* out, Value* seed) { add_vjp_term(*back, surrogate, map.at(out), seed, base); };
  for (size_t c = 0; c < float_states.size(); ++c) add_term(body.outputs()[float_states[c]], carries[c]);
  for (size_t k = 0; k < nk; ++k)
    if (is_float_type(body.outputs()[ns + k]->type())) add_term(body.outputs()[ns + k], dys[k]);
  if (surrogate == nullptr) return Status::ok();  // no float output: nothing flows back
  std::vector<Value*> params;
  for (size_t j : float_states) params.push_back(map.at(body.inputs()[j]));
  for (size_t i : float_inputs) params.push_back(map.at(body.inputs()[ns + i]));
  // Captured values of the enclosing graph that want a gradient.
  std::vector<Value*> outer_wanted;
  for (Value* v : b.implicit_inputs()) {
    Value* cap = back->find_value(v->name());
    if (cap == nullptr || !b.wants_value(v) || !is_float_type(v->type())) continue;
    outer_wanted.push_back(v);
    params.push_back(cap);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> grads, b.differentiate(*back, surrogate, params));
  // Outputs: the new carries, then per step dx (float scan inputs) and d(capture).
  std::vector<Value*> outs;
  for (size_t c = 0; c < float_states.size(); ++c) outs.push_back(grads[c]);
  for (size_t q = float_states.size(); q < grads.size(); ++q) outs.push_back(grads[q]);
  // A body output may not be a body input or a shared value: each through its own Identity.
  for (Value*& o : outs) o = back->add_node("Identity", {o}, {back->unique_name(base + ".bwd.out")})->output(0);
  back->set_outputs(outs);

  // 3. The reverse Scan: carries start at the final states' gradients.
  std::vector<Value*> bin;
  for (size_t j : float_states) {
    Value* g = b.output_grad(j);
    if (g == nullptr) {
      KILN_ASSIGN_OR_RETURN(g, zeros_like(n.output(j)));
    }
    bin.push_back(g);
  }
  for (size_t j = 0; j < ns; ++j) bin.push_back(fwd[ns + nk + j]);
  for (size_t i = 0; i < nm; ++i) bin.push_back(n.input(ns + i));
  for (size_t k = 0; k < nk; ++k) {
    Value* g = b.output_grad(ns + k);
    if (g == nullptr) {
      KILN_ASSIGN_OR_RETURN(g, zeros_like(n.output(ns + k)));
    }
    bin.push_back(g);
  }
  const int64_t scanned = static_cast<int64_t>(ns + nm + nk);
  const size_t per_step = outs.size() - float_states.size();
  KILN_ASSIGN_OR_RETURN(
      std::vector<Value*> r,
      b.add("Scan", bin,
            {{"body", Attribute::of_graph(back)},
             {"num_scan_inputs", Attribute::of_int(scanned)},
             {"scan_input_directions", Attribute::of_ints(std::vector<int64_t>(static_cast<size_t>(scanned), 1))},
             {"scan_output_directions", Attribute::of_ints(std::vector<int64_t>(per_step, 1))}},
            outs.size()));
  for (size_t c = 0; c < float_states.size(); ++c)
    KILN_RETURN_IF_ERROR(b.set_input_grad(float_states[c], r[c]));
  size_t q = float_states.size();
  for (size_t i : float_inputs) KILN_RETURN_IF_ERROR(b.set_input_grad(ns + i, r[q++]));
  for (Value* v : outer_wanted) {
    KILN_ASSIGN_OR_RETURN(Value* total, b.reduce_sum(r[q++], {0}, false));
    KILN_RETURN_IF_ERROR(b.add_value_grad(v, total));
  }
  return Status::ok();
}

Status grad_loop(GradBuilder& b) {
  const Node& n = b.node();
  const Attribute* body_attr = n.attr("body");
  if (body_attr == nullptr || body_attr->g == nullptr || n.num_inputs() < 2) return node_invalid(n) << "needs a body";
  const Graph& body = *body_attr->g;
  const size_t ns = n.num_inputs() - 2;
  if (body.inputs().size() != ns + 2 || body.outputs().size() < ns + 1)
    return node_invalid(n) << "its body's inputs and outputs do not match the node's";
  const size_t nk = body.outputs().size() - 1 - ns;
  // Each state keeps its type from step to step (the kept states are stacked).
  for (size_t j = 0; j < ns; ++j) {
    const TensorType& in = body.inputs()[2 + j]->type();
    const TensorType& out = body.outputs()[1 + j]->type();
    if (in.is_container() || !in.has_shape() || !out.has_shape() || in.to_string() != out.to_string())
      return unsupported() << n.describe() << ": the Loop gradient needs every carried value to keep its type ("
                           << body.inputs()[2 + j]->name() << " is " << in.to_string() << ", then "
                           << out.to_string() << ")";
  }
  if (ns + nk == 0) return Status::ok();
  const std::string base = (n.name().empty() ? std::string("loop") : n.name()) + ".bptt";
  auto zeros_like = [&](Value* v) { return zeros_of_shape(b, v); };

  // 1. The iterations again, each one's incoming states kept as scan outputs.
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> save, keeping_states(body, 2, ns, base));
  std::vector<Value*> inputs(n.inputs().begin(), n.inputs().end());
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> fwd, b.add("Loop", inputs, {{"body", Attribute::of_graph(save)}}, ns + nk + ns));
  // The iterations run: the kept states' (or a scan output's) leading dim.
  KILN_ASSIGN_OR_RETURN(Value* stacked_shape, b.add1("Shape", {ns > 0 ? fwd[ns + nk] : fwd[ns]}));
  KILN_ASSIGN_OR_RETURN(Value* trips, b.add1("Gather", {stacked_shape, b.ints({0})}));
  KILN_ASSIGN_OR_RETURN(Value* trips_scalar, b.add1("Squeeze", {trips, b.ints({0})}));
  // The gradients of the scan outputs, whole (zeros where none flows).
  std::vector<Value*> dys;
  for (size_t k = 0; k < nk; ++k) {
    Value* g = b.output_grad(ns + k);
    if (g == nullptr) {
      KILN_ASSIGN_OR_RETURN(g, zeros_like(n.output(ns + k)));
    }
    dys.push_back(g);
  }

  // 2. The backward iteration i (of T): step t = T - 1 - i of the forward,
  // its states and scan-output gradients gathered from the stacks; carries
  // dS (float states) and the captured values' gradients summed so far.
  auto back = std::make_shared<Graph>();
  back->opsets = body.opsets;
  Value* iter = back->add_input(base + ".i", TensorType{DType::kInt64, Shape{}});
  back->add_input(base + ".cond", TensorType{DType::kBool, Shape{}});  // always true: the step ran
  std::vector<size_t> float_states;
  for (size_t j = 0; j < ns; ++j)
    if (is_float_type(body.inputs()[2 + j]->type())) float_states.push_back(j);
  std::vector<Value*> carries;
  for (size_t j : float_states)
    carries.push_back(back->add_input(base + ".dstate" + std::to_string(j), body.inputs()[2 + j]->type()));
  // Captured values that want a gradient: their sums so far are carried too.
  std::vector<Value*> outer_wanted;
  for (Value* v : b.implicit_inputs())
    if (b.wants_value(v) && is_float_type(v->type()) && body.find_value(v->name()) != nullptr) outer_wanted.push_back(v);
  std::vector<Value*> sums;
  for (Value* v : outer_wanted) sums.push_back(back->add_input(base + ".dsum." + v->name(), v->type()));
  auto capture = [&](Value* outer) {
    Value* c = back->find_value(outer->name());
    return c != nullptr ? c : back->add_capture(outer->name(), outer->type());
  };
  Tensor one_t(DType::kInt64, {});
  one_t.data_as<int64_t>()[0] = 1;
  Value* last = back->add_node("Sub", {capture(trips_scalar), back->add_constant(back->unique_name(base + ".one"), one_t)},
                               {back->unique_name(base + ".last")})->output(0);
  Value* t = back->add_node("Sub", {last, iter}, {back->unique_name(base + ".t")})->output(0);
  auto at_t = [&](Value* stack) {
    return back->add_node("Gather", {capture(stack), t}, {back->unique_name(base + ".at")})->output(0);
  };
  std::map<const Value*, Value*> map;
  map[body.inputs()[0]] = t;
  Tensor yes(DType::kBool, {});
  yes.data_as<bool>()[0] = true;
  Value* true_v = back->add_constant(back->unique_name(base + ".true"), yes);
  map[body.inputs()[1]] = true_v;
  std::vector<Value*> kept;
  for (size_t j = 0; j < ns; ++j) {
    kept.push_back(at_t(fwd[ns + nk + j]));
    map[body.inputs()[2 + j]] = kept.back();
  }
  KILN_RETURN_IF_ERROR(copy_body(body, *back, map, base + ".bwd."));
  Value* surrogate = nullptr;
  auto add_term = [&](const Value* out, Value* seed) { add_vjp_term(*back, surrogate, map.at(out), seed, base); };
  for (size_t c = 0; c < float_states.size(); ++c) add_term(body.outputs()[1 + float_states[c]], carries[c]);
  for (size_t k = 0; k < nk; ++k)
    if (is_float_type(body.outputs()[1 + ns + k]->type())) add_term(body.outputs()[1 + ns + k], at_t(dys[k]));
  if (surrogate == nullptr) return Status::ok();
  std::vector<Value*> params;
  for (size_t j : float_states) params.push_back(kept[j]);
  for (Value* v : outer_wanted) params.push_back(back->find_value(v->name()));
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> grads, b.differentiate(*back, surrogate, params));
  std::vector<Value*> outs = {back->add_node("Identity", {true_v}, {back->unique_name(base + ".cond_out")})->output(0)};
  for (size_t c = 0; c < float_states.size(); ++c)
    outs.push_back(back->add_node("Identity", {grads[c]}, {back->unique_name(base + ".bwd.out")})->output(0));
  for (size_t q = 0; q < outer_wanted.size(); ++q)
    outs.push_back(back->add_node("Add", {sums[q], grads[float_states.size() + q]},
                                  {back->unique_name(base + ".bwd.sum")})->output(0));
  back->set_outputs(outs);

  // 3. The backward Loop: T iterations, carries from the final states' gradients, sums from zeros.
  std::vector<Value*> bin = {trips_scalar, nullptr};
  for (size_t j : float_states) {
    Value* g = b.output_grad(j);
    if (g == nullptr) {
      KILN_ASSIGN_OR_RETURN(g, zeros_like(n.output(j)));
    }
    bin.push_back(g);
  }
  for (Value* v : outer_wanted) {
    KILN_ASSIGN_OR_RETURN(Value* z, zeros_like(v));
    bin.push_back(z);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> r,
                        b.add("Loop", bin, {{"body", Attribute::of_graph(back)}}, float_states.size() + outer_wanted.size()));
  for (size_t c = 0; c < float_states.size(); ++c)
    KILN_RETURN_IF_ERROR(b.set_input_grad(2 + float_states[c], r[c]));
  for (size_t q = 0; q < outer_wanted.size(); ++q)
    KILN_RETURN_IF_ERROR(b.add_value_grad(outer_wanted[q], r[float_states.size() + q]));
  return Status::ok();
}

}  // namespace kiln::ops
