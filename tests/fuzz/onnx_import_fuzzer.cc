// libFuzzer target: the ONNX importer on arbitrary bytes. Any input must give
// a graph that verifies or a Status, never a crash, hang, leak or sanitizer
// report. Seeds: scripts/fuzz.sh (zoo and ONNX backend suite models).
#include <cstddef>
#include <cstdint>
#include <string>

#include "frontend/onnx/import.h"
#include "support/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto graph = kiln::import_onnx_bytes(bytes, "fuzz.onnx");
  if (graph.is_ok()) {
    kiln::Status verified = (*graph)->verify();
    (void)verified;
  }
  return 0;
}
