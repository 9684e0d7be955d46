// Private interface between the loop-IR-to-LLVM translation (codegen.cc) and
// the JIT (jit.cc). Only codegen/llvm includes this header.
#pragma once

#include <string>
#include <vector>

#include "support/status.h"
#include "tir/tir.h"

namespace llvm {
class Module;
}

namespace kiln::codegen::detail {

// What the translation needs to know about the target.
struct TargetInfo {
  std::string cpu;       // LLVM CPU name, e.g. "znver4"
  std::string features;  // LLVM feature string, e.g. "+avx2,+avx512f,..."
  int vector_bits = 128; // widest native vector register, in bits (512 with AVX-512)
};

// Translates every PrimFunc into an externally visible function
//   void name(void** buffers, const int64_t* syms)
// of `module` (plus internal outlined bodies of parallel loops). The module's
// data layout and triple must already be set. Errors: kInternal naming the
// function and the offending expression.
Status emit_module(const std::vector<tir::PrimFunc>& funcs, const TargetInfo& target,
                   llvm::Module& module);

// External functions generated code may call (kiln_parallel_for, the heap
// allocator, scalar libm functions for f64 math), with their addresses in
// this process; the JIT defines them as absolute symbols.
struct RuntimeSymbol {
  const char* name;
  void* address;
};
std::vector<RuntimeSymbol> runtime_symbols();

}  // namespace kiln::codegen::detail
