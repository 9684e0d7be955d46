#include "npy.h"

#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

namespace kiln::cli {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// Refuse arrays larger than this: a corrupt header must not trigger a huge allocation.
constexpr int64_t kMaxBytes = int64_t{1} << 40;

struct DescrEntry {
  const char* code;  // kind and size without the byte-order character: "f4", "b1"
  DType dtype;
};

constexpr DescrEntry kDescrs[] = {
    {"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"i1", DType::kInt8},
    {"i2", DType::kInt16},   {"i4", DType::kInt32},   {"i8", DType::kInt64},
    {"u1", DType::kUInt8},   {"u2", DType::kUInt16},  {"u4", DType::kUInt32},
    {"u8", DType::kUInt64},  {"b1", DType::kBool},
};

bool host_is_little_endian() {
  uint16_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

Result<DType> dtype_from_descr(const std::string& descr, const std::string& source) {
  if (descr.size() != 3) {
    return unsupported() << source << ": unsupported .npy dtype '" << descr
                         << "' (supported: f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1)";
  }
  char order = descr[0];
  std::string code = descr.substr(1);
  for (const DescrEntry& e : kDescrs) {
    if (code != e.code) continue;
    bool single_byte = dtype_size(e.dtype) == 1;
    bool little = order == '<' || (order == '=' && host_is_little_endian());
    if (order == '|' ? !single_byte : !(little || single_byte)) {
      return unsupported() << source << ": .npy dtype '" << descr
                           << "' is not little-endian; only little-endian data is supported";
    }
    return e.dtype;
  }
  return unsupported() << source << ": unsupported .npy dtype '" << descr
                       << "' (supported: f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1)";
}

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kInt8: return "|i1";
    case DType::kInt16: return "<i2";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kUInt8: return "|u1";
    case DType::kUInt16: return "<u2";
    case DType::kUInt32: return "<u4";
    case DType::kUInt64: return "<u8";
    case DType::kBool: return "|b1";
    default: return nullptr;
  }
}

// A cursor over the Python dict literal of the header:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Status parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    if (!consume('{')) return error("expected '{'");
    while (true) {
      skip_space();
      if (consume('}')) break;
      std::string key;
      KILN_RETURN_IF_ERROR(parse_string(&key));
      skip_space();
      if (!consume(':')) return error("expected ':' after key '" + key + "'");
      skip_space();
      if (key == "descr") {
        KILN_RETURN_IF_ERROR(parse_string(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        KILN_RETURN_IF_ERROR(parse_bool(fortran));
        have_fortran = true;
      } else if (key == "shape") {
        KILN_RETURN_IF_ERROR(parse_shape(shape));
        have_shape = true;
      } else {
        return error("unexpected key '" + key + "'");
      }
      skip_space();
      if (consume(',')) continue;
      skip_space();
      if (consume('}')) break;
      return error("expected ',' or '}'");
    }
    if (!have_descr || !have_fortran || !have_shape) {
      return error("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    return Status::ok();
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument() << source_ << ": malformed .npy header (" << what << " at offset "
                              << pos_ << ")";
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status parse_string(std::string* out) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return error("expected a string");
    char quote = s_[pos_++];
    size_t end = s_.find(quote, pos_);
    if (end == std::string::npos) return error("unterminated string");
    *out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return Status::ok();
  }
  Status parse_bool(bool* out) {
    if (s_.compare(pos_, 4, "True") == 0) {
      *out = true;
      pos_ += 4;
    } else if (s_.compare(pos_, 5, "False") == 0) {
      *out = false;
      pos_ += 5;
    } else {
      return error("expected True or False");
    }
    return Status::ok();
  }
  Status parse_shape(std::vector<int64_t>* shape) {
    if (!consume('(')) return error("expected '(' for shape");
    shape->clear();
    while (true) {
      skip_space();
      if (consume(')')) break;
      size_t start = pos_;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == start) return error("expected a non-negative integer dimension");
      int64_t dim = 0;
      auto [ptr, ec] = std::from_chars(s_.data() + start, s_.data() + pos_, dim);
      if (ec != std::errc() || ptr != s_.data() + pos_) return error("dimension out of range");
      shape->push_back(dim);
      skip_space();
      if (consume(',')) continue;
      skip_space();
      if (consume(')')) break;
      return error("expected ',' or ')' in shape");
    }
    return Status::ok();
  }

  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;
};

uint32_t read_le(const std::string& bytes, size_t offset, int width) {
  uint32_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return v;
}

}  // namespace

Result<Tensor> parse_npy(const std::string& bytes, const std::string& source) {
  if (bytes.size() < kMagicLen + 2 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0) {
    return invalid_argument() << source << ": not a .npy file (missing \\x93NUMPY magic)";
  }
  int major = static_cast<unsigned char>(bytes[6]);
  int len_width = 0;
  if (major == 1) {
    len_width = 2;
  } else if (major == 2 || major == 3) {
    len_width = 4;
  } else {
    return unsupported() << source << ": unsupported .npy format version " << major << "."
                         << static_cast<int>(static_cast<unsigned char>(bytes[7]));
  }
  size_t prefix = kMagicLen + 2 + len_width;
  if (bytes.size() < prefix) return invalid_argument() << source << ": truncated .npy header";
  size_t header_len = read_le(bytes, kMagicLen + 2, len_width);
  if (bytes.size() - prefix < header_len) {
    return invalid_argument() << source << ": truncated .npy header (needs " << header_len
                              << " bytes)";
  }
  std::string header = bytes.substr(prefix, header_len);
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  KILN_RETURN_IF_ERROR(HeaderParser(header, source).parse(&descr, &fortran, &shape));
  KILN_ASSIGN_OR_RETURN(DType dtype, dtype_from_descr(descr, source));

  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d != 0 && numel > kMaxBytes / d) {
      return invalid_argument() << source << ": array too large (shape "
                                << shape_to_string(shape) << ")";
    }
    numel *= d;
  }
  int64_t nbytes = numel * dtype_size(dtype);
  if (nbytes > kMaxBytes) {
    return invalid_argument() << source << ": array too large (shape " << shape_to_string(shape)
                              << ")";
  }
  if (fortran && shape.size() > 1) {
    return unsupported() << source
                         << ": Fortran-order .npy arrays are not supported; save a C-order array "
                            "(numpy.ascontiguousarray)";
  }
  size_t data_offset = prefix + header_len;
  size_t available = bytes.size() - data_offset;
  if (available < static_cast<size_t>(nbytes)) {
    return invalid_argument() << source << ": truncated .npy data: shape "
                              << shape_to_string(shape) << " of " << dtype_name(dtype) << " needs "
                              << nbytes << " bytes, file has " << available;
  }
  if (available > static_cast<size_t>(nbytes)) {
    return invalid_argument() << source << ": .npy file has " << (available - nbytes)
                              << " bytes after the array data";
  }
  Tensor t(dtype, shape);
  if (nbytes > 0) std::memcpy(t.data(), bytes.data() + data_offset, static_cast<size_t>(nbytes));
  if (dtype == DType::kBool) {
    auto* p = t.data_as<uint8_t>();
    for (int64_t i = 0; i < numel; ++i) {
      if (p[i] > 1) {
        return invalid_argument() << source << ": bool array holds byte value "
                                  << static_cast<int>(p[i]) << " at element " << i;
      }
    }
  }
  return t;
}

