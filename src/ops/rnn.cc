// Recurrent layers: RNN, GRU and LSTM (ONNX opsets 7 through 22).
//
// These run as runtime kernels called by the VM like a compiled kernel. The
// time loop is inherently sequential (step t reads the hidden state of step
// t-1), which the compute-stage form of the loop IR cannot express. Two forms:
// - As imported (W and R as ONNX stores them): plain loops over directions,
//   batch entries and steps, dot products in 16 partial sums. This is the
//   reference, and what runs where the graph pass below does not apply.
// - Projected (attribute kiln_projected_input, made by the graph pass
//   project-rnn-inputs): input 0 already holds x W^T + Wb for every step and
//   direction, computed before the loop by one compiled, packed MatMul; W is
//   absent; R is packed in panels of hidden units (layout below, 64 or 256
//   bytes of units per panel). Each step adds h R^T + Rb:
//   hidden units are split into blocks run in parallel on the model's thread
//   pool (one parallel loop per step; two for GRU without linear_before_reset,
//   whose hidden gate reads r * h of every unit), each block accumulating its
//   gate columns in vector registers over its panel of R, then updating its
//   units' cell (in float vectors when the dtype is float and the
//   activations are the defaults; see "cells in float vectors" below). Every
//   unit's sum runs in the same order whatever the block split and thread
//   count, so results do not depend on either.
//
// Semantics (the ONNX spec):
// - layout 0: X [seq, batch, input], Y [seq, num_directions, batch, hidden],
//   Y_h / Y_c / initial_h / initial_c [num_directions, batch, hidden];
//   layout 1: X [batch, seq, input], Y [batch, seq, num_directions, hidden],
//   states [batch, num_directions, hidden].
// - W [nd, gates*hidden, input], R [nd, gates*hidden, hidden], B [nd, 2*gates*hidden]
//   (W biases then R biases). Gate order: RNN i; GRU z, r, h; LSTM i, o, f, c;
//   LSTM peepholes P [nd, 3*hidden] in the order i, o, f.
// - direction forward, reverse or bidirectional (direction 0 forward, 1 reverse).
// - sequence_lens [batch]: batch entry b runs steps 0 .. len_b - 1 (the reverse
//   direction runs them from len_b - 1 down to 0); Y is 0 at steps >= len_b;
//   Y_h / Y_c hold the state after the last step run.
// - activations: per direction, RNN f (default Tanh), GRU f, g (Sigmoid, Tanh),
//   LSTM f, g, h (Sigmoid, Tanh, Tanh). activation_alpha / activation_beta are
//   consumed in order by the activations that take them, other activations
//   use their ONNX defaults (as ONNX Runtime does).
// - clip bounds the gate pre-activations to [-clip, clip].
// - GRU linear_before_reset: h = g(x Wh + Wbh + r * (H Rh + Rbh)) instead of
//   g(x Wh + Wbh + (r * H) Rh + Rbh). LSTM input_forget couples f = 1 - i.
// Computation is in the input's dtype (f32 or f64).
#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/common.h"
#include "ops/rnn_grad.h"
#include "support/thread_pool.h"

