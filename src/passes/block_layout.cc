#include "passes/block_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "passes/rewrite.h"
#include "strategy/strategy.h"

namespace kiln::passes {

namespace {

// Elementwise ops that keep finite values finite (the padding channels'
// values stay harmless) and have no per-position operand semantics.
const std::set<std::string>& chain_unary_ops() {
  static const std::set<std::string> ops = {"Relu",  "LeakyRelu", "Clip",     "Sigmoid", "HardSigmoid", "HardSwish",
                                            "Tanh",  "Elu",       "Selu",     "Celu",    "Erf",         "Neg",
                                            "Abs",   "Softsign",  "Identity", "Gelu",    "Mish",        "Softplus",
                                            "ThresholdedRelu"};
  return ops;
}
const std::set<std::string>& chain_binary_ops() {
  static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu"};
  return ops;
}

// Channels of a 4-D f32 activation whose channel dim is a constant.
std::optional<int64_t> channels_of(const Value* v) {
  if (v == nullptr || v->dtype() != DType::kFloat32 || !v->type().shape || v->type().shape->size() != 4)
    return std::nullopt;
  return (*v->type().shape)[1].as_const();
}

int64_t blocks_of(int64_t c, int64_t b) { return (c + b - 1) / b; }

// A per-channel constant (after right-aligning to rank 4, every dim but the
// channel's is 1 and the channel's is C) laid out [1, Cb, 1, 1, b], `pad`
// past C. nullopt: not per-channel.
std::optional<Tensor> per_channel_blocked(const Tensor& t, int64_t c, int64_t b, float pad) {
  if (t.dtype() != DType::kFloat32 || t.rank() > 4) return std::nullopt;
  std::vector<int64_t> s = t.shape();
  while (s.size() < 4) s.insert(s.begin(), 1);
  if (s[0] != 1 || s[2] != 1 || s[3] != 1 || s[1] != c) return std::nullopt;
  int64_t cb = blocks_of(c, b);
  Tensor out(DType::kFloat32, {1, cb, 1, 1, b});
  float* dst = out.data_as<float>();
  std::fill(dst, dst + cb * b, pad);
  std::memcpy(dst, t.data_as<float>(), static_cast<size_t>(c) * sizeof(float));
  return out;
}

bool is_scalar_like(const Value* v) {
  if (v == nullptr || !v->type().shape) return false;
  for (const Expr& d : *v->type().shape)
    if (d.as_const() != 1) return false;
  return v->type().shape->size() <= 4;
}

// The weight W [O, C, KH, KW] of a convolution laid out for kiln:ConvBlocked
// (ops/layout.cc), zero past O and C: depthwise [Ob, KH, KW, b]; on a
// blocked input [Ob, Cb, KH, KW, b (input lane), b (output lane)]; on an
// NCHW input [Ob, C, KH, KW, b].
Tensor blocked_weights(const Tensor& w, bool depthwise, bool in_blocked, int64_t c, int64_t o, int64_t b) {
  const int64_t kh = w.shape()[2], kw = w.shape()[3], taps = kh * kw, ob = blocks_of(o, b);
  const int64_t cb = blocks_of(c, b);
  const float* src = w.data_as<float>();
  Tensor packed = depthwise    ? Tensor(DType::kFloat32, {ob, kh, kw, b})
                  : in_blocked ? Tensor(DType::kFloat32, {ob, cb, kh, kw, b, b})
                               : Tensor(DType::kFloat32, {ob, c, kh, kw, b});
  float* dst = packed.data_as<float>();
  std::fill(dst, dst + packed.numel(), 0.f);
  for (int64_t m = 0; m < o; ++m) {
    const int64_t mb = m / b, ml = m % b;
    if (depthwise) {
      for (int64_t t = 0; t < taps; ++t) dst[(mb * taps + t) * b + ml] = src[m * taps + t];
      continue;
    }
    for (int64_t i = 0; i < c; ++i)
      for (int64_t t = 0; t < taps; ++t) {
        const float v = src[(m * c + i) * taps + t];
        if (in_blocked) dst[(((mb * cb + i / b) * taps + t) * b + i % b) * b + ml] = v;
        else dst[((mb * c + i) * taps + t) * b + ml] = v;
      }
  }
  return packed;
}

struct Rewriter {
  Graph& g;
  PassContext& ctx;
  int64_t b;
  std::map<Value*, Value*> blocked;  // NCHW value -> its blocked form
  std::map<std::pair<Value*, bool>, Value*> packed_weights;  // (weight, blocked input) -> re-laid out
  int rewrites = 0;

