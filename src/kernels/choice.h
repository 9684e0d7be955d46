// What the compiler chose for one kernel: kept with a compiled model (and in
// its package) for `kiln info --kernels`, profiles and traces.
#pragma once

#include <string>

namespace kiln::kernels {

// How one compiled kernel was implemented (kiln info --kernels).
struct KernelChoiceInfo {
  std::string kernel;  // kiln_k3_MatMul
  std::string node;    // MatMul '/fc1/MatMul'
  std::string impl;    // candidate name, "default" (no candidates) or "naive"
  std::string knobs;   // "mr=8 nr=32"
  std::string source;  // priority, measured, database
  std::string why;
  std::string schedule;  // the kernel's schedule as text (tir::Schedule::to_string)
  std::string workload;  // its tuning workload's key (tune::Workload), where kernel choice computed it
};

}  // namespace kiln::kernels
