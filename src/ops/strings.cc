// String ops, as runtime kernels over string tensors (UTF-8 bytes):
// StringConcat, StringSplit, RegexFullMatch, StringNormalizer,
// TfIdfVectorizer (over string or integer tokens), ai.onnx.ml's
// LabelEncoder, and the
// string forms of Cast, CastLike and Equal (those ops are compiled for
// numbers; extend_op gives them a kernel that runs where a string is
// involved).
//
// Numbers print as their shortest round-trip decimal (std::to_chars: float32
// 0.039187793, not 0.03918779), NaN and infinities as "NaN", "INF", "-INF"
// (the ONNX Cast rules); strings parse as decimal or hexadecimal numbers,
// "NaN"/"INF"/"-INF"/"inf"/"infinity" in any case, with surrounding blanks
// allowed. A string that is no number is an error naming it.
//
// RegexFullMatch uses std::regex's ECMAScript grammar: RE2 patterns made of
// classes, groups, alternation, anchors and counted repeats mean the same in
// both; RE2-only syntax (named groups `(?P<n>`, inline flags `(?i)`, `\C`)
// is an error when the model is compiled.
//
// StringNormalizer changes case with the C.UTF-8 locale's Unicode mappings
// (falling back to ASCII where that locale is missing); it does not strip
// accents, which the ONNX reference does by Unicode decomposition.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <clocale>
#include <cstring>
#include <cwctype>
#include <locale.h>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {
namespace {

// ---- Broadcasting over host tensors ---------------------------------------------------------------

std::vector<int64_t> broadcast_dims(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool* ok) {
  size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  *ok = true;
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) *ok = false;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat index into `in` (right-aligned, broadcast) for each flat index of `out`.
std::vector<int64_t> broadcast_map(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  int64_t n = 1;
  for (int64_t d : out) n *= d;
  std::vector<int64_t> map(static_cast<size_t>(n));
  const size_t r = out.size(), off = r - in.size();
  std::vector<int64_t> idx(r, 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t flat = 0;
    for (size_t d = off; d < r; ++d) flat = flat * in[d - off] + (in[d - off] == 1 ? 0 : idx[d]);
    map[static_cast<size_t>(e)] = flat;
    for (size_t d = r; d-- > 0;)
      if (++idx[d] < out[d]) break;
      else idx[d] = 0;
  }
  return map;
}

Status infer_broadcast_pair(Node& n, InferContext& ctx, DType out) {
  KILN_ASSIGN_OR_RETURN(TensorType a, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(TensorType b, input_type(n, 1));
  if (!a.has_shape() || !b.has_shape()) {
    set_output_unknown_rank(n, 0, out);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Shape s, broadcast_all(n, {*a.shape, *b.shape}, ctx.bounds));
  set_output(n, 0, out, s, ctx);
  return Status::ok();
}

// Applies f(a[i], b[j]) -> writes element e of the output, over the broadcast shape.
template <typename F>
Result<Tensor> broadcast_apply(const Tensor& a, const Tensor& b, DType out_t, F f) {
  bool ok;
  std::vector<int64_t> shape = broadcast_dims(a.shape(), b.shape(), &ok);
  if (!ok) return invalid_argument() << "cannot broadcast " << a.describe() << " with " << b.describe();
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::allocate(out_t, shape, "the output"));
  std::vector<int64_t> ia = broadcast_map(a.shape(), shape), ib = broadcast_map(b.shape(), shape);
  for (int64_t e = 0; e < out.numel(); ++e) f(out, e, ia[static_cast<size_t>(e)], ib[static_cast<size_t>(e)]);
  return out;
}

Status require_strings(const Node& n, size_t i, const char* what) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
  if (t.dtype != DType::kString) return node_invalid(n) << what << " must be a string tensor, got " << t.to_string();
  return Status::ok();
}

const std::string* strings_of(const Tensor& t) { return t.data_as<std::string>(); }

// ---- StringConcat ---------------------------------------------------------------------------------

Status infer_concat(Node& n, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_strings(n, 0, "X"));
  KILN_RETURN_IF_ERROR(require_strings(n, 1, "Y"));
  return infer_broadcast_pair(n, ctx, DType::kString);
}

