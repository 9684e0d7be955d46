// simplify_algebra: algebraic identities and folding of affine ops into the
// weights of the convolution or matmul that produces their input. Rules
// (rewrite driver, simplify_algebra.cc):
//   x*1, 1*x, x/1, x+0, 0+x, x-0 -> x when the constant does not broadcast x
//   to a larger shape (x+0 turns -0.0 into +0.0: equal, not the same bits);
//   Neg(Neg(x)) -> x;
//   Conv(x, W, b) -> BatchNormalization (inference, constant parameters) ->
//   Conv(x, W', b') with W'[o] = W[o]*s[o], s = scale/sqrt(var+eps),
//   b' = (b - mean)*s + B;
//   Conv -> Mul or Div by a constant per output channel (or scalar) -> W and b
//   scaled; Conv -> Add or Sub of a constant per output channel -> b shifted;
//   MatMul(x, W) -> Mul or Div by a constant per column (or scalar) -> W scaled.
// Folding needs the Conv or MatMul output to have no other use, constant f32
// or f64 weights, and (for Conv) the default weight layout. New weights are
// computed in double and rounded once, as ONNX Runtime's fusions do.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> simplify_algebra(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
