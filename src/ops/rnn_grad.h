// The recurrent ops' gradient rules: the LSTM's (rnn_grad.cc, registered by
// rnn.cc) and Scan's (scan_grad.cc, registered by control_flow.cc).
#pragma once

#include "ops/gradient.h"

namespace kiln::ops {

// LSTM, direction forward, default activations, no clip, input_forget,
// layout 1, sequence_lens or peepholes (anything else is kUnsupported,
// naming the node): back-propagation through time as two Scans.
Status grad_lstm(GradBuilder& b);

// Scan of opset 9 and later with axes 0 and forward directions (else
// kUnsupported): the steps recomputed keeping each step's incoming states,
// then a reverse Scan over the body's own reverse mode. Gradients reach the
// float states, scan inputs and captured values.
Status grad_scan(GradBuilder& b);

// Loop whose carried values keep their types: the iterations recomputed
// keeping each one's incoming states, then a Loop over them last to first
// (gathered from the stacks) running the body's own reverse mode. Gradients
// reach the float carried values and the values the body captures (summed
// over the iterations as loop-carried values); not M or cond.
Status grad_loop(GradBuilder& b);

}  // namespace kiln::ops
