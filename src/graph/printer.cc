// print_graph / parse_graph: the text form of the graph IR (format in graph.h).
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>

#include "graph/graph.h"

namespace kiln {

namespace {

// ---------------------------------------------------------------------------
// Shared lexical helpers

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '$' || c == '/' || c == '-';
}

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

bool is_plain_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_name_char(c)) return false;
  return true;
}

// A plain identifier: starts with a letter or '_' (so it cannot be read as a number or keyword-like token).
bool is_plain_ident(const std::string& s) { return !s.empty() && is_ident_start(s[0]) && is_plain_name(s); }

std::string quote(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string value_ref(const std::string& name) { return "%" + (is_plain_name(name) ? name : quote(name)); }

std::string ident_or_quoted(const std::string& s) { return is_plain_ident(s) ? s : quote(s); }

template <typename T>
std::string shortest(T v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// A float attribute: f32-exact values print as the shortest f32 text, others
// as the shortest f64 text with a 'd' suffix. Always recognisable as a float.
std::string format_attr_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::string s;
  bool is_f32 = static_cast<double>(static_cast<float>(f)) == f;
  s = is_f32 ? shortest(static_cast<float>(f)) : shortest(f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  if (!is_f32) s += "d";
  return s;
}

uint64_t fnv1a(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  };
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      const std::string& s = t.data_as<std::string>()[i];
      uint64_t len = s.size();
      unsigned char lb[8];
      for (int k = 0; k < 8; ++k) lb[k] = static_cast<unsigned char>(len >> (8 * k));
      mix(lb, 8);
      mix(reinterpret_cast<const unsigned char*>(s.data()), s.size());
    }
  } else {
    mix(static_cast<const unsigned char*>(t.data()), static_cast<size_t>(t.nbytes()));
  }
  return h;
}

std::string hex16(uint64_t h) {
  static const char* kHex = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[i] = kHex[h & 15];
    h >>= 4;
  }
  return s;
}

