// The compiler on one screen: every stage, in order, as one plain call. Each
// stage lives in its own folder or file; docs/architecture.md lists the same
// stages (tests/unit/driver_stages_test.cc compares the list with what a
// compile reports in CompileStats::stages).
#include "driver/compile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "bytecode/bytecode.h"
#include "codegen/llvm/jit.h"
#include "frontend/onnx/import.h"
#include "kernels/kernels.h"
#include "ops/registry.h"
#include "partition/partition.h"
#include "tune/features.h"

namespace kiln::driver {

namespace {

// Times consecutive stages: each call ends the running stage and starts the next.
class StageClock {
 public:
  // `on_stage` (may be null or empty) hears each stage as it starts.
  explicit StageClock(std::vector<std::pair<std::string, double>>* out,
                      const std::function<void(const std::string&)>* on_stage = nullptr)
      : out_(out), on_stage_(on_stage) {}
  ~StageClock() { stop(); }
  void operator()(const char* stage) {
    stop();
    if (on_stage_ != nullptr && *on_stage_) (*on_stage_)(stage);
    name_ = stage;
    t0_ = std::chrono::steady_clock::now();
  }
  void stop() {
    if (name_ == nullptr || out_ == nullptr) return;
    out_->emplace_back(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    name_ = nullptr;
  }

 private:
  std::vector<std::pair<std::string, double>>* out_;
  const std::function<void(const std::string&)>* on_stage_;
  const char* name_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
};

// Stage "code generation": every kernel's loop IR through LLVM into one module.
Result<std::shared_ptr<codegen::CompiledModule>> generate_code(const kernels::KernelSet& ks, const CompileOptions& options,
                                                              const std::string& source) {
  if (ks.kernels.empty()) return std::shared_ptr<codegen::CompiledModule>();
  std::vector<tir::PrimFunc> funcs;
  for (const kernels::Kernel& k : ks.kernels) funcs.push_back(k.func);
  codegen::CodegenOptions copts;
  copts.dump_ir = options.dump_ir;
  auto module = codegen::compile(funcs, copts);
  if (!module.is_ok()) return module.status().with_context("code generation for " + source);
  return std::shared_ptr<codegen::CompiledModule>(std::move(*module));
}

// Stage "checkpointing": a training step's input-only calls (weights
// transformed for the backward) moved to their first use, and under a
// memory budget forward values recomputed in the backward
// (bytecode/checkpoint.cc), each kernel's
// compute estimated from its loop IR (the cost model's counts of loads,
// stores and arithmetic).
Status checkpoint_step(bytecode::Bytecode& bc, const kernels::KernelSet& ks, const CompileOptions& options,
                       const std::string& source, CompileStats* stats) {
  if (!options.train) return Status::ok();
  bytecode::sink_input_only_calls(bc);
  bytecode::hoist_output_calls(bc);
  if (options.train->memory_budget == 0) return Status::ok();  // a negative one is checkpoint()'s error
  bytecode::CheckpointOptions o;
  o.budget = options.train->memory_budget;
  o.policy = options.train->checkpoint_policy;
  const std::vector<std::string>& names = tune::feature_names();
  auto index = [&](const char* name) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const size_t counts[] = {index("store_iters"), index("load_iters"), index("arith_ops")};
  std::vector<double> kernel_cost;
  for (const kernels::Kernel& k : ks.kernels) {
    std::vector<float> f = tune::kernel_features(k.func, k.info.impl, k.info.knobs, 1, Target::host());
    double c = 0;
    for (size_t i : counts) c += i < f.size() ? std::exp2(static_cast<double>(f[i])) - 1 : 0;
    kernel_cost.push_back(c);
  }
  for (const auto& [kernel, syms] : bc.entries)
    o.entry_cost.push_back(kernel >= 0 && static_cast<size_t>(kernel) < kernel_cost.size()
                               ? kernel_cost[static_cast<size_t>(kernel)]
                               : 0);
  auto report = bytecode::checkpoint(bc, o);
  if (!report.is_ok()) return source.empty() ? report.status() : report.status().with_context(source);
  stats->unbudgeted_activation_bytes = report->before.activation_bytes();
  stats->recomputed_segments = report->segments;
  stats->recomputed_values = report->singles;
  stats->recomputed_calls = report->recomputed_calls;
  stats->recompute_share = report->forward_cost > 0 ? report->recompute_cost / report->forward_cost : 0;
  return Status::ok();
}

// The kernels' cached scratch (support/scratch.h keeps blocks per thread and
// size): per size, the most any kernel holds at once, on every thread where
// a parallel loop allocates it.
int64_t scratch_bytes(const kernels::KernelSet& ks, int threads) {
  std::map<int64_t, tir::ScratchUse> sizes;
  for (const kernels::Kernel& k : ks.kernels)
    for (const tir::ScratchUse& u : tir::heap_scratch(k.func)) {
      tir::ScratchUse& s = sizes[u.bytes];
      s.count = std::max(s.count, u.count);
      s.per_thread = s.per_thread || u.per_thread;
    }
  int64_t total = 0;
  for (const auto& [bytes, u] : sizes) total += bytes * u.count * (u.per_thread ? std::max(threads, 1) : 1);
  return total;
}

}  // namespace

Result<CompiledProgram> compile_model(const ModelSource& source, const CompileOptions& options,
                                      const std::function<void(Graph&)>& adjust) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, double>> stages;
  StageClock stage(&stages, &options.on_stage);
  stage("import");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, source.path.empty() ? import_onnx_bytes(source.bytes, source.name)
                                                                       : import_onnx_file(source.path));
  if (adjust) adjust(*g);
  stage.stop();
  KILN_ASSIGN_OR_RETURN(CompiledProgram out, compile_graph(std::move(g), options));
  stages.insert(stages.end(), out.stats.stages.begin(), out.stats.stages.end());
  out.stats.stages = std::move(stages);
  out.stats.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<CompiledProgram> compile_graph(std::unique_ptr<Graph> g, const CompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  const int nodes_imported = static_cast<int>(g->num_nodes());
  std::vector<std::pair<std::string, double>> stages;
  StageClock stage(&stages, &options.on_stage);
  KernelEvaluator evaluator(options);  // constant folding's

  stage("support check");
  KILN_RETURN_IF_ERROR(check_supported(*g));
  stage("gradients");
  KILN_RETURN_IF_ERROR(append_requested_gradients(*g, options));
  KILN_ASSIGN_OR_RETURN(passes::PassContext ctx, pass_context(*g, options, &evaluator));
  stage("graph passes");
  KILN_RETURN_IF_ERROR(run_graph_passes(*g, options, ctx));
  stage("kernel choice");
  std::map<const Node*, std::string> workload_keys;
  KILN_RETURN_IF_ERROR(choose_kernels(*g, options, ctx, &workload_keys));
  stage.stop();
  if (options.dump_ir) std::fprintf(stderr, "%s\n", print_graph(*g).c_str());
  KILN_ASSIGN_OR_RETURN(CompiledProgram out, compile_chosen(*g, ctx.infer.bounds, options, &stages, &workload_keys));

  out.stats.num_nodes_imported = nodes_imported;
  out.stats.num_nodes = static_cast<int>(g->num_nodes());
  out.stats.stages = std::move(stages);
  out.graph = std::move(g);
  out.stats.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<CompiledProgram> compile_chosen(Graph& g, const SymbolBounds& bounds, const CompileOptions& options,
                                       std::vector<std::pair<std::string, double>>* stages,
                                       const std::map<const Node*, std::string>* workload_keys) {
  auto t0 = std::chrono::steady_clock::now();
  // Stages are heard only from the model's own compile (which keeps them),
  // not from constant folding's or a measurement's.
  StageClock stage(stages, stages != nullptr ? &options.on_stage : nullptr);
  CompiledProgram out;

  stage("partition");
  KILN_ASSIGN_OR_RETURN(partition::Partition parts, partition::partition_graph(g, bounds, fusion_enabled(options)));
  stage("kernel definitions");
  KILN_ASSIGN_OR_RETURN(kernels::KernelSet ks, kernels::define_kernels(parts, bounds));
  stage("schedules");
  KILN_RETURN_IF_ERROR(kernels::schedule_kernels(ks, options.naive));
  if (workload_keys)
    for (kernels::Kernel& k : ks.kernels)
      if (auto it = workload_keys->find(k.anchor ? k.anchor : k.root); it != workload_keys->end())
        k.info.workload = it->second;
  stage("loop IR lowering");
  KILN_RETURN_IF_ERROR(kernels::lower_kernels(ks, options.dump_ir));
  stage("code generation");
  KILN_ASSIGN_OR_RETURN(out.module, generate_code(ks, options, g.source));
  stage("bytecode");
  KILN_ASSIGN_OR_RETURN(bytecode::Bytecode bc, bytecode::build_bytecode(parts, ks, bounds));
  stage("checkpointing");
  KILN_RETURN_IF_ERROR(checkpoint_step(bc, ks, options, g.source, &out.stats));
  stage("memory plan");
  bytecode::plan_memory(bc);
  const bytecode::MemoryUse memory = bytecode::memory_use(bc);
  stage("link");
  KILN_RETURN_IF_ERROR(bytecode::link_kernels(bc, ks, [&](const std::string& name) { return out.module->lookup(name); }));
  stage.stop();

  for (const Value* v : g.inputs())
    if (!v->is_constant()) out.inputs.push_back(make_info(v));
  for (const Value* v : g.outputs()) out.outputs.push_back(make_info(v));
  for (const kernels::Kernel& k : ks.kernels) {
    out.kernel_choices.push_back(k.info);
    out.funcs.push_back(k.func);
  }
  const partition::GraphPartition& top = parts.top();
  for (const auto& [node, kind] : top.kind) {
    switch (kind) {
      case partition::NodeKind::kSkip: out.node_runs[node] = "dead"; break;
      case partition::NodeKind::kView: out.node_runs[node] = "view"; break;
      case partition::NodeKind::kHost: out.node_runs[node] = "host kernel"; break;
      case partition::NodeKind::kShape: out.node_runs[node] = "shape"; break;
      case partition::NodeKind::kControl: out.node_runs[node] = "control flow"; break;
      case partition::NodeKind::kCompiled: break;
    }
  }
  for (const partition::FusedGroup& group : top.groups) {
    auto call = ks.calls.find(&group);
    if (call == ks.calls.end() || call->second.kernel < 0) continue;
    for (const Node* n : group.nodes) out.node_runs[n] = ks.kernels[static_cast<size_t>(call->second.kernel)].func.name;
  }
  out.kernel_choices.insert(out.kernel_choices.end(), bc.host_choices.begin(), bc.host_choices.end());
  out.stats.num_kernels = static_cast<int>(ks.kernels.size());
  out.stats.num_runtime_kernels = bc.num_host_calls;
  out.stats.arena_bytes = bc.program->static_plan ? bc.program->arena_bytes : 0;
  out.stats.memory_known = memory.known;
  out.stats.activation_bytes = memory.activation_bytes();
  out.stats.output_bytes = memory.output_bytes;
  out.stats.peak_at = memory.peak_at;
  out.stats.peak_values = memory.peak_values;
  out.stats.scratch_bytes = scratch_bytes(ks, resolve_threads(options.threads));
  out.stats.peak_bytes = memory.peak_bytes + out.stats.scratch_bytes;
  out.program = std::move(bc.program);
  out.stats.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

KernelEvaluator::KernelEvaluator(CompileOptions options) : options_(std::move(options)) {
  options_.dump_ir = false;
  options_.train.reset();
  options_.on_stage = nullptr;
}

Result<std::vector<Tensor>> KernelEvaluator::evaluate(std::unique_ptr<Graph> g) {
  ops::InferContext ictx;
  ictx.graph = g.get();
  ictx.bounds = g->bounds;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ictx));
  KILN_ASSIGN_OR_RETURN(CompiledProgram p, compile_chosen(*g, ictx.bounds, options_));
  runtime::VM vm(p.program, 1);
  vm.set_memory_limit(options_.max_memory_bytes);
  return vm.run({});
}

}  // namespace kiln::driver
