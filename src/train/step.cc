// make_training_step: parameters to inputs, gradients, clipping, the update.
#include "train/step.h"

#include <algorithm>
#include <iterator>

#include "ops/registry.h"
#include "train/autodiff.h"

namespace kiln::train {

namespace {

bool is_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// The update's arithmetic: each node's types inferred as it is added.
class Emitter {
 public:
  explicit Emitter(Graph& g) : g_(g) {
    ctx_.graph = &g;
    ctx_.bounds = g.bounds;
    ctx_.next_fresh = 1 << 21;  // past inference's and autodiff's fresh symbols
  }
  Result<Value*> op(const std::string& type, const std::vector<Value*>& in,
                    const std::map<std::string, Attribute>& attrs = {}, const std::string& domain = "") {
    Node* n = g_.add_node(type, in, {g_.unique_name("train." + type)}, domain);
    for (const auto& [k, a] : attrs) n->set_attr(k, a);
    KILN_RETURN_IF_ERROR(ops::infer_node(*n, ctx_));
    return n->output(0);
  }
  Value* scalar(double v, DType t) {
    Tensor s(t, {});
    s.set_f64(0, v);
    return g_.add_constant(g_.unique_name("train.const"), std::move(s));
  }
  // a * x + b * y, a and b numbers.
  Result<Value*> lerp(double a, Value* x, double b, Value* y) {
    KILN_ASSIGN_OR_RETURN(Value* ax, op("Mul", {x, scalar(a, x->dtype())}));
    KILN_ASSIGN_OR_RETURN(Value* by, op("Mul", {y, scalar(b, y->dtype())}));
    return op("Add", {ax, by});
  }

