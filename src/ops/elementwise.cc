// Elementwise ops: unary math and activations, binary arithmetic and
// comparisons with numpy broadcasting, variadic Sum/Mean/Max/Min, Where, Clip,
// Cast, Dropout (inference) and Identity. Each lowers to one stage whose body
// is an expression over broadcast loads of the inputs.
//
// Shape arithmetic: when every data input has a sym_value (small integer
// tensors such as the output of Shape), the result's sym_value is computed
// symbolically, so chains like Shape -> Gather -> Mul -> Concat -> Reshape
// resolve to symbolic dims.
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>

#include "ops/common.h"

namespace kiln::ops {

namespace {

// Inputs loaded at one output index (undefined for an omitted optional input),
// and the output dtype. Returns the output value.
using BodyFn = std::function<Result<Expr>(const Node&, const std::vector<Expr>& in, DType out, LowerContext& ctx)>;
// Output dtype from the input dtypes (kUndefined for an omitted input).
using TypeFn = std::function<Result<DType>(const Node&, const std::vector<DType>& in)>;
// Symbolic value of one output element from input elements; nullopt when unknown.
using SymFn = std::function<std::optional<Expr>(const Node&, const std::vector<Expr>& in, const SymbolBounds&)>;

struct Elementwise {
  std::string name;
  int min_inputs = 1;
  int max_inputs = 1;      // -1: variadic
  int broadcast_inputs = -1;  // inputs that broadcast into the output (-1: all)
  TypeFn type;
  BodyFn body;
  SymFn sym;
  bool is_view = false;
  GradientRule gradient;  // reverse mode (ops/gradient.h); unset: none yet
};

// ---- dtype rules -----------------------------------------------------------------------

Result<DType> same_dtype_inputs(const Node& n, const std::vector<DType>& in, size_t count) {
  DType t = DType::kUndefined;
  for (size_t i = 0; i < in.size() && i < count; ++i) {
    if (in[i] == DType::kUndefined) continue;
    if (t == DType::kUndefined) {
      t = in[i];
    } else if (in[i] != t) {
      return node_invalid(n) << "input dtypes differ: " << dtype_name(t) << " and " << dtype_name(in[i]);
    }
  }
  return t;
}

TypeFn same_as_inputs(size_t count = SIZE_MAX) {
  return [count](const Node& n, const std::vector<DType>& in) { return same_dtype_inputs(n, in, count); };
}

TypeFn bool_result(size_t count = SIZE_MAX) {
  return [count](const Node& n, const std::vector<DType>& in) -> Result<DType> {
    KILN_ASSIGN_OR_RETURN(DType t, same_dtype_inputs(n, in, count));
    (void)t;
    return DType::kBool;
  };
}

TypeFn first_input() {
  return [](const Node&, const std::vector<DType>& in) -> Result<DType> { return in[0]; };
}

// ---- expression helpers ------------------------------------------------------------------

Expr c_of(const Expr& like, double v) { return const_of(like.dtype(), v); }
Expr gt(Expr a, Expr b) { return lt(std::move(b), std::move(a)); }
Expr ge(Expr a, Expr b) { return le(std::move(b), std::move(a)); }
Expr xor_bool(Expr a, Expr b) { return ne(std::move(a), std::move(b)); }
Expr fcall(const char* name, const Expr& x) { return call(name, x.dtype(), {x}); }

bool is_float(const Expr& e) { return dtype_is_float(e.dtype()); }
bool is_signed_int(const Expr& e) { return dtype_is_int(e.dtype()) && dtype_is_signed(e.dtype()); }

// Integer division truncating toward zero (ONNX / C semantics) from floor division.
Expr trunc_div(const Expr& a, const Expr& b) {
  Expr q = floordiv(a, b);
  if (!is_signed_int(a)) return q;
  Expr zero = c_of(a, 0);
  Expr r = mod(a, b);
  Expr signs_differ = xor_bool(lt(a, zero), lt(b, zero));
  return select(logical_and(ne(r, zero), signs_differ), add(q, c_of(a, 1)), q);
}

// Remainder with the sign of the dividend (C fmod) for integers; 0 for a zero
// divisor, like the generated code's floordiv and mod (codegen/llvm).
Expr trunc_mod(const Expr& a, const Expr& b) {
  Expr zero = c_of(a, 0);
  return select(eq(b, zero), zero, sub(a, mul(trunc_div(a, b), b)));
}

Expr float_attr(const Node& n, const char* name, double def, const Expr& like) {
  return c_of(like, n.attr_float(name, def));
}

// softplus(x) = log(1 + exp(x)), computed without overflow for large x.
Expr softplus(const Expr& x) {
  Expr zero = c_of(x, 0);
  return add(max(x, zero), fcall("log", add(c_of(x, 1), fcall("exp", fcall("neg", fcall("abs", x))))));
}

// A scalar (rank 0 or one-element) input loaded at its only element.
Expr load_scalar(const LowerContext& ctx, size_t i) {
  std::vector<Expr> idx(ctx.inputs[i].shape.size(), Expr(0));
  return ctx.load_input(i, std::move(idx));
}

// ---- registration helpers -----------------------------------------------------------------

Status check_float(const Node& n, const Expr& x) {
  if (!is_float(x)) return node_unsupported(n) << "dtype " << dtype_name(x.dtype()) << " (float expected)";
  return Status::ok();
}

// A unary op defined by f(x) for float inputs only.
Elementwise unary_float(std::string name, std::function<Expr(const Node&, const Expr&)> f) {
  Elementwise e;
  e.name = std::move(name);
  e.type = same_as_inputs();
  e.body = [f](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
    KILN_RETURN_IF_ERROR(check_float(n, in[0]));
    return f(n, in[0]);
  };
  return e;
}

// A unary op for any numeric dtype.
Elementwise unary_any(std::string name, std::function<Expr(const Node&, const Expr&)> f) {
  Elementwise e;
  e.name = std::move(name);
  e.type = same_as_inputs();
  e.body = [f](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
    return f(n, in[0]);
  };
  return e;
}

Elementwise binary(std::string name, TypeFn type, std::function<Result<Expr>(const Node&, const Expr&, const Expr&)> f,
                   SymFn sym = nullptr) {
  Elementwise e;
  e.name = std::move(name);
  e.min_inputs = e.max_inputs = 2;
  e.type = std::move(type);
  e.body = [f](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) { return f(n, in[0], in[1]); };
  e.sym = std::move(sym);
  return e;
}

// Variadic fold (Sum, Max, Min): at least one input.
Elementwise variadic(std::string name, std::function<Expr(const Expr&, const Expr&)> f, SymFn sym = nullptr) {
  Elementwise e;
  e.name = std::move(name);
  e.min_inputs = 1;
  e.max_inputs = -1;
  e.type = same_as_inputs();
  e.body = [f](const Node&, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
    Expr acc = in[0];
    for (size_t i = 1; i < in.size(); ++i) acc = f(acc, in[i]);
    return acc;
  };
  e.sym = std::move(sym);
  return e;
}

// ---- symbolic helpers ----------------------------------------------------------------------

SymFn sym_arith(std::function<Expr(const Expr&, const Expr&)> f) {
  return [f](const Node&, const std::vector<Expr>& in, const SymbolBounds& b) -> std::optional<Expr> {
    Expr acc = in[0];
    for (size_t i = 1; i < in.size(); ++i) acc = f(acc, in[i]);
    return simplify(acc, b);
  };
}

std::optional<Expr> sym_compare(const Expr& a, const Expr& b, const SymbolBounds& bounds,
                                const std::function<bool(int64_t, int64_t)>& cmp) {
  Expr d = simplify(sub(a, b), bounds);
  // Compare a - b with 0 when its bounds decide the comparison.
  Interval iv = bound_of(d, bounds);
  if (auto c = d.as_const()) return Expr(cmp(*c, 0) ? 1 : 0);
  bool lo_neg = iv.hi && *iv.hi < 0, hi_pos = iv.lo && *iv.lo > 0;
  if (lo_neg) return Expr(cmp(-1, 0) ? 1 : 0);
  if (hi_pos) return Expr(cmp(1, 0) ? 1 : 0);
  return std::nullopt;
}

SymFn sym_cmp(std::function<bool(int64_t, int64_t)> cmp) {
  return [cmp](const Node&, const std::vector<Expr>& in, const SymbolBounds& b) {
    return sym_compare(in[0], in[1], b, cmp);
  };
}

// ---- generic infer / lower ------------------------------------------------------------------

size_t num_broadcast(const Elementwise& e, const Node& n) {
  return e.broadcast_inputs < 0 ? n.num_inputs() : std::min<size_t>(n.num_inputs(), e.broadcast_inputs);
}

// Flat index of input element for output flat index `o` under broadcasting (static shapes).
int64_t broadcast_flat(int64_t o, const std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  int64_t idx = 0, stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    size_t ok = out.size() - 1 - k, ik = in.size() - 1 - k;
    int64_t ostride = 1;
    for (size_t j = ok + 1; j < out.size(); ++j) ostride *= out[j];
    int64_t coord = (o / ostride) % out[ok];
    if (in[ik] != 1) idx += coord * stride;
    stride *= in[ik];
  }
  return idx;
}

void infer_sym(const Elementwise& e, Node& n, const InferContext& ctx, const std::vector<TensorType>& in_types,
               const TensorType& out_type) {
  if (!e.sym) return;
  if (!(dtype_is_int(out_type.dtype) || out_type.dtype == DType::kBool) || !out_type.is_static()) return;
  std::vector<int64_t> out_shape = out_type.static_shape();
  int64_t numel = 1;
  for (int64_t d : out_shape) numel *= d;
  if (numel > 64) return;
  size_t nb = num_broadcast(e, n);
  std::vector<std::vector<Expr>> vals(nb);
  std::vector<std::vector<int64_t>> shapes(nb);
  for (size_t i = 0; i < nb; ++i) {
    if (!has_input(n, i)) return;
    auto v = sym_values(n, i);
    if (!v || !in_types[i].is_static()) return;
    shapes[i] = in_types[i].static_shape();
    int64_t cnt = 1;
    for (int64_t d : shapes[i]) cnt *= d;
    if (cnt != static_cast<int64_t>(v->size())) return;
    vals[i] = std::move(*v);
  }
  std::vector<Expr> out;
  for (int64_t o = 0; o < numel; ++o) {
    std::vector<Expr> args;
    for (size_t i = 0; i < nb; ++i) args.push_back(vals[i][broadcast_flat(o, out_shape, shapes[i])]);
    auto r = e.sym(n, args, ctx.bounds);
    if (!r) return;
    out.push_back(*r);
  }
  n.output(0)->set_sym_value(std::move(out));
}

Status infer_elementwise(const Elementwise& e, Node& n, InferContext& ctx) {
  int count = static_cast<int>(n.num_inputs());
  if (count < e.min_inputs || (e.max_inputs >= 0 && count > e.max_inputs)) {
    return node_invalid(n) << count << " inputs (expected " << e.min_inputs << ".."
                           << (e.max_inputs < 0 ? std::string("n") : std::to_string(e.max_inputs)) << ")";
  }
  std::vector<DType> dtypes(n.num_inputs(), DType::kUndefined);
  std::vector<TensorType> types(n.num_inputs());
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    if (!has_input(n, i)) continue;
    KILN_ASSIGN_OR_RETURN(types[i], input_type(n, i));
    dtypes[i] = types[i].dtype;
  }
  KILN_ASSIGN_OR_RETURN(DType out, e.type(n, dtypes));
  std::vector<Shape> shapes;
  bool known = true;
  for (size_t i = 0; i < num_broadcast(e, n); ++i) {
    if (!has_input(n, i)) continue;
    if (!types[i].has_shape()) {
      known = false;
      break;
    }
    shapes.push_back(*types[i].shape);
  }
  if (!known) {
    set_output_unknown_rank(n, 0, out);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Shape shape, broadcast_all(n, shapes, ctx.bounds));
  set_output(n, 0, out, shape, ctx);
  infer_sym(e, n, ctx, types, n.output(0)->type());
  return Status::ok();
}

