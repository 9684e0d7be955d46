// Expr: the one expression type of Kiln. Symbolic dimensions (shape/) and
// loop-IR expressions (tir/) are both Exprs and share one simplifier.
//
// Integer expressions (dtype i64) over symbols are kept in a canonical form by
// simplify(): a sum of terms, each an integer coefficient times a product of
// atoms, plus a constant. Atoms are variables and the non-polynomial nodes
// floordiv, mod, min, max (themselves with canonical operands), and any
// value-level node (a load, a cast, ...). Equal integer expressions therefore
// print equal: Reshape(x:[a,b], [-1]) gives [a*b]; Concat([m],[n]) gives
// [m + n]; a stride-2 convolution on [h] gives [(h - 1) floordiv 2 + 1].
//
// Value-level kinds (floats, comparisons, select, cast, load, math calls) are
// only used inside loop IR; simplify() folds constants in them but never
// reassociates floating-point arithmetic.
//
// Exprs are immutable and cheap to copy (a shared pointer). Structural
// equality is deep (==), hashing is structural (hash()).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "support/dtype.h"
#include "support/status.h"

namespace kiln {

enum class ExprKind : uint8_t {
  kIntImm,    // int_value, dtype any integer type or bool
  kFloatImm,  // float_value, dtype f32/f64
  kVar,       // name; a symbol (shape dim) or a loop variable
  kAdd,       // args[0] + args[1] (simplify() may build n-ary sums: args.size() >= 2)
  kSub,       // args[0] - args[1]
  kMul,       // args[0] * args[1] (n-ary after simplify())
  kDiv,       // true division, floats only
  kFloorDiv,  // floor(args[0] / args[1]), integers
  kMod,       // args[0] - floordiv(args[0], args[1]) * args[1] (sign of divisor), integers;
              // for floats: fmod (sign of dividend), as ONNX Mod(fmod=1)
  kMin,
  kMax,
  kLT,  // comparisons: dtype bool
  kLE,
  kEQ,
  kNE,
  kAnd,  // logical, bool operands
  kOr,
  kNot,
  kSelect,  // args[0] ? args[1] : args[2]
  kCast,    // convert args[0] to dtype
  kLoad,    // name = buffer name, int_value = buffer index in the kernel; args = indices
  kCall,    // name = intrinsic (see kIntrinsics below); args
};

// Math intrinsics a kCall may name. Code generation expands the transcendental
// ones (exp, log, tanh, erf, sigmoid) into polynomial approximations.
// exp log tanh erf sigmoid sqrt abs neg floor ceil round pow sin cos
// isnan isinf bitand bitor bitxor shl shr  (ints)
// atan asin acos
// cast_nosat: its argument converted to the call's dtype, a float8 type,
// without saturation (ONNX Cast saturate=0: overflow gives NaN or infinity).
bool is_known_intrinsic(std::string_view name);

struct ExprNode;

class Expr {
 public:
  Expr() = default;
  // Integer constant (i64); implicit so dims read naturally: shape = {1, n, 3}.
  Expr(int64_t v);  // NOLINT
  Expr(int v) : Expr(static_cast<int64_t>(v)) {}  // NOLINT
  explicit Expr(std::shared_ptr<const ExprNode> n) : n_(std::move(n)) {}

  bool defined() const { return n_ != nullptr; }
  const ExprNode* get() const { return n_.get(); }
  const ExprNode* operator->() const { return n_.get(); }
  ExprKind kind() const;
  DType dtype() const;

  bool is_const() const;                  // an integer constant
  std::optional<int64_t> as_const() const;
  bool is_var() const;

  // Deep structural equality and hash.
  bool same_as(const Expr& o) const;
  size_t hash() const;

  std::string to_string() const;  // the printer's text, see print_expr

 private:
  std::shared_ptr<const ExprNode> n_;
};

struct ExprNode {
  ExprKind kind;
  DType dtype = DType::kInt64;
  int64_t int_value = 0;
  double float_value = 0.0;
  std::string name;
  std::vector<Expr> args;
};

// While an ExprErrorTrap lives on a thread, building an ill-typed expression
// there (operands of dtypes an operation does not take, an undefined operand,
// an immediate or variable of a dtype it cannot hold) records the first such
// error in the innermost trap and yields an undefined Expr instead of
// aborting; dtype() of an undefined Expr is then kUndefined and simplify of
// it undefined, so the error propagates to the end of the computation. The
// driver lowers every op under a trap: an op lowered for dtypes its lowering
// does not handle becomes an error naming the node. Without a trap these are
// broken invariants of Kiln's own code (KILN_CHECK).
class ExprErrorTrap {
 public:
  ExprErrorTrap();
  ~ExprErrorTrap();
  ExprErrorTrap(const ExprErrorTrap&) = delete;
  ExprErrorTrap& operator=(const ExprErrorTrap&) = delete;
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  // Records `message` in this thread's innermost trap (if it has no error
  // yet); false when no trap is active on this thread.
  static bool record(const std::string& message);

