// Expr: constructors, structural equality, printer, parser, evaluation and the
// canonicalizing simplifier. See expr.h for the contracts.
#include "shape/expr.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

namespace {

using Env = std::map<std::string, int64_t, std::less<>>;

Expr make_node(ExprKind kind, DType dtype, std::vector<Expr> args, int64_t int_value = 0,
               double float_value = 0.0, std::string name = {}) {
  auto n = std::make_shared<ExprNode>();
  n->kind = kind;
  n->dtype = dtype;
  n->int_value = int_value;
  n->float_value = float_value;
  n->name = std::move(name);
  n->args = std::move(args);
  return Expr(std::shared_ptr<const ExprNode>(std::move(n)));
}

// ---------------------------------------------------------------------------
// Integer and float arithmetic with the semantics of the IR.

int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int64_t wrap_neg(int64_t a) { return wrap_sub(0, a); }

// floor(a / b); b != 0.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) return wrap_neg(a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
// a - floor_div(a, b) * b, sign of the divisor; b != 0.
int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// The value v represented in integer dtype t (two's complement truncation).
int64_t wrap_to(int64_t v, DType t) {
  switch (t) {
    case DType::kBool: return v != 0;
    case DType::kInt8: return static_cast<int8_t>(v);
    case DType::kUInt8: return static_cast<uint8_t>(v);
    case DType::kInt16: return static_cast<int16_t>(v);
    case DType::kUInt16: return static_cast<uint16_t>(v);
    case DType::kInt32: return static_cast<int32_t>(v);
    case DType::kUInt32: return static_cast<uint32_t>(v);
    case DType::kInt4: return ((v & 0xF) ^ 0x8) - 0x8;
    case DType::kUInt4: return v & 0xF;
    default: return v;
  }
}

double round_to(double v, DType t) {
  if (t == DType::kFloat32) return static_cast<double>(static_cast<float>(v));
  return v;
}

bool is_int_like(DType t) { return dtype_is_int(t) || t == DType::kBool; }

// Integer result of a binary operation on constants of dtype t; nullopt when it
// cannot be folded (division by zero).
std::optional<int64_t> fold_int(ExprKind k, int64_t a, int64_t b, DType t) {
  const bool u64 = t == DType::kUInt64;
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (k) {
    case ExprKind::kAdd: return wrap_to(wrap_add(a, b), t);
    case ExprKind::kSub: return wrap_to(wrap_sub(a, b), t);
    case ExprKind::kMul: return wrap_to(wrap_mul(a, b), t);
    case ExprKind::kFloorDiv:
      if (b == 0) return std::nullopt;
      return u64 ? static_cast<int64_t>(ua / ub) : wrap_to(floor_div(a, b), t);
    case ExprKind::kMod:
      if (b == 0) return std::nullopt;
      return u64 ? static_cast<int64_t>(ua % ub) : wrap_to(floor_mod(a, b), t);
    case ExprKind::kMin: return u64 ? static_cast<int64_t>(std::min(ua, ub)) : std::min(a, b);
    case ExprKind::kMax: return u64 ? static_cast<int64_t>(std::max(ua, ub)) : std::max(a, b);
    case ExprKind::kLT: return u64 ? ua < ub : a < b;
    case ExprKind::kLE: return u64 ? ua <= ub : a <= b;
    case ExprKind::kEQ: return a == b;
    case ExprKind::kNE: return a != b;
    case ExprKind::kAnd: return (a != 0) && (b != 0);
    case ExprKind::kOr: return (a != 0) || (b != 0);
    default: return std::nullopt;
  }
}

bool is_compare(ExprKind k) {
  return k == ExprKind::kLT || k == ExprKind::kLE || k == ExprKind::kEQ || k == ExprKind::kNE;
}

// Folds a binary node whose operands are both constants; undefined when it cannot.
Expr fold_binary(ExprKind k, const Expr& a, const Expr& b) {
  if (a.kind() == ExprKind::kIntImm && b.kind() == ExprKind::kIntImm) {
    auto r = fold_int(k, a->int_value, b->int_value, a.dtype());
    if (!r) return Expr();
    DType t = (is_compare(k) || k == ExprKind::kAnd || k == ExprKind::kOr) ? DType::kBool : a.dtype();
    return int_imm(*r, t);
  }
  if (a.kind() == ExprKind::kFloatImm && b.kind() == ExprKind::kFloatImm) {
    double x = a->float_value, y = b->float_value;
    DType t = a.dtype();
    switch (k) {
      case ExprKind::kAdd: return float_imm(x + y, t);
      case ExprKind::kSub: return float_imm(x - y, t);
      case ExprKind::kMul: return float_imm(x * y, t);
      case ExprKind::kDiv: return float_imm(x / y, t);
      case ExprKind::kMod: return float_imm(std::fmod(x, y), t);
      case ExprKind::kMin:
        if (std::isnan(x) || std::isnan(y)) return Expr();
        return float_imm(std::min(x, y), t);
      case ExprKind::kMax:
        if (std::isnan(x) || std::isnan(y)) return Expr();
        return float_imm(std::max(x, y), t);
      case ExprKind::kLT: return bool_imm(x < y);
      case ExprKind::kLE: return bool_imm(x <= y);
      case ExprKind::kEQ: return bool_imm(x == y);
      case ExprKind::kNE: return bool_imm(x != y);
      default: return Expr();
    }
  }
  return Expr();
}

// Value of a constant converted to dtype t (C semantics, saturating float->int).
Expr fold_cast(DType t, const Expr& a) {
  if (a.kind() == ExprKind::kIntImm) {
    int64_t v = a->int_value;
    if (dtype_is_float(t)) {
      double d = a.dtype() == DType::kUInt64 ? static_cast<double>(static_cast<uint64_t>(v))
                                             : static_cast<double>(v);
      return float_imm(d, t);
    }
    if (is_int_like(t)) return int_imm(v, t);
    return Expr();
  }
  if (a.kind() == ExprKind::kFloatImm) {
    double d = a->float_value;
    if (dtype_is_float(t)) return float_imm(d, t);
    if (t == DType::kBool) return bool_imm(d != 0.0);
    if (dtype_is_int(t)) {
      if (std::isnan(d)) return int_imm(0, t);
      d = std::trunc(d);
      if (t == DType::kUInt64) {
        if (d <= 0) return int_imm(0, t);
        if (d >= 18446744073709551615.0) return int_imm(-1, t);
        return int_imm(static_cast<int64_t>(static_cast<uint64_t>(d)), t);
      }
      if (d >= 9223372036854775807.0) return int_imm(std::numeric_limits<int64_t>::max(), t);
      if (d <= -9223372036854775808.0) return int_imm(std::numeric_limits<int64_t>::min(), t);
      return int_imm(static_cast<int64_t>(d), t);
    }
  }
  return Expr();
}

// ---------------------------------------------------------------------------
// Checked construction, shared by the public constructors and the parser.

// An i64 integer constant (a plain literal) takes the dtype of the other operand.
void unify(Expr& a, Expr& b) {
  if (a.dtype() == b.dtype()) return;
  auto retype = [](Expr& c, DType t) {
    if (c.kind() != ExprKind::kIntImm || c.dtype() != DType::kInt64) return false;
    if (dtype_is_float(t)) {
      c = float_imm(static_cast<double>(c->int_value), t);
      return true;
    }
    if (is_int_like(t)) {
      c = int_imm(c->int_value, t);
      return true;
    }
    return false;
  };
  if (!retype(a, b.dtype())) retype(b, a.dtype());
}

const char* kind_name(ExprKind k) {
  switch (k) {
    case ExprKind::kIntImm: return "int";
    case ExprKind::kFloatImm: return "float";
    case ExprKind::kVar: return "var";
    case ExprKind::kAdd: return "+";
    case ExprKind::kSub: return "-";
    case ExprKind::kMul: return "*";
    case ExprKind::kDiv: return "/";
    case ExprKind::kFloorDiv: return "floordiv";
    case ExprKind::kMod: return "mod";
    case ExprKind::kMin: return "min";
    case ExprKind::kMax: return "max";
    case ExprKind::kLT: return "<";
    case ExprKind::kLE: return "<=";
    case ExprKind::kEQ: return "==";
    case ExprKind::kNE: return "!=";
    case ExprKind::kAnd: return "&&";
    case ExprKind::kOr: return "||";
    case ExprKind::kNot: return "!";
    case ExprKind::kSelect: return "select";
    case ExprKind::kCast: return "cast";
    case ExprKind::kLoad: return "load";
    case ExprKind::kCall: return "call";
  }
  return "?";
}

// Builds a node of kind k (not an immediate or a variable) from args: checks
// the operand dtypes and folds constant operands. On a type error returns an
// undefined Expr and sets *error.
Expr build(ExprKind k, std::vector<Expr> args, DType dtype, std::string name, int64_t int_value,
           std::string* error) {
  auto fail = [&](const std::string& msg) {
    *error = msg;
    return Expr();
  };
  for (const Expr& a : args)
    if (!a.defined()) return fail(std::string("undefined operand of ") + kind_name(k));
  auto type_of = [](const Expr& e) { return std::string(dtype_name(e.dtype())); };
  switch (k) {
    case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kDiv:
    case ExprKind::kFloorDiv: case ExprKind::kMod: case ExprKind::kMin: case ExprKind::kMax:
    case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE:
    case ExprKind::kAnd: case ExprKind::kOr: {
      if (args.size() != 2) return fail(std::string(kind_name(k)) + " needs two operands");
      unify(args[0], args[1]);
      DType t = args[0].dtype();
      if (t != args[1].dtype())
        return fail(std::string("operands of ") + kind_name(k) + " have different dtypes " +
                    type_of(args[0]) + " and " + type_of(args[1]));
      bool ok = true;
      switch (k) {
        case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul:
          ok = dtype_is_int(t) || dtype_is_float(t);
          break;
        case ExprKind::kDiv: ok = dtype_is_float(t); break;
        case ExprKind::kFloorDiv: ok = dtype_is_int(t); break;
        case ExprKind::kMod: ok = dtype_is_int(t) || dtype_is_float(t); break;
        case ExprKind::kAnd: case ExprKind::kOr: ok = t == DType::kBool; break;
        default: ok = is_int_like(t) || dtype_is_float(t); break;
      }
      if (!ok) return fail(std::string(kind_name(k)) + " does not take operands of dtype " + type_of(args[0]));
      Expr folded = fold_binary(k, args[0], args[1]);
      if (folded.defined()) return folded;
      DType rt = (is_compare(k) || k == ExprKind::kAnd || k == ExprKind::kOr) ? DType::kBool : t;
      return make_node(k, rt, std::move(args));
    }
    case ExprKind::kNot: {
      if (args.size() != 1 || args[0].dtype() != DType::kBool) return fail("! needs one bool operand");
      if (args[0].kind() == ExprKind::kIntImm) return bool_imm(args[0]->int_value == 0);
      return make_node(k, DType::kBool, std::move(args));
    }
    case ExprKind::kSelect: {
      if (args.size() != 3) return fail("select needs three operands");
      if (args[0].dtype() != DType::kBool) return fail("select condition has dtype " + type_of(args[0]));
      unify(args[1], args[2]);
      if (args[1].dtype() != args[2].dtype())
        return fail("select branches have different dtypes " + type_of(args[1]) + " and " + type_of(args[2]));
      if (args[0].kind() == ExprKind::kIntImm) return args[0]->int_value ? args[1] : args[2];
      DType t = args[1].dtype();
      return make_node(k, t, std::move(args));
    }
    case ExprKind::kCast: {
      if (args.size() != 1) return fail("cast needs one operand");
      if (!(is_int_like(dtype) || dtype_is_float(dtype)))
        return fail(std::string("cannot cast to ") + dtype_name(dtype));
      if (args[0].dtype() == dtype) return args[0];
      Expr folded = fold_cast(dtype, args[0]);
      if (folded.defined()) return folded;
      return make_node(k, dtype, std::move(args));
    }
    case ExprKind::kLoad: {
      for (const Expr& a : args)
        if (!dtype_is_int(a.dtype())) return fail("load index of dtype " + type_of(a));
      if (dtype == DType::kUndefined) return fail("load of undefined dtype");
      return make_node(k, dtype, std::move(args), int_value, 0.0, std::move(name));
    }
    case ExprKind::kCall: {
      if (!is_known_intrinsic(name)) return fail("unknown intrinsic '" + name + "'");
      if (dtype == DType::kUndefined) return fail("call of undefined dtype");
      return make_node(k, dtype, std::move(args), 0, 0.0, std::move(name));
    }
    default:
      return fail(std::string("cannot build a node of kind ") + kind_name(k));
  }
}

thread_local ExprErrorTrap* t_trap = nullptr;

Expr build_or_die(ExprKind k, std::vector<Expr> args, DType dtype = DType::kUndefined,
                  std::string name = {}, int64_t int_value = 0) {
  std::string error;
  Expr r = build(k, std::move(args), dtype, std::move(name), int_value, &error);
  if (!r.defined() && ExprErrorTrap::record(error)) return r;
  KILN_CHECK(r.defined()) << error;
  return r;
}

// The same node with new operands (checked and folded).
Expr with_args(const Expr& e, std::vector<Expr> args) {
  switch (e.kind()) {
    case ExprKind::kIntImm: case ExprKind::kFloatImm: case ExprKind::kVar: return e;
    case ExprKind::kAdd: case ExprKind::kMul: case ExprKind::kMin: case ExprKind::kMax:
      if (args.size() > 2) {  // n-ary: rebuild as a left-leaning chain
        Expr acc = args[0];
        for (size_t i = 1; i < args.size(); ++i) acc = build_or_die(e.kind(), {acc, args[i]});
        return acc;
      }
      return build_or_die(e.kind(), std::move(args));
    default:
      return build_or_die(e.kind(), std::move(args), e.dtype(), e->name, e->int_value);
  }
}

// ---------------------------------------------------------------------------
// Structural equality, hash and total order.

bool float_bits_equal(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

bool nodes_equal(const ExprNode* a, const ExprNode* b) {
  if (a == b) return true;
  if (!a || !b) return false;
  if (a->kind != b->kind || a->dtype != b->dtype || a->int_value != b->int_value ||
      a->args.size() != b->args.size() || a->name != b->name ||
      !float_bits_equal(a->float_value, b->float_value))
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!nodes_equal(a->args[i].get(), b->args[i].get())) return false;
  return true;
}

size_t hash_combine(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

// Rank of a kind in the canonical order of atoms: variables first.
int kind_rank(ExprKind k) {
  switch (k) {
    case ExprKind::kVar: return 0;
    case ExprKind::kIntImm: return 1;
    case ExprKind::kFloatImm: return 2;
    case ExprKind::kFloorDiv: return 3;
    case ExprKind::kMod: return 4;
    case ExprKind::kMin: return 5;
    case ExprKind::kMax: return 6;
    default: return 10 + static_cast<int>(k);
  }
}

// Deterministic total order on expressions (consistent with same_as).
int compare_expr(const Expr& a, const Expr& b) {
  if (a.get() == b.get()) return 0;
  const ExprNode* x = a.get();
  const ExprNode* y = b.get();
  if (int c = kind_rank(x->kind) - kind_rank(y->kind)) return c < 0 ? -1 : 1;
  if (int c = x->name.compare(y->name)) return c < 0 ? -1 : 1;
  if (x->dtype != y->dtype) return x->dtype < y->dtype ? -1 : 1;
  if (x->int_value != y->int_value) return x->int_value < y->int_value ? -1 : 1;
  if (!float_bits_equal(x->float_value, y->float_value)) {
    if (std::isnan(x->float_value)) return 1;
    if (std::isnan(y->float_value)) return -1;
    if (x->float_value != y->float_value) return x->float_value < y->float_value ? -1 : 1;
    return std::signbit(x->float_value) ? -1 : 1;
  }
  size_t n = std::min(x->args.size(), y->args.size());
  for (size_t i = 0; i < n; ++i)
    if (int c = compare_expr(x->args[i], y->args[i])) return c;
  if (x->args.size() != y->args.size()) return x->args.size() < y->args.size() ? -1 : 1;
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public construction.

bool is_known_intrinsic(std::string_view name) {
  static const char* const kNames[] = {
      "exp",  "log",  "tanh",  "erf",   "sigmoid", "sqrt",   "abs",    "neg",    "floor", "ceil",
      "round", "pow", "sin",   "cos",   "isnan",   "isinf",  "bitand", "bitor",  "bitxor", "shl",
      "shr",  "atan", "asin",  "acos",  "cast_nosat"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

Expr::Expr(int64_t v) : Expr(int_imm(v)) {}

ExprKind Expr::kind() const {
  KILN_CHECK(n_ != nullptr) << "kind() of an undefined Expr";
  return n_->kind;
}
DType Expr::dtype() const {
  if (n_ == nullptr && ExprErrorTrap::record("dtype() of an undefined Expr")) return DType::kUndefined;
  KILN_CHECK(n_ != nullptr) << "dtype() of an undefined Expr";
  return n_->dtype;
}

ExprErrorTrap::ExprErrorTrap() : outer_(t_trap) { t_trap = this; }
ExprErrorTrap::~ExprErrorTrap() { t_trap = outer_; }

bool ExprErrorTrap::record(const std::string& message) {
  if (t_trap == nullptr) return false;
  if (t_trap->error_.empty()) t_trap->error_ = message.empty() ? "ill-typed expression" : message;
  return true;
}
bool Expr::is_const() const { return n_ && n_->kind == ExprKind::kIntImm; }
std::optional<int64_t> Expr::as_const() const {
  if (!is_const()) return std::nullopt;
  return n_->int_value;
}
bool Expr::is_var() const { return n_ && n_->kind == ExprKind::kVar; }
bool Expr::same_as(const Expr& o) const { return nodes_equal(n_.get(), o.n_.get()); }

size_t Expr::hash() const {
  if (!n_) return 0;
  size_t h = std::hash<int>()(static_cast<int>(n_->kind));
  h = hash_combine(h, static_cast<size_t>(n_->dtype));
  h = hash_combine(h, std::hash<int64_t>()(n_->int_value));
  double f = std::isnan(n_->float_value) ? std::numeric_limits<double>::quiet_NaN() : n_->float_value;
  uint64_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  h = hash_combine(h, std::hash<uint64_t>()(bits));
  if (!n_->name.empty()) h = hash_combine(h, std::hash<std::string>()(n_->name));
  for (const Expr& a : n_->args) h = hash_combine(h, a.hash());
  return h;
}

std::string Expr::to_string() const { return print_expr(*this); }

Expr int_imm(int64_t v, DType dtype) {
  if (!is_int_like(dtype) && ExprErrorTrap::record(std::string("int_imm of dtype ") + dtype_name(dtype))) return Expr();
  KILN_CHECK(is_int_like(dtype)) << "int_imm of dtype " << dtype_name(dtype);
  return make_node(ExprKind::kIntImm, dtype, {}, wrap_to(v, dtype));
}
Expr float_imm(double v, DType dtype) {
  if (!dtype_is_float(dtype) && ExprErrorTrap::record(std::string("float_imm of dtype ") + dtype_name(dtype)))
    return Expr();
  KILN_CHECK(dtype_is_float(dtype)) << "float_imm of dtype " << dtype_name(dtype);
  return make_node(ExprKind::kFloatImm, dtype, {}, 0, round_to(v, dtype));
}
Expr bool_imm(bool v) { return make_node(ExprKind::kIntImm, DType::kBool, {}, v ? 1 : 0); }
Expr var(std::string name, DType dtype) {
  KILN_CHECK(!name.empty()) << "var with an empty name";
  if (!(is_int_like(dtype) || dtype_is_float(dtype)) &&
      ExprErrorTrap::record("var " + name + " of dtype " + dtype_name(dtype)))
    return Expr();
  KILN_CHECK(is_int_like(dtype) || dtype_is_float(dtype)) << "var " << name << " of dtype " << dtype_name(dtype);
  return make_node(ExprKind::kVar, dtype, {}, 0, 0.0, std::move(name));
}
Expr add(Expr a, Expr b) { return build_or_die(ExprKind::kAdd, {std::move(a), std::move(b)}); }
Expr sub(Expr a, Expr b) { return build_or_die(ExprKind::kSub, {std::move(a), std::move(b)}); }
Expr mul(Expr a, Expr b) { return build_or_die(ExprKind::kMul, {std::move(a), std::move(b)}); }
Expr div(Expr a, Expr b) { return build_or_die(ExprKind::kDiv, {std::move(a), std::move(b)}); }
Expr floordiv(Expr a, Expr b) { return build_or_die(ExprKind::kFloorDiv, {std::move(a), std::move(b)}); }
Expr mod(Expr a, Expr b) { return build_or_die(ExprKind::kMod, {std::move(a), std::move(b)}); }
Expr min(Expr a, Expr b) { return build_or_die(ExprKind::kMin, {std::move(a), std::move(b)}); }
Expr max(Expr a, Expr b) { return build_or_die(ExprKind::kMax, {std::move(a), std::move(b)}); }
Expr lt(Expr a, Expr b) { return build_or_die(ExprKind::kLT, {std::move(a), std::move(b)}); }
Expr le(Expr a, Expr b) { return build_or_die(ExprKind::kLE, {std::move(a), std::move(b)}); }
Expr eq(Expr a, Expr b) { return build_or_die(ExprKind::kEQ, {std::move(a), std::move(b)}); }
Expr ne(Expr a, Expr b) { return build_or_die(ExprKind::kNE, {std::move(a), std::move(b)}); }
Expr logical_and(Expr a, Expr b) { return build_or_die(ExprKind::kAnd, {std::move(a), std::move(b)}); }
Expr logical_or(Expr a, Expr b) { return build_or_die(ExprKind::kOr, {std::move(a), std::move(b)}); }
Expr logical_not(Expr a) { return build_or_die(ExprKind::kNot, {std::move(a)}); }
Expr select(Expr cond, Expr t, Expr f) {
  return build_or_die(ExprKind::kSelect, {std::move(cond), std::move(t), std::move(f)});
}
Expr cast(DType dtype, Expr a) { return build_or_die(ExprKind::kCast, {std::move(a)}, dtype); }
Expr load(std::string buffer, int buffer_index, DType dtype, std::vector<Expr> indices) {
  return build_or_die(ExprKind::kLoad, std::move(indices), dtype, std::move(buffer), buffer_index);
}
Expr call(std::string intrinsic, DType dtype, std::vector<Expr> args) {
  return build_or_die(ExprKind::kCall, std::move(args), dtype, std::move(intrinsic));
}

// ---------------------------------------------------------------------------
// Traversals.

Expr rewrite(const Expr& e, const std::function<Expr(const Expr&)>& f) {
  std::unordered_map<const ExprNode*, Expr> memo;
  std::function<Expr(const Expr&)> go = [&](const Expr& x) -> Expr {
    auto it = memo.find(x.get());
    if (it != memo.end()) return it->second;
    std::vector<Expr> args;
    args.reserve(x->args.size());
    bool changed = false;
    for (const Expr& a : x->args) {
      args.push_back(go(a));
      changed = changed || args.back().get() != a.get();
    }
    Expr node = changed ? with_args(x, std::move(args)) : x;
    Expr r = f(node);
    if (!r.defined()) r = node;
    memo.emplace(x.get(), r);
    return r;
  };
  return go(e);
}

Expr substitute(const Expr& e, const std::map<std::string, Expr, std::less<>>& repl) {
  return rewrite(e, [&](const Expr& x) -> Expr {
    if (x.kind() != ExprKind::kVar) return Expr();
    auto it = repl.find(x->name);
    return it == repl.end() ? Expr() : it->second;
  });
}

std::vector<std::string> free_vars(const Expr& e) {
  std::set<std::string> names;
  std::unordered_set<const ExprNode*> seen;
  std::vector<const ExprNode*> stack{e.get()};
  while (!stack.empty()) {
    const ExprNode* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    if (n->kind == ExprKind::kVar) names.insert(n->name);
    for (const Expr& a : n->args) stack.push_back(a.get());
  }
  return {names.begin(), names.end()};
}

// ---------------------------------------------------------------------------
// Evaluation.

namespace {

Result<int64_t> eval(const Expr& e, const Env& env) {
  const ExprNode* n = e.get();
  KILN_CHECK(n != nullptr) << "evaluate of an undefined Expr";
  if (!is_int_like(n->dtype))
    return invalid_argument() << "cannot evaluate non-integer expression " << print_expr(e);
  auto arg = [&](size_t i) { return eval(n->args[i], env); };
  switch (n->kind) {
    case ExprKind::kIntImm: return n->int_value;
    case ExprKind::kVar: {
      auto it = env.find(n->name);
      if (it == env.end()) return invalid_argument() << "unbound variable '" << n->name << "'";
      return wrap_to(it->second, n->dtype);
    }
    case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kFloorDiv:
    case ExprKind::kMod: case ExprKind::kMin: case ExprKind::kMax: case ExprKind::kLT:
    case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE: case ExprKind::kAnd:
    case ExprKind::kOr: {
      KILN_CHECK(n->args.size() >= 2) << "binary node with " << n->args.size() << " operands";
      KILN_ASSIGN_OR_RETURN(int64_t acc, arg(0));
      DType t = n->args[0].dtype();
      for (size_t i = 1; i < n->args.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(int64_t v, arg(i));
        auto r = fold_int(n->kind, acc, v, t);
        if (!r) return invalid_argument() << "division by zero in " << print_expr(e);
        acc = *r;
      }
      return acc;
    }
    case ExprKind::kNot: {
      KILN_ASSIGN_OR_RETURN(int64_t v, arg(0));
      return v == 0 ? 1 : 0;
    }
    case ExprKind::kSelect: {
      KILN_ASSIGN_OR_RETURN(int64_t c, arg(0));
      return c ? arg(1) : arg(2);
    }
    case ExprKind::kCast: {
      if (!is_int_like(n->args[0].dtype()))
        return invalid_argument() << "cannot evaluate cast of a non-integer " << print_expr(e);
      KILN_ASSIGN_OR_RETURN(int64_t v, arg(0));
      return wrap_to(v, n->dtype);
    }
    default:
      return invalid_argument() << "cannot evaluate value-level expression " << print_expr(e);
  }
}

}  // namespace

Result<int64_t> evaluate(const Expr& e, const std::map<std::string, int64_t, std::less<>>& env) {
  return eval(e, env);
}

// ---------------------------------------------------------------------------
// Bounds. Endpoints are 128-bit so that sums and products of 64-bit bounds do
// not overflow; anything outside the i64 range counts as unbounded.

namespace {

using I128 = __int128;
constexpr I128 kInf = static_cast<I128>(1) << 100;
constexpr I128 kI64Max = std::numeric_limits<int64_t>::max();
constexpr I128 kI64Min = std::numeric_limits<int64_t>::min();

struct Range {
  I128 lo = -kInf, hi = kInf;
};

Range full_range() { return Range{}; }
Range point(int64_t v) { return Range{v, v}; }

Range normalize(Range r) {
  if (r.lo > kI64Max || r.hi < kI64Min) return full_range();
  if (r.lo < kI64Min) r.lo = -kInf;
  if (r.hi > kI64Max) r.hi = kInf;
  return r;
}

bool is_inf(I128 v) { return v >= kInf || v <= -kInf; }

I128 mul_end(I128 a, I128 b) {
  if (a == 0 || b == 0) return 0;
  bool neg = (a < 0) != (b < 0);
  if (is_inf(a) || is_inf(b)) return neg ? -kInf : kInf;
  return a * b;
}

I128 floor_div128(I128 a, I128 b) {
  I128 q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// floor(a / b) for b >= 1 (b may be +inf).
I128 div_end(I128 a, I128 b) {
  if (is_inf(a)) return a;
  if (is_inf(b)) return a >= 0 ? 0 : -1;
  return floor_div128(a, b);
}

Range range_add(Range a, Range b) {
  Range r;
  r.lo = (is_inf(a.lo) || is_inf(b.lo)) ? -kInf : a.lo + b.lo;
  r.hi = (is_inf(a.hi) || is_inf(b.hi)) ? kInf : a.hi + b.hi;
  return normalize(r);
}
Range range_neg(Range a) { return Range{is_inf(a.hi) ? -kInf : -a.hi, is_inf(a.lo) ? kInf : -a.lo}; }
Range range_mul(Range a, Range b) {
  I128 c[4] = {mul_end(a.lo, b.lo), mul_end(a.lo, b.hi), mul_end(a.hi, b.lo), mul_end(a.hi, b.hi)};
  return normalize(Range{*std::min_element(c, c + 4), *std::max_element(c, c + 4)});
}
Range range_square(Range a) {
  if (a.lo <= 0 && a.hi >= 0) return normalize(Range{0, std::max(mul_end(a.lo, a.lo), mul_end(a.hi, a.hi))});
  return range_mul(a, a);
}
Range range_floordiv(Range n, Range d) {
  if (d.hi <= -1) return range_floordiv(range_neg(n), range_neg(d));
  if (d.lo < 1) return full_range();
  Range r;
  r.lo = n.lo >= 0 ? div_end(n.lo, d.hi) : div_end(n.lo, d.lo);
  r.hi = n.hi >= 0 ? div_end(n.hi, d.lo) : div_end(n.hi, d.hi);
  return normalize(r);
}
Range range_mod(Range n, Range d) {
  if (d.hi <= -1) return range_neg(range_mod(range_neg(n), range_neg(d)));
  if (d.lo < 1) return full_range();
  if (n.lo >= 0 && n.hi < d.lo) return n;
  if (d.lo == d.hi && !is_inf(n.lo) && !is_inf(n.hi) && floor_div128(n.lo, d.lo) == floor_div128(n.hi, d.lo)) {
    I128 base = floor_div128(n.lo, d.lo) * d.lo;
    return Range{n.lo - base, n.hi - base};
  }
  Range r{0, is_inf(d.hi) ? kInf : d.hi - 1};
  if (n.lo >= 0 && n.hi < r.hi) r.hi = n.hi;
  return r;
}
Range range_union(Range a, Range b) { return Range{std::min(a.lo, b.lo), std::max(a.hi, b.hi)}; }

Range dtype_range(DType t) {
  switch (t) {
    case DType::kBool: return Range{0, 1};
    case DType::kInt8: return Range{-128, 127};
    case DType::kUInt8: return Range{0, 255};
    case DType::kInt16: return Range{-32768, 32767};
    case DType::kUInt16: return Range{0, 65535};
    case DType::kInt32: return Range{std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    case DType::kUInt32: return Range{0, std::numeric_limits<uint32_t>::max()};
    case DType::kInt4: return Range{-8, 7};
    case DType::kUInt4: return Range{0, 15};
    case DType::kUInt64: return Range{0, kInf};
    default: return full_range();
  }
}

Range range_intersect(Range a, Range b) { return Range{std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

void collect_factors(const Expr& e, std::vector<Expr>* out) {
  if (e.kind() == ExprKind::kMul && e.dtype() == DType::kInt64) {
    for (const Expr& a : e->args) collect_factors(a, out);
  } else {
    out->push_back(e);
  }
}

Range range_of(const Expr& e, const SymbolBounds& bounds) {
  const ExprNode* n = e.get();
  if (dtype_is_float(n->dtype)) return full_range();
  auto arg = [&](size_t i) { return range_of(n->args[i], bounds); };
  Range type_range = dtype_range(n->dtype);
  Range r;
  switch (n->kind) {
    case ExprKind::kIntImm: return point(n->int_value);
    case ExprKind::kVar: {
      auto it = bounds.find(n->name);
      if (it != bounds.end()) {
        if (it->second.lo) r.lo = *it->second.lo;
        if (it->second.hi) r.hi = *it->second.hi;
      }
      return range_intersect(r, type_range);
    }
    case ExprKind::kAdd:
      r = arg(0);
      for (size_t i = 1; i < n->args.size(); ++i) r = range_add(r, arg(i));
      break;
    case ExprKind::kSub: r = range_add(arg(0), range_neg(arg(1))); break;
    case ExprKind::kMul: {
      std::vector<Expr> factors;
      collect_factors(e, &factors);
      std::sort(factors.begin(), factors.end(), [](const Expr& a, const Expr& b) { return compare_expr(a, b) < 0; });
      r = point(1);
      for (size_t i = 0; i < factors.size();) {
        Range f = range_of(factors[i], bounds);
        if (i + 1 < factors.size() && factors[i].same_as(factors[i + 1])) {
          r = range_mul(r, range_square(f));
          i += 2;
        } else {
          r = range_mul(r, f);
          i += 1;
        }
      }
      break;
    }
    case ExprKind::kFloorDiv: r = range_floordiv(arg(0), arg(1)); break;
    case ExprKind::kMod: r = range_mod(arg(0), arg(1)); break;
    case ExprKind::kMin:
      r = arg(0);
      for (size_t i = 1; i < n->args.size(); ++i) {
        Range b = arg(i);
        r = Range{std::min(r.lo, b.lo), std::min(r.hi, b.hi)};
      }
      break;
    case ExprKind::kMax:
      r = arg(0);
      for (size_t i = 1; i < n->args.size(); ++i) {
        Range b = arg(i);
        r = Range{std::max(r.lo, b.lo), std::max(r.hi, b.hi)};
      }
      break;
    case ExprKind::kSelect: r = range_union(arg(1), arg(2)); break;
    case ExprKind::kCast:
      if (is_int_like(n->args[0].dtype())) {
        Range a = arg(0);
        if (a.lo >= type_range.lo && a.hi <= type_range.hi) return a;
      }
      return type_range;
    default: return type_range;
  }
  // Arithmetic on narrow integer types wraps; the result is only trusted if it fits.
  if (r.lo < type_range.lo || r.hi > type_range.hi) return type_range;
  return r;
}

Interval to_interval(Range r) {
  Interval iv;
  if (!is_inf(r.lo)) iv.lo = static_cast<int64_t>(r.lo);
  if (!is_inf(r.hi)) iv.hi = static_cast<int64_t>(r.hi);
  return iv;
}

}  // namespace

Interval bound_of(const Expr& e, const SymbolBounds& bounds) { return to_interval(range_of(e, bounds)); }

// ---------------------------------------------------------------------------
// Printer.

namespace {

constexpr int kPrecOr = 1, kPrecAnd = 2, kPrecCmp = 3, kPrecAdd = 4, kPrecMul = 5, kPrecUnary = 6,
              kPrecPrimary = 7;

bool is_minus_one(const Expr& e) {
  return e.kind() == ExprKind::kIntImm && dtype_is_int(e.dtype()) && e->int_value == -1;
}

// A product -1 * x prints as the negation -x.
bool is_negation(const ExprNode* n) {
  return n->kind == ExprKind::kMul && n->args.size() == 2 && is_minus_one(n->args[0]);
}

int precedence(const ExprNode* n) {
  switch (n->kind) {
    case ExprKind::kIntImm: return n->int_value < 0 && n->dtype != DType::kBool ? kPrecUnary : kPrecPrimary;
    case ExprKind::kFloatImm: return std::signbit(n->float_value) ? kPrecUnary : kPrecPrimary;
    case ExprKind::kAdd: case ExprKind::kSub: return kPrecAdd;
    case ExprKind::kMul: return is_negation(n) ? kPrecUnary : kPrecMul;
    case ExprKind::kDiv: case ExprKind::kFloorDiv: case ExprKind::kMod: return kPrecMul;
    case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE: return kPrecCmp;
    case ExprKind::kAnd: return kPrecAnd;
    case ExprKind::kOr: return kPrecOr;
    case ExprKind::kNot: return kPrecUnary;
    default: return kPrecPrimary;
  }
}

bool is_reserved_word(std::string_view s) {
  static const char* const kWords[] = {"floordiv", "mod", "true", "false", "inf", "nan",
                                       "min", "max", "select", "cast", "load"};
  for (const char* w : kWords)
    if (s == w) return true;
  return false;
}

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

void print_name(const std::string& name, std::string& out) {
  bool plain = !name.empty() && is_ident_start(name[0]) && !is_reserved_word(name);
  for (char c : name) plain = plain && is_ident_char(c);
  if (plain) {
    out += name;
    return;
  }
  out += '"';
  for (char c : name) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
}

void print_float(double v, DType t, std::string& out) {
  if (std::isnan(v) || std::isinf(v)) {
    if (std::isinf(v) && v < 0) out += '-';
    out += std::isnan(v) ? "nan" : "inf";
    out += ':';
    out += dtype_name(t);
    return;
  }
  char buf[64];
  std::to_chars_result res = t == DType::kFloat32
                                 ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(v))
                                 : std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  out += s;
  if (t == DType::kFloat32) {
    out += 'f';
  } else if (t == DType::kFloat64) {
    out += 'd';
  } else {
    out += ':';
    out += dtype_name(t);
  }
}

void print(const Expr& e, int min_prec, std::string& out);

void print_args(const std::vector<Expr>& args, size_t from, std::string& out) {
  for (size_t i = from; i < args.size(); ++i) {
    if (i > from) out += ", ";
    print(args[i], 0, out);
  }
}

void print(const Expr& e, int min_prec, std::string& out) {
  const ExprNode* n = e.get();
  if (!n) {
    out += "<undefined>";
    return;
  }
  int p = precedence(n);
  bool paren = p < min_prec;
  if (paren) out += '(';
  auto binary = [&](const char* op, int lhs_prec, int rhs_prec) {
    print(n->args[0], lhs_prec, out);
    for (size_t i = 1; i < n->args.size(); ++i) {
      out += op;
      print(n->args[i], rhs_prec, out);
    }
  };
  switch (n->kind) {
    case ExprKind::kIntImm:
      if (n->dtype == DType::kBool) {
        out += n->int_value ? "true" : "false";
      } else {
        out += std::to_string(n->int_value);
        if (n->dtype != DType::kInt64) {
          out += ':';
          out += dtype_name(n->dtype);
        }
      }
      break;
    case ExprKind::kFloatImm: print_float(n->float_value, n->dtype, out); break;
    case ExprKind::kVar:
      print_name(n->name, out);
      if (n->dtype != DType::kInt64) {
        out += ':';
        out += dtype_name(n->dtype);
      }
      break;
    case ExprKind::kAdd: binary(" + ", kPrecAdd, kPrecAdd + 1); break;
    case ExprKind::kSub: binary(" - ", kPrecAdd, kPrecAdd + 1); break;
    case ExprKind::kMul:
      if (is_negation(n)) {
        out += '-';
        print(n->args[1], kPrecUnary, out);
      } else {
        binary("*", kPrecMul, kPrecMul + 1);
      }
      break;
    case ExprKind::kDiv: binary(" / ", kPrecMul, kPrecMul + 1); break;
    case ExprKind::kFloorDiv: binary(" floordiv ", kPrecMul, kPrecMul + 1); break;
    case ExprKind::kMod: binary(" mod ", kPrecMul, kPrecMul + 1); break;
    case ExprKind::kMin: case ExprKind::kMax: {
      // n-ary nodes print as nested binary calls.
      const char* fn = n->kind == ExprKind::kMin ? "min(" : "max(";
      for (size_t i = 1; i < n->args.size(); ++i) out += fn;
      print(n->args[0], 0, out);
      for (size_t i = 1; i < n->args.size(); ++i) {
        out += ", ";
        print(n->args[i], 0, out);
        out += ')';
      }
      break;
    }
    case ExprKind::kLT: binary(" < ", kPrecCmp + 1, kPrecCmp + 1); break;
    case ExprKind::kLE: binary(" <= ", kPrecCmp + 1, kPrecCmp + 1); break;
    case ExprKind::kEQ: binary(" == ", kPrecCmp + 1, kPrecCmp + 1); break;
    case ExprKind::kNE: binary(" != ", kPrecCmp + 1, kPrecCmp + 1); break;
    case ExprKind::kAnd: binary(" && ", kPrecAnd, kPrecAnd + 1); break;
    case ExprKind::kOr: binary(" || ", kPrecOr, kPrecOr + 1); break;
    case ExprKind::kNot:
      out += '!';
      print(n->args[0], kPrecUnary, out);
      break;
    case ExprKind::kSelect:
      out += "select(";
      print_args(n->args, 0, out);
      out += ')';
      break;
    case ExprKind::kCast:
      out += "cast<";
      out += dtype_name(n->dtype);
      out += ">(";
      print(n->args[0], 0, out);
      out += ')';
      break;
    case ExprKind::kLoad:
      out += "load(";
      print_name(n->name, out);
      out += '#';
      out += std::to_string(n->int_value);
      out += ':';
      out += dtype_name(n->dtype);
      for (const Expr& a : n->args) {
        out += ", ";
        print(a, 0, out);
      }
      out += ')';
      break;
    case ExprKind::kCall:
      out += n->name;
      out += ':';
      out += dtype_name(n->dtype);
      out += '(';
      print_args(n->args, 0, out);
      out += ')';
      break;
  }
  if (paren) out += ')';
}

}  // namespace

std::string print_expr(const Expr& e) {
  std::string out;
  print(e, 0, out);
  return out;
}

// ---------------------------------------------------------------------------
// Parser: recursive descent over the printer's grammar.
//   or      := and ('||' and)*
//   and     := cmp ('&&' cmp)*
//   cmp     := additive (('<' | '<=' | '==' | '!=' | '>' | '>=') additive)*
//   additive:= mul (('+' | '-') mul)*
//   mul     := unary (('*' | '/' | 'floordiv' | 'mod') unary)*
//   unary   := '-' unary | '!' unary | primary   ('-' before a number is a negative literal)
//   primary := number | name [':' dtype] | intrinsic ':' dtype '(' args ')' | min/max/select/cast/load
//              | 'true' | 'false' | ('inf' | 'nan') ':' dtype | '(' or ')'

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Result<Expr> parse() {
    Expr e = parse_or();
    if (e.defined()) {
      skip_ws();
      if (pos_ != s_.size()) e = error("unexpected '" + std::string(1, s_[pos_]) + "'");
    }
    if (!e.defined()) return invalid_argument() << "parse_expr: at position " << err_pos_ << ": " << err_;
    return e;
  }

 private:
  Expr error(const std::string& msg) { return error_at(pos_, msg); }
  Expr error_at(size_t pos, const std::string& msg) {
    if (err_.empty()) {
      err_ = msg;
      err_pos_ = pos;
    }
    return Expr();
  }

  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool consume(std::string_view tok) {
    skip_ws();
    if (s_.substr(pos_, tok.size()) == tok) {
      pos_ += tok.size();
      return true;
    }
    return false;
  }
  // Consumes a whole-word keyword.
  bool consume_word(std::string_view word) {
    skip_ws();
    if (s_.substr(pos_, word.size()) != word) return false;
    size_t end = pos_ + word.size();
    if (end < s_.size() && is_ident_char(s_[end])) return false;
    pos_ = end;
    return true;
  }
  bool expect(std::string_view tok) {
    if (consume(tok)) return true;
    error("expected '" + std::string(tok) + "'");
    return false;
  }

  Expr make(ExprKind k, std::vector<Expr> args, size_t at, DType dtype = DType::kUndefined,
            std::string name = {}, int64_t int_value = 0) {
    std::string msg;
    Expr r = build(k, std::move(args), dtype, std::move(name), int_value, &msg);
    if (!r.defined()) return error_at(at, msg);
    return r;
  }

  Expr parse_or() {
    Expr lhs = parse_and();
    while (lhs.defined()) {
      size_t at = (skip_ws(), pos_);
      if (!consume("||")) break;
      Expr rhs = parse_and();
      if (!rhs.defined()) return Expr();
      lhs = make(ExprKind::kOr, {lhs, rhs}, at);
    }
    return lhs;
  }
  Expr parse_and() {
    Expr lhs = parse_cmp();
    while (lhs.defined()) {
      size_t at = (skip_ws(), pos_);
      if (!consume("&&")) break;
      Expr rhs = parse_cmp();
      if (!rhs.defined()) return Expr();
      lhs = make(ExprKind::kAnd, {lhs, rhs}, at);
    }
    return lhs;
  }
  Expr parse_cmp() {
    Expr lhs = parse_additive();
    while (lhs.defined()) {
      size_t at = (skip_ws(), pos_);
      ExprKind k;
      bool swap = false;
      if (consume("<=")) {
        k = ExprKind::kLE;
      } else if (consume(">=")) {
        k = ExprKind::kLE;
        swap = true;
      } else if (consume("==")) {
        k = ExprKind::kEQ;
      } else if (consume("!=")) {
        k = ExprKind::kNE;
      } else if (consume("<")) {
        k = ExprKind::kLT;
      } else if (consume(">")) {
        k = ExprKind::kLT;
        swap = true;
      } else {
        break;
      }
      Expr rhs = parse_additive();
      if (!rhs.defined()) return Expr();
      lhs = swap ? make(k, {rhs, lhs}, at) : make(k, {lhs, rhs}, at);
    }
    return lhs;
  }
  Expr parse_additive() {
    Expr lhs = parse_mul();
    while (lhs.defined()) {
      size_t at = (skip_ws(), pos_);
      ExprKind k;
      if (consume("+")) {
        k = ExprKind::kAdd;
      } else if (peek() == '-') {
        ++pos_;
        k = ExprKind::kSub;
      } else {
        break;
      }
      Expr rhs = parse_mul();
      if (!rhs.defined()) return Expr();
      lhs = make(k, {lhs, rhs}, at);
    }
    return lhs;
  }
  Expr parse_mul() {
    Expr lhs = parse_unary();
    while (lhs.defined()) {
      size_t at = (skip_ws(), pos_);
      ExprKind k;
      if (consume("*")) {
        k = ExprKind::kMul;
      } else if (consume("/")) {
        k = ExprKind::kDiv;
      } else if (consume_word("floordiv")) {
        k = ExprKind::kFloorDiv;
      } else if (consume_word("mod")) {
        k = ExprKind::kMod;
      } else {
        break;
      }
      Expr rhs = parse_unary();
      if (!rhs.defined()) return Expr();
      lhs = make(k, {lhs, rhs}, at);
    }
    return lhs;
  }
  Expr parse_unary() {
    size_t at = (skip_ws(), pos_);
    if (consume("-")) {
      skip_ws();
      if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) return parse_number(true);
      Expr x = parse_unary();
      if (!x.defined()) return Expr();
      return make(ExprKind::kMul, {Expr(-1), x}, at);
    }
    if (peek() == '!' && s_.substr(pos_, 2) != "!=") {
      ++pos_;
      Expr x = parse_unary();
      if (!x.defined()) return Expr();
      return make(ExprKind::kNot, {x}, at);
    }
    return parse_primary();
  }

  bool parse_dtype(DType* out) {
    skip_ws();
    size_t start = pos_;
    while (pos_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    DType t = dtype_from_name(s_.substr(start, pos_ - start));
    if (t == DType::kUndefined) {
      error_at(start, "unknown dtype '" + std::string(s_.substr(start, pos_ - start)) + "'");
      return false;
    }
    *out = t;
    return true;
  }

  Expr parse_number(bool negative) {
    size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    bool is_float = false;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      is_float = true;
      ++pos_;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        is_float = true;
        pos_ = q;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      }
    }
    std::string_view text = s_.substr(start, pos_ - start);
    DType t = DType::kUndefined;
    if (pos_ < s_.size() && s_[pos_] == 'f' && (pos_ + 1 >= s_.size() || !is_ident_char(s_[pos_ + 1]))) {
      ++pos_;
      t = DType::kFloat32;
    } else if (pos_ < s_.size() && s_[pos_] == 'd' && (pos_ + 1 >= s_.size() || !is_ident_char(s_[pos_ + 1]))) {
      ++pos_;
      t = DType::kFloat64;
    } else if (pos_ < s_.size() && s_[pos_] == ':') {
      ++pos_;
      if (!parse_dtype(&t)) return Expr();
    } else if (pos_ < s_.size() && is_ident_char(s_[pos_])) {
      return error("malformed number");
    }
    if (is_float || dtype_is_float(t)) {
      if (t == DType::kUndefined) return error_at(start, "float literal needs a suffix (f, d or :dtype)");
      if (!dtype_is_float(t)) return error_at(start, "float literal with integer dtype");
      double v = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), v);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size())
        return error_at(start, "malformed float literal");
      return float_imm(negative ? -v : v, t);
    }
    if (t == DType::kUndefined) t = DType::kInt64;
    if (!is_int_like(t)) return error_at(start, "integer literal with dtype " + std::string(dtype_name(t)));
    uint64_t mag = 0;
    for (char c : text) {
      uint64_t d = static_cast<uint64_t>(c - '0');
      if (mag > (std::numeric_limits<uint64_t>::max() - d) / 10) return error_at(start, "integer literal out of range");
      mag = mag * 10 + d;
    }
    if (t != DType::kUInt64 && mag > (negative ? (uint64_t{1} << 63) : static_cast<uint64_t>(kI64Max)))
      return error_at(start, "integer literal out of range");
    int64_t v = static_cast<int64_t>(negative ? 0 - mag : mag);
    return int_imm(v, t);
  }

  bool parse_name(std::string* out) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      ++pos_;
      std::string name;
      while (pos_ < s_.size() && s_[pos_] != '"') {
        if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
        name += s_[pos_++];
      }
      if (pos_ >= s_.size()) {
        error("unterminated quoted name");
        return false;
      }
      ++pos_;
      *out = std::move(name);
      return true;
    }
    if (pos_ >= s_.size() || !is_ident_start(s_[pos_])) {
      error("expected a name");
      return false;
    }
    size_t start = pos_;
    while (pos_ < s_.size() && is_ident_char(s_[pos_])) ++pos_;
    *out = std::string(s_.substr(start, pos_ - start));
    return true;
  }

