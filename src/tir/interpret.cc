#include "tir/interpret.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace kiln::tir {
namespace {

// A scalar: integers and bools in `i` (the bit pattern for u64), floats in `f`.
struct Value {
  int64_t i = 0;
  double f = 0.0;
};

int bit_width(DType t) { return t == DType::kBool ? 1 : static_cast<int>(dtype_size(t)) * 8; }

// Wraps an integer to the width and signedness of t; rounds f32 values.
Value normalize(DType t, Value v) {
  if (dtype_is_float(t)) {
    // Narrow float types compute in f32 (as compiled code does); conversions round.
    if (t == DType::kFloat32 || dtype_is_narrow_float(t)) v.f = static_cast<float>(v.f);
    return v;
  }
  if (t == DType::kBool) {
    v.i = v.i != 0;
    return v;
  }
  int bits = bit_width(t);
  if (bits == 64) return v;
  uint64_t mask = (uint64_t{1} << bits) - 1;
  uint64_t u = static_cast<uint64_t>(v.i) & mask;
  if (dtype_is_signed(t) && (u >> (bits - 1))) u |= ~mask;
  v.i = static_cast<int64_t>(u);
  return v;
}

Value int_value(int64_t i) { return Value{i, 0.0}; }
Value float_value(double f) { return Value{0, f}; }

struct Scratch {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
};

struct BufferRef {
  unsigned char* data = nullptr;
  DType dtype = DType::kUndefined;
  const std::vector<int64_t>* shape = nullptr;
};

class Interpreter {
 public:
  Interpreter(const PrimFunc& f, const std::vector<void*>& buffers) : f_(f), buffers_(buffers) {}

  Status run(const std::vector<int64_t>& syms) {
    if (buffers_.size() != f_.params.size()) {
      return invalid_argument() << "interpret " << f_.name << ": " << buffers_.size()
                                << " buffers for " << f_.params.size() << " params";
    }
    if (syms.size() != f_.sym_names.size()) {
      return invalid_argument() << "interpret " << f_.name << ": " << syms.size() << " syms for "
                                << f_.sym_names.size() << " names";
    }
    for (size_t j = 0; j < syms.size(); ++j) env_.emplace_back(f_.sym_names[j], syms[j]);
    for (const Buffer& b : f_.params) {
      if (!dtype_is_compilable(b.dtype)) {
        return unsupported() << "interpret " << f_.name << ": param " << b.name << " has dtype "
                             << dtype_name(b.dtype);
      }
      std::vector<int64_t> shape;
      for (const Expr& d : b.shape) {
        Value v = eval(d);
        if (!err_.is_ok()) return err_;
        shape.push_back(v.i);
      }
      param_shapes_.push_back(std::move(shape));
    }
    exec(f_.body);
    return err_;
  }

 private:
  void fail(Status s) {
    if (err_.is_ok()) err_ = std::move(s);
  }
  bool failed() const { return !err_.is_ok(); }

  Value read(const unsigned char* p, DType t) {
    switch (t) {
      case DType::kFloat32: { float x; std::memcpy(&x, p, 4); return float_value(x); }
      case DType::kFloat64: { double x; std::memcpy(&x, p, 8); return float_value(x); }
      case DType::kInt8: case DType::kInt4: { int8_t x; std::memcpy(&x, p, 1); return int_value(x); }
      case DType::kInt16: { int16_t x; std::memcpy(&x, p, 2); return int_value(x); }
      case DType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return int_value(x); }
      case DType::kInt64: { int64_t x; std::memcpy(&x, p, 8); return int_value(x); }
      case DType::kUInt8: case DType::kUInt4: { uint8_t x; std::memcpy(&x, p, 1); return int_value(x); }
      case DType::kUInt16: { uint16_t x; std::memcpy(&x, p, 2); return int_value(x); }
      case DType::kUInt32: { uint32_t x; std::memcpy(&x, p, 4); return int_value(x); }
      case DType::kUInt64: { int64_t x; std::memcpy(&x, p, 8); return int_value(x); }
      case DType::kBool: return int_value(*p != 0);
      default:
        if (dtype_is_narrow_float(t)) return float_value(narrow_float_load(p, t));
        break;
    }
    fail(unsupported() << "interpret: cannot read dtype " << dtype_name(t));
    return {};
  }