namespace kiln::ops {

namespace {

enum class Cell { kRnn, kGru, kLstm };

int gate_count(Cell c) { return c == Cell::kRnn ? 1 : c == Cell::kGru ? 3 : 4; }
int activation_count(Cell c) { return c == Cell::kRnn ? 1 : c == Cell::kGru ? 2 : 3; }

enum class ActKind {
  kRelu, kTanh, kSigmoid, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid, kElu, kSoftsign,
  kSoftplus
};

struct Activation {
  ActKind kind = ActKind::kTanh;
  double alpha = 0, beta = 0;
};

// x . w over n elements, in 16 independent partial sums (a fixed order: the
// result does not depend on the thread count) that the compiler keeps in
// vector registers; the tail is added last. A single running sum would be
// one dependent chain of additions, latency bound.
template <typename T>
T dot(const T* x, const T* w, int64_t n) {
  constexpr int kLanes = 16;
  T part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += x[i + l] * w[i + l];
  T acc = 0;
  for (int l = 0; l < kLanes; ++l) acc += part[l];
  for (; i < n; ++i) acc += x[i] * w[i];
  return acc;
}

double apply(const Activation& a, double x) {
  switch (a.kind) {
    case ActKind::kRelu: return x > 0 ? x : 0;
    case ActKind::kTanh: return std::tanh(x);
    case ActKind::kSigmoid: return 1 / (1 + std::exp(-x));
    case ActKind::kAffine: return a.alpha * x + a.beta;
    case ActKind::kLeakyRelu: return x >= 0 ? x : a.alpha * x;
    case ActKind::kThresholdedRelu: return x > a.alpha ? x : 0;
    case ActKind::kScaledTanh: return a.alpha * std::tanh(a.beta * x);
    case ActKind::kHardSigmoid: return std::max(0.0, std::min(1.0, a.alpha * x + a.beta));
    case ActKind::kElu: return x >= 0 ? x : a.alpha * (std::exp(x) - 1);
    case ActKind::kSoftsign: return x / (1 + std::fabs(x));
    case ActKind::kSoftplus: return std::log1p(std::exp(x));
  }
  return x;
}

struct RnnAttrs {
  Cell cell = Cell::kRnn;
  int64_t hidden = 0;  // 0: from R's last dim
  int num_directions = 1;
  bool reverse_only = false;
  int64_t layout = 0;
  bool has_clip = false;
  double clip = 0;
  bool linear_before_reset = false;
  bool input_forget = false;
  bool projected = false;  // kiln_projected_input: input 0 is x W^T + Wb, R is packed in panels
  std::vector<Activation> acts;  // activation_count(cell) per direction
};

Result<RnnAttrs> parse_attrs(Cell cell, const Node& n) {
  RnnAttrs a;
  a.cell = cell;
  a.hidden = n.attr_int("hidden_size", 0);
  // Gate rows are a few times hidden_size: bounded so products of them fit.
  if (a.hidden < 0 || a.hidden > (int64_t{1} << 40))
    return node_invalid(n) << "hidden_size " << a.hidden << " is not a valid size";
  std::string dir = n.attr_string("direction", "forward");
  if (dir == "bidirectional") {
    a.num_directions = 2;
  } else if (dir == "reverse") {
    a.reverse_only = true;
  } else if (dir != "forward") {
    return node_invalid(n) << "unknown direction '" << dir << "'";
  }
  a.layout = n.attr_int("layout", 0);
  if (a.layout != 0 && a.layout != 1) return node_invalid(n) << "layout must be 0 or 1";
  if (n.has_attr("clip")) {
    a.has_clip = true;
    a.clip = n.attr_float("clip", 0);
  }
  a.linear_before_reset = n.attr_int("linear_before_reset", 0) != 0;
  a.input_forget = n.attr_int("input_forget", 0) != 0;
  a.projected = n.attr_int("kiln_projected_input", 0) != 0;

  std::vector<std::string> names;
  if (const Attribute* at = n.attr("activations")) names = at->strings;
  int per = activation_count(cell);
  if (names.empty()) {
    for (int d = 0; d < a.num_directions; ++d) {
      if (cell == Cell::kRnn) names.push_back("Tanh");
      if (cell == Cell::kGru) names.insert(names.end(), {"Sigmoid", "Tanh"});
      if (cell == Cell::kLstm) names.insert(names.end(), {"Sigmoid", "Tanh", "Tanh"});
    }
  } else if (static_cast<int>(names.size()) == per && a.num_directions == 2) {
    std::vector<std::string> twice = names;
    names.insert(names.end(), twice.begin(), twice.end());
  }
  if (static_cast<int>(names.size()) != per * a.num_directions) {
    return node_invalid(n) << "expected " << per * a.num_directions << " activations, got " << names.size();
  }
  std::vector<double> alphas = n.attr_floats("activation_alpha");
  std::vector<double> betas = n.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  auto next = [](const std::vector<double>& v, size_t& i, double def) { return i < v.size() ? v[i++] : def; };
  for (const std::string& name : names) {
    std::string l;
    for (char c : name) l.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    Activation act;
    if (l == "relu") {
      act.kind = ActKind::kRelu;
    } else if (l == "tanh") {
      act.kind = ActKind::kTanh;
    } else if (l == "sigmoid") {
      act.kind = ActKind::kSigmoid;
    } else if (l == "affine") {
      act.kind = ActKind::kAffine;
      act.alpha = next(alphas, ai, 1.0);
      act.beta = next(betas, bi, 0.0);
    } else if (l == "leakyrelu") {
      act.kind = ActKind::kLeakyRelu;
      act.alpha = next(alphas, ai, 0.01);
    } else if (l == "thresholdedrelu") {
      act.kind = ActKind::kThresholdedRelu;
      act.alpha = next(alphas, ai, 1.0);
    } else if (l == "scaledtanh") {
      act.kind = ActKind::kScaledTanh;
      act.alpha = next(alphas, ai, 1.0);
      act.beta = next(betas, bi, 1.0);
    } else if (l == "hardsigmoid") {
      act.kind = ActKind::kHardSigmoid;
      act.alpha = next(alphas, ai, 0.2);
      act.beta = next(betas, bi, 0.5);
    } else if (l == "elu") {
      act.kind = ActKind::kElu;
      act.alpha = next(alphas, ai, 1.0);
    } else if (l == "softsign") {
      act.kind = ActKind::kSoftsign;
    } else if (l == "softplus") {
      act.kind = ActKind::kSoftplus;
    } else {
      return node_unsupported(n) << "activation '" << name << "'";
    }
    a.acts.push_back(act);
  }
  return a;
}

// The cell math both forms share. An activation of a gate pre-activation,
// clipped to [-clip, clip] when the layer has clip.
template <typename T>
T activate(const RnnAttrs& a, const Activation& act, double pre) {
  if (a.has_clip) pre = std::max(-a.clip, std::min(a.clip, pre));
  return static_cast<T>(apply(act, pre));
}

// One LSTM unit from its gate pre-activations (x W + h R + biases, order
// i, o, f, c) and peepholes: updates the cell state c, returns h.
template <typename T>
T lstm_unit(const RnnAttrs& a, const Activation* act, T i, T o, T f, T g, T pi, T po, T pf, T& c) {
  T ig = activate<T>(a, act[0], i + pi * c);
  T fg = a.input_forget ? T(1) - ig : activate<T>(a, act[0], f + pf * c);
  T cg = activate<T>(a, act[1], g);
  T cn = fg * c + ig * cg;
  T og = activate<T>(a, act[0], o + po * cn);
  c = cn;
  return og * static_cast<T>(apply(act[2], cn));
}

Status infer_rnn(Cell cell, Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, parse_attrs(cell, n));
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape r, input_shape(n, 2));
  Expr hidden;
  if (a.projected) {  // X: [.., .., nd*G*H] projections; R: panels [nd, ceil(H/pw), H, G, pw]
    if (x.size() != 3 || r.size() != 5) return node_invalid(n) << "projected X must be 3-D and packed R 5-D";
    hidden = a.hidden > 0 ? Expr(a.hidden) : r[2];
  } else {
    KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 1));
    if (x.size() != 3 || w.size() != 3 || r.size() != 3) return node_invalid(n) << "X, W and R must be 3-D";
    hidden = a.hidden > 0 ? Expr(a.hidden) : r[2];
    auto wd = simplify(w[0], ctx.bounds).as_const();
    if (wd && *wd != a.num_directions) {
      return node_invalid(n) << "W has " << *wd << " directions, the direction attribute " << a.num_directions;
    }
    auto wg = simplify(w[1], ctx.bounds).as_const();
    if (wg && a.hidden > 0 && *wg != gate_count(cell) * a.hidden) {
      return node_invalid(n) << "W has " << *wg << " rows, expected " << gate_count(cell) * a.hidden;
    }
  }
  Expr seq = a.layout == 0 ? x[0] : x[1];
  Expr batch = a.layout == 0 ? x[1] : x[0];
  Expr nd = Expr(a.num_directions);
  Shape y = a.layout == 0 ? Shape{seq, nd, batch, hidden} : Shape{batch, seq, nd, hidden};
  Shape state = a.layout == 0 ? Shape{nd, batch, hidden} : Shape{batch, nd, hidden};
  if (n.num_outputs() > 0) set_output(n, 0, xt.dtype, y, ctx);
  if (n.num_outputs() > 1) set_output(n, 1, xt.dtype, state, ctx);
  if (cell == Cell::kLstm && n.num_outputs() > 2) set_output(n, 2, xt.dtype, state, ctx);
  return Status::ok();
}

// The optional inputs both forms share: B, sequence_lens, initial_h,
// initial_c and peepholes, checked against the layer's sizes.
template <typename T>
struct RnnOptionals {
  const T* B = nullptr;
  std::vector<int64_t> lens;  // a thread's object is reused: no allocation once warm
  std::array<int64_t, 3> state_shape{};
  const T* H0 = nullptr;
  const T* C0 = nullptr;
  const T* P = nullptr;
};