  bool parse_arg_list(std::vector<Expr>* args) {
    if (consume(")")) return true;
    while (true) {
      Expr a = parse_or();
      if (!a.defined()) return false;
      args->push_back(a);
      if (consume(")")) return true;
      if (!expect(",")) return false;
    }
  }

  Expr parse_primary() {
    skip_ws();
    size_t at = pos_;
    if (pos_ >= s_.size()) return error("unexpected end of expression");
    char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) return parse_number(false);
    if (c == '(') {
      ++pos_;
      Expr e = parse_or();
      if (!e.defined() || !expect(")")) return Expr();
      return e;
    }
    bool quoted = c == '"';
    if (!quoted && !is_ident_start(c)) return error("unexpected '" + std::string(1, c) + "'");
    std::string name;
    if (!parse_name(&name)) return Expr();
    if (!quoted) {
      if (name == "true") return bool_imm(true);
      if (name == "false") return bool_imm(false);
      if (name == "inf" || name == "nan") {
        DType t;
        if (!expect(":") || !parse_dtype(&t)) return Expr();
        if (!dtype_is_float(t)) return error_at(at, name + " needs a float dtype");
        return float_imm(name == "nan" ? std::numeric_limits<double>::quiet_NaN()
                                       : std::numeric_limits<double>::infinity(), t);
      }
      if ((name == "min" || name == "max" || name == "select") && consume("(")) {
        std::vector<Expr> args;
        if (!parse_arg_list(&args)) return Expr();
        if (name == "select") {
          if (args.size() != 3) return error_at(at, "select needs 3 operands");
          return make(ExprKind::kSelect, std::move(args), at);
        }
        if (args.size() != 2) return error_at(at, name + " needs 2 operands");
        return make(name == "min" ? ExprKind::kMin : ExprKind::kMax, std::move(args), at);
      }
      if (name == "cast" && consume("<")) {
        DType t;
        if (!parse_dtype(&t) || !expect(">") || !expect("(")) return Expr();
        Expr x = parse_or();
        if (!x.defined() || !expect(")")) return Expr();
        return make(ExprKind::kCast, {x}, at, t);
      }
      if (name == "load" && consume("(")) {
        std::string buffer;
        if (!parse_name(&buffer) || !expect("#")) return Expr();
        skip_ws();
        size_t num_at = pos_;
        bool neg = consume("-");
        skip_ws();
        size_t digits = pos_;
        while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        int index = 0;
        auto res = std::from_chars(s_.data() + digits, s_.data() + pos_, index);
        if (digits == pos_ || res.ec != std::errc()) return error_at(num_at, "expected a buffer index");
        if (neg) index = -index;
        DType t;
        if (!expect(":") || !parse_dtype(&t)) return Expr();
        std::vector<Expr> indices;
        while (consume(",")) {
          Expr i = parse_or();
          if (!i.defined()) return Expr();
          indices.push_back(i);
        }
        if (!expect(")")) return Expr();
        return make(ExprKind::kLoad, std::move(indices), at, t, buffer, index);
      }
      if (is_reserved_word(name)) return error_at(at, "unexpected keyword '" + name + "'");
    }
    DType t = DType::kInt64;
    if (consume(":") && !parse_dtype(&t)) return Expr();
    if (!quoted && peek() == '(') {
      ++pos_;
      std::vector<Expr> args;
      if (!parse_arg_list(&args)) return Expr();
      return make(ExprKind::kCall, std::move(args), at, t, name);
    }
    if (!(is_int_like(t) || dtype_is_float(t))) return error_at(at, "variable of dtype " + std::string(dtype_name(t)));
    return var(name, t);
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string err_;
  size_t err_pos_ = 0;
};

}  // namespace

