#include "support/kernel_abi.h"

#include <cstdint>

#include "kiln/dtype.h"
#include "support/scratch.h"
#include "support/thread_pool.h"

namespace kiln {

namespace {

// Float8 conversions called by generated code (the ONNX reference rounding
// is bit manipulation with many cases; float8 tensors are rare enough that a
// scalar call per element is fine).
float kiln_f8_to_f32(int32_t bits, int32_t dtype) { return f8_to_f32(static_cast<uint8_t>(bits), static_cast<DType>(dtype)); }
int32_t kiln_f32_to_f8(float v, int32_t dtype) {
  uint8_t b;
  narrow_float_store(&b, static_cast<DType>(dtype), v);
  return b;
}
float kiln_round_f8(float v, int32_t dtype, int32_t saturate) {
  return round_to_narrow_float(v, static_cast<DType>(dtype), saturate != 0);
}

}  // namespace

const std::vector<KernelCallback>& kernel_callbacks() {
  static const std::vector<KernelCallback> callbacks = {
      {"kiln_parallel_for", reinterpret_cast<void*>(&kiln_parallel_for)},
      {"kiln_scratch_alloc", reinterpret_cast<void*>(&kiln_scratch_alloc)},
      {"kiln_scratch_free", reinterpret_cast<void*>(&kiln_scratch_free)},
      {"kiln_f8_to_f32", reinterpret_cast<void*>(&kiln_f8_to_f32)},
      {"kiln_f32_to_f8", reinterpret_cast<void*>(&kiln_f32_to_f8)},
      {"kiln_round_f8", reinterpret_cast<void*>(&kiln_round_f8)},
  };
  return callbacks;
}

}  // namespace kiln
