// The stages of compilation that belong to the driver (support check, graph
// passes, kernel choice, measurement for --select=measure); compile.cc calls
// them in order with the other folders' stages.
#include "driver/pipeline.h"
#include "train/algorithm.h"
#include "train/autodiff.h"
#include "train/step.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "driver/compile.h"
#include "driver/database_source.h"
#include "kernels/kernels.h"
#include "ops/registry.h"
#include "partition/partition.h"
#include "passes/default_pipeline.h"
#include "passes/pass_manager.h"
#include "strategy/strategy.h"

namespace kiln::driver {

namespace {

// Walks a graph and its nested graphs.
void for_each_node(const Graph& g, const std::function<void(const Node*)>& f) {
  for (const Node* n : g.nodes()) {
    f(n);
    for (const auto& [name, a] : n->attrs()) {
      if (a.g) for_each_node(*a.g, f);
      for (const auto& sub : a.graphs)
        if (sub) for_each_node(*sub, f);
    }
  }
}

}  // namespace

bool fusion_enabled(const CompileOptions& o) {
  return !o.naive && std::find(o.disable_passes.begin(), o.disable_passes.end(), "fuse-elementwise") ==
                         o.disable_passes.end();
}

Result<std::string> lowered_kernels_text(Graph& g, const CompileOptions& options) {
  KILN_ASSIGN_OR_RETURN(partition::Partition parts, partition::partition_graph(g, g.bounds, fusion_enabled(options)));
  KILN_ASSIGN_OR_RETURN(kernels::KernelSet ks, kernels::define_kernels(parts, g.bounds));
  KILN_RETURN_IF_ERROR(kernels::schedule_kernels(ks, options.naive));
  KILN_RETURN_IF_ERROR(kernels::lower_kernels(ks, options.dump_ir));
  return kernels::kernels_text(ks);
}

Result<std::string> fused_groups_text(Graph& g, const CompileOptions& options) {
  KILN_ASSIGN_OR_RETURN(partition::Partition parts, partition::partition_graph(g, g.bounds, fusion_enabled(options)));
  std::ostringstream os;
  for (const partition::FusedGroup& grp : parts.top().groups) {
    os << "group %" << grp.nodes.back()->output(0)->name() << ":";
    for (const Node* n : grp.nodes) os << " " << n->op_type();
    os << "\n";
  }
  return os.str();
}

Status check_supported(const Graph& g) {
  // Op semantics are implemented up to the newest ai.onnx opset of the pinned
  // onnx package; a newer model may rely on semantics Kiln does not know.
  if (auto it = g.opsets.find(""); it != g.opsets.end() && it->second > kNewestOnnxOpset)
    return unsupported() << g.source << ": ai.onnx opset " << it->second << " is newer than the newest Kiln knows ("
                         << kNewestOnnxOpset << ")";
  std::map<std::string, std::vector<std::string>> missing;  // op -> node names
  for_each_node(g, [&](const Node* n) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    bool ok = def != nullptr && (def->lower || def->kernel || def->is_view || def->expanded_by_autodiff ||
                                  partition::is_control_flow(n));
    if (!ok) {
      std::string op = n->domain().empty() ? n->op_type() : n->domain() + ":" + n->op_type();
      missing[op].push_back(n->name().empty() ? "<unnamed>" : n->name());
    }
  });
  if (missing.empty()) return Status::ok();
  std::ostringstream os;
  os << g.source << ": " << missing.size() << " unsupported op" << (missing.size() > 1 ? "s" : "") << ": ";
  bool first = true;
  for (const auto& [op, nodes] : missing) {
    os << (first ? "" : "; ") << op << " (node" << (nodes.size() > 1 ? "s" : "") << " ";
    for (size_t i = 0; i < nodes.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << nodes[i] << "'";
    if (nodes.size() > 5) os << ", ... " << nodes.size() << " in all";
    os << ")";
    first = false;
  }
  return unsupported() << os.str();
}

std::vector<std::string> pipeline_for(const CompileOptions& options) {
  std::vector<std::string> list = options.passes ? *options.passes : passes::default_pipeline(options.naive);
  std::vector<std::string> out;
  for (const std::string& p : list)
    if (std::find(options.disable_passes.begin(), options.disable_passes.end(), p) == options.disable_passes.end())
      out.push_back(p);
  return passes::with_shape_inference(out);
}

namespace {

// CompileOptions::prefer_impls as a choice source: the first preferred
// candidate that applies to a node, with its default knobs where not given.
class PreferredImpls : public strategy::ChoiceSource {
 public:
  explicit PreferredImpls(std::vector<std::pair<std::string, std::optional<tir::Knobs>>> prefs)
      : prefs_(std::move(prefs)) {}
  std::string name() const override { return "--impl"; }
  bool strict() const override { return true; }
  std::optional<strategy::Choice> lookup(const Node& n, const std::vector<const strategy::Candidate*>& applicable,
                                         const Target& target) override {
    for (const auto& [name, knobs] : prefs_) {
      for (const strategy::Candidate* c : applicable) {
        if (c->name != name) continue;
        strategy::Choice ch;
        ch.candidate = name;
        // Knobs given override the candidate's defaults; those not given keep them.
        ch.knobs = c->default_knobs ? c->default_knobs(n, target) : tir::Knobs{};
        if (knobs)
          for (const auto& [k, v] : *knobs) ch.knobs[k] = v;
        ch.source = "preferred";
        ch.why = "--impl " + name;
        return ch;
      }
    }
    return std::nullopt;
  }

