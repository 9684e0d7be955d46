// fold_transposed_weights: moves transposes of constant weights to compile
// time. Gemm with transA/transB on a constant operand gets the operand
// transposed once and the flag cleared; Transpose of a constant becomes a
// constant. Generated matmul kernels vectorize along the output's last axis,
// which reads B row-wise: a transposed B would be read with a stride of K.
#pragma once

#include "graph/graph.h"
#include "support/status.h"

namespace kiln::passes {

// Returns the number of rewrites.
Result<int> fold_transposed_weights(Graph& g);

}  // namespace kiln::passes
