// deduplicate_constants: constants with the same dtype, shape and contents
// become one value (the first), so that eliminate-common-subexpressions sees
// nodes reading equal constants as reading the same input. Constants that are
// also graph inputs (initializers a caller may override) are left alone.
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

Result<int> deduplicate_constants(Graph& g, PassContext& ctx);

}  // namespace kiln::passes