  Node* add(Node* pos, const std::string& op, const std::vector<Value*>& in, const std::string& out,
            const std::string& domain = "kiln") {
    Node* m = g.insert_node_before(pos, op, in, {g.unique_name(out)}, domain);
    m->set_name(g.unique_name(pos->name().empty() ? out : pos->name() + "." + op));
    return m;
  }

  // The blocked form of an NCHW value (a ToBlocked before `pos` when none).
  // A value transposed from channels-last ([N, H, W, C], perm [0, 3, 1, 2])
  // is read channels-last by the ToBlocked: one contiguous vector of b
  // channels per position instead of a gather across b planes (the
  // Transpose goes when nothing else reads it).
  Value* to_blocked(Node* pos, Value* v) {
    if (auto it = blocked.find(v); it != blocked.end()) return it->second;
    Value* src = v;
    const bool from_cl = from_channels_last(v);
    if (from_cl) src = v->producer()->input(0);
    Node* t = add(pos, "ToBlocked", {src}, v->name() + ".blk");
    t->set_attr("block", Attribute::of_int(b));
    if (from_cl) t->set_attr("channels_last", Attribute::of_int(1));
    blocked[v] = t->output(0);
    return t->output(0);
  }

  // `v` is a Transpose of channels-last data to NCHW (perm [0, 3, 1, 2]).
  static bool from_channels_last(const Value* v) {
    const Node* tr = v->producer();
    return tr != nullptr && is_op(tr, "Transpose") && channels_of(v) &&
           transpose_perm(tr) == std::vector<int64_t>{0, 3, 1, 2};
  }

  // A reader of `y` is an elementwise op of the chain with another operand
  // already blocked.
  bool feeds_chain(const Value* y) const {
    for (const auto& [u, index] : y->uses()) {
      if (!u->domain().empty() || chain_binary_ops().count(u->op_type()) == 0) continue;
      for (const Value* v : u->inputs())
        if (v != nullptr && v != y && blocked.count(const_cast<Value*>(v)) != 0) return true;
    }
    return false;
  }

  // A Transpose of blocked data to channels-last (perm [0, 2, 3, 1]) is
  // one kiln:FromBlocked with channels_last: each position's b channels are
  // one contiguous vector in both layouts, where FromBlocked then Transpose
  // were two passes with strided accesses (convnext_tiny's permute before
  // each LayerNorm).
  Status transpose(Node* n) {
    if (!is_op(n, "Transpose") || n->num_outputs() != 1) return Status::ok();
    Value* x = n->input(0);
    auto it = blocked.find(x);
    auto c = channels_of(x);
    if (it == blocked.end() || !c || transpose_perm(n) != std::vector<int64_t>{0, 2, 3, 1}) return Status::ok();
    Value* y = n->output(0);
    Node* m = add(n, "FromBlocked", {it->second}, y->name() + ".cl");
    m->set_attr("block", Attribute::of_int(b));
    m->set_attr("channels", Attribute::of_int(*c));
    m->set_attr("channels_last", Attribute::of_int(1));
    m->output(0)->set_type(y->type());
    if (!replace_value(g, y, m->output(0)))
      return Status(StatusCode::kInternal, "block-layout: cannot replace " + y->name());
    g.remove_node(n);
    ++rewrites;
    return Status::ok();
  }

  // Node `n` (one output y, C channels) is replaced by `m`, which computes y
  // blocked: y becomes FromBlocked(m's output), which readers that stay
  // NCHW (and graph outputs) read; blocked readers take m's output.
  Status finish(Node* n, Node* m, int64_t c) {
    KILN_RETURN_IF_ERROR(finish_output(n, 0, m->output(0), c));
    g.remove_node(n);
    ++rewrites;
    return Status::ok();
  }

  // Output k of `n` (c channels) is FromBlocked(yb).
  Status finish_output(Node* n, size_t k, Value* yb, int64_t c) {
    Value* y = n->output(k);
    Node* back = add(n, "FromBlocked", {yb}, y->name() + ".nchw");
    back->set_attr("block", Attribute::of_int(b));
    back->set_attr("channels", Attribute::of_int(c));
    back->output(0)->set_type(y->type());  // what readers on the chain look at before inference runs again
    if (!replace_value(g, y, back->output(0)))
      return Status(StatusCode::kInternal, "block-layout: cannot replace " + y->name());
    blocked[back->output(0)] = yb;
    return Status::ok();
  }

