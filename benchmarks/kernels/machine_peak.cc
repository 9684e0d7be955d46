#include "kernels/machine_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace kiln::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Independent accumulator chains in named registers (latency 4 x 2 FMA
// ports needs 8; 16 with AVX-512, 12 with AVX2): returns the flops done.
// Inputs come through volatile so nothing folds; the empty asm keeps every
// chain live in a register on each iteration.
#define KILN_FMA4(T, F, a, b, c, d) a = F(a, m, x); b = F(b, m, x); c = F(c, m, x); d = F(d, m, x)

__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iters) {
  volatile float seed = 1e-7f;
  const __m512 m = _mm512_set1_ps(seed), x = _mm512_set1_ps(seed * 0.5f);
  __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f), a3 = _mm512_set1_ps(3.f);
  __m512 a4 = a0, a5 = a1, a6 = a2, a7 = a3, a8 = a0, a9 = a1, a10 = a2, a11 = a3, a12 = a0, a13 = a1, a14 = a2,
         a15 = a3;
  for (int64_t it = 0; it < iters; ++it) {
    KILN_FMA4(__m512, _mm512_fmadd_ps, a0, a1, a2, a3);
    KILN_FMA4(__m512, _mm512_fmadd_ps, a4, a5, a6, a7);
    KILN_FMA4(__m512, _mm512_fmadd_ps, a8, a9, a10, a11);
    KILN_FMA4(__m512, _mm512_fmadd_ps, a12, a13, a14, a15);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    __asm__ volatile("" : "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11), "+v"(a12), "+v"(a13), "+v"(a14), "+v"(a15));
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return static_cast<double>(iters) * 16 * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  volatile float seed = 1e-7f;
  const __m256 m = _mm256_set1_ps(seed), x = _mm256_set1_ps(seed * 0.5f);
  __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f), a3 = _mm256_set1_ps(3.f);
  __m256 a4 = a0, a5 = a1, a6 = a2, a7 = a3, a8 = a0, a9 = a1, a10 = a2, a11 = a3;
  for (int64_t it = 0; it < iters; ++it) {
    KILN_FMA4(__m256, _mm256_fmadd_ps, a0, a1, a2, a3);
    KILN_FMA4(__m256, _mm256_fmadd_ps, a4, a5, a6, a7);
    KILN_FMA4(__m256, _mm256_fmadd_ps, a8, a9, a10, a11);
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  volatile float sink = lanes[0];
  (void)sink;
  return static_cast<double>(iters) * 12 * 8 * 2;
}
#undef KILN_FMA4

// Runs body(thread) on `threads` threads started together; returns the
// wall time of the slowest.
template <typename F>
double run_parallel(int threads, F body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> secs(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      auto s = Clock::now();
      body(t);
      secs[static_cast<size_t>(t)] = std::chrono::duration<double>(Clock::now() - s).count();
    });
  }
  while (ready.load() < threads) {
  }
  go.store(true);
  for (auto& th : pool) th.join();
  return *std::max_element(secs.begin(), secs.end());
}

// Sums a slice with wide loads; the result is kept so the reads stay.
__attribute__((target("avx2"))) float sum_slice(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return lanes[0];
}

}  // namespace

MachinePeak measure_machine_peak(int threads) {
  threads = std::max(threads, 1);
  MachinePeak p;
  bool avx512 = __builtin_cpu_supports("avx512f");
  p.isa = avx512 ? "avx512" : "avx2";
  auto fma = [&](int64_t iters) { return avx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters); };
  // Calibrate to ~0.1 s per thread, then keep the best of three.
  int64_t iters = 1 << 20;
  while (true) {
    auto s = Clock::now();
    fma(iters);
    double t = std::chrono::duration<double>(Clock::now() - s).count();
    if (t > 0.05) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * 0.1 / t);
      break;
    }
    iters *= 4;
  }
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0;
    std::vector<double> per(static_cast<size_t>(threads));
    double secs = run_parallel(threads, [&](int t) { per[static_cast<size_t>(t)] = fma(iters); });
    for (double f : per) flops += f;
    p.gflops = std::max(p.gflops, flops / secs * 1e-9);
  }
  // 512 MiB, far beyond the last-level cache; touched once before timing.
  const int64_t n = int64_t{128} << 20;
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  if (buf == nullptr) return p;
  for (int64_t i = 0; i < n; ++i) buf[i] = 1.0f;
  std::vector<float> sink(static_cast<size_t>(threads));
  int64_t slice = n / threads / 32 * 32;
  for (int rep = 0; rep < 3; ++rep) {
    double secs = run_parallel(threads, [&](int t) {
      sink[static_cast<size_t>(t)] = sum_slice(buf + slice * t, slice);
    });
    p.gbytes_s = std::max(p.gbytes_s, static_cast<double>(slice * threads) * sizeof(float) / secs * 1e-9);
  }
  volatile float keep = sink[0];
  (void)keep;
  std::free(buf);
  return p;
}

}  // namespace kiln::bench
