#include "runtime/memory_plan.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace kiln::runtime {

namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
bool overlaps(const BufferLifetime& a, const BufferLifetime& b) { return a.first <= b.last && b.first <= a.last; }
}  // namespace

namespace {

// Places buffers in `order`, each at the lowest offset that fits (first
// fit) or in the smallest gap that fits (best fit) among the buffers
// already placed whose lifetimes overlap its own.
MemoryPlan place(const std::vector<BufferLifetime>& buffers, const std::vector<size_t>& order, bool best_fit) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> taken;
  for (size_t i : order) {
    const int64_t size = align_up(std::max<int64_t>(buffers[i].bytes, 1));
    taken.clear();
    for (size_t j : placed)
      if (overlaps(buffers[i], buffers[j]))
        taken.push_back({plan.offsets[j], plan.offsets[j] + align_up(std::max<int64_t>(buffers[j].bytes, 1))});
    std::sort(taken.begin(), taken.end());
    int64_t offset = -1, gap = 0, end = 0;
    for (const auto& [lo, hi] : taken) {
      if (lo - end >= size && (offset < 0 || lo - end < gap)) {
        offset = end;
        gap = lo - end;
        if (!best_fit) break;
      }
      end = std::max(end, hi);
    }
    if (offset < 0) offset = end;
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace

LivePeak peak_of(const std::vector<BufferLifetime>& buffers) {
  std::vector<std::pair<int, int64_t>> events;  // (instruction, bytes gained there)
  for (const BufferLifetime& b : buffers) {
    events.push_back({b.first, align_up(std::max<int64_t>(b.bytes, 1))});
    events.push_back({b.last + 1, -align_up(std::max<int64_t>(b.bytes, 1))});
  }
  std::sort(events.begin(), events.end());
  LivePeak peak;
  int64_t live = 0;
  for (size_t k = 0; k < events.size(); ++k) {
    live += events[k].second;
    if ((k + 1 == events.size() || events[k + 1].first != events[k].first) && live > peak.bytes) {
      peak.bytes = live;
      peak.at = events[k].first;
    }
  }
  return peak;
}

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers) {
  // The most bytes alive at once: no plan is smaller.
  const int64_t live_peak = peak_of(buffers).bytes;
  // Orders: largest first; longest-lived first; most bytes x lifetime
  // first; each placed first-fit and best-fit. The smallest arena wins
  // (the first among equals).
  auto span = [&](size_t a) { return static_cast<int64_t>(buffers[a].last - buffers[a].first + 1); };
  const std::vector<std::function<bool(size_t, size_t)>> orders = {
      [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; },
      [&](size_t a, size_t b) { return span(a) != span(b) ? span(a) > span(b) : buffers[a].bytes > buffers[b].bytes; },
      [&](size_t a, size_t b) {
        return static_cast<double>(buffers[a].bytes) * static_cast<double>(span(a)) >
               static_cast<double>(buffers[b].bytes) * static_cast<double>(span(b));
      },
  };
  MemoryPlan best;
  bool have = false;

  for (const auto& less : orders) {
    std::vector<size_t> order(buffers.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), less);
    for (bool best_fit : {false, true}) {
      MemoryPlan plan = place(buffers, order, best_fit);
      if (!have || plan.arena_bytes < best.arena_bytes) {
        best = std::move(plan);
        have = true;
      }
      if (best.arena_bytes <= live_peak) return best;
    }
  }
  return best;
}

}  // namespace kiln::runtime
