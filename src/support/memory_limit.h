// Limits on memory whose size comes from a model or its inputs. A tensor, a
// kernel's scratch block or a model's arena larger than the limit is an error
// (StatusCode::kResourceExhausted) naming what needed it, instead of an
// allocation that aborts or gets the process killed by the OOM killer.
//
// The default limit is 80% of the machine's physical memory (or of the
// address-space rlimit when lower). Compiled models take their own limit
// (CompileOptions::max_memory_bytes, `kiln --max-memory`); the VM makes it
// the current limit of its thread while it runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "support/dtype.h"
#include "support/status.h"

namespace kiln {

// 80% of physical memory (bytes), computed once.
int64_t default_memory_limit();

// The limit in force on this thread: the running model's, else the default.
int64_t current_memory_limit();
// Sets this thread's limit (0 restores the default); returns the previous setting.
int64_t set_current_memory_limit(int64_t bytes);

// Bytes of a dense tensor of `shape` and `dtype`, or nullopt when the element
// count or byte size overflows int64 (or a dim is negative).
std::optional<int64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape);

// OK when a tensor of this shape fits under `limit`; else an error naming
// `what`, the shape and the limit.
Status check_allocation(DType dtype, const std::vector<int64_t>& shape, int64_t limit, const std::string& what);

// Parses "4G", "512M", "512MB", "100k", "123" (bytes; K, M, G, T with or
// without B or iB are binary multiples).
Result<int64_t> parse_byte_size(const std::string& text);
std::string format_bytes(int64_t bytes);

}  // namespace kiln
