// The recurrent ops' gradient rules (rnn_grad.cc), registered by rnn.cc.
#pragma once

#include "ops/gradient.h"

namespace kiln::ops {

// LSTM, direction forward, default activations, no clip, input_forget,
// layout 1, sequence_lens or peepholes (anything else is kUnsupported,
// naming the node): back-propagation through time as two Scans.
Status grad_lstm(GradBuilder& b);

}  // namespace kiln::ops