bool has_shape(const std::vector<int64_t>& shape, std::initializer_list<int64_t> want) {
  return std::equal(shape.begin(), shape.end(), want.begin(), want.end());
}
bool has_shape(const std::vector<int64_t>& shape, const std::array<int64_t, 3>& want) {
  return std::equal(shape.begin(), shape.end(), want.begin(), want.end());
}

// The layer's outputs Y, Y_h and Y_c, f32 or f64. The kernel fills the
// outputs the VM passes in (OpDef::kernel_fills_outputs): a buffer of the
// inferred shape from the memory plan or the run's pool; an output passed
// undefined gets a fresh zero-filled tensor, one the node does not have a
// thread's scratch. `zero_y`: some batch entry is shorter than the sequence,
// so Y must read 0 at the steps it skips.
template <typename T>
struct RnnOutputs {
  T* y = nullptr;
  T* yh = nullptr;
  T* yc = nullptr;
};

template <typename T>
Status take_outputs(std::vector<Tensor>& out, DType dt, const std::array<int64_t, 4>& y_shape,
                    const std::array<int64_t, 3>& state_shape, bool zero_y, RnnOutputs<T>& o) {
  thread_local std::vector<T> spare[3];
  auto take = [&](size_t i, const int64_t* dims, size_t rank, bool zero) -> Result<T*> {
    int64_t n = 1;
    for (size_t k = 0; k < rank; ++k) n *= dims[k];
    if (i < out.size() && out[i].defined()) {
      Tensor& t = out[i];
      if (t.dtype() != dt || !std::equal(t.shape().begin(), t.shape().end(), dims, dims + rank))
        return internal_error() << "output " << i << " was given as " << t.describe();
      if (zero) std::memset(t.data(), 0, static_cast<size_t>(n) * sizeof(T));
      return t.data_as<T>();
    }
    if (i < out.size()) {
      KILN_ASSIGN_OR_RETURN(out[i], Tensor::allocate(dt, std::vector<int64_t>(dims, dims + rank),
                                                     i == 0 ? "Y" : i == 1 ? "Y_h" : "Y_c"));
      return out[i].data_as<T>();
    }
    spare[i].assign(static_cast<size_t>(n), T(0));
    return spare[i].data();
  };
  KILN_ASSIGN_OR_RETURN(o.y, take(0, y_shape.data(), 4, zero_y));
  KILN_ASSIGN_OR_RETURN(o.yh, take(1, state_shape.data(), 3, false));
  KILN_ASSIGN_OR_RETURN(o.yc, take(2, state_shape.data(), 3, false));
  return Status::ok();
}

template <typename T>
Status read_optionals(const RnnAttrs& a, const std::vector<Tensor>& in, int64_t S, int64_t NB, int64_t ND, int64_t G,
                      int64_t H, RnnOptionals<T>& o) {
  auto present = [&](size_t i) { return i < in.size() && in[i].defined(); };
  o.B = o.H0 = o.C0 = o.P = nullptr;
  if (present(3)) {
    if (!has_shape(in[3].shape(), {ND, 2 * G * H})) return invalid_argument() << "B is " << in[3].describe();
    o.B = in[3].data_as<T>();
  }
  o.lens.assign(static_cast<size_t>(NB), S);
  if (present(4)) {
    if (in[4].numel() != NB) return invalid_argument() << "sequence_lens is " << in[4].describe();
    for (int64_t b = 0; b < NB; ++b) {
      o.lens[b] = in[4].get_i64(b);
      if (o.lens[b] < 0 || o.lens[b] > S) return invalid_argument() << "sequence_lens[" << b << "] = " << o.lens[b];
    }
  }
  o.state_shape = a.layout == 0 ? std::array<int64_t, 3>{ND, NB, H} : std::array<int64_t, 3>{NB, ND, H};
  if (present(5)) {
    if (!has_shape(in[5].shape(), o.state_shape)) return invalid_argument() << "initial_h is " << in[5].describe();
    o.H0 = in[5].data_as<T>();
  }
  if (a.cell == Cell::kLstm && present(6)) {
    if (!has_shape(in[6].shape(), o.state_shape)) return invalid_argument() << "initial_c is " << in[6].describe();
    o.C0 = in[6].data_as<T>();
  }
  if (a.cell == Cell::kLstm && present(7)) {
    if (!has_shape(in[7].shape(), {ND, 3 * H})) return invalid_argument() << "P is " << in[7].describe();
    o.P = in[7].data_as<T>();
  }
  return Status::ok();
}

