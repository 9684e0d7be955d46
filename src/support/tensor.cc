#include "support/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

#include "support/memory.h"
#include "support/memory_limit.h"
#include "support/status.h"

namespace kiln {

namespace {
// Zero-filled storage for n elements; null when the allocation fails.
std::shared_ptr<void> try_allocate_storage(DType dtype, int64_t n) {
  if (dtype == DType::kString) {
    auto* p = new std::string[n > 0 ? n : 1];
    return std::shared_ptr<void>(p, [](void* q) { delete[] static_cast<std::string*>(q); });
  }
  if (dtype_is_container(dtype)) {
    auto* p = new Tensor[n > 0 ? n : 1];
    return std::shared_ptr<void>(p, [](void* q) { delete[] static_cast<Tensor*>(q); });
  }
  int64_t bytes = n * dtype_size(dtype);
  // 64-byte alignment for vector loads (huge pages for large blocks:
  // support/memory.h); at least one cache line so data() is never null.
  size_t alloc = static_cast<size_t>(((bytes + 63) / 64) * 64);
  if (alloc == 0) alloc = 64;
  void* p = allocate_aligned(alloc);
  if (p == nullptr) return nullptr;
  std::memset(p, 0, alloc);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

std::shared_ptr<void> allocate_storage(DType dtype, int64_t n) {
  std::shared_ptr<void> p = try_allocate_storage(dtype, n);
  KILN_CHECK(p != nullptr) << "out of memory allocating " << n << " elements of " << dtype_name(dtype);
  return p;
}
}  // namespace

Result<Tensor> Tensor::allocate(DType dtype, std::vector<int64_t> shape, const std::string& what) {
  KILN_RETURN_IF_ERROR(check_allocation(dtype, shape, current_memory_limit(), what));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = try_allocate_storage(dtype, t.numel());
  if (t.storage_ == nullptr)
    return resource_exhausted() << what << ": out of memory allocating " << t.describe() << " ("
                                << format_bytes(t.nbytes()) << ")";
  t.data_ = t.storage_.get();
  return t;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  storage_ = allocate_storage(dtype_, numel());
  data_ = storage_.get();
}

Tensor Tensor::borrow(DType dtype, std::vector<int64_t> shape, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  return t;
}

Tensor Tensor::wrap(DType dtype, std::vector<int64_t> shape, std::shared_ptr<void> storage) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::move(storage);
  t.data_ = t.storage_.get();
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

double Tensor::get_f64(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32: return static_cast<const float*>(data_)[i];
    case DType::kFloat64: return static_cast<const double*>(data_)[i];
    case DType::kInt8: case DType::kInt4: return static_cast<const int8_t*>(data_)[i];
    case DType::kUInt8: case DType::kUInt4: return static_cast<const uint8_t*>(data_)[i];
    case DType::kInt16: return static_cast<const int16_t*>(data_)[i];
    case DType::kUInt16: return static_cast<const uint16_t*>(data_)[i];
    case DType::kInt32: return static_cast<const int32_t*>(data_)[i];
    case DType::kUInt32: return static_cast<const uint32_t*>(data_)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(data_)[i]);
    case DType::kUInt64: return static_cast<double>(static_cast<const uint64_t*>(data_)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(data_)[i] ? 1.0 : 0.0;
    default:
      KILN_CHECK(dtype_is_narrow_float(dtype_)) << "get_f64 on " << dtype_name(dtype_);
      return narrow_float_load(static_cast<const char*>(data_) + i * dtype_size(dtype_), dtype_);
  }
  return 0;
}

namespace {
// v converted to integer type T saturating (NaN to 0): the conversion of an
// out-of-range double is undefined in C++.
template <typename T>
T saturate_to(double v) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    if (!(v > 0)) return 0;
    return v >= 18446744073709551616.0 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(v);
  } else {
    return static_cast<T>(std::clamp<int64_t>(saturate_to_i64(v), std::numeric_limits<T>::min(),
                                              std::numeric_limits<T>::max()));
  }
}
}  // namespace

int64_t Tensor::get_i64(int64_t i) const {
  switch (dtype_) {
    case DType::kInt64: return static_cast<const int64_t*>(data_)[i];
    case DType::kUInt64: return static_cast<int64_t>(static_cast<const uint64_t*>(data_)[i]);
    default: return saturate_to<int64_t>(get_f64(i));
  }
}

