// ONNX's standard training form: Gradient's expansion, the step of a model's
// own training algorithm, and the algorithm Kiln writes (algorithm.h).
#include "train/algorithm.h"

#include <algorithm>
#include <set>

#include "graph/copy.h"
#include "ops/registry.h"
#include "train/autodiff.h"
#include "train/step.h"
#include "train/update.h"

namespace kiln::train {

namespace {

bool is_gradient(const Node* n) { return n->op_type() == "Gradient" && n->domain() == kTrainingDomain; }

std::vector<std::string> strings_attr(const Node& n, const std::string& key) {
  const Attribute* a = n.attr(key);
  return a != nullptr && a->kind == Attribute::Kind::kStrings ? a->strings : std::vector<std::string>{};
}

// A Gradient node within a subgraph of `g`'s nodes, or null.
const Node* nested_gradient(const Graph& g) {
  for (const Node* n : g.nodes())
    for (const auto& [key, a] : n->attrs()) {
      std::vector<std::shared_ptr<Graph>> subs = a.graphs;
      if (a.g) subs.push_back(a.g);
      for (const auto& sg : subs) {
        if (sg == nullptr) continue;
        for (const Node* m : sg->nodes())
          if (is_gradient(m)) return m;
        if (const Node* m = nested_gradient(*sg)) return m;
      }
    }
  return nullptr;
}

Status infer(Graph& g) {
  ops::InferContext ctx;
  ctx.graph = &g;
  ctx.bounds = g.bounds;
  return ops::infer_shapes(g, ctx);
}

// Copies the nodes, inputs and initializers of `alg` into `g`, keeping their
// names; `alg`'s captures read `g`'s values of their names.
Status inline_algorithm(Graph& g, const Graph& alg) {
  std::map<const Value*, Value*> map;
  auto fresh = [&](const std::string& name) -> Status {
    if (g.find_value(name) != nullptr)
      return invalid_model() << g.source << ": the training algorithm defines '" << name
                             << "', which the model's graph defines too";
    return Status::ok();
  };
  for (const Value* c : alg.captures()) {
    Value* outer = g.find_value(c->name());
    if (outer == nullptr)
      return invalid_model() << g.source << ": the training algorithm reads '" << c->name() << "', which nothing defines";
    map[c] = outer;
  }
  for (const Value* in : alg.inputs()) {
    if (in->is_constant()) continue;
    KILN_RETURN_IF_ERROR(fresh(in->name()));
    map[in] = g.add_input(in->name(), in->type());
  }
  for (const Value* c : alg.constants()) {
    KILN_RETURN_IF_ERROR(fresh(c->name()));
    map[c] = g.add_constant(c->name(), c->constant());
  }
  for (const Node* m : alg.nodes())
    for (const Value* o : m->outputs())
      if (o != nullptr) KILN_RETURN_IF_ERROR(fresh(o->name()));
  return copy_nodes(alg, g, map, [](const Value* v) { return v->name(); });
}


}  // namespace

Status expand_gradient_ops(Graph& g, bool data_parallel) {
  if (const Node* n = nested_gradient(g))
    return unsupported() << g.source << ": " << n->describe() << ": Kiln expands Gradient in the top-level graph only";
  std::vector<Node*> gradients;
  for (Node* n : g.nodes())
    if (is_gradient(n)) gradients.push_back(n);
  if (gradients.empty()) return Status::ok();
  for (Node* n : gradients) {
    const std::vector<std::string> xs = strings_attr(*n, "xs"), zs = strings_attr(*n, "zs");
    const Attribute* y_attr = n->attr("y");
    const std::string where = g.source.empty() ? n->describe() : g.source + ": " + n->describe();
    if (xs.empty() || y_attr == nullptr || y_attr->kind != Attribute::Kind::kString)
      return invalid_model() << where << ": Gradient needs the attributes xs (names) and y (a name)";
    if (n->num_outputs() != xs.size())
      return invalid_model() << where << ": " << n->num_outputs() << " outputs for " << xs.size() << " names in xs";
    std::vector<std::string> fed = xs;
    fed.insert(fed.end(), zs.begin(), zs.end());
    if (n->num_inputs() != fed.size())
      return invalid_model() << where << ": " << n->num_inputs() << " inputs for the " << fed.size()
                             << " names in xs and zs";
    std::vector<Value*> params;
    for (size_t i = 0; i < fed.size(); ++i) {
      Value* named = g.find_value(fed[i]);
      if (named == nullptr) return invalid_model() << where << ": the graph has no value '" << fed[i] << "'";
      if (n->input(i) != named)
        return unsupported() << where << ": input " << i << " is '" << (n->input(i) ? n->input(i)->name() : "")
                             << "', not '" << fed[i] << "' itself; Kiln differentiates at the named values";
      if (i < xs.size()) params.push_back(named);
    }
    Value* y = g.find_value(y_attr->s);
    if (y == nullptr) return invalid_model() << where << ": the graph has no value '" << y_attr->s << "' (y)";
    Value* loss = y;
    if (!y->type().has_shape() || !y->type().is_static() || y->type().numel().as_const() != 1) {
      // The gradient of y's sum: a seed of ones.
      Emitter e(g);
      KILN_ASSIGN_OR_RETURN(loss, e.op("ReduceSum", {y}, {{"keepdims", Attribute::of_int(0)}}));
    }
    auto grads = append_gradients(g, loss, params);
    if (!grads.is_ok()) return grads.status().with_context(where);
    Emitter e(g);
    std::vector<std::string> names;
    std::vector<Node*> ids;
    for (size_t k = 0; k < xs.size(); ++k) {
      Value* gr = (*grads)[k];
      if (data_parallel) {
        KILN_ASSIGN_OR_RETURN(gr, e.op("AllReduceMean", {gr}, {}, "kiln"));
      }
      // The gradient under the output's name: an Identity, since one value
      // may be the gradient of several xs (or a constant zero).
      Value* out = n->output(k);
      names.push_back(out->name());
      Node* id = g.add_node("Identity", {gr}, {g.unique_name(out->name() + ".grad")});
      id->output(0)->set_type(gr->type());
      g.replace_all_uses(out, id->output(0));
      ids.push_back(id);
    }
    g.remove_node(n);
    for (size_t k = 0; k < ids.size(); ++k) g.rename_value(ids[k]->output(0), names[k]);
  }
  KILN_RETURN_IF_ERROR(g.topo_sort());
  return infer(g);
}

Status infer_training_types(Graph& g) {
  for (TrainingInfo& info : g.training_info)
    for (Graph* part : {info.algorithm.get(), info.initialization.get()}) {
      if (part == nullptr) continue;
      for (Value* c : part->captures()) {
        const Value* outer = g.find_value(c->name());
        if (outer == nullptr)
          return invalid_model() << g.source << ": the training algorithm reads '" << c->name() << "', which nothing defines";
        c->set_type(outer->type());
      }
      part->opsets = g.opsets;
      ops::InferContext ctx;
      ctx.graph = part;
      ctx.bounds = g.bounds;
      Status st = ops::infer_shapes(*part, ctx);
      if (!st.is_ok()) return st.with_context("the training algorithm");
    }
  return Status::ok();
}

const Tensor* training_initializer(const Graph& g, const std::string& name) {
  const Value* v = g.find_value(name);
  if (v == nullptr && g.training_info.size() == 1 && g.training_info[0].algorithm != nullptr)
    v = g.training_info[0].algorithm->find_value(name);
  return v != nullptr && v->is_constant() ? &v->constant() : nullptr;
}

Status make_step_from_training_info(Graph& g, bool data_parallel) {
  if (g.training_info.empty())
    return invalid_argument() << g.source << ": the model has no training algorithm (ONNX training_info)";
  if (g.training_info.size() > 1)
    return unsupported() << g.source << ": the model has " << g.training_info.size()
                         << " training algorithms; Kiln runs a model with one";
  TrainingInfo info = std::move(g.training_info[0]);
  g.training_info.clear();
  if (info.algorithm == nullptr) return invalid_model() << g.source << ": the training algorithm has no graph";
  const Graph& alg = *info.algorithm;
  KILN_RETURN_IF_ERROR(inline_algorithm(g, alg));
  // Each bound initializer becomes an input of its name (before inference,
  // which would take it for a constant), its update an output "<name>.next".
  // An initializer the initialization graph sets but no step updates is
  // state too (fed, and output unchanged).
  std::vector<std::pair<std::string, std::string>> bindings = info.update_binding;
  for (const auto& entry : info.initialization_binding) {
    const std::string& init = entry.first;
    if (std::none_of(bindings.begin(), bindings.end(), [&](const auto& b) { return b.first == init; }))
      bindings.push_back({init, init});
  }
  std::vector<Value*> updates;
  std::set<std::string> bound_outputs;
  for (const auto& [init, out] : bindings) {
    Value* update = g.find_value(out);
    if (update == nullptr) return internal_error() << "training algorithm: the output '" << out << "' went missing";
    updates.push_back(update);
    bound_outputs.insert(out);
  }
  for (size_t i = 0; i < bindings.size(); ++i) {
    const std::string& init = bindings[i].first;
    Value* c = g.find_value(init);
    if (c == nullptr || !c->is_constant())
      return invalid_model() << g.source << ": update_binding names '" << init << "', which is not an initializer";
    if (const Value* taken = g.find_value(init + ".next"); taken != nullptr && taken != updates[i])
      return invalid_argument() << g.source << ": the model already has a value named '" << init << ".next'";
    g.rename_value(c, g.unique_name(init + ".initial"));
    Value* p = g.add_input(init, c->type());
    g.replace_all_uses(c, p);
    for (Value*& u : updates)
      if (u == c) u = p;
  }
  KILN_RETURN_IF_ERROR(g.topo_sort());
  KILN_RETURN_IF_ERROR(infer(g));
  // The loss: the y of the algorithm's first Gradient node.
  std::string loss_name;
  for (const Node* n : alg.nodes())
    if (is_gradient(n)) {
      const Attribute* y = n->attr("y");
      if (y != nullptr && y->kind == Attribute::Kind::kString) loss_name = y->s;
      break;
    }
  if (loss_name.empty()) return invalid_model() << g.source << ": the training algorithm has no Gradient node";
  KILN_RETURN_IF_ERROR(expand_gradient_ops(g, data_parallel));
  Value* loss = g.find_value(loss_name);
  if (loss == nullptr) return internal_error() << "training algorithm: the loss '" << loss_name << "' went missing";
  Value* reported = loss;
  if (data_parallel) {
    Emitter e(g);
    KILN_ASSIGN_OR_RETURN(reported, e.op("AllReduceMean", {loss}, {}, "kiln"));
    g.rename_value(loss, g.unique_name(loss_name + ".local"));
    g.rename_value(reported, loss_name);
  }
  std::vector<Value*> next;
  std::set<const Value*> renamed;
  for (size_t i = 0; i < bindings.size(); ++i) {
    const std::string next_name = bindings[i].first + ".next";
    Value* update = updates[i];
    if (update->producer() != nullptr && !renamed.count(update) && update != reported) {
      if (update->name() != next_name) g.rename_value(update, next_name);
      renamed.insert(update);
      next.push_back(update);
    } else {
      Node* id = g.add_node("Identity", {update}, {next_name});
      id->output(0)->set_type(update->type());
      next.push_back(id->output(0));
    }
  }
  std::vector<Value*> outs = {reported};
  for (const Value* o : alg.outputs())
    if (!bound_outputs.count(o->name()) && o->name() != loss_name) {
      Value* v = g.find_value(o->name());
      if (v != nullptr) outs.push_back(v);
    }
  outs.insert(outs.end(), next.begin(), next.end());
  g.set_outputs(outs);
  g.remove_dead_values();
  KILN_RETURN_IF_ERROR(g.topo_sort());
  return infer(g);
}

Status attach_training_algorithm(Graph& g, const TrainOptions& o, const std::map<std::string, Tensor>& state) {
  KILN_RETURN_IF_ERROR(check_options(o));
  auto alg = std::make_shared<Graph>();
  alg->name = "training";
  alg->bounds = g.bounds;
  alg->opsets = g.opsets;
  auto cap = [&](const Value* v) {
    Value* c = alg->find_value(v->name());
    return c != nullptr ? c : alg->add_capture(v->name(), v->type());
  };
  // Names the algorithm must have: none may be the model's.
  auto claim = [&](const std::string& name) -> Status {
    if (g.find_value(name) != nullptr || alg->find_value(name) != nullptr)
      return invalid_argument() << "the model already has a value named '" << name << "'";
    return Status::ok();
  };
  Emitter e(*alg);
  Value* loss = nullptr;
  if (!o.loss_kind.empty()) {
    KILN_ASSIGN_OR_RETURN(Value* y, prediction_output(g, o));
    if (g.find_value(o.target) != nullptr)
      return invalid_argument() << "target: the model already has a value named '" << o.target << "'";
    auto opset = g.opsets.find("");
    KILN_ASSIGN_OR_RETURN(loss, append_loss(*alg, cap(y), o, opset == g.opsets.end() ? 0 : opset->second));
    KILN_RETURN_IF_ERROR(claim(kLossOutput));
    alg->rename_value(loss, kLossOutput);
  } else {
    Value* l = g.find_value(o.loss);
    if (l == nullptr) return invalid_argument() << "loss: the model has no value '" << o.loss << "'";
    if (!is_float(l->dtype())) return invalid_argument() << "loss '" << o.loss << "' is not f32 or f64";
    loss = cap(l);
  }
  const DType dt = loss->dtype();
  KILN_ASSIGN_OR_RETURN(Trainables t, trainables(g, o));
  auto initial = [&](const std::string& name, const Value* like) -> Result<Tensor> {
    auto it = state.find(name);
    if (it == state.end()) return Tensor(like->dtype(), like->type().static_shape());
    if (it->second.dtype() != like->dtype() || it->second.shape() != like->type().static_shape())
      return invalid_argument() << "'" << name << "' is " << it->second.describe() << ", not "
                                << like->type().to_string();
    return it->second;
  };

  std::vector<Value*> params;
  std::vector<std::string> xs, grad_names;
  for (const Value* p : t.params) {
    params.push_back(cap(p));
    xs.push_back(p->name());
    grad_names.push_back(alg->unique_name(p->name() + ".grad"));
  }
  std::map<std::string, Attribute> gattrs = {{"xs", Attribute::of_strings(xs)}, {"y", Attribute::of_string(loss->name())}};
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> grads, e.op_n("Gradient", params, grad_names, gattrs, kTrainingDomain));