template <typename T>
Status run_rnn(const RnnAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& xt = in[0];
  const Tensor& wt = in[1];
  const Tensor& rt = in[2];
  if (xt.rank() != 3 || wt.rank() != 3 || rt.rank() != 3) return invalid_argument() << "X, W and R must be 3-D";
  const int64_t S = a.layout == 0 ? xt.shape()[0] : xt.shape()[1];
  const int64_t NB = a.layout == 0 ? xt.shape()[1] : xt.shape()[0];
  const int64_t I = xt.shape()[2];
  const int64_t H = rt.shape()[2];
  const int64_t ND = a.num_directions;
  const int64_t G = gate_count(a.cell);
  if (!has_shape(wt.shape(), {ND, G * H, I})) {
    return invalid_argument() << "W is " << wt.describe() << ", expected [" << ND << "," << G * H << "," << I << "]";
  }
  if (!has_shape(rt.shape(), {ND, G * H, H})) return invalid_argument() << "R is " << rt.describe();
  const T* X = xt.data_as<T>();
  const T* W = wt.data_as<T>();
  const T* R = rt.data_as<T>();
  thread_local RnnOptionals<T> opt;
  KILN_RETURN_IF_ERROR(read_optionals(a, in, S, NB, ND, G, H, opt));
  const T *B = opt.B, *H0 = opt.H0, *C0 = opt.C0, *P = opt.P;
  const std::vector<int64_t>& lens = opt.lens;

  DType dt = xt.dtype();
  std::array<int64_t, 4> y_shape = a.layout == 0 ? std::array<int64_t, 4>{S, ND, NB, H} : std::array<int64_t, 4>{NB, S, ND, H};
  RnnOutputs<T> outs;
  bool short_entry = std::any_of(lens.begin(), lens.end(), [&](int64_t l) { return l < S; });
  KILN_RETURN_IF_ERROR(take_outputs(out, dt, y_shape, opt.state_shape, short_entry, outs));
  T* Y = outs.y;
  T* YH = outs.yh;
  T* YC = outs.yc;

  auto x_at = [&](int64_t t, int64_t b) { return X + (a.layout == 0 ? (t * NB + b) : (b * S + t)) * I; };
  auto state_off = [&](int64_t d, int64_t b) { return (a.layout == 0 ? (d * NB + b) : (b * ND + d)) * H; };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return Y + (a.layout == 0 ? ((t * ND + d) * NB + b) : ((b * S + t) * ND + d)) * H;
  };

  std::vector<T> h(H), c(H), gates(G * H), hr(H), z(H), r(H), hh(H);
  for (int64_t d = 0; d < ND; ++d) {
    bool reverse = a.reverse_only || d == 1;
    const T* Wd = W + d * G * H * I;
    const T* Rd = R + d * G * H * H;
    const T* Wb = B ? B + d * 2 * G * H : nullptr;
    const T* Rb = B ? Wb + G * H : nullptr;
    const T* Pd = P ? P + d * 3 * H : nullptr;
    const Activation* act = &a.acts[static_cast<size_t>(d * activation_count(a.cell))];
    for (int64_t b = 0; b < NB; ++b) {
      for (int64_t j = 0; j < H; ++j) {
        h[j] = H0 ? H0[state_off(d, b) + j] : T(0);
        c[j] = C0 ? C0[state_off(d, b) + j] : T(0);
      }
      for (int64_t s = 0; s < lens[b]; ++s) {
        int64_t t = reverse ? lens[b] - 1 - s : s;
        const T* xv = x_at(t, b);
        // gates = x W^T + Wb (all gates); the recurrent part per cell below.
        for (int64_t g = 0; g < G * H; ++g) {
          gates[g] = (Wb ? Wb[g] : T(0)) + dot(xv, Wd + g * I, I);
        }
        auto rec = [&](int64_t g, const T* hv) {  // hv R[g]^T + Rb[g]
          return (Rb ? Rb[g] : T(0)) + dot(hv, Rd + g * H, H);
        };
        if (a.cell == Cell::kRnn) {
          for (int64_t j = 0; j < H; ++j) gates[j] += rec(j, h.data());
          for (int64_t j = 0; j < H; ++j) h[j] = activate<T>(a, act[0], gates[j]);
        } else if (a.cell == Cell::kGru) {
          // z, r first; then the hidden gate, which needs r.
          for (int64_t j = 0; j < H; ++j) {
            z[j] = activate<T>(a, act[0], gates[j] + rec(j, h.data()));
            r[j] = activate<T>(a, act[0], gates[H + j] + rec(H + j, h.data()));
          }
          if (a.linear_before_reset) {
            for (int64_t j = 0; j < H; ++j) hh[j] = gates[2 * H + j] + r[j] * rec(2 * H + j, h.data());
          } else {
            for (int64_t k = 0; k < H; ++k) hr[k] = r[k] * h[k];
            for (int64_t j = 0; j < H; ++j) hh[j] = gates[2 * H + j] + rec(2 * H + j, hr.data());
          }
          for (int64_t j = 0; j < H; ++j) {
            T ht = activate<T>(a, act[1], hh[j]);
            h[j] = (T(1) - z[j]) * ht + z[j] * h[j];
          }
        } else {
          for (int64_t g = 0; g < 4 * H; ++g) gates[g] += rec(g, h.data());
          for (int64_t j = 0; j < H; ++j) {
            T pi = Pd ? Pd[j] : T(0), po = Pd ? Pd[H + j] : T(0), pf = Pd ? Pd[2 * H + j] : T(0);
            h[j] = lstm_unit<T>(a, act, gates[j], gates[H + j], gates[2 * H + j], gates[3 * H + j], pi, po, pf, c[j]);
          }
        }
        std::copy(h.begin(), h.end(), y_at(t, d, b));
      }
      std::copy(h.begin(), h.end(), YH + state_off(d, b));
      std::copy(c.begin(), c.end(), YC + state_off(d, b));
    }
  }
  return Status::ok();
}

// ---- projected form ---------------------------------------------------------

// R is packed by project-rnn-inputs into panels of pw hidden units, pw * sizeof(T)
// one of kPanelBytes: [nd, ceil(H / pw), H, G, pw], zero past H. Panel p row
// k holds R[g*H + p*pw + u][k] for every gate g and unit u, so a block of pw
// units streams one contiguous panel per step. 256-byte panels fill AVX-512's
// 32 registers with one pass over the panel; with 16 registers a 256-byte
// panel takes several passes, each reading a quarter of every row (strided
// lines the prefetcher follows badly), so those targets pack 64 bytes.
constexpr int64_t kPanelBytes[] = {64, 256};  // gate_panel_any instantiates each
constexpr int64_t kMaxPanelBytes = 256;

// acc[g][0 .. pw) += sum over k of h[k] * panel[k][g0 + g][..], k ascending,
// for NG gates at once, in vectors of VB bytes (the instruction set's own
// width: GCC lowers wider vector types through the stack, and the AVX2 body
// built with 64-byte vectors ran the LSTM model at a third of the AVX-512
// speed): NG x VP vectors stay in registers while the panel streams by, in
// PB / VB / VP passes over its rows. One chain of fused
// multiply-adds per element, in k order, so the result does not depend on how
// units are split among threads.
template <typename T, int PB, int NG, int VB, int VP>
inline __attribute__((always_inline)) void gate_panel(T* acc, const T* panel, int64_t row_stride, const T* h,
                                                      int64_t hidden) {
  constexpr int kLanes = VB / sizeof(T);
  constexpr int kVectors = PB / VB;  // vectors per gate in a panel row
  static_assert(kVectors % VP == 0);
  constexpr int64_t kPw = PB / sizeof(T);
  typedef T V __attribute__((vector_size(VB), aligned(sizeof(T))));
  for (int v0 = 0; v0 < kVectors; v0 += VP) {
    V a[NG][VP];
    for (int g = 0; g < NG; ++g)
      for (int v = 0; v < VP; ++v) std::memcpy(&a[g][v], acc + g * kPw + (v0 + v) * kLanes, sizeof(V));
    for (int64_t k = 0; k < hidden; ++k) {
      V hk = V{} + h[k];
      const T* row = panel + k * row_stride + v0 * kLanes;
      for (int g = 0; g < NG; ++g)
        for (int v = 0; v < VP; ++v) {
          V w;
          std::memcpy(&w, row + g * kPw + v * kLanes, sizeof(V));
          a[g][v] += hk * w;
        }
    }
    for (int g = 0; g < NG; ++g)
      for (int v = 0; v < VP; ++v) std::memcpy(acc + g * kPw + (v0 + v) * kLanes, &a[g][v], sizeof(V));
  }
}

