// block-layout: convolution chains on blocked-channel activations (NCHW<b>c,
// b = the target's f32 vector lanes; ops/layout.cc). Each eligible 2-D
// convolution becomes a kiln:ConvBlocked whose output is blocked, its weights
// re-laid out once here; the ops that read a blocked value and can work on
// blocked data follow it (elementwise ops whose other operands are blocked,
// per-channel constants (re-laid out) or scalars; inference
// BatchNormalization as a per-channel Mul and Add; max/average pooling as
// the same op over a trailing window of 1; global average pooling as a
// ReduceMean over the plane; Pad of the plane; channel Concats and Splits of
// whole blocks). Every other reader, and
// a graph output, reads the NCHW value through a kiln:FromBlocked; an
// operand that is NCHW where blocked data is wanted goes through a
// kiln:ToBlocked. So layout conversions happen only at the chains' edges.
//
// Eligible convolutions: f32, 2-D, constant weights and bias, one group or
// depthwise (group = C = O), static channel counts, output channels padded
// to whole blocks wasting at most a quarter of the last; not one the strategy
// would give Winograd, not a one-group window larger than 3x3, not one a
// choice source decides for (the same rules under --select=measure: the
// layout of a chain is not measured). A convolution whose
// input is not blocked reads it as NCHW (the stem's 3 channels); a depthwise
// one gets a kiln:ToBlocked in front.
//
// The channels past C of a blocked value are zero where a convolution wrote
// them; the elementwise ops allowed on the chain keep finite values finite
// (a divisor must be a constant, padded with ones), so the zero weights of a
// following convolution cancel them and FromBlocked drops them.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> block_layout(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
