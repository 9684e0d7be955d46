#include "support/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "support/tensor.h"

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
  if (t == DType::kSequence) return "seq";
  if (t == DType::kOptional) return "opt";
  int i = static_cast<int>(t);
  return i <= kMaxDType ? kInfo[i].name : "undef";
}

DType dtype_from_name(std::string_view name) {
  for (int i = 1; i <= kMaxDType; ++i)
    if (name == kInfo[i].name) return static_cast<DType>(i);
  if (name == "seq") return DType::kSequence;
  if (name == "opt") return DType::kOptional;
  return DType::kUndefined;
}

int64_t dtype_size(DType t) {
  int i = static_cast<int>(t);
  if (t == DType::kString) return static_cast<int64_t>(sizeof(std::string));
  if (dtype_is_container(t)) return static_cast<int64_t>(sizeof(Tensor));
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
    case DType::kInt4: case DType::kUInt4:  // one per byte in memory (int4 sign-extended)
      return true;
    default:
      return dtype_is_narrow_float(t);
  }
}

bool dtype_is_narrow_float(DType t) {
  switch (t) {
    case DType::kFloat16: case DType::kBFloat16: case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ:
      return true;
    default:
      return false;
  }
}

namespace {
uint32_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
float f32_from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// Rounding of the subnormal range shared by the float8 encoders (ONNX reference).
bool round_subnormal_up(uint32_t m, uint32_t ret, uint32_t mask) {
  return (m & mask) && ((ret & 1) || (m & (mask - 1)) > 0 || ((m & mask) && (m & (mask << 1)) && (m & (mask - 1)) == 0));
}

uint8_t f32_to_e4m3(float x, bool uz, bool saturate) {
  uint32_t b = f32_bits(x);
  uint32_t ret = (b & 0x80000000u) >> 24;
  if (uz) {
    if ((b & 0x7FC00000u) == 0x7FC00000u) return 0x80;
    if (std::isinf(x)) return saturate ? static_cast<uint8_t>(ret | 127) : 0x80;
    uint32_t e = (b & 0x7F800000u) >> 23, m = b & 0x007FFFFFu;
    if (e < 116) {
      ret = 0;
    } else if (e < 120) {
      int ex = static_cast<int>(e) - 119;
      if (ex >= -2) {
        ret |= 1u << (2 + ex);
        ret |= m >> (21 - ex);
      } else if (m > 0) {
        ret |= 1;
      } else {
        ret = 0;
      }
      if (round_subnormal_up(m, ret, 1u << (20 - ex))) ret += 1;
    } else if (e < 135) {
      uint32_t ex = e - 119;
      if (ex == 0) {
        ret |= 0x4;
        ret |= m >> 21;
      } else {
        ret |= ex << 3;
        ret |= m >> 20;
      }
      if ((m & 0x80000) && ((m & 0x100000) || (m & 0x7FFFF))) {
        if ((ret & 0x7F) < 0x7F) {
          ret += 1;
        } else if (!saturate) {
          return 0x80;
        }
      }
    } else if (saturate) {
      ret |= 0x7F;
    } else {
      ret = 0x80;
    }
    return static_cast<uint8_t>(ret);
  }
  if ((b & 0x7FC00000u) == 0x7FC00000u) return static_cast<uint8_t>(0x7F | ret);
  if (std::isinf(x)) return static_cast<uint8_t>(saturate ? (ret | 126) : (ret | 0x7F));
  uint32_t e = (b & 0x7F800000u) >> 23, m = b & 0x007FFFFFu;
  if (e != 0) {
    if (e < 117) {
    } else if (e < 121) {
      int ex = static_cast<int>(e) - 120;
      if (ex >= -2) {
        ret |= 1u << (2 + ex);
        ret |= m >> (21 - ex);
      } else if (m > 0) {
        ret |= 1;
      }
      if (round_subnormal_up(m, ret, 1u << (20 - ex))) ret += 1;
    } else if (e < 136) {
      uint32_t ex = e - 120;
      if (ex == 0) {
        ret |= 0x4;
        ret |= m >> 21;
      } else {
        ret |= ex << 3;
        ret |= m >> 20;
        if ((ret & 0x7F) == 0x7F) ret &= 0xFE;
      }
      if ((m & 0x80000) && ((m & 0x100000) || (m & 0x7FFFF))) {
        if ((ret & 0x7F) < 0x7E) {
          ret += 1;
        } else if (!saturate) {
          ret |= 0x7F;
        }
      }
    } else if (saturate) {
      ret |= 126;
    } else {
      ret |= 0x7F;
    }
  }
  return static_cast<uint8_t>(ret);
}

uint8_t f32_to_e5m2(float x, bool fnuz, bool saturate) {
  uint32_t b = f32_bits(x);
  uint32_t ret = (b & 0x80000000u) >> 24;
  if (fnuz) {
    if ((b & 0x7FC00000u) == 0x7FC00000u) return 0x80;
    if ((b & 0x7FFFFFFFu) == 0x7F800000u) return saturate ? static_cast<uint8_t>(ret | 0x7F) : 0x80;
    uint32_t e = (b & 0x7F800000u) >> 23, m = b & 0x007FFFFFu;
    if (e < 109) {
      ret = 0;
    } else if (e < 112) {
      int ex = static_cast<int>(e) - 111;
      if (ex >= -1) {
        ret |= 1u << (1 + ex);
        ret |= m >> (22 - ex);
      } else if (m > 0) {
        ret |= 1;
      } else {
        ret = 0;
      }
      if (round_subnormal_up(m, ret, 1u << (21 - ex))) ret += 1;
    } else if (e < 143) {
      uint32_t ex = e - 111;
      ret |= ex << 2;
      ret |= m >> 21;
      if ((m & 0x100000) && ((m & 0xFFFFF) || (m & 0x200000))) {
        if ((ret & 0x7F) < 0x7F) {
          ret += 1;
        } else if (!saturate) {
          ret = 0x80;
        }
      }
    } else if (e == 255 && m == 0) {
      ret = 0x80;
    } else if (saturate) {
      ret |= 0x7F;
    } else {
      ret = 0x80;
    }
    return static_cast<uint8_t>(ret);
  }
  if ((b & 0x7FC00000u) == 0x7FC00000u) return static_cast<uint8_t>(0x7F | ret);
  if (std::isinf(x)) return static_cast<uint8_t>(saturate ? (0x7B | ret) : (0x7C | ret));
  uint32_t e = (b & 0x7F800000u) >> 23, m = b & 0x007FFFFFu;
  if (e != 0) {
    if (e < 110) {
    } else if (e < 113) {
      int ex = static_cast<int>(e) - 112;
      if (ex >= -1) {
        ret |= 1u << (1 + ex);
        ret |= m >> (22 - ex);
      } else if (m > 0) {
        ret |= 1;
      }
      if (round_subnormal_up(m, ret, 1u << (21 - ex))) ret += 1;
    } else if (e < 143) {
      uint32_t ex = e - 112;
      ret |= ex << 2;
      ret |= m >> 21;
      if ((m & 0x100000) && ((m & 0xFFFFF) || (m & 0x200000))) {
        if ((ret & 0x7F) < 0x7B) {
          ret += 1;
        } else {
          ret |= saturate ? 0x7B : 0x7C;
        }
      }
    } else {
      ret |= saturate ? 0x7B : 0x7C;
    }
  }
  return static_cast<uint8_t>(ret);
}
}  // namespace

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float v) {
  uint32_t b = f32_bits(v);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00 | ((a >> 13) & 0x3FF));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to infinity
  if (a < 0x38800000u) {
    // Subnormal or zero: scale so that the f16 subnormal step is 1, round to nearest even.
    float f = f32_from_bits(a) * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(f)));
  }
  uint32_t r = a + 0xFFF + ((a >> 13) & 1);  // round to nearest even on the dropped 13 bits
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

