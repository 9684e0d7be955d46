#include "passes/eliminate_identities.h"

#include <set>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool unused(const Graph& g, const Value* v) { return v == nullptr || (v->uses().empty() && !is_graph_output(g, v)); }

// Replaces n's first output by `x` when both have the same dtype and proven shape.
bool forward_if_same(Graph& g, Node* n, Value* x, PassContext& ctx) {
  Value* out = n->output(0);
  if (x == nullptr || out == nullptr || x->dtype() != out->dtype()) return false;
  if (!same_shape(x, out, ctx.infer.bounds)) return false;
  return replace_value(g, out, x);
}

bool is_view_op(const Node* n) {
  return is_op(n, "Reshape") || is_op(n, "Flatten") || is_op(n, "Squeeze") || is_op(n, "Unsqueeze") ||
         is_op(n, "Identity");
}

// Identity(x) -> x.
bool identity(Graph& g, Node* n, PassContext&) {
  if (!is_op(n, "Identity") || n->input(0) == nullptr || n->input(0)->dtype() != n->output(0)->dtype()) return false;
  return replace_value(g, n->output(0), n->input(0));
}

// Dropout(x) -> x when it does not train (no training_mode, or a constant
// false), or trains with a constant ratio of 0, and its mask is unused.
bool dropout(Graph& g, Node* n, PassContext& ctx) {
  if (!is_op(n, "Dropout") || !unused(g, n->output(1))) return false;
  bool training = false;
  if (Value* t = n->input(2)) {
    const Tensor* c = constant_of(t);
    if (c == nullptr || c->numel() != 1) return false;
    training = c->get_f64(0) != 0;
  }
  if (training) {
    const Tensor* ratio = constant_of(n->input(1));
    if (ratio == nullptr || ratio->numel() != 1 || ratio->get_f64(0) != 0) return false;
  }
  return forward_if_same(g, n, n->input(0), ctx);
}

// A chain of views (row-major reshapes of one buffer) ending at n: its result
// is the chain's source reshaped, so it is the source itself when the shapes
// agree, and one Reshape of the source when the result's shape is static.
bool view_chain(Graph& g, Node* n, PassContext& ctx) {
  if (!is_view_op(n) || n->input(0) == nullptr) return false;
  Value* source = n->input(0);
  int length = 1;
  while (source->producer() != nullptr && is_view_op(source->producer()) && source->producer()->input(0) != nullptr) {
    source = source->producer()->input(0);
    ++length;
  }
  Value* out = n->output(0);
  if (source->dtype() != out->dtype()) return false;
  if (same_shape(source, out, ctx.infer.bounds)) return replace_value(g, out, source);
  if (length < 2 || !out->type().is_static()) return false;
  std::vector<int64_t> dims = out->type().static_shape();
  Tensor shape(DType::kInt64, {static_cast<int64_t>(dims.size())});
  for (size_t i = 0; i < dims.size(); ++i) shape.data_as<int64_t>()[i] = dims[i];
  Value* target = g.add_constant(g.unique_name(out->name() + ".shape"), shape);
  Node* r = g.insert_node_before(n, "Reshape", {source, target}, {out->name() + ".reshaped"});
  r->output(0)->set_type(out->type());
  return replace_value(g, out, r->output(0));
}

