// The LSTM's gradient rule: back-propagation through time as two Scans.
// A forward Scan recomputes each step and keeps what the backward needs per
// step (the gates after their activations, the cell state before and the
// tanh of the cell state after, the hidden state before), as its scan
// outputs; a reverse Scan walks the steps last to first carrying the
// gradients of h and c, and outputs each step's gradient of the gate
// pre-activations. The weights' gradients are then one product each over all
// steps ([4H, T*B] x [T*B, I] and x [T*B, H]), the input's one product
// [T, B, 4H] x [4H, I], the biases' a sum.
#include <memory>

#include "ops/common.h"
#include "ops/gradient.h"
#include "ops/rnn_grad.h"

namespace kiln::ops {

namespace {

// A Scan body under construction: typed inputs, untyped node outputs
// (inferred with the Scan), captures of the enclosing graph's values.
class Body {
 public:
  Body(const std::string& base, int64_t opset) : base_(base), g_(std::make_shared<Graph>()) { g_->opsets[""] = opset; }
  Value* input(const std::string& name, DType dt, const Shape& shape) {
    return g_->add_input(base_ + "." + name, TensorType{dt, shape});
  }
  Value* capture(const Value* outer) { return g_->add_capture(outer->name(), outer->type()); }
  Value* op(const char* type, const std::vector<Value*>& ins, const std::map<std::string, Attribute>& attrs = {}) {
    Node* n = g_->add_node(type, ins, {g_->unique_name(base_ + "." + type)});
    for (const auto& [k, a] : attrs) n->set_attr(k, a);
    return n->output(0);
  }
  std::vector<Value*> split4(Value* v) {
    std::vector<std::string> names;
    for (const char* gate : {"i", "o", "f", "z"}) names.push_back(g_->unique_name(base_ + ".pre_" + gate));
    Node* n = g_->add_node("Split", {v}, names);
    n->set_attr("axis", Attribute::of_int(1));
    return std::vector<Value*>(n->outputs().begin(), n->outputs().end());
  }
  Value* constant(Tensor t) { return g_->add_constant(g_->unique_name(base_ + ".k"), std::move(t)); }
  std::shared_ptr<Graph> finish(const std::vector<Value*>& outs) {
    g_->set_outputs(outs);
    return g_;
  }