  static bool has_kiln_attrs(const Node& n) {
    for (const auto& [k, a] : n.attrs())
      if (k.rfind("kiln_", 0) == 0) return true;
    return false;
  }

  // ---- Conv --------------------------------------------------------------------------------

  Status conv(Node* n) {
    if (!is_op(n, "Conv") || n->num_outputs() != 1 || has_kiln_attrs(*n) || n->num_inputs() < 2) return Status::ok();
    Value* x = n->input(0);
    const Tensor* w = constant_of(n->input(1));
    const Tensor* bias = n->num_inputs() > 2 && n->input(2) != nullptr ? constant_of(n->input(2)) : nullptr;
    if (n->num_inputs() > 2 && n->input(2) != nullptr && bias == nullptr) return Status::ok();
    auto c = channels_of(x);
    auto o = channels_of(n->output(0));
    if (!c || !o || w == nullptr || w->dtype() != DType::kFloat32 || w->rank() != 4) return Status::ok();
    if (bias != nullptr && (bias->dtype() != DType::kFloat32 || bias->numel() != *o)) return Status::ok();
    const std::vector<int64_t>& ws = w->shape();
    int64_t group = n->attr_int("group", 1);
    bool depthwise = group > 1 && group == *c && group == *o && ws[0] == *o && ws[1] == 1;
    if (group != 1 && !depthwise) return Status::ok();
    if (group == 1 && (ws[0] != *o || ws[1] != *c)) return Status::ok();
    // Windows larger than 3x3 with one group stay NCHW: conv.panels' whole-row
    // tiles with the channels innermost beat the blocked template there
    // (inception_v3's 1x7/7x1 on 17x17 measured slower blocked).
    if (group == 1 && (ws[2] > 3 || ws[3] > 3)) return Status::ok();
    int64_t ob = blocks_of(*o, b);
    if (4 * (ob * b - *o) > ob * b) return Status::ok();  // more than a quarter of the last block idle
    // A convolution whose choice is not left to the strategy stays NCHW (an
    // edge of the chain): a choice source's record (a tuning database,
    // --impl) names an NCHW candidate. So does one the strategy would give
    // Winograd (fewer multiplies than any direct template). The rule holds
    // under --select=measure too: measurement then chooses among the NCHW
    // candidates of the convolutions left NCHW. (Choosing each
    // convolution's layout by its own measured time leaves out the
    // conversions an NCHW one inside a chain causes: mobilenet_v2 got 27
    // FromBlocked instead of 1 even with its input's conversion counted,
    // and measured only at chain starts, efficientnet_b0's
    // squeeze-excitation convolutions went NCHW on timings within noise of
    // each other, breaking its chains. The
    // layout wants measuring per chain.)
    bool from_source = false;
    const std::string nchw = strategy::unmeasured_choice(g, *n, ctx.select, &from_source);
    if (from_source || nchw == "conv.winograd") return Status::ok();
    bool in_blocked = blocked.count(x) != 0;
    Value* xin = x;
    // An input transposed from channels-last converts with one contiguous
    // copy (to_blocked), which then replaces the Transpose: convnext's
    // downsampling convolutions after their channels-last LayerNorm.
    if (depthwise || (!in_blocked && from_channels_last(x))) xin = to_blocked(n, x);
    else if (in_blocked) xin = blocked[x];
    in_blocked = in_blocked || xin != x;
    // A weight shared by several convolutions is re-laid out once per input layout.
    Value*& packed = packed_weights[{n->input(1), in_blocked}];
    if (packed == nullptr)
      packed = g.add_constant(g.unique_name(n->input(1)->name() + ".blk"),
                              blocked_weights(*w, depthwise, in_blocked, *c, *o, b));
    std::vector<Value*> in = {xin, packed};
    if (bias != nullptr) {
      Tensor bb(DType::kFloat32, {ob, b});
      float* dst = bb.data_as<float>();
      std::fill(dst, dst + ob * b, 0.f);
      std::memcpy(dst, bias->data_as<float>(), static_cast<size_t>(*o) * sizeof(float));
      in.push_back(g.add_constant(g.unique_name(n->input(2)->name() + ".blk"), std::move(bb)));
    }
    Node* m = add(n, "ConvBlocked", in, n->output(0)->name() + ".blk");
    for (const char* a : {"strides", "pads", "dilations", "auto_pad", "group"})
      if (const Attribute* at = n->attr(a)) m->set_attr(a, *at);
    m->set_attr("block", Attribute::of_int(b));
    m->set_attr("channels", Attribute::of_int(*o));
    m->set_attr("in_blocked", Attribute::of_int(in_blocked ? 1 : 0));
    return finish(n, m, *o);
  }

