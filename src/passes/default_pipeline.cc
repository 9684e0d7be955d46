#include "passes/default_pipeline.h"

#include <algorithm>

#include "passes/pass.h"

namespace kiln::passes {

std::vector<std::string> default_pipeline(bool naive) {
  std::vector<std::string> p = {
      "scan8-to-loop",                    // Scan of opset 8: a Loop over the batch of opset-9 Scans (structural)
      "fold-transposed-weights",          // Gemm transA/transB and Transpose of constants (structural)
      "infer-shapes",                     // symbolic types of every value; later passes prove with them
      "sink-transposes",                  // Transposes below elementwise ops and reductions
      "eliminate-identities",             // Identity, inference Dropout, no-op views/casts/slices/pads;
                                          // transposes that met cancel
      "simplify-algebra",                 // x*1, x+0, --x; Conv+BatchNorm/Mul/Add into weights
      "fold-constants",                   // nodes of constants only run once, through compiled kernels
      "deduplicate-constants",            // equal constants become one value
      "eliminate-common-subexpressions",  // same op, attributes and inputs: one node
      "combine-parallel-matmuls",         // Q/K/V-style projections of one input: one wide op + Split
      "flatten-matmul-batch",             // [d.., M, K] x const [K, N]: one [d..*M, K] product
      "sequence-map-to-loop",             // SequenceMap: a Loop carrying the output sequences (VM code)
      "rnn-to-scan",                     // LSTM/GRU/RNN: projection MatMul + Scan of compiled steps
      "project-rnn-inputs",               // RNN/GRU/LSTM input projections: one MatMul over all steps
      "block-layout",                     // convolution chains on blocked channels (NCHWc), conversions at edges
      "eliminate-dead-code",              // nodes nothing reads, unused constants
      "select-kernels",                   // operator strategy: an implementation per MatMul/Gemm/Conv,
                                          // its weight transform applied
  };
  if (naive) {
    p.erase(std::remove(p.begin(), p.end(), "select-kernels"), p.end());
    p.erase(std::remove(p.begin(), p.end(), "block-layout"), p.end());
  }
  return p;
}

std::vector<std::string> onnx_pipeline() {
  std::vector<std::string> p = default_pipeline();
  p.erase(std::remove_if(p.begin(), p.end(),
                         [](const std::string& name) {
                           const PassInfo* info = find_pass(name);
                           return info != nullptr && info->kiln_only;
                         }),
          p.end());
  return p;
}

std::vector<std::string> with_shape_inference(const std::vector<std::string>& pipeline, bool at_end) {
  std::vector<std::string> out;
  bool inferred = false;
  for (const std::string& name : pipeline) {
    const PassInfo* p = find_pass(name);
    if (name == "infer-shapes") inferred = true;
    if (p != nullptr && p->needs_shapes && !inferred) {
      out.push_back("infer-shapes");
      inferred = true;
    }
    out.push_back(name);
  }
  if (at_end && !inferred) out.push_back("infer-shapes");
  return out;
}

}  // namespace kiln::passes
