// pack_conv_weights: stores the constant weights of 2-D convolutions with one
// group output-channel innermost, where the default schedule cannot vectorize
// along the output width. A Conv whose weight W[O, I, KH, KW] is a constant
// gets a new constant in layout [I, KH, KW, O] and the string attribute
// "kiln_weight_layout" = "IHWO" (an internal attribute, understood by the Conv
// inference and lowering in ops/conv.cc); the default schedule then
// vectorizes it along the output channels with contiguous weight loads.
//
// It runs after shape inference and packs a convolution with a kernel of at
// most 3x3 when its output width is a constant below 8 (7x7 planes) or its
// horizontal stride is not 1 (the input would be read with a stride). Other convolutions keep their
// layout: the schedule vectorizes them along the output width, reading the
// weights as broadcasts (with output channels adjacent in memory, LLVM's SLP
// vectorizer packs those broadcasts across rows of the register tile and the
// tile degrades, 78 -> 32 GFLOP/s on a 3x3 256->256 conv on 14x14).
#pragma once

#include "graph/graph.h"
#include "support/status.h"

namespace kiln::passes {

// The attribute name and its one value.
inline constexpr const char* kConvWeightLayoutAttr = "kiln_weight_layout";
inline constexpr const char* kConvWeightLayoutIHWO = "IHWO";

// Returns the number of Conv nodes rewritten. Conv nodes with group != 1, a
// weight that is not a constant of rank 4, a kernel larger than 3x3, an output
// of unknown width, or the attribute already set are left as they are. A
// weight shared by several convolutions is packed once.
Result<int> pack_conv_weights(Graph& g);

}  // namespace kiln::passes
