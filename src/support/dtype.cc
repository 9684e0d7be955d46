#include "support/dtype.h"

namespace kiln {

namespace {
struct DTypeInfo {
  const char* name;
  int64_t size;
};
constexpr DTypeInfo kInfo[kMaxDType + 1] = {
    {"undef", 0}, {"f32", 4},   {"u8", 1},       {"i8", 1},         {"u16", 2},    {"i16", 2},
    {"i32", 4},   {"i64", 8},   {"string", 32},  {"bool", 1},       {"f16", 2},    {"f64", 8},
    {"u32", 4},   {"u64", 8},   {"c64", 8},      {"c128", 16},      {"bf16", 2},   {"f8e4m3fn", 1},
    {"f8e4m3fnuz", 1}, {"f8e5m2", 1}, {"f8e5m2fnuz", 1}, {"u4", 1}, {"i4", 1}, {"f4e2m1", 1},
};
}  // namespace

const char* dtype_name(DType t) {
  int i = static_cast<int>(t);
  return i <= kMaxDType ? kInfo[i].name : "undef";
}

DType dtype_from_name(std::string_view name) {
  for (int i = 1; i <= kMaxDType; ++i)
    if (name == kInfo[i].name) return static_cast<DType>(i);
  return DType::kUndefined;
}

int64_t dtype_size(DType t) {
  int i = static_cast<int>(t);
  if (t == DType::kString) return static_cast<int64_t>(sizeof(std::string));
  return i <= kMaxDType ? kInfo[i].size : 0;
}

bool dtype_is_float(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kFloat64: case DType::kFloat16: case DType::kBFloat16:
    case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: case DType::kFloat4E2M1:
      return true;
    default:
      return false;
  }
}

bool dtype_is_int(DType t) {
  switch (t) {
    case DType::kUInt8: case DType::kInt8: case DType::kUInt16: case DType::kInt16:
    case DType::kInt32: case DType::kInt64: case DType::kUInt32: case DType::kUInt64:
    case DType::kUInt4: case DType::kInt4:
      return true;
    default:
      return false;
  }
}

bool dtype_is_signed(DType t) {
  switch (t) {
    case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64: case DType::kInt4:
      return true;
    default:
      return dtype_is_float(t);
  }
}

bool dtype_is_compilable(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kFloat64: case DType::kUInt8: case DType::kInt8:
    case DType::kUInt16: case DType::kInt16: case DType::kInt32: case DType::kInt64:
    case DType::kUInt32: case DType::kUInt64: case DType::kBool:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln
