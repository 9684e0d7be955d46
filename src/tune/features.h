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
#include "tune/tune.h"

namespace kiln::tune {

inline constexpr int kNumFeatures = 85;
// The version of the features' definition. Raise it whenever a feature's
// meaning changes: records and stored cost models carry it, a model trains
// only on records of this version and loads only if it was trained on them,
// and `kiln db refeature` recomputes older records' features.
inline constexpr int kFeatureVersion = 2;

// Names of the features, for docs and tests.
const std::vector<std::string>& feature_names();

// The caches are those of `key` (null: TargetKey::host(target)).
std::vector<float> kernel_features(const tir::PrimFunc& f, const std::string& candidate, const std::string& knobs,
                                   int threads, const Target& target, const TargetKey* key = nullptr);

}  // namespace kiln::tune
