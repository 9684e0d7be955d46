#include "ops/registry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "ops/common.h"
#include "ops/onnx_schema.h"

namespace kiln::ops {

namespace {

// Ops keyed by "name" (ai.onnx) or "domain:name".
std::map<std::string, OpDef>& registry() {
  static std::map<std::string, OpDef> ops;
  return ops;
}

std::string op_key(const std::string& domain, const std::string& name) {
  if (domain.empty() || domain == "ai.onnx") return name;
  return domain + ":" + name;
}

// Small integer constants carry their values as sym_values so that shape
// arithmetic over them can be followed symbolically.
constexpr int64_t kMaxSymValueElements = 64;

void seed_sym_value(Value* v) {
  if (v == nullptr || !v->is_constant() || v->sym_value().has_value()) return;
  const Tensor& t = v->constant();
  if (t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32) return;
  if (t.numel() > kMaxSymValueElements) return;
  std::vector<Expr> vals;
  vals.reserve(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) vals.push_back(Expr(t.get_i64(i)));
  v->set_sym_value(std::move(vals));
}

}  // namespace

// ---- InferContext / LowerContext --------------------------------------------

Expr InferContext::fresh_symbol(std::optional<int64_t> upper) {
  std::string name = "_d" + std::to_string(next_fresh++);
  while (bounds.count(name) != 0) name = "_d" + std::to_string(next_fresh++);
  bounds[name] = Interval{0, upper};
  return var(name);
}

Expr LowerContext::load_input(size_t i, std::vector<Expr> indices) const {
  bool present = i < inputs.size() && !inputs[i].name.empty();
  if (!present && ExprErrorTrap::record("load of omitted input " + std::to_string(i))) return Expr();
  KILN_CHECK(present) << "load of missing input " << i;
  int idx = i < input_index.size() ? input_index[i] : -1;
  return load(inputs[i].name, idx, inputs[i].dtype, std::move(indices));
}

std::string LowerContext::fresh(const std::string& prefix) {
  static int fallback = 0;
  int* counter = name_counter != nullptr ? name_counter : &fallback;
  return prefix + std::to_string((*counter)++);
}

// ---- Registry -----------------------------------------------------------------

void register_op(OpDef def) {
  std::string key = op_key(def.domain, def.name);
  KILN_CHECK(registry().count(key) == 0) << "op registered twice: " << key;
  registry().emplace(std::move(key), std::move(def));
}

void extend_op(const std::string& domain, const std::string& name, const std::function<void(OpDef&)>& amend) {
  auto it = registry().find(op_key(domain, name));
  KILN_CHECK(it != registry().end()) << "extend_op before " << op_key(domain, name) << " was registered";
  amend(it->second);
}

void register_all_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_elementwise_ops();
    register_reduce_ops();
    register_norm_ops();
    register_conv_ops();
    register_pool_ops();
    register_matmul_ops();
    register_shape_ops();
    register_indexing_ops();
    register_control_flow_ops();
    register_loss_ops();
    register_rnn_ops();
    register_quant_ops();
    register_misc_ops();
    register_layout_ops();
    register_conv_grad_ops();
    register_collective_ops();
    register_signal_ops();
    register_detection_ops();
    register_random_ops();
    register_string_ops();  // after elementwise: extends Cast, CastLike and Equal
    register_image_ops();
    register_ml_ops();
    register_optimizer_ops();
    register_sequence_ops();
  });
}