Result<RuntimeKernel> concat_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in[0].dtype() != DType::kString || in[1].dtype() != DType::kString)
      return invalid_argument() << "StringConcat of " << in[0].describe() << " and " << in[1].describe();
    const std::string *a = strings_of(in[0]), *b = strings_of(in[1]);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], broadcast_apply(in[0], in[1], DType::kString, [&](Tensor& o, int64_t e, int64_t i,
                                                                                    int64_t j) {
      o.data_as<std::string>()[e] = a[i] + b[j];
    }));
    return Status::ok();
  });
}

// ---- Equal on strings -------------------------------------------------------------------------------

Result<RuntimeKernel> equal_kernel(const Node&) {
  return RuntimeKernel([](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    if (in[0].dtype() != DType::kString || in[1].dtype() != DType::kString)
      return invalid_argument() << "Equal's string kernel got " << in[0].describe() << " and " << in[1].describe();
    const std::string *a = strings_of(in[0]), *b = strings_of(in[1]);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], broadcast_apply(in[0], in[1], DType::kBool,
                                                  [&](Tensor& o, int64_t e, int64_t i, int64_t j) {
                                                    o.set_f64(e, a[i] == b[j] ? 1.0 : 0.0);
                                                  }));
    return Status::ok();
  });
}

bool has_string_input(const Node& n) {
  for (const Value* v : n.inputs())
    if (v != nullptr && v->dtype() == DType::kString) return true;
  return false;
}

// ---- Cast / CastLike to and from strings -------------------------------------------------------------

std::string number_to_string(const Tensor& t, int64_t i) {
  DType d = t.dtype();
  if (d == DType::kBool) return t.get_f64(i) != 0 ? "1" : "0";
  if (dtype_is_int(d)) {
    if (d == DType::kUInt64) return std::to_string(t.data_as<uint64_t>()[i]);
    return std::to_string(t.get_i64(i));
  }
  double v = t.get_f64(i);
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "INF" : "-INF";
  char buf[64];
  std::to_chars_result r = d == DType::kFloat64 ? std::to_chars(buf, buf + sizeof buf, v)
                                                : std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
  return std::string(buf, r.ptr);
}

Status string_to_number(const std::string& s, Tensor& t, int64_t i) {
  size_t b = s.find_first_not_of(" \t\n\r"), e = s.find_last_not_of(" \t\n\r");
  std::string v = b == std::string::npos ? "" : s.substr(b, e - b + 1);
  std::string lower = v;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  DType d = t.dtype();
  if (dtype_is_float(d)) {
    double x;
    if (lower == "nan" || lower == "-nan" || lower == "+nan") x = NAN;
    else if (lower == "inf" || lower == "+inf" || lower == "infinity" || lower == "+infinity") x = INFINITY;
    else if (lower == "-inf" || lower == "-infinity") x = -INFINITY;
    else {
      const char* p = v.c_str();
      char* end = nullptr;
      x = std::strtod(p, &end);
      if (v.empty() || end != p + v.size()) return invalid_argument() << "string '" << s << "' at element " << i << " is not a number";
    }
    t.set_f64(i, x);
    return Status::ok();
  }
  if (d == DType::kBool) {
    if (lower == "true" || lower == "1") t.set_f64(i, 1);
    else if (lower == "false" || lower == "0") t.set_f64(i, 0);
    else return invalid_argument() << "string '" << s << "' at element " << i << " is not a bool";
    return Status::ok();
  }
  if (dtype_is_int(d) && d != DType::kUInt4 && d != DType::kInt4) {
    if (d == DType::kUInt64) {
      uint64_t x;
      auto r = std::from_chars(v.data(), v.data() + v.size(), x);
      if (r.ec != std::errc() || r.ptr != v.data() + v.size()) return invalid_argument() << "string '" << s << "' at element " << i << " is not an unsigned integer";
      t.data_as<uint64_t>()[i] = x;
      return Status::ok();
    }
    int64_t x;
    const char* first = v.data() + (!v.empty() && v[0] == '+' ? 1 : 0);
    auto r = std::from_chars(first, v.data() + v.size(), x);
    if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size())
      return invalid_argument() << "string '" << s << "' at element " << i << " is not an integer";
    // Narrower ints wrap like C, as the compiled Cast does (integer
    // conversion: a double out of the target's range would be undefined).
    switch (d) {
      case DType::kInt64: t.data_as<int64_t>()[i] = x; break;
      case DType::kInt32: t.data_as<int32_t>()[i] = static_cast<int32_t>(x); break;
      case DType::kUInt32: t.data_as<uint32_t>()[i] = static_cast<uint32_t>(x); break;
      case DType::kInt16: t.data_as<int16_t>()[i] = static_cast<int16_t>(x); break;
      case DType::kUInt16: t.data_as<uint16_t>()[i] = static_cast<uint16_t>(x); break;
      case DType::kInt8: t.data_as<int8_t>()[i] = static_cast<int8_t>(x); break;
      default: t.data_as<uint8_t>()[i] = static_cast<uint8_t>(x); break;  // uint8
    }
    return Status::ok();
  }
  return unsupported() << "Cast from string to " << dtype_name(d);
}

