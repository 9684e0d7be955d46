// libFuzzer target: import, shape inference and compilation (lowering, code
// generation, JIT) of arbitrary bytes. Any input must compile or give a
// Status, never a crash, hang, leak or sanitizer report. Inputs larger than
// kMaxBytes are skipped: compile time grows with the model, and the corpus
// seeds are small node-test models.
#include <cstddef>
#include <cstdint>
#include <string>

#include "driver/compile.h"
#include "frontend/onnx/import.h"
#include "support/status.h"

namespace {
constexpr size_t kMaxBytes = 64 * 1024;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxBytes) return 0;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto graph = kiln::import_onnx_bytes(bytes, "fuzz.onnx");
  if (!graph.is_ok()) return 0;
  kiln::CompileOptions options;
  options.threads = 1;
  auto compiled = kiln::driver::compile_graph(std::move(*graph), options);
  (void)compiled;
  return 0;
}
