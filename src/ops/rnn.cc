// Recurrent layers: RNN, GRU and LSTM (ONNX opsets 7 through 22).
//
// These run as runtime kernels: C++ with plain loops over directions, batch
// entries and time steps, called by the VM like a compiled kernel. The time
// loop is inherently sequential (step t reads the hidden state of step t-1),
// which the compute-stage form of the loop IR cannot express; a compiled
// version would instead loop over time in the VM with one compiled step
// kernel (the gate matrix products and the cell update as stages), reusing
// the matmul schedules. That is future work; the kernels here are plain and
// unvectorized, fine for the small recurrent layers in the model zoo but not
// fast.
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
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common.h"

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
  std::vector<Activation> acts;  // activation_count(cell) per direction
};

Result<RnnAttrs> parse_attrs(Cell cell, const Node& n) {
  RnnAttrs a;
  a.cell = cell;
  a.hidden = n.attr_int("hidden_size", 0);
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

Status infer_rnn(Cell cell, Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, parse_attrs(cell, n));
  KILN_ASSIGN_OR_RETURN(TensorType xt, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape x, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape w, input_shape(n, 1));
  KILN_ASSIGN_OR_RETURN(Shape r, input_shape(n, 2));
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) return node_invalid(n) << "X, W and R must be 3-D";
  Expr hidden = a.hidden > 0 ? Expr(a.hidden) : r[2];
  Expr seq = a.layout == 0 ? x[0] : x[1];
  Expr batch = a.layout == 0 ? x[1] : x[0];
  Expr nd = Expr(a.num_directions);
  auto wd = simplify(w[0], ctx.bounds).as_const();
  if (wd && *wd != a.num_directions) {
    return node_invalid(n) << "W has " << *wd << " directions, the direction attribute " << a.num_directions;
  }
  auto wg = simplify(w[1], ctx.bounds).as_const();
  if (wg && a.hidden > 0 && *wg != gate_count(cell) * a.hidden) {
    return node_invalid(n) << "W has " << *wg << " rows, expected " << gate_count(cell) * a.hidden;
  }
  Shape y = a.layout == 0 ? Shape{seq, nd, batch, hidden} : Shape{batch, seq, nd, hidden};
  Shape state = a.layout == 0 ? Shape{nd, batch, hidden} : Shape{batch, nd, hidden};
  if (n.num_outputs() > 0) set_output(n, 0, xt.dtype, y, ctx);
  if (n.num_outputs() > 1) set_output(n, 1, xt.dtype, state, ctx);
  if (cell == Cell::kLstm && n.num_outputs() > 2) set_output(n, 2, xt.dtype, state, ctx);
  return Status::ok();
}

