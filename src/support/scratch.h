// Scratch memory for generated kernels: buffers a kernel allocates for itself
// (intermediate stages too large for the stack). Blocks are cached per thread
// and size, so after the first run a model allocates nothing while running.
#pragma once

#include <cstdint>

// 64-byte aligned block of at least `bytes` bytes; never null (aborts when out of memory).
extern "C" void* kiln_scratch_alloc(int64_t bytes);
// Returns a block obtained from kiln_scratch_alloc with the same `bytes`.
extern "C" void kiln_scratch_free(void* block, int64_t bytes);