// Dtypes whose elements print as decimal text; the rest print as hex bytes.
bool has_text_elements(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kFloat64: case DType::kUInt8: case DType::kInt8: case DType::kUInt16:
    case DType::kInt16: case DType::kInt32: case DType::kInt64: case DType::kUInt32: case DType::kUInt64:
    case DType::kBool: case DType::kString:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// Printer

class Printer {
 public:
  explicit Printer(const PrintOptions& options) : options_(options) {}

  void graph(const Graph& g, int indent, std::ostringstream& os) {
    std::string pad(static_cast<size_t>(indent) + 2, ' ');
    os << "graph " << ident_or_quoted(g.name) << "(";
    for (size_t i = 0; i < g.inputs().size(); ++i) os << (i ? ", " : "") << decl(g.inputs()[i]);
    os << ") -> (";
    for (size_t i = 0; i < g.outputs().size(); ++i) os << (i ? ", " : "") << value_ref(g.outputs()[i]->name());
    os << ") {\n";
    for (const auto& [domain, version] : g.opsets) os << pad << "opset " << quote(domain) << " " << version << "\n";
    if (!g.source.empty()) os << pad << "source " << quote(g.source) << "\n";
    for (const auto& [sym, iv] : g.bounds) {
      os << pad << "bound " << ident_or_quoted(sym) << " [" << (iv.lo ? std::to_string(*iv.lo) : "-inf") << ", "
         << (iv.hi ? std::to_string(*iv.hi) : "inf") << "]\n";
    }
    for (Value* c : g.captures()) os << pad << "capture " << decl(c) << "\n";
    std::vector<Value*> strays;
    for (Value* v : g.values()) {
      if (v->is_constant()) {
        os << pad << decl(v) << " = " << tensor(g, v->constant()) << "\n";
      } else if (!v->producer() && !is_input_or_capture(g, v)) {
        strays.push_back(v);
      }
    }
    for (Value* v : strays) os << pad << "value " << decl(v) << "\n";
    for (Node* n : g.nodes()) {
      os << pad;
      if (n->outputs().empty()) os << "()";
      for (size_t i = 0; i < n->outputs().size(); ++i) os << (i ? ", " : "") << decl(n->output(i));
      os << " = " << (n->domain().empty() ? "" : n->domain() + "::") << n->op_type() << "(";
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        os << (i ? ", " : "");
        Value* in = n->input(i);
        os << (in ? value_ref(in->name()) : "_");
      }
      os << ")";
      if (!n->attrs().empty()) {
        os << " {";
        bool first = true;
        for (const auto& [k, a] : n->attrs()) {
          os << (first ? "" : ", ") << ident_or_quoted(k) << " = ";
          attribute(g, a, indent + 2, os);
          first = false;
        }
        os << "}";
      }
      if (!n->name().empty()) os << " name " << quote(n->name());
      os << "\n";
    }
    os << std::string(static_cast<size_t>(indent), ' ') << "}";
  }

 private:
  static bool is_input_or_capture(const Graph& g, const Value* v) {
    for (Value* i : g.inputs())
      if (i == v) return true;
    for (Value* c : g.captures())
      if (c == v) return true;
    return false;
  }

  std::string decl(const Value* v) {
    std::string s = value_ref(v->name()) + ": " + v->type().to_string();
    if (v->sym_value()) s += " sym " + shape_to_string(*v->sym_value());
    return s;
  }

  std::string tensor(const Graph& g, const Tensor& t) {
    std::string s = "const<" + std::string(dtype_name(t.dtype())) + shape_to_string(t.shape()) + " ";
    for (const auto& e : g.elided_tensors)
      if (e.tensor.data() == t.data() && e.tensor.dtype() == t.dtype()) return s + "fnv:" + e.hash + ">";
    int64_t n = t.numel();
    if (options_.max_constant_elements >= 0 && n > options_.max_constant_elements)
      return s + "fnv:" + hex16(fnv1a(t)) + ">";
    if (!has_text_elements(t.dtype())) {
      static const char* kHex = "0123456789abcdef";
      s += "hex:";
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (int64_t i = 0; i < t.nbytes(); ++i) {
        s += kHex[p[i] >> 4];
        s += kHex[p[i] & 15];
      }
      return s + ">";
    }
    s += "[";
    for (int64_t i = 0; i < n; ++i) {
      if (i) s += ", ";
      s += element(t, i);
    }
    return s + "]>";
  }

  static std::string element(const Tensor& t, int64_t i) {
    switch (t.dtype()) {
      case DType::kFloat32: return shortest(t.data_as<float>()[i]);
      case DType::kFloat64: return shortest(t.data_as<double>()[i]);
      case DType::kUInt64: return std::to_string(t.data_as<uint64_t>()[i]);
      case DType::kBool: return t.data_as<uint8_t>()[i] ? "true" : "false";
      case DType::kString: return quote(t.data_as<std::string>()[i]);
      default: return std::to_string(t.get_i64(i));
    }
  }

  void attribute(const Graph& g, const Attribute& a, int indent, std::ostringstream& os) {
    using K = Attribute::Kind;
    auto list = [&](const char* kind, size_t n, auto&& each) {
      if (n == 0) {
        os << kind << "[]";
        return;
      }
      os << "[";
      for (size_t i = 0; i < n; ++i) {
        if (i) os << ", ";
        each(i);
      }
      os << "]";
    };
    switch (a.kind) {
      case K::kInt: os << a.i; break;
      case K::kFloat: os << format_attr_float(a.f); break;
      case K::kString: os << quote(a.s); break;
      case K::kTensor: os << tensor(g, a.t); break;
      case K::kGraph:
        KILN_CHECK(a.g != nullptr) << "graph attribute without a graph";
        graph(*a.g, indent, os);
        break;
      case K::kInts: list("ints", a.ints.size(), [&](size_t i) { os << a.ints[i]; }); break;
      case K::kFloats: list("floats", a.floats.size(), [&](size_t i) { os << format_attr_float(a.floats[i]); }); break;
      case K::kStrings: list("strings", a.strings.size(), [&](size_t i) { os << quote(a.strings[i]); }); break;
      case K::kTensors: list("tensors", a.tensors.size(), [&](size_t i) { os << tensor(g, a.tensors[i]); }); break;
      case K::kGraphs:
        list("graphs", a.graphs.size(), [&](size_t i) {
          KILN_CHECK(a.graphs[i] != nullptr) << "graphs attribute with a null graph";
          graph(*a.graphs[i], indent, os);
        });
        break;
    }
  }

  PrintOptions options_;
};

