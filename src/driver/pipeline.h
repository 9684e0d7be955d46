// The compiler in order, on one screen (driver/pipeline.cc):
//   import ONNX -> check every op is supported (all missing ops listed at once)
//   -> symbolic shape inference -> classify nodes (compiled / view / host
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
#include "runtime/vm.h"

namespace kiln::driver {

struct CompiledProgram {
  std::unique_ptr<Graph> graph;  // after inference (types of every value)
  std::shared_ptr<runtime::Program> program;
  std::shared_ptr<codegen::CompiledModule> module;  // keeps kernel code alive
  std::vector<TensorInfo> inputs, outputs;
  CompileStats stats;
};

// Lists every node whose op Kiln does not implement, in one error.
Status check_supported(const Graph& g);

// Runs the pipeline on an imported graph.
Result<CompiledProgram> compile_graph(std::unique_ptr<Graph> g, const CompileOptions& options);

}  // namespace kiln::driver
