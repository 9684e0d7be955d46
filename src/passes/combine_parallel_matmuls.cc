#include "passes/combine_parallel_matmuls.h"

#include <cstring>
#include <map>
#include <unordered_map>

#include "passes/eliminate_common_subexpressions.h"
#include "passes/eliminate_dead_code.h"
#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

enum class Kind { kMatMul, kGemm, kConv };

bool is_real(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// The op kind when n may join a combined op, or nullopt.
std::optional<Kind> kind_of(const Node* n) {
  if (!n->domain().empty()) return std::nullopt;
  const Tensor* w = constant_of(n->input(1));
  if (w == nullptr || !is_real(w->dtype()) || n->input(0) == nullptr || n->input(0)->dtype() != w->dtype() ||
      w->numel() == 0)
    return std::nullopt;
  if (n->op_type() == "MatMul" && w->rank() == 2 && n->num_inputs() == 2) return Kind::kMatMul;
  if (n->op_type() == "Gemm" && w->rank() == 2 && n->attr_int("transA", 0) == 0 && n->attr_int("transB", 0) == 0 &&
      n->attr_float("alpha", 1.0) == 1.0 && n->attr_float("beta", 1.0) == 1.0) {
    const Value* c = n->input(2);
    if (c == nullptr) return Kind::kGemm;
    const Tensor* b = constant_of(c);
    // A bias per column ([N] or [1, N]); a full [M, N] bias does not split by column alone.
    if (b != nullptr && b->dtype() == w->dtype() && b->numel() == w->shape()[1] &&
        (b->rank() == 1 || (b->rank() == 2 && b->shape()[0] == 1)))
      return Kind::kGemm;
    return std::nullopt;
  }
  if (n->op_type() == "Conv" && w->rank() >= 3 && n->attr_int("group", 1) == 1 && !n->has_attr("kiln_weight_layout")) {
    const Value* c = n->input(2);
    if (c == nullptr) return Kind::kConv;
    const Tensor* b = constant_of(c);
    if (b != nullptr && b->dtype() == w->dtype() && b->numel() == w->shape()[0]) return Kind::kConv;
  }
  return std::nullopt;
}

// What must agree for two ops to combine: kind, weight dims but the split one, attributes.
bool compatible(Kind kind, const Node* a, const Node* b) {
  const Tensor& wa = a->input(1)->constant();
  const Tensor& wb = b->input(1)->constant();
  if (wa.dtype() != wb.dtype() || wa.rank() != wb.rank()) return false;
  int split_axis = kind == Kind::kConv ? 0 : 1;
  for (int64_t k = 0; k < wa.rank(); ++k)
    if (k != split_axis && wa.shape()[k] != wb.shape()[k]) return false;
  return kind != Kind::kConv || same_attributes(*a, *b);
}

// Concatenates the weights of `group` along the output axis (bytes copied as they are).
Tensor concat_weights(Kind kind, const std::vector<Node*>& group) {
  const Tensor& first = group[0]->input(1)->constant();
  std::vector<int64_t> shape = first.shape();
  int axis = kind == Kind::kConv ? 0 : 1;
  shape[axis] = 0;
  for (Node* n : group) shape[axis] += n->input(1)->constant().shape()[axis];
  Tensor out(first.dtype(), shape);
  auto* dst = static_cast<char*>(out.data());
  int64_t elem = dtype_size(first.dtype());
  if (kind == Kind::kConv) {  // [O, ...]: blocks one after another
    for (Node* n : group) {
      const Tensor& w = n->input(1)->constant();
      std::memcpy(dst, w.data(), static_cast<size_t>(w.nbytes()));
      dst += w.nbytes();
    }
    return out;
  }
  int64_t rows = shape[0], cols = shape[1], col0 = 0;  // [K, N]: column blocks
  for (Node* n : group) {
    const Tensor& w = n->input(1)->constant();
    int64_t nc = w.shape()[1];
    const auto* src = static_cast<const char*>(w.data());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + (r * cols + col0) * elem, src + r * nc * elem, static_cast<size_t>(nc * elem));
    col0 += nc;
  }
  return out;
}

