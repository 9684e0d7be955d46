// rnn-to-scan: an LSTM, GRU or RNN with constant weights becomes ops Kiln
// compiles: one MatMul over every step for the input projection, and per
// direction a Scan whose body computes one step with packed GEMMs and fused
// gate arithmetic, run as VM code (runtime/vm.h: the loop instructions, no
// sub-program).
//
//   LSTM(X, W, R, B, -, h0, c0)  ->  P = MatMul(X, W^T) + (Wb + Rb)       [seq, batch, dirs * 4H]
//                                    per direction d (P_d its 4H columns):
//                                      Scan(h0_d, c0_d, P_d) body (h, c, p):
//                                        g = MatMul(h, R_d^T) + p            (R_d^T a body constant)
//                                        i, o, f, z = Split(g, 4, axis 1)
//                                        c' = Sigmoid(f) c + Sigmoid(i) Tanh(z)
//                                        h' = Sigmoid(o) Tanh(c')           -> (h', c', h')
//                                    Y = Concat_d(Reshape(Y_d, [0, 1, -1, H])), Y_h, Y_c likewise
//   GRU: p = [pz, pr, ph] (Wb + Rb folded, but Rbh under linear_before_reset);
//        z = Sigmoid(pz + h Rz^T), r = Sigmoid(pr + h Rr^T),
//        hh = Tanh(ph + (r h) Rh^T), or Tanh(ph + r (h Rh^T + Rbh)) with
//        linear_before_reset; h' = (1 - z) hh + z h.
//   RNN: h' = Tanh(h R^T + p).
//
// A reverse direction scans its input and writes its output backwards
// (scan_input_directions / scan_output_directions 1), so Y stays aligned
// with X's steps. Absent initial states are zeros of [batch, H] (from X's
// shape when the batch is symbolic). Applies where X is [seq, batch, input]
// (layout 0), W and R are constants of X's dtype (f32 or f64), B a constant
// or absent, without sequence_lens, LSTM peepholes, clip, input_forget or
// activations other than the defaults, and the graph's opset has Scan in its
// opset-9 form. Runs before project-rnn-inputs, which keeps the host kernel
// for the recurrent ops left.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> rnn_to_scan(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
