#include "support/target.h"

#include <cstdio>
#include <cstdlib>

namespace kiln {

std::optional<Target> Target::named(const std::string& name) {
  if (name == "avx512") return Target{"avx512", 64, 32};
  if (name == "avx2") return Target{"avx2", 32, 16};
  if (name == "generic") return Target{"generic", 16, 16};
  return std::nullopt;
}

namespace {
Target detect() {
  if (const char* env = std::getenv("KILN_TARGET"); env != nullptr && *env != '\0') {
    if (std::optional<Target> t = Target::named(env)) return *t;
    std::fprintf(stderr, "kiln: warning: KILN_TARGET='%s' is not avx512, avx2 or generic; using the host's\n", env);
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return *Target::named("avx512");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return *Target::named("avx2");
#endif
  return *Target::named("generic");
}
}  // namespace

const Target& Target::host() {
  static const Target t = detect();
  return t;
}

}  // namespace kiln