Status check_compilable(const Node& n, const LowerContext& ctx) {
  for (const auto& b : ctx.inputs) {
    if (!b.name.empty() && !dtype_is_compilable(b.dtype)) {
      return node_unsupported(n) << "dtype " << dtype_name(b.dtype) << " of input '" << b.name << "'";
    }
  }
  for (const auto& b : ctx.outputs) {
    if (!dtype_is_compilable(b.dtype)) {
      return node_unsupported(n) << "dtype " << dtype_name(b.dtype) << " of output '" << b.name << "'";
    }
  }
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_elementwise(const Elementwise& e, const Node& n, LowerContext& ctx) {
  KILN_RETURN_IF_ERROR(check_compilable(n, ctx));
  KILN_CHECK(!ctx.outputs.empty()) << n.describe() << ": no output buffer";
  const tir::Buffer& out = ctx.outputs[0];
  std::vector<std::string> axes = fresh_axes(ctx, out.shape.size());
  std::vector<Expr> idx = axis_vars(axes);
  std::vector<Expr> in;
  size_t nb = std::min(num_broadcast(e, n), ctx.inputs.size());
  for (size_t i = 0; i < nb; ++i) {
    in.push_back(ctx.inputs[i].name.empty() ? Expr() : load_broadcast(ctx, i, idx, out.shape));
  }
  KILN_ASSIGN_OR_RETURN(Expr body, e.body(n, in, out.dtype, ctx));
  if (body.dtype() != out.dtype) {
    return internal_error() << n.describe() << ": body dtype " << dtype_name(body.dtype()) << " != output dtype "
                            << dtype_name(out.dtype);
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_stage(out.name, out.dtype, axes, out.shape, body));
  return stages;
}

void register_elementwise(Elementwise e) {
  auto shared = std::make_shared<Elementwise>(std::move(e));
  OpDef def;
  def.name = shared->name;
  def.infer = [shared](Node& n, InferContext& ctx) { return infer_elementwise(*shared, n, ctx); };
  def.lower = [shared](const Node& n, LowerContext& ctx) { return lower_elementwise(*shared, n, ctx); };
  def.is_elementwise = true;
  def.is_view = shared->is_view;
  def.gradient = shared->gradient;
  register_op(std::move(def));
}

// ---- individual ops ---------------------------------------------------------------------------

Result<Expr> divide(const Node&, const Expr& a, const Expr& b) {
  if (is_float(a)) return div(a, b);
  if (a.dtype() == DType::kBool) return Status(StatusCode::kUnsupported, "Div of bool");
  return trunc_div(a, b);
}

Result<Expr> power(const Node& n, const Expr& a, const Expr& b) {
  if (a.dtype() == DType::kBool || b.dtype() == DType::kBool) return node_unsupported(n) << "Pow of bool";
  if (is_float(a)) return call("pow", a.dtype(), {a, cast_if_needed(a.dtype(), b)});
  // Integer base: computed in f64 and converted back (exact for results below 2^53).
  Expr r = call("pow", DType::kFloat64, {cast(DType::kFloat64, a), cast_if_needed(DType::kFloat64, b)});
  return cast(a.dtype(), fcall("round", r));
}

Result<Expr> modulo(const Node& n, const Expr& a, const Expr& b) {
  bool fmod = n.attr_int("fmod", 0) != 0;
  if (is_float(a)) {
    if (fmod) return mod(a, b);
    // Python-style remainder (sign of the divisor) for floats.
    return sub(a, mul(fcall("floor", div(a, b)), b));
  }
  if (a.dtype() == DType::kBool) return node_unsupported(n) << "Mod of bool";
  if (fmod) return trunc_mod(a, b);
  return mod(a, b);
}

Result<Expr> bitshift(const Node& n, const Expr& a, const Expr& b) {
  std::string dir = n.attr_string("direction", "");
  if (dir == "LEFT") return call("shl", a.dtype(), {a, b});
  if (dir == "RIGHT") return call("shr", a.dtype(), {a, b});
  return node_invalid(n) << "BitShift direction '" << dir << "' (LEFT or RIGHT expected)";
}

Result<Expr> cast_body(const Node& n, const Expr& x, DType to) {
  if (to == DType::kBool) {
    if (x.dtype() == DType::kBool) return x;
    return ne(x, c_of(x, 0));
  }
  if (x.dtype() == DType::kBool) return select(x, const_of(to, 1), const_of(to, 0));
  if ((to == DType::kInt4 || to == DType::kUInt4) && x.dtype() != to) {
    // Saturating, floats rounded half to even first (the ONNX Cast rule for
    // 4-bit targets); the byte then holds a value in range.
    const double lo = to == DType::kInt4 ? -8 : 0, hi = to == DType::kInt4 ? 7 : 15;
    Expr v = x;
    if (dtype_is_float(x.dtype())) {
      v = call("round", x.dtype(), {x});
      v = select(call("isnan", DType::kBool, {x}), c_of(x, 0), max(min(v, c_of(x, hi)), c_of(x, lo)));
    } else {
      bool has_lo = is_signed_int(x), has_hi = !(x.dtype() == DType::kInt4 || x.dtype() == DType::kUInt4);
      if (has_hi) v = min(v, c_of(x, hi));
      if (has_lo) v = max(v, c_of(x, lo));
    }
    return cast_if_needed(to, v);
  }
  bool float8 = dtype_is_narrow_float(to) && to != DType::kFloat16 && to != DType::kBFloat16;
  if (float8 && n.attr_int("saturate", 1) == 0 && x.dtype() != to) {
    // Non-saturating conversion: out-of-range values become NaN (or infinity for e5m2).
    Expr f = dtype_is_float(x.dtype()) ? x : cast(DType::kFloat32, x);
    return call("cast_nosat", to, {f});
  }
  return cast_if_needed(to, x);
}

Result<DType> cast_type(const Node& n) {
  if (!n.has_attr("to")) return node_invalid(n) << "missing attribute 'to'";
  int64_t to = n.attr_int("to", 0);
  if (to <= 0 || to > kMaxDType) return node_invalid(n) << "invalid 'to' dtype " << to;
  return static_cast<DType>(to);
}

Result<Expr> clip_bound(const Node& n, LowerContext& ctx, size_t i, const char* attr, const Expr& x) {
  if (n.has_attr(attr)) return c_of(x, n.attr_float(attr, 0));
  if (i < ctx.inputs.size() && !ctx.inputs[i].name.empty()) {
    if (i < ctx.constants.size() && ctx.constants[i] != nullptr) {
      const Tensor* t = ctx.constants[i];
      if (t->numel() != 1) return node_invalid(n) << "Clip bound must be a scalar";
      return c_of(x, t->get_f64(0));
    }
    int64_t numel = 1;
    for (const Expr& d : ctx.inputs[i].shape) {
      auto c = d.as_const();
      if (!c) return node_unsupported(n) << "Clip bound with a symbolic shape";
      numel *= *c;
    }
    if (numel != 1) return node_invalid(n) << "Clip bound must be a scalar";
    return cast_if_needed(x.dtype(), load_scalar(ctx, i));
  }
  return Expr();
}

// ---- gradient rules (ops/gradient.h) -------------------------------------------------------
// Each gives d loss / d input from gy = d loss / d output, in ordinary ops;
// inputs that broadcast get the sum over their broadcast axes (give()).

Elementwise with_gradient(Elementwise e, GradientRule rule) {
  e.gradient = std::move(rule);
  return e;
}

// x's gradient is gy * f(x, y) for a unary op, f built by `factor`.
GradientRule unary_gradient(std::function<Result<Value*>(GradBuilder&, Value* x, Value* y)> factor) {
  return [factor](GradBuilder& b) -> Status {
    Value* gy = b.output_grad(0);
    if (!b.wants(0) || gy == nullptr) return Status::ok();
    KILN_ASSIGN_OR_RETURN(Value* f, factor(b, b.node().input(0), b.node().output(0)));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {gy, f}));
    return b.set_input_grad(0, g);
  };
}

