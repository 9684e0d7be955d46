// Matrix products: MatMul (numpy semantics: batch dims broadcast, 1-D
// operands promoted and their unit dim removed), Gemm (transA, transB, alpha,
// beta, optional C broadcast to [M, N]) and Einsum (explicit or implicit
// output, ellipsis with broadcasting, repeated labels as diagonals). Each
// lowers to one sum reduction; Gemm's scaling and bias are the stage's finalize.
//
// MatMul and Gemm also accept the internal attribute kiln_weight_layout =
// "P<nr>" (set by the strategy's gemm.packed candidate, src/strategy/gemm.cc):
// the constant B is stored as panels [N / nr, K, nr] (Bp[j, k, i] = B[k, j nr + i],
// transB already applied; zero columns past N, whose value is then the int
// attribute kiln_b_columns), so a tile of nr output columns reads one
// contiguous panel. The logical B is [K, N] for inference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/common.h"

namespace kiln::ops {

namespace {
// Index into a batch dim `d` of an operand for output batch index `i` whose
// extent is `out_d`: 0 for a unit dim, `i` when equal, `i mod d` when it may be either.
Expr batch_index(const Expr& i, const Expr& d, const Expr& out_d) {
  auto c = d.as_const();
  if (c && *c == 1) return Expr(0);
  if (c || prove_equal(d, out_d)) return i;
  return mod(i, d);
}
}  // namespace

MatMulIndices matmul_indices(LowerContext& ctx, const tir::Buffer& a, const tir::Buffer& b, const tir::Buffer& y) {
  MatMulIndices mi;
  bool a_vec = a.shape.size() == 1, b_vec = b.shape.size() == 1;
  size_t out_rank = y.shape.size();
  size_t batch_rank = out_rank - (a_vec ? 0 : 1) - (b_vec ? 0 : 1);
  mi.axes = fresh_axes(ctx, out_rank, "i");
  std::vector<Expr> iv = axis_vars(mi.axes);
  mi.k = ctx.fresh("k");
  Expr kv = var(mi.k);
  mi.m = a_vec ? Expr(0) : iv[batch_rank];
  mi.n = b_vec ? Expr(0) : iv[out_rank - 1];
  size_t a_batch = a_vec ? 0 : a.shape.size() - 2;
  size_t b_batch = b_vec ? 0 : b.shape.size() - 2;
  for (size_t d = 0; d < a_batch; ++d) {
    size_t o = batch_rank - a_batch + d;
    mi.a.push_back(batch_index(iv[o], a.shape[d], y.shape[o]));
  }
  for (size_t d = 0; d < b_batch; ++d) {
    size_t o = batch_rank - b_batch + d;
    mi.b.push_back(batch_index(iv[o], b.shape[d], y.shape[o]));
  }
  if (!a_vec) mi.a.push_back(mi.m);
  mi.a.push_back(kv);
  mi.b.push_back(kv);
  if (!b_vec) mi.b.push_back(mi.n);
  return mi;
}

namespace {

// The panel width of a B stored as panels (kiln_weight_layout "P<nr>"); 0
// when B is stored as the op defines it.
Result<int64_t> b_panel_width(const Node& n) {
  if (!n.has_attr("kiln_weight_layout")) return 0;
  std::string layout = n.attr_string("kiln_weight_layout", "");
  int64_t nr = 0;
  if (layout.size() >= 2 && layout[0] == 'P' && layout.size() < 8 &&
      layout.find_first_not_of("0123456789", 1) == std::string::npos)
    nr = std::stoll(layout.substr(1));
  if (nr <= 0) return node_invalid(n) << "unknown kiln_weight_layout '" << layout << "'";
  return nr;
}

// B's logical shape ([K, N], or [N, K] for Gemm with transB) from its stored panels [P, K, nr].
Result<Shape> logical_b_shape(const Node& n, Shape stored, bool gemm_trans_b) {
  KILN_ASSIGN_OR_RETURN(int64_t nr, b_panel_width(n));
  if (nr == 0) return stored;
  if (stored.size() != 3) return node_invalid(n) << "B stored as panels must have rank 3";
  Expr k = stored[1], cols = stored[0] * Expr(nr);
  // Panels padded past N: the true N is kept in kiln_b_columns, within the last panel.
  if (n.has_attr("kiln_b_columns")) {
    int64_t c = n.attr_int("kiln_b_columns", 0);
    auto panels = stored[0].as_const();
    if (!panels || c <= (*panels - 1) * nr || c > *panels * nr)
      return node_invalid(n) << "kiln_b_columns " << c << " does not fit B's panels " << shape_to_string(stored);
    cols = Expr(c);
  }
  if (gemm_trans_b) return Shape{cols, k};
  return Shape{k, cols};
}


Status infer_matmul(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType at, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape a, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape stored_b, input_shape(n, 1));
  KILN_ASSIGN_OR_RETURN(Shape b, logical_b_shape(n, stored_b, false));
  if (a.empty() || b.empty()) return node_invalid(n) << "operands must have rank >= 1";
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), Expr(1));
  if (b_vec) b.push_back(Expr(1));
  Expr ka = a[a.size() - 1], kb = b[b.size() - 2];
  auto ca = simplify(ka, ctx.bounds).as_const(), cb = simplify(kb, ctx.bounds).as_const();
  if (ca && cb && *ca != *cb) {
    return node_invalid(n) << "inner dims differ: " << shape_to_string(*n.input(0)->type().shape) << " x "
                           << shape_to_string(*n.input(1)->type().shape);
  }
  Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  KILN_ASSIGN_OR_RETURN(Shape out, broadcast_all(n, {a_batch, b_batch}, ctx.bounds));
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b[b.size() - 1]);
  set_output(n, 0, at.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_matmul(const Node& n, LowerContext& ctx) {
  const tir::Buffer& a = ctx.inputs[0];
  tir::Buffer b = ctx.inputs[1];
  const tir::Buffer& y = ctx.outputs[0];
  KILN_ASSIGN_OR_RETURN(int64_t nr, b_panel_width(n));
  if (nr > 0) {
    KILN_ASSIGN_OR_RETURN(b.shape, logical_b_shape(n, b.shape, false));
  }
  MatMulIndices mi = matmul_indices(ctx, a, b, y);
  if (nr > 0) mi.b = {floordiv(mi.n, Expr(nr)), mi.b[0], mod(mi.n, Expr(nr))};
  Expr body = ctx.load_input(0, mi.a) * ctx.load_input(1, mi.b);
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_reduce_stage(y.name, y.dtype, mi.axes, y.shape, {mi.k}, {a.shape.back()},
                                     tir::Combiner::kSum, const_of(y.dtype, 0), body));
  return stages;
}