  void write(unsigned char* p, DType t, Value v) {
    switch (t) {
      case DType::kFloat32: { float x = static_cast<float>(v.f); std::memcpy(p, &x, 4); return; }
      case DType::kFloat64: std::memcpy(p, &v.f, 8); return;
      case DType::kInt8:
      case DType::kUInt8: { uint8_t x = static_cast<uint8_t>(v.i); std::memcpy(p, &x, 1); return; }
      case DType::kInt16:
      case DType::kUInt16: { uint16_t x = static_cast<uint16_t>(v.i); std::memcpy(p, &x, 2); return; }
      case DType::kInt32:
      case DType::kUInt32: { uint32_t x = static_cast<uint32_t>(v.i); std::memcpy(p, &x, 4); return; }
      case DType::kInt64:
      case DType::kUInt64: std::memcpy(p, &v.i, 8); return;
      case DType::kBool: *p = v.i != 0; return;
      // One 4-bit value per byte: int4 sign-extended, uint4 in the low nibble.
      case DType::kInt4: { int8_t x = static_cast<int8_t>(static_cast<int8_t>(v.i << 4) >> 4); std::memcpy(p, &x, 1); return; }
      case DType::kUInt4: *p = static_cast<uint8_t>(v.i & 0x0f); return;
      default:
        if (dtype_is_narrow_float(t)) {
          narrow_float_store(p, t, static_cast<float>(v.f));
          return;
        }
        break;
    }
    fail(unsupported() << "interpret: cannot write dtype " << dtype_name(t));
  }

  BufferRef find_buffer(const std::string& name, int64_t index) {
    if (index >= 0) {
      if (index >= static_cast<int64_t>(f_.params.size()) || f_.params[index].name != name) {
        fail(internal_error() << "interpret " << f_.name << ": buffer " << name << "#" << index
                              << " is not a param");
        return {};
      }
      return {static_cast<unsigned char*>(buffers_[index]), f_.params[index].dtype,
              &param_shapes_[index]};
    }
    for (size_t i = scratch_.size(); i-- > 0;) {
      if (scratch_[i].name == name) {
        return {scratch_[i].data.data(), scratch_[i].dtype, &scratch_[i].shape};
      }
    }
    fail(internal_error() << "interpret " << f_.name << ": buffer " << name
                          << " is neither a param nor allocated here");
    return {};
  }

  // The address of an element, or null after reporting an error.
  unsigned char* element(const std::string& name, int64_t index, const std::vector<Expr>& indices,
                         DType* dtype) {
    BufferRef b = find_buffer(name, index);
    if (failed()) return nullptr;
    const std::vector<int64_t>& shape = *b.shape;
    if (indices.size() != shape.size()) {
      fail(internal_error() << "interpret " << f_.name << ": " << indices.size()
                            << " indices for buffer " << name << " of rank " << shape.size());
      return nullptr;
    }
    int64_t offset = 0;
    for (size_t d = 0; d < indices.size(); ++d) {
      int64_t i = eval(indices[d]).i;
      if (failed()) return nullptr;
      if (i < 0 || i >= shape[d]) {
        fail(invalid_argument() << "interpret " << f_.name << ": index " << i << " out of bounds [0, "
                                << shape[d] << ") in dim " << d << " of " << name);
        return nullptr;
      }
      offset = offset * shape[d] + i;
    }
    if (b.data == nullptr) {
      fail(invalid_argument() << "interpret " << f_.name << ": buffer " << name << " is null");
      return nullptr;
    }
    *dtype = b.dtype;
    return b.data + offset * dtype_size(b.dtype);
  }

  Value lookup(const std::string& name) {
    for (size_t i = env_.size(); i-- > 0;) {
      if (env_[i].first == name) return int_value(env_[i].second);
    }
    fail(internal_error() << "interpret " << f_.name << ": unbound variable " << name);
    return {};
  }

  static bool less(DType t, Value a, Value b) {
    if (dtype_is_float(t)) return a.f < b.f;
    if (dtype_is_signed(t)) return a.i < b.i;
    return static_cast<uint64_t>(a.i) < static_cast<uint64_t>(b.i);
  }

  static bool equal(DType t, Value a, Value b) {
    return dtype_is_float(t) ? a.f == b.f : a.i == b.i;
  }

  Value arith(ExprKind kind, DType t, Value a, Value b) {
    bool is_float = dtype_is_float(t);
    if (is_float) {
      switch (kind) {
        case ExprKind::kAdd: return normalize(t, float_value(a.f + b.f));
        case ExprKind::kSub: return normalize(t, float_value(a.f - b.f));
        case ExprKind::kMul: return normalize(t, float_value(a.f * b.f));
        case ExprKind::kDiv: return normalize(t, float_value(a.f / b.f));
        case ExprKind::kMod: return normalize(t, float_value(std::fmod(a.f, b.f)));
        case ExprKind::kFloorDiv: return normalize(t, float_value(std::floor(a.f / b.f)));
        case ExprKind::kMin:
          if (std::isnan(a.f) || std::isnan(b.f)) return float_value(std::nan(""));
          return a.f < b.f ? a : b;
        case ExprKind::kMax:
          if (std::isnan(a.f) || std::isnan(b.f)) return float_value(std::nan(""));
          return a.f > b.f ? a : b;
        default: break;
      }
    } else {
      uint64_t ua = static_cast<uint64_t>(a.i), ub = static_cast<uint64_t>(b.i);
      switch (kind) {
        case ExprKind::kAdd: return normalize(t, int_value(static_cast<int64_t>(ua + ub)));
        case ExprKind::kSub: return normalize(t, int_value(static_cast<int64_t>(ua - ub)));
        case ExprKind::kMul: return normalize(t, int_value(static_cast<int64_t>(ua * ub)));
        case ExprKind::kMin: return less(t, a, b) ? a : b;
        case ExprKind::kMax: return less(t, a, b) ? b : a;
        case ExprKind::kFloorDiv:
        case ExprKind::kMod: {
          // As the generated code: a zero divisor gives 0.
          if (b.i == 0) return normalize(t, int_value(0));
          if (!dtype_is_signed(t)) {
            uint64_t r = kind == ExprKind::kFloorDiv ? ua / ub : ua % ub;
            return normalize(t, int_value(static_cast<int64_t>(r)));
          }
          if (b.i == -1) {
            // Avoids INT64_MIN / -1; the result wraps like the hardware's would.
            int64_t r = kind == ExprKind::kFloorDiv ? static_cast<int64_t>(0 - ua) : 0;
            return normalize(t, int_value(r));
          }
          int64_t q = a.i / b.i, r = a.i % b.i;
          if (r != 0 && ((r < 0) != (b.i < 0))) {
            q -= 1;
            r += b.i;
          }
          return normalize(t, int_value(kind == ExprKind::kFloorDiv ? q : r));
        }
        default: break;
      }
    }
    fail(internal_error() << "interpret: bad arithmetic on " << dtype_name(t));
    return {};
  }

