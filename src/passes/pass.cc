#include "passes/pass.h"

#include "strategy/strategy.h"

#include "passes/block_layout.h"
#include "passes/combine_parallel_matmuls.h"
#include "passes/deduplicate_constants.h"
#include "passes/eliminate_common_subexpressions.h"
#include "passes/eliminate_dead_code.h"
#include "passes/eliminate_identities.h"
#include "passes/fold_constants.h"
#include "passes/flatten_matmul_batch.h"
#include "passes/fold_transposed_weights.h"
#include "passes/rnn_to_scan.h"
#include "passes/scan8_to_loop.h"
#include "passes/sequence_map_to_loop.h"
#include "passes/project_rnn_inputs.h"
#include "passes/simplify_algebra.h"
#include "passes/sink_transposes.h"

namespace kiln::passes {

Result<int> infer_shapes(Graph& g, PassContext& ctx) {
  ctx.infer.graph = &g;
  KILN_RETURN_IF_ERROR(ops::infer_shapes(g, ctx.infer));
  ctx.shapes_inferred = true;
  return 0;
}

const std::vector<PassInfo>& registered_passes() {
  static const std::vector<PassInfo> kPasses = {
      {"infer-shapes", "symbolic type and shape inference of every value (and symbolic values of shape tensors)",
       &infer_shapes, false, "tests/ir/infer_shapes_reshape.kir"},
      {"fold-transposed-weights", "Gemm transA/transB on a constant and Transpose of a constant done at compile time",
       [](Graph& g, PassContext&) { return fold_transposed_weights(g); }, false,
       "tests/ir/fold_transposed_weights.kir"},
      {"sink-transposes",
       "Transposes move below elementwise ops and reductions, where they meet and cancel",
       &sink_transposes, true, "tests/ir/sink_transposes.kir"},
      {"eliminate-identities",
       "Identity, inference Dropout, and Reshape/Transpose/Cast/Expand/Slice/Pad/Concat/Squeeze/Unsqueeze that "
       "do nothing or cancel, proven by symbolic shapes",
       &eliminate_identities, true, "tests/ir/eliminate_identities.kir"},
      {"simplify-algebra",
       "x*1, x/1, x+0, x-0, -(-x); x^2 and x^3 as multiplies; Conv followed by BatchNormalization or a per-channel Mul/Add folded into the "
       "weights and bias",
       &simplify_algebra, true, "tests/ir/simplify_algebra.kir"},
      {"fold-constants",
       "nodes whose inputs are all constants are evaluated once at compile time by the compiled kernels",
       &fold_constants, true, "tests/ir/fold_constants.kir"},
      {"deduplicate-constants", "constants with equal dtype, shape and contents become one value",
       &deduplicate_constants, false, "tests/ir/deduplicate_constants.kir"},
      {"eliminate-common-subexpressions", "nodes with the same op, attributes and inputs become one",
       &eliminate_common_subexpressions, false, "tests/ir/eliminate_common_subexpressions.kir"},
      {"combine-parallel-matmuls",
       "MatMuls, Gemms or Convs reading the same input with constant weights become one op and a Split",
       &combine_parallel_matmuls, true, "tests/ir/combine_parallel_matmuls.kir"},
      {"flatten-matmul-batch",
       "MatMul of A with constant batch dims by a constant matrix B becomes one product over all rows "
       "(Reshape views around it)",
       &flatten_matmul_batch, true, "tests/ir/flatten_matmul_batch.kir"},
      {"scan8-to-loop",
       "Scan of opset 8 (a batch axis on every input) becomes a Loop over the batch whose body runs one opset-9 "
       "Scan on element b (with sequence_lens: on its first lens[b] steps, checked, the outputs padded with zeros): "
       "VM code instead of a sub-program per element",
       &scan8_to_loop, true, "tests/ir/scan8_to_loop.kir"},
      {"sequence-map-to-loop",
       "SequenceMap becomes a Loop over the first input's elements carrying one sequence per output (SequenceAt, "
       "the body's nodes, SequenceInsert; other sequences' lengths checked equal): VM code instead of a "
       "sub-program per element",
       &sequence_map_to_loop, true, "tests/ir/sequence_map_to_loop.kir"},
      {"rnn-to-scan",
       "LSTM, GRU and RNN with constant weights become one input-projection MatMul and a Scan per direction whose "
       "body is one step: packed GEMMs with the recurrent weights and the gate arithmetic, compiled and run as VM code",
       &rnn_to_scan, true, "tests/ir/rnn_to_scan.kir"},
      {"project-rnn-inputs",
       "RNN/GRU/LSTM input projections of every step become one MatMul (packed GEMM) before the time loop; "
       "R packed in panels of hidden units for the per-step product",
       &project_rnn_inputs, true, "tests/ir/project_rnn_inputs.kir", /*kiln_only=*/true},
      {"block-layout",
       "convolution chains on blocked-channel activations (NCHW16c with AVX-512): kiln:ConvBlocked with weights "
       "re-laid out, elementwise/pool/Concat readers follow, FromBlocked/ToBlocked only at the chains' edges",
       &block_layout, true, "tests/ir/block_layout.kir", /*kiln_only=*/true},
      {"eliminate-dead-code", "nodes whose outputs nothing reads, and unused constants, are removed",
       &eliminate_dead_code, false, "tests/ir/eliminate_dead_code.kir"},
      {"select-kernels",
       "each MatMul/Gemm/Conv gets an implementation from the operator strategy (src/strategy): "
       "database, measurement or priority; its weight transform (GEMM panels, conv IHWO) is applied",
       [](Graph& g, PassContext& ctx) { return strategy::select_kernels(g, ctx.select); }, true,
       "tests/ir/select_kernels.kir", /*kiln_only=*/true},
  };
  return kPasses;
}

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : registered_passes())
    if (p.name == name) return &p;
  return nullptr;
}

std::string pass_names() {
  std::string out;
  for (const PassInfo& p : registered_passes()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

}  // namespace kiln::passes
