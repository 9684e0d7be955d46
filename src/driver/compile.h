// The compiler, stage by stage (compile.cc lists them in order as plain
// calls; docs/architecture.md shows the same list and a test compares them).
#pragma once

#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "driver/pipeline.h"
#include "passes/pass.h"

namespace kiln::driver {

// The model to compile: a file, or bytes with a name for errors.
struct ModelSource {
  std::string path;   // set: read this file
  std::string bytes;  // else: these bytes
  std::string name = "<bytes>";
};

// Every stage from import: `adjust` (may be null) changes the imported graph
// before the rest (bounds of named dims, inputs bound to values).
Result<CompiledProgram> compile_model(const ModelSource& source, const CompileOptions& options,
                                      const std::function<void(Graph&)>& adjust = nullptr);

// Every stage after import.
Result<CompiledProgram> compile_graph(std::unique_ptr<Graph> g, const CompileOptions& options);

// The stages after kernel choice (partition .. link) on a graph whose shapes
// are inferred and whose kernels are chosen: what constant folding and
// measurement compile. `stages` (may be null) gets each stage's name and seconds.
// `workload_keys` (may be null): choose_kernels' keys, copied into each
// kernel's KernelChoiceInfo::workload.
Result<CompiledProgram> compile_chosen(Graph& g, const SymbolBounds& bounds, const CompileOptions& options,
                                       std::vector<std::pair<std::string, double>>* stages = nullptr,
                                       const std::map<const Node*, std::string>* workload_keys = nullptr);

// The optimized graph as a self-contained HTML page (Model::graph_html).
std::string graph_html(const CompiledProgram& c);

// Constant folding's evaluator: shape inference, then compile_chosen, then
// one run (on one thread, under the options' memory limit).
class KernelEvaluator : public passes::Evaluator {
 public:
  explicit KernelEvaluator(CompileOptions options);
  Result<std::vector<Tensor>> evaluate(std::unique_ptr<Graph> g) override;

 private:
  CompileOptions options_;
};

}  // namespace kiln::driver
