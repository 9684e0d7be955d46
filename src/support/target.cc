#include "support/target.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

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
  // 0 where neither the kernel nor the C library can tell (some virtual machines): keep the nominal size.
  if (int64_t l2 = host_cache_bytes(2); l2 >= (64 << 10)) t.l2_bytes = l2;
  return t;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::string();
  while (!line.empty() && (line.back() == ' ' || line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}
}  // namespace

std::optional<int64_t> parse_cache_size(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t n = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) n = n * 10 + (text[i] - '0');
  if (i == 0) return std::nullopt;
  int64_t unit = 1;
  if (i < text.size()) {
    char u = text[i++];
    unit = u == 'K' || u == 'k' ? int64_t{1} << 10 : u == 'M' || u == 'm' ? int64_t{1} << 20 : u == 'G' || u == 'g' ? int64_t{1} << 30 : 0;
    if (unit == 0 || i != text.size()) return std::nullopt;
  }
  if (n > (int64_t{1} << 40) / unit) return std::nullopt;
  return n * unit;
}

int64_t host_cache_bytes(int level) {
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string lv = read_line(dir + "level");
    if (lv.empty()) break;
    const std::string type = read_line(dir + "type");
    if (lv != std::to_string(level) || (type != "Data" && type != "Unified")) continue;
    if (std::optional<int64_t> bytes = parse_cache_size(read_line(dir + "size")); bytes && *bytes > 0) return *bytes;
  }
  long v = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
  if (level == 1) v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  if (level == 2) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (level == 3) v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return v > 0 ? v : 0;
}

const Target& Target::host() {
  static const Target t = detect();
  return t;
}

}  // namespace kiln
