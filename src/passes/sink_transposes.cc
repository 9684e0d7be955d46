#include "passes/sink_transposes.h"

#include <set>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// The permutation of a Transpose producing v when v has one reader, or nullopt.
std::optional<std::vector<int64_t>> sole_transpose(const Graph& g, const Value* v) {
  if (v == nullptr || !is_op(v->producer(), "Transpose") || v->uses().size() != 1 || is_graph_output(g, v))
    return std::nullopt;
  return transpose_perm(v->producer());
}

bool is_elementwise(const Node* n) {
  const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
  return def != nullptr && def->is_elementwise && n->num_outputs() == 1;
}

bool is_scalar(const Value* v) { return v == nullptr || (v->type().shape && v->type().rank() == 0); }

// Replaces n (reading `inputs` in place of its own) by the same op followed by Transpose(perm).
bool rebuild_then_transpose(Graph& g, Node* n, const std::vector<Value*>& inputs, const std::vector<int64_t>& perm,
                            const std::vector<std::pair<std::string, Attribute>>& attr_changes = {}) {
  Value* out = n->output(0);
  Node* m = g.insert_node_before(n, n->op_type(), inputs, {out->name() + ".pre"}, n->domain());
  for (const auto& [key, a] : n->attrs()) m->set_attr(key, a);
  for (const auto& [key, a] : attr_changes) m->set_attr(key, a);
  // The new op's type: the output's dims, un-permuted.
  TensorType t = out->type();
  if (t.shape) {
    Shape s(t.shape->size());
    for (size_t k = 0; k < perm.size(); ++k) s[perm[k]] = (*t.shape)[k];
    t.shape = s;
  }
  m->output(0)->set_type(t);
  Node* tr = g.insert_node_before(n, "Transpose", {m->output(0)}, {out->name() + ".sunk"});
  tr->set_attr("perm", Attribute::of_ints(perm));
  tr->output(0)->set_type(out->type());
  return replace_value(g, out, tr->output(0));
}

// U(Transpose(x, p)) -> Transpose(U(x), p).
bool through_unary(Graph& g, Node* n, PassContext&) {
  if (!is_elementwise(n) || n->num_inputs() < 1) return false;
  for (size_t i = 1; i < n->num_inputs(); ++i)
    if (!is_scalar(n->input(i))) return false;
  auto perm = sole_transpose(g, n->input(0));
  if (!perm || !n->output(0)->type().shape || n->output(0)->type().rank() != static_cast<int64_t>(perm->size()))
    return false;
  std::vector<Value*> inputs = n->inputs();
  inputs[0] = n->input(0)->producer()->input(0);
  return rebuild_then_transpose(g, n, inputs, *perm);
}

// The constant c, padded to `rank` with leading 1s and transposed by the inverse of perm.
Tensor inverse_transposed(const Tensor& c, const std::vector<int64_t>& perm) {
  size_t rank = perm.size();
  std::vector<int64_t> dims(rank - c.rank(), 1);
  dims.insert(dims.end(), c.shape().begin(), c.shape().end());
  // out[j] over axes j: out dim perm[k] = dims[k].
  std::vector<int64_t> out_dims(rank);
  for (size_t k = 0; k < rank; ++k) out_dims[perm[k]] = dims[k];
  Tensor out(c.dtype(), out_dims);
  std::vector<int64_t> in_strides(rank, 1), idx(rank, 0);
  for (int64_t k = static_cast<int64_t>(rank) - 2; k >= 0; --k) in_strides[k] = in_strides[k + 1] * dims[k + 1];
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    // idx: the out index of `flat`; the element comes from in index dims k = out axis perm[k].
    int64_t rem = flat;
    for (int64_t j = static_cast<int64_t>(rank) - 1; j >= 0; --j) {
      idx[j] = rem % out_dims[j];
      rem /= out_dims[j];
    }
    int64_t src = 0;
    for (size_t k = 0; k < rank; ++k) src += idx[perm[k]] * in_strides[k];
    out.set_f64(flat, c.get_f64(src));
  }
  return out;
}

