#include "compare.h"

#include <cmath>
#include <sstream>

namespace kiln::cli {

Comparison compare_tensors(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  Comparison c;
  if (actual.dtype() != expected.dtype()) {
    c.problem = std::string("dtype ") + dtype_name(actual.dtype()) + ", expected " +
                dtype_name(expected.dtype());
    return c;
  }
  if (actual.shape() != expected.shape()) {
    c.problem = "shape " + shape_to_string(actual.shape()) + ", expected " +
                shape_to_string(expected.shape());
    return c;
  }
  if (!dtype_is_float(actual.dtype()) && !dtype_is_int(actual.dtype()) &&
      actual.dtype() != DType::kBool) {
    c.problem = std::string("cannot compare ") + dtype_name(actual.dtype()) + " tensors";
    return c;
  }
  int64_t n = actual.numel();
  for (int64_t i = 0; i < n; ++i) {
    double a = actual.get_f64(i);
    double e = expected.get_f64(i);
    bool ok;
    if (std::isnan(a) || std::isnan(e)) {
      ok = std::isnan(a) && std::isnan(e);
    } else if (std::isinf(a) || std::isinf(e)) {
      ok = a == e;
    } else {
      double err = std::fabs(a - e);
      ok = err <= atol + rtol * std::fabs(e);
      if (err > c.max_abs_error) c.max_abs_error = err;
      if (e != 0 && err / std::fabs(e) > c.max_rel_error) c.max_rel_error = err / std::fabs(e);
    }
    if (!ok) {
      if (c.mismatches == 0) c.first_mismatch = i;
      ++c.mismatches;
      if (!std::isnan(a) && !std::isnan(e) && (std::isinf(a) || std::isinf(e))) {
        c.max_abs_error = INFINITY;
      } else if (std::isnan(a) != std::isnan(e)) {
        c.max_abs_error = NAN;
      }
    }
  }
  c.pass = c.mismatches == 0;
  return c;
}

}  // namespace kiln::cli