Result<Expr> parse_expr(std::string_view text) { return Parser(text).parse(); }

// ---------------------------------------------------------------------------
// Simplifier.
//
// Integer (i64) expressions are converted to a polynomial: a map from
// monomials (sorted lists of atoms, with repetition) to nonzero coefficients,
// plus a constant. Atoms are variables, canonical floordiv/mod/min/max nodes
// and value-level nodes. The polynomial is converted back to an Expr in a
// fixed order, so equal polynomials give identical trees:
//   the first term with a positive coefficient (or the first term), then
//   "+ term" or "- |term|" for each further term in order, then the constant;
//   a term is coef*a1*a2*... (left-leaning), "-a1*..." for coefficient -1.
// Every rule below produces atoms that are fixed points of the same rules, which
// makes simplify() idempotent.

namespace {

struct ExprLess {
  bool operator()(const Expr& a, const Expr& b) const { return compare_expr(a, b) < 0; }
};

using Monomial = std::vector<Expr>;  // sorted by compare_expr, never empty

struct MonomialLess {
  bool operator()(const Monomial& a, const Monomial& b) const {
    size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i)
      if (int c = compare_expr(a[i], b[i])) return c < 0;
    return a.size() < b.size();
  }
};

struct Poly {
  std::map<Monomial, int64_t, MonomialLess> terms;  // coefficients are nonzero
  int64_t constant = 0;