Status grad_add_sub(GradBuilder& b, bool sub) {
  Value* gy = b.output_grad(0);
  KILN_RETURN_IF_ERROR(b.give(0, gy));
  if (!b.wants(1)) return Status::ok();
  Value* g1 = gy;
  if (sub) {
    KILN_ASSIGN_OR_RETURN(g1, b.add1("Neg", {gy}));
  }
  return b.give(1, g1);
}

Status grad_mul(GradBuilder& b) {
  Value* gy = b.output_grad(0);
  const Node& n = b.node();
  for (size_t i : {size_t{0}, size_t{1}}) {
    if (!b.wants(i)) continue;
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {gy, n.input(1 - i)}));
    KILN_RETURN_IF_ERROR(b.give(i, g));
  }
  return Status::ok();
}

// y = a / b: da = gy / b, db = -gy * y / b.
Status grad_div(GradBuilder& b) {
  Value* gy = b.output_grad(0);
  const Node& n = b.node();
  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Div", {gy, n.input(1)}));
    KILN_RETURN_IF_ERROR(b.give(0, g));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* q, b.add1("Div", {n.output(0), n.input(1)}));
    KILN_ASSIGN_OR_RETURN(Value* m, b.add1("Mul", {gy, q}));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Neg", {m}));
    KILN_RETURN_IF_ERROR(b.give(1, g));
  }
  return Status::ok();
}