// ---------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<std::unique_ptr<Graph>> parse_top() {
    auto g = std::make_unique<Graph>();
    KILN_RETURN_IF_ERROR(parse_graph_into(*g));
    skip_ws();
    if (pos_ != text_.size()) return error("text after the end of the graph");
    return g;
  }

 private:
  Status error(const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    size_t end = text_.find('\n', pos_);
    std::string rest(text_.substr(pos_, std::min<size_t>(end == std::string_view::npos ? text_.size() - pos_ : end - pos_, 40)));
    return invalid_model() << "graph text, line " << line << ", column " << col << ": " << what << " (at '" << rest
                           << "')";
  }

  void skip_ws() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  bool peek(std::string_view s) {
    skip_ws();
    return text_.substr(pos_, s.size()) == s;
  }

  // Consumes s if it comes next. For a word, it must not run on into a name.
  bool accept(std::string_view s) {
    if (!peek(s)) return false;
    if (is_ident_start(s.back()) || (s.back() >= '0' && s.back() <= '9')) {
      size_t after = pos_ + s.size();
      if (after < text_.size() && is_name_char(text_[after])) return false;
    }
    pos_ += s.size();
    return true;
  }

  Status expect(std::string_view s) {
    if (!accept(s)) return error("expected '" + std::string(s) + "'");
    return Status::ok();
  }

  Result<std::string> quoted() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a quoted string");
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) return error("unterminated string");
      char c = text_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) return error("unterminated string");
      char e = text_[pos_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'x': {
          if (pos_ + 2 > text_.size()) return error("bad \\x escape");
          int v = 0;
          for (int k = 0; k < 2; ++k) {
            int d = hex_digit(text_[pos_++]);
            if (d < 0) return error("bad \\x escape");
            v = v * 16 + d;
          }
          out += static_cast<char>(v);
          break;
        }
        default: return error(std::string("unknown escape \\") + e);
      }
    }
    return out;
  }

  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  std::string plain_name() {
    size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // An identifier or a quoted string (graph names, attribute names, symbols).
  Result<std::string> ident_or_quoted() {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '"') return quoted();
    if (pos_ >= text_.size() || !is_ident_start(text_[pos_])) return error("expected a name");
    return plain_name();
  }

  // %name or %"name".
  Result<std::string> value_name() {
    skip_ws();
    if (pos_ >= text_.size() || text_[pos_] != '%') return error("expected a value (%name)");
    ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '"') return quoted();
    std::string n = plain_name();
    if (n.empty()) return error("expected a value name after '%'");
    return n;
  }

  Result<int64_t> integer() {
    skip_ws();
    int64_t v = 0;
    auto r = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), v);
    if (r.ec != std::errc()) return error("expected an integer");
    pos_ = static_cast<size_t>(r.ptr - text_.data());
    return v;
  }

  // "[e1, e2, ...]" of Exprs (dims or sym values); split at top-level commas.
  Result<std::vector<Expr>> expr_list() {
    KILN_RETURN_IF_ERROR(expect("["));
    std::vector<Expr> out;
    skip_ws();
    if (accept("]")) return out;
    while (true) {
      size_t start = pos_;
      int depth = 0;
      while (pos_ < text_.size()) {
        char c = text_[pos_];
        if (c == '(' || c == '[') ++depth;
        if (c == ')' || c == ']') {
          if (depth == 0) break;
          --depth;
        }
        if (c == ',' && depth == 0) break;
        if (c == '\n') break;
        ++pos_;
      }
      if (pos_ >= text_.size() || text_[pos_] == '\n') return error("unterminated dimension list");
      std::string_view piece = text_.substr(start, pos_ - start);
      while (!piece.empty() && piece.back() == ' ') piece.remove_suffix(1);
      while (!piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
      Result<Expr> e = parse_expr(piece);
      if (!e.is_ok()) {
        pos_ = start;
        return error("bad expression '" + std::string(piece) + "': " + e.status().message());
      }
      out.push_back(e.value());
      if (text_[pos_] == ']') {
        ++pos_;
        return out;
      }
      ++pos_;  // ','
    }
  }

  Result<DType> dtype() {
    skip_ws();
    size_t start = pos_;
    while (pos_ < text_.size() && ((text_[pos_] >= 'a' && text_[pos_] <= 'z') || (text_[pos_] >= '0' && text_[pos_] <= '9')))
      ++pos_;
    std::string_view n = text_.substr(start, pos_ - start);
    if (n == "undef") return DType::kUndefined;
    DType t = dtype_from_name(n);
    if (t == DType::kUndefined) {
      pos_ = start;
      return error("unknown dtype '" + std::string(n) + "'");
    }
    return t;
  }

  Result<TensorType> tensor_type(int depth = 0) {
    TensorType t;
    KILN_ASSIGN_OR_RETURN(t.dtype, dtype());
    if (t.is_container()) {
      // seq<ELEMENT>[LENGTH], opt<ELEMENT>[LENGTH] (TensorType::to_string).
      if (depth > 4) return error("containers nested too deeply");
      KILN_RETURN_IF_ERROR(expect("<"));
      KILN_ASSIGN_OR_RETURN(TensorType e, tensor_type(depth + 1));
      KILN_RETURN_IF_ERROR(expect(">"));
      t.elem = std::make_shared<const TensorType>(std::move(e));
    }
    if (accept("[?]")) {
      if (t.is_container()) return error("a container's shape is its length, [LENGTH]");
      return t;
    }
    KILN_ASSIGN_OR_RETURN(Shape s, expr_list());
    if (t.is_container() && s.size() != 1) return error("a container's shape is its length, [LENGTH]");
    t.shape = std::move(s);
    return t;
  }

  struct Decl {
    std::string name;
    TensorType type;
    std::optional<std::vector<Expr>> sym;
  };

  Result<Decl> decl() {
    Decl d;
    KILN_ASSIGN_OR_RETURN(d.name, value_name());
    KILN_RETURN_IF_ERROR(expect(":"));
    KILN_ASSIGN_OR_RETURN(d.type, tensor_type());
    if (accept("sym")) {
      KILN_ASSIGN_OR_RETURN(auto s, expr_list());
      d.sym = std::move(s);
    }
    return d;
  }

  Result<Value*> declare(Graph& g, const Decl& d, bool input) {
    if (g.find_value(d.name)) return error("duplicate value %" + d.name);
    Value* v = input ? g.add_input(d.name, d.type) : g.add_value(d.name, d.type);
    v->set_sym_value(d.sym);
    return v;
  }

  // const<dtype[shape] data>
  Result<Tensor> tensor(Graph& g) {
    KILN_RETURN_IF_ERROR(expect("const<"));
    KILN_ASSIGN_OR_RETURN(DType dt, dtype());
    if (dt == DType::kUndefined) return error("a constant needs a dtype");
    KILN_RETURN_IF_ERROR(expect("["));
    std::vector<int64_t> shape;
    if (!accept("]")) {
      while (true) {
        KILN_ASSIGN_OR_RETURN(int64_t d, integer());
        if (d < 0) return error("negative dimension");
        shape.push_back(d);
        if (accept("]")) break;
        KILN_RETURN_IF_ERROR(expect(","));
      }
    }
    Tensor t(dt, shape);
    if (accept("fnv:")) {
      std::string h = plain_name();
      if (h.size() != 16) return error("expected 16 hex digits after fnv:");
      g.elided_tensors.push_back({t, h});
    } else if (accept("hex:")) {
      std::string h = plain_name();
      if (static_cast<int64_t>(h.size()) != 2 * t.nbytes()) return error("hex data does not match the tensor's size");
      auto* p = static_cast<unsigned char*>(t.data());
      for (size_t i = 0; i < h.size(); i += 2) {
        int hi = hex_digit(h[i]), lo = hex_digit(h[i + 1]);
        if (hi < 0 || lo < 0) return error("bad hex data");
        p[i / 2] = static_cast<unsigned char>(hi * 16 + lo);
      }
    } else {
      if (!has_text_elements(dt)) return error(std::string("a ") + dtype_name(dt) + " constant needs hex: data");
      KILN_RETURN_IF_ERROR(expect("["));
      int64_t n = t.numel();
      for (int64_t i = 0; i < n; ++i) {
        if (i) KILN_RETURN_IF_ERROR(expect(","));
        KILN_RETURN_IF_ERROR(element(t, i));
      }
      KILN_RETURN_IF_ERROR(expect("]"));
    }
    KILN_RETURN_IF_ERROR(expect(">"));
    return t;
  }

  // A number token: optional '-', then digits, '.', exponent, or inf/nan.
  std::string_view number_token() {
    skip_ws();
    size_t start = pos_;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) ++pos_;
    if (text_.substr(pos_, 3) == "inf" || text_.substr(pos_, 3) == "nan") {
      pos_ += 3;
    } else {
      while (pos_ < text_.size()) {
        char c = text_[pos_];
        bool exp_sign = (c == '-' || c == '+') && pos_ > start && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E');
        if ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || exp_sign) {
          ++pos_;
        } else {
          break;
        }
      }
    }
    return text_.substr(start, pos_ - start);
  }

  template <typename T>
  Status from_text(std::string_view tok, T& out) {
    if (!tok.empty() && tok[0] == '+') tok.remove_prefix(1);
    auto r = std::from_chars(tok.data(), tok.data() + tok.size(), out);
    if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) return error("bad number '" + std::string(tok) + "'");
    return Status::ok();
  }

  Status element(Tensor& t, int64_t i) {
    switch (t.dtype()) {
      case DType::kString: {
        KILN_ASSIGN_OR_RETURN(std::string s, quoted());
        t.data_as<std::string>()[i] = std::move(s);
        return Status::ok();
      }
      case DType::kBool:
        if (accept("true")) {
          t.data_as<uint8_t>()[i] = 1;
        } else if (accept("false")) {
          t.data_as<uint8_t>()[i] = 0;
        } else {
          return error("expected true or false");
        }
        return Status::ok();
      case DType::kFloat32: return from_text(number_token(), t.data_as<float>()[i]);
      case DType::kFloat64: return from_text(number_token(), t.data_as<double>()[i]);
      case DType::kUInt64: return from_text(number_token(), t.data_as<uint64_t>()[i]);
      default: {
        int64_t v = 0;
        KILN_RETURN_IF_ERROR(from_text(number_token(), v));
        switch (t.dtype()) {
          case DType::kInt64: t.data_as<int64_t>()[i] = v; break;
          case DType::kInt32: t.data_as<int32_t>()[i] = static_cast<int32_t>(v); break;
          case DType::kUInt32: t.data_as<uint32_t>()[i] = static_cast<uint32_t>(v); break;
          case DType::kInt16: t.data_as<int16_t>()[i] = static_cast<int16_t>(v); break;
          case DType::kUInt16: t.data_as<uint16_t>()[i] = static_cast<uint16_t>(v); break;
          case DType::kInt8: t.data_as<int8_t>()[i] = static_cast<int8_t>(v); break;
          case DType::kUInt8: t.data_as<uint8_t>()[i] = static_cast<uint8_t>(v); break;
          default: return error("unexpected dtype");
        }
        return Status::ok();
      }
    }
  }

  static bool float_like(std::string_view tok) {
    return tok.find_first_of(".eE") != std::string_view::npos || tok.find("inf") != std::string_view::npos ||
           tok.find("nan") != std::string_view::npos;
  }

  // A number attribute: returns true in is_float when it is a float.
  Status number(Attribute& a, bool& is_float) {
    std::string_view tok = number_token();
    if (tok.empty() || tok == "-" || tok == "+") return error("expected a number");
    bool dsuffix = pos_ < text_.size() && text_[pos_] == 'd';
    if (dsuffix) ++pos_;
    is_float = dsuffix || float_like(tok);
    if (!is_float) return from_text(tok, a.i);
    if (dsuffix) return from_text(tok, a.f);
    float f = 0;
    KILN_RETURN_IF_ERROR(from_text(tok, f));
    a.f = f;
    return Status::ok();
  }

  Status attribute(Graph& g, Attribute& a) {
    using K = Attribute::Kind;
    skip_ws();
    if (peek("\"")) {
      a.kind = K::kString;
      KILN_ASSIGN_OR_RETURN(a.s, quoted());
      return Status::ok();
    }
    if (peek("const<")) {
      a.kind = K::kTensor;
      KILN_ASSIGN_OR_RETURN(a.t, tensor(g));
      return Status::ok();
    }
    if (peek("graph")) {
      a.kind = K::kGraph;
      a.g = std::make_shared<Graph>();
      return parse_graph_into(*a.g);
    }
    static const std::pair<const char*, K> kEmpty[] = {{"ints[]", K::kInts},       {"floats[]", K::kFloats},
                                                       {"strings[]", K::kStrings}, {"tensors[]", K::kTensors},
                                                       {"graphs[]", K::kGraphs}};
    for (const auto& [word, kind] : kEmpty)
      if (accept(word)) {
        a.kind = kind;
        return Status::ok();
      }
    if (accept("[")) {
      if (accept("]")) return error("an empty list must name its kind (ints[], floats[], ...)");
      skip_ws();
      if (peek("\"")) {
        a.kind = K::kStrings;
      } else if (peek("const<")) {
        a.kind = K::kTensors;
      } else if (peek("graph")) {
        a.kind = K::kGraphs;
      } else {
        a.kind = K::kInts;  // becomes kFloats at the first float
      }
      std::vector<Attribute> numbers;
      bool any_float = false;
      while (true) {
        switch (a.kind) {
          case K::kStrings: {
            KILN_ASSIGN_OR_RETURN(std::string s, quoted());
            a.strings.push_back(std::move(s));
            break;
          }
          case K::kTensors: {
            KILN_ASSIGN_OR_RETURN(Tensor t, tensor(g));
            a.tensors.push_back(std::move(t));
            break;
          }
          case K::kGraphs: {
            auto sg = std::make_shared<Graph>();
            KILN_RETURN_IF_ERROR(parse_graph_into(*sg));
            a.graphs.push_back(std::move(sg));
            break;
          }
          default: {
            Attribute num;
            bool is_float = false;
            KILN_RETURN_IF_ERROR(number(num, is_float));
            num.kind = is_float ? K::kFloat : K::kInt;
            any_float |= is_float;
            numbers.push_back(num);
          }
        }
        if (accept("]")) break;
        KILN_RETURN_IF_ERROR(expect(","));
      }
      if (a.kind == K::kInts) {
        if (any_float) {
          a.kind = K::kFloats;
          for (const Attribute& n : numbers) a.floats.push_back(n.kind == K::kFloat ? n.f : static_cast<double>(n.i));
        } else {
          for (const Attribute& n : numbers) a.ints.push_back(n.i);
        }
      }
      return Status::ok();
    }
    bool is_float = false;
    KILN_RETURN_IF_ERROR(number(a, is_float));
    a.kind = is_float ? K::kFloat : K::kInt;
    return Status::ok();
  }

  Status parse_graph_into(Graph& g) {
    KILN_RETURN_IF_ERROR(expect("graph"));
    KILN_ASSIGN_OR_RETURN(g.name, ident_or_quoted());
    KILN_RETURN_IF_ERROR(expect("("));
    if (!accept(")")) {
      while (true) {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        KILN_ASSIGN_OR_RETURN(Value * v, declare(g, d, true));
        (void)v;
        if (accept(")")) break;
        KILN_RETURN_IF_ERROR(expect(","));
      }
    }
    KILN_RETURN_IF_ERROR(expect("->"));
    KILN_RETURN_IF_ERROR(expect("("));
    std::vector<std::string> output_names;
    size_t outputs_pos = pos_;
    if (!accept(")")) {
      while (true) {
        KILN_ASSIGN_OR_RETURN(std::string n, value_name());
        output_names.push_back(std::move(n));
        if (accept(")")) break;
        KILN_RETURN_IF_ERROR(expect(","));
      }
    }
    KILN_RETURN_IF_ERROR(expect("{"));
    while (!accept("}")) {
      skip_ws();
      if (pos_ >= text_.size()) return error("unexpected end of text in graph " + g.name);
      if (accept("opset")) {
        KILN_ASSIGN_OR_RETURN(std::string domain, quoted());
        KILN_ASSIGN_OR_RETURN(int64_t version, integer());
        g.opsets[domain] = version;
      } else if (accept("source")) {
        KILN_ASSIGN_OR_RETURN(g.source, quoted());
      } else if (accept("bound")) {
        KILN_ASSIGN_OR_RETURN(std::string sym, ident_or_quoted());
        Interval iv;
        KILN_RETURN_IF_ERROR(expect("["));
        if (!accept("-inf")) {
          KILN_ASSIGN_OR_RETURN(int64_t lo, integer());
          iv.lo = lo;
        }
        KILN_RETURN_IF_ERROR(expect(","));
        if (!accept("inf")) {
          KILN_ASSIGN_OR_RETURN(int64_t hi, integer());
          iv.hi = hi;
        }
        KILN_RETURN_IF_ERROR(expect("]"));
        g.bounds[sym] = iv;
      } else if (accept("capture")) {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        if (g.find_value(d.name)) return error("duplicate value %" + d.name);
        g.add_capture(d.name, d.type)->set_sym_value(d.sym);
      } else if (accept("value")) {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        KILN_ASSIGN_OR_RETURN(Value * v, declare(g, d, false));
        (void)v;
      } else {
        KILN_RETURN_IF_ERROR(statement(g));
      }
    }
    std::vector<Value*> outs;
    for (const std::string& n : output_names) {
      Value* v = g.find_value(n);
      if (!v) {
        pos_ = outputs_pos;
        return error("graph output %" + n + " is not defined in graph " + g.name);
      }
      outs.push_back(v);
    }
    g.set_outputs(std::move(outs));
    return Status::ok();
  }

  // "%a: T, %b: T = Op(...) {...} name "n"" or "%w: T = const<...>".
  Status statement(Graph& g) {
    std::vector<Decl> outs;
    if (accept("(")) {
      KILN_RETURN_IF_ERROR(expect(")"));
    } else {
      while (true) {
        KILN_ASSIGN_OR_RETURN(Decl d, decl());
        outs.push_back(std::move(d));
        if (!accept(",")) break;
      }
    }
    KILN_RETURN_IF_ERROR(expect("="));
    if (peek("const<")) {
      if (outs.size() != 1) return error("a constant defines exactly one value");
      KILN_ASSIGN_OR_RETURN(Tensor t, tensor(g));
      if (g.find_value(outs[0].name)) return error("duplicate value %" + outs[0].name);
      Value* v = g.add_constant(outs[0].name, std::move(t));
      v->set_type(outs[0].type);
      v->set_sym_value(outs[0].sym);
      return Status::ok();
    }
    skip_ws();
    size_t op_start = pos_;
    while (pos_ < text_.size() && (is_ident_start(text_[pos_]) || (text_[pos_] >= '0' && text_[pos_] <= '9') ||
                                   text_[pos_] == '.' || text_[pos_] == ':'))
      ++pos_;
    std::string op(text_.substr(op_start, pos_ - op_start));
    std::string domain;
    size_t sep = op.rfind("::");
    if (sep != std::string::npos) {
      domain = op.substr(0, sep);
      op = op.substr(sep + 2);
    }
    if (op.empty()) {
      pos_ = op_start;
      return error("expected an op type");
    }
    KILN_RETURN_IF_ERROR(expect("("));
    std::vector<Value*> inputs;
    if (!accept(")")) {
      while (true) {
        if (accept("_")) {
          inputs.push_back(nullptr);
        } else {
          size_t at = pos_;
          KILN_ASSIGN_OR_RETURN(std::string n, value_name());
          Value* v = g.find_value(n);
          if (!v) {
            pos_ = at;
            return error("value %" + n + " is used before it is defined");
          }
          inputs.push_back(v);
        }
        if (accept(")")) break;
        KILN_RETURN_IF_ERROR(expect(","));
      }
    }
    std::map<std::string, Attribute> attrs;
    if (accept("{")) {
      if (!accept("}")) {
        while (true) {
          KILN_ASSIGN_OR_RETURN(std::string key, ident_or_quoted());
          KILN_RETURN_IF_ERROR(expect("="));
          Attribute a;
          KILN_RETURN_IF_ERROR(attribute(g, a));
          if (attrs.count(key)) return error("duplicate attribute " + key);
          attrs[key] = std::move(a);
          if (accept("}")) break;
          KILN_RETURN_IF_ERROR(expect(","));
        }
      }
    }
    std::string node_name;
    if (accept("name")) {
      KILN_ASSIGN_OR_RETURN(node_name, quoted());
    }
    std::vector<std::string> names;
    for (const Decl& d : outs) {
      if (g.find_value(d.name)) return error("duplicate value %" + d.name);
      for (const std::string& earlier : names)
        if (earlier == d.name) return error("duplicate value %" + d.name);
      names.push_back(d.name);
    }
    Node* n = g.add_node(op, inputs, names, domain, node_name);
    for (size_t i = 0; i < outs.size(); ++i) {
      n->output(i)->set_type(outs[i].type);
      n->output(i)->set_sym_value(outs[i].sym);
    }
    for (auto& [k, a] : attrs) n->set_attr(k, std::move(a));
    return Status::ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

std::string print_graph(const Graph& g, const PrintOptions& options) {
  std::ostringstream os;
  Printer(options).graph(g, 0, os);
  os << "\n";
  return os.str();
}

Result<std::unique_ptr<Graph>> parse_graph(std::string_view text) { return Parser(text).parse_top(); }

}  // namespace kiln
