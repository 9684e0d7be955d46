// combine_parallel_matmuls: several MatMuls, Gemms or Convs that read the same
// input with constant weights (the Q, K and V projections of attention; the
// branches of an Inception block) become one op on the concatenated weights,
// followed by a Split that hands each former op its columns (channels).
//   MatMul(x, W_i: [K, N_i])                  -> MatMul(x, [W_1 .. W_n]) -> Split(axis -1)
//   Gemm(x, W_i: [K, N_i], b_i) (no transpose, alpha = beta = 1)
//                                             -> Gemm(x, [W_1 .. W_n], [b_1 .. b_n]) -> Split(axis 1)
//   Conv(x, W_i: [O_i, C, kh, kw], b_i), equal attributes, group 1
//                                             -> Conv(x, [W_1; ..; W_n], [b_1; ..; b_n]) -> Split(axis 1)
// Weights must share the dtype (f32 or f64) and every dim but the one
// concatenated; a missing bias counts as zeros. One wide op reads its input
// once instead of n times and gives the kernel a wider tile to fill.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> combine_parallel_matmuls(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
