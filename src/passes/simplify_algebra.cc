#include "passes/simplify_algebra.h"

#include <algorithm>
#include <cmath>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

// Every element of the constant behind v equals `value`.
bool all_equal(const Value* v, double value) {
  const Tensor* t = constant_of(v);
  if (t == nullptr || !(dtype_is_float(t->dtype()) || dtype_is_int(t->dtype()))) return false;
  for (int64_t i = 0; i < t->numel(); ++i)
    if (t->get_f64(i) != value) return false;
  return true;
}

// n's output is x when `c` is the neutral constant and does not broadcast x.
bool neutral(Graph& g, Node* n, Value* x, Value* c, double value, PassContext& ctx) {
  if (x == nullptr || !all_equal(c, value)) return false;
  Value* out = n->output(0);
  if (x->dtype() != out->dtype() || !same_shape(x, out, ctx.infer.bounds)) return false;
  return replace_value(g, out, x);
}

// x*1, 1*x, x/1, x+0, 0+x, x-0 -> x.
bool neutral_operand(Graph& g, Node* n, PassContext& ctx) {
  if (n->num_inputs() != 2) return false;
  Value* a = n->input(0);
  Value* b = n->input(1);
  if (is_op(n, "Mul")) return neutral(g, n, a, b, 1, ctx) || neutral(g, n, b, a, 1, ctx);
  if (is_op(n, "Add")) return neutral(g, n, a, b, 0, ctx) || neutral(g, n, b, a, 0, ctx);
  if (is_op(n, "Div")) return neutral(g, n, a, b, 1, ctx);
  if (is_op(n, "Sub")) return neutral(g, n, a, b, 0, ctx);
  return false;
}

// Neg(Neg(x)) -> x.
bool double_negation(Graph& g, Node* n, PassContext&) {
  if (!is_op(n, "Neg") || n->input(0) == nullptr) return false;
  Node* inner = n->input(0)->producer();
  if (!is_op(inner, "Neg") || inner->input(0) == nullptr) return false;
  return replace_value(g, n->output(0), inner->input(0));
}

// The producer of v when it is an op of type `op` whose only reader is one node.
Node* sole_producer(const Graph& g, const Value* v, const char* op) {
  if (v == nullptr || !is_op(v->producer(), op) || v->uses().size() != 1 || is_graph_output(g, v)) return nullptr;
  return v->producer();
}

