// Static memory planning: places buffers with known sizes and lifetimes at
// offsets in one arena so that buffers alive at the same time never overlap
// and the arena is small. Greedy placements (largest, longest-lived, most
// bytes x lifetime first; each at the lowest fitting 64-byte-aligned offset
// or in the smallest fitting gap); the smallest arena is kept.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::runtime {

struct BufferLifetime {
  int64_t bytes = 0;  // size in bytes
  int first = 0;      // index of the instruction that defines it
  int last = 0;       // index of the last instruction that reads it (inclusive)
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // byte offset per buffer, 64-byte aligned
  int64_t arena_bytes = 0;       // total size of the arena
};

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers);

// The most (64-byte aligned) bytes alive at once and the first instruction
// where they are: no plan's arena is smaller.
struct LivePeak {
  int64_t bytes = 0;
  int at = -1;
};
LivePeak peak_of(const std::vector<BufferLifetime>& buffers);

}  // namespace kiln::runtime
