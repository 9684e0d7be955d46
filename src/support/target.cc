#include "support/target.h"

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

namespace kiln {

std::optional<Target> Target::named(const std::string& name) {
  if (name == "avx512") return Target{"avx512", 64, 32, 2 << 20};
  if (name == "avx2") return Target{"avx2", 32, 16, 512 << 10};
  if (name == "generic") return Target{"generic", 16, 16, 256 << 10};
  return std::nullopt;
}

namespace {
Target detect() {
  if (const char* env = std::getenv("KILN_TARGET"); env != nullptr && *env != '\0') {
    if (std::optional<Target> t = Target::named(env)) return *t;
    std::fprintf(stderr, "kiln: warning: KILN_TARGET='%s' is not avx512, avx2 or generic; using the host's\n", env);
  }
  Target t = *Target::named("generic");
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) t = *Target::named("avx512");
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) t = *Target::named("avx2");
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
  // 0 or -1 where the C library cannot tell (some virtual machines): keep the nominal size.
  if (long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); l2 >= (64 << 10)) t.l2_bytes = l2;
#endif
  return t;
}
}  // namespace

const Target& Target::host() {
  static const Target t = detect();
  return t;
}

}  // namespace kiln
