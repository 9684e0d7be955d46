// Writing a package (package/package.h) from a compiled model: the kernels
// compiled again as an object (codegen::compile_object), linked into a
// shared library by the C compiler driver ($KILN_CC, else `cc`), and the
// file written beside `path` and renamed over it (an existing file is
// replaced only by a complete package).
#pragma once

#include <string>

#include "driver/pipeline.h"

namespace kiln::package {

// `empty_dims` (may be null): the model compiled with every named input dim
// at least 0 (Contents::empty_dims).
Status write(const std::string& path, const driver::CompiledProgram& compiled, const std::string& source,
             const driver::CompiledProgram* empty_dims = nullptr);

}  // namespace kiln::package
