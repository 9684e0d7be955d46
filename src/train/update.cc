// Shared pieces of training steps (update.h).
#include "train/update.h"

#include <algorithm>
#include <iterator>

#include "train/step.h"

namespace kiln::train {

bool is_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

Emitter::Emitter(Graph& g) : g_(g) {
  ctx_.graph = &g;
  ctx_.bounds = g.bounds;
  ctx_.next_fresh = 1 << 21;  // past inference's and autodiff's fresh symbols
}

Result<std::vector<Value*>> Emitter::op_n(const std::string& type, const std::vector<Value*>& in,
                                          const std::vector<std::string>& outputs,
                                          const std::map<std::string, Attribute>& attrs, const std::string& domain) {
  Node* n = g_.add_node(type, in, outputs, domain);
  for (const auto& [k, a] : attrs) n->set_attr(k, a);
  KILN_RETURN_IF_ERROR(ops::infer_node(*n, ctx_));
  return n->outputs();
}

Result<Value*> Emitter::op(const std::string& type, const std::vector<Value*>& in,
                           const std::map<std::string, Attribute>& attrs, const std::string& domain) {
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> outs, op_n(type, in, {g_.unique_name("train." + type)}, attrs, domain));
  return outs[0];
}

Value* Emitter::scalar(double v, DType t) {
  Tensor s(t, {});
  s.set_f64(0, v);
  return g_.add_constant(g_.unique_name("train.const"), std::move(s));
}

Result<Value*> Emitter::lerp(double a, Value* x, double b, Value* y) {
  KILN_ASSIGN_OR_RETURN(Value* ax, op("Mul", {x, scalar(a, x->dtype())}));
  KILN_ASSIGN_OR_RETURN(Value* by, op("Mul", {y, scalar(b, y->dtype())}));
  return op("Add", {ax, by});
}

Result<Value*> prediction_output(const Graph& g, const TrainOptions& o) {
  if (g.outputs().empty()) return invalid_argument() << "the model has no output to compute a loss of";
  if (o.prediction.empty()) return g.outputs()[0];
  auto it = std::find_if(g.outputs().begin(), g.outputs().end(), [&](Value* v) { return v->name() == o.prediction; });
  if (it == g.outputs().end()) return invalid_argument() << "prediction: the model has no output '" << o.prediction << "'";
  return *it;
}

Result<Value*> append_loss(Graph& g, Value* y, const TrainOptions& o, int64_t opset) {
  if (std::find(std::begin(kLossKinds), std::end(kLossKinds), o.loss_kind) == std::end(kLossKinds))
    return invalid_argument() << "loss kind '" << o.loss_kind << "': Kiln has mse, l1, bce and cross_entropy";
  if (!is_float(y->dtype()) || !y->type().has_shape())
    return invalid_argument() << "the " << o.loss_kind << " loss needs a float output of known rank; '" << y->name()
                              << "' is " << y->type().to_string();
  if (g.find_value(o.target) != nullptr)
    return invalid_argument() << "target: the model already has a value named '" << o.target << "'";
  Emitter e(g);
  const DType dt = y->dtype();
  auto mean = [&](Value* v) { return e.op("ReduceMean", {v}, {{"keepdims", Attribute::of_int(0)}}); };
  if (o.loss_kind == "cross_entropy") {
    if (opset < 12)
      return invalid_argument() << "the cross_entropy loss (SoftmaxCrossEntropyLoss) needs ai.onnx opset 12 or newer";
    if (y->type().rank() < 2) return invalid_argument() << "cross_entropy needs logits [N, C, ...]; '" << y->name()
                                                         << "' is " << y->type().to_string();
    Shape ts = *y->type().shape;
    ts.erase(ts.begin() + 1);
    Value* t = g.add_input(o.target, TensorType{DType::kInt64, ts});
    return e.op("SoftmaxCrossEntropyLoss", {y, t}, {{"reduction", Attribute::of_string("mean")}});
  }
  Value* t = g.add_input(o.target, y->type());
  KILN_ASSIGN_OR_RETURN(Value* d, e.op("Sub", {y, t}));
  if (o.loss_kind == "mse") {
    KILN_ASSIGN_OR_RETURN(Value* sq, e.op("Mul", {d, d}));
    return mean(sq);
  }
  if (o.loss_kind == "l1") {
    KILN_ASSIGN_OR_RETURN(Value* a, e.op("Abs", {d}));
    return mean(a);
  }
  // bce of logits x: max(x, 0) - x t + log(1 + exp(-|x|)), stable for any x.
  KILN_ASSIGN_OR_RETURN(Value* pos, e.op("Relu", {y}));
  KILN_ASSIGN_OR_RETURN(Value* xt, e.op("Mul", {y, t}));
  KILN_ASSIGN_OR_RETURN(Value* a, e.op("Abs", {y}));
  KILN_ASSIGN_OR_RETURN(Value* na, e.op("Neg", {a}));
  KILN_ASSIGN_OR_RETURN(Value* ex, e.op("Exp", {na}));
  KILN_ASSIGN_OR_RETURN(Value* one_plus, e.op("Add", {ex, e.scalar(1, dt)}));
  KILN_ASSIGN_OR_RETURN(Value* soft, e.op("Log", {one_plus}));
  KILN_ASSIGN_OR_RETURN(Value* lin, e.op("Sub", {pos, xt}));
  KILN_ASSIGN_OR_RETURN(Value* l, e.op("Add", {lin, soft}));
  return mean(l);
}

