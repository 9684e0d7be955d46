#include "support/target.h"

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {

std::optional<Target> Target::named(const std::string& name) {
  if (name == "avx512") return Target{"avx512", 64, 32, 64, 2 << 20};
  if (name == "avx512-split") return Target{"avx512-split", 64, 32, 32, 1 << 20};
  if (name == "avx2") return Target{"avx2", 32, 16, 32, 512 << 10};
  if (name == "generic") return Target{"generic", 16, 16, 16, 256 << 10};
  return std::nullopt;
}

namespace {
// AMD family 19h cores with AVX-512 (Zen 4; Zen 3 of the same family has
// none) execute a 512-bit FMA as two 256-bit halves. Zen 5 (family 1Ah) and
// Intel's AVX-512 cores have full-width FMA units.
bool split_fma_core() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
  unsigned family = ((a >> 8) & 0xf) + ((a >> 8 & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
  return family == 0x19;
#else
  return false;
#endif
}

Target detect() {
  if (const char* env = std::getenv("KILN_TARGET"); env != nullptr && *env != '\0') {
    if (std::optional<Target> t = Target::named(env)) return *t;
    std::fprintf(stderr, "kiln: warning: KILN_TARGET='%s' is not avx512, avx512-split, avx2 or generic; using the host's\n", env);
  }
  Target t = *Target::named("generic");
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) t = *Target::named(split_fma_core() ? "avx512-split" : "avx512");
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