// y = a ^ e: da = gy * e * a^(e-1), de = gy * y * log(a).
Status grad_pow(GradBuilder& b) {
  Value* gy = b.output_grad(0);
  const Node& n = b.node();
  Value* a = n.input(0);
  Value* e = n.input(1);
  if (b.wants(0)) {
    Value* ea = e;
    if (e->dtype() != a->dtype()) {
      KILN_ASSIGN_OR_RETURN(ea, b.add1("Cast", {e}, {{"to", Attribute::of_int(static_cast<int64_t>(a->dtype()))}}));
    }
    KILN_ASSIGN_OR_RETURN(Value* em1, b.add1("Sub", {ea, b.scalar(1, a)}));
    KILN_ASSIGN_OR_RETURN(Value* p, b.add1("Pow", {a, em1}));
    KILN_ASSIGN_OR_RETURN(Value* f, b.add1("Mul", {p, ea}));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {gy, f}));
    KILN_RETURN_IF_ERROR(b.give(0, g));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* la, b.add1("Log", {a}));
    KILN_ASSIGN_OR_RETURN(Value* f, b.add1("Mul", {n.output(0), la}));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {gy, f}));
    KILN_RETURN_IF_ERROR(b.give(1, g));
  }
  return Status::ok();
}

// Where(c, a, b): the gradient flows to the side each element came from.
Status grad_where(GradBuilder& b) {
  Value* gy = b.output_grad(0);
  const Node& n = b.node();
  for (size_t i : {size_t{1}, size_t{2}}) {
    if (!b.wants(i)) continue;
    Value* zero = b.scalar(0, gy);
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Where", {n.input(0), i == 1 ? gy : zero, i == 1 ? zero : gy}));
    KILN_RETURN_IF_ERROR(b.give(i, g));
  }
  return Status::ok();
}

// Max/Min of two inputs: to the input that won (ties to the first).
Status grad_extremum(GradBuilder& b, bool max) {
  const Node& n = b.node();
  if (n.num_inputs() == 1) return b.give(0, b.output_grad(0));
  if (n.num_inputs() != 2)
    return node_unsupported(n) << "the gradient of " << n.op_type() << " of " << n.num_inputs() << " inputs";
  KILN_ASSIGN_OR_RETURN(Value* first, b.add1(max ? "GreaterOrEqual" : "LessOrEqual", {n.input(0), n.input(1)}));
  Value* gy = b.output_grad(0);
  Value* zero = b.scalar(0, gy);
  KILN_ASSIGN_OR_RETURN(Value* g0, b.add1("Where", {first, gy, zero}));
  KILN_ASSIGN_OR_RETURN(Value* g1, b.add1("Where", {first, zero, gy}));
  KILN_RETURN_IF_ERROR(b.give(0, g0));
  return b.give(1, g1);
}

// Clip(x, min, max) = Min(Max(x, min), max) (max wins where min > max):
// dy flows to x where min < x and Max(x, min) < max (strictly, as Relu's
// x > 0 and PyTorch's hardtanh, which ReLU6 exports as); a bound given as an
// input gets the sum of dy where it is the output.
Status grad_clip(GradBuilder& b) {
  const Node& n = b.node();
  Value* x = n.input(0);
  Value* gy = b.output_grad(0);
  Value* zero = b.scalar(0, gy);
  auto bound = [&](size_t i, const char* attr) -> Value* {
    if (n.has_attr(attr)) return b.scalar(n.attr_float(attr, 0), x);
    return i < n.num_inputs() ? n.input(i) : nullptr;
  };
  auto input_bound = [&](size_t i, const char* attr) { return !n.has_attr(attr) && b.wants(i); };
  Value* lo = bound(1, "min");
  Value* hi = bound(2, "max");
  Value* to_x = nullptr;  // where dy reaches x
  Value* pre = x;         // Max(x, min)
  Value* to_lo = nullptr;
  if (lo != nullptr) {
    KILN_ASSIGN_OR_RETURN(to_x, b.add1("Greater", {x, lo}));
    KILN_ASSIGN_OR_RETURN(pre, b.add1("Max", {x, lo}));
    if (input_bound(1, "min")) {
      KILN_ASSIGN_OR_RETURN(to_lo, b.add1("Less", {x, lo}));
    }
  }
  if (hi != nullptr) {
    KILN_ASSIGN_OR_RETURN(Value* below, b.add1("Less", {pre, hi}));
    if (input_bound(2, "max")) {
      KILN_ASSIGN_OR_RETURN(Value* above, b.add1("Greater", {pre, hi}));
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Where", {above, gy, zero}));
      KILN_RETURN_IF_ERROR(b.give(2, g));
    }
    if (to_x == nullptr) {
      to_x = below;
    } else {
      KILN_ASSIGN_OR_RETURN(to_x, b.add1("And", {to_x, below}));
    }
    if (to_lo != nullptr) {
      KILN_ASSIGN_OR_RETURN(to_lo, b.add1("And", {to_lo, below}));
    }
  }
  if (to_lo != nullptr) {
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Where", {to_lo, gy, zero}));
    KILN_RETURN_IF_ERROR(b.give(1, g));
  }
  if (!b.wants(0)) return Status::ok();
  if (to_x == nullptr) return b.give(0, gy);
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Where", {to_x, gy, zero}));
  return b.give(0, g);
}

Result<Value*> one_minus(GradBuilder& b, Value* v) { return b.add1("Sub", {b.scalar(1, v), v}); }