const OpDef* find_op(const std::string& domain, const std::string& name) {
  register_all_ops();
  auto it = registry().find(op_key(domain, name));
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_op_names() {
  register_all_ops();
  std::vector<std::string> names;
  for (const auto& [key, def] : registry()) names.push_back(key);
  std::sort(names.begin(), names.end());
  return names;
}

Status infer_node(Node& n, InferContext& ctx) {
  for (Value* in : n.inputs()) seed_sym_value(in);
  const OpDef* def = find_op(n.domain(), n.op_type());
  if (def == nullptr || !def->infer) return node_unsupported(n) << "no shape inference for " << n.op_type();
  return def->infer(n, ctx);
}

Status infer_shapes(Graph& g, InferContext& ctx) {
  ctx.graph = &g;
  for (const auto& [name, iv] : g.bounds) ctx.bounds.emplace(name, iv);
  for (Value* c : g.constants()) seed_sym_value(c);
  for (Node* n : g.nodes()) {
    for (Value* in : n->inputs()) seed_sym_value(in);
    const OpDef* def = find_op(n->domain(), n->op_type());
    if (def == nullptr || !def->infer) continue;
    Status st = Status::ok();
    if (!def->takes_containers)
      for (size_t i = 0; i < n->num_inputs() && st.is_ok(); ++i)
        if (n->input(i) != nullptr && n->input(i)->type().is_container())
          st = node_unsupported(*n) << "input " << i << " ('" << n->input(i)->name() << "') is a "
                                    << (n->input(i)->dtype() == DType::kSequence ? "sequence" : "optional")
                                    << "; " << n->op_type() << " takes tensors only";
    const bool check = n->onnx_schema_pending();
    const OnnxSchema* schema = check ? onnx_schema_for(*n, g.opsets) : nullptr;
    if (st.is_ok() && check && !schema && !g.opsets.count(n->domain() == "ai.onnx" ? "" : n->domain()) &&
        onnx_first_version(n->domain(), n->op_type()) > 0)
      st = node_invalid(*n) << "the model imports no opset of "
                            << (n->domain().empty() ? "ai.onnx" : n->domain()) << " (opset_import), so "
                            << n->op_type() << " has no version";
    if (st.is_ok() && check && !schema)
      if (int since = onnx_first_version(n->domain(), n->op_type()); since > 0 && g.opsets.count(n->domain()))
        st = node_invalid(*n) << "not in opset " << g.opsets.at(n->domain()) << " of "
                              << (n->domain().empty() ? "ai.onnx" : n->domain()) << " (" << n->op_type()
                              << " first appears in opset " << since << ")";
    if (st.is_ok() && schema) st = check_onnx_inputs(*n, *schema);
    if (st.is_ok()) st = def->infer(*n, ctx);
    if (st.is_ok() && schema) st = check_onnx_outputs(*n, *schema);
    if (!st.is_ok()) {
      std::string prefix = g.source.empty() ? std::string() : g.source + ": ";
      if (st.message().rfind(n->describe(), 0) != 0) prefix += n->describe() + ": ";
      return Status(st.code(), prefix + st.message());
    }
    n->set_onnx_schema_pending(false);
  }
  return Status::ok();
}

// ---- Broadcasting ---------------------------------------------------------------

Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const SymbolBounds& bounds) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t k = 0; k < rank; ++k) {
    // Align from the right.
    bool has_a = k + a.size() >= rank, has_b = k + b.size() >= rank;
    if (!has_a) {
      out[k] = b[k + b.size() - rank];
      continue;
    }
    if (!has_b) {
      out[k] = a[k + a.size() - rank];
      continue;
    }
    Expr da = simplify(a[k + a.size() - rank], bounds), db = simplify(b[k + b.size() - rank], bounds);
    auto ca = da.as_const(), cb = db.as_const();
    if (ca && *ca == 1) {
      out[k] = db;
    } else if (cb && *cb == 1) {
      out[k] = da;
    } else if (prove_equal(da, db, bounds)) {
      out[k] = da;
    } else if (ca && cb) {
      return invalid_model() << "shapes " << shape_to_string(a) << " and " << shape_to_string(b)
                             << " cannot be broadcast (dim " << *ca << " vs " << *cb << ")";
    } else if (ca) {
      // A symbol against a constant other than 1: the symbol must be 1 or equal.
      out[k] = da;
    } else if (cb) {
      out[k] = db;
    } else {
      // Two different symbols: one of them is 1 at run time, or they are equal.
      out[k] = simplify(max(da, db), bounds);
    }
  }
  return out;
}

