// Private helpers shared by the op family files (src/ops/*.cc). Not part of
// the registry's interface: nothing outside src/ops includes this header.
//
// Conventions for an op's lower():
// - Every stage that defines a node output is named ctx.outputs[k].name and
//   has that buffer's dtype and shape. Intermediate stages get names from
//   ctx.fresh(...) so that several fused nodes never collide.
// - Axis names (spatial and reduce) come from ctx.fresh("i") / ctx.fresh("k").
// - Inputs are read with ctx.load_input(i, indices); an earlier stage of the
//   same op with stage_load(stage, indices).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "ops/registry.h"
#include "shape/expr.h"
#include "support/status.h"
#include "tir/tir.h"

namespace kiln::ops {

// One registration function per op family; register_all_ops() (registry.cc)
// calls each once.
void register_elementwise_ops();  // elementwise.cc
void register_reduce_ops();       // reduce.cc
void register_norm_ops();         // norm.cc
void register_conv_ops();         // conv.cc
void register_pool_ops();         // pool.cc
void register_matmul_ops();       // matmul.cc
void register_shape_ops();        // shape_ops.cc
void register_indexing_ops();     // indexing.cc
void register_control_flow_ops();  // control_flow.cc
void register_loss_ops();         // loss.cc
void register_rnn_ops();          // rnn.cc
void register_quant_ops();        // quant.cc
void register_misc_ops();         // misc.cc
void register_layout_ops();       // layout.cc (kiln:ToBlocked, FromBlocked, ConvBlocked)
void register_conv_grad_ops();    // conv_grad.cc (kiln:PackPanels, Im2Col, Col2Im, MaxPoolGrad)
void register_collective_ops();   // collective.cc (kiln:AllReduceMean)
void register_signal_ops();       // signal.cc
void register_detection_ops();    // detection.cc
void register_random_ops();       // random.cc
void register_string_ops();       // strings.cc
void register_image_ops();        // image.cc
void register_ml_ops();           // ml.cc
void register_optimizer_ops();    // optimizer.cc
void register_sequence_ops();     // sequence.cc (after elementwise.cc and misc.cc: extends their Optional ops)

// Dropout in training mode (random.cc), for elementwise.cc's Dropout.
Result<RuntimeKernel> dropout_training_kernel(const Node& n);

// An OpDef for a compiled op (optionally a view, optionally with a runtime
// kernel for data-dependent cases), ready for register_op.
OpDef make_def(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
               std::function<Result<std::vector<tir::ComputeDef>>(const Node&, LowerContext&)> lower,
               bool is_view = false, std::function<Result<RuntimeKernel>(const Node&)> kernel = nullptr);
// An OpDef for a runtime-kernel op (no lowering).
OpDef kernel_op(const std::string& name, std::function<Status(Node&, InferContext&)> infer,
                std::function<Result<RuntimeKernel>(const Node&)> kernel);

// ---- Containers (sequence.cc) ------------------------------------------------

// The type of a container that is `a` on one path and `b` on another (If
// branches, a loop-carried value before and after the body): its length
// where both agree, else a fresh symbol; its element type joined likewise.
Result<TensorType> join_container_types(const Node& n, const TensorType& a, const TensorType& b, InferContext& ctx);
// Same dtype, rank and constant dims at every level (symbols are not compared).
bool same_container_shape(const TensorType& a, const TensorType& b);

// ---- Errors ---------------------------------------------------------------

// Error builders whose message starts with the node ("Conv 'conv1': ").
StatusBuilder node_unsupported(const Node& n);
StatusBuilder node_invalid(const Node& n);
// The element type that integer attribute `attr` names (ONNX's
// TensorProto.DataType), `def` when absent; an error naming the node and the
// attribute when it names none (0, a container, out of range).
Result<DType> elem_type_attr(const Node& n, const char* attr, DType def);

// ---- Inference helpers ----------------------------------------------------

// The ai.onnx opset of the graph being inferred; 0 when unknown (treat as latest).
int64_t onnx_opset(const InferContext& ctx);

// True when optional input i is present (not omitted, not an empty name).
bool has_input(const Node& n, size_t i);

// The type of input i; error naming the node when the input is missing or
// its type has no dtype.
Result<TensorType> input_type(const Node& n, size_t i);
// Like input_type, but also requires a known rank.
Result<Shape> input_shape(const Node& n, size_t i);

// Sets output i's type (shape dims are simplified with ctx.bounds).
void set_output(Node& n, size_t i, DType dtype, Shape shape, const InferContext& ctx);
void set_output_unknown_rank(Node& n, size_t i, DType dtype);

// Normalizes a possibly negative axis into [0, rank); error naming the node
// when out of range.
Result<int64_t> normalize_axis(const Node& n, int64_t axis, int64_t rank);

// Integer values of input i when known at compile time: from its constant
// tensor, or from its sym_value when every element is a constant.
std::optional<std::vector<int64_t>> const_ints(const Node& n, size_t i);
// Element values of input i as Exprs: its sym_value, or its constant's values
// for a small integer constant. nullopt otherwise.
std::optional<std::vector<Expr>> sym_values(const Node& n, size_t i);
// A constant numeric scalar (or one-element tensor) input's value.
std::optional<double> const_scalar(const Node& n, size_t i);

// Multidirectional broadcast over several shapes (Sum, Max, Where, ...).
Result<Shape> broadcast_all(const Node& n, const std::vector<Shape>& shapes, const SymbolBounds& bounds);

// Checks that optional input i (when present) has exactly `expected` shape
// (dims proven equal under `bounds`); a parameter of another shape would be
// read out of bounds by the kernel. `what` names it in the error.
Status require_param_shape(const Node& n, size_t i, const Shape& expected, const char* what,
                           const SymbolBounds& bounds);
// Checks that optional input i (when present) broadcasts unidirectionally to
// `target` (right-aligned; each dim equal or 1). An error only where it
// provably does not (a higher rank, or two different constants); a dim not
// proven 1 or equal is checked at run time: broadcast_dim_checks lists those
// checks for the op's OpDef::dim_checks.
Status require_broadcastable_to(const Node& n, size_t i, const Shape& target, const char* what,
                                const SymbolBounds& bounds);
std::vector<DimCheck> broadcast_dim_checks(const Node& n, size_t i, const Shape& target, const SymbolBounds& bounds);

// ---- Convolution geometry (conv.cc; shared with the integer convolutions) ---

// Geometry of a convolution window along the spatial dims.
struct ConvGeometry {
  std::vector<Expr> in;         // input spatial extents
  std::vector<Expr> kernel;     // kernel extents
  std::vector<Expr> out;        // output spatial extents
  std::vector<Expr> pad_begin;  // padding before each spatial dim (may be symbolic with auto_pad)
  std::vector<int64_t> stride, dilation;
  bool may_pad = false;  // some padding may be non-zero: bodies need bound checks
};

// A per-spatial-dim attribute (strides, dilations): `rank` positive values, default `def`.
Result<std::vector<int64_t>> spatial_attr(const Node& n, const std::string& name, size_t rank, int64_t def);
// A window of `span` positions (the dilated kernel extent) along spatial dim
// d over an input reaching `reach` positions. Every output position visits
// the whole window, so one far longer than its input (a file's absurd kernel,
// dilation or padding) would run for hours over padding: refused when longer
// than kMaxWindowOverInput positions and a quarter of that times the reach.
// Symbolic extents are not judged.
constexpr int64_t kMaxWindowOverInput = 64;
// The largest rank inference makes from the length of a shape tensor (one
// symbol per dim): a longer one is a file's absurd dim, not a shape.
constexpr int64_t kMaxInferredRank = 64;
Status check_window_span(const Node& n, size_t d, const Expr& span, const Expr& reach, const SymbolBounds& bounds);
// An index held inside [0, extent) (loads under a select whose condition
// rejects the out-of-range positions).
Expr clamp_index(const Expr& i, const Expr& extent);
// Output extents and padding of Conv-like ops over input x: explicit pads or auto_pad.
Result<ConvGeometry> conv_geometry(const Node& n, const Shape& x, const std::vector<Expr>& kernel,
                                   const SymbolBounds& bounds);

// ---- Matrix products (matmul.cc; shared with the integer matmuls) -----------

// Axes and load indices of a numpy-style (batched, broadcast; 1-D operands
// promoted) product y = a @ b reduced over the fresh axis `k`.
struct MatMulIndices {
  std::vector<std::string> axes;  // output axes
  std::string k;                  // the reduce axis
  std::vector<Expr> a, b;         // indices into a and b
  Expr m, n;                      // row and column of y (0 for a 1-D operand)
};
MatMulIndices matmul_indices(LowerContext& ctx, const tir::Buffer& a, const tir::Buffer& b, const tir::Buffer& y);

// ---- Lowering helpers -----------------------------------------------------

// Lowering needs every output dim computable from symbols bound before the
// node runs (its input shapes, ctx.bound_symbols). A dim that is a fresh
// symbol of this node (a shape-like input known only at run time) is not:
// kUnsupported then, and such a node runs as its runtime kernel.
Status require_dims_from_inputs(const Node& n, const LowerContext& ctx);

// `rank` fresh axis names with the given prefix, and their variables.
std::vector<std::string> fresh_axes(LowerContext& ctx, size_t rank, const std::string& prefix = "i");
std::vector<Expr> axis_vars(const std::vector<std::string>& names);

// A stage without reduction: name[axes] = body.
tir::ComputeDef make_stage(std::string name, DType dtype, std::vector<std::string> axes, std::vector<Expr> shape,
                           Expr body);
// A reduction stage: name[axes] = finalize(combine over reduce axes of body).
tir::ComputeDef make_reduce_stage(std::string name, DType dtype, std::vector<std::string> axes,
                                  std::vector<Expr> shape, std::vector<std::string> reduce_axes,
                                  std::vector<Expr> reduce_extents, tir::Combiner combiner, Expr init, Expr body,
                                  Expr finalize = Expr());

// Reads an earlier stage of the same kernel (buffer_index -1).
Expr stage_load(const tir::ComputeDef& stage, std::vector<Expr> indices);

// A constant of the given dtype: float_imm for floats, int_imm for integers,
// bool_imm for bool (v != 0).
Expr const_of(DType dtype, double v);
// Copies elements [si, si + count) of src to [di, di + count) of dst (same
// dtype; strings and containers by assignment, others as bytes).
void copy_elements(Tensor& dst, int64_t di, const Tensor& src, int64_t si, int64_t count);
// The smallest / largest finite-or-infinite value of a dtype: -inf/+inf for
// floats, numeric limits for integers, false/true for bool. Identities of max / min.
Expr lowest_of(DType dtype);
Expr highest_of(DType dtype);
// cast(dtype, e), or e itself when it already has that dtype.
Expr cast_if_needed(DType dtype, Expr e);

// Loads input i at the index `out_idx` of a broadcast result of shape
// `out_shape` (numpy rules: leading dims dropped, dims of constant size 1 read
// at 0, dims provably equal to the output dim read at the output index, and a
// symbolic dim that may be either 1 or the output dim read at `idx mod dim`).
Expr load_broadcast(const LowerContext& ctx, size_t i, const std::vector<Expr>& out_idx,
                    const std::vector<Expr>& out_shape);

// A reduction over the dims of `in_shape` marked in `reduced`. The stage's
// shape is in_shape without the reduced dims (keep_dims false) or with them
// as 1 (keep_dims true). `body` gets the full index into in_shape (reduced
// dims bound to reduce axes) and returns the value to combine; `finalize`
// may use var("acc", body dtype) and the stage's own axes (passed to it).
tir::ComputeDef reduce_over_dims(LowerContext& ctx, std::string name, DType dtype, const std::vector<Expr>& in_shape,
                                 const std::vector<bool>& reduced, bool keep_dims, tir::Combiner combiner, Expr init,
                                 const std::function<Expr(const std::vector<Expr>& full_idx)>& body,
                                 const std::function<Expr(const Expr& acc, const std::vector<Expr>& out_idx)>&
                                     finalize = nullptr);
// The index into a reduce_over_dims stage for a full index into in_shape.
std::vector<Expr> reduced_index(const std::vector<Expr>& full_idx, const std::vector<bool>& reduced, bool keep_dims);

}  // namespace kiln::ops
