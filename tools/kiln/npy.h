// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
// Supported: little-endian (or single-byte) C-order arrays of f32, f64, i8, i16,
// i32, i64, u8, u16, u32, u64 and bool. Anything else is a clear error, never a crash.
#pragma once

#include <string>

#include "support/status.h"
#include "support/tensor.h"

namespace kiln::cli {

// Parses a whole .npy file held in memory; `source` names it in error messages.
Result<Tensor> parse_npy(const std::string& bytes, const std::string& source);
Result<Tensor> read_npy(const std::string& path);

// The file's bytes: a version 1.0 header (2.0 when the header is too long), then data.
Result<std::string> encode_npy(const Tensor& tensor);
Status write_npy(const std::string& path, const Tensor& tensor);

}  // namespace kiln::cli