  // ---- Elementwise -------------------------------------------------------------------------

  Status elementwise(Node* n) {
    if (!n->domain().empty() || n->num_outputs() != 1) return Status::ok();
    bool unary = chain_unary_ops().count(n->op_type()) != 0, binary = chain_binary_ops().count(n->op_type()) != 0;
    if (!unary && !binary) return Status::ok();
    Value* y = n->output(0);
    auto c = channels_of(y);
    if (!c) return Status::ok();
    bool any = false;
    for (Value* v : n->inputs()) any |= v != nullptr && blocked.count(v) != 0;
    // Data transposed from channels-last converts with one contiguous copy
    // (to_blocked), so an op on it joins the chain when a reader of its
    // output already has a blocked operand: convnext's layer-scale Mul
    // between the permute back from channels-last and the residual Add.
    if (!any && feeds_chain(y))
      for (Value* v : n->inputs()) any |= v != nullptr && from_channels_last(v);
    if (!any) return Status::ok();
    std::vector<Value*> in;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      Value* v = n->input(i);
      if (v == nullptr) {
        in.push_back(nullptr);
        continue;
      }
      // Clip's bounds and other scalars broadcast as they are; Clip's are never data.
      if (unary && i > 0) {
        if (!is_scalar_like(v)) return Status::ok();
        in.push_back(v);
        continue;
      }
      bool divisor = n->op_type() == "Div" && i == 1;
      if (auto it = blocked.find(v); it != blocked.end() && channels_of(v) == c && !divisor) {
        in.push_back(it->second);
        continue;
      }
      if (const Tensor* t = constant_of(v)) {
        if (t->numel() == 1 && t->rank() <= 4) {
          in.push_back(v);
          continue;
        }
        auto relaid = per_channel_blocked(*t, *c, b, divisor ? 1.f : 0.f);
        if (!relaid) return Status::ok();
        in.push_back(g.add_constant(g.unique_name(v->name() + ".blk"), std::move(*relaid)));
        continue;
      }
      if (divisor) return Status::ok();
      // NCHW data of the output's own shape (a residual from outside the chain).
      if (channels_of(v) == c && same_shape(v, y, ctx.infer.bounds)) {
        in.push_back(to_blocked(n, v));
        continue;
      }
      return Status::ok();
    }
    Node* m = add(n, n->op_type(), in, y->name() + ".blk", "");
    for (const auto& [k, a] : n->attrs()) m->set_attr(k, a);
    return finish(n, m, *c);
  }

  // ---- Pooling and Concat --------------------------------------------------------------------

  Status pool(Node* n) {
    bool window = is_op(n, "MaxPool") || is_op(n, "AveragePool");
    bool global = is_op(n, "GlobalAveragePool");
    if ((!window && !global) || n->num_outputs() != 1 || has_kiln_attrs(*n)) return Status::ok();
    Value* x = n->input(0);
    auto it = blocked.find(x);
    auto c = channels_of(n->output(0));
    if (it == blocked.end() || !c || channels_of(x) != c) return Status::ok();
    Node* m = nullptr;
    if (global) {
      m = add(n, "ReduceMean", {it->second}, n->output(0)->name() + ".blk", "");
      m->set_attr("axes", Attribute::of_ints({2, 3}));
      m->set_attr("keepdims", Attribute::of_int(1));
    } else {
      std::vector<int64_t> k = n->attr_ints("kernel_shape");
      if (k.size() != 2) return Status::ok();
      m = add(n, n->op_type(), {it->second}, n->output(0)->name() + ".blk", "");
      for (const auto& [key, a] : n->attrs()) m->set_attr(key, a);
      m->set_attr("kernel_shape", Attribute::of_ints({k[0], k[1], 1}));
      // Absent, strides and dilations are 1 along every axis, the lanes' too.
      auto extend = [&](const char* name) {
        std::vector<int64_t> v = n->attr_ints(name);
        if (v.size() == 2) m->set_attr(name, Attribute::of_ints({v[0], v[1], 1}));
      };
      extend("strides");
      extend("dilations");
      if (n->has_attr("pads")) {
        std::vector<int64_t> p = n->attr_ints("pads");
        if (p.size() == 4) m->set_attr("pads", Attribute::of_ints({p[0], p[1], 0, p[2], p[3], 0}));
      }
    }
    return finish(n, m, *c);
  }

