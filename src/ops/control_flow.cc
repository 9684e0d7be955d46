// Control flow: If, Loop, Scan (opsets 9/11..21). Only shape inference lives
// here; the driver compiles each subgraph to a sub-program and the VM runs it
// (kIf / kLoop / kScan, runtime/vm.h). The ops have neither a lowering nor a
// runtime kernel.
//
// Inference of a node infers its subgraphs first. A subgraph's input types come
// from the node (the ONNX body input types are overridden), its captures take
// the types, constants and (when expressible) symbolic values of the outer
// values they stand for. Output dims that the subgraph computes over symbols
// of the outer graph (dims of the node's inputs and captured values) are kept;
// any other dim becomes a fresh symbol, bound at run time from the tensors the
// sub-program returns.
#include <set>

#include "ops/common.h"
#include "ops/rnn_grad.h"

namespace kiln::ops {

namespace {

void add_vars(const TensorType& t, std::set<std::string>& out) {
  if (!t.shape) return;
  for (const Expr& d : *t.shape)
    for (const std::string& v : free_vars(d)) out.insert(v);
}

bool vars_within(const Expr& e, const std::set<std::string>& known) {
  for (const std::string& v : free_vars(e))
    if (!known.count(v)) return false;
  return true;
}

// Symbols known in the outer graph when `n` runs: dims of its inputs and of
// the outer values its subgraphs capture.
std::set<std::string> outer_symbols(const Node& n, const InferContext& ctx) {
  std::set<std::string> known;
  for (const Value* v : n.inputs())
    if (v) add_vars(v->type(), known);
  if (ctx.graph)
    for (const Value* v : ctx.graph->implicit_inputs(&n)) add_vars(v->type(), known);
  return known;
}

// A dim of a subgraph output as seen from the outer graph.
Expr outer_dim(const Expr& d, const std::set<std::string>& known, InferContext& ctx) {
  if (vars_within(d, known)) return d;
  return ctx.fresh_symbol();
}

Graph* subgraph(const Node& n, const std::string& name) {
  const Attribute* a = n.attr(name);
  return a && a->kind == Attribute::Kind::kGraph ? a->g.get() : nullptr;
}

// Infers `sub` (a subgraph of `n`) in the scope of ctx.graph, with the
// shared symbol counter and bounds. The caller has set the input types.
Status infer_subgraph(const Node& n, Graph& sub, InferContext& ctx) {
  Graph* outer = ctx.graph;
  if (outer == nullptr) return node_invalid(n) << "subgraph inference without an outer graph";
  if (sub.opsets.empty()) sub.opsets = outer->opsets;
  if (sub.source.empty()) sub.source = outer->source;
  std::set<std::string> bound;
  for (const Value* v : sub.inputs()) add_vars(v->type(), bound);
  for (Value* c : sub.captures()) {
    const Value* o = outer->find_value(c->name());
    if (o == nullptr) return node_invalid(n) << "subgraph captures unknown value '" << c->name() << "'";
    c->set_type(o->type());
    if (o->is_constant() && !c->is_constant()) c->set_constant(o->constant());
    add_vars(o->type(), bound);
  }
  // A symbolic value is copied only when the sub-program can evaluate it (its
  // symbols are dims of the sub-program's inputs).
  for (Value* c : sub.captures()) {
    const Value* o = outer->find_value(c->name());
    std::optional<std::vector<Expr>> sv = o->sym_value();
    if (sv)
      for (const Expr& e : *sv)
        if (!vars_within(e, bound)) sv.reset();
    if (sv || !c->is_constant()) c->set_sym_value(sv);
  }
  Status st = infer_shapes(sub, ctx);
  ctx.graph = outer;
  if (!st.is_ok()) return Status(st.code(), n.describe() + " subgraph '" + sub.name + "': " + st.message());
  return Status::ok();
}

Status check_outputs(const Node& n, const Graph& sub, size_t expected, const char* what) {
  if (sub.outputs().size() != expected)
    return node_invalid(n) << what << " has " << sub.outputs().size() << " outputs, expected " << expected;
  for (const Value* v : sub.outputs())
    if (v->dtype() == DType::kUndefined)
      return node_unsupported(n) << what << " output '" << v->name() << "' has no tensor type";
  return Status::ok();
}

Status infer_if(Node& n, InferContext& ctx) {
  Graph* then_g = subgraph(n, "then_branch");
  Graph* else_g = subgraph(n, "else_branch");
  if (!then_g || !else_g) return node_invalid(n) << "missing then_branch or else_branch";
  KILN_ASSIGN_OR_RETURN(TensorType cond, input_type(n, 0));
  if (cond.is_container() || cond.dtype == DType::kString)
    return node_invalid(n) << "condition is " << cond.to_string() << ", expected a bool tensor";
  // A condition known at compile time (a constant, or a shape computation
  // such as Equal(Size(x), 4) in an expanded function): the outputs take the
  // taken branch's types; the other branch may not even be valid for these
  // shapes (AffineGrid's expanded 3-D branch splits a 4-element size 5 ways,
  // and squeezes a dim that may be 1): its inference may fail, and the
  // program runs only the taken branch (driver/pipeline.cc, emit_if).
  std::optional<bool> taken = known_condition(n, ctx.bounds);
  for (bool then_side : {true, false}) {
    Graph& g = then_side ? *then_g : *else_g;
    const char* what = then_side ? "then_branch" : "else_branch";
    Status st = infer_subgraph(n, g, ctx);
    if (taken && *taken != then_side) continue;  // never runs: its failure is no error
    KILN_RETURN_IF_ERROR(st);
    KILN_RETURN_IF_ERROR(check_outputs(n, g, n.num_outputs(), what));
  }
  std::set<std::string> known = outer_symbols(n, ctx);
  for (size_t i = 0; i < n.num_outputs(); ++i) {
    const TensorType& t = then_g->outputs()[i]->type();
    const TensorType& e = else_g->outputs()[i]->type();
    if (t.is_container() || e.is_container()) {
      // A container's length and element dims are bound from the value, so
      // the branches' symbols never leak out: the joined type, fresh length.
      KILN_ASSIGN_OR_RETURN(TensorType j, join_container_types(n, taken ? (*taken ? t : e) : t, taken ? (*taken ? t : e) : e, ctx));
      (*j.shape)[0] = ctx.fresh_symbol();
      n.output(i)->set_type(std::move(j));
      continue;
    }
    if (taken) {
      const TensorType& b = *taken ? t : e;
      if (!b.shape) {
        set_output_unknown_rank(n, i, b.dtype);
        continue;
      }
      Shape shape;
      for (const Expr& d : *b.shape) shape.push_back(outer_dim(d, known, ctx));
      set_output(n, i, b.dtype, std::move(shape), ctx);
      // The taken branch's values where they are known symbolically in the
      // outer scope (AffineGrid's expanded 2-D branch sets D = 1).
      const Value* bv = (*taken ? then_g : else_g)->outputs()[i];
      if (bv->sym_value()) {
        bool outer = true;
        for (const Expr& e : *bv->sym_value()) outer = outer && vars_within(e, known);
        if (outer) n.output(i)->set_sym_value(bv->sym_value());
      }
      continue;
    }
    if (t.dtype != e.dtype)
      return node_invalid(n) << "output " << i << " is " << dtype_name(t.dtype) << " in then_branch and "
                             << dtype_name(e.dtype) << " in else_branch";
    if (!t.shape || !e.shape || t.shape->size() != e.shape->size()) {
      set_output_unknown_rank(n, i, t.dtype);
      continue;
    }
    Shape shape;
    for (size_t k = 0; k < t.shape->size(); ++k) {
      const Expr& a = (*t.shape)[k];
      const Expr& b = (*e.shape)[k];
      shape.push_back(prove_equal(a, b, ctx.bounds) ? outer_dim(a, known, ctx) : ctx.fresh_symbol());
    }
    set_output(n, i, t.dtype, std::move(shape), ctx);
  }
  return Status::ok();
}

// Infers a body whose inputs [first, first + state.size()) are loop-carried
// with the given initial types and whose outputs [out_first, ...) are their
// next values. Dims that the body does not preserve become fresh symbols on
// the body input (bound per iteration). Returns the carried types as seen
// from the outer graph.
Result<std::vector<TensorType>> infer_carried(Node& n, Graph& body, size_t first, size_t out_first,
                                              const std::vector<TensorType>& state, size_t num_outputs,
                                              InferContext& ctx) {
  std::set<std::string> known = outer_symbols(n, ctx);
  std::vector<std::vector<bool>> varies(state.size());
  for (size_t j = 0; j < state.size(); ++j) {
    if (!state[j].shape) return node_unsupported(n) << "loop-carried input " << j << " has unknown rank";
    varies[j].assign(state[j].shape->size(), false);
  }
  for (int round = 0;; ++round) {
    KILN_RETURN_IF_ERROR(infer_subgraph(n, body, ctx));
    KILN_RETURN_IF_ERROR(check_outputs(n, body, num_outputs, "body"));
    bool changed = false;
    for (size_t j = 0; j < state.size(); ++j) {
      Value* in = body.inputs()[first + j];
      const TensorType& out = body.outputs()[out_first + j]->type();
      if (state[j].is_container() || out.is_container()) {
        // The element type and length the body leaves: joined until they settle.
        // An optional carried value may come back as its element (ONNX lets an
        // optional become the value it holds): it stays optional, and the VM
        // wraps the body's output (run_loop).
        TensorType next = out;
        if (in->type().dtype == DType::kOptional && out.dtype != DType::kOptional && in->type().elem &&
            in->type().elem->dtype == out.dtype)
          next = TensorType::container(DType::kOptional, out, Dim(int64_t{1}));
        KILN_ASSIGN_OR_RETURN(TensorType joined, join_container_types(n, in->type(), next, ctx));
        // A length the body changes is a symbol of the body's own (bound per
        // iteration), never the initial value's: the VM binds the caller's
        // symbols in a sub-program before its inputs.
        bool grows = !prove_equal((*in->type().shape)[0], (*next.shape)[0], ctx.bounds) && !varies[j][0];
        if (grows || !same_container_shape(joined, in->type())) {
          varies[j][0] = varies[j][0] || grows;
          (*joined.shape)[0] = varies[j][0] ? ctx.fresh_symbol() : (*in->type().shape)[0];
          in->set_type(std::move(joined));
          changed = true;
        }
        continue;
      }
      if (out.dtype != state[j].dtype)
        return node_invalid(n) << "body changes the dtype of loop-carried value " << j << " from "
                               << dtype_name(state[j].dtype) << " to " << dtype_name(out.dtype);
      if (!out.shape || out.shape->size() != state[j].shape->size())
        return node_unsupported(n) << "body changes the rank of loop-carried value " << j;
      Shape shape = in->type().shape ? *in->type().shape : *state[j].shape;
      for (size_t k = 0; k < shape.size(); ++k) {
        if (varies[j][k] || prove_equal(shape[k], (*out.shape)[k], ctx.bounds)) continue;
        varies[j][k] = true;
        shape[k] = ctx.fresh_symbol();
        changed = true;
      }
      in->set_type(TensorType{state[j].dtype, std::move(shape)});
    }
    if (!changed) break;
    if (round > 64) return node_unsupported(n) << "loop-carried shapes do not settle";
  }
  std::vector<TensorType> out;
  for (size_t j = 0; j < state.size(); ++j) {
    if (state[j].is_container()) {
      TensorType t = body.inputs()[first + j]->type();
      (*t.shape)[0] = ctx.fresh_symbol();
      out.push_back(std::move(t));
      continue;
    }
    Shape shape = *state[j].shape;
    for (size_t k = 0; k < shape.size(); ++k)
      shape[k] = varies[j][k] ? ctx.fresh_symbol() : outer_dim(shape[k], known, ctx);
    out.push_back(TensorType{state[j].dtype, std::move(shape)});
  }
  return out;
}

Status infer_loop(Node& n, InferContext& ctx) {
  Graph* body = subgraph(n, "body");
  if (!body) return node_invalid(n) << "missing body";
  if (n.num_inputs() < 2) return node_invalid(n) << "expects inputs M, cond, loop-carried values";
  size_t num_carried = n.num_inputs() - 2;
  if (body->inputs().size() != num_carried + 2)
    return node_invalid(n) << "body has " << body->inputs().size() << " inputs, expected " << num_carried + 2;
  if (body->outputs().size() < num_carried + 1)
    return node_invalid(n) << "body has " << body->outputs().size() << " outputs, expected at least "
                           << num_carried + 1;
  size_t num_scan = body->outputs().size() - 1 - num_carried;
  if (n.num_outputs() != num_carried + num_scan)
    return node_invalid(n) << "has " << n.num_outputs() << " outputs, body defines " << num_carried + num_scan;
  for (size_t i = 0; i < 2; ++i) {
    if (!has_input(n, i)) continue;
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
    if (t.is_container() || t.dtype == DType::kString)
      return node_invalid(n) << (i == 0 ? "M" : "cond") << " is " << t.to_string() << ", expected a tensor";
  }
  std::vector<TensorType> state;
  for (size_t j = 0; j < num_carried; ++j) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 2 + j));
    state.push_back(t);
  }
  body->inputs()[0]->set_type(TensorType{DType::kInt64, Shape{}});
  body->inputs()[1]->set_type(TensorType{DType::kBool, Shape{}});
  for (size_t j = 0; j < num_carried; ++j) body->inputs()[2 + j]->set_type(state[j]);
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> carried,
                        infer_carried(n, *body, 2, 1, state, num_carried + 1 + num_scan, ctx));
  if (const TensorType& c = body->outputs()[0]->type(); c.is_container() || c.dtype == DType::kString)
    return node_invalid(n) << "body condition is " << c.to_string() << ", expected a bool tensor";
  for (size_t j = 0; j < num_carried; ++j) {
    if (carried[j].is_container()) n.output(j)->set_type(carried[j]);
    else set_output(n, j, carried[j].dtype, *carried[j].shape, ctx);
  }

  std::set<std::string> known = outer_symbols(n, ctx);
  // The trip count is M when there is no condition and M is known.
  Expr trips;
  if (has_input(n, 0) && !has_input(n, 1)) {
    auto m = sym_values(n, 0);
    if (m && m->size() == 1 && vars_within((*m)[0], known)) trips = simplify(max((*m)[0], Expr(0)), ctx.bounds);
  }
  // A carried sequence the body appends one element to per iteration
  // (SequenceInsert of it without a position) ends trips longer than it began.
  for (size_t j = 0; j < num_carried && trips.defined(); ++j) {
    const Node* p = body->outputs()[1 + j]->producer();
    TensorType t = n.output(j)->type();
    if (t.dtype != DType::kSequence || !t.shape || t.shape->size() != 1 || !state[j].shape || state[j].shape->size() != 1 ||
        p == nullptr || !p->domain().empty() || p->op_type() != "SequenceInsert" || p->num_inputs() != 2 ||
        p->input(0) != body->inputs()[2 + j])
      continue;
    Expr start = (*state[j].shape)[0];
    if (!vars_within(start, known)) continue;
    (*t.shape)[0] = simplify(start + trips, ctx.bounds);
    n.output(j)->set_type(t);
  }
  for (size_t k = 0; k < num_scan; ++k) {
    const TensorType& t = body->outputs()[1 + num_carried + k]->type();
    if (!t.shape) {
      set_output_unknown_rank(n, num_carried + k, t.dtype);
      continue;
    }
    Shape shape{trips.defined() ? trips : ctx.fresh_symbol()};
    for (const Expr& d : *t.shape) shape.push_back(outer_dim(d, known, ctx));
    set_output(n, num_carried + k, t.dtype, std::move(shape), ctx);
  }
  return Status::ok();
}

