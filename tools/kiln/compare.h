// Comparing a computed tensor with an expected one, as `kiln run --test-data` does.
#pragma once

#include <string>

#include "support/tensor.h"

namespace kiln::cli {

struct Comparison {
  bool pass = false;
  std::string problem;        // why it failed when shapes or dtypes differ; empty otherwise
  double max_abs_error = 0;   // max |actual - expected| over elements
  double max_rel_error = 0;   // max |actual - expected| / |expected| over elements with expected != 0
  int64_t mismatches = 0;     // elements outside atol + rtol * |expected|
  int64_t first_mismatch = -1;
};

// Elementwise check |actual - expected| <= atol + rtol * |expected|. NaN matches NaN,
// an infinity matches the same infinity. Shapes and dtypes must be equal.
Comparison compare_tensors(const Tensor& actual, const Tensor& expected, double atol, double rtol);

}  // namespace kiln::cli