  Value convert(DType from, DType to, Value v) {
    if (dtype_is_float(from)) {
      if (dtype_is_narrow_float(to) && from != to)
        return float_value(round_to_narrow_float(static_cast<float>(v.f), to));
      if (dtype_is_float(to)) return normalize(to, v);
      if (to == DType::kBool) return int_value(v.f != 0.0);
      if (std::isnan(v.f)) return int_value(0);
      double t = std::trunc(v.f);
      int64_t bits;
      if (t >= 9223372036854775808.0) {
        bits = t >= 18446744073709551616.0 ? -1 : static_cast<int64_t>(static_cast<uint64_t>(t));
      } else if (t < -9223372036854775808.0) {
        bits = std::numeric_limits<int64_t>::min();
      } else {
        bits = static_cast<int64_t>(t);
      }
      return normalize(to, int_value(bits));
    }
    if (dtype_is_float(to)) {
      double d = dtype_is_signed(from) || from == DType::kBool
                     ? static_cast<double>(v.i)
                     : static_cast<double>(static_cast<uint64_t>(v.i));
      if (dtype_is_narrow_float(to)) return float_value(round_to_narrow_float(static_cast<float>(d), to));
      return normalize(to, float_value(d));
    }
    return normalize(to, v);
  }

  Value call(const Expr& e) {
    const std::string& name = e->name;
    DType t = e.dtype();
    std::vector<Value> a;
    for (const Expr& x : e->args) {
      a.push_back(eval(x));
      if (failed()) return {};
    }
    auto need = [&](size_t n) {
      if (a.size() == n) return true;
      fail(internal_error() << "interpret: " << name << " takes " << n << " arguments, got "
                            << a.size());
      return false;
    };
    DType at = e->args.empty() ? t : e->args[0].dtype();
    bool is_float = dtype_is_float(at);
    auto unary_float = [&](double (*fn)(double)) {
      if (!need(1)) return Value{};
      if (!is_float) {
        fail(internal_error() << "interpret: " << name << " of " << dtype_name(at));
        return Value{};
      }
      return normalize(t, float_value(fn(a[0].f)));
    };
    if (name == "exp") return unary_float([](double x) { return std::exp(x); });
    if (name == "log") return unary_float([](double x) { return std::log(x); });
    if (name == "tanh") return unary_float([](double x) { return std::tanh(x); });
    if (name == "erf") return unary_float([](double x) { return std::erf(x); });
    if (name == "sigmoid") return unary_float([](double x) { return 1.0 / (1.0 + std::exp(-x)); });
    if (name == "sqrt") return unary_float([](double x) { return std::sqrt(x); });
    if (name == "floor") return unary_float([](double x) { return std::floor(x); });
    if (name == "ceil") return unary_float([](double x) { return std::ceil(x); });
    if (name == "round") return unary_float([](double x) { return std::nearbyint(x); });
    if (name == "sin") return unary_float([](double x) { return std::sin(x); });
    if (name == "cos") return unary_float([](double x) { return std::cos(x); });
    if (name == "atan") return unary_float([](double x) { return std::atan(x); });
    if (name == "asin") return unary_float([](double x) { return std::asin(x); });
    if (name == "acos") return unary_float([](double x) { return std::acos(x); });
    if (name == "cast_nosat") {
      if (!need(1)) return Value{};
      if (!dtype_is_narrow_float(t) || !is_float) {
        fail(internal_error() << "interpret: cast_nosat to " << dtype_name(t));
        return Value{};
      }
      return float_value(round_to_narrow_float(static_cast<float>(a[0].f), t, false));
    }
    if (name == "abs" || name == "neg") {
      if (!need(1)) return {};
      bool neg = name == "neg";
      if (is_float) return normalize(t, float_value(neg ? -a[0].f : std::fabs(a[0].f)));
      uint64_t u = static_cast<uint64_t>(a[0].i);
      bool negate = neg || (dtype_is_signed(at) && a[0].i < 0);
      return normalize(t, int_value(static_cast<int64_t>(negate ? 0 - u : u)));
    }
    if (name == "pow") {
      if (!need(2)) return {};
      if (is_float) return normalize(t, float_value(std::pow(a[0].f, a[1].f)));
      uint64_t base = static_cast<uint64_t>(a[0].i), r = 1;
      if (dtype_is_signed(at) && a[1].i < 0) {
        // Integer pow with a negative exponent: 1/b^|e| truncated.
        int64_t b = a[0].i;
        r = b == 1 ? 1 : b == -1 ? ((a[1].i & 1) ? static_cast<uint64_t>(-1) : 1) : 0;
        return normalize(t, int_value(static_cast<int64_t>(r)));
      }
      for (uint64_t n = static_cast<uint64_t>(a[1].i); n; n >>= 1) {
        if (n & 1) r *= base;
        base *= base;
      }
      return normalize(t, int_value(static_cast<int64_t>(r)));
    }
    if (name == "isnan" || name == "isinf") {
      if (!need(1)) return {};
      if (!is_float) return int_value(0);
      return int_value(name == "isnan" ? std::isnan(a[0].f) : std::isinf(a[0].f));
    }
    if (name == "bitand" || name == "bitor" || name == "bitxor" || name == "shl" || name == "shr") {
      if (!need(2)) return {};
      if (is_float) {
        fail(internal_error() << "interpret: " << name << " of " << dtype_name(at));
        return {};
      }
      uint64_t x = static_cast<uint64_t>(a[0].i), y = static_cast<uint64_t>(a[1].i);
      int bits = bit_width(at);
      uint64_t r = 0;
      if (name == "bitand") r = x & y;
      if (name == "bitor") r = x | y;
      if (name == "bitxor") r = x ^ y;
      if (name == "shl") r = y >= static_cast<uint64_t>(bits) ? 0 : x << y;
      if (name == "shr") {
        if (dtype_is_signed(at)) {
          int64_t s = a[0].i;
          r = static_cast<uint64_t>(y >= static_cast<uint64_t>(bits) ? (s < 0 ? -1 : 0) : s >> y);
        } else {
          uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
          r = y >= static_cast<uint64_t>(bits) ? 0 : (x & mask) >> y;
        }
      }
      return normalize(t, int_value(static_cast<int64_t>(r)));
    }
    fail(unsupported() << "interpret: unknown intrinsic " << name);
    return {};
  }