std::vector<Expr> broadcast_indices(const std::vector<Expr>& out_idx, const std::vector<Expr>& in_shape) {
  const bool ok = in_shape.size() <= out_idx.size();
  if (!ok && ExprErrorTrap::record("broadcast of a rank-" + std::to_string(in_shape.size()) + " input to rank " +
                                   std::to_string(out_idx.size())))
    return std::vector<Expr>(in_shape.size());
  KILN_CHECK(ok) << "broadcast of a higher-rank input";
  size_t offset = out_idx.size() - in_shape.size();
  std::vector<Expr> idx;
  idx.reserve(in_shape.size());
  for (size_t k = 0; k < in_shape.size(); ++k) {
    auto c = in_shape[k].as_const();
    idx.push_back(c && *c == 1 ? Expr(0) : out_idx[offset + k]);
  }
  return idx;
}

// ---- common.h: errors -------------------------------------------------------------

Result<DType> elem_type_attr(const Node& n, const char* attr, DType def) {
  if (!n.has_attr(attr)) return def;
  const int64_t v = n.attr_int(attr, 0);
  if (v < 1 || v > kMaxDType) return node_invalid(n) << "attribute '" << attr << "' = " << v << " names no element type";
  return static_cast<DType>(v);
}

StatusBuilder node_unsupported(const Node& n) {
  StatusBuilder b(StatusCode::kUnsupported);
  b << n.describe() << ": ";
  return b;
}

StatusBuilder node_invalid(const Node& n) {
  StatusBuilder b(StatusCode::kInvalidModel);
  b << n.describe() << ": ";
  return b;
}

// ---- common.h: op definitions -----------------------------------------------------

OpDef make_def(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
               std::function<Result<std::vector<tir::ComputeDef>>(const Node&, LowerContext&)> lower,
               bool is_view, std::function<Result<RuntimeKernel>(const Node&)> kernel) {
  OpDef def;
  def.name = name;
  def.infer = std::move(infer);
  def.lower = std::move(lower);
  def.is_view = is_view;
  def.kernel = std::move(kernel);
  return def;
}

OpDef kernel_op(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
                std::function<Result<RuntimeKernel>(const Node&)> kernel) {
  return make_def(name, std::move(infer), nullptr, false, std::move(kernel));
}

// ---- common.h: lowering preconditions ------------------------------------------------

Status require_dims_from_inputs(const Node& n, const LowerContext& ctx) {
  std::set<std::string> known = ctx.bound_symbols;
  for (const tir::Buffer& b : ctx.inputs) {
    for (const Expr& d : b.shape) {
      for (const std::string& v : free_vars(d)) known.insert(v);
    }
  }
  for (const tir::Buffer& b : ctx.outputs) {
    for (const Expr& d : b.shape) {
      for (const std::string& v : free_vars(d)) {
        if (!known.count(v)) {
          return node_unsupported(n) << "output dim " << print_expr(d)
                                     << " is data-dependent: the node needs its runtime kernel";
        }
      }
    }
  }
  return Status::ok();
}

// ---- common.h: parameter shape checks ------------------------------------------------

namespace {
std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + print_expr(s[i]);
  return out + "]";
}
}  // namespace

