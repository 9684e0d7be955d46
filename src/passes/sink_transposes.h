// sink_transposes: moves Transposes towards the graph's outputs, through
// elementwise ops and reductions, so that transposes that meet cancel
// (eliminate-identities, which runs after it, composes or removes them) and a
// transpose after a reduction moves fewer elements. Rules (rewrite driver):
//   U(Transpose(x, p))                    -> Transpose(U(x), p)   U elementwise, other inputs scalars
//   B(Transpose(a, p), Transpose(b, p))   -> Transpose(B(a, b), p) B elementwise, same ranks
//   B(Transpose(a, p), c)                 -> Transpose(B(a, c'), p) c constant, c' = c (padded to
//                                            a's rank) transposed by the inverse of p
//   Reduce(Transpose(x, p), axes, keepdims = 1) -> Transpose(Reduce(x, p[axes]), p)
// A Transpose moves only when the op is its one reader (otherwise it would be
// computed twice).
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> sink_transposes(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