  bool is_const() const { return terms.empty(); }
  bool is_zero() const { return terms.empty() && constant == 0; }
  void add_term(const Monomial& m, int64_t c) {
    if (c == 0) return;
    auto [it, inserted] = terms.emplace(m, c);
    if (!inserted) {
      it->second = wrap_add(it->second, c);
      if (it->second == 0) terms.erase(it);
    }
  }
  // The atom when this polynomial is exactly 1*atom.
  const Expr* single_atom() const {
    if (constant != 0 || terms.size() != 1) return nullptr;
    const auto& [m, c] = *terms.begin();
    return (c == 1 && m.size() == 1) ? &m[0] : nullptr;
  }
};

bool poly_equal(const Poly& a, const Poly& b) {
  if (a.constant != b.constant || a.terms.size() != b.terms.size()) return false;
  for (auto ia = a.terms.begin(), ib = b.terms.begin(); ia != a.terms.end(); ++ia, ++ib) {
    if (ia->second != ib->second || ia->first.size() != ib->first.size()) return false;
    for (size_t i = 0; i < ia->first.size(); ++i)
      if (!ia->first[i].same_as(ib->first[i])) return false;
  }
  return true;
}

Poly poly_const(int64_t c) {
  Poly p;
  p.constant = c;
  return p;
}
Poly poly_atom(const Expr& a) {
  Poly p;
  p.terms.emplace(Monomial{a}, 1);
  return p;
}
Poly poly_add(Poly a, const Poly& b) {
  for (const auto& [m, c] : b.terms) a.add_term(m, c);
  a.constant = wrap_add(a.constant, b.constant);
  return a;
}
Poly poly_scale(const Poly& a, int64_t k) {
  Poly r;
  if (k == 0) return r;
  for (const auto& [m, c] : a.terms) r.add_term(m, wrap_mul(c, k));
  r.constant = wrap_mul(a.constant, k);
  return r;
}
Poly poly_sub(const Poly& a, const Poly& b) { return poly_add(a, poly_scale(b, -1)); }
Monomial mono_mul(const Monomial& a, const Monomial& b) {
  Monomial m;
  m.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(m), ExprLess());
  return m;
}
Poly poly_mul(const Poly& a, const Poly& b) {
  Poly r;
  for (const auto& [ma, ca] : a.terms) {
    for (const auto& [mb, cb] : b.terms) r.add_term(mono_mul(ma, mb), wrap_mul(ca, cb));
    r.add_term(ma, wrap_mul(ca, b.constant));
  }
  for (const auto& [mb, cb] : b.terms) r.add_term(mb, wrap_mul(a.constant, cb));
  r.constant = wrap_mul(a.constant, b.constant);
  return r;
}

