// `kiln opt`: runs parts of the compiler on a graph (Kiln's text IR, .kir, or
// an ONNX file) and prints the result, for tests and for looking inside.
#pragma once

#include <string>
#include <vector>

#include "support/status.h"

namespace kiln::cli {

Result<int> cmd_opt(const std::vector<std::string>& argv);
// `kiln ops`: every supported op, with how it runs (compiled, runtime kernel, view).
Result<int> cmd_ops(const std::vector<std::string>& argv);

}  // namespace kiln::cli
