// libFuzzer target with a structure-aware mutator: each input is an ONNX
// model, mutated as a structure (tests/fuzz/model_mutator.h: dtypes, dims,
// attributes, op types, inputs and outputs) rather than as bytes, so that
// mutants parse and reach type checking, inference, lowering, code generation
// and a run on random inputs. Any mutant must compile and run or give a
// Status: never a crash, hang, leak or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "model_mutator.h"

namespace {
constexpr size_t kMaxBytes = 64 * 1024;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string out = kiln::fuzz::mutate_model(in, seed, max_size);
  // Not a model (or nothing changed): libFuzzer's byte mutations instead.
  if (out == in) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxBytes) return 0;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)kiln::fuzz::compile_and_run(bytes, "fuzz.onnx");
  return 0;
}