Expr term_expr(int64_t c, const Monomial& m) {
  Expr t = c == 1 ? m[0] : make_node(ExprKind::kMul, DType::kInt64, {int_imm(c), m[0]});
  for (size_t i = 1; i < m.size(); ++i) t = make_node(ExprKind::kMul, DType::kInt64, {t, m[i]});
  return t;
}

Expr to_expr(const Poly& p) {
  // The first term with a positive coefficient leads (b - a*c rather than -a*c + b).
  auto lead = p.terms.begin();
  while (lead != p.terms.end() && lead->second < 0) ++lead;
  if (lead == p.terms.end()) lead = p.terms.begin();
  Expr acc;
  if (lead != p.terms.end()) acc = term_expr(lead->second, lead->first);
  for (auto it = p.terms.begin(); it != p.terms.end(); ++it) {
    if (it == lead) continue;
    const auto& [m, c] = *it;
    if (c > 0) {
      acc = make_node(ExprKind::kAdd, DType::kInt64, {acc, term_expr(c, m)});
    } else {
      acc = make_node(ExprKind::kSub, DType::kInt64, {acc, term_expr(wrap_neg(c), m)});
    }
  }
  if (!acc.defined()) return int_imm(p.constant);
  if (p.constant > 0) return make_node(ExprKind::kAdd, DType::kInt64, {acc, int_imm(p.constant)});
  if (p.constant < 0) return make_node(ExprKind::kSub, DType::kInt64, {acc, int_imm(wrap_neg(p.constant))});
  return acc;
}