std::vector<Elementwise> elementwise_ops() {
  std::vector<Elementwise> ops;
  auto add_op = [&](Elementwise e) { ops.push_back(std::move(e)); };

  // ---- unary, float ----
  add_op(with_gradient(unary_float("Sigmoid", [](const Node&, const Expr& x) { return fcall("sigmoid", x); }),
                       unary_gradient([](GradBuilder& b, Value*, Value* y) -> Result<Value*> {
                         KILN_ASSIGN_OR_RETURN(Value* r, one_minus(b, y));
                         return b.add1("Mul", {y, r});
                       })));
  add_op(with_gradient(unary_float("Tanh", [](const Node&, const Expr& x) { return fcall("tanh", x); }),
                       unary_gradient([](GradBuilder& b, Value*, Value* y) -> Result<Value*> {
                         KILN_ASSIGN_OR_RETURN(Value* y2, b.add1("Mul", {y, y}));
                         return one_minus(b, y2);
                       })));
  add_op(with_gradient(unary_float("Exp", [](const Node&, const Expr& x) { return fcall("exp", x); }),
                       unary_gradient([](GradBuilder&, Value*, Value* y) -> Result<Value*> { return y; })));
  add_op(with_gradient(unary_float("Log", [](const Node&, const Expr& x) { return fcall("log", x); }),
                       unary_gradient([](GradBuilder& b, Value* x, Value*) -> Result<Value*> {
                         return b.add1("Reciprocal", {x});
                       })));
  add_op(with_gradient(unary_float("Sqrt", [](const Node&, const Expr& x) { return fcall("sqrt", x); }),
                       unary_gradient([](GradBuilder& b, Value*, Value* y) -> Result<Value*> {
                         KILN_ASSIGN_OR_RETURN(Value* twice, b.add1("Add", {y, y}));
                         return b.add1("Reciprocal", {twice});
                       })));
  add_op(with_gradient(unary_float("Erf", [](const Node&, const Expr& x) { return fcall("erf", x); }),
                       unary_gradient([](GradBuilder& b, Value* x, Value*) -> Result<Value*> {
                         // 2 / sqrt(pi) * exp(-x^2)
                         KILN_ASSIGN_OR_RETURN(Value* x2, b.add1("Mul", {x, x}));
                         KILN_ASSIGN_OR_RETURN(Value* nx2, b.add1("Neg", {x2}));
                         KILN_ASSIGN_OR_RETURN(Value* e, b.add1("Exp", {nx2}));
                         return b.add1("Mul", {e, b.scalar(1.1283791670955126, x)});
                       })));
  add_op(unary_float("Floor", [](const Node&, const Expr& x) { return fcall("floor", x); }));
  add_op(unary_float("Ceil", [](const Node&, const Expr& x) { return fcall("ceil", x); }));
  add_op(unary_float("Round", [](const Node&, const Expr& x) { return fcall("round", x); }));
  add_op(with_gradient(unary_float("Sin", [](const Node&, const Expr& x) { return fcall("sin", x); }),
                       unary_gradient([](GradBuilder& b, Value* x, Value*) { return b.add1("Cos", {x}); })));
  add_op(with_gradient(unary_float("Cos", [](const Node&, const Expr& x) { return fcall("cos", x); }),
                       unary_gradient([](GradBuilder& b, Value* x, Value*) -> Result<Value*> {
                         KILN_ASSIGN_OR_RETURN(Value* s, b.add1("Sin", {x}));
                         return b.add1("Neg", {s});
                       })));
  add_op(unary_float("Tan", [](const Node&, const Expr& x) { return div(fcall("sin", x), fcall("cos", x)); }));
  add_op(unary_float("Atan", [](const Node&, const Expr& x) { return fcall("atan", x); }));
  add_op(unary_float("Asin", [](const Node&, const Expr& x) { return fcall("asin", x); }));
  add_op(unary_float("Acos", [](const Node&, const Expr& x) { return fcall("acos", x); }));
  add_op(unary_float("Sinh", [](const Node&, const Expr& x) {
    return mul(sub(fcall("exp", x), fcall("exp", fcall("neg", x))), c_of(x, 0.5));
  }));
  add_op(unary_float("Cosh", [](const Node&, const Expr& x) {
    return mul(add(fcall("exp", x), fcall("exp", fcall("neg", x))), c_of(x, 0.5));
  }));
  // asinh(x) = sign(x) log(|x| + sqrt(x^2 + 1)); acosh(x) = log(x + sqrt(x^2 - 1)).
  add_op(unary_float("Asinh", [](const Node&, const Expr& x) {
    Expr ax = fcall("abs", x);
    Expr r = fcall("log", add(ax, fcall("sqrt", add(mul(ax, ax), c_of(x, 1)))));
    return select(lt(x, c_of(x, 0)), fcall("neg", r), r);
  }));
  add_op(unary_float("Acosh", [](const Node&, const Expr& x) {
    return fcall("log", add(x, fcall("sqrt", sub(mul(x, x), c_of(x, 1)))));
  }));
  // atanh(x) = log((1 + x) / (1 - x)) / 2.
  add_op(unary_float("Atanh", [](const Node&, const Expr& x) {
    return mul(fcall("log", div(add(c_of(x, 1), x), sub(c_of(x, 1), x))), c_of(x, 0.5));
  }));
  add_op(with_gradient(unary_float("Reciprocal", [](const Node&, const Expr& x) { return div(c_of(x, 1), x); }),
                       unary_gradient([](GradBuilder& b, Value*, Value* y) -> Result<Value*> {
                         KILN_ASSIGN_OR_RETURN(Value* y2, b.add1("Mul", {y, y}));
                         return b.add1("Neg", {y2});
                       })));
  add_op(unary_float("Softplus", [](const Node&, const Expr& x) { return softplus(x); }));
  add_op(unary_float("Softsign",
                     [](const Node&, const Expr& x) { return div(x, add(c_of(x, 1), fcall("abs", x))); }));
  add_op(unary_float("Mish", [](const Node&, const Expr& x) { return mul(x, fcall("tanh", softplus(x))); }));
  add_op(unary_float("Elu", [](const Node& n, const Expr& x) {
    Expr alpha = float_attr(n, "alpha", 1.0, x);
    return select(lt(x, c_of(x, 0)), mul(alpha, sub(fcall("exp", x), c_of(x, 1))), x);
  }));
  add_op(unary_float("Selu", [](const Node& n, const Expr& x) {
    Expr alpha = float_attr(n, "alpha", 1.67326319217681884765625, x);
    Expr gamma = float_attr(n, "gamma", 1.05070102214813232421875, x);
    return mul(gamma, select(le(x, c_of(x, 0)), sub(mul(alpha, fcall("exp", x)), alpha), x));
  }));
  add_op(unary_float("Celu", [](const Node& n, const Expr& x) {
    Expr alpha = float_attr(n, "alpha", 1.0, x);
    Expr zero = c_of(x, 0);
    return add(max(zero, x), min(zero, mul(alpha, sub(fcall("exp", div(x, alpha)), c_of(x, 1)))));
  }));
  add_op(unary_float("HardSigmoid", [](const Node& n, const Expr& x) {
    Expr alpha = float_attr(n, "alpha", 0.2, x), beta = float_attr(n, "beta", 0.5, x);
    return max(c_of(x, 0), min(c_of(x, 1), add(mul(alpha, x), beta)));
  }));
  add_op(unary_float("HardSwish", [](const Node&, const Expr& x) {
    Expr hs = max(c_of(x, 0), min(c_of(x, 1), add(mul(c_of(x, 1.0 / 6.0), x), c_of(x, 0.5))));
    return mul(x, hs);
  }));
  add_op(unary_float("ThresholdedRelu", [](const Node& n, const Expr& x) {
    return select(gt(x, float_attr(n, "alpha", 1.0, x)), x, c_of(x, 0));
  }));
  {
    Elementwise gelu = unary_float("Gelu", nullptr);
    gelu.body = [](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
      const Expr& x = in[0];
      KILN_RETURN_IF_ERROR(check_float(n, x));
      std::string approx = n.attr_string("approximate", "none");
      Expr half = c_of(x, 0.5), one = c_of(x, 1);
      if (approx == "none") return mul(mul(half, x), add(one, fcall("erf", mul(x, c_of(x, M_SQRT1_2)))));
      if (approx == "tanh") {
        Expr inner = mul(c_of(x, std::sqrt(2.0 / std::numbers::pi)), add(x, mul(c_of(x, 0.044715), mul(x, mul(x, x)))));
        return mul(mul(half, x), add(one, fcall("tanh", inner)));
      }
      return node_unsupported(n) << "Gelu approximate='" << approx << "'";
    };
    add_op(std::move(gelu));
  }
  {
    Elementwise isnan;
    isnan.name = "IsNaN";
    isnan.type = [](const Node&, const std::vector<DType>&) -> Result<DType> { return DType::kBool; };
    isnan.body = [](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
      KILN_RETURN_IF_ERROR(check_float(n, in[0]));
      return call("isnan", DType::kBool, {in[0]});
    };
    Elementwise isinf = isnan;
    add_op(std::move(isnan));
    isinf.name = "IsInf";
    isinf.body = [](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
      const Expr& x = in[0];
      KILN_RETURN_IF_ERROR(check_float(n, x));
      bool neg = n.attr_int("detect_negative", 1) != 0, pos = n.attr_int("detect_positive", 1) != 0;
      Expr inf = call("isinf", DType::kBool, {x});
      if (neg && pos) return inf;
      if (pos) return logical_and(inf, gt(x, c_of(x, 0)));
      if (neg) return logical_and(inf, lt(x, c_of(x, 0)));
      return bool_imm(false);
    };
    add_op(std::move(isinf));
  }

  // ---- unary, any numeric dtype ----
  add_op(with_gradient(unary_any("Relu", [](const Node&, const Expr& x) { return max(x, c_of(x, 0)); }),
                       [](GradBuilder& b) -> Status {
                         if (!b.wants(0)) return Status::ok();
                         // y > 0 where x > 0: the backward keeps the output,
                         // which the next layer's gradient reads anyway.
                         Value* y = b.node().output(0);
                         KILN_ASSIGN_OR_RETURN(Value* pos, b.add1("Greater", {y, b.scalar(0, y)}));
                         Value* gy = b.output_grad(0);
                         KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Where", {pos, gy, b.scalar(0, gy)}));
                         return b.set_input_grad(0, g);
                       }));
  add_op(unary_any("LeakyRelu", [](const Node& n, const Expr& x) {
    return select(lt(x, c_of(x, 0)), mul(float_attr(n, "alpha", 0.01, x), x), x);
  }));
  add_op(with_gradient(unary_any("Abs", [](const Node&, const Expr& x) {
    if (is_float(x)) return fcall("abs", x);
    if (!is_signed_int(x)) return x;
    return select(lt(x, c_of(x, 0)), sub(c_of(x, 0), x), x);
  }), unary_gradient([](GradBuilder& b, Value* x, Value*) { return b.add1("Sign", {x}); })));
  {
    Elementwise neg = unary_any("Neg", [](const Node&, const Expr& x) {
      if (is_float(x)) return fcall("neg", x);
      return sub(c_of(x, 0), x);
    });
    neg.sym = [](const Node&, const std::vector<Expr>& in, const SymbolBounds& b) -> std::optional<Expr> {
      return simplify(sub(Expr(0), in[0]), b);
    };
    neg.gradient = [](GradBuilder& b) -> Status {
      if (!b.wants(0)) return Status::ok();
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Neg", {b.output_grad(0)}));
      return b.set_input_grad(0, g);
    };
    add_op(std::move(neg));
  }
  add_op(unary_any("Sign", [](const Node&, const Expr& x) {
    Expr zero = c_of(x, 0);
    return select(gt(x, zero), c_of(x, 1), select(lt(x, zero), c_of(x, -1), zero));
  }));
  add_op(unary_any("Shrink", [](const Node& n, const Expr& x) {
    Expr lambd = float_attr(n, "lambd", 0.5, x), bias = float_attr(n, "bias", 0.0, x);
    Expr neg_lambd = c_of(x, -n.attr_float("lambd", 0.5));
    return select(lt(x, neg_lambd), add(x, bias), select(gt(x, lambd), sub(x, bias), c_of(x, 0)));
  }));
  add_op(unary_any("Not", [](const Node&, const Expr& x) { return logical_not(x); }));
  add_op(unary_any("BitwiseNot", [](const Node&, const Expr& x) {
    return call("bitxor", x.dtype(), {x, int_imm(-1, x.dtype())});
  }));
  {
    Elementwise id = unary_any("Identity", [](const Node&, const Expr& x) { return x; });
    id.is_view = true;
    id.gradient = [](GradBuilder& b) { return b.set_input_grad(0, b.output_grad(0)); };
    id.sym = [](const Node&, const std::vector<Expr>& in, const SymbolBounds&) -> std::optional<Expr> {
      return in[0];
    };
    add_op(id);
    // OptionalGetElement of a tensor (opset 18) is that tensor. Optional-typed
    // values are refused at import, so every input reaching it is a tensor.
    id.name = "OptionalGetElement";
    add_op(std::move(id));
  }
  {
    Elementwise c;
    c.name = "Cast";
    // Between float dtypes: the gradient cast back.
    c.gradient = [](GradBuilder& b) -> Status {
      if (!b.wants(0)) return Status::ok();
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Cast", {b.output_grad(0)},
                                             {{"to", Attribute::of_int(static_cast<int64_t>(b.node().input(0)->dtype()))}}));
      return b.set_input_grad(0, g);
    };
    c.type = [](const Node& n, const std::vector<DType>&) { return cast_type(n); };
    c.body = [](const Node& n, const std::vector<Expr>& in, DType out, LowerContext&) {
      return cast_body(n, in[0], out);
    };
    c.sym = [](const Node& n, const std::vector<Expr>& in, const SymbolBounds&) -> std::optional<Expr> {
      auto to = cast_type(n);
      if (!to.is_ok()) return std::nullopt;
      if (*to == DType::kBool) {
        auto v = in[0].as_const();
        if (!v) return std::nullopt;
        return Expr(*v != 0 ? 1 : 0);
      }
      return in[0];
    };
    auto cast_body_fn = c.body;
    add_op(std::move(c));
    Elementwise like;
    like.name = "CastLike";
    like.min_inputs = like.max_inputs = 2;
    like.broadcast_inputs = 1;
    like.type = [](const Node&, const std::vector<DType>& in) -> Result<DType> { return in[1]; };
    like.body = cast_body_fn;
    like.sym = [](const Node&, const std::vector<Expr>& in, const SymbolBounds&) -> std::optional<Expr> {
      return in[0];
    };
    add_op(std::move(like));
  }
  {
    Elementwise clip;
    clip.name = "Clip";
    clip.min_inputs = 1;
    clip.max_inputs = 3;
    clip.broadcast_inputs = 1;
    clip.type = same_as_inputs();
    clip.body = [](const Node& n, const std::vector<Expr>& in, DType, LowerContext& ctx) -> Result<Expr> {
      Expr x = in[0];
      KILN_ASSIGN_OR_RETURN(Expr lo, clip_bound(n, ctx, 1, "min", x));
      KILN_ASSIGN_OR_RETURN(Expr hi, clip_bound(n, ctx, 2, "max", x));
      if (lo.defined()) x = max(x, lo);
      if (hi.defined()) x = min(x, hi);
      return x;
    };
    add_op(with_gradient(std::move(clip), grad_clip));
  }

  // ---- binary arithmetic ----
  add_op(with_gradient(binary("Add", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return add(a, b);
  }, sym_arith([](const Expr& a, const Expr& b) { return add(a, b); })), [](GradBuilder& b) { return grad_add_sub(b, false); }));
  add_op(with_gradient(binary("Sub", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return sub(a, b);
  }, sym_arith([](const Expr& a, const Expr& b) { return sub(a, b); })), [](GradBuilder& b) { return grad_add_sub(b, true); }));
  add_op(with_gradient(binary("Mul", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return mul(a, b);
  }, sym_arith([](const Expr& a, const Expr& b) { return mul(a, b); })), grad_mul));
  add_op(with_gradient(binary("Div", same_as_inputs(), divide,
                [](const Node&, const std::vector<Expr>& in, const SymbolBounds& b) -> std::optional<Expr> {
                  auto ca = in[0].as_const(), cb = in[1].as_const();
                  if (cb && *cb == 0) return std::nullopt;
                  if (ca && cb) return Expr(*ca / *cb);  // C++ division truncates, as ONNX
                  // Floor and truncation agree for a non-negative dividend and positive divisor.
                  Interval ia = bound_of(in[0], b), ib = bound_of(in[1], b);
                  if (ia.lo && *ia.lo >= 0 && ib.lo && *ib.lo > 0) return simplify(floordiv(in[0], in[1]), b);
                  return std::nullopt;
                }), grad_div));
  add_op(with_gradient(binary("Pow", first_input(), power), grad_pow));
  add_op(binary("Mod", same_as_inputs(), modulo,
                [](const Node& n, const std::vector<Expr>& in, const SymbolBounds& b) -> std::optional<Expr> {
                  auto ca = in[0].as_const(), cb = in[1].as_const();
                  if (cb && *cb == 0) return std::nullopt;
                  if (ca && cb) {
                    int64_t r = *ca % *cb;  // sign of dividend (fmod)
                    if (n.attr_int("fmod", 0) == 0 && r != 0 && ((r < 0) != (*cb < 0))) r += *cb;
                    return Expr(r);
                  }
                  Interval ia = bound_of(in[0], b), ib = bound_of(in[1], b);
                  if (ia.lo && *ia.lo >= 0 && ib.lo && *ib.lo > 0) return simplify(mod(in[0], in[1]), b);
                  return std::nullopt;
                }));
  add_op(binary("PRelu", same_as_inputs(), [](const Node&, const Expr& x, const Expr& slope) -> Result<Expr> {
    return select(lt(x, c_of(x, 0)), mul(slope, x), x);
  }));
  add_op(binary("BitShift", same_as_inputs(), bitshift));
  add_op(binary("BitwiseAnd", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return call("bitand", a.dtype(), {a, b});
  }));
  add_op(binary("BitwiseOr", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return call("bitor", a.dtype(), {a, b});
  }));
  add_op(binary("BitwiseXor", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return call("bitxor", a.dtype(), {a, b});
  }));

  // ---- comparisons and logic ----
  add_op(binary("Equal", bool_result(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return eq(a, b);
  }, sym_cmp([](int64_t a, int64_t b) { return a == b; })));
  add_op(binary("Less", bool_result(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return lt(a, b);
  }, sym_cmp([](int64_t a, int64_t b) { return a < b; })));
  add_op(binary("Greater", bool_result(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return gt(a, b);
  }, sym_cmp([](int64_t a, int64_t b) { return a > b; })));
  add_op(binary("LessOrEqual", bool_result(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return le(a, b);
  }, sym_cmp([](int64_t a, int64_t b) { return a <= b; })));
  add_op(binary("GreaterOrEqual", bool_result(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return ge(a, b);
  }, sym_cmp([](int64_t a, int64_t b) { return a >= b; })));
  auto bool_sym = [](std::function<bool(bool, bool)> f) -> SymFn {
    return [f](const Node&, const std::vector<Expr>& in, const SymbolBounds&) -> std::optional<Expr> {
      auto a = in[0].as_const(), b = in[1].as_const();
      if (!a || !b) return std::nullopt;
      return Expr(f(*a != 0, *b != 0) ? 1 : 0);
    };
  };
  // Both operands are read at the element's own index, always in bounds:
  // bitwise on the bools, so neither waits on the other (a short-circuit
  // logical_and with a load on its right branches per element, which keeps
  // a loop from vectorizing).
  add_op(binary("And", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return call("bitand", DType::kBool, {a, b});
  }, bool_sym([](bool a, bool b) { return a && b; })));
  add_op(binary("Or", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return call("bitor", DType::kBool, {a, b});
  }, bool_sym([](bool a, bool b) { return a || b; })));
  add_op(binary("Xor", same_as_inputs(), [](const Node&, const Expr& a, const Expr& b) -> Result<Expr> {
    return xor_bool(a, b);
  }, bool_sym([](bool a, bool b) { return a != b; })));
  {
    Elementwise where;
    where.name = "Where";
    where.min_inputs = where.max_inputs = 3;
    where.gradient = grad_where;
    where.type = [](const Node& n, const std::vector<DType>& in) -> Result<DType> {
      if (in[0] != DType::kBool) return node_invalid(n) << "condition must be bool";
      if (in[1] != in[2]) return node_invalid(n) << "X and Y dtypes differ";
      return in[1];
    };
    where.body = [](const Node&, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
      return select(in[0], in[1], in[2]);
    };
    where.sym = [](const Node&, const std::vector<Expr>& in, const SymbolBounds&) -> std::optional<Expr> {
      auto c = in[0].as_const();
      if (!c) return std::nullopt;
      return *c != 0 ? in[1] : in[2];
    };
    add_op(std::move(where));
  }

  // ---- variadic ----
  add_op(with_gradient(variadic("Sum", [](const Expr& a, const Expr& b) { return add(a, b); },
                                sym_arith([](const Expr& a, const Expr& b) { return add(a, b); })),
                       [](GradBuilder& b) -> Status {
                         for (size_t i = 0; i < b.node().num_inputs(); ++i) KILN_RETURN_IF_ERROR(b.give(i, b.output_grad(0)));
                         return Status::ok();
                       }));
  add_op(with_gradient(variadic("Max", [](const Expr& a, const Expr& b) { return max(a, b); },
                                sym_arith([](const Expr& a, const Expr& b) { return max(a, b); })),
                       [](GradBuilder& b) { return grad_extremum(b, true); }));
  add_op(with_gradient(variadic("Min", [](const Expr& a, const Expr& b) { return min(a, b); },
                                sym_arith([](const Expr& a, const Expr& b) { return min(a, b); })),
                       [](GradBuilder& b) { return grad_extremum(b, false); }));
  {
    Elementwise mean = variadic("Mean", [](const Expr& a, const Expr& b) { return add(a, b); });
    mean.gradient = [](GradBuilder& b) -> Status {
      Value* gy = b.output_grad(0);
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {gy, b.scalar(1.0 / static_cast<double>(b.node().num_inputs()), gy)}));
      for (size_t i = 0; i < b.node().num_inputs(); ++i) KILN_RETURN_IF_ERROR(b.give(i, g));
      return Status::ok();
    };
    mean.body = [](const Node& n, const std::vector<Expr>& in, DType, LowerContext&) -> Result<Expr> {
      KILN_RETURN_IF_ERROR(check_float(n, in[0]));
      Expr acc = in[0];
      for (size_t i = 1; i < in.size(); ++i) acc = add(acc, in[i]);
      return div(acc, c_of(acc, static_cast<double>(in.size())));
    };
    add_op(std::move(mean));
  }
  return ops;
}

