// Ahead-of-time packages (`kiln compile MODEL -o model.kiln`, Model::save):
// one file a machine without a compiler runs (Model::load, the C API of
// libkiln_runtime). Layout:
//
//   header (64 bytes)  magic "KILNPKG\0", format version, file size, where the
//                      index is, a 64-bit checksum of everything else, the
//                      Kiln version that wrote it
//   index              binary: the target (architecture, CPU, the checked
//                      instruction-set extensions the kernels use), the
//                      signatures of inputs and outputs, the kernel choices,
//                      metadata as JSON (`kiln info model.kiln`), the VM
//                      programs (registers, instructions, memory plan, host
//                      kernels as their nodes' text), where each constant lies
//   constants          each at a 64-byte aligned offset: memory-mapped on
//                      load and used in place (never copied)
//   kernel library     a shared object (ELF) of every compiled kernel
//                      (codegen::compile_object), page aligned; loaded from
//                      memory (memfd) with its callbacks bound
//                      (support/kernel_abi.h)
//
// Loading checks, in order: the magic, the format version (a package of
// another format names both versions and the Kiln that wrote it), the size
// (truncated), the checksum (corrupt or edited), the architecture and every
// extension the kernels use against the host's CPU (support/cpu_features.h).
// Reading (load.cc) needs no LLVM, protobuf or SQLite; writing (write.cc)
// runs the code generator and a C compiler driver to link the library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/choice.h"
#include "kiln/kiln.h"
#include "runtime/vm.h"

namespace kiln::package {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr const char* kEmptyDimsPrefix = "empty_dims_";

// What a package holds, apart from its kernels' code.
struct Contents {
  std::shared_ptr<runtime::Program> program;
  // The program compiled with every named input dim at least 0 (`program`
  // assumes at least 1): Model runs it for inputs with an empty dim. Null
  // when the model has no named input dims (or that compile failed). Its
  // kernels are named with kEmptyDimsPrefix in the library.
  std::shared_ptr<runtime::Program> empty_dims;
  std::vector<TensorInfo> inputs, outputs;
  std::vector<kernels::KernelChoiceInfo> kernel_choices;
  CompileStats stats;
  std::string source;        // the model file it was compiled from
  std::string kiln_version;  // of the Kiln that wrote it
  std::string arch, cpu;     // architecture; the LLVM CPU name the kernels were compiled for
  std::vector<std::string> cpu_features;  // checked extensions the kernels may use
  std::string metadata_json;              // a description for people and tools (written by write.cc)
};

// The package file's bytes: `library` is the kernels' shared object.
Result<std::string> serialize(const Contents& contents, const std::string& library);

// A package read into this process: its programs' kernel tables point into
// the loaded library and their constants into the mapped file, both kept
// alive by this object (and by every Program it hands out).
struct Loaded {
  Contents contents;
  std::shared_ptr<void> mapping;  // the file, mapped
  std::shared_ptr<void> library;  // the kernels' shared object, loaded
  std::vector<std::shared_ptr<void>> host_graphs;  // the graphs host kernels were rebuilt from
};

// Reads a package (see the file comment for the checks). Errors name the path.
Result<std::shared_ptr<Loaded>> load(const std::string& path);

// True when the file starts with the package magic (`kiln run` tells a
// package from an ONNX model this way).
bool is_package_file(const std::string& path);

// The Kiln version this build writes into packages.
const char* kiln_version();

}  // namespace kiln::package
