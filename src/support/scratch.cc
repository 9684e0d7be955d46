#include "support/scratch.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <vector>

#include "support/memory_limit.h"
#include "support/status.h"

namespace {

// Per-thread cache: blocks by size. A few blocks per size cover a kernel's
// scratch buffers; more are freed.
constexpr size_t kMaxCachedPerSize = 8;

struct ScratchCache {
  std::map<int64_t, std::vector<void*>> free_blocks;
  ~ScratchCache() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) std::free(p);
  }
};

ScratchCache& cache() {
  thread_local ScratchCache c;
  return c;
}

std::atomic<int64_t> g_failures{0};

int64_t rounded(int64_t bytes) {
  int64_t b = bytes < 64 ? 64 : bytes;
  return (b + 63) / 64 * 64;
}

}  // namespace

extern "C" void* kiln_scratch_alloc(int64_t bytes) {
  int64_t size = rounded(bytes);
  auto& blocks = cache().free_blocks[size];
  if (!blocks.empty()) {
    void* p = blocks.back();
    blocks.pop_back();
    return p;
  }
  // Worker threads have no model of their own: the default limit applies.
  if (bytes < 0 || size > kiln::default_memory_limit()) {
    g_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  void* p = std::aligned_alloc(64, static_cast<size_t>(size));
  if (p == nullptr) g_failures.fetch_add(1, std::memory_order_relaxed);
  return p;
}

extern "C" void kiln_scratch_free(void* block, int64_t bytes) {
  if (block == nullptr) return;
  auto& blocks = cache().free_blocks[rounded(bytes)];
  if (blocks.size() < kMaxCachedPerSize) {
    blocks.push_back(block);
  } else {
    std::free(block);
  }
}

int64_t kiln_scratch_failures() { return g_failures.load(std::memory_order_relaxed); }