Status require_param_shape(const Node& n, size_t i, const Shape& expected, const char* what,
                           const SymbolBounds& bounds) {
  if (!has_input(n, i)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
  bool ok = t.has_shape() && t.shape->size() == expected.size();
  for (size_t d = 0; ok && d < expected.size(); ++d) ok = prove_equal((*t.shape)[d], expected[d], bounds);
  if (!ok) return node_invalid(n) << what << " has type " << t.to_string() << ", expected shape " << shape_text(expected);
  return Status::ok();
}

Status require_broadcastable_to(const Node& n, size_t i, const Shape& target, const char* what,
                                const SymbolBounds& bounds) {
  if (!has_input(n, i)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
  bool ok = t.has_shape() && t.shape->size() <= target.size();
  for (size_t d = 0; ok && d < t.shape->size(); ++d) {
    Expr p = simplify((*t.shape)[t.shape->size() - 1 - d], bounds);
    Expr q = simplify(target[target.size() - 1 - d], bounds);
    auto cp = p.as_const(), cq = q.as_const();
    ok = !(cp && *cp != 1 && ((cq && *cq != *cp) || prove_equal(q, 1, bounds)));
  }
  if (!ok)
    return node_invalid(n) << what << " has type " << t.to_string() << ", which does not broadcast to "
                           << shape_text(target);
  return Status::ok();
}

std::vector<DimCheck> broadcast_dim_checks(const Node& n, size_t i, const Shape& target, const SymbolBounds& bounds) {
  std::vector<DimCheck> checks;
  const Value* v = n.input(i);
  if (v == nullptr || !v->type().shape || v->type().shape->size() > target.size()) return checks;
  const Shape& s = *v->type().shape;
  for (size_t d = 0; d < s.size(); ++d) {
    const Expr& p = s[d];
    const Expr& q = target[target.size() - s.size() + d];
    if (!prove_equal(p, 1, bounds) && !prove_equal(p, q, bounds))
      checks.push_back({i, static_cast<int64_t>(d), p, q, true});
  }
  return checks;
}

// ---- common.h: inference helpers ---------------------------------------------------

int64_t onnx_opset(const InferContext& ctx) {
  if (ctx.graph == nullptr) return 0;
  auto it = ctx.graph->opsets.find("");
  if (it == ctx.graph->opsets.end()) it = ctx.graph->opsets.find("ai.onnx");
  return it == ctx.graph->opsets.end() ? 0 : it->second;
}

bool has_input(const Node& n, size_t i) {
  Value* v = n.input(i);
  return v != nullptr && !v->name().empty();
}

Result<TensorType> input_type(const Node& n, size_t i) {
  if (!has_input(n, i)) return node_invalid(n) << "missing input " << i;
  const TensorType& t = n.input(i)->type();
  if (t.dtype == DType::kUndefined) {
    return node_invalid(n) << "input " << i << " ('" << n.input(i)->name() << "') has no known type";
  }
  return t;
}

Result<Shape> input_shape(const Node& n, size_t i) {
  KILN_ASSIGN_OR_RETURN(TensorType t, input_type(n, i));
  if (!t.has_shape()) {
    return node_unsupported(n) << "input " << i << " ('" << n.input(i)->name() << "') has unknown rank";
  }
  return *t.shape;
}

// An output the node does not have (an optional one the file omits, beyond
// its last output) needs no type: ignored, like an omitted one.
void set_output(Node& n, size_t i, DType dtype, Shape shape, const InferContext& ctx) {
  Value* v = n.output(i);
  if (v == nullptr) return;
  for (Expr& d : shape) d = simplify(d, ctx.bounds);
  v->set_type(TensorType{dtype, std::move(shape)});
}

void set_output_unknown_rank(Node& n, size_t i, DType dtype) {
  if (Value* v = n.output(i)) v->set_type(TensorType{dtype, std::nullopt});
}

Result<int64_t> normalize_axis(const Node& n, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    return node_invalid(n) << "axis " << axis << " out of range for rank " << rank;
  }
  return axis < 0 ? axis + rank : axis;
}

std::optional<std::vector<int64_t>> const_ints(const Node& n, size_t i) {
  if (!has_input(n, i)) return std::nullopt;
  Value* v = n.input(i);
  if (v->is_constant()) {
    const Tensor& t = v->constant();
    if (!dtype_is_int(t.dtype())) return std::nullopt;
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(t.numel()));
    for (int64_t k = 0; k < t.numel(); ++k) out.push_back(t.get_i64(k));
    return out;
  }
  if (v->sym_value()) {
    std::vector<int64_t> out;
    for (const Expr& e : *v->sym_value()) {
      auto c = e.as_const();
      if (!c) return std::nullopt;
      out.push_back(*c);
    }
    return out;
  }
  return std::nullopt;
}

