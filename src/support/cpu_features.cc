#include "support/cpu_features.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {

namespace {

// (leaf, subleaf, register 0..3 = eax ebx ecx edx, bit) per extension.
struct Bit {
  const char* name;
  unsigned leaf, subleaf;
  int reg, bit;
  int state;  // 0: none; 1: needs AVX state (XCR0 bits 1, 2); 2: AVX-512 state (5-7 too); 3: AMX state (17, 18)
};

constexpr Bit kX86Bits[] = {
    {"sse3", 1, 0, 2, 0, 0},       {"pclmul", 1, 0, 2, 1, 0},     {"ssse3", 1, 0, 2, 9, 0},
    {"fma", 1, 0, 2, 12, 1},       {"cx16", 1, 0, 2, 13, 0},      {"sse4.1", 1, 0, 2, 19, 0},
    {"sse4.2", 1, 0, 2, 20, 0},    {"movbe", 1, 0, 2, 22, 0},     {"popcnt", 1, 0, 2, 23, 0},
    {"aes", 1, 0, 2, 25, 0},       {"avx", 1, 0, 2, 28, 1},       {"f16c", 1, 0, 2, 29, 1},
    {"sse", 1, 0, 3, 25, 0},       {"sse2", 1, 0, 3, 26, 0},      {"bmi", 7, 0, 1, 3, 0},
    {"avx2", 7, 0, 1, 5, 1},       {"bmi2", 7, 0, 1, 8, 0},       {"avx512f", 7, 0, 1, 16, 2},
    {"avx512dq", 7, 0, 1, 17, 2},  {"adx", 7, 0, 1, 19, 0},       {"avx512ifma", 7, 0, 1, 21, 2},
    {"avx512cd", 7, 0, 1, 28, 2},  {"sha", 7, 0, 1, 29, 0},       {"avx512bw", 7, 0, 1, 30, 2},
    {"avx512vl", 7, 0, 1, 31, 2},  {"avx512vbmi", 7, 0, 2, 1, 2}, {"avx512vbmi2", 7, 0, 2, 6, 2},
    {"gfni", 7, 0, 2, 8, 0},       {"vaes", 7, 0, 2, 9, 1},       {"vpclmulqdq", 7, 0, 2, 10, 1},
    {"avx512vnni", 7, 0, 2, 11, 2}, {"avx512bitalg", 7, 0, 2, 12, 2}, {"avx512vpopcntdq", 7, 0, 2, 14, 2},
    {"avx512fp16", 7, 0, 3, 23, 2}, {"amx-bf16", 7, 0, 3, 22, 3},  {"amx-tile", 7, 0, 3, 24, 3},
    {"amx-int8", 7, 0, 3, 25, 3},  {"avxvnni", 7, 1, 0, 4, 1},    {"avx512bf16", 7, 1, 0, 5, 2},
    {"lzcnt", 0x80000001u, 0, 2, 5, 0}, {"sse4a", 0x80000001u, 0, 2, 6, 0}, {"xop", 0x80000001u, 0, 2, 11, 1},
    {"fma4", 0x80000001u, 0, 2, 16, 1}, {"tbm", 0x80000001u, 0, 2, 21, 0},
};

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> detect() {
  std::vector<std::string> out;
#if defined(__x86_64__) || defined(__i386__)
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  uint64_t xcr0 = 0;
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)) != 0) {  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool avx_state = (xcr0 & 0x6) == 0x6;
  const bool avx512_state = avx_state && (xcr0 & 0xe0) == 0xe0;
  const bool amx_state = (xcr0 & 0x60000) == 0x60000;
  for (const Bit& f : kX86Bits) {
    if (f.leaf >= 0x80000000u ? f.leaf > max_ext : f.leaf > max_leaf) continue;
    unsigned r[4] = {0, 0, 0, 0};
    __cpuid_count(f.leaf, f.subleaf, r[0], r[1], r[2], r[3]);
    if ((r[f.reg] & (1u << f.bit)) == 0) continue;
    if ((f.state == 1 && !avx_state) || (f.state == 2 && !avx512_state) || (f.state == 3 && !amx_state)) continue;
    out.push_back(f.name);
  }
#endif
  return sorted(std::move(out));
}

}  // namespace

const char* host_arch() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#elif defined(__i386__)
  return "i386";
#else
  return "unknown";
#endif
}

const std::vector<std::string>& checked_cpu_features() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
#if defined(__x86_64__) || defined(__i386__)
    for (const Bit& f : kX86Bits) v.push_back(f.name);
#endif
    return sorted(std::move(v));
  }();
  return names;
}

const std::vector<std::string>& host_cpu_features() {
  static const std::vector<std::string> features = detect();
  return features;
}

}  // namespace kiln