bool castable_with_strings(DType d) {
  return d == DType::kString || d == DType::kBool || d == DType::kFloat32 || d == DType::kFloat64 ||
         d == DType::kFloat16 || d == DType::kBFloat16 ||
         (dtype_is_int(d) && d != DType::kUInt4 && d != DType::kInt4);
}

// Output dtype: Cast's `to`, or CastLike's second input's dtype.
Result<RuntimeKernel> cast_kernel(const Node& n) {
  const bool like = n.op_type() == "CastLike";
  std::optional<DType> to;
  if (!like) to = static_cast<DType>(n.attr_int("to", 0));
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    DType t = like ? in[1].dtype() : *to;
    if (!castable_with_strings(x.dtype()) || !castable_with_strings(t))
      return unsupported() << "Cast from " << dtype_name(x.dtype()) << " to " << dtype_name(t);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(t, x.shape(), "the Cast output"));
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (x.dtype() == DType::kString && t == DType::kString) {
        out[0].data_as<std::string>()[i] = strings_of(x)[i];
      } else if (t == DType::kString) {
        out[0].data_as<std::string>()[i] = number_to_string(x, i);
      } else if (x.dtype() == DType::kString) {
        KILN_RETURN_IF_ERROR(string_to_number(strings_of(x)[i], out[0], i));
      } else {
        return internal_error() << "Cast's string kernel on " << dtype_name(x.dtype()) << " to " << dtype_name(t);
      }
    }
    return Status::ok();
  });
}

bool cast_involves_strings(const Node& n) {
  if (has_string_input(n)) return true;
  if (n.op_type() == "Cast") return static_cast<DType>(n.attr_int("to", 0)) == DType::kString;
  return false;  // CastLike: its second input's dtype is an input dtype
}

// ---- StringSplit ----------------------------------------------------------------------------------

Status infer_split(Node& n, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_strings(n, 0, "X"));
  if (n.has_attr("maxsplit") && n.attr_int("maxsplit", 0) < 0)
    return node_invalid(n) << "maxsplit " << n.attr_int("maxsplit", 0) << " (must be >= 0)";
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  Shape y = s;
  y.push_back(ctx.fresh_symbol());  // the most substrings of any element: known at run time
  set_output(n, 0, DType::kString, y, ctx);
  if (n.num_outputs() > 1) set_output(n, 1, DType::kInt64, s, ctx);
  return Status::ok();
}

// Python's str.split: with a delimiter, every occurrence splits (empty
// pieces kept); without one (absent or ""), runs of whitespace split and
// leading/trailing whitespace is dropped. At most `maxsplit` splits.
std::vector<std::string> split_one(const std::string& s, const std::string& delim, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (!delim.empty()) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t at = s.find(delim, pos);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(pos, at - pos));
      pos = at + delim.size();
    }
    parts.push_back(s.substr(pos));
    return parts;
  }
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && space(s[i])) ++i;
    if (i == s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = s.size();
      while (end > i && space(s[end - 1])) --end;
      parts.push_back(s.substr(i, end - i));
      break;
    }
    size_t j = i;
    while (j < s.size() && !space(s[j])) ++j;
    parts.push_back(s.substr(i, j - i));
    i = j;
  }
  return parts;
}