 private:
  Graph& g_;
  ops::InferContext ctx_;
};

// TrainOptions::loss_kind over the model output `o.prediction` against a new
// input `o.target`: the mean over the elements.
Result<Value*> append_loss(Graph& g, const TrainOptions& o) {
  if (std::find(std::begin(kLossKinds), std::end(kLossKinds), o.loss_kind) == std::end(kLossKinds))
    return invalid_argument() << "loss kind '" << o.loss_kind << "': Kiln has mse, l1, bce and cross_entropy";
  if (g.outputs().empty()) return invalid_argument() << "the model has no output to compute a loss of";
  Value* y = g.outputs()[0];
  if (!o.prediction.empty()) {
    auto it = std::find_if(g.outputs().begin(), g.outputs().end(), [&](Value* v) { return v->name() == o.prediction; });
    if (it == g.outputs().end()) return invalid_argument() << "prediction: the model has no output '" << o.prediction << "'";
    y = *it;
  }
  if (!is_float(y->dtype()) || !y->type().has_shape())
    return invalid_argument() << "the " << o.loss_kind << " loss needs a float output of known rank; '" << y->name()
                              << "' is " << y->type().to_string();
  if (g.find_value(o.target) != nullptr)
    return invalid_argument() << "target: the model already has a value named '" << o.target << "'";
  Emitter e(g);
  const DType dt = y->dtype();
  auto mean = [&](Value* v) { return e.op("ReduceMean", {v}, {{"keepdims", Attribute::of_int(0)}}); };
  if (o.loss_kind == "cross_entropy") {
    auto opset = g.opsets.find("");
    if (opset == g.opsets.end() || opset->second < 12)
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

}  // namespace

Status make_training_step(Graph& g, const TrainOptions& o) {
  if (o.optimizer != "sgd" && o.optimizer != "adam" && o.optimizer != "adamw")
    return invalid_argument() << "optimizer '" << o.optimizer << "': Kiln has sgd, adam and adamw";
  if (o.nesterov && (o.optimizer != "sgd" || o.momentum <= 0))
    return invalid_argument() << "nesterov needs the sgd optimizer with a momentum above 0";
  if (o.momentum < 0 || o.weight_decay < 0 || o.clip_norm < 0 || o.eps < 0 || o.beta1 < 0 || o.beta1 >= 1 ||
      o.beta2 < 0 || o.beta2 >= 1)
    return invalid_argument() << "momentum, weight_decay, clip_norm and eps must be >= 0, beta1 and beta2 in [0, 1)";
  Value* loss = nullptr;
  if (!o.loss_kind.empty()) {
    KILN_ASSIGN_OR_RETURN(loss, append_loss(g, o));
  } else {
    loss = g.find_value(o.loss);
    if (loss == nullptr) return invalid_argument() << "loss: the model has no value '" << o.loss << "'";
    if (!is_float(loss->dtype())) return invalid_argument() << "loss '" << o.loss << "' is not f32 or f64";
  }
  const DType dt = loss->dtype();

  // Running statistics of BatchNormalizations in training form whose updated
  // values the node outputs: constants that become inputs of their own names
  // and outputs "<name>.next", never parameters.
  std::vector<std::pair<Value*, Value*>> running;  // (constant, its update)
  for (Node* n : g.nodes()) {
    if (n->op_type() != "BatchNormalization" || !n->domain().empty() || n->attr_int("training_mode", 0) == 0) continue;
    for (size_t i = 1; i < 3 && i < n->num_outputs(); ++i) {
      Value* r = n->num_inputs() > i + 2 ? n->input(i + 2) : nullptr;
      if (n->output(i) != nullptr && r != nullptr && r->is_constant() && r->uses().size() == 1)
        running.push_back({r, n->output(i)});
    }
  }
  auto is_running = [&](const Value* v) {
    return std::any_of(running.begin(), running.end(), [&](const auto& r) { return r.first == v; });
  };
  // Parameters: constants that become inputs of their own names.
  std::vector<Value*> consts;
  if (o.params.empty()) {
    for (Value* c : g.constants())
      if (is_float(c->dtype()) && !c->uses().empty() && c->constant().numel() >= 2 && !is_running(c))
        consts.push_back(c);
  } else {
    for (const std::string& name : o.params) {
      Value* v = g.find_value(name);
      if (v == nullptr || !v->is_constant())
        return invalid_argument() << "params: '" << name << "' is not an initializer of the model";
      if (!is_float(v->dtype())) return invalid_argument() << "params: '" << name << "' is not f32 or f64";
      consts.push_back(v);
    }
  }
  auto to_input = [&](Value* c) {
    const std::string name = c->name();
    g.rename_value(c, g.unique_name(name + ".initial"));
    Value* p = g.add_input(name, c->type());
    g.replace_all_uses(c, p);
    return p;
  };
  std::vector<Value*> params;
  for (Value* c : consts) {
    if (is_running(c)) return invalid_argument() << "params: '" << c->name() << "' is a running statistic of a "
                                                    "BatchNormalization in training form (updated, not trained)";
    params.push_back(to_input(c));
  }
  std::vector<std::pair<Value*, std::string>> running_out;
  for (auto& [c, update] : running) {
    Value* in = to_input(c);
    running_out.push_back({update, in->name() + ".next"});
  }
  Value* lr = g.add_input(kLearningRateInput, TensorType{dt, Shape{}});
  Value* step = g.add_input(kStepInput, TensorType{dt, Shape{}});

  KILN_ASSIGN_OR_RETURN(std::vector<Value*> grads, append_gradients(g, loss, params));
  Emitter e(g);
  Value* reported = loss;
  if (o.data_parallel) {
    for (Value*& gr : grads) {
      KILN_ASSIGN_OR_RETURN(gr, e.op("AllReduceMean", {gr}, {}, "kiln"));
    }
    KILN_ASSIGN_OR_RETURN(reported, e.op("AllReduceMean", {loss}, {}, "kiln"));
    // The step's loss output keeps its name: the process's own loss is renamed.
    if (o.loss_kind.empty()) {
      const std::string name = loss->name();
      g.rename_value(loss, g.unique_name(name + ".local"));
      g.rename_value(reported, name);
    }
  }
  // L2 weight decay (SGD, Adam): into the gradient. AdamW decays the weights.
  if (o.weight_decay > 0 && o.optimizer != "adamw")
    for (size_t i = 0; i < params.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(grads[i], e.lerp(1, grads[i], o.weight_decay, params[i]));
    }
  if (o.clip_norm > 0 && !params.empty()) {
    // coef = min(1, max_norm / (||g|| + 1e-6)) over all gradients together.
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
    KILN_ASSIGN_OR_RETURN(Value* ratio, e.op("Div", {e.scalar(o.clip_norm, dt), denom}));
    KILN_ASSIGN_OR_RETURN(Value* coef, e.op("Min", {ratio, e.scalar(1, dt)}));
    for (Value*& gr : grads) {
      KILN_ASSIGN_OR_RETURN(gr, e.op("Mul", {gr, coef}));
    }
  }

  std::vector<std::pair<Value*, std::string>> outputs = {{reported, o.loss_kind.empty() ? "" : kLossOutput}};
  std::vector<std::pair<Value*, std::string>> state_out;
  for (size_t i = 0; i < params.size(); ++i) {
    Value* p = params[i];
    Value* gr = grads[i];
    Value* delta = gr;  // p' = p - lr * delta
    if (o.optimizer == "sgd" && o.momentum > 0) {
      Value* v = g.add_input(p->name() + kMomentumSuffix, p->type());
      KILN_ASSIGN_OR_RETURN(Value* v2, e.lerp(o.momentum, v, 1, gr));
      state_out.push_back({v2, v->name() + ".next"});
      delta = v2;
      if (o.nesterov) {
        KILN_ASSIGN_OR_RETURN(delta, e.lerp(1, gr, o.momentum, v2));
      }
    } else if (o.optimizer != "sgd") {
      Value* m = g.add_input(p->name() + kAdamMSuffix, p->type());
      Value* v = g.add_input(p->name() + kAdamVSuffix, p->type());
      KILN_ASSIGN_OR_RETURN(Value* m2, e.lerp(o.beta1, m, 1 - o.beta1, gr));
      KILN_ASSIGN_OR_RETURN(Value* g2, e.op("Mul", {gr, gr}));
      KILN_ASSIGN_OR_RETURN(Value* v2, e.lerp(o.beta2, v, 1 - o.beta2, g2));
      state_out.push_back({m2, m->name() + ".next"});
      state_out.push_back({v2, v->name() + ".next"});
      // Bias corrections 1 - beta^step.
      KILN_ASSIGN_OR_RETURN(Value* b1t, e.op("Pow", {e.scalar(o.beta1, dt), step}));
      KILN_ASSIGN_OR_RETURN(Value* b2t, e.op("Pow", {e.scalar(o.beta2, dt), step}));
      KILN_ASSIGN_OR_RETURN(Value* c1, e.op("Sub", {e.scalar(1, dt), b1t}));
      KILN_ASSIGN_OR_RETURN(Value* c2, e.op("Sub", {e.scalar(1, dt), b2t}));
      KILN_ASSIGN_OR_RETURN(Value* mhat, e.op("Div", {m2, c1}));
      KILN_ASSIGN_OR_RETURN(Value* vhat, e.op("Div", {v2, c2}));
      KILN_ASSIGN_OR_RETURN(Value* root, e.op("Sqrt", {vhat}));
      KILN_ASSIGN_OR_RETURN(Value* den, e.op("Add", {root, e.scalar(o.eps, dt)}));
      KILN_ASSIGN_OR_RETURN(delta, e.op("Div", {mhat, den}));
    }
    Value* base = p;
    if (o.optimizer == "adamw" && o.weight_decay > 0) {
      // p * (1 - lr * wd)
      KILN_ASSIGN_OR_RETURN(Value* lwd, e.op("Mul", {lr, e.scalar(o.weight_decay, dt)}));
      KILN_ASSIGN_OR_RETURN(Value* keep, e.op("Sub", {e.scalar(1, dt), lwd}));
      KILN_ASSIGN_OR_RETURN(base, e.op("Mul", {p, keep}));
    }
    KILN_ASSIGN_OR_RETURN(Value* step_size, e.op("Mul", {delta, lr}));
    KILN_ASSIGN_OR_RETURN(Value* next, e.op("Sub", {base, step_size}));
    outputs.push_back({next, p->name() + ".next"});
  }
  outputs.insert(outputs.end(), state_out.begin(), state_out.end());
  outputs.insert(outputs.end(), running_out.begin(), running_out.end());
  std::vector<Value*> outs;
  for (auto& [v, name] : outputs) {
    if (!name.empty()) {
      if (g.find_value(name) != nullptr) return invalid_argument() << "the model already has a value named '" << name << "'";
      g.rename_value(v, name);
    }
    outs.push_back(v);
  }
  g.set_outputs(outs);
  g.remove_dead_values();
  return Status::ok();
}

}  // namespace kiln::train