bool is_identity_perm(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// Transpose(x, identity) -> x; Transpose(Transpose(x, p), q) -> Transpose(x, p[q[k]]).
bool transpose(Graph& g, Node* n, PassContext&) {
  if (!is_op(n, "Transpose")) return false;
  auto perm = transpose_perm(n);
  if (!perm) return false;
  if (is_identity_perm(*perm)) return replace_value(g, n->output(0), n->input(0));
  Node* inner = n->input(0)->producer();
  if (!is_op(inner, "Transpose")) return false;
  auto p = transpose_perm(inner);
  if (!p || p->size() != perm->size()) return false;
  std::vector<int64_t> composed(perm->size());
  for (size_t k = 0; k < perm->size(); ++k) {
    int64_t q = (*perm)[k];
    if (q < 0 || q >= static_cast<int64_t>(p->size())) return false;
    composed[k] = (*p)[q];
  }
  if (is_identity_perm(composed)) return replace_value(g, n->output(0), inner->input(0));
  Value* out = n->output(0);
  Node* t = g.insert_node_before(n, "Transpose", {inner->input(0)}, {out->name() + ".composed"});
  t->set_attr("perm", Attribute::of_ints(composed));
  t->output(0)->set_type(out->type());
  return replace_value(g, out, t->output(0));
}

// Every value of `from` is exactly representable in `to` (and converts back
// to any third type the same way): the middle of Cast(Cast(x)) can go.
bool holds_every_value(DType from, DType to) {
  using D = DType;
  static const std::set<std::pair<D, D>> kLossless = {
      {D::kFloat16, D::kFloat32},  {D::kFloat16, D::kFloat64}, {D::kBFloat16, D::kFloat32},
      {D::kBFloat16, D::kFloat64}, {D::kFloat32, D::kFloat64}, {D::kInt8, D::kInt16},
      {D::kInt8, D::kInt32},       {D::kInt8, D::kInt64},      {D::kInt8, D::kFloat16},
      {D::kInt8, D::kFloat32},     {D::kInt8, D::kFloat64},    {D::kUInt8, D::kUInt16},
      {D::kUInt8, D::kUInt32},     {D::kUInt8, D::kUInt64},    {D::kUInt8, D::kInt16},
      {D::kUInt8, D::kInt32},      {D::kUInt8, D::kInt64},     {D::kUInt8, D::kFloat16},
      {D::kUInt8, D::kFloat32},    {D::kUInt8, D::kFloat64},   {D::kInt16, D::kInt32},
      {D::kInt16, D::kInt64},      {D::kInt16, D::kFloat32},   {D::kInt16, D::kFloat64},
      {D::kUInt16, D::kUInt32},    {D::kUInt16, D::kUInt64},   {D::kUInt16, D::kInt32},
      {D::kUInt16, D::kInt64},     {D::kUInt16, D::kFloat32},  {D::kUInt16, D::kFloat64},
      {D::kInt32, D::kInt64},      {D::kInt32, D::kFloat64},   {D::kUInt32, D::kUInt64},
      {D::kUInt32, D::kInt64},     {D::kUInt32, D::kFloat64},
  };
  if (from == D::kBool) return dtype_is_int(to) || dtype_is_float(to);
  return kLossless.count({from, to}) != 0;
}

// Cast(x, to = dtype(x)) -> x; Cast(Cast(x, B), C) -> Cast(x, C) when B holds every value of x.
bool cast(Graph& g, Node* n, PassContext&) {
  if (!is_op(n, "Cast") || n->input(0) == nullptr) return false;
  Value* x = n->input(0);
  Value* out = n->output(0);
  if (x->dtype() == out->dtype() && x->dtype() != DType::kUndefined) return replace_value(g, out, x);
  Node* inner = x->producer();
  if (!is_op(inner, "Cast") || inner->input(0) == nullptr) return false;
  Value* src = inner->input(0);
  if (src->dtype() == DType::kString || out->dtype() == DType::kString) return false;
  if (!holds_every_value(src->dtype(), x->dtype())) return false;
  if (src->dtype() == out->dtype()) return replace_value(g, out, src);
  Node* c = g.insert_node_before(n, "Cast", {src}, {out->name() + ".direct"});
  for (const auto& [key, a] : n->attrs()) c->set_attr(key, a);
  c->output(0)->set_type(out->type());
  return replace_value(g, out, c->output(0));
}

// Expand or Tile whose output has the input's shape -> x.
bool expand_or_tile(Graph& g, Node* n, PassContext& ctx) {
  if (!is_op(n, "Expand") && !is_op(n, "Tile")) return false;
  return forward_if_same(g, n, n->input(0), ctx);
}

// Slice with positive steps whose output has the input's shape takes everything -> x.
bool slice(Graph& g, Node* n, PassContext& ctx) {
  if (!is_op(n, "Slice")) return false;
  if (Value* steps = n->input(4)) {
    auto s = constant_ints(steps);
    if (!s) return false;
    for (int64_t v : *s)
      if (v <= 0) return false;
  }
  return forward_if_same(g, n, n->input(0), ctx);
}

// Pad by zeros on every side -> x (any mode).
bool pad(Graph& g, Node* n, PassContext& ctx) {
  if (!is_op(n, "Pad")) return false;
  std::vector<int64_t> pads;
  if (n->has_attr("pads")) {
    pads = n->attr_ints("pads");
  } else {
    auto p = constant_ints(n->input(1));
    if (!p) return false;
    pads = *p;
  }
  for (int64_t v : pads)
    if (v != 0) return false;
  return forward_if_same(g, n, n->input(0), ctx);
}

// Concat of one tensor, Split into one tensor -> x.
bool concat_or_split_of_one(Graph& g, Node* n, PassContext& ctx) {
  if (is_op(n, "Concat") && n->num_inputs() == 1) return forward_if_same(g, n, n->input(0), ctx);
  if (is_op(n, "Split") && n->num_outputs() == 1) return forward_if_same(g, n, n->input(0), ctx);
  return false;
}

}  // namespace

Result<int> eliminate_identities(Graph& g, PassContext& ctx) {
  static const std::vector<RewriteRule> kRules = {
      {"identity", &identity},
      {"dropout", &dropout},
      {"view-chain", &view_chain},
      {"transpose", &transpose},
      {"cast", &cast},
      {"expand-or-tile", &expand_or_tile},
      {"slice", &slice},
      {"pad", &pad},
      {"concat-or-split-of-one", &concat_or_split_of_one},
  };
  return rewrite_to_fixed_point(g, kRules, ctx);
}

}  // namespace kiln::passes