// ---- Gemm ----------------------------------------------------------------------------

Status infer_gemm(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType at, input_type(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape a, input_shape(n, 0));
  KILN_ASSIGN_OR_RETURN(Shape stored_b, input_shape(n, 1));
  bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  KILN_ASSIGN_OR_RETURN(Shape b, logical_b_shape(n, stored_b, tb));
  if (a.size() != 2 || b.size() != 2) return node_invalid(n) << "A and B must be 2-D";
  Expr m = ta ? a[1] : a[0];
  Expr ka = ta ? a[0] : a[1];
  Expr kb = tb ? b[1] : b[0];
  Expr nn = tb ? b[0] : b[1];
  auto ca = simplify(ka, ctx.bounds).as_const(), cb = simplify(kb, ctx.bounds).as_const();
  if (ca && cb && *ca != *cb) return node_invalid(n) << "inner dims differ: " << *ca << " vs " << *cb;
  Shape out = {m, nn};
  if (has_input(n, 2)) {
    KILN_ASSIGN_OR_RETURN(Shape c, input_shape(n, 2));
    if (c.size() > 2) return node_invalid(n) << "C has rank " << c.size() << " > 2";
    KILN_ASSIGN_OR_RETURN(Shape bc, broadcast_all(n, {out, c}, ctx.bounds));
    (void)bc;  // C broadcasts to [M, N] (checked); the output keeps [M, N].
  }
  set_output(n, 0, at.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_gemm(const Node& n, LowerContext& ctx) {
  const tir::Buffer& a = ctx.inputs[0];
  const tir::Buffer& y = ctx.outputs[0];
  DType dt = y.dtype;
  bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  double alpha = n.attr_float("alpha", 1.0), beta = n.attr_float("beta", 1.0);
  std::vector<std::string> axes = fresh_axes(ctx, 2, "i");
  std::vector<Expr> iv = axis_vars(axes);
  std::string k = ctx.fresh("k");
  Expr kv = var(k);
  Expr av = ta ? ctx.load_input(0, {kv, iv[0]}) : ctx.load_input(0, {iv[0], kv});
  KILN_ASSIGN_OR_RETURN(int64_t nr, b_panel_width(n));
  Expr bv = nr > 0 ? ctx.load_input(1, {floordiv(iv[1], Expr(nr)), kv, mod(iv[1], Expr(nr))})
            : tb   ? ctx.load_input(1, {iv[1], kv})
                   : ctx.load_input(1, {kv, iv[1]});
  Expr kext = ta ? a.shape[0] : a.shape[1];
  Expr acc = var("acc", dt);
  Expr finalize;
  bool has_c = has_input(n, 2) && beta != 0.0;
  if (!dtype_is_float(dt) && ((alpha != 1.0 && alpha != std::trunc(alpha)) || (has_c && beta != std::trunc(beta)))) {
    // Integer Gemm with a fractional alpha or beta: the scaling in f64 and
    // one conversion back (truncating), as the ONNX reference computes it;
    // alpha cast to the integer type first made 0.25 * A B zero.
    Expr f = const_of(DType::kFloat64, alpha) * cast(DType::kFloat64, acc);
    if (has_c) f = f + const_of(DType::kFloat64, beta) * cast(DType::kFloat64, load_broadcast(ctx, 2, iv, y.shape));
    finalize = cast(dt, f);
  } else {
    if (alpha != 1.0) finalize = const_of(dt, alpha) * acc;
    if (has_c) {
      Expr c = load_broadcast(ctx, 2, iv, y.shape);
      if (beta != 1.0) c = const_of(dt, beta) * c;
      finalize = (finalize.defined() ? finalize : acc) + c;
    }
  }
  std::vector<tir::ComputeDef> stages;
  stages.push_back(make_reduce_stage(y.name, dt, axes, y.shape, {k}, {kext}, tir::Combiner::kSum, const_of(dt, 0),
                                     av * bv, finalize));
  return stages;
}


// ---- Einsum ----------------------------------------------------------------------------

// Labels: letters by their character code; the dims covered by an ellipsis
// get labels kEllipsisLabel + j, right-aligned across inputs (numpy broadcasting).
constexpr int kEllipsisLabel = 256;

struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  // labels per input dim
  std::vector<int> output;               // labels per output dim
  std::vector<int> reduced;              // labels summed over, in order of first appearance
  std::map<int, Expr> dims;              // extent per label
};

Result<EinsumSpec> parse_einsum(const Node& n, const std::vector<Shape>& shapes, const SymbolBounds& bounds) {
  std::string eq;
  for (char c : n.attr_string("equation", "")) {
    if (c != ' ') eq.push_back(c);
  }
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != shapes.size()) {
    return node_invalid(n) << "equation '" << eq << "' has " << terms.size() << " terms for " << shapes.size()
                           << " inputs";
  }
  auto is_label = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  // Ellipsis rank per input, and the broadcast ellipsis rank.
  std::vector<int64_t> ell(terms.size(), 0);
  int64_t ell_rank = 0;
  bool any_ellipsis = false;
  for (size_t k = 0; k < terms.size(); ++k) {
    int64_t letters = 0;
    for (char c : terms[k]) letters += is_label(c) ? 1 : 0;
    bool has_ell = terms[k].find("...") != std::string::npos;
    int64_t rank = static_cast<int64_t>(shapes[k].size());
    if (has_ell) {
      any_ellipsis = true;
      ell[k] = rank - letters;
      if (ell[k] < 0) return node_invalid(n) << "term '" << terms[k] << "' does not fit rank " << rank;
    } else if (letters != rank) {
      return node_invalid(n) << "term '" << terms[k] << "' does not fit rank " << rank;
    }
    ell_rank = std::max(ell_rank, ell[k]);
  }
  EinsumSpec spec;
  std::map<int, int> count;
  std::vector<int> order;
  auto expand_term = [&](const std::string& t, int64_t e_rank) -> Result<std::vector<int>> {
    std::vector<int> labels;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 3, "...") == 0) {
        for (int64_t j = 0; j < e_rank; ++j) labels.push_back(kEllipsisLabel + static_cast<int>(ell_rank - e_rank + j));
        i += 2;
      } else if (is_label(t[i])) {
        labels.push_back(static_cast<int>(static_cast<unsigned char>(t[i])));
      } else {
        return node_invalid(n) << "bad character '" << t[i] << "' in equation '" << eq << "'";
      }
    }
    return labels;
  };
  for (size_t k = 0; k < terms.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(std::vector<int> labels, expand_term(terms[k], ell[k]));
    for (size_t d = 0; d < labels.size(); ++d) {
      int l = labels[d];
      if (count[l]++ == 0) order.push_back(l);
      Expr dim = simplify(shapes[k][d], bounds);
      auto c = dim.as_const();
      auto it = spec.dims.find(l);
      if (it == spec.dims.end()) {
        spec.dims[l] = dim;
      } else if (!(c && *c == 1)) {
        auto prev = it->second.as_const();
        if (prev && *prev == 1) {
          it->second = dim;
        } else if (c && prev && *c != *prev) {
          return node_invalid(n) << "label dims differ (" << *prev << " vs " << *c << ") in '" << eq << "'";
        }
      }
    }
    spec.inputs.push_back(std::move(labels));
  }
  if (arrow != std::string::npos) {
    KILN_ASSIGN_OR_RETURN(spec.output, expand_term(eq.substr(arrow + 2), ell_rank));
  } else {
    if (any_ellipsis) {
      for (int64_t j = 0; j < ell_rank; ++j) spec.output.push_back(kEllipsisLabel + static_cast<int>(j));
    }
    std::vector<int> once;
    for (const auto& [l, c] : count) {
      if (c == 1 && l < kEllipsisLabel) once.push_back(l);
    }
    std::sort(once.begin(), once.end());
    spec.output.insert(spec.output.end(), once.begin(), once.end());
  }
  for (size_t i = 0; i < spec.output.size(); ++i) {
    if (!spec.dims.count(spec.output[i])) return node_invalid(n) << "output label not in any input: '" << eq << "'";
    for (size_t j = 0; j < i; ++j) {
      if (spec.output[j] == spec.output[i]) return node_invalid(n) << "repeated output label in '" << eq << "'";
    }
  }
  for (int l : order) {
    if (std::find(spec.output.begin(), spec.output.end(), l) == spec.output.end()) spec.reduced.push_back(l);
  }
  return spec;
}