 private:
  std::vector<std::pair<std::string, std::optional<tir::Knobs>>> prefs_;
};

Result<std::shared_ptr<strategy::ChoiceSource>> preferred_source(const std::vector<std::string>& prefs) {
  std::vector<std::pair<std::string, std::optional<tir::Knobs>>> parsed;
  for (const std::string& p : prefs) {
    size_t colon = p.find(':');
    std::string name = p.substr(0, colon);
    if (strategy::find_candidate(name) == nullptr) {
      std::string known;
      for (const strategy::Candidate* c : strategy::all_candidates()) known += (known.empty() ? "" : ", ") + c->name;
      return invalid_argument() << "unknown implementation '" << name << "' (known: " << known << ")";
    }
    std::optional<tir::Knobs> knobs;
    if (colon != std::string::npos) {
      auto k = tir::parse_knobs(p.substr(colon + 1));
      if (!k.is_ok()) return k.status().with_context("implementation '" + p + "'");
      knobs = *k;
    }
    parsed.emplace_back(name, knobs);
  }
  return std::shared_ptr<strategy::ChoiceSource>(std::make_shared<PreferredImpls>(std::move(parsed)));
}

Tensor random_input(const TensorType& t, uint32_t seed) {
  std::vector<int64_t> dims;
  for (const Expr& d : *t.shape) dims.push_back(*d.as_const());
  Tensor x(t.dtype, dims);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (t.dtype == DType::kFloat32)
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = dist(rng);
  return x;
}

// Compiles node `n` alone under `choice` (its constants copied, the other
// inputs random) and returns the median seconds of a few runs. Errors for a
// node whose input shapes are not all constants.
Result<double> measure_choice(const Graph& parent, const Node& n, const strategy::Choice& choice,
                              const CompileOptions& options) {
  auto g = std::make_unique<Graph>();
  g->source = parent.source + " (measuring " + choice.candidate + ")";
  g->opsets = parent.opsets;
  std::vector<Value*> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v == nullptr) {
      ins.push_back(nullptr);
      continue;
    }
    if (v->is_constant()) {
      ins.push_back(g->add_constant(v->name(), v->constant()));
      continue;
    }
    const TensorType& t = v->type();
    if (!t.shape) return unsupported() << "input '" << v->name() << "' has unknown rank";
    for (const Expr& d : *t.shape)
      if (!d.as_const()) return unsupported() << "input '" << v->name() << "' has a symbolic shape";
    ins.push_back(g->add_input(v->name(), t));
    feeds.push_back(random_input(t, static_cast<uint32_t>(feeds.size() + 1)));
  }
  std::vector<std::string> outs;
  for (const Value* o : n.outputs()) outs.push_back(o ? o->name() : "");
  Node* m = g->add_node(n.op_type(), ins, outs, n.domain(), n.name());
  for (const auto& [k, a] : n.attrs())
    if (k.rfind("kiln_", 0) != 0) m->set_attr(k, a);
  std::vector<Value*> gouts;
  for (Value* o : m->outputs()) gouts.push_back(o);
  g->set_outputs(gouts);
  ops::InferContext ictx;
  ictx.graph = g.get();
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ictx));
  strategy::record_choice(*m, choice);
  const strategy::Candidate* c = strategy::find_candidate(choice.candidate);
  if (c && c->transform) KILN_RETURN_IF_ERROR(c->transform(*g, *m, choice.knobs));
  g->remove_dead_values();
  // The transform may have changed the node's constants: their types again.
  ops::InferContext again;
  again.graph = g.get();
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, again));
  CompileOptions o = options;
  o.dump_ir = false;
  o.train.reset();
  KILN_ASSIGN_OR_RETURN(CompiledProgram p, compile_chosen(*g, again.bounds, o));
  runtime::VM vm(p.program, resolve_threads(options.threads));
  vm.set_memory_limit(options.max_memory_bytes);
  KILN_RETURN_IF_ERROR(vm.run(feeds).status());
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(vm.run(feeds).status());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What a measurement of `choice` on `n` depends on: the op, its attributes,
// its inputs' types and which are constants, and the choice. Not the names
// (two convolutions of one shape in a model are one measurement) nor the
// constants' values (timings do not depend on them).
std::string measure_key(const Node& n, const strategy::Choice& choice) {
  Graph g;
  std::vector<Value*> ins;
  std::string constness;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    constness += v == nullptr ? '-' : v->is_constant() ? 'c' : 'x';
    ins.push_back(v == nullptr ? nullptr : g.add_input("in" + std::to_string(i), v->type()));
  }
  std::vector<std::string> outs;
  for (size_t i = 0; i < n.num_outputs(); ++i) outs.push_back(n.output(i) ? "out" + std::to_string(i) : "");
  Node* m = g.add_node(n.op_type(), ins, outs, n.domain(), "");
  for (const auto& [k, a] : n.attrs())
    if (k.rfind("kiln_", 0) != 0) m->set_attr(k, a);
  return print_graph(g) + "\n" + constness + " " + choice.candidate + " " + tir::knobs_to_string(choice.knobs);
}

}  // namespace

