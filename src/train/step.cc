// make_training_step: parameters to inputs, gradients, clipping, the update.
#include "train/step.h"

#include <algorithm>
#include <iterator>

#include "ops/registry.h"
#include "train/autodiff.h"
#include "train/update.h"

namespace kiln::train {

Status make_training_step(Graph& g, const TrainOptions& o) {
  KILN_RETURN_IF_ERROR(check_options(o));
  Value* loss = nullptr;
  if (!o.loss_kind.empty()) {
    KILN_ASSIGN_OR_RETURN(Value* y, prediction_output(g, o));
    auto opset = g.opsets.find("");
    KILN_ASSIGN_OR_RETURN(loss, append_loss(g, y, o, opset == g.opsets.end() ? 0 : opset->second));
  } else {
    loss = g.find_value(o.loss);
    if (loss == nullptr) return invalid_argument() << "loss: the model has no value '" << o.loss << "'";
    if (!is_float(loss->dtype())) return invalid_argument() << "loss '" << o.loss << "' is not f32 or f64";
  }
  const DType dt = loss->dtype();
  // Parameters become inputs of their own names; so do the running
  // statistics, whose updates the step outputs as "<name>.next".
  KILN_ASSIGN_OR_RETURN(Trainables t, trainables(g, o));
  auto to_input = [&](Value* c) {
    const std::string name = c->name();
    g.rename_value(c, g.unique_name(name + ".initial"));
    Value* p = g.add_input(name, c->type());
    g.replace_all_uses(c, p);
    return p;
  };
  std::vector<Value*> params;
  for (Value* c : t.params) params.push_back(to_input(c));
  std::vector<std::pair<Value*, std::string>> running_out;
  for (auto& [c, update] : t.running) {
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
  if (o.clip_norm > 0) KILN_RETURN_IF_ERROR(clip_by_global_norm(e, grads, o.clip_norm, dt));

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
      KILN_ASSIGN_OR_RETURN(AdamUpdate u, adam_update(e, m, v, gr, step, o));
      state_out.push_back({u.m, m->name() + ".next"});
      state_out.push_back({u.v, v->name() + ".next"});
      delta = u.direction;
    }
    KILN_ASSIGN_OR_RETURN(Value* next, apply_update(e, p, delta, lr, o));
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