  KILN_RETURN_IF_ERROR(claim(kLearningRateInput));
  Value* lr = alg->add_input(kLearningRateInput, TensorType{dt, Shape{}});
  KILN_RETURN_IF_ERROR(claim(kIterationsInitializer));
  Tensor count(DType::kInt64, {});
  if (auto it = state.find(kIterationsInitializer); it != state.end()) {
    if (it->second.dtype() != DType::kInt64 || it->second.numel() != 1)
      return invalid_argument() << "'" << kIterationsInitializer << "' is " << it->second.describe() << ", not i64[]";
    count.data_as<int64_t>()[0] = it->second.data_as<int64_t>()[0];
  }
  Value* iterations = alg->add_constant(kIterationsInitializer, std::move(count));
  Tensor one(DType::kInt64, {});
  one.data_as<int64_t>()[0] = 1;
  KILN_ASSIGN_OR_RETURN(Value* step, e.op("Add", {iterations, alg->add_constant(alg->unique_name("train.one"), one)}));

  if (o.weight_decay > 0 && o.optimizer != "adamw")
    for (size_t i = 0; i < params.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(grads[i], e.lerp(1, grads[i], o.weight_decay, params[i]));
    }
  if (o.clip_norm > 0) KILN_RETURN_IF_ERROR(clip_by_global_norm(e, grads, o.clip_norm, dt));