TensorInfo make_info(const Value* v) {
  TensorInfo info;
  info.name = v->name();
  info.dtype = v->dtype();
  if (v->type().shape)
    for (const Expr& d : *v->type().shape) info.dims.push_back(print_expr(d));
  return info;
}


static Result<strategy::SelectOptions> select_options(const Graph& g, const CompileOptions& options) {
  strategy::SelectOptions so;
  so.threads = resolve_threads(options.threads);
  if (!options.prefer_impls.empty()) {
    KILN_ASSIGN_OR_RETURN(auto src, preferred_source(options.prefer_impls));
    so.sources.push_back(src);
  }
  if (options.select == "measure") {
    // One measurement per workload and choice: block-layout and
    // select-kernels ask for the same ones, and a model repeats its shapes.
    auto cache = std::make_shared<std::map<std::string, double>>();
    so.measure = [&g, options, cache](const Node& n, const strategy::Choice& c) -> Result<double> {
      std::string key = measure_key(n, c);
      if (auto it = cache->find(key); it != cache->end()) return it->second;
      KILN_ASSIGN_OR_RETURN(double t, measure_choice(g, n, c, options));
      cache->emplace(std::move(key), t);
      return t;
    };
  } else if (options.select != "priority") {
    return invalid_argument() << "select must be 'priority' or 'measure', not '" << options.select << "'";
  }
  return so;
}

Result<passes::PassContext> pass_context(const Graph& g, const CompileOptions& options, passes::Evaluator* evaluator) {
  passes::PassContext ctx;
  ctx.infer.bounds = g.bounds;
  ctx.evaluator = evaluator;
  KILN_ASSIGN_OR_RETURN(ctx.select, select_options(g, options));
  return ctx;
}

