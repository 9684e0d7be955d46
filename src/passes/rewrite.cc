#include "passes/rewrite.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "passes/eliminate_dead_code.h"

namespace kiln::passes {

bool is_graph_output(const Graph& g, const Value* v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

bool is_op(const Node* n, const char* op) { return n != nullptr && n->domain().empty() && n->op_type() == op; }

bool is_random_op(const Node& n) {
  static const std::set<std::string> kRandom = {"RandomNormal", "RandomNormalLike", "RandomUniform",
                                                "RandomUniformLike", "Bernoulli", "Multinomial"};
  return n.domain().empty() && kRandom.count(n.op_type());
}

bool has_subgraph(const Node& n) {
  for (const auto& [key, attr] : n.attrs())
    if (attr.g || !attr.graphs.empty()) return true;
  return false;
}

std::optional<std::vector<int64_t>> transpose_perm(const Node* t) {
  const Value* x = t->input(0);
  if (x == nullptr || !x->type().shape) return std::nullopt;
  int64_t rank = x->type().rank();
  std::vector<int64_t> perm = t->attr_ints("perm");
  if (!t->has_attr("perm"))
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != rank) return std::nullopt;
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[p]) return std::nullopt;
    seen[p] = true;
  }
  return perm;
}

Value* insert_range_check(Graph& g, Node* pos, const std::vector<Value*>& inputs, const std::string& out,
                          const std::string& what) {
  Node* check = g.insert_node_before(pos, "CheckInRange", inputs, {g.unique_name(out)}, "kiln");
  check->set_name(pos->name());
  check->set_attr("what", Attribute::of_string(what));
  g.opsets.emplace("kiln", 1);
  return check->output(0);
}

bool replace_value(Graph& g, Value* from, Value* to) {
  if (from == to) return false;
  if (is_graph_output(g, from)) {
    if (to->producer() == nullptr || is_graph_output(g, to)) return false;
    std::string name = from->name();
    g.rename_value(from, g.unique_name(name + ".replaced"));
    g.rename_value(to, name);
  }
  g.replace_all_uses(from, to);
  return true;
}

Status replace_outputs(Graph& g, Node* from, Node* to, const std::string& pass) {
  for (size_t k = 0; k < from->num_outputs() && k < to->num_outputs(); ++k) {
    Value* old = from->output(k);
    // Every output, also one without explicit uses: a subgraph may capture
    // it by name (replace_all_uses renames those captures).
    if (old == nullptr) continue;
    if (!replace_value(g, old, to->output(k)))
      return internal_error() << from->describe() << ": " << pass << " could not replace output " << k;
  }
  return Status::ok();
}

Tensor transpose_tensor(const Tensor& t, const std::vector<int64_t>& perm) {
  int64_t rank = t.rank();
  std::vector<int64_t> out_shape(rank);
  for (int64_t i = 0; i < rank; ++i) out_shape[i] = t.shape()[perm[i]];
  Tensor out(t.dtype(), out_shape);
  std::vector<int64_t> in_strides(rank, 1);
  for (int64_t i = rank - 2; i >= 0; --i) in_strides[i] = in_strides[i + 1] * t.shape()[i + 1];
  int64_t esize = dtype_size(t.dtype());
  std::vector<int64_t> idx(rank, 0);
  const char* src = static_cast<const char*>(t.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    int64_t off = 0;
    for (int64_t i = 0; i < rank; ++i) off += idx[i] * in_strides[perm[i]];
    std::memcpy(dst + flat * esize, src + off * esize, static_cast<size_t>(esize));
    for (int64_t i = rank - 1; i >= 0; --i) {
      if (++idx[i] < out_shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

Tensor int64_vector(const std::vector<int64_t>& v) {
  Tensor t(DType::kInt64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<int64_t>());
  return t;
}

Value* view_as_rows(Graph& g, Node* pos, Value* x, int64_t cols, const std::string& base) {
  Value* shape = g.add_constant(g.unique_name(base + ".rows_shape"), int64_vector({-1, cols}));
  return g.insert_node_before(pos, "Reshape", {x, shape}, {g.unique_name(base + ".rows")})->output(0);
}

Value* view_with_leading_dims(Graph& g, Node* pos, Value* y, Value* like, int64_t lead, int64_t last,
                              const std::string& base) {
  Node* shape = g.insert_node_before(pos, "Shape", {like}, {g.unique_name(base + ".like_shape")});
  std::vector<int64_t> idx(static_cast<size_t>(lead));
  for (int64_t i = 0; i < lead; ++i) idx[static_cast<size_t>(i)] = i;
  Value* lead_idx = g.add_constant(g.unique_name(base + ".lead"), int64_vector(idx));
  Node* dims = g.insert_node_before(pos, "Gather", {shape->output(0), lead_idx}, {g.unique_name(base + ".lead_dims")});
  Value* tail = g.add_constant(g.unique_name(base + ".last"), int64_vector({last}));
  Node* cat = g.insert_node_before(pos, "Concat", {dims->output(0), tail}, {g.unique_name(base + ".view_shape")});
  cat->set_attr("axis", Attribute::of_int(0));
  return g.insert_node_before(pos, "Reshape", {y, cat->output(0)}, {g.unique_name(base + ".view")})->output(0);
}

const Tensor* constant_of(const Value* v) { return v != nullptr && v->is_constant() ? &v->constant() : nullptr; }

std::optional<std::vector<int64_t>> constant_ints(const Value* v) {
  const Tensor* t = constant_of(v);
  if (t == nullptr || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) return std::nullopt;
  std::vector<int64_t> out(t->numel());
  for (int64_t i = 0; i < t->numel(); ++i) out[i] = t->get_i64(i);
  return out;
}

bool same_shape(const Value* a, const Value* b, const SymbolBounds& bounds) {
  const auto& sa = a->type().shape;
  const auto& sb = b->type().shape;
  if (!sa || !sb || sa->size() != sb->size()) return false;
  for (size_t i = 0; i < sa->size(); ++i)
    if (!prove_equal((*sa)[i], (*sb)[i], bounds)) return false;
  return true;
}

Result<int> rewrite_to_fixed_point(Graph& g, const std::vector<RewriteRule>& rules, PassContext& ctx,
                                   int max_sweeps) {
  int rewrites = 0;
  for (int sweep = 0; sweep < max_sweeps; ++sweep) {
    int before = rewrites;
    for (Node* n : g.nodes()) {
      // A node whose outputs a rule already redirected is dead: skip it. (A
      // value read only by a subgraph has no use entry: its producer is left
      // as it is, which is safe.)
      bool live = false;
      for (const Value* o : n->outputs()) live |= !o->uses().empty() || is_graph_output(g, o);
      if (!live) continue;
      for (const RewriteRule& rule : rules) {
        if (rule.apply(g, n, ctx)) {
          ++rewrites;
          break;  // the node may be gone as a pattern root; the next sweep sees the rest
        }
      }
    }
    remove_unused_nodes(g);
    if (rewrites == before) break;
  }
  return rewrites;
}

}  // namespace kiln::passes
