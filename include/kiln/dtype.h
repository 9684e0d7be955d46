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
  // Containers, not ONNX element types (outside [0, kMaxDType], so a model
  // file cannot name them): a sequence is a rank-1 tensor whose elements are
  // Tensors (its length the dim), an optional one of length 0 (no element) or
  // 1. The element type is TensorType::elem at compile time.
  kSequence = 64,
  kOptional = 65,
};

constexpr int kMaxDType = 23;

// kSequence or kOptional: elements are Tensor objects.
inline bool dtype_is_container(DType t) { return t == DType::kSequence || t == DType::kOptional; }

// Short lowercase name used by the IR printer: f32, i64, bool, ...
const char* dtype_name(DType t);
// Inverse of dtype_name; kUndefined when the name is unknown.
DType dtype_from_name(std::string_view name);
// Size of one element in bytes (strings: sizeof(std::string); containers:
// sizeof(Tensor); 4-bit types: 1).
int64_t dtype_size(DType t);
bool dtype_is_float(DType t);   // f16, bf16, f32, f64 and the float8s
bool dtype_is_int(DType t);     // signed and unsigned integers (not bool)
bool dtype_is_signed(DType t);
// True when the compiler can generate code for this dtype (f32, f64, ints,
// bool, and the narrow float storage types: f16, bf16 and the float8s, whose
// values are f32 in registers).
bool dtype_is_compilable(DType t);
// f16, bf16 or one of the float8 types: stored narrow, computed as f32.
bool dtype_is_narrow_float(DType t);
// v as int64, saturating (NaN as 0): C++ leaves an out-of-range conversion undefined.
int64_t saturate_to_i64(double v);

// Bit conversions between f32 and the narrow float types. f32 -> f16 / bf16
// round to nearest even (NaN stays NaN). The float8 conversions follow the
// ONNX reference (onnx.helper.float32_to_float8e4m3 / _e5m2): with `saturate`
// out-of-range values and infinities become the largest finite value,
// without it they become NaN (or infinity for e5m2).
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float v);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float v);
float f8_to_f32(uint8_t bits, DType t);
uint8_t f32_to_f8(float v, DType t, bool saturate);
// One element of narrow float type t at p, as f32; and the store of v
// (float8: finite values saturate, infinities and NaN do not).
float narrow_float_load(const void* p, DType t);
void narrow_float_store(void* p, DType t, float v);
// v rounded to the nearest value of narrow float type t, as f32.
float round_to_narrow_float(float v, DType t, bool saturate = true);

}  // namespace kiln