Result<RuntimeKernel> split_kernel(const Node& n) {
  std::string delim = n.attr_string("delimiter", "");
  int64_t maxsplit = n.has_attr("maxsplit") ? n.attr_int("maxsplit", 0) : -1;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.dtype() != DType::kString) return invalid_argument() << "StringSplit of " << x.describe();
    std::vector<std::vector<std::string>> parts(static_cast<size_t>(x.numel()));
    size_t most = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      parts[static_cast<size_t>(i)] = split_one(strings_of(x)[i], delim, maxsplit);
      most = std::max(most, parts[static_cast<size_t>(i)].size());
    }
    std::vector<int64_t> shape = x.shape();
    shape.push_back(static_cast<int64_t>(most));
    out.resize(2);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kString, shape, "the StringSplit output"));
    KILN_ASSIGN_OR_RETURN(out[1], Tensor::allocate(DType::kInt64, x.shape(), "the StringSplit counts"));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const auto& p = parts[static_cast<size_t>(i)];
      for (size_t k = 0; k < p.size(); ++k) out[0].data_as<std::string>()[i * static_cast<int64_t>(most) + static_cast<int64_t>(k)] = p[k];
      out[1].data_as<int64_t>()[i] = static_cast<int64_t>(p.size());
    }
    return Status::ok();
  });
}

// ---- RegexFullMatch -----------------------------------------------------------------------------------

Result<std::regex> compile_pattern(const Node& n) {
  if (!n.has_attr("pattern")) return node_invalid(n) << "missing attribute pattern";
  std::string pattern = n.attr_string("pattern", "");
  for (const char* re2_only : {"(?P<", "(?i", "(?s", "(?m", "(?U", "\\C", "\\pN", "\\p{"}) {
    if (pattern.find(re2_only) != std::string::npos)
      return node_unsupported(n) << "RE2 syntax '" << re2_only << "' in pattern '" << pattern << "'";
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return node_invalid(n) << "invalid pattern '" << pattern << "': " << e.what();
  }
}

Status infer_regex(Node& n, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_strings(n, 0, "X"));
  KILN_RETURN_IF_ERROR(compile_pattern(n).status());
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  if (t.has_shape()) set_output(n, 0, DType::kBool, *t.shape, ctx);
  else set_output_unknown_rank(n, 0, DType::kBool);
  return Status::ok();
}

Result<RuntimeKernel> regex_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::regex re, compile_pattern(n));
  return RuntimeKernel([re](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.dtype() != DType::kString) return invalid_argument() << "RegexFullMatch of " << x.describe();
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kBool, x.shape(), "the RegexFullMatch output"));
    for (int64_t i = 0; i < x.numel(); ++i) {
      // std::regex reports a match too complex for it by throwing.
      try {
        out[0].set_f64(i, std::regex_match(strings_of(x)[i], re) ? 1.0 : 0.0);
      } catch (const std::regex_error& e) {
        return unsupported() << "RegexFullMatch: element " << i << " is too complex to match: " << e.what();
      }
    }
    return Status::ok();
  });
}

// ---- StringNormalizer -----------------------------------------------------------------------------------

// Decodes UTF-8 (invalid bytes pass through as themselves), maps each code
// point, encodes back.
std::string map_utf8(const std::string& s, wint_t (*f)(wint_t, locale_t), locale_t loc) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    bool valid = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; valid && k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      valid = (cc >> 6) == 2;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!valid) {
      out.push_back(s[i++]);
      continue;
    }
    uint32_t m = loc != nullptr ? static_cast<uint32_t>(f(static_cast<wint_t>(cp), loc))
                                : (cp < 0x80 ? static_cast<uint32_t>(f == towlower_l ? std::tolower(static_cast<int>(cp))
                                                                                   : std::toupper(static_cast<int>(cp)))
                                             : cp);
    if (m < 0x80) {
      out.push_back(static_cast<char>(m));
    } else if (m < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (m >> 6)));
      out.push_back(static_cast<char>(0x80 | (m & 0x3f)));
    } else if (m < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (m >> 12)));
      out.push_back(static_cast<char>(0x80 | ((m >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (m & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (m >> 18)));
      out.push_back(static_cast<char>(0x80 | ((m >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((m >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (m & 0x3f)));
    }
    i += static_cast<size_t>(len);
  }
  return out;
}

locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    return l;  // null where the locale is missing: ASCII case mapping only
  }();
  return loc;
}

Status infer_normalizer(Node& n, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(require_strings(n, 0, "X"));
  std::string action = n.attr_string("case_change_action", "NONE");
  if (action != "NONE" && action != "LOWER" && action != "UPPER")
    return node_invalid(n) << "case_change_action '" << action << "' (NONE, LOWER or UPPER)";
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() != 1 && !(s.size() == 2 && s[0].as_const() == std::optional<int64_t>(1)))
    return node_invalid(n) << "input must be [C] or [1, C], got rank " << s.size();
  Shape y = s;
  y.back() = ctx.fresh_symbol();  // stop words removed: known at run time
  set_output(n, 0, DType::kString, y, ctx);
  return Status::ok();
}

Result<RuntimeKernel> normalizer_kernel(const Node& n) {
  std::string action = n.attr_string("case_change_action", "NONE");
  bool case_sensitive = n.attr_int("is_case_sensitive", 0) != 0;
  std::vector<std::string> stops;
  if (const Attribute* a = n.attr("stopwords"); a != nullptr && a->kind == Attribute::Kind::kStrings) stops = a->strings;
  return RuntimeKernel([=](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.dtype() != DType::kString || !(x.rank() == 1 || (x.rank() == 2 && x.shape()[0] == 1)))
      return invalid_argument() << "StringNormalizer input must be a string tensor [C] or [1, C], got " << x.describe();
    locale_t loc = utf8_locale();
    auto change = [&](const std::string& s) {
      if (action == "LOWER") return map_utf8(s, towlower_l, loc);
      if (action == "UPPER") return map_utf8(s, towupper_l, loc);
      return s;
    };
    auto lower = [&](const std::string& s) { return map_utf8(s, towlower_l, loc); };
    std::set<std::string> stop_set;
    for (const std::string& w : stops) stop_set.insert(case_sensitive ? w : lower(w));
    std::vector<std::string> kept;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const std::string& s = strings_of(x)[i];
      if (!stop_set.empty() && stop_set.count(case_sensitive ? s : lower(s))) continue;
      std::string c = change(s);
      if (!c.empty()) kept.push_back(std::move(c));
    }
    if (kept.empty()) kept.push_back("");  // the ONNX rule: one empty string, never an empty tensor
    std::vector<int64_t> shape = x.shape();
    shape.back() = static_cast<int64_t>(kept.size());
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kString, shape, "the StringNormalizer output"));
    for (size_t i = 0; i < kept.size(); ++i) out[0].data_as<std::string>()[i] = kept[i];
    return Status::ok();
  });
}

// ---- TfIdfVectorizer ---------------------------------------------------------------------------------

// The n-gram pool as a trie over int64 or string tokens; a node's id is its
// n-gram's position in the pool order (1-based; 0: only a prefix), as the
// ONNX reference numbers them, and ngram_indexes[id - 1] its output column.
template <typename Key>
struct GramTrie {
  int64_t id = 0;
  std::map<Key, GramTrie> next;
};

struct TfIdfConfig {
  int64_t min_len = 1, max_len = 1, max_skip = 0, out_size = 0;
  std::string mode;
  std::vector<int64_t> indexes;
  std::vector<double> weights;
  bool strings = false;
  GramTrie<int64_t> ints;
  GramTrie<std::string> texts;
};

template <typename Key>
int64_t add_grams(GramTrie<Key>& root, const std::vector<Key>& pool, size_t start, int64_t count, int64_t size,
                  int64_t id) {
  for (int64_t g = 0; g < count; ++g, ++id) {
    GramTrie<Key>* node = &root;
    for (int64_t k = 0; k < size; ++k) node = &node->next[pool[start + static_cast<size_t>(g * size + k)]];
    node->id = id;
  }
  return id;
}

Result<std::shared_ptr<TfIdfConfig>> tfidf_config(const Node& n) {
  auto c = std::make_shared<TfIdfConfig>();
  c->min_len = n.attr_int("min_gram_length", 1);
  c->max_len = n.attr_int("max_gram_length", 1);
  c->max_skip = n.attr_int("max_skip_count", 0);
  c->mode = n.attr_string("mode", "TF");
  if (c->mode != "TF" && c->mode != "IDF" && c->mode != "TFIDF") return node_invalid(n) << "mode '" << c->mode << "'";
  if (c->min_len < 1 || c->max_len < c->min_len || c->max_skip < 0)
    return node_invalid(n) << "need 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0 (got "
                           << c->min_len << ", " << c->max_len << ", " << c->max_skip << ")";
  std::vector<int64_t> counts = n.attr_ints("ngram_counts");
  c->indexes = n.attr_ints("ngram_indexes");
  if (n.has_attr("weights")) c->weights = n.attr_floats("weights");
  std::vector<int64_t> pool_ints = n.attr_ints("pool_int64s");
  std::vector<std::string> pool_texts;
  if (const Attribute* a = n.attr("pool_strings"); a != nullptr && a->kind == Attribute::Kind::kStrings)
    pool_texts = a->strings;
  if (pool_ints.empty() == pool_texts.empty())
    return node_invalid(n) << "exactly one of pool_int64s and pool_strings must be given";
  c->strings = !pool_texts.empty();
  const int64_t total = static_cast<int64_t>(c->strings ? pool_texts.size() : pool_ints.size());
  if (counts.empty()) return node_invalid(n) << "missing attribute ngram_counts";
  int64_t id = 1;
  for (size_t i = 0; i < counts.size(); ++i) {
    int64_t start = counts[i], end = i + 1 < counts.size() ? counts[i + 1] : total, size = static_cast<int64_t>(i) + 1;
    if (start < 0 || end < start || end > total)
      return node_invalid(n) << "ngram_counts " << i << " (" << start << " .. " << end << ") outside the pool of " << total;
    if ((end - start) % size != 0)
      return node_invalid(n) << (end - start) << " pool entries for " << size << "-grams is not a multiple of " << size;
    int64_t grams = (end - start) / size;
    if (size >= c->min_len && size <= c->max_len) {
      id = c->strings ? add_grams(c->texts, pool_texts, static_cast<size_t>(start), grams, size, id)
                      : add_grams(c->ints, pool_ints, static_cast<size_t>(start), grams, size, id);
    } else {
      id += grams;
    }
  }
  if (static_cast<int64_t>(c->indexes.size()) != id - 1)
    return node_invalid(n) << "ngram_indexes has " << c->indexes.size() << " entries for " << id - 1 << " n-grams";
  for (int64_t ix : c->indexes)
    if (ix < 0) return node_invalid(n) << "negative ngram index " << ix;
  c->out_size = c->indexes.empty() ? 0 : *std::max_element(c->indexes.begin(), c->indexes.end()) + 1;
  if (!c->weights.empty() && static_cast<int64_t>(c->weights.size()) < c->out_size)
    return node_invalid(n) << c->weights.size() << " weights for " << c->out_size << " output columns";
  return c;
}

Status infer_tfidf(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto c, tfidf_config(n));
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  bool ok = c->strings ? t.dtype == DType::kString : (t.dtype == DType::kInt32 || t.dtype == DType::kInt64);
  if (!ok) return node_invalid(n) << "input of dtype " << dtype_name(t.dtype) << " for a "
                                  << (c->strings ? "string" : "int64") << " pool";
  KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, 0));
  if (s.size() > 2) return node_invalid(n) << "input must be [C] or [B, C], got rank " << s.size();
  Shape out{Expr(c->out_size)};
  if (s.size() == 2) out.insert(out.begin(), s[0]);
  set_output(n, 0, DType::kFloat32, out, ctx);
  return Status::ok();
}

// Counts, per row, every pool n-gram of length min..max whose tokens are
// skip + 1 apart (skip 0..max_skip_count); unigrams are counted once.
template <typename Key, typename Get>
void count_grams(const TfIdfConfig& c, const GramTrie<Key>& root, int64_t row_len, Get token, double* freq) {
  int64_t start_len = c.min_len;
  // A skip of the row's length or more leaves no second token in the row.
  // (max_skip_count may be INT64_MAX: no + 1 before the min.)
  const int64_t last_skip = std::min(c.max_skip, std::max<int64_t>(row_len, 1) - 1) + 1;
  for (int64_t skip = 1; skip <= last_skip; ++skip) {
    for (int64_t first = 0; first < row_len; ++first) {
      // A gram longer than the row does not fit (and skip * its length could overflow).
      if (start_len - 1 >= row_len || first + skip * (start_len - 1) >= row_len) break;
      const GramTrie<Key>* node = &root;
      for (int64_t len = 1, at = first; !node->next.empty() && len <= c.max_len && at < row_len; ++len, at += skip) {
        auto it = node->next.find(token(at));
        if (it == node->next.end()) break;
        if (len >= start_len && it->second.id != 0) freq[c.indexes[static_cast<size_t>(it->second.id - 1)]] += 1;
        node = &it->second;
      }
    }
    if (start_len == 1) {
      ++start_len;
      if (start_len > c.max_len) break;
    }
  }
}