bool is_real(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// Per-channel values of a constant `c` broadcast against an output of rank
// `rank` whose axis `axis` has `channels` entries, every other axis being
// left as it is: c's dims are 1 except (possibly) at `axis`. Returns one
// value per channel, or nullopt when c is not of that form.
std::optional<std::vector<double>> per_channel(const Value* c, int64_t rank, int64_t axis, int64_t channels) {
  const Tensor* t = constant_of(c);
  if (t == nullptr || !is_real(t->dtype()) || t->rank() > rank) return std::nullopt;
  int64_t offset = rank - t->rank();
  bool along = false;
  for (int64_t k = 0; k < t->rank(); ++k) {
    int64_t d = t->shape()[k];
    if (k + offset == axis && d == channels && channels != 1) along = true;
    else if (d != 1) return std::nullopt;
  }
  std::vector<double> out(channels);
  for (int64_t o = 0; o < channels; ++o) out[o] = t->get_f64(along ? o : 0);
  return out;
}

// A convolution that may take new weights: constant W [O, ...] of a real
// dtype, optional constant bias [O], default layout.
struct ConvParts {
  Node* conv = nullptr;
  const Tensor* w = nullptr;
  const Tensor* b = nullptr;  // null: no bias
  int64_t channels = 0;
};

std::optional<ConvParts> foldable_conv(const Graph& g, const Value* v) {
  ConvParts p;
  p.conv = sole_producer(g, v, "Conv");
  if (p.conv == nullptr || p.conv->has_attr("kiln_weight_layout")) return std::nullopt;
  p.w = constant_of(p.conv->input(1));
  if (p.w == nullptr || !is_real(p.w->dtype()) || p.w->rank() < 3 || p.w->dtype() != v->dtype()) return std::nullopt;
  p.channels = p.w->shape()[0];
  if (p.channels <= 0 || p.w->numel() == 0) return std::nullopt;
  if (p.conv->input(2) != nullptr) {
    p.b = constant_of(p.conv->input(2));
    if (p.b == nullptr || p.b->dtype() != p.w->dtype() || p.b->numel() != p.channels) return std::nullopt;
  }
  return p;
}

// Replaces `out` by Conv(x, W*scale[o], b*scale[o] + shift[o]).
bool refit_conv(Graph& g, Node* at, Value* out, const ConvParts& p, const std::vector<double>& scale,
                const std::vector<double>& shift) {
  Tensor w(p.w->dtype(), p.w->shape());
  int64_t per = p.w->numel() / p.channels;
  for (int64_t o = 0; o < p.channels; ++o)
    for (int64_t i = 0; i < per; ++i) w.set_f64(o * per + i, p.w->get_f64(o * per + i) * scale[o]);
  Tensor b(p.w->dtype(), {p.channels});
  for (int64_t o = 0; o < p.channels; ++o) b.set_f64(o, (p.b ? p.b->get_f64(o) : 0.0) * scale[o] + shift[o]);
  Value* wv = g.add_constant(g.unique_name(p.conv->input(1)->name() + ".folded"), w);
  Value* bv = g.add_constant(g.unique_name(out->name() + ".bias"), b);
  Node* conv = g.insert_node_before(at, "Conv", {p.conv->input(0), wv, bv}, {out->name() + ".conv"});
  for (const auto& [key, a] : p.conv->attrs()) conv->set_attr(key, a);
  conv->output(0)->set_type(out->type());
  return replace_value(g, out, conv->output(0));
}

// Conv -> BatchNormalization (inference, constant parameters) -> one Conv.
bool conv_batch_norm(Graph& g, Node* n, PassContext&) {
  if (!is_op(n, "BatchNormalization") || n->attr_int("training_mode", 0) != 0) return false;
  for (size_t i = 1; i < n->num_outputs(); ++i)
    if (n->output(i) != nullptr && (!n->output(i)->uses().empty() || is_graph_output(g, n->output(i)))) return false;
  auto p = foldable_conv(g, n->input(0));
  if (!p) return false;
  std::vector<const Tensor*> params;
  for (size_t i = 1; i <= 4; ++i) {
    const Tensor* t = constant_of(n->input(i));
    if (t == nullptr || !is_real(t->dtype()) || t->numel() != p->channels) return false;
    params.push_back(t);
  }
  double eps = n->attr_float("epsilon", 1e-5);
  std::vector<double> scale(p->channels), shift(p->channels);
  for (int64_t o = 0; o < p->channels; ++o) {
    double s = params[0]->get_f64(o) / std::sqrt(params[3]->get_f64(o) + eps);
    scale[o] = s;
    shift[o] = params[1]->get_f64(o) - params[2]->get_f64(o) * s;
  }
  return refit_conv(g, n, n->output(0), *p, scale, shift);
}

// Conv -> Mul/Div/Add/Sub by a constant per output channel -> one Conv.
bool conv_affine(Graph& g, Node* n, PassContext& ctx) {
  bool mul = is_op(n, "Mul"), div = is_op(n, "Div"), add = is_op(n, "Add"), sub = is_op(n, "Sub");
  if (!(mul || div || add || sub) || n->num_inputs() != 2) return false;
  // The conv output is input 0, or input 1 of a commutative op.
  for (int side = 0; side < ((mul || add) ? 2 : 1); ++side) {
    Value* y = n->input(side);
    Value* c = n->input(1 - side);
    auto p = foldable_conv(g, y);
    if (!p || !same_shape(y, n->output(0), ctx.infer.bounds)) continue;
    auto k = per_channel(c, y->type().rank(), 1, p->channels);
    if (!k || (div && std::count(k->begin(), k->end(), 0.0) != 0)) continue;
    std::vector<double> scale(p->channels, 1.0), shift(p->channels, 0.0);
    for (int64_t o = 0; o < p->channels; ++o) {
      double v = (*k)[o];
      if (mul) scale[o] = v;
      if (div) scale[o] = 1.0 / v;
      if (add) shift[o] = v;
      if (sub) shift[o] = -v;
    }
    return refit_conv(g, n, n->output(0), *p, scale, shift);
  }
  return false;
}

// MatMul(x, W) -> Mul/Div by a constant per column (or a scalar) -> MatMul(x, W').
bool matmul_scale(Graph& g, Node* n, PassContext& ctx) {
  bool mul = is_op(n, "Mul"), div = is_op(n, "Div");
  if (!(mul || div) || n->num_inputs() != 2) return false;
  for (int side = 0; side < (mul ? 2 : 1); ++side) {
    Value* y = n->input(side);
    Node* mm = sole_producer(g, y, "MatMul");
    if (mm == nullptr || !same_shape(y, n->output(0), ctx.infer.bounds)) continue;
    const Tensor* w = constant_of(mm->input(1));
    if (w == nullptr || w->rank() != 2 || !is_real(w->dtype()) || w->dtype() != y->dtype() || w->numel() == 0)
      continue;
    int64_t rows = w->shape()[0], cols = w->shape()[1];
    auto k = per_channel(n->input(1 - side), y->type().rank(), y->type().rank() - 1, cols);
    if (!k || (div && std::count(k->begin(), k->end(), 0.0) != 0)) continue;
    Tensor w2(w->dtype(), w->shape());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        double v = w->get_f64(r * cols + c);
        w2.set_f64(r * cols + c, mul ? v * (*k)[c] : v / (*k)[c]);
      }
    Value* out = n->output(0);
    Value* wv = g.add_constant(g.unique_name(mm->input(1)->name() + ".scaled"), w2);
    Node* m2 = g.insert_node_before(n, "MatMul", {mm->input(0), wv}, {out->name() + ".matmul"});
    m2->output(0)->set_type(out->type());
    return replace_value(g, out, m2->output(0));
  }
  return false;
}

