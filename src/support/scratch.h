// Scratch memory for generated kernels: buffers a kernel allocates for itself
// (intermediate stages too large for the stack). Blocks are cached per thread
// and size, so after the first run a model allocates nothing while running.
#pragma once

#include <cstdint>

// 64-byte aligned block of at least `bytes` bytes, or null when the block is
// larger than the default memory limit (support/memory_limit.h) or cannot be
// allocated. Generated code skips the loops that would use a null block; the
// failure is counted, and the VM turns a count that moved during a kernel call
// into an error naming the node (kiln_scratch_failures).
extern "C" void* kiln_scratch_alloc(int64_t bytes);
// Returns a block obtained from kiln_scratch_alloc with the same `bytes`.
extern "C" void kiln_scratch_free(void* block, int64_t bytes);

// Scratch allocations that failed since the process started.
int64_t kiln_scratch_failures();
