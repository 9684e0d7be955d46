#include "support/status.h"

#include <iostream>

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidModel: return "invalid model";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "i/o error";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kResourceExhausted: return "resource exhausted";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message_);
}

namespace detail {
CheckFailure::CheckFailure(const char* file, int line, const char* cond) {
  os_ << "kiln internal error: check failed at " << file << ":" << line << ": " << cond << " ";
}
CheckFailure::~CheckFailure() {
  std::cerr << os_.str() << std::endl;
  std::abort();
}
}  // namespace detail

}  // namespace kiln