// B(Transpose(a, p), Transpose(b, p)) and B(Transpose(a, p), c) -> Transpose(B(...), p).
bool through_binary(Graph& g, Node* n, PassContext&) {
  if (!is_elementwise(n) || n->num_inputs() != 2 || !n->output(0)->type().shape) return false;
  auto pa = sole_transpose(g, n->input(0));
  auto pb = sole_transpose(g, n->input(1));
  int64_t rank = n->output(0)->type().rank();
  if (pa && pb) {
    if (*pa != *pb || static_cast<int64_t>(pa->size()) != rank) return false;
    return rebuild_then_transpose(g, n, {n->input(0)->producer()->input(0), n->input(1)->producer()->input(0)}, *pa);
  }
  int side = pa ? 0 : (pb ? 1 : -1);
  if (side < 0) return false;
  const std::vector<int64_t>& perm = side == 0 ? *pa : *pb;
  const Tensor* c = constant_of(n->input(1 - side));
  if (c == nullptr || static_cast<int64_t>(perm.size()) != rank || c->rank() > rank) return false;
  if (!(dtype_is_float(c->dtype()) || dtype_is_int(c->dtype()) || c->dtype() == DType::kBool)) return false;
  if (c->numel() > (int64_t{1} << 20)) return false;
  Value* cv = g.add_constant(g.unique_name(n->input(1 - side)->name() + ".untransposed"), inverse_transposed(*c, perm));
  std::vector<Value*> inputs(2);
  inputs[side] = n->input(side)->producer()->input(0);
  inputs[1 - side] = cv;
  return rebuild_then_transpose(g, n, inputs, perm);
}

// Reduce(Transpose(x, p), axes, keepdims = 1) -> Transpose(Reduce(x, p[axes]), p).
bool through_reduce(Graph& g, Node* n, PassContext&) {
  static const std::set<std::string> kReduce = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                                "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                                "ReduceLogSumExp", "ReduceSumSquare"};
  if (!n->domain().empty() || !kReduce.count(n->op_type()) || n->attr_int("keepdims", 1) != 1) return false;
  auto perm = sole_transpose(g, n->input(0));
  if (!perm) return false;
  int64_t rank = static_cast<int64_t>(perm->size());
  bool axes_input = n->num_inputs() > 1 && n->input(1) != nullptr;
  std::vector<int64_t> axes;
  if (axes_input) {
    auto a = constant_ints(n->input(1));
    if (!a) return false;
    axes = *a;
  } else {
    axes = n->attr_ints("axes");
  }
  if (axes.empty()) return false;  // all axes (or noop_with_empty_axes): nothing to gain
  std::vector<int64_t> mapped;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) return false;
    mapped.push_back((*perm)[a < 0 ? a + rank : a]);
  }
  Value* x = n->input(0)->producer()->input(0);
  if (axes_input) {
    Tensor t(DType::kInt64, {static_cast<int64_t>(mapped.size())});
    for (size_t i = 0; i < mapped.size(); ++i) t.data_as<int64_t>()[i] = mapped[i];
    Value* av = g.add_constant(g.unique_name(n->input(1)->name() + ".untransposed"), t);
    return rebuild_then_transpose(g, n, {x, av}, *perm);
  }
  return rebuild_then_transpose(g, n, {x}, *perm, {{"axes", Attribute::of_ints(mapped)}});
}

}  // namespace

Result<int> sink_transposes(Graph& g, PassContext& ctx) {
  static const std::vector<RewriteRule> kRules = {
      {"through-unary", &through_unary},
      {"through-binary", &through_binary},
      {"through-reduce", &through_reduce},
  };
  return rewrite_to_fixed_point(g, kRules, ctx);
}

}  // namespace kiln::passes
