#include "support/trace.h"

#include <atomic>
#include <chrono>

namespace kiln::trace {

Scope& current() {
  thread_local Scope scope;
  return scope;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int32_t thread_id() {
  static std::atomic<int32_t> next{1};
  thread_local int32_t id = next.fetch_add(1);
  return id;
}

}  // namespace kiln::trace