float bf16_to_f32(uint16_t bits) { return f32_from_bits(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float v) {
  uint32_t b = f32_bits(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

float f8_to_f32(uint8_t bits, DType t) {
  bool e4m3 = t == DType::kFloat8E4M3FN || t == DType::kFloat8E4M3FNUZ;
  bool uz = t == DType::kFloat8E4M3FNUZ || t == DType::kFloat8E5M2FNUZ;
  int man_bits = e4m3 ? 3 : 2;
  int bias = e4m3 ? (uz ? 8 : 7) : (uz ? 16 : 15);
  bool neg = (bits & 0x80) != 0;
  if (uz && bits == 0x80) return NAN;
  int exp = (bits & 0x7F) >> man_bits;
  int man = bits & ((1 << man_bits) - 1);
  if (!uz) {
    if (e4m3 && (bits & 0x7F) == 0x7F) return neg ? -NAN : NAN;
    if (!e4m3 && exp == 31) {
      if (man == 0) return neg ? -INFINITY : INFINITY;
      return neg ? -NAN : NAN;
    }
  }
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), 1 - bias - man_bits)
                     : std::ldexp(static_cast<float>((1 << man_bits) | man), exp - bias - man_bits);
  return neg ? -v : v;
}

uint8_t f32_to_f8(float v, DType t, bool saturate) {
  switch (t) {
    case DType::kFloat8E4M3FN: return f32_to_e4m3(v, false, saturate);
    case DType::kFloat8E4M3FNUZ: return f32_to_e4m3(v, true, saturate);
    case DType::kFloat8E5M2: return f32_to_e5m2(v, false, saturate);
    case DType::kFloat8E5M2FNUZ: return f32_to_e5m2(v, true, saturate);
    default: return 0;
  }
}

float narrow_float_load(const void* p, DType t) {
  if (t == DType::kFloat16 || t == DType::kBFloat16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return t == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return f8_to_f32(*static_cast<const uint8_t*>(p), t);
}

void narrow_float_store(void* p, DType t, float v) {
  if (t == DType::kFloat16 || t == DType::kBFloat16) {
    uint16_t h = t == DType::kFloat16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(p, &h, 2);
    return;
  }
  // Finite values saturate; infinities and NaN (from a non-saturating cast) keep their meaning.
  *static_cast<uint8_t*>(p) = f32_to_f8(v, t, std::isfinite(v));
}

float round_to_narrow_float(float v, DType t, bool saturate) {
  switch (t) {
    case DType::kFloat16: return f16_to_f32(f32_to_f16(v));
    case DType::kBFloat16: return bf16_to_f32(f32_to_bf16(v));
    default: return f8_to_f32(f32_to_f8(v, t, saturate), t);
  }
}

int64_t saturate_to_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  if (v >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(v);
}

}  // namespace kiln