template <typename T>
Status run_rnn(const RnnAttrs& a, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  auto present = [&](size_t i) { return i < in.size() && in[i].defined(); };
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
  if (wt.shape() != std::vector<int64_t>{ND, G * H, I}) {
    return invalid_argument() << "W is " << wt.describe() << ", expected [" << ND << "," << G * H << "," << I << "]";
  }
  if (rt.shape() != std::vector<int64_t>{ND, G * H, H}) return invalid_argument() << "R is " << rt.describe();
  const T* X = xt.data_as<T>();
  const T* W = wt.data_as<T>();
  const T* R = rt.data_as<T>();
  const T* B = nullptr;
  if (present(3)) {
    if (in[3].shape() != std::vector<int64_t>{ND, 2 * G * H}) return invalid_argument() << "B is " << in[3].describe();
    B = in[3].data_as<T>();
  }
  std::vector<int64_t> lens(static_cast<size_t>(NB), S);
  if (present(4)) {
    if (in[4].numel() != NB) return invalid_argument() << "sequence_lens is " << in[4].describe();
    for (int64_t b = 0; b < NB; ++b) {
      lens[b] = in[4].get_i64(b);
      if (lens[b] < 0 || lens[b] > S) return invalid_argument() << "sequence_lens[" << b << "] = " << lens[b];
    }
  }
  std::vector<int64_t> state_shape = a.layout == 0 ? std::vector<int64_t>{ND, NB, H} : std::vector<int64_t>{NB, ND, H};
  const T* H0 = nullptr;
  const T* C0 = nullptr;
  const T* P = nullptr;
  if (present(5)) {
    if (in[5].shape() != state_shape) return invalid_argument() << "initial_h is " << in[5].describe();
    H0 = in[5].data_as<T>();
  }
  if (a.cell == Cell::kLstm && present(6)) {
    if (in[6].shape() != state_shape) return invalid_argument() << "initial_c is " << in[6].describe();
    C0 = in[6].data_as<T>();
  }
  if (a.cell == Cell::kLstm && present(7)) {
    if (in[7].shape() != std::vector<int64_t>{ND, 3 * H}) return invalid_argument() << "P is " << in[7].describe();
    P = in[7].data_as<T>();
  }

  DType dt = xt.dtype();
  std::vector<int64_t> y_shape = a.layout == 0 ? std::vector<int64_t>{S, ND, NB, H} : std::vector<int64_t>{NB, S, ND, H};
  Tensor y(dt, y_shape), yh(dt, state_shape), yc(dt, state_shape);  // zero-filled
  T* Y = y.data_as<T>();
  T* YH = yh.data_as<T>();
  T* YC = yc.data_as<T>();

  auto x_at = [&](int64_t t, int64_t b) { return X + (a.layout == 0 ? (t * NB + b) : (b * S + t)) * I; };
  auto state_off = [&](int64_t d, int64_t b) { return (a.layout == 0 ? (d * NB + b) : (b * ND + d)) * H; };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return Y + (a.layout == 0 ? ((t * ND + d) * NB + b) : ((b * S + t) * ND + d)) * H;
  };
  auto clipped = [&](double v) { return a.has_clip ? std::max(-a.clip, std::min(a.clip, v)) : v; };

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
          for (int64_t j = 0; j < H; ++j) h[j] = static_cast<T>(apply(act[0], clipped(gates[j])));
        } else if (a.cell == Cell::kGru) {
          // z, r first; then the hidden gate, which needs r.
          for (int64_t j = 0; j < H; ++j) {
            z[j] = static_cast<T>(apply(act[0], clipped(gates[j] + rec(j, h.data()))));
            r[j] = static_cast<T>(apply(act[0], clipped(gates[H + j] + rec(H + j, h.data()))));
          }
          if (a.linear_before_reset) {
            for (int64_t j = 0; j < H; ++j) hh[j] = gates[2 * H + j] + r[j] * rec(2 * H + j, h.data());
          } else {
            for (int64_t k = 0; k < H; ++k) hr[k] = r[k] * h[k];
            for (int64_t j = 0; j < H; ++j) hh[j] = gates[2 * H + j] + rec(2 * H + j, hr.data());
          }
          for (int64_t j = 0; j < H; ++j) {
            T ht = static_cast<T>(apply(act[1], clipped(hh[j])));
            h[j] = (T(1) - z[j]) * ht + z[j] * h[j];
          }
        } else {
          for (int64_t g = 0; g < 4 * H; ++g) gates[g] += rec(g, h.data());
          for (int64_t j = 0; j < H; ++j) {
            T pi = Pd ? Pd[j] : T(0), po = Pd ? Pd[H + j] : T(0), pf = Pd ? Pd[2 * H + j] : T(0);
            T ig = static_cast<T>(apply(act[0], clipped(gates[j] + pi * c[j])));
            T fg = a.input_forget ? T(1) - ig : static_cast<T>(apply(act[0], clipped(gates[2 * H + j] + pf * c[j])));
            T cg = static_cast<T>(apply(act[1], clipped(gates[3 * H + j])));
            T cn = fg * c[j] + ig * cg;
            T og = static_cast<T>(apply(act[0], clipped(gates[H + j] + po * cn)));
            c[j] = cn;
            h[j] = og * static_cast<T>(apply(act[2], cn));
          }
        }
        std::copy(h.begin(), h.end(), y_at(t, d, b));
      }
      std::copy(h.begin(), h.end(), YH + state_off(d, b));
      std::copy(c.begin(), c.end(), YC + state_off(d, b));
    }
  }
  if (out.size() > 0) out[0] = std::move(y);
  if (out.size() > 1) out[1] = std::move(yh);
  if (out.size() > 2) out[2] = std::move(yc);
  return Status::ok();
}

Result<RuntimeKernel> rnn_kernel(Cell cell, const Node& n) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, parse_attrs(cell, n));
  std::string where = n.describe();
  return RuntimeKernel([a, where](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in.size() < 3) return invalid_argument() << where << ": X, W and R are required";
    DType dt = in[0].dtype();
    for (size_t i : {1, 2, 3, 5, 6, 7}) {
      if (i < in.size() && in[i].defined() && in[i].dtype() != dt) {
        return invalid_argument() << where << ": input " << i << " is " << in[i].describe() << ", X is "
                                  << dtype_name(dt);
      }
    }
    Status st = dt == DType::kFloat32   ? run_rnn<float>(a, in, out)
                : dt == DType::kFloat64 ? run_rnn<double>(a, in, out)
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
  register_op(std::move(def));
}

}  // namespace

void register_rnn_ops() {
  register_rnn("RNN", Cell::kRnn);
  register_rnn("GRU", Cell::kGru);
  register_rnn("LSTM", Cell::kLstm);
}

}  // namespace kiln::ops