  std::vector<std::pair<Value*, std::string>> outputs = {{loss, ""}};  // (value, name it gets)
  std::vector<std::pair<std::string, std::string>> bindings;
  auto state_initializer = [&](const Value* p, const char* suffix) -> Result<Value*> {
    const std::string name = p->name() + suffix;
    KILN_RETURN_IF_ERROR(claim(name));
    KILN_ASSIGN_OR_RETURN(Tensor v, initial(name, p));
    return alg->add_constant(name, std::move(v));
  };
  std::vector<std::pair<Value*, std::string>> state_out;
  if (o.optimizer == "sgd" && o.momentum > 0) {
    // One Momentum node over every parameter: R, T, X..., G..., V....
    std::vector<Value*> in = {lr, step};
    in.insert(in.end(), params.begin(), params.end());
    in.insert(in.end(), grads.begin(), grads.end());
    std::vector<std::string> names;
    for (const Value* p : params) names.push_back(p->name() + ".next");
    for (const Value* p : params) {
      KILN_ASSIGN_OR_RETURN(Value* v, state_initializer(p, kMomentumSuffix));
      in.push_back(v);
      names.push_back(v->name() + ".next");
    }
    for (const std::string& n : names) KILN_RETURN_IF_ERROR(claim(n));
    std::map<std::string, Attribute> attrs = {{"alpha", Attribute::of_float(o.momentum)},
                                              {"beta", Attribute::of_float(1.0)},
                                              {"mode", Attribute::of_string(o.nesterov ? "nesterov" : "standard")},
                                              {"norm_coefficient", Attribute::of_float(0.0)}};
    KILN_ASSIGN_OR_RETURN(std::vector<Value*> outs, e.op_n("Momentum", in, names, attrs, kTrainingDomain));
    for (size_t i = 0; i < params.size(); ++i) {
      outputs.push_back({outs[i], ""});
      bindings.push_back({params[i]->name(), outs[i]->name()});
      state_out.push_back({outs[params.size() + i], ""});
      bindings.push_back({in[2 + 2 * params.size() + i]->name(), outs[params.size() + i]->name()});
    }
  } else {
    Value* step_f = nullptr;
    if (o.optimizer != "sgd") {
      KILN_ASSIGN_OR_RETURN(step_f, e.op("Cast", {step}, {{"to", Attribute::of_int(static_cast<int64_t>(dt))}}));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      Value* p = params[i];
      Value* delta = grads[i];
      if (o.optimizer != "sgd") {
        KILN_ASSIGN_OR_RETURN(Value* m, state_initializer(p, kAdamMSuffix));
        KILN_ASSIGN_OR_RETURN(Value* v, state_initializer(p, kAdamVSuffix));
        KILN_ASSIGN_OR_RETURN(AdamUpdate u, adam_update(e, m, v, grads[i], step_f, o));
        state_out.push_back({u.m, m->name() + ".next"});
        bindings.push_back({m->name(), m->name() + ".next"});
        state_out.push_back({u.v, v->name() + ".next"});
        bindings.push_back({v->name(), v->name() + ".next"});
        delta = u.direction;
      }
      KILN_ASSIGN_OR_RETURN(Value* next, apply_update(e, p, delta, lr, o));
      outputs.push_back({next, p->name() + ".next"});
      bindings.push_back({p->name(), p->name() + ".next"});
    }
  }
  outputs.insert(outputs.end(), state_out.begin(), state_out.end());
  for (const auto& [r, update] : t.running) {
    outputs.push_back({cap(update), ""});
    bindings.push_back({r->name(), update->name()});
  }
  outputs.push_back({step, std::string(kIterationsInitializer) + ".next"});
  bindings.push_back({kIterationsInitializer, std::string(kIterationsInitializer) + ".next"});

  std::vector<Value*> outs;
  for (auto& [v, name] : outputs) {
    if (!name.empty() && v->name() != name) {
      KILN_RETURN_IF_ERROR(claim(name));
      alg->rename_value(v, name);
    }
    outs.push_back(v);
  }
  alg->set_outputs(outs);
  // Emitted temporaries whose names the model's graph has too get fresh ones.
  const std::vector<Value*>& caps = alg->captures();
  for (Value* v : alg->values()) {
    if (std::find(caps.begin(), caps.end(), v) != caps.end() || g.find_value(v->name()) == nullptr) continue;
    std::string name = v->name();
    for (int k = 1; g.find_value(name) != nullptr || alg->find_value(name) != nullptr; ++k)
      name = v->name() + "." + std::to_string(k);
    alg->rename_value(v, name);
  }
  TrainingInfo info;
  info.algorithm = std::move(alg);
  info.update_binding = std::move(bindings);
  g.training_info = {std::move(info)};
  g.opsets.emplace(kTrainingDomain, 1);
  return Status::ok();
}

}  // namespace kiln::train