// Scan in opset 8: input 0 is the optional sequence_lens ([B], int64), then
// the initial states [B, ...] and the scan inputs [B, T, ...]; the body sees
// one batch element's states and one step's slices (no batch axis).
// Outputs: the final states [B, ...] and the scan outputs [B, T, ...], zero
// past an element's sequence length. Attribute `directions`: per scan input,
// 1 = reverse. The node is marked kiln_scan_batched for the program builder.
Status infer_scan8(Node& n, InferContext& ctx) {
  Graph* body = subgraph(n, "body");
  if (!body) return node_invalid(n) << "missing body";
  int64_t num_scan_in = n.attr_int("num_scan_inputs", -1);
  if (num_scan_in < 1 || static_cast<size_t>(num_scan_in) + 1 > n.num_inputs())
    return node_invalid(n) << "num_scan_inputs " << num_scan_in << " out of range";
  size_t num_state = n.num_inputs() - 1 - static_cast<size_t>(num_scan_in);
  if (body->inputs().size() != num_state + static_cast<size_t>(num_scan_in))
    return node_invalid(n) << "body has " << body->inputs().size() << " inputs, expected "
                           << num_state + static_cast<size_t>(num_scan_in);
  if (body->outputs().size() < num_state || n.num_outputs() != body->outputs().size())
    return node_invalid(n) << "body has " << body->outputs().size() << " outputs, node has " << n.num_outputs();
  size_t num_scan_out = body->outputs().size() - num_state;
  std::vector<int64_t> dirs = n.attr_ints("directions", std::vector<int64_t>(num_scan_in, 0));
  if (dirs.size() != static_cast<size_t>(num_scan_in)) return node_invalid(n) << "directions has the wrong length";
  if (has_input(n, 0)) {
    KILN_ASSIGN_OR_RETURN(Shape lens, input_shape(n, 0));
    if (lens.size() != 1 || n.input(0)->dtype() != DType::kInt64)
      return node_invalid(n) << "sequence_lens must be a 1-D int64 tensor";
  }
  Expr batch, len;
  std::vector<TensorType> state;
  for (size_t j = 0; j < num_state; ++j) {
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 1 + j));
    if (s.empty()) return node_invalid(n) << "state " << j << " has no batch axis";
    if (!batch.defined()) batch = s[0];
    s.erase(s.begin());
    state.push_back(TensorType{n.input(1 + j)->dtype(), s});
    body->inputs()[j]->set_type(state.back());
  }
  for (int64_t j = 0; j < num_scan_in; ++j) {
    size_t i = 1 + num_state + static_cast<size_t>(j);
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, i));
    if (s.size() < 2) return node_invalid(n) << "scan input " << j << " has no batch and sequence axes";
    if (!batch.defined()) batch = s[0];
    if (!len.defined()) len = s[1];
    s.erase(s.begin(), s.begin() + 2);
    body->inputs()[num_state + static_cast<size_t>(j)]->set_type(TensorType{n.input(i)->dtype(), s});
  }
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> carried,
                        infer_carried(n, *body, 0, 0, state, body->outputs().size(), ctx));
  for (size_t j = 0; j < num_state; ++j) {
    Shape shape{batch};
    shape.insert(shape.end(), carried[j].shape->begin(), carried[j].shape->end());
    set_output(n, j, carried[j].dtype, std::move(shape), ctx);
  }
  std::set<std::string> known = outer_symbols(n, ctx);
  for (size_t k = 0; k < num_scan_out; ++k) {
    const TensorType& t = body->outputs()[num_state + k]->type();
    if (!t.shape) return node_unsupported(n) << "scan output " << k << " has unknown rank";
    Shape shape{batch, len};
    for (const Expr& d : *t.shape) shape.push_back(outer_dim(d, known, ctx));
    set_output(n, num_state + k, t.dtype, std::move(shape), ctx);
  }
  n.set_attr("kiln_scan_batched", Attribute::of_int(1));
  return Status::ok();
}