// VB-byte vectors; 32 registers (AVX-512): all 4 vectors of every gate at
// once (16 accumulators); 16 registers: 8 to 12 accumulators per pass.
constexpr int vectors_per_pass(int ng, int vectors, bool wide) {
  return wide ? vectors : std::min(vectors, ng == 1 ? 8 : ng == 4 ? 2 : 4);
}
template <typename T, int PB, int VB>
inline __attribute__((always_inline)) void gate_panel_pb(T* acc, int ng, const T* panel, int64_t row_stride,
                                                         const T* h, int64_t hidden) {
  constexpr int kVectors = PB / VB;
  constexpr bool kWide = VB == 64;
  switch (ng) {
    case 1: gate_panel<T, PB, 1, VB, vectors_per_pass(1, kVectors, kWide)>(acc, panel, row_stride, h, hidden); break;
    case 2: gate_panel<T, PB, 2, VB, vectors_per_pass(2, kVectors, kWide)>(acc, panel, row_stride, h, hidden); break;
    case 3: gate_panel<T, PB, 3, VB, vectors_per_pass(3, kVectors, kWide)>(acc, panel, row_stride, h, hidden); break;
    default: gate_panel<T, PB, 4, VB, vectors_per_pass(4, kVectors, kWide)>(acc, panel, row_stride, h, hidden); break;
  }
}
// Panels of pb bytes, one of kPanelBytes (each at least one vector of VB bytes).
template <typename T, int VB>
inline __attribute__((always_inline)) void gate_panel_any(T* acc, int ng, int64_t pb, const T* panel,
                                                          int64_t row_stride, const T* h, int64_t hidden) {
  if (pb == 64) gate_panel_pb<T, 64, VB>(acc, ng, panel, row_stride, h, hidden);
  else gate_panel_pb<T, 256, VB>(acc, ng, panel, row_stride, h, hidden);
}

// One body per instruction set (the project is built for baseline x86-64),
// chosen at run time from the host's features. Plain dispatch, not
// target_clones: an ifunc resolver runs before the sanitizer runtimes start.
#define KILN_GATE_PANEL(T, suffix, vector_bytes, target_attr)                                               \
  target_attr void gate_panel_##suffix(T* acc, int ng, int64_t pb, const T* panel, int64_t row_stride,    \
                                       const T* h, int64_t hidden) {                                        \
    gate_panel_any<T, vector_bytes>(acc, ng, pb, panel, row_stride, h, hidden);                             \
  }
#if defined(__x86_64__)
KILN_GATE_PANEL(float, f32_avx512, 64, __attribute__((target("avx512f"))))
KILN_GATE_PANEL(float, f32_avx2, 32, __attribute__((target("avx2,fma"))))
KILN_GATE_PANEL(double, f64_avx512, 64, __attribute__((target("avx512f"))))
KILN_GATE_PANEL(double, f64_avx2, 32, __attribute__((target("avx2,fma"))))
#endif
KILN_GATE_PANEL(float, f32_base, 16, )
KILN_GATE_PANEL(double, f64_base, 16, )
#undef KILN_GATE_PANEL

enum class Isa { kBase, kAvx2, kAvx512 };
Isa host_isa() {
#if defined(__x86_64__)
  static const Isa isa = __builtin_cpu_supports("avx512f")                                   ? Isa::kAvx512
                         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::kAvx2
                                                                                            : Isa::kBase;
  return isa;
#else
  return Isa::kBase;
#endif
}

void gate_panel_dispatch(float* acc, int ng, int64_t pb, const float* panel, int64_t row_stride, const float* h,
                         int64_t hidden) {
  switch (host_isa()) {
#if defined(__x86_64__)
    case Isa::kAvx512: return gate_panel_f32_avx512(acc, ng, pb, panel, row_stride, h, hidden);
    case Isa::kAvx2: return gate_panel_f32_avx2(acc, ng, pb, panel, row_stride, h, hidden);
#endif
    default: return gate_panel_f32_base(acc, ng, pb, panel, row_stride, h, hidden);
  }
}
void gate_panel_dispatch(double* acc, int ng, int64_t pb, const double* panel, int64_t row_stride,
                         const double* h, int64_t hidden) {
  switch (host_isa()) {
#if defined(__x86_64__)
    case Isa::kAvx512: return gate_panel_f64_avx512(acc, ng, pb, panel, row_stride, h, hidden);
    case Isa::kAvx2: return gate_panel_f64_avx2(acc, ng, pb, panel, row_stride, h, hidden);
#endif
    default: return gate_panel_f64_base(acc, ng, pb, panel, row_stride, h, hidden);
  }
}

// ---- LSTM and GRU cells in float vectors ------------------------------------

// The cell update of a block of units when the activations are ONNX's default
// (LSTM f = Sigmoid, g = h = Tanh; GRU f = Sigmoid, g = Tanh) and the dtype is
// float: exp, sigmoid and tanh in float vectors of VB bytes instead of a
// double libm call per gate (five per LSTM unit: they took as long as
// streaming R through the step's gate sums).
// exp: e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (ln 2 in two
// parts so r is exact), e^r = 1 + r + r^2 p(r) with p of degree 5 (Cephes's
// expf coefficients) on |r| <= ln2 / 2. tanh: Cephes's odd polynomial for
// |x| < 0.625, 1 - 2 / (e^2|x| + 1) above, with x's sign. Measured over
// [-90, 90] against libm in double: exp within 1.01 ulp, sigmoid 2.5, tanh
// 1.2 (7e-8 absolute). Every unit runs the same vector code (blocks are
// padded to whole vectors), so a unit's result does not depend on the block
// split.
//
// What a CellBlock holds, per kind:
// kLstm: pre = gate pre-activations without peepholes (i, o, f, c), peep =
//   peepholes (i, o, f; zero when absent), c = cell state in and out, h out.
// kGruLbr (linear_before_reset): pre = z and r pre-activations, x Wh + Wbh,
//   h Rh + Rbh; c = previous h; h out.
// kGruGates (phase 1 without it): pre = z and r pre-activations; c =
//   previous h; h out = z, aux out = r * previous h.
// kGruHidden (phase 2): pre[0] = z, pre[2] = the hidden gate's
//   pre-activation; c = previous h; h out.
enum class CellKind { kLstm, kGruLbr, kGruGates, kGruHidden };
struct CellBlock {
  static constexpr int kUnits = kMaxPanelBytes / sizeof(float);
  alignas(64) float pre[4][kUnits];
  alignas(64) float peep[3][kUnits];
  alignas(64) float c[kUnits];
  alignas(64) float h[kUnits];
  alignas(64) float aux[kUnits];
};