Status infer_einsum(Node& n, InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t0, input_type(n, 0));
  std::vector<Shape> shapes;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(Shape s, input_shape(n, i));
    shapes.push_back(std::move(s));
  }
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(n, shapes, ctx.bounds));
  Shape out;
  for (int l : spec.output) out.push_back(spec.dims[l]);
  set_output(n, 0, t0.dtype, std::move(out), ctx);
  return Status::ok();
}

Result<std::vector<tir::ComputeDef>> lower_einsum(const Node& n, LowerContext& ctx) {
  const tir::Buffer& y = ctx.outputs[0];
  std::vector<Shape> shapes;
  for (const tir::Buffer& b : ctx.inputs) shapes.emplace_back(b.shape.begin(), b.shape.end());
  KILN_ASSIGN_OR_RETURN(EinsumSpec spec, parse_einsum(n, shapes, {}));
  std::map<int, Expr> index;
  std::vector<std::string> axes = fresh_axes(ctx, spec.output.size(), "i");
  for (size_t k = 0; k < axes.size(); ++k) index[spec.output[k]] = var(axes[k]);
  std::vector<std::string> raxes = fresh_axes(ctx, spec.reduced.size(), "k");
  std::vector<Expr> rext;
  for (size_t k = 0; k < raxes.size(); ++k) {
    index[spec.reduced[k]] = var(raxes[k]);
    rext.push_back(spec.dims[spec.reduced[k]]);
  }
  Expr body;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    std::vector<Expr> idx;
    for (size_t d = 0; d < spec.inputs[i].size(); ++d) {
      int l = spec.inputs[i][d];
      auto c = simplify(shapes[i][d]).as_const();
      auto full = simplify(spec.dims[l]).as_const();
      bool broadcast = c && *c == 1 && !(full && *full == 1);
      idx.push_back(broadcast ? Expr(0) : index[l]);
    }
    Expr v = cast_if_needed(y.dtype, ctx.load_input(i, idx));
    body = body.defined() ? body * v : v;
  }
  std::vector<tir::ComputeDef> stages;
  if (raxes.empty()) {
    stages.push_back(make_stage(y.name, y.dtype, axes, y.shape, body));
  } else {
    stages.push_back(make_reduce_stage(y.name, y.dtype, axes, y.shape, raxes, rext, tir::Combiner::kSum,
                                       const_of(y.dtype, 0), body));
  }
  return stages;
}
// A's inner dim against B's (MatMul: B's second-to-last; Gemm: by transA
// and transB) when inference could not prove them
// equal: checked at run time, exactly, before the kernel reads both.
std::vector<DimCheck> inner_dim_checks(const Node& n, const SymbolBounds& bounds, bool gemm) {
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  if (a == nullptr || b == nullptr || !a->type().shape || !b->type().shape) return {};
  const Shape& as = *a->type().shape;
  bool tb = gemm && n.attr_int("transB", 0) != 0;
  auto logical = logical_b_shape(n, *b->type().shape, tb);
  if (!logical.is_ok() || as.empty() || logical->empty()) return {};
  const Shape& bs = *logical;
  int64_t a_axis = gemm ? (n.attr_int("transA", 0) != 0 ? 0 : 1) : static_cast<int64_t>(as.size()) - 1;
  size_t b_index = gemm ? (tb ? 1 : 0) : bs.size() == 1 ? 0 : bs.size() - 2;
  if (b_index >= bs.size()) return {};
  if (a_axis < 0 || static_cast<size_t>(a_axis) >= as.size()) return {};
  const Expr& ka = as[static_cast<size_t>(a_axis)];
  const Expr& kb = bs[b_index];
  if (prove_equal(ka, kb, bounds)) return {};
  return {DimCheck{0, a_axis, ka, kb, true}};
}

