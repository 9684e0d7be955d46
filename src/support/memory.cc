#include "support/memory.h"

#include <cstdlib>

#include <sys/mman.h>

namespace kiln {

void* allocate_aligned(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < kHugeBlockBytes) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  constexpr size_t kHugePage = size_t{2} << 20;
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KB pages
  return p;
}

}  // namespace kiln
