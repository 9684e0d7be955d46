#include "support/memory_limit.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <limits>

#include "support/tensor.h"

namespace kiln {

namespace {
thread_local int64_t t_limit = 0;
}  // namespace

int64_t default_memory_limit() {
  static const int64_t limit = [] {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGE_SIZE);
    int64_t phys = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 34;
    rlimit rl{};
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < static_cast<rlim_t>(phys))
      phys = static_cast<int64_t>(rl.rlim_cur);
    return phys / 10 * 8;
  }();
  return limit;
}

int64_t current_memory_limit() { return t_limit > 0 ? t_limit : default_memory_limit(); }

int64_t set_current_memory_limit(int64_t bytes) {
  int64_t old = t_limit;
  t_limit = bytes > 0 ? bytes : 0;
  return old;
}

std::optional<int64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      // Overflow, unless a later dim is 0.
      for (int64_t e : shape)
        if (e == 0) return 0;
      return std::nullopt;
    }
    n *= d;
  }
  int64_t size = dtype == DType::kString ? static_cast<int64_t>(sizeof(std::string)) : dtype_size(dtype);
  if (size > 0 && n > std::numeric_limits<int64_t>::max() / size) return std::nullopt;
  return n * size;
}

Status check_allocation(DType dtype, const std::vector<int64_t>& shape, int64_t limit, const std::string& what) {
  auto bytes = checked_nbytes(dtype, shape);
  if (!bytes)
    return resource_exhausted() << what << ": " << dtype_name(dtype) << shape_to_string(shape)
                                << " has a byte size that overflows 64 bits";
  if (*bytes > limit)
    return resource_exhausted() << what << ": " << dtype_name(dtype) << shape_to_string(shape) << " needs "
                                << format_bytes(*bytes) << ", more than the memory limit of " << format_bytes(limit)
                                << " (--max-memory)";
  return Status::ok();
}

Result<int64_t> parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 18) return invalid_argument() << "expected a byte size such as 8G, 512M or 1000000, got '" << text << "'";
  int64_t v = std::stoll(text.substr(0, i));
  std::string unit = text.substr(i);
  int shift = 0;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "k" || unit == "K" || unit == "KiB" || unit == "KB") shift = 10;
  else if (unit == "M" || unit == "MiB" || unit == "MB") shift = 20;
  else if (unit == "G" || unit == "GiB" || unit == "GB") shift = 30;
  else if (unit == "T" || unit == "TiB" || unit == "TB") shift = 40;
  else return invalid_argument() << "unknown unit '" << unit << "' in byte size '" << text << "' (use K, M, G or T)";
  if (v > (std::numeric_limits<int64_t>::max() >> shift)) return invalid_argument() << "byte size '" << text << "' is too large";
  return v << shift;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  if (bytes >= (int64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(int64_t{1} << 30));
  else if (bytes >= (int64_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(int64_t{1} << 20));
  else std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

}  // namespace kiln
