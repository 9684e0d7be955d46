// eliminate_identities: removes nodes that compute their input, proven with
// symbolic shapes where the model's own shape inference could not. Rules
// (rewrite driver, eliminate_identities.cc):
//   Identity(x) -> x; Dropout(x) in inference (or with ratio 0) -> x when its
//   mask is unused; a chain of Reshape/Flatten/Squeeze/Unsqueeze/Identity whose
//   result has x's shape -> x, and a longer chain with a static result -> one
//   Reshape; Transpose with the identity permutation -> x, and two Transposes
//   -> one (or none); Cast to x's own dtype -> x, and Cast(Cast(x)) through a
//   dtype that holds every value of x -> one Cast; Expand, Tile and Slice
//   whose output has x's shape (Slice with positive steps) -> x; Pad by zeros
//   -> x; Concat and Split of one tensor -> x.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> eliminate_identities(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