  // Inference BatchNormalization with constant parameters: x * s + t with
  // per-channel constants s = scale / sqrt(var + eps), t = B - mean * s.
  Status batch_norm(Node* n) {
    if (!is_op(n, "BatchNormalization") || n->num_outputs() != 1 || n->num_inputs() != 5 ||
        n->attr_int("training_mode", 0) != 0)
      return Status::ok();
    Value* x = n->input(0);
    auto it = blocked.find(x);
    auto c = channels_of(n->output(0));
    if (it == blocked.end() || !c || channels_of(x) != c) return Status::ok();
    const Tensor* p[4];
    for (int i = 0; i < 4; ++i) {
      p[i] = constant_of(n->input(i + 1));
      if (p[i] == nullptr || p[i]->dtype() != DType::kFloat32 || p[i]->numel() != *c) return Status::ok();
    }
    const double eps = n->attr_float("epsilon", 1e-5);
    Tensor scale(DType::kFloat32, {*c, 1, 1}), shift(DType::kFloat32, {*c, 1, 1});
    for (int64_t i = 0; i < *c; ++i) {
      double sc = p[0]->data_as<float>()[i] / std::sqrt(static_cast<double>(p[3]->data_as<float>()[i]) + eps);
      scale.data_as<float>()[i] = static_cast<float>(sc);
      shift.data_as<float>()[i] = static_cast<float>(p[1]->data_as<float>()[i] - p[2]->data_as<float>()[i] * sc);
    }
    auto relaid = [&](const Tensor& t, const std::string& name) {
      return g.add_constant(g.unique_name(name), *per_channel_blocked(t, *c, b, 0.f));
    };
    Node* mul = add(n, "Mul", {it->second, relaid(scale, n->output(0)->name() + ".scale.blk")},
                    n->output(0)->name() + ".mul.blk", "");
    Node* m = add(n, "Add", {mul->output(0), relaid(shift, n->output(0)->name() + ".shift.blk")},
                  n->output(0)->name() + ".blk", "");
    return finish(n, m, *c);
  }

  // Pad of the plane only (constant mode, a finite constant): the same pads
  // with none on the block's lanes.
  Status pad(Node* n) {
    if (!is_op(n, "Pad") || n->num_outputs() != 1 || n->attr_string("mode", "constant") != "constant")
      return Status::ok();
    Value* x = n->input(0);
    auto it = blocked.find(x);
    auto c = channels_of(n->output(0));
    if (it == blocked.end() || !c || channels_of(x) != c) return Status::ok();
    if (n->num_inputs() > 3 && n->input(3) != nullptr) return Status::ok();  // axes
    std::optional<std::vector<int64_t>> pads =
        n->num_inputs() > 1 ? constant_ints(n->input(1)) : std::optional<std::vector<int64_t>>(n->attr_ints("pads"));
    if (!pads || pads->size() != 8 || (*pads)[0] != 0 || (*pads)[1] != 0 || (*pads)[4] != 0 || (*pads)[5] != 0)
      return Status::ok();
    if (n->num_inputs() > 2 && n->input(2) != nullptr) {
      const Tensor* v = constant_of(n->input(2));
      if (v == nullptr || v->dtype() != DType::kFloat32 || v->numel() != 1 || !std::isfinite(v->data_as<float>()[0]))
        return Status::ok();
    } else if (!std::isfinite(n->attr_float("value", 0.0))) {
      return Status::ok();
    }
    const std::vector<int64_t>& p = *pads;
    std::vector<int64_t> blocked_pads = {0, 0, p[2], p[3], 0, 0, 0, p[6], p[7], 0};
    Node* m = nullptr;
    if (n->num_inputs() > 1) {
      std::vector<Value*> in = {it->second,
                                g.add_constant(g.unique_name(n->input(1)->name() + ".blk"), int64_vector(blocked_pads))};
      if (n->num_inputs() > 2 && n->input(2) != nullptr) in.push_back(n->input(2));
      m = add(n, "Pad", in, n->output(0)->name() + ".blk", "");
    } else {
      m = add(n, "Pad", {it->second}, n->output(0)->name() + ".blk", "");
      m->set_attr("pads", Attribute::of_ints(blocked_pads));
    }
    for (const auto& [key, a] : n->attrs())
      if (key != "pads") m->set_attr(key, a);
    return finish(n, m, *c);
  }