uint64_t abs_u(int64_t v) { return v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

// gcd of k and every coefficient of p (the constant is not included).
int64_t poly_gcd(const Poly& p, int64_t k) {
  uint64_t g = abs_u(k);
  for (const auto& [m, c] : p.terms) g = std::gcd(g, abs_u(c));
  return static_cast<int64_t>(g);
}

// Exact division of every coefficient by g > 0; the constant becomes 0.
Poly poly_div_exact(const Poly& p, int64_t g) {
  Poly r;
  for (const auto& [m, c] : p.terms) r.terms.emplace(m, c / g);
  return r;
}

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a - b for multisets of atoms; nullopt when b is not contained in a.
std::optional<Monomial> mono_div(const Monomial& a, const Monomial& b) {
  Monomial r;
  size_t j = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (j < b.size() && a[i].same_as(b[j])) {
      ++j;
    } else {
      r.push_back(a[i]);
    }
  }
  if (j != b.size()) return std::nullopt;
  return r;
}

class Simplifier {
 public:
  explicit Simplifier(const SymbolBounds& bounds) : bounds_(bounds) {}

  Expr run(const Expr& e) {
    auto it = memo_.find(e.get());
    if (it != memo_.end()) return it->second.second;
    Expr r = e.dtype() == DType::kInt64 ? to_expr(to_poly(e)) : value_level(e);
    memo_.emplace(e.get(), std::make_pair(e, r));
    return r;
  }

 private:
  Range range_of_poly(const Poly& p) {
    Range r = point(p.constant);
    for (const auto& [m, c] : p.terms) {
      Range t = point(c);
      for (size_t i = 0; i < m.size();) {
        Range a = range_of(m[i], bounds_);
        if (i + 1 < m.size() && m[i].same_as(m[i + 1])) {
          t = range_mul(t, range_square(a));
          i += 2;
        } else {
          t = range_mul(t, a);
          i += 1;
        }
      }
      r = range_add(r, t);
    }
    return r;
  }

  Poly to_poly(const Expr& e) {
    auto it = poly_memo_.find(e.get());
    if (it != poly_memo_.end()) return it->second.second;
    Poly p = compute_poly(e);
    poly_memo_.emplace(e.get(), std::make_pair(e, p));
    return p;
  }

  Poly compute_poly(const Expr& e) {
    const ExprNode* n = e.get();
    switch (n->kind) {
      case ExprKind::kIntImm: return poly_const(n->int_value);
      case ExprKind::kVar: return poly_atom(e);
      case ExprKind::kAdd: {
        Poly p = to_poly(n->args[0]);
        for (size_t i = 1; i < n->args.size(); ++i) p = poly_add(std::move(p), to_poly(n->args[i]));
        return fold_div_mod(std::move(p));
      }
      case ExprKind::kSub: return fold_div_mod(poly_sub(to_poly(n->args[0]), to_poly(n->args[1])));
      case ExprKind::kMul: {
        Poly p = to_poly(n->args[0]);
        for (size_t i = 1; i < n->args.size(); ++i) p = poly_mul(p, to_poly(n->args[i]));
        return p;
      }
      case ExprKind::kFloorDiv: return floordiv_poly(to_poly(n->args[0]), to_poly(n->args[1]));
      case ExprKind::kMod: return mod_poly(to_poly(n->args[0]), to_poly(n->args[1]));
      case ExprKind::kMin: case ExprKind::kMax: {
        std::vector<Poly> ops;
        for (const Expr& a : n->args) ops.push_back(to_poly(a));
        return minmax_poly(n->kind, std::move(ops));
      }
      default: {
        Expr v = value_level(e);
        if (v.kind() == ExprKind::kIntImm) return poly_const(v->int_value);
        if (v.dtype() == DType::kInt64 && v.kind() != n->kind) return to_poly(v);
        return poly_atom(v);
      }
    }
  }

