// The cost model's features of one scheduled kernel: its loop IR (after
// tir::lower) and the candidate and knobs that produced it, as a fixed-length
// vector (kNumFeatures), in the spirit of Ansor's per-store features: how much
// is computed and loaded, how much of it in vector lanes, unrolled, in
// parallel and how evenly, what each loop level touches against the caches,
// and the arithmetic intensity. Magnitudes are log2(1 + x).
#pragma once

#include <string>
#include <vector>

#include "support/target.h"
#include "tir/tir.h"

namespace kiln::tune {

inline constexpr int kNumFeatures = 42;

// Names of the features, for docs and tests.
const std::vector<std::string>& feature_names();

std::vector<float> kernel_features(const tir::PrimFunc& f, const std::string& candidate, const std::string& knobs,
                                   int threads, const Target& target);

}  // namespace kiln::tune
