// What generated kernel code calls back into: the functions of Kiln's own
// that a kernel may call (the thread pool, scratch memory, float8
// conversions), by the name the code generator declares them with. The JIT
// binds these names directly; a kernel library written for a package
// (codegen::compile_object) instead reads each through a pointer variable
// named kKernelSlotPrefix + name, which the package loader fills in
// (package/load.cc), so the library needs no symbol of the process that loads it.
// libc and libm functions (memset, exp, pow, ...) stay ordinary calls.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct KernelCallback {
  const char* name;
  void* address;
};

inline constexpr const char* kKernelSlotPrefix = "__kiln_slot_";

const std::vector<KernelCallback>& kernel_callbacks();

}  // namespace kiln