  Value eval(const Expr& e) {
    if (failed()) return {};
    if (!e.defined()) {
      fail(internal_error() << "interpret " << f_.name << ": undefined expression");
      return {};
    }
    DType t = e.dtype();
    switch (e.kind()) {
      case ExprKind::kIntImm: return normalize(t, int_value(e->int_value));
      case ExprKind::kFloatImm: return normalize(t, float_value(e->float_value));
      case ExprKind::kVar: return normalize(t, lookup(e->name));
      case ExprKind::kAdd:
      case ExprKind::kMul:
      case ExprKind::kSub:
      case ExprKind::kDiv:
      case ExprKind::kFloorDiv:
      case ExprKind::kMod:
      case ExprKind::kMin:
      case ExprKind::kMax: {
        if (e->args.size() < 2) {
          fail(internal_error() << "interpret: " << print_expr(e) << " has too few operands");
          return {};
        }
        Value acc = eval(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) {
          Value b = eval(e->args[i]);
          if (failed()) return {};
          acc = arith(e.kind(), t, acc, b);
        }
        return acc;
      }
      case ExprKind::kLT:
      case ExprKind::kLE:
      case ExprKind::kEQ:
      case ExprKind::kNE: {
        DType at = e->args[0].dtype();
        Value a = eval(e->args[0]);
        Value b = eval(e->args[1]);
        if (failed()) return {};
        switch (e.kind()) {
          case ExprKind::kLT: return int_value(less(at, a, b));
          case ExprKind::kLE: return int_value(less(at, a, b) || equal(at, a, b));
          case ExprKind::kEQ: return int_value(equal(at, a, b));
          default: return int_value(!equal(at, a, b));
        }
      }
      case ExprKind::kAnd: {
        if (!eval(e->args[0]).i) return int_value(0);
        return int_value(eval(e->args[1]).i != 0);
      }
      case ExprKind::kOr: {
        if (eval(e->args[0]).i) return int_value(1);
        return int_value(eval(e->args[1]).i != 0);
      }
      case ExprKind::kNot: return int_value(eval(e->args[0]).i == 0);
      case ExprKind::kSelect: return eval(e->args[0]).i ? eval(e->args[1]) : eval(e->args[2]);
      case ExprKind::kCast: {
        Value v = eval(e->args[0]);
        if (failed()) return {};
        return convert(e->args[0].dtype(), t, v);
      }
      case ExprKind::kLoad: {
        DType bt;
        unsigned char* p = element(e->name, e->int_value, e->args, &bt);
        if (p == nullptr) return {};
        if (bt != t) {
          fail(internal_error() << "interpret " << f_.name << ": load of " << e->name << " as "
                                << dtype_name(t) << " but the buffer is " << dtype_name(bt));
          return {};
        }
        return read(p, bt);
      }
      case ExprKind::kCall: return call(e);
    }
    fail(internal_error() << "interpret: unknown expression kind");
    return {};
  }

