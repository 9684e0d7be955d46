// The driver's stages and helpers: the support check, graph passes, kernel
// choice (with measurement for --select=measure), and the text views of the
// later stages that `kiln opt` prints. driver/compile.cc calls every stage in
// order.
#pragma once

#include <memory>
#include <map>
#include <string>
#include <vector>

#include "codegen/llvm/jit.h"
#include "db/database.h"
#include "graph/graph.h"
#include "kernels/kernels.h"
#include "kiln/kiln.h"
#include "passes/pass_manager.h"
#include "runtime/vm.h"

namespace kiln::driver {

using KernelChoiceInfo = kernels::KernelChoiceInfo;

struct CompiledProgram {
  std::unique_ptr<Graph> graph;  // after inference (types of every value)
  std::shared_ptr<runtime::Program> program;
  std::shared_ptr<codegen::CompiledModule> module;  // keeps kernel code alive
  std::vector<tir::PrimFunc> funcs;                 // every kernel's loop IR (what a package compiles again)
  std::vector<TensorInfo> inputs, outputs;
  CompileStats stats;
  std::vector<KernelChoiceInfo> kernel_choices;  // one per kernel
  // How each node of the model's graph runs: its kernel's name for a compiled
  // node, else "view", "host kernel", "shape", "control flow" or "dead".
  std::map<const Node*, std::string> node_runs;
};

// The newest ai.onnx opset whose semantics Kiln implements (that of the pinned onnx 1.17).
constexpr int64_t kNewestOnnxOpset = 22;

// The public description of a graph input or output (dims printed symbolically).
TensorInfo make_info(const Value* v);

// Lists every node whose op Kiln does not implement, in one error (and
// rejects an ai.onnx opset newer than kNewestOnnxOpset).
Status check_supported(const Graph& g);

// Stage "gradients": with options.train, the model made one training step
// (train::make_training_step); with options.gradient_of, the backward graph
// appended (train::append_gradients) and the gradients made outputs
// "<name>_grad"; nothing otherwise.
Status append_requested_gradients(Graph& g, const CompileOptions& options);

// The graph passes `options` asks for (the default pipeline unless
// options.passes is set, without options.disable_passes), shape inference
// included where needed.
std::vector<std::string> pipeline_for(const CompileOptions& options);

// The pass select-kernels: where it ends the pass list (the default
// pipeline), it runs as the stage kernel choice, after the graph passes.
inline constexpr const char* kKernelChoicePass = "select-kernels";

// The context the graph passes and kernel choice share: symbol bounds, the
// evaluator of constant folding, how kernels are chosen (choice sources,
// measurement). Errors for an unknown --select or --impl.
Result<passes::PassContext> pass_context(const Graph& g, const CompileOptions& options, passes::Evaluator* evaluator);
// Stage "graph passes": the pass list of pipeline_for but kernel choice.
Status run_graph_passes(Graph& g, const CompileOptions& options, passes::PassContext& ctx);
// The tuning database a compile asks (CompileOptions::db, KILN_DB, the
// default file where it exists); null for none.
Result<std::shared_ptr<db::Database>> compile_database(const CompileOptions& options);
// Stage "kernel choice": select-kernels, where the pass list ends with it,
// with the tuning database as its first non-strict choice source.
// `workload_keys` (may be null) gets the tuning workload key of every kernel
// to be, by its anchor node (a candidate's node, or a generic group's last).
Status choose_kernels(Graph& g, const CompileOptions& options, passes::PassContext& ctx,
                      std::map<const Node*, std::string>* workload_keys = nullptr);

// Checks that every op is supported, then runs `pipeline` on `g` (pass
// manager, passes/pass_manager.h) with constant folding through the
// compiler's kernels (kiln opt).
struct OptimizedGraph {
  std::vector<passes::PassRun> runs;
  SymbolBounds bounds;  // every symbol's bounds, fresh (data-dependent) symbols included
};
Result<OptimizedGraph> optimize_graph(Graph& g, const CompileOptions& options, const std::vector<std::string>& pipeline,
                                      const passes::Instrumentation& inst = {});

// Elementwise fusion is on (not --naive, not --disable=fuse-elementwise).
bool fusion_enabled(const CompileOptions& options);

// The thread count a model runs with: CompileOptions::threads, or with 0 the
// hardware's (1 when unknown).
int resolve_threads(int threads);

// The pipeline up to loop IR, without code generation: for every kernel (in
// program order) its compute definition, its schedule and the lowered loops,
// as text. Used by `kiln opt --lower` and the ir tests. `g` must be inferred.
Result<std::string> lowered_kernels_text(Graph& g, const CompileOptions& options);

// The fused groups of an inferred graph, one line per group:
//   "group <root value>: <op> <op> ..." (used by `kiln opt --fuse-elementwise`).
Result<std::string> fused_groups_text(Graph& g, const CompileOptions& options);

}  // namespace kiln::driver