// Dropout that drops nothing: no training_mode, a constant false one, or a
// constant true one with a constant ratio of 0 (scale 1 / (1 - 0); some
// exporters emit it). Compiled: output 0 = input, optional output 1 (mask)
// all true. Any other Dropout runs random.cc's kernel, which reads
// training_mode and ratio at run time.
bool dropout_is_identity(const Node& n) {
  if (!has_input(n, 2)) return true;
  if (!n.input(2)->is_constant()) return false;
  const Tensor& training = n.input(2)->constant();
  if (training.numel() != 1 || training.get_f64(0) == 0) return training.numel() == 1;
  return has_input(n, 1) && n.input(1)->is_constant() && n.input(1)->constant().numel() == 1 &&
         n.input(1)->constant().get_f64(0) == 0;
}

// Dropout: the identity where it is one (inference); in training, dy times
// the node's own mask and 1 / (1 - ratio) (the mask must be an output: it
// cannot be drawn again).
Status grad_dropout(GradBuilder& b) {
  const Node& n = b.node();
  if (!b.wants(0)) return Status::ok();
  Value* dy = b.output_grad(0);
  if (dropout_is_identity(n)) return b.set_input_grad(0, dy);
  Value* mask = n.num_outputs() > 1 ? n.output(1) : nullptr;
  if (mask == nullptr || !has_input(n, 1) || !n.input(1)->is_constant())
    return node_unsupported(n) << "the gradient of a training-mode Dropout needs its mask output and a constant ratio";
  const double ratio = n.input(1)->constant().get_f64(0);
  KILN_ASSIGN_OR_RETURN(Value* kept, b.add1("Where", {mask, dy, b.scalar(0, dy)}));
  KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {kept, b.scalar(1.0 / (1.0 - ratio), dy)}));
  return b.set_input_grad(0, g);
}

