// Code generation: loop IR (tir::PrimFunc) to LLVM IR, compiled in process with
// ORC LLJIT for the host CPU (its features detected at start-up). This header
// exposes no LLVM types; LLVM headers are included only in codegen/llvm/*.cc.
//
// Vectorized loops: the loop is emitted with LLVM loop metadata that forces
// vectorization; transcendental intrinsics (exp, log, tanh, erf, sigmoid) are
// expanded into polynomial approximations in IR, so they vectorize (no libm
// calls inside vector loops).
//
// Parallel loops: the loop body is outlined into a function
//   void body(int64_t begin, int64_t end, void* env)
// and the loop becomes a call to kiln_parallel_for (support/thread_pool.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/status.h"
#include "tir/tir.h"

namespace kiln::codegen {

// Signature of every generated kernel (see tir::PrimFunc).
using KernelFn = void (*)(void** buffers, const int64_t* syms);

struct CodegenOptions {
  int opt_level = 3;
  bool dump_ir = false;  // print optimized LLVM IR to stderr
};

// A set of compiled kernels that stays alive as long as this object.
class CompiledModule {
 public:
  virtual ~CompiledModule() = default;
  // The entry point of the PrimFunc named `name`; null if absent.
  virtual KernelFn lookup(const std::string& name) const = 0;
  // The optimized LLVM IR text of the module (for tests and --dump-ir).
  virtual const std::string& llvm_ir() const = 0;
};

// Compiles all functions into one JIT module. Errors (kInternal) carry LLVM's message.
Result<std::unique_ptr<CompiledModule>> compile(const std::vector<tir::PrimFunc>& funcs,
                                                const CodegenOptions& options = {});

// The kernels of a package (package/): the functions compiled for the host
// CPU like compile(), as a relocatable, position-independent ELF object to be
// linked into a shared library. Kiln's own functions the code calls
// (support/kernel_abi.h) are read through pointer variables the loader
// fills in, so the library needs no symbol of the process that loads it.
struct ObjectCode {
  std::string bytes;
  std::string cpu;                        // the LLVM CPU name the code was compiled for
  std::vector<std::string> cpu_features;  // the checked extensions (support/cpu_features.h) it may use
};
Result<ObjectCode> compile_object(const std::vector<tir::PrimFunc>& funcs, const CodegenOptions& options = {});

// The host target as a canonical string, e.g. "x86_64-znver4+avx512f+avx512bw+...".
std::string host_target_string();

}  // namespace kiln::codegen
