// project_rnn_inputs: the input projection of a recurrent layer (RNN, GRU,
// LSTM) leaves the time loop and becomes one matrix product over every step.
//
//   LSTM(X, W, R, B, ...)  ->  P = MatMul(X, W^T) + Wb        (all steps, all directions)
//                              LSTM(P, -, R panels, B, ...)    kiln_projected_input = 1
//
// X is [seq, batch, input] (layout 0) or [batch, seq, input] (layout 1); W^T
// is [input, directions * gates * hidden] (direction d's gates at columns
// d*gates*hidden), so P has X's two leading dims and one column per gate of
// every direction. The MatMul goes through the operator strategy (a packed
// GEMM); the recurrent op then adds only h R^T + Rb per step. R is stored
// transposed, [directions, hidden, gates * hidden], so each step's product
// reads rows of R^T contiguously. The node's W input is dropped (empty).
// Applies where W and R are constants of the input's dtype (f32 or f64) and B
// is a constant or absent. The attribute is Kiln-internal (ONNX import refuses
// kiln_* attributes), so only this pass makes the projected form.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> project_rnn_inputs(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
