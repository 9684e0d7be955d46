#include "passes/flatten_matmul_batch.h"

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool applies(const Node* n) {
  if (!is_op(n, "MatMul") || n->has_attr("kiln_weight_layout") || n->num_inputs() != 2) return false;
  const Tensor* b = constant_of(n->input(1));
  const Value* a = n->input(0);
  if (b == nullptr || b->rank() != 2 || a == nullptr || !a->type().shape || a->dtype() != b->dtype()) return false;
  if (b->dtype() != DType::kFloat32 && b->dtype() != DType::kFloat64) return false;
  const Shape& s = *a->type().shape;
  if (s.size() < 3) return false;
  auto k = s.back().as_const();
  if (!k || *k != b->shape()[0]) return false;
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < s.size(); ++i) {
    auto d = s[i].as_const();
    if (!d) return false;
    batch *= *d;
  }
  return batch > 1;
}

}  // namespace

Result<int> flatten_matmul_batch(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(n)) todo.push_back(n);
  for (Node* n : todo) {
    Value* a = n->input(0);
    Value* y = n->output(0);
    const Tensor& b = n->input(1)->constant();
    int64_t rank = static_cast<int64_t>(a->type().shape->size());
    std::string base = y->name();
    Value* rows = view_as_rows(g, n, a, b.shape()[0], base);
    Node* mm = g.insert_node_before(n, "MatMul", {rows, n->input(1)}, {g.unique_name(base + ".flat")});
    Value* view = view_with_leading_dims(g, n, mm->output(0), a, rank - 1, b.shape()[1], base);
    view->set_type(y->type());
    if (!replace_value(g, y, view)) return internal_error() << "flatten-matmul-batch: cannot replace " << y->name();
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