Result<Tensor> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found() << "cannot open '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error() << "error reading '" << path << "'";
  return parse_npy(ss.str(), path);
}

Result<std::string> encode_npy(const Tensor& tensor) {
  const char* descr = descr_of(tensor.dtype());
  if (descr == nullptr) {
    return unsupported() << "cannot write a " << dtype_name(tensor.dtype())
                         << " tensor as .npy (supported: f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 "
                            "bool)";
  }
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    dict << tensor.shape()[i];
    if (tensor.shape().size() == 1 || i + 1 < tensor.shape().size()) dict << ",";
    if (i + 1 < tensor.shape().size()) dict << " ";
  }
  dict << "), }";
  std::string header = dict.str();
  // Pad with spaces and a final newline so the data starts on a 64-byte boundary.
  int version = header.size() + 1 + kMagicLen + 4 > 65535 ? 2 : 1;
  size_t prefix = kMagicLen + 2 + (version == 1 ? 2 : 4);
  size_t total = prefix + header.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  header.append(padded - total, ' ');
  header.push_back('\n');

  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(version));
  out.push_back(0);
  uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (version == 1 ? 2 : 4); ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += header;
  out.append(static_cast<const char*>(tensor.data()), static_cast<size_t>(tensor.nbytes()));
  return out;
}

Status write_npy(const std::string& path, const Tensor& tensor) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, encode_npy(tensor));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error() << "cannot open '" << path << "' for writing";
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return io_error() << "error writing '" << path << "'";
  return Status::ok();
}

}  // namespace kiln::cli