Status infer_scan(Node& n, InferContext& ctx) {
  // kiln_scan_opset9: a Scan made by passes/scan8_to_loop.h in an opset-8
  // graph, in the opset-9 form.
  if (onnx_opset(ctx) != 0 && onnx_opset(ctx) < 9 && n.attr_int("kiln_scan_opset9", 0) == 0) return infer_scan8(n, ctx);
  Graph* body = subgraph(n, "body");
  if (!body) return node_invalid(n) << "missing body";
  int64_t num_scan_in = n.attr_int("num_scan_inputs", -1);
  if (num_scan_in < 1 || static_cast<size_t>(num_scan_in) > n.num_inputs())
    return node_invalid(n) << "num_scan_inputs " << num_scan_in << " out of range";
  size_t num_state = n.num_inputs() - num_scan_in;
  if (body->inputs().size() != n.num_inputs())
    return node_invalid(n) << "body has " << body->inputs().size() << " inputs, expected " << n.num_inputs();
  if (body->outputs().size() < num_state || n.num_outputs() != body->outputs().size())
    return node_invalid(n) << "body has " << body->outputs().size() << " outputs, node has " << n.num_outputs();
  size_t num_scan_out = body->outputs().size() - num_state;
  std::vector<int64_t> in_axes = n.attr_ints("scan_input_axes", std::vector<int64_t>(num_scan_in, 0));
  std::vector<int64_t> out_axes = n.attr_ints("scan_output_axes", std::vector<int64_t>(num_scan_out, 0));
  if (in_axes.size() != static_cast<size_t>(num_scan_in) || out_axes.size() != num_scan_out)
    return node_invalid(n) << "scan_input_axes / scan_output_axes have the wrong length";

  std::vector<TensorType> state;
  for (size_t j = 0; j < num_state; ++j) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, j));
    state.push_back(t);
    body->inputs()[j]->set_type(t);
  }
  Expr len;
  for (int64_t j = 0; j < num_scan_in; ++j) {
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, num_state + j));
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, in_axes[j], static_cast<int64_t>(s.size())));
    if (!len.defined()) len = s[axis];
    s.erase(s.begin() + axis);
    body->inputs()[num_state + j]->set_type(TensorType{n.input(num_state + j)->dtype(), s});
  }
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> carried,
                        infer_carried(n, *body, 0, 0, state, body->outputs().size(), ctx));
  for (size_t j = 0; j < num_state; ++j) set_output(n, j, carried[j].dtype, *carried[j].shape, ctx);
  std::set<std::string> known = outer_symbols(n, ctx);
  for (size_t k = 0; k < num_scan_out; ++k) {
    const TensorType& t = body->outputs()[num_state + k]->type();
    if (!t.shape) return node_unsupported(n) << "scan output " << k << " has unknown rank";
    Shape shape;
    for (const Expr& d : *t.shape) shape.push_back(outer_dim(d, known, ctx));
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n, out_axes[k], static_cast<int64_t>(shape.size()) + 1));
    shape.insert(shape.begin() + axis, len);
    set_output(n, num_state + k, t.dtype, std::move(shape), ctx);
  }
  return Status::ok();
}

