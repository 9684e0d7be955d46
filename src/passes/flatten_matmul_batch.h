// flatten_matmul_batch: a MatMul whose B is a constant matrix and whose A has
// batch dims becomes one product over all rows.
//
//   MatMul(A: [d1, .., dk, M, K], B: const [K, N])
//     -> Reshape(MatMul(Reshape(A, [-1, K]), B), [d1, .., dk, M, N])
//
// B is shared by every batch entry, so the product is one [d1*..*dk*M, K] x
// [K, N] GEMM: the packed template then tiles all rows in registers and
// streams each panel of B once, instead of running d1*..*dk products of M
// rows each (attention written as [seq, batch=1, dim] x [dim, 3*dim] had M = 1:
// a matrix-vector product per row). The views cost nothing at run time; the
// output's shape comes from A's leading dims (Shape/Gather/Concat, evaluated by
// shape inference). Applies where the batch dims are constants whose product
// is above 1 (symbolic batch dims are left alone: they are usually 1, where
// the rewrite gains nothing).
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> flatten_matmul_batch(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
