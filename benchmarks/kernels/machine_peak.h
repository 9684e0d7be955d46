// This machine's ceilings, measured (never assumed): the FP32 FMA throughput
// of a register-resident loop and the memory read bandwidth, at a given
// number of threads. Kernels are reported as a share of these.
#pragma once

namespace kiln::bench {

struct MachinePeak {
  double gflops = 0;      // FP32, all threads together
  double gbytes_s = 0;    // streaming read of a buffer far larger than the caches
  const char* isa = "";   // "avx512" or "avx2" (the widest FMA the host has)
};

// Runs for about 0.3 s per figure. Threads run the loop at once, one each.
MachinePeak measure_machine_peak(int threads);

}  // namespace kiln::bench