  // c*k*(x floordiv k) + c*(y mod k) = c*x when x - y is a multiple of k
  // (then y mod k = x mod k): a row-major index over (x floordiv k, x mod k),
  // as a fused loop gives, is x again. x and y may differ in terms that the
  // two atoms normalized differently (mod drops multiples of k).
  Poly fold_div_mod(Poly p) {
    while (true) {
      // One pair (mod term, floordiv term) that folds, found before anything is erased.
      std::optional<Monomial> mod_key, div_key;
      Poly x;
      int64_t c = 0;
      for (const auto& [mm, mc] : p.terms) {
        if (mod_key) break;
        if (mm.size() != 1 || mm[0].kind() != ExprKind::kMod) continue;
        auto k = mm[0]->args[1].as_const();
        int64_t ck = 0;
        if (!k || *k < 2 || __builtin_mul_overflow(mc, *k, &ck)) continue;
        for (const auto& [dm, dc] : p.terms) {
          if (dm.size() != 1 || dm[0].kind() != ExprKind::kFloorDiv || dc != ck) continue;
          if (dm[0]->args[1].as_const() != k) continue;
          Poly xd = to_poly(dm[0]->args[0]);
          Poly diff = poly_sub(xd, to_poly(mm[0]->args[0]));
          bool multiple = diff.constant % *k == 0;
          for (const auto& [m, coef] : diff.terms) multiple = multiple && coef % *k == 0;
          if (!multiple) continue;
          mod_key = mm;
          div_key = dm;
          x = std::move(xd);
          c = mc;
          break;
        }
      }
      if (!mod_key) return p;
      p.terms.erase(*mod_key);
      p.terms.erase(*div_key);
      p = poly_add(std::move(p), poly_scale(x, c));
    }
  }

  // floor(P / D).
  Poly floordiv_poly(const Poly& p, const Poly& d) {
    if (d.is_const()) {
      int64_t k = d.constant;
      if (k > 0) return floordiv_const(p, k);
      if (k < 0 && k != std::numeric_limits<int64_t>::min()) return floordiv_const(poly_scale(p, -1), -k);
      return poly_atom(make_node(ExprKind::kFloorDiv, DType::kInt64, {to_expr(p), to_expr(d)}));
    }
    // The divisor is not a constant: only exact parts are taken out (valid for any d != 0).
    if (p.is_zero()) return p;
    auto [quotient, rest] = split_by(p, d);
    if (rest.is_zero()) return quotient;
    Range rd = range_of_poly(d), rr = range_of_poly(rest);
    if (rd.lo >= 1 && rr.lo >= 0 && rr.hi < rd.lo) return quotient;
    if (poly_equal(rest, d)) return poly_add(quotient, poly_const(1));
    return poly_add(quotient, poly_atom(make_node(ExprKind::kFloorDiv, DType::kInt64, {to_expr(rest), to_expr(d)})));
  }

  // P mod D (sign of the divisor).
  Poly mod_poly(const Poly& p, const Poly& d) {
    if (d.is_const()) {
      int64_t k = d.constant;
      if (k > 0) return mod_const(p, k);
      if (k < 0 && k != std::numeric_limits<int64_t>::min())
        return poly_scale(mod_const(poly_scale(p, -1), -k), -1);
      return poly_atom(make_node(ExprKind::kMod, DType::kInt64, {to_expr(p), to_expr(d)}));
    }
    if (p.is_zero()) return p;
    Poly rest = split_by(p, d).second;
    if (rest.is_zero() || poly_equal(rest, d)) return Poly();
    Range rd = range_of_poly(d), rr = range_of_poly(rest);
    if (rd.lo >= 1 && rr.lo >= 0 && rr.hi < rd.lo) return rest;
    return poly_atom(make_node(ExprKind::kMod, DType::kInt64, {to_expr(rest), to_expr(d)}));
  }

  // Splits P into quotient * D + rest where D is a single term c*M: a term is
  // divisible when its coefficient is a multiple of c and its monomial contains M.
  std::pair<Poly, Poly> split_by(const Poly& p, const Poly& d) {
    Poly quotient, rest;
    rest.constant = p.constant;
    if (d.terms.size() != 1 || d.constant != 0) {
      rest = p;
      return {quotient, rest};
    }
    const auto& [dm, dc] = *d.terms.begin();
    for (const auto& [m, c] : p.terms) {
      std::optional<Monomial> q;
      if (c % dc == 0) q = mono_div(m, dm);
      if (!q) {
        rest.add_term(m, c);
        continue;
      }
      int64_t qc = dc == -1 ? wrap_neg(c) : c / dc;
      if (q->empty()) {
        quotient.constant = wrap_add(quotient.constant, qc);
      } else {
        quotient.add_term(*q, qc);
      }
    }
    return {quotient, rest};
  }

  // floor(P / k) for a constant k >= 1.
  Poly floordiv_const(const Poly& p, int64_t k) {
    if (k == 1) return p;
    Poly quotient, rest;
    for (const auto& [m, c] : p.terms) {
      if (c % k == 0) {
        quotient.add_term(m, c / k);
      } else {
        rest.add_term(m, c);
      }
    }
    int64_t c = p.constant;
    if (rest.is_const()) {
      quotient.constant = floor_div(c, k);
      return quotient;
    }
    // (g*y + c) floordiv (g*m) = (y + c floordiv g) floordiv m.
    int64_t g = poly_gcd(rest, k);
    if (g > 1) {
      rest = poly_div_exact(rest, g);
      c = floor_div(c, g);
      k /= g;
    }
    // c = k*q + r with r in (-k, 0]: (h - 1) floordiv 2 stays as written.
    int64_t q = floor_div(c, k) + (floor_mod(c, k) != 0 ? 1 : 0);
    rest.constant = wrap_sub(c, wrap_mul(k, q));
    quotient.constant = q;
    Range r = range_of_poly(rest);
    if (!is_inf(r.lo) && !is_inf(r.hi)) {
      I128 lo = floor_div128(r.lo, k), hi = floor_div128(r.hi, k);
      if (lo == hi) return poly_add(quotient, poly_const(static_cast<int64_t>(lo)));
    }
    // (x floordiv a + r) floordiv k = (x + a*r) floordiv (a*k) for a, k > 0.
    Poly var_part = rest;
    var_part.constant = 0;
    if (const Expr* atom = var_part.single_atom()) {
      const ExprNode* inner = atom->get();
      if (inner->kind == ExprKind::kFloorDiv && inner->args[1].is_const() && inner->args[1]->int_value > 0) {
        int64_t a = inner->args[1]->int_value;
        auto ak = checked_mul(a, k);
        auto ar = checked_mul(a, rest.constant);
        if (ak && ar) {
          Poly x = to_poly(inner->args[0]);
          x.constant = wrap_add(x.constant, *ar);
          return poly_add(quotient, floordiv_const(x, *ak));
        }
      }
    }
    return poly_add(quotient, poly_atom(make_node(ExprKind::kFloorDiv, DType::kInt64, {to_expr(rest), int_imm(k)})));
  }

  // P mod k for a constant k >= 1.
  Poly mod_const(const Poly& p, int64_t k) {
    if (k == 1) return Poly();
    Poly rest;
    bool replaced = false;
    for (const auto& [m, c] : p.terms) {
      if (c % k == 0) continue;
      // (x mod a) mod k = x mod k when k divides a: c*(x mod a) becomes c*x.
      if (m.size() == 1 && m[0].kind() == ExprKind::kMod && m[0]->args[1].is_const() &&
          m[0]->args[1]->int_value > 0 && m[0]->args[1]->int_value % k == 0) {
        rest = poly_add(std::move(rest), poly_scale(to_poly(m[0]->args[0]), c));
        replaced = true;
        continue;
      }
      rest.add_term(m, c);
    }
    rest.constant = wrap_add(rest.constant, p.constant);
    if (replaced) return mod_const(rest, k);
    if (rest.is_const()) return poly_const(floor_mod(rest.constant, k));
    // (g*y + c) mod (g*m) = g*((y + c floordiv g) mod m) + c mod g.
    int64_t g = poly_gcd(rest, k);
    if (g > 1) {
      int64_t c = rest.constant;
      rest.constant = 0;
      Poly inner = poly_div_exact(rest, g);
      inner.constant = floor_div(c, g);
      return poly_add(poly_scale(mod_const(inner, k / g), g), poly_const(floor_mod(c, g)));
    }
    rest.constant = floor_mod(rest.constant, k);
    Range r = range_of_poly(rest);
    if (!is_inf(r.lo) && !is_inf(r.hi)) {
      I128 lo = floor_div128(r.lo, k), hi = floor_div128(r.hi, k);
      if (lo == hi) return poly_sub(rest, poly_const(static_cast<int64_t>(lo * k)));
    }
    return poly_atom(make_node(ExprKind::kMod, DType::kInt64, {to_expr(rest), int_imm(k)}));
  }

  // Adds the operands of a min (max) over `p` to ops, distributing nested mins
  // (maxes): min(a, b) + t contributes a + t and
  // b + t. Only where p holds one such atom: distributing t over several
  // (min(d0, 300) + ... + min(d9, 300), a detector's concatenated per-class
  // top-k counts) would make 2^k operands.
  void flatten_minmax(ExprKind kind, const Poly& p, std::vector<Poly>* ops) {
    int atoms = 0;
    for (const auto& [m, c] : p.terms) atoms += m.size() == 1 && m[0].kind() == kind;
    if (atoms != 1) {
      ops->push_back(p);
      return;
    }
    for (const auto& [m, c] : p.terms) {
      if (c == 1 && m.size() == 1 && m[0].kind() == kind) {
        Poly t = p;
        t.terms.erase(m);
        for (const Expr& a : m[0]->args) flatten_minmax(kind, poly_add(to_poly(a), t), ops);
        return;
      }
    }
    ops->push_back(p);
  }

  // The operands of a chain of binary min (or max) nodes.
  static void collect_chain(ExprKind kind, const Expr& e, std::vector<Expr>* out) {
    if (e.kind() != kind) {
      out->push_back(e);
      return;
    }
    for (const Expr& a : e->args) collect_chain(kind, a, out);
  }

