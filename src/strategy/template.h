// Helpers shared by the candidates' schedule templates and transforms
// (gemm.cc, conv.cc). Not part of the strategy's interface.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "tir/schedule.h"

namespace kiln::strategy {

tir::Primitive prim(std::string kind, std::string stage, std::vector<std::string> axes, int64_t factor = 0);

// The default schedule of `k` with the primitives of `stage` replaced by
// `prims`: the kernel's other stages (fused producers and epilogues) keep theirs.
tir::Schedule replace_stage_schedule(const tir::KernelDef& k, const std::string& stage,
                                     const std::vector<tir::Primitive>& prims);

// The loop a template parallelizes: the first with a known count above 1,
// else the first with an unknown count (a symbolic batch dim is often 1 at
// run time), else -1.
int first_parallel(const std::vector<std::optional<int64_t>>& counts);

void set_string_attr(Node& n, const std::string& name, const std::string& value);

}  // namespace kiln::strategy