Result<Trainables> trainables(const Graph& g, const TrainOptions& o) {
  Trainables t;
  for (Node* n : g.nodes()) {
    if (n->op_type() != "BatchNormalization" || !n->domain().empty() || n->attr_int("training_mode", 0) == 0) continue;
    for (size_t i = 1; i < 3 && i < n->num_outputs(); ++i) {
      Value* r = n->num_inputs() > i + 2 ? n->input(i + 2) : nullptr;
      if (n->output(i) != nullptr && r != nullptr && r->is_constant() && r->uses().size() == 1)
        t.running.push_back({r, n->output(i)});
    }
  }
  auto is_running = [&](const Value* v) {
    return std::any_of(t.running.begin(), t.running.end(), [&](const auto& r) { return r.first == v; });
  };
  if (o.params.empty()) {
    for (Value* c : g.constants())
      if (is_float(c->dtype()) && !c->uses().empty() && c->constant().numel() >= 2 && !is_running(c))
        t.params.push_back(c);
    return t;
  }
  for (const std::string& name : o.params) {
    Value* v = g.find_value(name);
    if (v == nullptr || !v->is_constant())
      return invalid_argument() << "params: '" << name << "' is not an initializer of the model";
    if (!is_float(v->dtype())) return invalid_argument() << "params: '" << name << "' is not f32 or f64";
    if (is_running(v))
      return invalid_argument() << "params: '" << name << "' is a running statistic of a "
                                   "BatchNormalization in training form (updated, not trained)";
    t.params.push_back(v);
  }
  return t;
}

Status check_options(const TrainOptions& o) {
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw")
    return invalid_argument() << "optimizer '" << o.optimizer << "': Kiln has sgd, adam and adamw";
  if (o.nesterov && (o.optimizer != "sgd" || o.momentum <= 0))
    return invalid_argument() << "nesterov needs the sgd optimizer with a momentum above 0";
  if (o.momentum < 0 || o.weight_decay < 0 || o.clip_norm < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 ||
      o.beta2 < 0 || o.beta2 >= 1)
    return invalid_argument() << "momentum, weight_decay, clip_norm and eps must be >= 0, beta1 and beta2 in [0, 1)";
  return Status::ok();
}

Status clip_by_global_norm(Emitter& e, std::vector<Value*>& grads, double max_norm, DType dt) {
  if (grads.empty()) return Status::ok();
  Value* total = nullptr;
  for (Value* gr : grads) {
    KILN_ASSIGN_OR_RETURN(Value* sq, e.op("Mul", {gr, gr}));
    KILN_ASSIGN_OR_RETURN(Value* s, e.op("ReduceSum", {sq}, {{"keepdims", Attribute::of_int(0)}}));
    if (total == nullptr) {
      total = s;
    } else {
      KILN_ASSIGN_OR_RETURN(total, e.op("Add", {total, s}));
    }
  }
  KILN_ASSIGN_OR_RETURN(Value* norm, e.op("Sqrt", {total}));
  KILN_ASSIGN_OR_RETURN(Value* denom, e.op("Add", {norm, e.scalar(1e-6, dt)}));
  KILN_ASSIGN_OR_RETURN(Value* ratio, e.op("Div", {e.scalar(max_norm, dt), denom}));
  KILN_ASSIGN_OR_RETURN(Value* coef, e.op("Min", {ratio, e.scalar(1, dt)}));
  for (Value*& gr : grads) {
    KILN_ASSIGN_OR_RETURN(gr, e.op("Mul", {gr, coef}));
  }
  return Status::ok();
}

Result<AdamUpdate> adam_update(Emitter& e, Value* m, Value* v, Value* gr, Value* step, const TrainOptions& o) {
  const DType dt = gr->dtype();
  AdamUpdate u;
  KILN_ASSIGN_OR_RETURN(u.m, e.lerp(o.beta1, m, 1 - o.beta1, gr));
  KILN_ASSIGN_OR_RETURN(Value* g2, e.op("Mul", {gr, gr}));
  KILN_ASSIGN_OR_RETURN(u.v, e.lerp(o.beta2, v, 1 - o.beta2, g2));
  // Bias corrections 1 - beta^step.
  KILN_ASSIGN_OR_RETURN(Value* b1t, e.op("Pow", {e.scalar(o.beta1, dt), step}));
  KILN_ASSIGN_OR_RETURN(Value* b2t, e.op("Pow", {e.scalar(o.beta2, dt), step}));
  KILN_ASSIGN_OR_RETURN(Value* c1, e.op("Sub", {e.scalar(1, dt), b1t}));
  KILN_ASSIGN_OR_RETURN(Value* c2, e.op("Sub", {e.scalar(1, dt), b2t}));
  KILN_ASSIGN_OR_RETURN(Value* mhat, e.op("Div", {u.m, c1}));
  KILN_ASSIGN_OR_RETURN(Value* vhat, e.op("Div", {u.v, c2}));
  KILN_ASSIGN_OR_RETURN(Value* root, e.op("Sqrt", {vhat}));
  KILN_ASSIGN_OR_RETURN(Value* den, e.op("Add", {root, e.scalar(o.eps, dt)}));
  KILN_ASSIGN_OR_RETURN(u.direction, e.op("Div", {mhat, den}));
  return u;
}

Result<Value*> apply_update(Emitter& e, Value* p, Value* direction, Value* lr, const TrainOptions& o) {
  Value* base = p;
  if (o.optimizer == "adamw" && o.weight_decay > 0) {
    KILN_ASSIGN_OR_RETURN(Value* lwd, e.op("Mul", {lr, e.scalar(o.weight_decay, p->dtype())}));
    KILN_ASSIGN_OR_RETURN(Value* keep, e.op("Sub", {e.scalar(1, p->dtype()), lwd}));
    KILN_ASSIGN_OR_RETURN(base, e.op("Mul", {p, keep}));
  }
  KILN_ASSIGN_OR_RETURN(Value* step_size, e.op("Mul", {direction, lr}));
  return e.op("Sub", {base, step_size});
}

}  // namespace kiln::train