// Vectors pass by value between these always-inlined helpers only, inside the
// functions built for each instruction set below (GCC reports the ABI note
// when it instantiates them, at the end of the file: ignored from here on).
#pragma GCC diagnostic ignored "-Wpsabi"
template <int VB>
struct F32Vectors {
  typedef float V __attribute__((vector_size(VB)));
  typedef int32_t I __attribute__((vector_size(VB)));
  static constexpr int kLanes = VB / 4;

  static inline __attribute__((always_inline)) V splat(float x) { return V{} + x; }
  static inline __attribute__((always_inline)) V min(V a, V b) { return a < b ? a : b; }
  static inline __attribute__((always_inline)) V max(V a, V b) { return a > b ? a : b; }
  static inline __attribute__((always_inline)) V exp(V x) {
    x = min(max(x, splat(-87.3f)), splat(88.3f));  // 2^n stays a normal float
    const V round = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer ...
    V shifted = x * splat(1.44269504f) + round;
    V n = shifted - round;
    V r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    V p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    V y = p * r * r + r + splat(1.0f);
    I bits;  // ... which the low mantissa bits then hold: 2^n's exponent field
    std::memcpy(&bits, &shifted, sizeof(V));
    bits = (bits - 0x4B400000 + 127) << 23;
    V scale;
    std::memcpy(&scale, &bits, sizeof(V));
    return y * scale;
  }
  static inline __attribute__((always_inline)) V sigmoid(V x) { return splat(1.0f) / (splat(1.0f) + exp(-x)); }
  static inline __attribute__((always_inline)) V tanh(V x) {
    V a = max(x, -x);
    V z = a * a;
    V p = splat(-5.70498872745e-3f);
    p = p * z + splat(2.06390887954e-2f);
    p = p * z - splat(5.37397155531e-2f);
    p = p * z + splat(1.33314422036e-1f);
    p = p * z - splat(3.33332819422e-1f);
    V small = p * z * a + a;
    V large = splat(1.0f) - splat(2.0f) / (exp(a + a) + splat(1.0f));
    V t = a < splat(0.625f) ? small : large;
    return x < splat(0.0f) ? -t : t;
  }

  // units: a multiple of kLanes.
  static inline __attribute__((always_inline)) void cells(CellBlock& b, CellKind kind, int units, bool clip,
                                                          float bound, bool input_forget) {
    auto load = [](const float* p) {
      V v;
      std::memcpy(&v, p, sizeof(V));
      return v;
    };
    auto store = [](float* p, V v) { std::memcpy(p, &v, sizeof(V)); };
    auto clamp = [&](V v) { return clip ? min(max(v, splat(-bound)), splat(bound)) : v; };
    const V one = splat(1.0f);
    for (int u = 0; u < units; u += kLanes) {
      V c = load(b.c + u);
      if (kind == CellKind::kGruLbr) {
        V z = sigmoid(clamp(load(b.pre[0] + u)));
        V r = sigmoid(clamp(load(b.pre[1] + u)));
        V ht = tanh(clamp(load(b.pre[2] + u) + r * load(b.pre[3] + u)));
        store(b.h + u, (one - z) * ht + z * c);
        continue;
      }
      if (kind == CellKind::kGruGates) {
        store(b.h + u, sigmoid(clamp(load(b.pre[0] + u))));
        store(b.aux + u, sigmoid(clamp(load(b.pre[1] + u))) * c);
        continue;
      }
      if (kind == CellKind::kGruHidden) {
        V z = load(b.pre[0] + u);
        V ht = tanh(clamp(load(b.pre[2] + u)));
        store(b.h + u, (one - z) * ht + z * c);
        continue;
      }
      V ig = sigmoid(clamp(load(b.pre[0] + u) + load(b.peep[0] + u) * c));
      V fg = input_forget ? splat(1.0f) - ig : sigmoid(clamp(load(b.pre[2] + u) + load(b.peep[2] + u) * c));
      V cg = tanh(clamp(load(b.pre[3] + u)));
      V cn = fg * c + ig * cg;
      V og = sigmoid(clamp(load(b.pre[1] + u) + load(b.peep[1] + u) * cn));
      V h = og * tanh(cn);
      store(b.c + u, cn);
      store(b.h + u, h);
    }
  }
};

#define KILN_CELLS(suffix, vector_bytes, target_attr)                                                      \
  target_attr void cells_##suffix(CellBlock& b, CellKind kind, int units, bool clip, float bound,           \
                                  bool input_forget) {                                                       \
    F32Vectors<vector_bytes>::cells(b, kind, units, clip, bound, input_forget);                             \
  }
#if defined(__x86_64__)
KILN_CELLS(avx512, 64, __attribute__((target("avx512f"))))
KILN_CELLS(avx2, 32, __attribute__((target("avx2,fma"))))
#endif
KILN_CELLS(base, 16, )
#undef KILN_CELLS

// units: a multiple of 16 (every panel width is).
void cells_dispatch(CellBlock& b, CellKind kind, int units, bool clip, float bound, bool input_forget) {
  switch (host_isa()) {
#if defined(__x86_64__)
    case Isa::kAvx512: return cells_avx512(b, kind, units, clip, bound, input_forget);
    case Isa::kAvx2: return cells_avx2(b, kind, units, clip, bound, input_forget);
#endif
    default: return cells_base(b, kind, units, clip, bound, input_forget);
  }
}

// Whether a direction's activations are the defaults the float cells compute.
bool default_activations(Cell cell, const Activation* act) {
  if (cell == Cell::kLstm)
    return act[0].kind == ActKind::kSigmoid && act[1].kind == ActKind::kTanh && act[2].kind == ActKind::kTanh;
  if (cell == Cell::kGru) return act[0].kind == ActKind::kSigmoid && act[1].kind == ActKind::kTanh;
  return false;
}

template <typename T>
struct ProjectedRun {
  const RnnAttrs* a = nullptr;
  int64_t S = 0, NB = 0, H = 0, G = 0, ND = 0;
  const T* X = nullptr;   // projections [.., .., ND * G * H]
  const T* RT = nullptr;  // panels [ND, ceil(H / pw), H, G, pw]
  int64_t pw = 0;         // hidden units per panel
  const T* B = nullptr;   // [ND, 2 * G * H] or null
  const T* P = nullptr;   // peepholes [ND, 3 * H] or null
  T* Y = nullptr;
  const std::vector<int64_t>* lens = nullptr;
  // Per step: direction, step index, state in and out.
  int64_t d = 0, s = 0;
  int phase = 0;  // GRU without linear_before_reset: 1 = z and r, 2 = the hidden gate
  const T* h_in = nullptr;
  T* h_out = nullptr;
  T* c = nullptr;
  T* hr = nullptr;  // GRU: r * h