namespace {
// The pass list `options` asks for, split into the graph passes and whether
// kernel choice (the pass select-kernels, last in the default pipeline)
// follows them as its own stage.
std::pair<std::vector<std::string>, bool> split_pass_list(const CompileOptions& options) {
  std::vector<std::string> list = pipeline_for(options);
  bool choose = !list.empty() && list.back() == kKernelChoicePass;
  if (choose) list.pop_back();
  return {list, choose};
}
}  // namespace

Status append_requested_gradients(Graph& g, const CompileOptions& options) {
  // ai.onnx.preview.training:Gradient nodes of the model's graph first.
  bool gradient_ops = false;
  for_each_node(g, [&](const Node* n) {
    gradient_ops |= n->op_type() == "Gradient" && n->domain() == train::kTrainingDomain;
  });
  if (gradient_ops) {
    ops::InferContext ctx;
    ctx.graph = &g;
    ctx.bounds = g.bounds;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(g, ctx));
    KILN_RETURN_IF_ERROR(train::expand_gradient_ops(g));
  }
  if (options.train) {
    if (!options.gradient_of.empty()) return invalid_argument() << "train and gradient_of exclude each other";
    ops::InferContext ctx;
    ctx.graph = &g;
    ctx.bounds = g.bounds;
    KILN_RETURN_IF_ERROR(ops::infer_shapes(g, ctx));
    if (options.train->model_algorithm) return train::make_step_from_training_info(g, options.train->data_parallel);
    return train::make_training_step(g, *options.train);
  }
  if (options.gradient_of.empty()) {
    if (!options.gradient_wrt.empty()) return invalid_argument() << "gradient_wrt is given without gradient_of";
    return Status::ok();
  }
  ops::InferContext ctx;
  ctx.graph = &g;
  ctx.bounds = g.bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(g, ctx));
  Value* loss = g.find_value(options.gradient_of);
  if (loss == nullptr) return invalid_argument() << "gradient_of: the model has no value '" << options.gradient_of << "'";
  std::vector<Value*> params;
  if (options.gradient_wrt.empty()) {
    for (Value* c : g.constants())
      if (!c->uses().empty() && train::differentiable_dtype(c->dtype())) params.push_back(c);
  } else {
    for (const std::string& name : options.gradient_wrt) {
      Value* v = g.find_value(name);
      if (v == nullptr) return invalid_argument() << "gradient_wrt: the model has no value '" << name << "'";
      params.push_back(v);
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Value*> grads, train::append_gradients(g, loss, params));
  std::vector<Value*> outputs = g.outputs();
  for (size_t i = 0; i < params.size(); ++i) {
    Value* grad = grads[i];
    // A gradient that is a parameter's own value or another output's gets its own name through an Identity.
    bool taken = grad->is_constant() || grad->producer() == nullptr ||
                 std::find(outputs.begin(), outputs.end(), grad) != outputs.end();
    const std::string name = g.unique_name(params[i]->name() + "_grad");
    if (taken) {
      Node* id = g.add_node("Identity", {grad}, {name});
      id->output(0)->set_type(grad->type());
      grad = id->output(0);
    } else {
      g.rename_value(grad, name);
    }
    outputs.push_back(grad);
  }
  g.set_outputs(outputs);
  return Status::ok();
}

Status run_graph_passes(Graph& g, const CompileOptions& options, passes::PassContext& ctx) {
  return passes::run_passes(g, split_pass_list(options).first, ctx).status();
}

Result<std::shared_ptr<db::Database>> compile_database(const CompileOptions& options) {
  if (options.no_db) return std::shared_ptr<db::Database>();
  std::string where = options.db;
  if (where.empty()) {
    const char* env = std::getenv("KILN_DB");
    if (env && std::string(env) == "off") return std::shared_ptr<db::Database>();
    where = db::default_database_path();
    // The default file is asked only where it exists; a named one must exist.
    std::error_code ec;
    if ((env == nullptr || *env == '\0') && !std::filesystem::exists(where, ec)) return std::shared_ptr<db::Database>();
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<db::Database> database, db::open_database(where, false));
  return std::shared_ptr<db::Database>(std::move(database));
}

