// The default pass pipeline: the one list of graph passes that compilation,
// `kiln opt --default-pipeline` and the tests all run (default_pipeline.cc).
#pragma once

#include <string>
#include <vector>

namespace kiln::passes {

// The passes, in order. `naive` (reference compilation) drops the passes that
// only exist to suit the default schedules (select-kernels).
std::vector<std::string> default_pipeline(bool naive = false);
// The default pipeline without the passes whose results ONNX cannot express
// (PassInfo::kiln_only): what `kiln opt MODEL -o out.onnx` runs.
std::vector<std::string> onnx_pipeline();

// `pipeline` with infer-shapes put in front of the first pass that needs
// shapes when none precedes it, and (with `at_end`) at the end when none runs
// at all: compilation needs inferred types (the pass manager keeps them
// current after every rewriting pass that follows infer-shapes).
std::vector<std::string> with_shape_inference(const std::vector<std::string>& pipeline, bool at_end = true);

}  // namespace kiln::passes