 private:
  ExprErrorTrap* outer_;
  std::string error_;
};

// Constructors. They check operand dtypes (KILN_CHECK, or the thread's ExprErrorTrap) and fold trivially
// constant operands, but do not canonicalize; call simplify() for that.
Expr int_imm(int64_t v, DType dtype = DType::kInt64);
Expr float_imm(double v, DType dtype = DType::kFloat32);
Expr bool_imm(bool v);
Expr var(std::string name, DType dtype = DType::kInt64);
Expr add(Expr a, Expr b);
Expr sub(Expr a, Expr b);
Expr mul(Expr a, Expr b);
Expr div(Expr a, Expr b);  // floats only
Expr floordiv(Expr a, Expr b);
Expr mod(Expr a, Expr b);
Expr min(Expr a, Expr b);
Expr max(Expr a, Expr b);
Expr lt(Expr a, Expr b);
Expr le(Expr a, Expr b);
Expr eq(Expr a, Expr b);
Expr ne(Expr a, Expr b);
Expr logical_and(Expr a, Expr b);
Expr logical_or(Expr a, Expr b);
Expr logical_not(Expr a);
Expr select(Expr cond, Expr t, Expr f);
Expr cast(DType dtype, Expr a);
Expr load(std::string buffer, int buffer_index, DType dtype, std::vector<Expr> indices);
Expr call(std::string intrinsic, DType dtype, std::vector<Expr> args);

inline Expr operator+(Expr a, Expr b) { return add(std::move(a), std::move(b)); }
inline Expr operator-(Expr a, Expr b) { return sub(std::move(a), std::move(b)); }
inline Expr operator*(Expr a, Expr b) { return mul(std::move(a), std::move(b)); }
inline bool operator==(const Expr& a, const Expr& b) { return a.same_as(b); }
inline bool operator!=(const Expr& a, const Expr& b) { return !a.same_as(b); }

// Inclusive bounds of integer symbols, used to simplify min/max and to decide
// signs. Symbols without an entry are unbounded. Shape symbols get [0, inf)
// (or [1, inf) when known non-empty) when they are created.
struct Interval {
  std::optional<int64_t> lo, hi;
};
using SymbolBounds = std::map<std::string, Interval, std::less<>>;

// Canonical form (see the file comment). Idempotent: simplify(simplify(e)) == simplify(e).
// Rules include: (a*k + b) floordiv k = a + b floordiv k; (a*k + b) mod k = b mod k;
// floordiv(floordiv(x, a), b) = floordiv(x, a*b) for positive a, b;
// min/max decided by bounds when the difference has a known sign; constant folding.
Expr simplify(const Expr& e, const SymbolBounds& bounds = {});

// Bounds of an integer expression given symbol bounds (conservative).
Interval bound_of(const Expr& e, const SymbolBounds& bounds);

// True when a and b are provably equal (simplify(a - b) == 0).
bool prove_equal(const Expr& a, const Expr& b, const SymbolBounds& bounds = {});

// Evaluates an integer expression given values for all its variables.
// Errors: an unbound variable, division by zero, a value-level node.
Result<int64_t> evaluate(const Expr& e, const std::map<std::string, int64_t, std::less<>>& env);

// Replaces variables by expressions (by name).
Expr substitute(const Expr& e, const std::map<std::string, Expr, std::less<>>& repl);
// Rewrites bottom-up: f is called on each node after its args were rewritten;
// returning an undefined Expr keeps the node.
Expr rewrite(const Expr& e, const std::function<Expr(const Expr&)>& f);
// Names of all kVar nodes (sorted, unique).
std::vector<std::string> free_vars(const Expr& e);

// Text form, deterministic and parseable by parse_expr:
//   integers: 3, n, a*b, 2*n + 1, (h - 1) floordiv 2 + 1, n mod 4, min(a, b), max(a, b)
//   value level: 1.5f (f32), 2.0d (f64), x:i32 for non-i64 vars, load(name#idx:f32, i, j),
//   cast<f32>(x), select(c, a, b), exp:f32(x), a < b, a <= b, a == b, a != b, a && b, a || b, !a, a / b
// Non-i64 integer constants print as 3:i32.
std::string print_expr(const Expr& e);
Result<Expr> parse_expr(std::string_view text);

}  // namespace kiln