 private:
  std::string base_;
  std::shared_ptr<Graph> g_;
};

bool default_lstm_activations(const Node& n) {
  if (n.has_attr("activation_alpha") || n.has_attr("activation_beta")) return false;
  const Attribute* a = n.attr("activations");
  if (a == nullptr) return true;
  return a->kind == Attribute::Kind::kStrings && a->strings == std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
}

}  // namespace

Status grad_lstm(GradBuilder& b) {
  const Node& n = b.node();
  auto input = [&](size_t i) { return i < n.num_inputs() ? n.input(i) : nullptr; };
  if (n.attr_string("direction", "forward") != "forward" || !default_lstm_activations(n) || n.has_attr("clip") ||
      n.attr_int("input_forget", 0) != 0 || n.attr_int("layout", 0) != 0 || input(4) != nullptr || input(7) != nullptr)
    return unsupported() << n.describe()
                         << ": the LSTM gradient covers direction forward with the default activations; not clip, "
                            "input_forget, layout 1, sequence_lens or peepholes";
  Value* x = input(0);
  Value* w = input(1);
  Value* r = input(2);
  const TensorType& rt = r->type();
  const TensorType& wt = w->type();
  if (!rt.has_shape() || rt.rank() != 3 || !(*rt.shape)[2].as_const() || !wt.has_shape() || wt.rank() != 3 ||
      !(*wt.shape)[2].as_const() || !x->type().has_shape() || x->type().rank() != 3)
    return unsupported() << n.describe() << ": the LSTM gradient needs W and R of static shapes and X of rank 3";
  const int64_t h = *(*rt.shape)[2].as_const(), in_size = *(*wt.shape)[2].as_const();
  const DType dt = x->dtype();
  const Expr batch = (*x->type().shape)[1];
  const int64_t opset = b.opset();
  if (opset < 13) return unsupported() << n.describe() << ": the LSTM gradient needs ai.onnx opset 13 or newer";
  const std::string base = (n.name().empty() ? std::string("lstm") : n.name()) + ".bptt";

  auto squeeze0 = [&](Value* v) { return b.add1("Squeeze", {v, b.ints({0})}); };
  auto unsqueeze0 = [&](Value* v) { return b.add1("Unsqueeze", {v, b.ints({0})}); };
  auto transpose = [&](Value* v) { return b.add1("Transpose", {v}, {{"perm", Attribute::of_ints({1, 0})}}); };
  auto rows = [&](Value* v, int64_t cols) { return b.add1("Reshape", {v, b.ints({-1, cols})}); };
  // Zeros of X's dims [from, to) followed by h.
  auto zeros = [&](int64_t from, int64_t to) -> Result<Value*> {
    KILN_ASSIGN_OR_RETURN(Value* shape, b.add1("Shape", {x}));
    KILN_ASSIGN_OR_RETURN(Value* dims, b.add1("Slice", {shape, b.ints({from}), b.ints({to})}));
    KILN_ASSIGN_OR_RETURN(Value* full, b.add1("Concat", {dims, b.ints({h})}, {{"axis", Attribute::of_int(0)}}));
    return b.add1("ConstantOfShape", {full}, {{"value", Attribute::of_tensor(Tensor(dt, {1}))}});
  };

  // W [4H, I], R [4H, H], R^T; the projected input X W^T (+ Wb + Rb), [T, B, 4H].
  KILN_ASSIGN_OR_RETURN(Value* w2, squeeze0(w));
  KILN_ASSIGN_OR_RETURN(Value* r2, squeeze0(r));
  KILN_ASSIGN_OR_RETURN(Value* r2t, transpose(r2));
  KILN_ASSIGN_OR_RETURN(Value* w2t, transpose(w2));
  KILN_ASSIGN_OR_RETURN(Value* proj, b.add1("MatMul", {x, w2t}));
  if (Value* bias = input(3)) {
    KILN_ASSIGN_OR_RETURN(Value* halves, b.add1("Reshape", {bias, b.ints({2, 4 * h})}));
    KILN_ASSIGN_OR_RETURN(Value* sum, b.reduce_sum(halves, {0}, false));
    KILN_ASSIGN_OR_RETURN(proj, b.add1("Add", {proj, sum}));
  }
  // Initial states [B, H]: the inputs', else zeros.
  Value* zero_state = nullptr;
  auto initial = [&](size_t i) -> Result<Value*> {
    if (Value* s = input(i)) return squeeze0(s);
    if (zero_state == nullptr) {
      KILN_ASSIGN_OR_RETURN(zero_state, zeros(1, 2));
    }
    return zero_state;
  };
  KILN_ASSIGN_OR_RETURN(Value* h0, initial(5));
  KILN_ASSIGN_OR_RETURN(Value* c0, initial(6));

  const Shape step{batch, Expr(h)};
  Tensor one_t(dt, {});
  one_t.set_f64(0, 1.0);

  // Forward, recomputed: (h, c; p) -> (h', c'; i, o, f, z, c, tanh(c'), h).
  Body fwd(base + ".fwd", opset);
  Value* hv = fwd.input("h", dt, step);
  Value* cv = fwd.input("c", dt, step);
  Value* pv = fwd.input("p", dt, Shape{batch, Expr(4 * h)});
  std::vector<Value*> pre = fwd.split4(fwd.op("Add", {fwd.op("MatMul", {hv, fwd.capture(r2t)}), pv}));
  Value* gi = fwd.op("Sigmoid", {pre[0]});
  Value* go = fwd.op("Sigmoid", {pre[1]});
  Value* gf = fwd.op("Sigmoid", {pre[2]});
  Value* gz = fwd.op("Tanh", {pre[3]});
  Value* c2 = fwd.op("Add", {fwd.op("Mul", {gf, cv}), fwd.op("Mul", {gi, gz})});
  Value* tc = fwd.op("Tanh", {c2});
  Value* h2 = fwd.op("Mul", {go, tc});
  std::shared_ptr<Graph> fwd_body =
      fwd.finish({h2, c2, gi, go, gf, gz, fwd.op("Identity", {cv}), tc, fwd.op("Identity", {hv})});
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> kept,
                        b.add("Scan", {h0, c0, proj},
                              {{"body", Attribute::of_graph(fwd_body)}, {"num_scan_inputs", Attribute::of_int(1)}}, 9));
  // kept: h_T, c_T, then per step [T, B, H]: i, o, f, z, c before, tanh(c after), h before.

  // The gradients flowing in: dY [T, 1, B, H] as [T, B, H]; dY_h and dY_c [1, B, H] as [B, H].
  Value* dy = b.output_grad(0);
  if (dy != nullptr) {
    KILN_ASSIGN_OR_RETURN(dy, b.add1("Reshape", {dy, b.ints({0, -1, h})}));
  } else {
    KILN_ASSIGN_OR_RETURN(dy, zeros(0, 2));
  }
  Value* zero_grad = nullptr;
  auto final_grad = [&](size_t k) -> Result<Value*> {
    if (Value* g = n.num_outputs() > k ? b.output_grad(k) : nullptr) return squeeze0(g);
    if (zero_grad == nullptr) {
      KILN_ASSIGN_OR_RETURN(zero_grad, zeros(1, 2));
    }
    return zero_grad;
  };
  KILN_ASSIGN_OR_RETURN(Value* dh_last, final_grad(1));
  KILN_ASSIGN_OR_RETURN(Value* dc_last, final_grad(2));