// Y = A B (batched, broadcast batch dims): dA = dY B^T, dB = A^T dY, each
// summed over the batch dims its operand was broadcast along (for a matrix B
// and A of the output's rank, one product over the flattened batch).
// A 1-D operand (numpy's rule: a vector A is a row, a vector B a column,
// the unit dim dropped from the result): outer products where the vector's
// partner is a matrix, sums over what the vector was broadcast along.
Status grad_matmul_vector(GradBuilder& b) {
  const Node& n = b.node();
  Value* a = n.input(0);
  Value* bm = n.input(1);
  Value* gy = b.output_grad(0);
  const int64_t ra = a->type().rank(), rb = bm->type().rank(), ry = gy->type().rank();
  if (ra < 1 || rb < 1 || ry < 0) return node_unsupported(n) << "the gradient of a MatMul of unknown rank";
  auto sum_to_vector = [&](Value* x, int64_t rank) -> Result<Value*> {
    // Every axis but the last summed away: [..., K] -> [K].
    if (rank == 1) return x;
    std::vector<int64_t> axes;
    for (int64_t d = 0; d + 1 < rank; ++d) axes.push_back(d);
    return b.reduce_sum(x, axes, false);
  };
  if (ra == 1 && rb == 1) {  // y = a . b, a scalar
    if (b.wants(0)) {
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {bm, gy}));
      KILN_RETURN_IF_ERROR(b.set_input_grad(0, g));
    }
    if (b.wants(1)) {
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Mul", {a, gy}));
      KILN_RETURN_IF_ERROR(b.set_input_grad(1, g));
    }
    return Status::ok();
  }
  if (ra == 1) {  // y[..., N] = a[K] B[..., K, N]
    KILN_ASSIGN_OR_RETURN(Value* gcol, b.unsqueeze(gy, {ry}));  // [..., N, 1]
    if (b.wants(0)) {
      KILN_ASSIGN_OR_RETURN(Value* p, b.add1("MatMul", {bm, gcol}));  // [..., K, 1]
      KILN_ASSIGN_OR_RETURN(Value* sq, b.add1("Squeeze", {p, b.ints({rb - 1})}));
      KILN_ASSIGN_OR_RETURN(Value* g, sum_to_vector(sq, rb - 1));
      KILN_RETURN_IF_ERROR(b.set_input_grad(0, g));
    }
    if (b.wants(1)) {
      KILN_ASSIGN_OR_RETURN(Value* acol, b.unsqueeze(a, {1}));          // [K, 1]
      KILN_ASSIGN_OR_RETURN(Value* grow, b.unsqueeze(gy, {ry - 1}));    // [..., 1, N]
      KILN_ASSIGN_OR_RETURN(Value* g, b.add1("MatMul", {acol, grow}));  // [..., K, N]
      KILN_RETURN_IF_ERROR(b.set_input_grad(1, g));
    }
    return Status::ok();
  }
  // y[..., M] = A[..., M, K] b[K]
  KILN_ASSIGN_OR_RETURN(Value* gcol, b.unsqueeze(gy, {ry}));  // [..., M, 1]
  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* brow, b.unsqueeze(bm, {0}));          // [1, K]
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("MatMul", {gcol, brow}));  // [..., M, K]
    KILN_RETURN_IF_ERROR(b.set_input_grad(0, g));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* prod, b.add1("Mul", {a, gcol}));  // [..., M, K]
    KILN_ASSIGN_OR_RETURN(Value* g, sum_to_vector(prod, ra));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, g));
  }
  return Status::ok();
}