  Poly minmax_poly(ExprKind kind, std::vector<Poly> in) {
    const bool is_min = kind == ExprKind::kMin;
    std::vector<Poly> ops;
    for (const Poly& p : in) flatten_minmax(kind, p, &ops);
    // Drop duplicates and operands that bounds prove never to be chosen.
    std::vector<bool> alive(ops.size(), true);
    for (size_t i = 0; i < ops.size(); ++i) {
      for (size_t j = 0; j < ops.size() && alive[i]; ++j) {
        if (i == j || !alive[j]) continue;
        Range diff = range_of_poly(poly_sub(ops[i], ops[j]));
        // ops[i] is dropped when ops[j] is always at least as good (ties keep the first).
        bool j_better = is_min ? diff.lo >= 0 : diff.hi <= 0;
        bool tie = diff.lo == 0 && diff.hi == 0;
        if (j_better && (!tie || j < i)) alive[i] = false;
      }
    }
    // Absorption: in max(x, ...), an operand min(a, b, ...) with an argument
    // that x bounds from above is never chosen (min(a, ...) <= a <= x), and
    // dually for min over max. Broadcasting seq against min(seq, 1024) gives
    // max(seq, min(seq, 1024)) = seq.
    // An operand may carry other terms t: max(a, ...) + t >= a + t.
    const ExprKind opposite = is_min ? ExprKind::kMax : ExprKind::kMin;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!alive[i]) continue;
      const Expr* atom = nullptr;
      for (const auto& [m, c] : ops[i].terms)
        if (c == 1 && m.size() == 1 && m[0].kind() == opposite) {
          atom = &m[0];
          break;
        }
      if (!atom) continue;
      Poly rest = poly_sub(ops[i], poly_atom(*atom));
      for (size_t j = 0; j < ops.size() && alive[i]; ++j) {
        if (i == j || !alive[j]) continue;
        std::vector<Expr> leaves;
        collect_chain(opposite, *atom, &leaves);
        for (const Expr& a : leaves) {
          Range diff = range_of_poly(poly_sub(poly_add(to_poly(a), rest), ops[j]));
          if (is_min ? diff.lo >= 0 : diff.hi <= 0) {
            alive[i] = false;
            break;
          }
        }
      }
    }
    std::vector<Poly> kept;
    for (size_t i = 0; i < ops.size(); ++i)
      if (alive[i]) kept.push_back(std::move(ops[i]));
    if (kept.size() == 1) return kept[0];
    // Take out the terms all operands share: min(a + 1, b + 1) = min(a, b) + 1.
    Poly common;
    for (const auto& [m, c] : kept[0].terms) {
      bool shared = true;
      for (size_t i = 1; i < kept.size() && shared; ++i) {
        auto it = kept[i].terms.find(m);
        shared = it != kept[i].terms.end() && it->second == c;
      }
      if (shared) common.terms.emplace(m, c);
    }
    bool shared_constant = true;
    for (const Poly& p : kept) shared_constant = shared_constant && p.constant == kept[0].constant;
    if (shared_constant) common.constant = kept[0].constant;
    std::vector<Expr> args;
    for (const Poly& p : kept) args.push_back(to_expr(poly_sub(p, common)));
    std::sort(args.begin(), args.end(), ExprLess());
    Expr chain = args[0];
    for (size_t i = 1; i < args.size(); ++i) chain = make_node(kind, DType::kInt64, {chain, args[i]});
    return poly_add(common, poly_atom(chain));
  }

  // Decides an integer comparison from the bounds of the difference of its operands.
  Expr decide_compare(ExprKind k, const Expr& a, const Expr& b) {
    if (a.dtype() != DType::kInt64) return Expr();
    Range d = range_of_poly(poly_sub(to_poly(a), to_poly(b)));
    switch (k) {
      case ExprKind::kLT:
        if (d.hi < 0) return bool_imm(true);
        if (d.lo >= 0) return bool_imm(false);
        break;
      case ExprKind::kLE:
        if (d.hi <= 0) return bool_imm(true);
        if (d.lo > 0) return bool_imm(false);
        break;
      case ExprKind::kEQ:
        if (d.lo == 0 && d.hi == 0) return bool_imm(true);
        if (d.lo > 0 || d.hi < 0) return bool_imm(false);
        break;
      case ExprKind::kNE:
        if (d.lo == 0 && d.hi == 0) return bool_imm(false);
        if (d.lo > 0 || d.hi < 0) return bool_imm(true);
        break;
      default: break;
    }
    return Expr();
  }

  // Value-level nodes (and integer nodes of other dtypes): operands simplified,
  // constants folded, no reassociation.
  Expr value_level(const Expr& e) {
    const ExprNode* n = e.get();
    if (n->args.empty()) return e;
    std::vector<Expr> args;
    args.reserve(n->args.size());
    for (const Expr& a : n->args) args.push_back(run(a));
    auto is_true = [](const Expr& x) { return x.kind() == ExprKind::kIntImm && x->int_value != 0; };
    auto is_false = [](const Expr& x) { return x.kind() == ExprKind::kIntImm && x->int_value == 0; };
    switch (n->kind) {
      case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE: {
        Expr d = decide_compare(n->kind, args[0], args[1]);
        if (d.defined()) return d;
        if (!dtype_is_float(args[0].dtype()) && args[0].same_as(args[1]))
          return bool_imm(n->kind == ExprKind::kLE || n->kind == ExprKind::kEQ);
        break;
      }
      case ExprKind::kAnd:
        if (is_false(args[0]) || is_false(args[1])) return bool_imm(false);
        if (is_true(args[0])) return args[1];
        if (is_true(args[1])) return args[0];
        if (args[0].same_as(args[1])) return args[0];
        break;
      case ExprKind::kOr:
        if (is_true(args[0]) || is_true(args[1])) return bool_imm(true);
        if (is_false(args[0])) return args[1];
        if (is_false(args[1])) return args[0];
        if (args[0].same_as(args[1])) return args[0];
        break;
      case ExprKind::kNot:
        if (args[0].kind() == ExprKind::kNot) return args[0]->args[0];
        break;
      case ExprKind::kSelect:
        if (args[1].same_as(args[2])) return args[1];
        break;
      case ExprKind::kCall: {
        Expr folded = fold_call(n->name, n->dtype, args);
        if (folded.defined()) return folded;
        break;
      }
      default: break;
    }
    // Rebuilding (which folds constants) is needed when an operand changed or
    // is a constant (a node built by hand may not have been folded).
    bool rebuild = false;
    for (size_t i = 0; i < args.size(); ++i) {
      rebuild = rebuild || args[i].get() != n->args[i].get() || args[i].kind() == ExprKind::kIntImm ||
                args[i].kind() == ExprKind::kFloatImm;
    }
    return rebuild ? with_args(e, std::move(args)) : e;
  }

  static Expr fold_call(const std::string& name, DType t, const std::vector<Expr>& args) {
    bool all_float = !args.empty(), all_int = !args.empty();
    for (const Expr& a : args) {
      all_float = all_float && a.kind() == ExprKind::kFloatImm;
      all_int = all_int && a.kind() == ExprKind::kIntImm;
    }
    if (all_float && args.size() == 1) {
      double x = args[0]->float_value;
      if (t == DType::kBool) {
        if (name == "isnan") return bool_imm(std::isnan(x));
        if (name == "isinf") return bool_imm(std::isinf(x));
        return Expr();
      }
      if (!dtype_is_float(t)) return Expr();
      double r;
      if (name == "exp") r = std::exp(x);
      else if (name == "log") r = std::log(x);
      else if (name == "tanh") r = std::tanh(x);
      else if (name == "erf") r = std::erf(x);
      else if (name == "sigmoid") r = 1.0 / (1.0 + std::exp(-x));
      else if (name == "sqrt") r = std::sqrt(x);
      else if (name == "abs") r = std::fabs(x);
      else if (name == "neg") r = -x;
      else if (name == "floor") r = std::floor(x);
      else if (name == "ceil") r = std::ceil(x);
      else if (name == "round") r = std::nearbyint(x);
      else if (name == "sin") r = std::sin(x);
      else if (name == "cos") r = std::cos(x);
      else return Expr();
      return float_imm(r, t);
    }
    if (all_float && args.size() == 2 && name == "pow" && dtype_is_float(t))
      return float_imm(std::pow(args[0]->float_value, args[1]->float_value), t);
    if (all_int && dtype_is_int(t)) {
      int64_t a = args[0]->int_value;
      if (args.size() == 1) {
        if (name == "abs") return int_imm(a < 0 ? wrap_neg(a) : a, t);
        if (name == "neg") return int_imm(wrap_neg(a), t);
        return Expr();
      }
      if (args.size() != 2) return Expr();
      int64_t b = args[1]->int_value;
      if (name == "bitand") return int_imm(a & b, t);
      if (name == "bitor") return int_imm(a | b, t);
      if (name == "bitxor") return int_imm(a ^ b, t);
      int bits = static_cast<int>(dtype_size(t) * 8);
      if ((name == "shl" || name == "shr") && (b < 0 || b >= bits)) return Expr();
      if (name == "shl") return int_imm(static_cast<int64_t>(static_cast<uint64_t>(a) << b), t);
      if (name == "shr") {
        if (dtype_is_signed(t)) return int_imm(a >> b, t);
        uint64_t ua = static_cast<uint64_t>(a);
        if (bits < 64) ua &= (uint64_t{1} << bits) - 1;
        return int_imm(static_cast<int64_t>(ua >> b), t);
      }
    }
    return Expr();
  }

  const SymbolBounds& bounds_;
  // Keyed by node; the pair keeps the key alive so its address is not reused.
  std::unordered_map<const ExprNode*, std::pair<Expr, Expr>> memo_;
  std::unordered_map<const ExprNode*, std::pair<Expr, Poly>> poly_memo_;
};

}  // namespace

Expr simplify(const Expr& e, const SymbolBounds& bounds) {
  if (!e.defined() && ExprErrorTrap::record("simplify of an undefined Expr")) return e;
  KILN_CHECK(e.defined()) << "simplify of an undefined Expr";
  return Simplifier(bounds).run(e);
}

bool prove_equal(const Expr& a, const Expr& b, const SymbolBounds& bounds) {
  if (a.same_as(b)) return true;
  Expr d = simplify(sub(a, b), bounds);
  return d.is_const() && *d.as_const() == 0;
}

}  // namespace kiln
