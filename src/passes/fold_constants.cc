#include "passes/fold_constants.h"

#include <unordered_map>
#include <unordered_set>

#include "passes/eliminate_dead_code.h"
#include "passes/rewrite.h"
#include "support/memory_limit.h"

namespace kiln::passes {

namespace {

// Containers (sequences, optionals) are never folded: their elements are not
// in the value's bytes, and a constant container has no ONNX initializer form.
std::optional<int64_t> static_bytes(const Value* v) {
  if (v == nullptr || !v->type().is_static() || v->dtype() == DType::kUndefined || v->type().is_container())
    return std::nullopt;
  return checked_nbytes(v->dtype(), v->type().static_shape());
}

// The constant a fully known, constant symbolic value stands for.
std::optional<Tensor> constant_sym_value(const Value* v) {
  if (v->is_constant() || !v->sym_value() || !v->type().is_static()) return std::nullopt;
  if (v->dtype() != DType::kInt64 && v->dtype() != DType::kInt32) return std::nullopt;
  std::vector<int64_t> shape = v->type().static_shape();
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > static_cast<int64_t>(v->sym_value()->size()) / d)) return std::nullopt;
    n *= d;
  }
  if (n != static_cast<int64_t>(v->sym_value()->size())) return std::nullopt;
  Tensor t(v->dtype(), shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    auto c = (*v->sym_value())[i].as_const();
    if (!c) return std::nullopt;
    if (v->dtype() == DType::kInt64) t.data_as<int64_t>()[i] = *c;
    else t.data_as<int32_t>()[i] = static_cast<int32_t>(*c);
  }
  return t;
}

}  // namespace

Result<int> fold_constants(Graph& g, PassContext& ctx) {
  int rewrites = 0;
  // Symbolic values first: they need no evaluation.
  for (Node* n : g.nodes())
    for (Value* o : n->outputs()) {
      if (o == nullptr || is_graph_output(g, o)) continue;
      if (o->uses().empty()) continue;
      std::optional<Tensor> t = constant_sym_value(o);
      if (!t) continue;
      Value* c = g.add_constant(g.unique_name(o->name() + ".folded"), *t);
      c->set_type(o->type());
      if (replace_value(g, o, c)) ++rewrites;
    }
  remove_unused_nodes(g);

  if (ctx.evaluator == nullptr) return rewrites;
  // Nodes computable from constants, in order.
  std::unordered_set<const Value*> known;
  std::vector<Node*> foldable;
  for (Node* n : g.nodes()) {
    if (is_random_op(*n) || has_subgraph(*n)) continue;
    bool inputs_known = true;
    int64_t in_bytes = 0;
    for (const Value* v : n->inputs()) {
      if (v == nullptr) continue;
      if (!v->is_constant() && !known.count(v)) inputs_known = false;
      if (auto b = static_bytes(v)) in_bytes += *b;
    }
    if (!inputs_known) continue;
    bool outputs_fit = n->num_outputs() > 0;
    for (const Value* o : n->outputs()) {
      auto b = static_bytes(o);
      if (o == nullptr || !b || (*b > ctx.fold_limit_bytes && *b > in_bytes)) outputs_fit = false;
    }
    if (!outputs_fit) continue;
    for (const Value* o : n->outputs()) known.insert(o);
    foldable.push_back(n);
  }
  if (foldable.empty()) return rewrites;

  // The values to materialize: read by a node that is not folded (or by a subgraph).
  std::unordered_set<const Node*> folded(foldable.begin(), foldable.end());
  std::unordered_set<const Value*> captured;
  for (const Node* n : g.nodes())
    for (const Value* v : g.implicit_inputs(n)) captured.insert(v);
  std::vector<Value*> frontier;
  for (Node* n : foldable)
    for (Value* o : n->outputs()) {
      if (is_graph_output(g, o)) continue;
      bool read_outside = captured.count(o) != 0;
      for (const auto& [user, idx] : o->uses()) read_outside |= !folded.count(user);
      if (read_outside) frontier.push_back(o);
    }
  if (frontier.empty()) return rewrites;

  // One graph of the foldable nodes, evaluated at once.
  auto sub = std::make_unique<Graph>();
  sub->name = g.name + ".fold";
  sub->opsets = g.opsets;
  sub->source = g.source;
  std::unordered_map<const Value*, Value*> map;
  for (Node* n : foldable) {
    std::vector<Value*> ins;
    for (Value* v : n->inputs()) {
      if (v == nullptr) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = map.find(v);
      if (it == map.end()) it = map.emplace(v, sub->add_constant(v->name(), v->constant())).first;
      ins.push_back(it->second);
    }
    std::vector<std::string> names;
    for (const Value* o : n->outputs()) names.push_back(o->name());
    Node* m = sub->add_node(n->op_type(), ins, names, n->domain(), n->name());
    for (const auto& [key, a] : n->attrs()) m->set_attr(key, a);
    for (size_t i = 0; i < n->num_outputs(); ++i) map[n->output(i)] = m->output(i);
  }
  std::vector<Value*> outs;
  for (Value* v : frontier) outs.push_back(map.at(v));
  sub->set_outputs(outs);
  Result<std::vector<Tensor>> values = ctx.evaluator->evaluate(std::move(sub));
  if (!values.is_ok() || values->size() != frontier.size()) return rewrites;
  for (size_t i = 0; i < frontier.size(); ++i) {
    Value* v = frontier[i];
    const Tensor& t = (*values)[i];
    if (t.dtype() != v->dtype() || t.shape() != v->type().static_shape()) continue;
    Value* c = g.add_constant(g.unique_name(v->name() + ".folded"), t);
    c->set_type(v->type());
    if (replace_value(g, v, c)) ++rewrites;
  }
  remove_unused_nodes(g);
  g.remove_dead_values();
  return rewrites;
}

}  // namespace kiln::passes
