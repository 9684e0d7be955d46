// The compiler in order, on one screen (driver/pipeline.cc):
//   import ONNX -> check every op is supported (all missing ops listed at once)
//   -> graph passes (passes/default_pipeline.cc; symbolic shape inference is
//   one of them) -> classify nodes (compiled / view / host
//   kernel / shape computation) -> fuse_elementwise -> lower each group to a
//   KernelDef, schedule, lower to loop IR -> LLVM JIT -> VM program with a
//   static memory plan (all shapes static) or pooled allocation (symbolic).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codegen/llvm/jit.h"
#include "graph/graph.h"
#include "kiln/kiln.h"
#include "passes/pass_manager.h"
#include "runtime/vm.h"

namespace kiln::driver {

// How one compiled kernel was implemented (kiln info --kernels).
struct KernelChoiceInfo {
  std::string kernel;  // kiln_k3_MatMul
  std::string node;    // MatMul '/fc1/MatMul'
  std::string impl;    // candidate name, "default" (no candidates) or "naive"
  std::string knobs;   // "mr=8 nr=32"
  std::string source;  // priority, measured, database
  std::string why;
};

struct CompiledProgram {
  std::unique_ptr<Graph> graph;  // after inference (types of every value)
  std::shared_ptr<runtime::Program> program;
  std::shared_ptr<codegen::CompiledModule> module;  // keeps kernel code alive
  std::vector<TensorInfo> inputs, outputs;
  CompileStats stats;
  std::vector<KernelChoiceInfo> kernel_choices;  // one per kernel
};

// The newest ai.onnx opset whose semantics Kiln implements (that of the pinned onnx 1.17).
constexpr int64_t kNewestOnnxOpset = 22;

// The public description of a graph input or output (dims printed symbolically).
TensorInfo make_info(const Value* v);

// Lists every node whose op Kiln does not implement, in one error (and
// rejects an ai.onnx opset newer than kNewestOnnxOpset).
Status check_supported(const Graph& g);

// The graph passes `options` asks for (the default pipeline unless
// options.passes is set, without options.disable_passes), shape inference
// included where needed.
std::vector<std::string> pipeline_for(const CompileOptions& options);

// Checks that every op is supported, then runs `pipeline` on `g` (pass
// manager, passes/pass_manager.h) with constant folding through the compiler.
struct OptimizedGraph {
  std::vector<passes::PassRun> runs;
  SymbolBounds bounds;  // every symbol's bounds, fresh (data-dependent) symbols included
};
Result<OptimizedGraph> optimize_graph(Graph& g, const CompileOptions& options, const std::vector<std::string>& pipeline,
                                      const passes::Instrumentation& inst = {});

// Runs the pipeline on an imported graph: optimize_graph, then partitioning,
// lowering, code generation and the VM program.
Result<CompiledProgram> compile_graph(std::unique_ptr<Graph> g, const CompileOptions& options);

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