  const T* x_at(int64_t t, int64_t b) const {
    return X + (a->layout == 0 ? (t * NB + b) : (b * S + t)) * ND * G * H + d * G * H;
  }
  T* y_at(int64_t t, int64_t b) const {
    return Y + (a->layout == 0 ? ((t * ND + d) * NB + b) : ((b * S + t) * ND + d)) * H;
  }

  // Units [j0, j1) of every batch entry for this step.
  void run_units(int64_t j0, int64_t j1) const {
    int64_t width = j1 - j0;
    const T* panel = RT + (d * ((H + pw - 1) / pw) + j0 / pw) * H * G * pw;
    const T* rb = B ? B + d * 2 * G * H + G * H : nullptr;
    const T* pd = P ? P + d * 3 * H : nullptr;
    const Activation* act = &a->acts[static_cast<size_t>(d * activation_count(a->cell))];
    bool reverse = a->reverse_only || d == 1;
    T acc[4 * kMaxPanelBytes / sizeof(T)];
    for (int64_t b = 0; b < NB; ++b) {
      int64_t len = (*lens)[static_cast<size_t>(b)];
      const T* hb = h_in + b * H;
      T* ho = h_out + b * H;
      if (s >= len) {  // this entry has finished: its state carries over
        if (phase != 1) std::copy(hb + j0, hb + j1, ho + j0);
        continue;
      }
      int64_t t = reverse ? len - 1 - s : s;
      const T* xp = x_at(t, b);
      T* cb = c + b * H;
      // Gates this pass computes, and the vector each reads h from.
      int g0 = 0, ng = static_cast<int>(G);
      const T* hv = hb;
      if (a->cell == Cell::kGru && !a->linear_before_reset) {
        if (phase == 1) ng = 2;
        else { g0 = 2; ng = 1; hv = hr + b * H; }
      }
      for (int g = 0; g < ng; ++g)
        for (int64_t j = 0; j < pw; ++j) acc[g * pw + j] = rb && j < width ? rb[(g0 + g) * H + j0 + j] : T(0);
      gate_panel_dispatch(acc, ng, pw * static_cast<int64_t>(sizeof(T)), panel + g0 * pw, G * pw, hv, H);
      T* yt = y_at(t, b);
      if constexpr (std::is_same_v<T, float>) {
        if (default_activations(a->cell, act)) {
          CellBlock cells;
          CellKind kind = a->cell == Cell::kLstm ? CellKind::kLstm
                          : a->linear_before_reset ? CellKind::kGruLbr
                          : phase == 1             ? CellKind::kGruGates
                                                   : CellKind::kGruHidden;
          for (int64_t jj = 0; jj < pw; ++jj) {
            bool in = jj < width;
            int64_t j = j0 + jj;
            for (int g = 0; g < 4; ++g) cells.pre[g][jj] = 0.0f;
            if (in && kind == CellKind::kLstm) {
              for (int g = 0; g < 4; ++g) cells.pre[g][jj] = xp[g * H + j] + acc[g * pw + jj];
            } else if (in && kind == CellKind::kGruLbr) {
              for (int g = 0; g < 2; ++g) cells.pre[g][jj] = xp[g * H + j] + acc[g * pw + jj];
              cells.pre[2][jj] = xp[2 * H + j];
              cells.pre[3][jj] = acc[2 * pw + jj];
            } else if (in && kind == CellKind::kGruGates) {
              for (int g = 0; g < 2; ++g) cells.pre[g][jj] = xp[g * H + j] + acc[g * pw + jj];
            } else if (in) {  // kGruHidden: z waits in the output row since phase 1
              cells.pre[0][jj] = ho[j];
              cells.pre[2][jj] = xp[2 * H + j] + acc[jj];
            }
            for (int g = 0; g < 3; ++g) cells.peep[g][jj] = in && pd ? pd[g * H + j] : 0.0f;
            cells.c[jj] = !in ? 0.0f : kind == CellKind::kLstm ? cb[j] : hb[j];
          }
          cells_dispatch(cells, kind, static_cast<int>(pw), a->has_clip, static_cast<float>(a->clip),
                         a->input_forget);
          for (int64_t jj = 0; jj < width; ++jj) {
            int64_t j = j0 + jj;
            if (kind == CellKind::kLstm) cb[j] = cells.c[jj];
            ho[j] = cells.h[jj];
            if (kind == CellKind::kGruGates) hr[b * H + j] = cells.aux[jj];
            else yt[j] = cells.h[jj];
          }
          continue;
        }
      }
      for (int64_t jj = 0; jj < width; ++jj) {
        int64_t j = j0 + jj;
        if (a->cell == Cell::kRnn) {
          ho[j] = activate<T>(*a, act[0], xp[j] + acc[jj]);
        } else if (a->cell == Cell::kLstm) {
          T pi = pd ? pd[j] : T(0), po = pd ? pd[H + j] : T(0), pf = pd ? pd[2 * H + j] : T(0);
          ho[j] = lstm_unit<T>(*a, act, xp[j] + acc[jj], xp[H + j] + acc[pw + jj], xp[2 * H + j] + acc[2 * pw + jj],
                               xp[3 * H + j] + acc[3 * pw + jj], pi, po, pf, cb[j]);
        } else if (a->linear_before_reset) {  // GRU: h~ = g(x Wh + Wbh + r * (h Rh + Rbh))
          T z = activate<T>(*a, act[0], xp[j] + acc[jj]);
          T r = activate<T>(*a, act[0], xp[H + j] + acc[pw + jj]);
          T ht = activate<T>(*a, act[1], xp[2 * H + j] + r * acc[2 * pw + jj]);
          ho[j] = (T(1) - z) * ht + z * hb[j];
        } else if (phase == 1) {  // GRU: z (kept in the output row until phase 2) and r * h
          T z = activate<T>(*a, act[0], xp[j] + acc[jj]);
          T r = activate<T>(*a, act[0], xp[H + j] + acc[pw + jj]);
          ho[j] = z;
          hr[b * H + j] = r * hb[j];
        } else {  // GRU phase 2: h~ = g(x Wh + Wbh + (r * h) Rh + Rbh)
          T z = ho[j];
          T ht = activate<T>(*a, act[1], xp[2 * H + j] + acc[jj]);
          ho[j] = (T(1) - z) * ht + z * hb[j];
        }
        if (phase != 1) yt[j] = ho[j];
      }
    }
  }