// Pow(x, 2) -> x*x and Pow(x, 3) -> (x*x)*x for a constant exponent that does
// not broadcast x (GPT-2's tanh GELU cubes its input: a general pow is
// exp(y log|x|) in double, 20 times the cost of two multiplies). x*x is the
// correctly rounded square, as pow's is; the cube differs from it by at most
// one rounding (ONNX Runtime's Pow makes the same two substitutions).
bool pow_small_integer(Graph& g, Node* n, PassContext& ctx) {
  if (!is_op(n, "Pow") || n->num_inputs() != 2 || n->input(0) == nullptr) return false;
  Value* x = n->input(0);
  Value* out = n->output(0);
  const Tensor* e = constant_of(n->input(1));
  if (e == nullptr || e->numel() != 1 || !is_real(x->dtype()) || x->dtype() != out->dtype() ||
      !same_shape(x, out, ctx.infer.bounds))
    return false;
  bool square = all_equal(n->input(1), 2), cube = all_equal(n->input(1), 3);
  if (!square && !cube) return false;
  Node* sq = g.insert_node_before(n, "Mul", {x, x}, {out->name() + ".square"});
  sq->output(0)->set_type(out->type());
  Value* result = sq->output(0);
  if (cube) {
    Node* cu = g.insert_node_before(n, "Mul", {result, x}, {out->name() + ".cube"});
    cu->output(0)->set_type(out->type());
    result = cu->output(0);
  }
  return replace_value(g, out, result);
}

}  // namespace

Result<int> simplify_algebra(Graph& g, PassContext& ctx) {
  static const std::vector<RewriteRule> kRules = {
      {"neutral-operand", &neutral_operand},
      {"double-negation", &double_negation},
      {"conv-batch-norm", &conv_batch_norm},
      {"conv-affine", &conv_affine},
      {"matmul-scale", &matmul_scale},
      {"pow-small-integer", &pow_small_integer},
  };
  return rewrite_to_fixed_point(g, kRules, ctx);
}

}  // namespace kiln::passes
