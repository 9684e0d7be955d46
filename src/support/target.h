// The vector machine the operator strategy and the default schedule tune for:
// the width of a vector register and how many there are. Tile sizes follow
// from it (a register tile holds at most accumulators() vectors; a vector of
// f32 has lanes() elements). It does not choose the instructions: code
// generation (codegen/llvm) always targets the host's own features, so a
// target other than the host's gives correct but differently tuned code.
//
// Target::host() is detected once from the CPU (AVX-512F: avx512, or
// avx512-split on cores that run a 512-bit FMA as two 256-bit halves (AMD
// family 19h, Zen 4); AVX2 with FMA: avx2, otherwise generic; the level-2
// cache size from host_cache_bytes),
// unless the environment variable KILN_TARGET names one (with that target's
// nominal cache size); the test suites set KILN_TARGET=avx512 so that the
// knobs and schedules they print do not depend on the machine they run on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

struct Target {
  std::string name = "generic";  // "avx512", "avx512-split", "avx2", "generic"
  int vector_bytes = 16;
  int vector_registers = 16;
  // Width of the FMA datapath: vector_bytes where one instruction is one
  // pass, 32 on AVX-512 cores that split a 512-bit FMA in two (avx512-split).
  // Tiles that favour fewer, wider vector operands on full-width cores may
  // prefer one vector per row on split ones (strategy/conv.cc wvec_width).
  int fma_bytes = 16;
  // One core's level-2 cache: what a loop nest may expect to re-read without
  // going to the shared last level (nominal 2 MB, 512 KB, 256 KB for the
  // named targets; detected for the host).
  int64_t l2_bytes = 256 << 10;

  // Elements of `elem_bytes` bytes in one vector register (16 f32 with AVX-512).
  int lanes(int elem_bytes = 4) const { return vector_bytes / elem_bytes; }
  // Vector registers a register tile may hold: three quarters of the file,
  // the rest for broadcasts and loads (24 of 32, 12 of 16).
  int accumulators() const { return vector_registers * 3 / 4; }
  bool split_fma() const { return fma_bytes < vector_bytes; }

  static std::optional<Target> named(const std::string& name);  // nullopt: unknown name
  static const Target& host();
};

// The size of the level-`level` data (or unified) cache that the calling
// process's first CPU uses, as the kernel lists it
// (/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}): the cache
// that core shares, e.g. one core complex's L3 rather than the socket's
// total, which the C library's sysconf reports on some AMD hosts. Falls back
// to sysconf, then 0 (unknown).
int64_t host_cache_bytes(int level);

// A sysfs cache size ("48K", "32768K", "2M", "1024"): bytes, or nullopt.
std::optional<int64_t> parse_cache_size(const std::string& text);

}  // namespace kiln