std::optional<bool> known_condition(const Node& n, const SymbolBounds& bounds) {
  auto v = sym_values(n, 0);
  if (!v || v->size() != 1) return std::nullopt;
  if (auto c = simplify((*v)[0], bounds).as_const()) return *c != 0;
  return std::nullopt;
}

std::optional<std::vector<Expr>> sym_values(const Node& n, size_t i) {
  if (!has_input(n, i)) return std::nullopt;
  Value* v = n.input(i);
  if (v->sym_value()) return v->sym_value();
  if (v->is_constant()) {
    const Tensor& t = v->constant();
    if ((dtype_is_int(t.dtype()) || t.dtype() == DType::kBool) && t.numel() <= kMaxSymValueElements) {
      std::vector<Expr> out;
      for (int64_t k = 0; k < t.numel(); ++k) out.push_back(Expr(t.get_i64(k)));
      return out;
    }
  }
  return std::nullopt;
}

std::optional<double> const_scalar(const Node& n, size_t i) {
  if (!has_input(n, i)) return std::nullopt;
  Value* v = n.input(i);
  if (v->is_constant()) {
    const Tensor& t = v->constant();
    if (t.numel() != 1 || t.dtype() == DType::kString || !dtype_is_compilable(t.dtype())) return std::nullopt;
    return t.get_f64(0);
  }
  if (v->sym_value() && v->sym_value()->size() == 1) {
    if (auto c = (*v->sym_value())[0].as_const()) return static_cast<double>(*c);
  }
  return std::nullopt;
}

Result<Shape> broadcast_all(const Node& n, const std::vector<Shape>& shapes, const SymbolBounds& bounds) {
  Shape out;
  for (const Shape& s : shapes) {
    auto r = broadcast_shapes(out, s, bounds);
    if (!r.is_ok()) return Status(r.status().code(), n.describe() + ": " + r.status().message());
    out = std::move(r).value();
  }
  return out;
}

// ---- common.h: lowering helpers -------------------------------------------------------

std::vector<std::string> fresh_axes(LowerContext& ctx, size_t rank, const std::string& prefix) {
  std::vector<std::string> names;
  names.reserve(rank);
  for (size_t k = 0; k < rank; ++k) names.push_back(ctx.fresh(prefix));
  return names;
}

std::vector<Expr> axis_vars(const std::vector<std::string>& names) {
  std::vector<Expr> vars;
  vars.reserve(names.size());
  for (const auto& n : names) vars.push_back(var(n));
  return vars;
}

tir::ComputeDef make_stage(std::string name, DType dtype, std::vector<std::string> axes, std::vector<Expr> shape,
                           Expr body) {
  tir::ComputeDef c;
  c.name = std::move(name);
  c.dtype = dtype;
  c.axes = std::move(axes);
  c.shape = std::move(shape);
  c.body = std::move(body);
  if (c.axes.size() != c.shape.size() && ExprErrorTrap::record("stage " + c.name + ": axes and shape differ in rank"))
    return c;
  KILN_CHECK(c.axes.size() == c.shape.size()) << "stage " << c.name << ": axes and shape differ in rank";
  bool ok = c.body.defined() && c.body.dtype() == dtype;
  std::string why = "stage " + c.name + ": body dtype " + (c.body.defined() ? dtype_name(c.body.dtype()) : "?") +
                    " != " + dtype_name(dtype);
  if (!ok && ExprErrorTrap::record(why)) return c;
  KILN_CHECK(ok) << why;
  return c;
}