  // Backward, last step first: (dh, dc; dy, i, o, f, z, c, tanh c') -> (dh_prev, dc_prev; d pre-activations).
  Body bwd(base + ".bwd", opset);
  Value* dh = bwd.input("dh", dt, step);
  Value* dc = bwd.input("dc", dt, step);
  std::vector<Value*> in;
  for (const char* name : {"dy", "i", "o", "f", "z", "c", "tc"}) in.push_back(bwd.input(name, dt, step));
  Value* one = bwd.constant(one_t);
  Value *dyv = in[0], *i = in[1], *o = in[2], *f = in[3], *z = in[4], *cprev = in[5], *tanh_c = in[6];
  Value* dht = bwd.op("Add", {dh, dyv});
  Value* d_o = bwd.op("Mul", {dht, tanh_c});
  Value* dtanh = bwd.op("Sub", {one, bwd.op("Mul", {tanh_c, tanh_c})});
  Value* dct = bwd.op("Add", {dc, bwd.op("Mul", {bwd.op("Mul", {dht, o}), dtanh})});
  auto sigmoid_grad = [&](Value* d, Value* s) { return bwd.op("Mul", {d, bwd.op("Mul", {s, bwd.op("Sub", {one, s})})}); };
  Value* dai = sigmoid_grad(bwd.op("Mul", {dct, z}), i);
  Value* dao = sigmoid_grad(d_o, o);
  Value* daf = sigmoid_grad(bwd.op("Mul", {dct, cprev}), f);
  Value* daz = bwd.op("Mul", {bwd.op("Mul", {dct, i}), bwd.op("Sub", {one, bwd.op("Mul", {z, z})})});
  Value* dpre = bwd.op("Concat", {dai, dao, daf, daz}, {{"axis", Attribute::of_int(1)}});
  Value* dh_prev = bwd.op("MatMul", {dpre, bwd.capture(r2)});
  Value* dc_prev = bwd.op("Mul", {dct, f});
  std::shared_ptr<Graph> bwd_body = bwd.finish({dh_prev, dc_prev, dpre});
  std::vector<Value*> bwd_in = {dh_last, dc_last, dy};
  for (size_t k = 2; k <= 7; ++k) bwd_in.push_back(kept[k]);
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> back,
                        b.add("Scan", bwd_in,
                              {{"body", Attribute::of_graph(bwd_body)},
                               {"num_scan_inputs", Attribute::of_int(7)},
                               {"scan_input_directions", Attribute::of_ints(std::vector<int64_t>(7, 1))},
                               {"scan_output_directions", Attribute::of_ints({1})}},
                              3));
  Value* dg = back[2];  // [T, B, 4H], in time order

  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* dx, b.add1("MatMul", {dg, w2}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(0, dx));
  }
  KILN_ASSIGN_OR_RETURN(Value* dg_rows, rows(dg, 4 * h));
  KILN_ASSIGN_OR_RETURN(Value* dg_t, transpose(dg_rows));
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* x_rows, rows(x, in_size));
    KILN_ASSIGN_OR_RETURN(Value* dw, b.add1("MatMul", {dg_t, x_rows}));
    KILN_ASSIGN_OR_RETURN(dw, unsqueeze0(dw));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, dw));
  }
  if (b.wants(2)) {
    KILN_ASSIGN_OR_RETURN(Value* h_rows, rows(kept[8], h));
    KILN_ASSIGN_OR_RETURN(Value* dr, b.add1("MatMul", {dg_t, h_rows}));
    KILN_ASSIGN_OR_RETURN(dr, unsqueeze0(dr));
    KILN_RETURN_IF_ERROR(b.set_input_grad(2, dr));
  }
  if (input(3) != nullptr && b.wants(3)) {
    KILN_ASSIGN_OR_RETURN(Value* db, b.reduce_sum(dg_rows, {0}, false));
    KILN_ASSIGN_OR_RETURN(Value* both, b.add1("Concat", {db, db}, {{"axis", Attribute::of_int(0)}}));
    KILN_ASSIGN_OR_RETURN(both, unsqueeze0(both));
    KILN_RETURN_IF_ERROR(b.set_input_grad(3, both));
  }
  if (input(5) != nullptr && b.wants(5)) {
    KILN_ASSIGN_OR_RETURN(Value* d, unsqueeze0(back[0]));
    KILN_RETURN_IF_ERROR(b.set_input_grad(5, d));
  }
  if (input(6) != nullptr && b.wants(6)) {
    KILN_ASSIGN_OR_RETURN(Value* d, unsqueeze0(back[1]));
    KILN_RETURN_IF_ERROR(b.set_input_grad(6, d));
  }
  return Status::ok();
}

}  // namespace kiln::ops