Tensor concat_biases(Kind kind, const std::vector<Node*>& group, DType dtype) {
  int axis = kind == Kind::kConv ? 0 : 1;
  int64_t total = 0;
  for (Node* n : group) total += n->input(1)->constant().shape()[axis];
  Tensor out(dtype, {total});
  int64_t at = 0;
  for (Node* n : group) {
    int64_t count = n->input(1)->constant().shape()[axis];
    if (const Tensor* b = constant_of(n->input(2)))
      for (int64_t i = 0; i < count; ++i) out.set_f64(at + i, b->get_f64(i));
    at += count;
  }
  return out;
}

bool has_bias(const std::vector<Node*>& group) {
  for (Node* n : group)
    if (n->input(2) != nullptr) return true;
  return false;
}

int64_t opset_of(const Graph& g) {
  auto it = g.opsets.find("");
  return it == g.opsets.end() ? 0 : it->second;
}

// Replaces `group` (in graph order, same input) by one op and a Split.
void combine(Graph& g, Kind kind, const std::vector<Node*>& group) {
  Node* first = group[0];
  Value* x = first->input(0);
  Tensor w = concat_weights(kind, group);
  std::vector<Value*> inputs = {x, g.add_constant(g.unique_name(first->input(1)->name() + ".combined"), w)};
  if (kind != Kind::kMatMul && has_bias(group))
    inputs.push_back(g.add_constant(g.unique_name(first->output(0)->name() + ".combined_bias"),
                                    concat_biases(kind, group, w.dtype())));
  static const char* kOps[] = {"MatMul", "Gemm", "Conv"};
  Node* wide = g.insert_node_before(first, kOps[static_cast<int>(kind)], inputs,
                                    {first->output(0)->name() + ".combined"});
  if (kind == Kind::kConv)
    for (const auto& [key, a] : first->attrs()) wide->set_attr(key, a);
  int axis = kind == Kind::kConv ? 0 : 1;
  std::vector<int64_t> sizes;
  for (Node* n : group) sizes.push_back(n->input(1)->constant().shape()[axis]);
  std::vector<Value*> split_inputs = {wide->output(0)};
  bool split_as_input = opset_of(g) >= 13;
  if (split_as_input) {
    Tensor s(DType::kInt64, {static_cast<int64_t>(sizes.size())});
    for (size_t i = 0; i < sizes.size(); ++i) s.data_as<int64_t>()[i] = sizes[i];
    split_inputs.push_back(g.add_constant(g.unique_name(wide->output(0)->name() + ".sizes"), s));
  }
  std::vector<std::string> names;
  for (Node* n : group) names.push_back(n->output(0)->name() + ".part");
  Node* split = g.insert_node_before(first, "Split", split_inputs, names);
  split->set_attr("axis", Attribute::of_int(kind == Kind::kMatMul ? -1 : 1));
  if (!split_as_input) split->set_attr("split", Attribute::of_ints(sizes));
  for (size_t i = 0; i < group.size(); ++i) {
    split->output(i)->set_type(group[i]->output(0)->type());
    replace_value(g, group[i]->output(0), split->output(i));
  }
}

}  // namespace

Result<int> combine_parallel_matmuls(Graph& g, PassContext&) {
  // Candidates by (input, kind), in graph order.
  std::map<std::pair<const Value*, int>, std::vector<Node*>> by_input;
  std::vector<std::pair<const Value*, int>> order;
  for (Node* n : g.nodes()) {
    auto kind = kind_of(n);
    if (!kind) continue;
    auto key = std::make_pair(static_cast<const Value*>(n->input(0)), static_cast<int>(*kind));
    if (by_input[key].empty()) order.push_back(key);
    by_input[key].push_back(n);
  }
  int rewrites = 0;
  for (const auto& key : order) {
    std::vector<Node*> pending = by_input[key];
    Kind kind = static_cast<Kind>(key.second);
    while (pending.size() >= 2) {
      std::vector<Node*> group = {pending[0]}, rest;
      for (size_t i = 1; i < pending.size(); ++i)
        (compatible(kind, pending[0], pending[i]) ? group : rest).push_back(pending[i]);
      if (group.size() >= 2) {
        combine(g, kind, group);
        ++rewrites;
      }
      pending = rest;
    }
  }
  if (rewrites > 0) remove_unused_nodes(g);
  return rewrites;
}

}  // namespace kiln::passes