// Integer element types saturate (a NaN stores 0).
void Tensor::set_f64(int64_t i, double v) {
  switch (dtype_) {
    case DType::kFloat32: static_cast<float*>(data_)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(data_)[i] = v; break;
    case DType::kInt8: static_cast<int8_t*>(data_)[i] = saturate_to<int8_t>(v); break;
    // 4-bit integers: one per byte (int4 sign-extended), wrapped to 4 bits like C.
    case DType::kInt4:
      static_cast<int8_t*>(data_)[i] = static_cast<int8_t>(static_cast<int8_t>(saturate_to<int64_t>(v) << 4) >> 4);
      break;
    case DType::kUInt4: static_cast<uint8_t*>(data_)[i] = static_cast<uint8_t>(saturate_to<int64_t>(v) & 0x0f); break;
    case DType::kUInt8: static_cast<uint8_t*>(data_)[i] = saturate_to<uint8_t>(v); break;
    case DType::kInt16: static_cast<int16_t*>(data_)[i] = saturate_to<int16_t>(v); break;
    case DType::kUInt16: static_cast<uint16_t*>(data_)[i] = saturate_to<uint16_t>(v); break;
    case DType::kInt32: static_cast<int32_t*>(data_)[i] = saturate_to<int32_t>(v); break;
    case DType::kUInt32: static_cast<uint32_t*>(data_)[i] = saturate_to<uint32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(data_)[i] = saturate_to<int64_t>(v); break;
    case DType::kUInt64: static_cast<uint64_t*>(data_)[i] = saturate_to<uint64_t>(v); break;
    case DType::kBool: static_cast<uint8_t*>(data_)[i] = v != 0.0; break;
    default:
      KILN_CHECK(dtype_is_narrow_float(dtype_)) << "set_f64 on " << dtype_name(dtype_);
      narrow_float_store(static_cast<char*>(data_) + i * dtype_size(dtype_), dtype_, static_cast<float>(v));
  }
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (dtype_ == DType::kString) {
    for (int64_t i = 0; i < numel(); ++i)
      t.data_as<std::string>()[i] = data_as<std::string>()[i];
  } else if (dtype_is_container(dtype_)) {
    for (int64_t i = 0; i < numel(); ++i) t.data_as<Tensor>()[i] = data_as<Tensor>()[i].clone();
  } else if (nbytes() > 0) {
    std::memcpy(t.data_, data_, static_cast<size_t>(nbytes()));
  }
  return t;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  Tensor t;  // member by member: copying *this would copy the old shape too
  t.dtype_ = dtype_;
  t.storage_ = storage_;
  t.data_ = data_;
  t.shape_ = std::move(shape);
  KILN_CHECK(t.numel() == numel()) << "reshape " << describe() << " to " << shape_to_string(t.shape_);
  return t;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_to_string(shape_); }

bool same_contents(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.dtype() == DType::kString) {
    for (int64_t i = 0; i < a.numel(); ++i)
      if (a.data_as<std::string>()[i] != b.data_as<std::string>()[i]) return false;
    return true;
  }
  if (dtype_is_container(a.dtype())) {
    for (int64_t i = 0; i < a.numel(); ++i)
      if (!same_contents(a.data_as<Tensor>()[i], b.data_as<Tensor>()[i])) return false;
    return true;
  }
  return a.data() == b.data() || std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

uint64_t content_hash(const Tensor& t) {
  // 8 bytes at a time (weights run to hundreds of MiB): multiply-xorshift per word.
  uint64_t h = 1469598103934665603ull;
  auto mix_word = [&h](uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  };
  auto mix = [&](const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      mix_word(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, b + i, n - i);
    mix_word(tail ^ (static_cast<uint64_t>(n - i) << 56));
  };
  int32_t dt = static_cast<int32_t>(t.dtype());
  mix(&dt, sizeof dt);
  for (int64_t d : t.shape()) mix(&d, sizeof d);
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      const std::string& s = t.data_as<std::string>()[i];
      uint64_t len = s.size();
      mix(&len, sizeof len);
      mix(s.data(), s.size());
    }
  } else if (dtype_is_container(t.dtype())) {
    for (int64_t i = 0; i < t.numel(); ++i) mix_word(content_hash(t.data_as<Tensor>()[i]));
  } else {
    mix(t.data(), static_cast<size_t>(t.nbytes()));
  }
  return h;
}

}  // namespace kiln
