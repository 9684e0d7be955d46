#include "runtime/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace kiln::runtime {

namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
bool overlaps(const BufferLifetime& a, const BufferLifetime& b) { return a.first <= b.last && b.first <= a.last; }
}  // namespace

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });

  std::vector<size_t> placed;
  for (size_t i : order) {
    int64_t size = align_up(std::max<int64_t>(buffers[i].bytes, 1));
    // Intervals [offset, offset + size) taken by placed buffers alive at the same time.
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t j : placed)
      if (overlaps(buffers[i], buffers[j]))
        taken.push_back({plan.offsets[j], plan.offsets[j] + align_up(std::max<int64_t>(buffers[j].bytes, 1))});
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    for (const auto& [lo, hi] : taken) {
      if (offset + size <= lo) break;
      offset = std::max(offset, hi);
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace kiln::runtime
