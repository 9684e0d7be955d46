// Tensor: a dense, row-major, contiguous n-d array with shared storage.
// Used for constants in the graph IR and for inputs/outputs at run time.
// Strings are stored as std::string elements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/status.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage (empty strings for kString). For sizes Kiln
  // controls (constants it builds, small metadata); aborts when out of memory.
  Tensor(DType dtype, std::vector<int64_t> shape);
  // Allocates zero-filled storage for a size that comes from a model or its
  // inputs: a byte size that overflows, exceeds current_memory_limit()
  // (support/memory_limit.h) or cannot be allocated is an error naming `what`.
  static Result<Tensor> allocate(DType dtype, std::vector<int64_t> shape, const std::string& what = "a tensor");
  // Wraps caller-owned memory; the caller keeps it alive while the Tensor is used.
  static Tensor borrow(DType dtype, std::vector<int64_t> shape, void* data);
  // Shares `storage` (which must hold at least nbytes, 64-byte aligned).
  static Tensor wrap(DType dtype, std::vector<int64_t> shape, std::shared_ptr<void> storage);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  bool defined() const { return dtype_ != DType::kUndefined; }
  // False for a borrowed tensor (and views of one): its memory is the lender's.
  bool owns_storage() const { return storage_ != nullptr; }
  // True when this handle (or views it made and dropped) is the only owner of
  // its storage: nothing else can read or write the data.
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* data_as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* data_as() const { return static_cast<const T*>(data_); }

  // Element i (flat index) converted to double / int64 (numeric dtypes only;
  // to int64 and into integer tensors saturating, NaN as 0).
  double get_f64(int64_t i) const;
  int64_t get_i64(int64_t i) const;
  void set_f64(int64_t i, double v);

  // A deep copy with its own storage.
  Tensor clone() const;
  // Same storage, new shape with the same element count.
  Tensor reshaped(std::vector<int64_t> shape) const;
  // Moves the shape vector out, for a handle about to be overwritten (the VM
  // reuses its memory for the next value of the register).
  std::vector<int64_t> release_shape() { return std::move(shape_); }
  // Short description: "f32[1,3,224,224]".
  std::string describe() const;

 private:
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

// Same dtype, shape and element bytes (strings compared as strings).
bool same_contents(const Tensor& a, const Tensor& b);
// A 64-bit hash of dtype, shape and contents: equal for same_contents tensors.
uint64_t content_hash(const Tensor& t);

}  // namespace kiln