  // Split along the channels into whole blocks.
  Status split(Node* n) {
    if (!is_op(n, "Split") || n->num_outputs() < 1) return Status::ok();
    Value* x = n->input(0);
    auto it = blocked.find(x);
    int64_t axis = n->attr_int("axis", 0);
    if (it == blocked.end() || !channels_of(x) || (axis != 1 && axis != -3)) return Status::ok();
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      auto c = channels_of(n->output(k));
      if (!c || *c % b != 0) return Status::ok();
      sizes.push_back(*c / b);
    }
    Node* m = g.insert_node_before(n, "Split", {it->second}, std::vector<std::string>(sizes.size(), ""), "");
    m->set_name(g.unique_name(n->name().empty() ? n->output(0)->name() + ".blk" : n->name() + ".Split"));
    for (size_t k = 0; k < sizes.size(); ++k) g.rename_value(m->output(k), g.unique_name(n->output(k)->name() + ".blk"));
    m->set_attr("axis", Attribute::of_int(1));
    m->set_attr("split", Attribute::of_ints(sizes));
    for (size_t k = 0; k < sizes.size(); ++k)
      KILN_RETURN_IF_ERROR(finish_output(n, k, m->output(k), sizes[k] * b));
    g.remove_node(n);
    ++rewrites;
    return Status::ok();
  }

  Status concat(Node* n) {
    if (!is_op(n, "Concat") || n->num_outputs() != 1) return Status::ok();
    auto c = channels_of(n->output(0));
    int64_t axis = n->attr_int("axis", 0);
    if (!c || (axis != 1 && axis != -3)) return Status::ok();
    bool any = false;
    for (Value* v : n->inputs()) {
      auto vc = channels_of(v);
      if (!vc || *vc % b != 0) return Status::ok();
      any |= blocked.count(v) != 0;
    }
    if (!any) return Status::ok();
    std::vector<Value*> in;
    for (Value* v : n->inputs()) in.push_back(to_blocked(n, v));
    Node* m = add(n, "Concat", in, n->output(0)->name() + ".blk", "");
    m->set_attr("axis", Attribute::of_int(1));
    return finish(n, m, *c);
  }
};

}  // namespace

Result<int> block_layout(Graph& g, PassContext& ctx) {
  const int64_t b = ctx.select.target.lanes();
  if (b < 4) return 0;
  Rewriter r{g, ctx, b, {}, {}, 0};
  for (Node* n : g.nodes()) {
    if (has_subgraph(*n)) continue;
    if (n->op_type() == "Conv") {
      KILN_RETURN_IF_ERROR(r.conv(n));
    } else if (n->op_type() == "Concat") {
      KILN_RETURN_IF_ERROR(r.concat(n));
    } else if (n->op_type() == "Pad") {
      KILN_RETURN_IF_ERROR(r.pad(n));
    } else if (n->op_type() == "Transpose") {
      KILN_RETURN_IF_ERROR(r.transpose(n));
    } else if (n->op_type() == "Split") {
      KILN_RETURN_IF_ERROR(r.split(n));
    } else if (n->op_type() == "BatchNormalization") {
      KILN_RETURN_IF_ERROR(r.batch_norm(n));
    } else if (n->op_type() == "MaxPool" || n->op_type() == "AveragePool" || n->op_type() == "GlobalAveragePool") {
      KILN_RETURN_IF_ERROR(r.pool(n));
    } else {
      KILN_RETURN_IF_ERROR(r.elementwise(n));
    }
  }
  if (r.rewrites > 0) {
    // FromBlocked nodes nothing reads, and Transposes from channels-last a
    // ToBlocked now reads around.
    for (Node* n : g.nodes())
      if ((n->op_type() == "FromBlocked" || n->op_type() == "Transpose") && n->num_outputs() == 1 &&
          n->output(0)->uses().empty() && !is_graph_output(g, n->output(0)))
        g.remove_node(n);
    g.remove_dead_values();
  }
  return r.rewrites;
}

}  // namespace kiln::passes