  void exec(const Stmt& s) {
    if (failed()) return;
    if (!s) {
      fail(internal_error() << "interpret " << f_.name << ": null statement");
      return;
    }
    switch (s->kind) {
      case StmtKind::kFor: {
        int64_t extent = eval(s->extent).i;
        env_.emplace_back(s->var, 0);
        size_t slot = env_.size() - 1;
        for (int64_t i = 0; i < extent && !failed(); ++i) {
          env_[slot].second = i;
          exec(s->body);
        }
        env_.pop_back();
        return;
      }
      case StmtKind::kStore: {
        DType bt;
        unsigned char* p = element(s->buffer.name, s->buffer_index, s->indices, &bt);
        if (p == nullptr) return;
        if (s->value.dtype() != bt) {
          fail(internal_error() << "interpret " << f_.name << ": store of "
                                << dtype_name(s->value.dtype()) << " into " << s->buffer.name
                                << " of " << dtype_name(bt));
          return;
        }
        Value v = eval(s->value);
        if (!failed()) write(p, bt, v);
        return;
      }
      case StmtKind::kAllocate: {
        Scratch b;
        b.name = s->buffer.name;
        b.dtype = s->buffer.dtype;
        if (!dtype_is_compilable(b.dtype)) {
          fail(unsupported() << "interpret: allocate " << b.name << " of dtype "
                             << dtype_name(b.dtype));
          return;
        }
        int64_t n = 1;
        for (const Expr& d : s->buffer.shape) {
          int64_t v = eval(d).i;
          if (failed()) return;
          if (v < 0) {
            fail(invalid_argument() << "interpret: allocate " << b.name << " with extent " << v);
            return;
          }
          b.shape.push_back(v);
          n *= v;
        }
        b.data.assign(static_cast<size_t>(n * dtype_size(b.dtype)), 0xff);
        scratch_.push_back(std::move(b));
        exec(s->body);
        scratch_.pop_back();
        return;
      }
      case StmtKind::kIfThenElse: {
        bool c = eval(s->cond).i != 0;
        if (failed()) return;
        if (c) {
          exec(s->then_case);
        } else if (s->else_case) {
          exec(s->else_case);
        }
        return;
      }
      case StmtKind::kSeq:
        for (const Stmt& c : s->seq) exec(c);
        return;
      case StmtKind::kPrefetch:  // a cache hint: nothing to compute
        return;
    }
  }

  const PrimFunc& f_;
  const std::vector<void*>& buffers_;
  std::vector<std::vector<int64_t>> param_shapes_;
  std::vector<std::pair<std::string, int64_t>> env_;
  std::vector<Scratch> scratch_;
  Status err_;
};

}  // namespace

Status interpret(const PrimFunc& f, const std::vector<void*>& buffers,
                 const std::vector<int64_t>& syms) {
  Interpreter in(f, buffers);
  return in.run(syms);
}

}  // namespace kiln::tir