Result<RuntimeKernel> tfidf_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<TfIdfConfig> cp, tfidf_config(n));
  std::shared_ptr<const TfIdfConfig> c = cp;
  return RuntimeKernel([c](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if (x.rank() > 2) return invalid_argument() << "input must be [C] or [B, C], got " << x.describe();
    if (c->strings != (x.dtype() == DType::kString)) return invalid_argument() << "input " << x.describe() << " does not match the pool";
    const int64_t rows = x.rank() == 2 ? x.shape()[0] : 1, len = x.rank() == 0 ? 1 : x.shape().back();
    std::vector<int64_t> shape{c->out_size};
    if (x.rank() == 2) shape.insert(shape.begin(), rows);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(DType::kFloat32, shape, "the TfIdfVectorizer output"));
    std::vector<double> freq(static_cast<size_t>(c->out_size));
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(freq.begin(), freq.end(), 0.0);
      if (c->strings) {
        const std::string* t = strings_of(x) + r * len;
        count_grams(*c, c->texts, len, [&](int64_t i) -> const std::string& { return t[i]; }, freq.data());
      } else {
        count_grams(*c, c->ints, len, [&](int64_t i) { return x.get_i64(r * len + i); }, freq.data());
      }
      for (int64_t k = 0; k < c->out_size; ++k) {
        double f = freq[static_cast<size_t>(k)], w = c->weights.empty() ? 1.0 : c->weights[static_cast<size_t>(k)];
        double y = c->mode == "TF" ? f : c->mode == "IDF" ? (f > 0 ? w : 0.0) : w * f;
        out[0].set_f64(r * c->out_size + k, y);
      }
    }
    return Status::ok();
  });
}

// ---- LabelEncoder (ai.onnx.ml) ----------------------------------------------------------------------

// Keys and values as one tensor each (from keys_strings / keys_int64s /
// keys_floats / keys_tensor and the values_* forms), the default as a
// one-element tensor of the values' dtype. Keys are looked up by a tagged
// text form so that string, integer and float keys share one map; float keys
// compare by value (NaN matches NaN, as the spec says).
struct LabelMap {
  DType key_type = DType::kUndefined;
  Tensor values, fallback;
  std::map<std::string, int64_t> index;
};

std::string label_key(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kString) return "s" + t.data_as<std::string>()[i];
  if (dtype_is_float(t.dtype())) {
    double v = t.get_f64(i);
    if (std::isnan(v)) return "fnan";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return "f" + std::string(buf, r.ptr);
  }
  return "i" + std::to_string(t.get_i64(i));
}

Result<Tensor> label_attr_tensor(const Node& n, const std::string& prefix) {
  if (const Attribute* a = n.attr(prefix + "tensor"); a != nullptr && a->kind == Attribute::Kind::kTensor) return a->t;
  if (const Attribute* a = n.attr(prefix + "strings"); a != nullptr && a->kind == Attribute::Kind::kStrings) {
    Tensor t(DType::kString, {static_cast<int64_t>(a->strings.size())});
    for (size_t i = 0; i < a->strings.size(); ++i) t.data_as<std::string>()[i] = a->strings[i];
    return t;
  }
  if (const Attribute* a = n.attr(prefix + "int64s"); a != nullptr && a->kind == Attribute::Kind::kInts) {
    Tensor t(DType::kInt64, {static_cast<int64_t>(a->ints.size())});
    for (size_t i = 0; i < a->ints.size(); ++i) t.data_as<int64_t>()[i] = a->ints[i];
    return t;
  }
  if (const Attribute* a = n.attr(prefix + "floats"); a != nullptr && a->kind == Attribute::Kind::kFloats) {
    Tensor t(DType::kFloat32, {static_cast<int64_t>(a->floats.size())});
    for (size_t i = 0; i < a->floats.size(); ++i) t.set_f64(static_cast<int64_t>(i), a->floats[i]);
    return t;
  }
  return node_invalid(n) << "missing " << prefix << "strings, " << prefix << "int64s, " << prefix << "floats or "
                         << prefix << "tensor";
}

