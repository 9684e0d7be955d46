#include "passes/rnn_to_scan.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool is_real(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

bool present(const Node* n, size_t i) { return n->input(i) != nullptr; }

// The directions of an LSTM: forward, reverse or both (nullopt: another value).
std::optional<std::vector<bool>> reversed_directions(const Node* n) {
  std::string d = n->attr_string("direction", "forward");
  if (d == "forward") return std::vector<bool>{false};
  if (d == "reverse") return std::vector<bool>{true};
  if (d == "bidirectional") return std::vector<bool>{false, true};
  return std::nullopt;
}

// Gates per op: LSTM i, o, f, c; GRU z, r, h; RNN one.
int64_t gates_of(const Node* n) {
  return is_op(n, "LSTM") ? 4 : is_op(n, "GRU") ? 3 : is_op(n, "RNN") ? 1 : 0;
}

// The default activations per direction: LSTM (Sigmoid, Tanh, Tanh), GRU
// (Sigmoid, Tanh), RNN (Tanh).
std::vector<std::string> default_activation_names(int64_t gates) {
  if (gates == 4) return {"Sigmoid", "Tanh", "Tanh"};
  if (gates == 3) return {"Sigmoid", "Tanh"};
  return {"Tanh"};
}

bool default_activations(const Node* n, size_t dirs, int64_t gates) {
  if (n->has_attr("activation_alpha") || n->has_attr("activation_beta")) return false;
  const Attribute* a = n->attr("activations");
  if (a == nullptr) return true;
  const std::vector<std::string> want = default_activation_names(gates);
  if (a->kind != Attribute::Kind::kStrings || a->strings.size() != want.size() * dirs) return false;
  for (size_t i = 0; i < a->strings.size(); ++i)
    if (a->strings[i] != want[i % want.size()]) return false;
  return true;
}

bool applies(const Graph& g, const Node* n) {
  const int64_t gates = gates_of(n);
  if (gates == 0 || n->has_attr("kiln_projected_input")) return false;
  auto opset = g.opsets.find("");
  if (opset != g.opsets.end() && opset->second < 9) return false;  // Scan of opset 8 is batched
  auto dirs = reversed_directions(n);
  if (!dirs || !default_activations(n, dirs->size(), gates)) return false;
  if (n->has_attr("clip") || n->attr_int("input_forget", 0) != 0 || n->attr_int("layout", 0) != 0) return false;
  if (present(n, 4) || (gates == 4 && present(n, 7))) return false;  // sequence_lens, LSTM peepholes
  const Value* x = n->input(0);
  const Tensor* w = constant_of(n->input(1));
  const Tensor* r = constant_of(n->input(2));
  if (x == nullptr || w == nullptr || r == nullptr || !is_real(w->dtype()) || x->dtype() != w->dtype() ||
      r->dtype() != w->dtype() || w->rank() != 3 || r->rank() != 3 || x->type().rank() != 3)
    return false;
  const int64_t nd = static_cast<int64_t>(dirs->size()), h = r->shape()[2];
  if (h < 1 || w->shape()[0] != nd || w->shape()[1] != gates * h || r->shape()[0] != nd ||
      r->shape()[1] != gates * h || w->numel() == 0)
    return false;
  if (n->attr_int("hidden_size", h) != h) return false;
  auto in = (*x->type().shape)[2].as_const();
  if (!in || *in != w->shape()[2]) return false;
  if (present(n, 3)) {
    const Tensor* b = constant_of(n->input(3));
    if (b == nullptr || b->dtype() != w->dtype() || b->shape() != std::vector<int64_t>{nd, 2 * gates * h})
      return false;
  }
  const size_t states = gates == 4 ? 2 : 1;
  for (size_t i = 5; i < 5 + states; ++i) {
    const Value* st = n->input(i);
    if (st != nullptr && (st->dtype() != w->dtype() || st->type().rank() != 3)) return false;
  }
  return true;
}

// Rows [r0, r1) of direction d's R [G*H, H], transposed: [H, r1 - r0].
Tensor transposed_rows(const Tensor& r, int64_t d, int64_t r0, int64_t r1) {
  const int64_t gh = r.shape()[1], h = r.shape()[2];
  const size_t es = dtype_size(r.dtype());
  Tensor out(r.dtype(), {h, r1 - r0});
  const char* src = static_cast<const char*>(r.data()) + (d * gh + r0) * h * es;
  char* dst = static_cast<char*>(out.data());
  for (int64_t i = 0; i < r1 - r0; ++i)
    for (int64_t j = 0; j < h; ++j) std::memcpy(dst + (j * (r1 - r0) + i) * es, src + (i * h + j) * es, es);
  return out;
}