tir::ComputeDef make_reduce_stage(std::string name, DType dtype, std::vector<std::string> axes,
                                  std::vector<Expr> shape, std::vector<std::string> reduce_axes,
                                  std::vector<Expr> reduce_extents, tir::Combiner combiner, Expr init, Expr body,
                                  Expr finalize) {
  tir::ComputeDef c;
  c.name = std::move(name);
  c.dtype = dtype;
  c.axes = std::move(axes);
  c.shape = std::move(shape);
  c.reduce_axes = std::move(reduce_axes);
  c.reduce_extents = std::move(reduce_extents);
  c.combiner = combiner;
  c.init = std::move(init);
  c.body = std::move(body);
  c.finalize = std::move(finalize);
  bool ok = c.axes.size() == c.shape.size() && c.reduce_axes.size() == c.reduce_extents.size();
  if (!ok && ExprErrorTrap::record("stage " + c.name + ": axes and extents differ in rank")) return c;
  KILN_CHECK(c.axes.size() == c.shape.size()) << "stage " << c.name << ": axes and shape differ in rank";
  KILN_CHECK(c.reduce_axes.size() == c.reduce_extents.size()) << "stage " << c.name << ": reduce axes";
  KILN_CHECK(c.combiner != tir::Combiner::kNone) << "stage " << c.name << ": reduction without combiner";
  ok = c.init.defined() && c.body.defined() && c.init.dtype() == c.body.dtype();
  if (!ok && ExprErrorTrap::record("stage " + c.name + ": init and body dtypes differ")) return c;
  KILN_CHECK(ok) << "stage " << c.name << ": init/body dtype mismatch";
  ok = (c.finalize.defined() ? c.finalize.dtype() : c.body.dtype()) == dtype;
  if (!ok && ExprErrorTrap::record("stage " + c.name + ": result dtype differs from " + dtype_name(dtype))) return c;
  KILN_CHECK(ok) << "stage " << c.name << ": result dtype mismatch";
  return c;
}

Expr stage_load(const tir::ComputeDef& stage, std::vector<Expr> indices) {
  return load(stage.name, -1, stage.dtype, std::move(indices));
}

void copy_elements(Tensor& dst, int64_t di, const Tensor& src, int64_t si, int64_t count) {
  if (count <= 0) return;
  if (src.dtype() == DType::kString) {
    std::copy_n(src.data_as<std::string>() + si, count, dst.data_as<std::string>() + di);
  } else if (dtype_is_container(src.dtype())) {
    std::copy_n(src.data_as<Tensor>() + si, count, dst.data_as<Tensor>() + di);
  } else {
    int64_t es = dtype_size(src.dtype());
    std::memcpy(static_cast<char*>(dst.data()) + di * es, static_cast<const char*>(src.data()) + si * es,
                static_cast<size_t>(count * es));
  }
}

Expr const_of(DType dtype, double v) {
  if (dtype == DType::kBool) return bool_imm(v != 0);
  if (dtype_is_float(dtype)) return float_imm(v, dtype);
  return int_imm(saturate_to_i64(v), dtype);
}

namespace {
std::pair<int64_t, uint64_t> int_limits(DType t) {
  switch (t) {
    case DType::kInt8: return {INT8_MIN, INT8_MAX};
    case DType::kUInt8: return {0, UINT8_MAX};
    case DType::kInt16: return {INT16_MIN, INT16_MAX};
    case DType::kUInt16: return {0, UINT16_MAX};
    case DType::kInt32: return {INT32_MIN, INT32_MAX};
    case DType::kUInt32: return {0, UINT32_MAX};
    case DType::kInt64: return {INT64_MIN, INT64_MAX};
    case DType::kUInt64: return {0, UINT64_MAX};
    default: return {0, 0};
  }
}
}  // namespace

Expr lowest_of(DType dtype) {
  if (dtype == DType::kBool) return bool_imm(false);
  if (dtype_is_float(dtype)) return float_imm(-std::numeric_limits<double>::infinity(), dtype);
  return int_imm(int_limits(dtype).first, dtype);
}

Expr highest_of(DType dtype) {
  if (dtype == DType::kBool) return bool_imm(true);
  if (dtype_is_float(dtype)) return float_imm(std::numeric_limits<double>::infinity(), dtype);
  // u64's maximum wraps to -1 in the i64 payload, which is its bit pattern.
  return int_imm(static_cast<int64_t>(int_limits(dtype).second), dtype);
}

Expr cast_if_needed(DType dtype, Expr e) {
  if (e.dtype() == dtype) return e;
  return cast(dtype, std::move(e));
}