Status grad_matmul(GradBuilder& b) {
  const Node& n = b.node();
  Value* a = n.input(0);
  Value* bm = n.input(1);
  Value* gy = b.output_grad(0);
  if ((a->type().rank() == 1 || bm->type().rank() == 1) && n.output(0)->type().has_shape())
    return grad_matmul_vector(b);
  if (a->type().rank() < 2 || bm->type().rank() < 2 || !n.output(0)->type().has_shape())
    return node_unsupported(n) << "the gradient of a MatMul of unknown rank";
  const Shape& ys = *n.output(0)->type().shape;
  const int64_t r = static_cast<int64_t>(ys.size());
  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* bt, b.transpose_last2(bm, bm->type().rank()));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("MatMul", {gy, bt}));
    Shape full(ys.begin(), ys.end() - 1);
    full.push_back(a->type().shape->back());
    KILN_RETURN_IF_ERROR(b.give(0, g, &full));
  }
  if (b.wants(1) && bm->type().rank() == 2 && a->type().rank() > 2 && a->type().rank() == r) {
    // B shared by every matrix of A (a Linear layer over [batch, seq, K]):
    // dB = A^T dY with the batch dims folded into the reduction, one product
    // of [K, B M] and [B M, N], instead of a product per matrix summed after.
    const int64_t axis = a->type().rank() - 1;
    KILN_ASSIGN_OR_RETURN(Value* a2, b.add1("Flatten", {a}, {{"axis", Attribute::of_int(axis)}}));
    KILN_ASSIGN_OR_RETURN(Value* gy2, b.add1("Flatten", {gy}, {{"axis", Attribute::of_int(r - 1)}}));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("Gemm", {a2, gy2}, {{"transA", Attribute::of_int(1)}}));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, g));
  } else if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* at, b.transpose_last2(a, a->type().rank()));
    KILN_ASSIGN_OR_RETURN(Value* g, b.add1("MatMul", {at, gy}));
    Shape full(ys.begin(), ys.end() - 2);
    full.push_back((*bm->type().shape)[static_cast<size_t>(bm->type().rank() - 2)]);
    full.push_back(ys[static_cast<size_t>(r - 1)]);
    KILN_RETURN_IF_ERROR(b.give(1, g, &full));
  }
  return Status::ok();
}