// Elements [from, from + count) of direction d's half `half` (0: Wb, 1: Rb)
// of B [nd, 2 * G * H], or zeros without B.
Tensor bias_part(const Node* n, DType dt, int64_t gh, int64_t d, int64_t half, int64_t from, int64_t count) {
  Tensor out(dt, {count});
  if (const Tensor* b = constant_of(n->input(3)))
    for (int64_t k = 0; k < count; ++k) out.set_f64(k, b->get_f64(d * 2 * gh + half * gh + from + k));
  return out;
}

// Builds one step of direction d as a Scan body: inputs are the states
// ([B, H] each) and the projected step p [B, G*H]; outputs the new states and
// the new h again as the scan output.
class StepBuilder {
 public:
  StepBuilder(const Graph& g, const std::string& base, DType dt) : base_(base), dt_(dt) {
    body_ = std::make_shared<Graph>();
    body_->opsets = g.opsets;
    body_->source = g.source;
  }
  Value* input(const std::string& name, const Shape& shape) {
    return body_->add_input(base_ + "." + name, TensorType{dt_, shape});
  }
  Value* constant(const std::string& name, Tensor t) { return body_->add_constant(base_ + "." + name, std::move(t)); }
  Value* op(const char* type, std::vector<Value*> ins, const std::string& out) {
    return body_->add_node(type, ins, {base_ + "." + out})->output(0);
  }
  std::vector<Value*> split(Value* v, const std::vector<std::string>& outs) {
    std::vector<std::string> names;
    for (const std::string& o : outs) names.push_back(base_ + "." + o);
    Node* n = body_->add_node("Split", {v}, names);
    n->set_attr("axis", Attribute::of_int(1));
    return std::vector<Value*>(n->outputs().begin(), n->outputs().end());
  }
  std::shared_ptr<Graph> finish(std::vector<Value*> states, Value* h) {
    states.push_back(op("Identity", {h}, "y"));
    body_->set_outputs(std::move(states));
    return body_;
  }

 private:
  std::string base_;
  DType dt_;
  std::shared_ptr<Graph> body_;
};

// ONNX's step of each op (default activations), gates in ONNX order.
std::shared_ptr<Graph> step_body(const Graph& g, const Node* n, int64_t d, const Expr& batch, int64_t h, DType dt,
                                 const std::string& base) {
  const Tensor& r = n->input(2)->constant();
  const int64_t gates = gates_of(n);
  StepBuilder b(g, base, dt);
  Value* hv = b.input("h", Shape{batch, Expr(h)});
  Value* cv = gates == 4 ? b.input("c", Shape{batch, Expr(h)}) : nullptr;
  Value* pv = b.input("p", Shape{batch, Expr(gates * h)});
  if (gates == 4) {
    // g = h R^T + p; c' = f c + i z; h' = o tanh(c').
    Value* gsum = b.op("Add", {b.op("MatMul", {hv, b.constant("rt", transposed_rows(r, d, 0, 4 * h))}, "hr"), pv}, "g");
    std::vector<Value*> gt = b.split(gsum, {"gi", "go", "gf", "gz"});
    Value* i = b.op("Sigmoid", {gt[0]}, "i");
    Value* o = b.op("Sigmoid", {gt[1]}, "o");
    Value* f = b.op("Sigmoid", {gt[2]}, "f");
    Value* z = b.op("Tanh", {gt[3]}, "z");
    Value* c2 = b.op("Add", {b.op("Mul", {f, cv}, "fc"), b.op("Mul", {i, z}, "iz")}, "c2");
    Value* h2 = b.op("Mul", {o, b.op("Tanh", {c2}, "tc")}, "h2");
    return b.finish({h2, c2}, h2);
  }
  if (gates == 1) {
    // h' = tanh(h R^T + p).
    Value* h2 = b.op("Tanh", {b.op("Add", {b.op("MatMul", {hv, b.constant("rt", transposed_rows(r, d, 0, h))}, "hr"), pv}, "g")}, "h2");
    return b.finish({h2}, h2);
  }
  // GRU: z = sigmoid(pz + h Rz^T), r = sigmoid(pr + h Rr^T) (Rbz, Rbr folded into p);
  // linear_before_reset: hh = tanh(ph + r (h Rh^T + Rbh)); otherwise
  // hh = tanh(ph + (r h) Rh^T) (Rbh folded into p); h' = (1 - z) hh + z h.
  const bool lbr = n->attr_int("linear_before_reset", 0) != 0;
  std::vector<Value*> pt = b.split(pv, {"pz", "pr", "ph"});
  Value *gz, *gr, *hh;
  if (lbr) {
    Value* gsum = b.op("MatMul", {hv, b.constant("rt", transposed_rows(r, d, 0, 3 * h))}, "hr");
    std::vector<Value*> gt = b.split(gsum, {"gz", "gr", "gh"});
    gz = gt[0];
    gr = gt[1];
    Value* rbh = b.constant("rbh", bias_part(n, dt, 3 * h, d, 1, 2 * h, h));
    Value* rr = b.op("Sigmoid", {b.op("Add", {pt[1], gr}, "sr")}, "r");
    hh = b.op("Tanh", {b.op("Add", {pt[2], b.op("Mul", {rr, b.op("Add", {gt[2], rbh}, "ghb")}, "rgh")}, "sh")}, "hh");
  } else {
    Value* gzr = b.op("MatMul", {hv, b.constant("rt_zr", transposed_rows(r, d, 0, 2 * h))}, "hzr");
    std::vector<Value*> gt = b.split(gzr, {"gz", "gr"});
    gz = gt[0];
    gr = gt[1];
    Value* rr = b.op("Sigmoid", {b.op("Add", {pt[1], gr}, "sr")}, "r");
    Value* rh = b.op("Mul", {rr, hv}, "rh");
    Value* gh = b.op("MatMul", {rh, b.constant("rt_h", transposed_rows(r, d, 2 * h, 3 * h))}, "gh");
    hh = b.op("Tanh", {b.op("Add", {pt[2], gh}, "sh")}, "hh");
  }
  Value* z = b.op("Sigmoid", {b.op("Add", {pt[0], gz}, "sz")}, "z");
  Tensor one(dt, {1});
  one.set_f64(0, 1.0);
  Value* keep = b.op("Sub", {b.constant("one", std::move(one)), z}, "keep");
  Value* h2 = b.op("Add", {b.op("Mul", {keep, hh}, "nh"), b.op("Mul", {z, hv}, "zh")}, "h2");
  return b.finish({h2}, h2);
}

