// Element types. Values match ONNX TensorProto.DataType so import is a cast.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln {

enum class DType : uint8_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
};

constexpr int kMaxDType = 23;

// Short lowercase name used by the IR printer: f32, i64, bool, ...
const char* dtype_name(DType t);
// Inverse of dtype_name; kUndefined when the name is unknown.
DType dtype_from_name(std::string_view name);
// Size of one element in bytes (strings: sizeof(std::string); 4-bit types: 1).
int64_t dtype_size(DType t);
bool dtype_is_float(DType t);   // f16, bf16, f32, f64 and the float8s
bool dtype_is_int(DType t);     // signed and unsigned integers (not bool)
bool dtype_is_signed(DType t);
// True when the compiler can generate code for this dtype (f32, f64, ints, bool).
bool dtype_is_compilable(DType t);

}  // namespace kiln