  static void blocks(int64_t begin, int64_t end, void* env) {
    const auto* self = static_cast<const ProjectedRun*>(env);
    for (int64_t blk = begin; blk < end; ++blk)
      self->run_units(blk * self->pw, std::min((blk + 1) * self->pw, self->H));
  }
};

template <typename T>
Status run_projected(const RnnAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& xt = in[0];
  const Tensor& rt = in[2];
  if (xt.rank() != 3) return invalid_argument() << "projected X must be 3-D";
  ProjectedRun<T> run;
  run.a = &a;
  run.S = a.layout == 0 ? xt.shape()[0] : xt.shape()[1];
  run.NB = a.layout == 0 ? xt.shape()[1] : xt.shape()[0];
  run.ND = a.num_directions;
  run.G = gate_count(a.cell);
  if (rt.rank() != 5) return invalid_argument() << "packed R is " << rt.describe();
  run.H = rt.shape()[2];
  const int64_t pw = rt.shape()[4];
  if (std::find(std::begin(kPanelBytes), std::end(kPanelBytes), pw * static_cast<int64_t>(sizeof(T))) ==
      std::end(kPanelBytes))
    return invalid_argument() << "packed R is " << rt.describe() << ": panels of " << pw << " units";
  run.pw = pw;
  const int64_t S = run.S, NB = run.NB, ND = run.ND, G = run.G, H = run.H;
  if (!has_shape(rt.shape(), {ND, (H + pw - 1) / pw, H, G, pw}))
    return invalid_argument() << "packed R is " << rt.describe();
  if (xt.shape()[2] != ND * G * H) return invalid_argument() << "projected X is " << xt.describe();
  if (a.hidden > 0 && a.hidden != H) return invalid_argument() << "hidden_size " << a.hidden << ", R has " << H;
  run.X = xt.data_as<T>();
  run.RT = rt.data_as<T>();
  thread_local RnnOptionals<T> opt;
  KILN_RETURN_IF_ERROR(read_optionals(a, in, S, NB, ND, G, H, opt));
  run.B = opt.B;
  run.P = opt.P;
  const T *H0 = opt.H0, *C0 = opt.C0;
  const std::vector<int64_t>& lens = opt.lens;
  run.lens = &lens;
  auto state_off = [&](int64_t d, int64_t b) { return (a.layout == 0 ? (d * NB + b) : (b * ND + d)) * H; };
  DType dt = xt.dtype();
  std::array<int64_t, 4> y_shape = a.layout == 0 ? std::array<int64_t, 4>{S, ND, NB, H} : std::array<int64_t, 4>{NB, S, ND, H};
  RnnOutputs<T> outs;
  bool short_entry = std::any_of(lens.begin(), lens.end(), [&](int64_t l) { return l < S; });
  KILN_RETURN_IF_ERROR(take_outputs(out, dt, y_shape, opt.state_shape, short_entry, outs));
  run.Y = outs.y;
  // The recurrent state: h in and out, c, and r * h for GRU (a thread's
  // buffers, reused from run to run).
  thread_local std::vector<T> state;
  const size_t units = static_cast<size_t>(NB * H);
  state.resize(4 * units);
  T* h0 = state.data();
  T* h1 = h0 + units;
  T* c = h1 + units;
  T* hr = c + units;
  int64_t max_len = 0;
  for (int64_t l : lens) max_len = std::max(max_len, l);
  int64_t blocks = (H + pw - 1) / pw;
  ThreadPool* pool = current_thread_pool();
  for (int64_t d = 0; d < ND; ++d) {
    for (int64_t b = 0; b < NB; ++b)
      for (int64_t j = 0; j < H; ++j) {
        h0[b * H + j] = H0 ? H0[state_off(d, b) + j] : T(0);
        c[b * H + j] = C0 ? C0[state_off(d, b) + j] : T(0);
      }
    run.d = d;
    run.c = c;
    run.hr = hr;
    T* cur = h0;
    T* next = h1;
    for (int64_t s = 0; s < max_len; ++s) {
      run.s = s;
      run.h_in = cur;
      run.h_out = next;
      bool two_phase = a.cell == Cell::kGru && !a.linear_before_reset;
      for (int phase = two_phase ? 1 : 0; phase <= (two_phase ? 2 : 0); ++phase) {
        run.phase = phase;
        if (pool != nullptr && blocks > 1) pool->parallel_for(blocks, &ProjectedRun<T>::blocks, &run);
        else ProjectedRun<T>::blocks(0, blocks, &run);
      }
      std::swap(cur, next);
    }
    for (int64_t b = 0; b < NB; ++b) {
      std::copy(cur + b * H, cur + (b + 1) * H, outs.yh + state_off(d, b));
      std::copy(c + b * H, c + (b + 1) * H, outs.yc + state_off(d, b));
    }
  }
  return Status::ok();
}

Result<RuntimeKernel> rnn_kernel(Cell cell, const Node& n) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, parse_attrs(cell, n));
  std::string where = n.describe();
  return RuntimeKernel([a, where](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.size() < 3 || !in[0].defined() || !in[2].defined() || (!a.projected && !in[1].defined()))
      return invalid_argument() << where << ": X, W and R are required";
    DType dt = in[0].dtype();
    for (size_t i : {1, 2, 3, 5, 6, 7}) {
      if (i < in.size() && in[i].defined() && in[i].dtype() != dt) {
        return invalid_argument() << where << ": input " << i << " is " << in[i].describe() << ", X is "
                                  << dtype_name(dt);
      }
    }
    Status st = dt == DType::kFloat32   ? (a.projected ? run_projected<float>(a, in, out) : run_rnn<float>(a, in, out))
                : dt == DType::kFloat64 ? (a.projected ? run_projected<double>(a, in, out) : run_rnn<double>(a, in, out))
                                        : unsupported() << "dtype " << dtype_name(dt) << " (f32 or f64 supported)";
    if (!st.is_ok()) return Status(st.code(), where + ": " + st.message());
    return st;
  });
}

void register_rnn(const char* name, Cell cell) {
  OpDef def;
  def.name = name;
  def.infer = [cell](Node& n, InferContext& ctx) { return infer_rnn(cell, n, ctx); };
  def.kernel = [cell](const Node& n) { return rnn_kernel(cell, n); };
  def.kernel_fills_outputs = true;
  if (cell == Cell::kLstm) def.gradient = grad_lstm;
  register_op(std::move(def));
}

}  // namespace

void register_rnn_ops() {
  register_rnn("RNN", Cell::kRnn);
  register_rnn("GRU", Cell::kGru);
  register_rnn("LSTM", Cell::kLstm);
}

}  // namespace kiln::ops
