// Status and Result<T>: how Kiln reports a user's error (bad model, unsupported
// op, wrong input at run time, JIT failure). No exceptions inside the library.
// A broken invariant (a bug) is KILN_CHECK, which aborts with a message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  kOk = 0,
  kInvalidModel,     // malformed, truncated or inconsistent model file
  kUnsupported,      // op, dtype or attribute Kiln does not implement
  kInvalidArgument,  // wrong input at run time (shape, dtype, missing name)
  kNotFound,         // a file or name that does not exist
  kIoError,          // reading or writing a file failed
  kInternal,         // codegen or JIT failure
  kResourceExhausted,  // an allocation failed or would exceed the memory limit
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

  // Prefixes context ("while importing model.onnx: ...") to the message.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}           // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {   // NOLINT: implicit by design
    if (status_.is_ok()) {
      std::fprintf(stderr, "kiln: Result constructed from an ok Status\n");
      std::abort();
    }
  }
  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

// Builds an error message with <<, converting implicitly to Status.
class StatusBuilder {
 public:
  explicit StatusBuilder(StatusCode code) : code_(code) {}
  template <typename T>
  StatusBuilder& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  operator Status() const { return Status(code_, os_.str()); }  // NOLINT
  template <typename T>
  operator Result<T>() const {  // NOLINT
    return Result<T>(Status(code_, os_.str()));
  }

 private:
  StatusCode code_;
  std::ostringstream os_;
};

inline StatusBuilder invalid_model() { return StatusBuilder(StatusCode::kInvalidModel); }
inline StatusBuilder unsupported() { return StatusBuilder(StatusCode::kUnsupported); }
inline StatusBuilder invalid_argument() { return StatusBuilder(StatusCode::kInvalidArgument); }
inline StatusBuilder not_found() { return StatusBuilder(StatusCode::kNotFound); }
inline StatusBuilder io_error() { return StatusBuilder(StatusCode::kIoError); }
inline StatusBuilder internal_error() { return StatusBuilder(StatusCode::kInternal); }
inline StatusBuilder resource_exhausted() { return StatusBuilder(StatusCode::kResourceExhausted); }

namespace detail {
// Collects a failure message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace kiln

// Aborts with a message when an internal invariant does not hold (a Kiln bug).
#define KILN_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::kiln::detail::CheckFailure(__FILE__, __LINE__, #cond)

// Returns the Status from the enclosing function if it is an error.
#define KILN_RETURN_IF_ERROR(expr)            \
  do {                                        \
    ::kiln::Status _kiln_st = (expr);         \
    if (!_kiln_st.is_ok()) return _kiln_st;   \
  } while (0)

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
// KILN_ASSIGN_OR_RETURN(auto x, make_x()); returns the error if make_x failed.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_res_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.is_ok()) return tmp.status();           \
  lhs = std::move(tmp).value()