// Y = alpha A' B' + beta C (A' = A or A^T, B' likewise): dA' = alpha dY B'^T,
// dB' = alpha A'^T dY, each transposed back, as Gemms; dC = beta dY, summed
// to C's shape.
Status grad_gemm(GradBuilder& b) {
  const Node& n = b.node();
  Value* a = n.input(0);
  Value* bm = n.input(1);
  Value* gy = b.output_grad(0);
  const int64_t ta = n.attr_int("transA", 0), tb = n.attr_int("transB", 0);
  const double alpha = n.attr_float("alpha", 1.0), beta = n.attr_float("beta", 1.0);
  auto gemm = [&](Value* x, Value* y, int64_t tx, int64_t ty) {
    return b.add1("Gemm", {x, y}, {{"alpha", Attribute::of_float(alpha)}, {"transA", Attribute::of_int(tx)},
                                   {"transB", Attribute::of_int(ty)}});
  };
  if (b.wants(0)) {
    KILN_ASSIGN_OR_RETURN(Value* g, ta ? gemm(bm, gy, tb, 1) : gemm(gy, bm, 0, 1 - tb));
    KILN_RETURN_IF_ERROR(b.set_input_grad(0, g));
  }
  if (b.wants(1)) {
    KILN_ASSIGN_OR_RETURN(Value* g, tb ? gemm(gy, a, 1, ta) : gemm(a, gy, 1 - ta, 0));
    KILN_RETURN_IF_ERROR(b.set_input_grad(1, g));
  }
  if (n.num_inputs() > 2 && n.input(2) != nullptr && b.wants(2)) {
    Value* g = gy;
    if (beta != 1.0) {
      KILN_ASSIGN_OR_RETURN(g, b.add1("Mul", {gy, b.scalar(beta, gy)}));
    }
    KILN_RETURN_IF_ERROR(b.give(2, g));
  }
  return Status::ok();
}

}  // namespace

void register_matmul_ops() {
  OpDef matmul;
  matmul.name = "MatMul";
  matmul.infer = infer_matmul;
  matmul.lower = lower_matmul;
  matmul.dim_checks = [](const Node& n, const SymbolBounds& b) { return inner_dim_checks(n, b, false); };
  matmul.gradient = grad_matmul;
  register_op(std::move(matmul));

  OpDef gemm;
  gemm.name = "Gemm";
  gemm.infer = infer_gemm;
  gemm.lower = lower_gemm;
  gemm.dim_checks = [](const Node& n, const SymbolBounds& b) { return inner_dim_checks(n, b, true); };
  gemm.gradient = grad_gemm;
  register_op(std::move(gemm));

  OpDef einsum;
  einsum.name = "Einsum";
  einsum.infer = infer_einsum;
  einsum.lower = lower_einsum;
  register_op(std::move(einsum));
}

}  // namespace kiln::ops