// SequenceMap (opset 17): runs `body` once per element of the first input
// (a sequence); every other sequence input gives its element at the same
// position, a tensor input is passed whole. Output k is the sequence of the
// body's output k. The body's inputs take the elements' types (fresh dims
// where the elements' vary, bound on each run of the body).
Status infer_sequence_map(Node& n, InferContext& ctx) {
  Graph* body = subgraph(n, "body");
  if (!body) return node_invalid(n) << "missing body";
  if (n.num_inputs() < 1 || body->inputs().size() != n.num_inputs())
    return node_invalid(n) << "body has " << body->inputs().size() << " inputs, expected " << n.num_inputs();
  KILN_ASSIGN_OR_RETURN(TensorType first, input_type(n, 0));
  if (first.dtype != DType::kSequence || !first.elem) return node_invalid(n) << "input 0 must be a sequence";
  for (size_t j = 0; j < n.num_inputs(); ++j) {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, j));
    if (t.dtype == DType::kOptional) return node_unsupported(n) << "input " << j << " is an optional";
    if (t.dtype != DType::kSequence) {
      body->inputs()[j]->set_type(t);
      continue;
    }
    if (!t.elem || t.elem->is_container() || !t.elem->shape)
      return node_unsupported(n) << "input " << j << ": the rank of the sequence's elements is unknown";
    Shape dims;
    for (const Dim& d : *t.elem->shape) dims.push_back(d.is_const() ? d : ctx.fresh_symbol());
    body->inputs()[j]->set_type(TensorType{t.elem->dtype, std::move(dims)});
  }
  KILN_RETURN_IF_ERROR(infer_subgraph(n, *body, ctx));
  KILN_RETURN_IF_ERROR(check_outputs(n, *body, n.num_outputs(), "body"));
  for (size_t k = 0; k < n.num_outputs(); ++k) {
    const TensorType& t = body->outputs()[k]->type();
    if (t.is_container()) return node_unsupported(n) << "body output " << k << " is a container";
    TensorType e{t.dtype, std::nullopt};
    if (t.shape) {
      e.shape = Shape{};
      for (const Dim& d : *t.shape) e.shape->push_back(d.is_const() ? d : ctx.fresh_symbol());
    }
    n.output(k)->set_type(TensorType::container(DType::kSequence, std::move(e), (*first.shape)[0]));
  }
  return Status::ok();
}

}  // namespace

void register_control_flow_ops() {
  register_op(OpDef{.name = "If", .infer = infer_if, .takes_containers = true});
  register_op(OpDef{.name = "Loop", .infer = infer_loop, .takes_containers = true, .gradient = grad_loop});
  register_op(OpDef{.name = "Scan", .infer = infer_scan, .gradient = grad_scan});
  register_op(OpDef{.name = "SequenceMap", .infer = infer_sequence_map, .takes_containers = true});
}

}  // namespace kiln::ops