Expr load_broadcast(const LowerContext& ctx, size_t i, const std::vector<Expr>& out_idx,
                    const std::vector<Expr>& out_shape) {
  bool present = i < ctx.inputs.size() && !ctx.inputs[i].name.empty();
  if (!present && ExprErrorTrap::record("load of omitted input " + std::to_string(i))) return Expr();
  KILN_CHECK(present) << "load of missing input " << i;
  const std::vector<Expr>& in_shape = ctx.inputs[i].shape;
  const bool ranks_ok = in_shape.size() <= out_idx.size() && out_idx.size() == out_shape.size();
  if (!ranks_ok && ExprErrorTrap::record("broadcast of input " + std::to_string(i) + " (rank " +
                                         std::to_string(in_shape.size()) + ") to rank " + std::to_string(out_idx.size())))
    return Expr();
  KILN_CHECK(ranks_ok) << "broadcast of a higher-rank input";
  size_t offset = out_idx.size() - in_shape.size();
  std::vector<Expr> idx;
  idx.reserve(in_shape.size());
  for (size_t k = 0; k < in_shape.size(); ++k) {
    const Expr& d = in_shape[k];
    const Expr& od = out_shape[offset + k];
    auto c = d.as_const();
    if (c && *c == 1) {
      idx.push_back(Expr(0));
    } else if (c || prove_equal(d, od)) {
      idx.push_back(out_idx[offset + k]);
    } else {
      idx.push_back(mod(out_idx[offset + k], d));
    }
  }
  return ctx.load_input(i, std::move(idx));
}

}  // namespace kiln::ops

namespace kiln::ops {

tir::ComputeDef reduce_over_dims(LowerContext& ctx, std::string name, DType dtype, const std::vector<Expr>& in_shape,
                                 const std::vector<bool>& reduced, bool keep_dims, tir::Combiner combiner, Expr init,
                                 const std::function<Expr(const std::vector<Expr>& full_idx)>& body,
                                 const std::function<Expr(const Expr& acc, const std::vector<Expr>& out_idx)>&
                                     finalize) {
  if (reduced.size() != in_shape.size() && ExprErrorTrap::record("reduction over " + std::to_string(reduced.size()) +
                                                                  " axes of a rank-" + std::to_string(in_shape.size()) +
                                                                  " input"))
    return tir::ComputeDef{};
  KILN_CHECK(reduced.size() == in_shape.size()) << "reduce_over_dims: rank mismatch";
  std::vector<std::string> axes, reduce_axes;
  std::vector<Expr> shape, reduce_extents, full_idx, out_idx;
  for (size_t d = 0; d < in_shape.size(); ++d) {
    if (reduced[d]) {
      std::string k = ctx.fresh("k");
      reduce_axes.push_back(k);
      reduce_extents.push_back(in_shape[d]);
      full_idx.push_back(var(k));
      if (keep_dims) {
        std::string i = ctx.fresh("i");
        axes.push_back(i);
        shape.push_back(Expr(1));
        out_idx.push_back(var(i));
      }
    } else {
      std::string i = ctx.fresh("i");
      axes.push_back(i);
      shape.push_back(in_shape[d]);
      full_idx.push_back(var(i));
      out_idx.push_back(var(i));
    }
  }
  Expr b = body(full_idx);
  Expr fin;
  if (finalize) fin = finalize(var("acc", b.dtype()), out_idx);
  return make_reduce_stage(std::move(name), dtype, std::move(axes), std::move(shape), std::move(reduce_axes),
                           std::move(reduce_extents), combiner, std::move(init), std::move(b), std::move(fin));
}

std::vector<Expr> reduced_index(const std::vector<Expr>& full_idx, const std::vector<bool>& reduced, bool keep_dims) {
  std::vector<Expr> idx;
  for (size_t d = 0; d < full_idx.size(); ++d) {
    if (!reduced[d]) {
      idx.push_back(full_idx[d]);
    } else if (keep_dims) {
      idx.push_back(Expr(0));
    }
  }
  return idx;
}

}  // namespace kiln::ops