void register_dropout() {
  OpDef def;
  def.name = "Dropout";
  def.gradient = grad_dropout;
  def.is_elementwise = true;
  def.kernel = dropout_training_kernel;
  def.runs_kernel = [](const Node& n) { return !dropout_is_identity(n); };
  def.infer = [](Node& n, InferContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, 0));
    for (size_t i : {1, 2}) {
      if (!has_input(n, i)) continue;
      KILN_ASSIGN_OR_RETURN(TensorType p, input_type(n, i));
      if (p.has_shape() && p.rank() != 0 && !(p.rank() == 1 && (*p.shape)[0].as_const() == std::optional<int64_t>(1)))
        return node_invalid(n) << (i == 1 ? "ratio" : "training_mode") << " must be a scalar, got " << p.to_string();
    }
    if (t.has_shape()) {
      set_output(n, 0, t.dtype, *t.shape, ctx);
      if (n.num_outputs() > 1) set_output(n, 1, DType::kBool, *t.shape, ctx);
    } else {
      set_output_unknown_rank(n, 0, t.dtype);
      if (n.num_outputs() > 1) set_output_unknown_rank(n, 1, DType::kBool);
    }
    return Status::ok();
  };
  def.lower = [](const Node& n, LowerContext& ctx) -> Result<std::vector<tir::ComputeDef>> {
    KILN_RETURN_IF_ERROR(check_compilable(n, ctx));
    std::vector<tir::ComputeDef> stages;
    const tir::Buffer& out = ctx.outputs[0];
    std::vector<std::string> axes = fresh_axes(ctx, out.shape.size());
    stages.push_back(make_stage(out.name, out.dtype, axes, out.shape, ctx.load_input(0, axis_vars(axes))));
    if (ctx.outputs.size() > 1 && !ctx.outputs[1].name.empty()) {
      const tir::Buffer& mask = ctx.outputs[1];
      stages.push_back(make_stage(mask.name, DType::kBool, fresh_axes(ctx, mask.shape.size()), mask.shape,
                                  bool_imm(true)));
    }
    return stages;
  };
  register_op(std::move(def));
}

}  // namespace

void register_elementwise_ops() {
  for (Elementwise& e : elementwise_ops()) register_elementwise(std::move(e));
  register_dropout();
}

}  // namespace kiln::ops