// The per-step bias folded into the projection, [nd * G * H]: Wb + Rb,
// except GRU's Rbh under linear_before_reset (added inside the step).
Tensor projection_bias(const Node* n, DType dt, int64_t nd, int64_t gates, int64_t h) {
  const int64_t gh = gates * h;
  const bool keep_rbh = gates == 3 && n->attr_int("linear_before_reset", 0) != 0;
  Tensor out(dt, {nd * gh});
  for (int64_t d = 0; d < nd; ++d) {
    Tensor wb = bias_part(n, dt, gh, d, 0, 0, gh), rb = bias_part(n, dt, gh, d, 1, 0, gh);
    for (int64_t k = 0; k < gh; ++k)
      out.set_f64(d * gh + k, wb.get_f64(k) + (keep_rbh && k >= 2 * h ? 0.0 : rb.get_f64(k)));
  }
  return out;
}

}  // namespace

Result<int> rnn_to_scan(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(g, n)) todo.push_back(n);
  for (Node* n : todo) {
    const std::vector<bool> dirs = *reversed_directions(n);
    const Tensor& w = n->input(1)->constant();
    const DType dt = w.dtype();
    const int64_t gates = gates_of(n), nd = static_cast<int64_t>(dirs.size()), h = n->input(2)->constant().shape()[2],
                  in = w.shape()[2], gh = gates * h;
    const size_t states = gates == 4 ? 2 : 1;
    // Names derive from the op's Y (every value made is given a unique name).
    const std::string base = n->output(0) != nullptr ? n->output(0)->name() : n->input(0)->name();
    Value* x = n->input(0);
    const Expr batch = (*x->type().shape)[1];
    // One [seq * batch, input] x [input, nd * G * H] product (a 3-D MatMul
    // would be seq products of batch rows each), viewed as [seq, batch, nd * G * H].
    Value* rows = view_as_rows(g, n, x, in, base);
    Tensor wt = transpose_tensor(w, {2, 0, 1}).reshaped({in, nd * gh});
    Value* proj = g.insert_node_before(n, "MatMul", {rows, g.add_constant(g.unique_name(base + ".wt"), std::move(wt))},
                                       {g.unique_name(base + ".proj")})
                      ->output(0);
    if (present(n, 3))
      proj = g.insert_node_before(
                  n, "Add",
                  {proj, g.add_constant(g.unique_name(base + ".bias"), projection_bias(n, dt, nd, gates, h))},
                  {g.unique_name(base + ".proj_b")})
                 ->output(0);
    proj = view_with_leading_dims(g, n, proj, x, 2, nd * gh, base + ".proj");
    std::vector<Value*> per_dir = {proj};
    if (nd > 1) {
      Node* split = g.insert_node_before(n, "Split", {proj}, {g.unique_name(base + ".p0"), g.unique_name(base + ".p1")});
      split->set_attr("axis", Attribute::of_int(2));
      per_dir = {split->output(0), split->output(1)};
    }
    // Initial states: direction d of [nd, B, H], or zeros of [B, H].
    Value* zeros = nullptr;
    auto initial = [&](size_t input, int64_t d) -> Value* {
      if (Value* st = n->input(input)) {
        Value* idx = g.add_constant(g.unique_name(base + ".d" + std::to_string(d)), int64_vector({d}).reshaped({}));
        return g.insert_node_before(n, "Gather", {st, idx}, {g.unique_name(base + ".init")})->output(0);
      }
      if (zeros != nullptr) return zeros;
      if (auto b = batch.as_const()) {
        zeros = g.add_constant(g.unique_name(base + ".zeros"), Tensor(dt, {*b, h}));
      } else {
        Value* shape = g.insert_node_before(n, "Shape", {x}, {g.unique_name(base + ".xshape")})->output(0);
        Value* one = g.add_constant(g.unique_name(base + ".one"), int64_vector({1}));
        Value* b1 = g.insert_node_before(n, "Gather", {shape, one}, {g.unique_name(base + ".batch")})->output(0);
        Value* hv = g.add_constant(g.unique_name(base + ".hidden"), int64_vector({h}));
        Node* cat = g.insert_node_before(n, "Concat", {b1, hv}, {g.unique_name(base + ".state_shape")});
        cat->set_attr("axis", Attribute::of_int(0));
        Node* fill = g.insert_node_before(n, "ConstantOfShape", {cat->output(0)}, {g.unique_name(base + ".zeros")});
        fill->set_attr("value", Attribute::of_tensor(Tensor(dt, {1})));
        zeros = fill->output(0);
      }
      return zeros;
    };
    // Per output k (Y, Y_h, Y_c): the pieces of every direction.
    std::vector<std::vector<Value*>> pieces(states + 1);
    for (int64_t d = 0; d < nd; ++d) {
      std::string db = base + ".dir" + std::to_string(d);
      std::vector<Value*> ins;
      for (size_t s = 0; s < states; ++s) ins.push_back(initial(5 + s, d));
      ins.push_back(per_dir[static_cast<size_t>(d)]);
      std::vector<std::string> outs = {g.unique_name(db + ".h")};
      if (states == 2) outs.push_back(g.unique_name(db + ".c"));
      outs.push_back(g.unique_name(db + ".y"));
      Node* scan = g.insert_node_before(n, "Scan", ins, outs);
      scan->set_attr("body", Attribute::of_graph(step_body(g, n, d, batch, h, dt, db)));
      scan->set_attr("num_scan_inputs", Attribute::of_int(1));
      if (dirs[static_cast<size_t>(d)]) {
        scan->set_attr("scan_input_directions", Attribute::of_ints({1}));
        scan->set_attr("scan_output_directions", Attribute::of_ints({1}));
      }
      pieces[0].push_back(scan->output(states));  // Y
      for (size_t s = 0; s < states; ++s) pieces[1 + s].push_back(scan->output(s));
    }
    // [.., B, H] pieces with a direction axis inserted at `axis`, concatenated along it.
    auto stack = [&](const std::vector<Value*>& parts, const std::vector<int64_t>& shape, int64_t axis,
                     const std::string& name) {
      Value* target = g.add_constant(g.unique_name(name + "_shape"), int64_vector(shape));
      std::vector<Value*> views;
      for (Value* p : parts)
        views.push_back(g.insert_node_before(n, "Reshape", {p, target}, {g.unique_name(name + ".part")})->output(0));
      if (views.size() == 1) return views[0];
      Node* cat = g.insert_node_before(n, "Concat", views, {g.unique_name(name)});
      cat->set_attr("axis", Attribute::of_int(axis));
      return cat->output(0);
    };
    for (size_t k = 0; k < pieces.size(); ++k) {
      Value* old = n->output(k);
      if (old == nullptr || (old->uses().empty() && !is_graph_output(g, old))) continue;
      Value* v = k == 0 ? stack(pieces[k], {0, 1, -1, h}, 1, base + ".Y")
                        : stack(pieces[k], {1, -1, h}, 0, base + (k == 1 ? ".Y_h" : ".Y_c"));
      if (!replace_value(g, old, v))
        return internal_error() << n->describe() << ": rnn-to-scan could not replace output " << k;
    }
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      Value* old = n->output(k);
      if (old != nullptr && (!old->uses().empty() || is_graph_output(g, old)))
        return internal_error() << n->describe() << ": rnn-to-scan left output " << k << " in use";
    }
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
