// Aligned heap blocks for tensor data: 64-byte aligned (one cache line, the
// widest vector load); blocks of at least kHugeBlockBytes start on a 2 MB
// boundary and are advised into transparent huge pages (madvise
// MADV_HUGEPAGE, honoured where the kernel's THP mode is "madvise" or
// "always"), so kernels streaming large weights or activations take fewer TLB
// misses. Free with std::free.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

inline constexpr size_t kHugeBlockBytes = size_t{4} << 20;

// Null when the allocation fails (or bytes is 0).
void* allocate_aligned(size_t bytes);

}  // namespace kiln
