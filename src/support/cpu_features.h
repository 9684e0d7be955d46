// The instruction-set extensions of the CPU this process runs on, in LLVM's
// spelling ("avx2", "avx512f", "amx-tile"), read with CPUID (and XGETBV: a
// vector extension counts only where the OS saves its registers). Only the
// extensions in checked_cpu_features() are reported: those that change which
// instructions generated code may contain. A package records the ones its
// kernels were compiled with, and a host lacking any of them refuses it.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// The architecture ("x86_64", "aarch64", ...) this process was built for.
const char* host_arch();

// Every extension name host_cpu_features() can report, sorted.
const std::vector<std::string>& checked_cpu_features();

// The checked extensions this CPU has, sorted.
const std::vector<std::string>& host_cpu_features();

}  // namespace kiln
