// Knobs of a schedule template: named integer parameters, each with the list
// of values it may take (its range), plus an optional joint validity rule.
// A point of the space (Knobs) prints as "mr=8 nr=32" and parses back.
// sample_knobs() draws a random valid point: the tuner's sampler, and what the
// template tests use to check every candidate at random knob values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "support/status.h"

namespace kiln::tir {

using Knobs = std::map<std::string, int64_t, std::less<>>;

struct Knob {
  std::string name;
  std::vector<int64_t> values;
  // A knob added to a template after points were recorded without it: the
  // value those points mean (the template's behaviour before the knob).
  // contains() takes a point that lacks it as having this value.
  std::optional<int64_t> absent;
};

struct KnobSpace {
  std::vector<Knob> knobs;
  // Joint constraint (e.g. accumulators that fit in registers); null: all valid.
  std::function<bool(const Knobs&)> valid;
  // Number of points (product of the ranges, before the constraint).
  int64_t size() const;
  bool contains(const Knobs& k) const;
  // `k` with every knob it lacks that has an `absent` value given that value:
  // one spelling per point, whether recorded before a knob existed or after.
  Knobs complete(const Knobs& k) const;
};

std::string knobs_to_string(const Knobs& k);
Result<Knobs> parse_knobs(std::string_view text);
// A uniformly drawn valid point (rejection sampling; error when none of 1000
// draws is valid or the space is empty of values).
Result<Knobs> sample_knobs(const KnobSpace& space, std::mt19937_64& rng);
// Every valid point (for exhaustive measurement of small spaces).
std::vector<Knobs> enumerate_knobs(const KnobSpace& space, size_t limit = 4096);

}  // namespace kiln::tir
