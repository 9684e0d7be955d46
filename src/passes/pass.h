// Graph passes: one signature, one registry.
//
// A pass rewrites a graph in place and returns the number of rewrites it made
// (0: the graph is unchanged). Every pass is registered once, in pass.cc, with
// its name (the `kiln opt --passes=` spelling, e.g. "eliminate-dead-code"; the
// file and function are the same words with underscores), a one-line summary,
// whether it needs inferred shapes, and the file of its FileCheck test. The
// default order of the passes is one list, in default_pipeline.cc.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"
#include "ops/registry.h"
#include "support/status.h"
#include "support/tensor.h"
#include "strategy/strategy.h"

namespace kiln::passes {

// Evaluates a graph without inputs (its nodes read only constants) and
// returns its outputs. The driver's (driver/compile.h: KernelEvaluator)
// compiles it with the stages after kernel choice, so folded values are
// computed by the same kernels a run would use, without graph passes.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual Result<std::vector<Tensor>> evaluate(std::unique_ptr<Graph> g) = 0;
};

// What a pass may use besides the graph.
struct PassContext {
  // Bounds and the fresh-symbol counter of shape inference; the pass manager
  // re-infers shapes with it after a pass changes an inferred graph.
  ops::InferContext infer;
  bool shapes_inferred = false;
  // Runs a graph without inputs and returns its outputs (fold_constants).
  // Null: fold_constants folds nothing.
  Evaluator* evaluator = nullptr;
  // fold_constants materializes no constant larger than this (bytes).
  int64_t fold_limit_bytes = int64_t{1} << 20;
  // How select-kernels decides (choice sources, measurement); the driver fills it.
  strategy::SelectOptions select;
};

using PassFn = Result<int> (*)(Graph&, PassContext&);

struct PassInfo {
  std::string name;     // "eliminate-dead-code"
  std::string summary;  // one line
  PassFn run = nullptr;
  bool needs_shapes = false;  // runs after infer-shapes
  std::string test;           // "tests/ir/eliminate_dead_code.kir"
  // Writes what ONNX cannot express (Kiln's weight layouts, kiln: ops,
  // recorded kernel choices): `kiln opt -o out.onnx` leaves it out.
  bool kiln_only = false;
};

// Every pass, in the order docs/passes.md lists them.
const std::vector<PassInfo>& registered_passes();
const PassInfo* find_pass(std::string_view name);
// "a, b, c" (for error messages).
std::string pass_names();

// Shape inference as a pass: types of every value, symbolic values of shape tensors.
Result<int> infer_shapes(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
