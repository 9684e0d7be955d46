// oneDNN (Debian's libdnnl, CPU, OpenMP runtime) as a kernel library behind
// the operator strategy: the candidate conv.onednn (strategy/conv.cc) marks a
// Conv with the int attribute kiln_onednn = 1, and the Conv then runs this
// host kernel instead of a compiled one. oneDNN's headers stay in this folder.
#pragma once

#include "graph/graph.h"
#include "ops/registry.h"
#include "support/status.h"

namespace kiln::onednn {

// Whether a Conv runs on oneDNN (the attribute kiln_onednn).
bool runs_conv(const Node& n);

// The kernel of a Conv marked kiln_onednn: 2-D, f32, a constant weight as
// ONNX stores it ([O, I / group, KH, KW]), optional bias, static input and
// output shapes. The primitive is created and the weight reordered into the
// layout oneDNN chose once, here; a run reorders nothing else unless the
// int attribute kiln_onednn_blocked = 1, which lets oneDNN also choose the
// activations' layout (its blocked nChw16c kernels) and reorders the input
// and output around each call. An error when oneDNN has no implementation.
Result<ops::RuntimeKernel> conv_kernel(const Node& n);

}  // namespace kiln::onednn