namespace {
// --tune-missing: the source's misses become jobs naming the model's file.
Status queue_misses(const Graph& g, db::Database& database, const DatabaseSource& source, const CompileOptions& options) {
  std::vector<db::JobSpec> jobs = source.misses();
  std::error_code ec;
  if (jobs.empty() && source.symbolic_misses() == 0) return Status::ok();
  if (g.source.empty() || !std::filesystem::is_regular_file(g.source, ec)) {
    std::fprintf(stderr, "kiln: %zu kernel%s no tuning record; not queued (the model was not read from a file)\n",
                 jobs.size(), jobs.size() == 1 ? " has" : "s have");
    return Status::ok();
  }
  const std::string model = std::filesystem::absolute(g.source, ec).string();
  for (db::JobSpec& j : jobs) j.model = model;
  auto queued_or = database.enqueue(jobs);
  if (!queued_or.is_ok()) return queued_or.status().with_context("tuning database: --tune-missing");
  const int64_t queued = *queued_or;
  std::fprintf(stderr, "kiln: %zu kernel%s no tuning record at %d thread%s: %lld queued in %s", jobs.size(),
               jobs.size() == 1 ? " has" : "s have", resolve_threads(options.threads),
               resolve_threads(options.threads) == 1 ? "" : "s",
               static_cast<long long>(queued), database.location().c_str());
  if (source.symbolic_misses() > 0)
    std::fprintf(stderr, " (%d more have symbolic shapes: kiln tune --dim binds them)", source.symbolic_misses());
  std::fprintf(stderr, "; kiln tune-worker --db %s tunes them\n", database.location().c_str());
  return Status::ok();
}
}  // namespace

Status choose_kernels(Graph& g, const CompileOptions& options, passes::PassContext& ctx,
                      std::map<const Node*, std::string>* workload_keys) {
  if (!split_pass_list(options).second) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<db::Database> database, compile_database(options));
  std::shared_ptr<DatabaseSource> source;
  if (database || workload_keys) {
    // Keyed before the choice: on the weights before any candidate's transform.
    std::vector<kernels::GroupWorkload> workloads =
        kernels::candidate_workloads(g, ctx.infer.bounds, fusion_enabled(options));
    if (workload_keys)
      for (const kernels::GroupWorkload& gw : workloads) (*workload_keys)[gw.anchor] = gw.workload.key;
    if (database) {
      source = std::make_shared<DatabaseSource>(database, g, std::move(workloads), resolve_threads(options.threads));
      ctx.select.sources.push_back(source);
    }
  }
  Status st = passes::run_passes(g, {kKernelChoicePass}, ctx).status();
  if (st.is_ok() && (source || workload_keys)) {
    for (kernels::GroupWorkload& gw :
         kernels::generic_workloads(g, ctx.infer.bounds, fusion_enabled(options), /*before_choice=*/false)) {
      if (workload_keys) (*workload_keys)[gw.anchor] = gw.workload.key;
      // Kernels without a candidate: the database's point of their generic
      // space, on each group's last node (define_kernels reads it).
      if (source)
        if (auto c = source->lookup_generic(gw, ctx.select.target)) strategy::record_generic_choice(*gw.group.back(), *c);
    }
  }
  if (source) {
    ctx.select.sources.pop_back();
    if (!source->error().is_ok()) return source->error().with_context("tuning database");
    if (st.is_ok() && options.tune_missing) KILN_RETURN_IF_ERROR(queue_misses(g, *database, *source, options));
  }
  return st;
}

Result<OptimizedGraph> optimize_graph(Graph& g, const CompileOptions& options, const std::vector<std::string>& pipeline,
                                      const passes::Instrumentation& inst) {
  KILN_RETURN_IF_ERROR(check_supported(g));
  KernelEvaluator evaluator(options);
  KILN_ASSIGN_OR_RETURN(passes::PassContext ctx, pass_context(g, options, &evaluator));
  OptimizedGraph out;
  KILN_ASSIGN_OR_RETURN(out.runs, passes::run_passes(g, pipeline, ctx, inst));
  out.bounds = ctx.infer.bounds;
  return out;
}

}  // namespace kiln::driver