Result<std::shared_ptr<LabelMap>> label_map(const Node& n) {
  auto m = std::make_shared<LabelMap>();
  KILN_ASSIGN_OR_RETURN(Tensor keys, label_attr_tensor(n, "keys_"));
  KILN_ASSIGN_OR_RETURN(m->values, label_attr_tensor(n, "values_"));
  if (keys.rank() != 1 || m->values.rank() != 1 || keys.numel() != m->values.numel())
    return node_invalid(n) << "keys " << keys.describe() << " and values " << m->values.describe() << " must be 1-D of one length";
  for (DType t : {keys.dtype(), m->values.dtype()})
    if (t != DType::kString && t != DType::kInt64 && t != DType::kFloat32 && t != DType::kFloat64 &&
        t != DType::kInt32 && t != DType::kInt16 && t != DType::kFloat16)
      return node_unsupported(n) << "keys or values of dtype " << dtype_name(t);
  m->key_type = keys.dtype();
  for (int64_t i = 0; i < keys.numel(); ++i) m->index.emplace(label_key(keys, i), i);  // the first of equal keys wins
  DType vt = m->values.dtype();
  m->fallback = Tensor(vt, {});
  if (const Attribute* a = n.attr("default_tensor"); a != nullptr && a->kind == Attribute::Kind::kTensor) {
    if (a->t.numel() != 1 || a->t.dtype() != vt)
      return node_invalid(n) << "default_tensor " << a->t.describe() << " must be one " << dtype_name(vt);
    m->fallback = a->t.reshaped({});
  } else if (vt == DType::kString) {
    m->fallback.data_as<std::string>()[0] = n.attr_string("default_string", "_Unused");
  } else if (dtype_is_float(vt)) {
    m->fallback.set_f64(0, n.attr_float("default_float", -0.0));
  } else {
    m->fallback.set_f64(0, static_cast<double>(n.attr_int("default_int64", -1)));
  }
  return m;
}

Status infer_label_encoder(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto m, label_map(n));
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
  bool same_kind = (t.dtype == DType::kString) == (m->key_type == DType::kString) &&
                   dtype_is_float(t.dtype) == dtype_is_float(m->key_type);
  if (!same_kind) return node_invalid(n) << "input of dtype " << dtype_name(t.dtype) << " for keys of dtype " << dtype_name(m->key_type);
  if (t.has_shape()) set_output(n, 0, m->values.dtype(), *t.shape, ctx);
  else set_output_unknown_rank(n, 0, m->values.dtype());
  return Status::ok();
}

void copy_label(Tensor& dst, int64_t di, const Tensor& src, int64_t si) {
  if (src.dtype() == DType::kString) dst.data_as<std::string>()[di] = src.data_as<std::string>()[si];
  else if (src.dtype() == DType::kInt64) dst.data_as<int64_t>()[di] = src.data_as<int64_t>()[si];
  else dst.set_f64(di, src.get_f64(si));
}

Result<RuntimeKernel> label_encoder_kernel(const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<LabelMap> mp, label_map(n));
  std::shared_ptr<const LabelMap> m = mp;
  return RuntimeKernel([m](const std::vector<Tensor>& in, std::vector<Tensor>& out) -> Status {
    const Tensor& x = in[0];
    if ((x.dtype() == DType::kString) != (m->key_type == DType::kString))
      return invalid_argument() << "input " << x.describe() << " for keys of dtype " << dtype_name(m->key_type);
    out.resize(1);
    KILN_ASSIGN_OR_RETURN(out[0], Tensor::allocate(m->values.dtype(), x.shape(), "the LabelEncoder output"));
    for (int64_t i = 0; i < x.numel(); ++i) {
      auto it = m->index.find(label_key(x, i));
      if (it == m->index.end()) copy_label(out[0], i, m->fallback, 0);
      else copy_label(out[0], i, m->values, it->second);
    }
    return Status::ok();
  });
}

}  // namespace

void register_string_ops() {
  register_op(kernel_op("StringConcat", infer_concat, concat_kernel));
  register_op(kernel_op("StringSplit", infer_split, split_kernel));
  register_op(kernel_op("RegexFullMatch", infer_regex, regex_kernel));
  register_op(kernel_op("StringNormalizer", infer_normalizer, normalizer_kernel));
  register_op(kernel_op("TfIdfVectorizer", infer_tfidf, tfidf_kernel));
  OpDef label = kernel_op("LabelEncoder", infer_label_encoder, label_encoder_kernel);
  label.domain = "ai.onnx.ml";
  register_op(std::move(label));
  // Compiled for numbers (elementwise.cc); these kernels where strings are involved.
  extend_op("", "Equal", [](OpDef& def) {
    def.kernel = equal_kernel;
    def.runs_kernel = has_string_input;
  });
  for (const char* op : {"Cast", "CastLike"})
    extend_op("", op, [](OpDef& def) {
      def.kernel = cast_kernel;
      def.runs_kernel = cast_involves_strings;
    });
}

}  // namespace kiln::ops
