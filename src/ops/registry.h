// The op registry. Per ONNX op: symbolic type/shape inference, and either a
// compute definition for lowering (regular ops: compiled) or a runtime kernel
// (irregular, data-dependent ops: C++ called by the VM like a compiled kernel).
// View ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity) are aliases at run
// time: the output shares the input's storage.
//
// One file per op family registers its ops: elementwise.cc, matmul.cc, conv.cc,
// pool.cc, norm.cc, reduce.cc, shape_ops.cc, indexing.cc, ...
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "ops/gradient.h"
#include "support/status.h"
#include "support/tensor.h"
#include "tir/tir.h"

namespace kiln::ops {

// State shared across inference of one graph: bounds of symbols and a counter
// for fresh symbols (data-dependent output dims).
struct InferContext {
  Graph* graph = nullptr;
  SymbolBounds bounds;
  int next_fresh = 0;
  // A new symbol for a data-dependent dim, named "_d<N>", bounded below by 0.
  Expr fresh_symbol(std::optional<int64_t> upper = std::nullopt);
};

// Inputs to an op's lowering. Index i is the node's input i.
struct LowerContext {
  std::vector<tir::Buffer> inputs;       // name empty for an omitted optional input
  std::vector<int> input_index;          // buffer_index for loads of input i (-1: an earlier stage)
  std::vector<const Tensor*> constants;  // constant value of input i, or null
  std::vector<std::optional<std::vector<Expr>>> sym_values;  // symbolic element values of input i
  std::vector<tir::Buffer> outputs;      // one per node output: names and types to define
  int* name_counter = nullptr;           // for fresh axis names unique in the kernel
  // The graph's ai.onnx opset (graph.opsets[""]); a few ops' semantics depend on
  // it (Softmax, LogSoftmax, Hardmax before 13). 0: unknown; those ops then fail
  // to lower when the semantics would differ.
  int64_t opset = 0;
  // Bounds of the graph's symbols (signs of symbolic slice bounds, ...).
  SymbolBounds bounds;
  // Symbols whose values are known at run time before this node runs (graph
  // input dims, dims of earlier runtime kernels' outputs). An output dim over
  // other symbols is data-dependent and cannot be lowered.
  std::set<std::string> bound_symbols;

  Expr load_input(size_t i, std::vector<Expr> indices) const;
  std::string fresh(const std::string& prefix);  // "i3", "k7", ...
};

// A runtime kernel: reads inputs, produces outputs (allocating them; their
// shapes may be data-dependent). Attributes are captured when the kernel is bound.
using RuntimeKernel = std::function<Status(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>;

// Index values of input `input` must lie in [-extent, extent) (negative
// values count from the end). `extents` has one entry per position along the
// innermost axis of the indices, cycled (GatherND's index tuples); a single
// extent applies to every element. The VM checks them before the kernel runs,
// so an out-of-range index is an error naming the node instead of a read of
// some other element.
struct IndexCheck {
  size_t input = 0;
  std::vector<Expr> extents;
};

// Dim `axis` of input `input` (the symbolic extent `dim`) must be 1 or equal
// `to` at run time (with `exact`, equal `to`: the kernel reads it at the
// output's index); the VM checks it before the node's compiled kernel runs
// (a Squeeze'd axis, checked against the constant 1).
struct DimCheck {
  size_t input = 0;
  int64_t axis = 0;
  Expr dim, to;
  bool exact = false;
};

struct OpDef {
  std::string name;
  std::string domain;  // "" = ai.onnx
  // Sets the outputs' TensorTypes (and sym_values where known) from inputs and attributes.
  std::function<Status(Node&, InferContext&)> infer;
  // For compiled ops: the stages that define the node's outputs.
  std::function<Result<std::vector<tir::ComputeDef>>(const Node&, LowerContext&)> lower;
  // For runtime-kernel ops: builds the kernel for this node.
  std::function<Result<RuntimeKernel>(const Node&)> kernel;
  // The kernel writes into the outputs it is given: an output passed in
  // defined (the VM passes those whose inferred shapes it can evaluate before
  // the call, from the memory plan or its buffer pool) must be written in
  // full, in place, and kept; only outputs passed undefined are allocated.
  bool kernel_fills_outputs = false;
  // For a compiled op that also has a kernel: true when this node must run
  // the kernel (Dropout in training mode, whose mask is random); the
  // lowering covers the other nodes. Unset: the kernel only for
  // data-dependent output shapes.
  std::function<bool(const Node&)> runs_kernel;
  // Output i aliases input 0's storage (view op): Reshape, Flatten, Squeeze, Unsqueeze, Identity.
  bool is_view = false;
  // Elementwise (with broadcasting): may be fused into a chain with neighbours.
  bool is_elementwise = false;
  // The op reads or writes sequences or optionals (dtype kSequence / kOptional,
  // TensorType::elem). infer_shapes refuses a container input to any other op.
  bool takes_containers = false;
  // Compiled ops that read through index tensors: the run-time range checks.
  std::function<Result<std::vector<IndexCheck>>(const Node&)> index_checks;
  // Ops whose lowering or view assumes a symbolic dim's value: the run-time
  // checks (kCheckBroadcast: `dim` must be 1 or `to`).
  std::function<std::vector<DimCheck>(const Node&, const SymbolBounds&)> dim_checks;
  // Replaced by the compiler's gradients stage before the graph passes, never
  // lowered or run: ai.onnx.preview.training:Gradient (train/algorithm.h).
  bool expanded_by_autodiff = false;
  // Reverse mode (ops/gradient.h, train/autodiff.cc): adds the nodes computing
  // the gradients of the node's inputs from those of its outputs. Unset: the
  // op cannot be differentiated (yet).
  GradientRule gradient;
};

// Registration (called from each family's register_*() function).
void register_op(OpDef def);
// Amends an op another family registered (registered earlier in
// register_all_ops): the string kernels of Cast, CastLike and Equal.
void extend_op(const std::string& domain, const std::string& name, const std::function<void(OpDef&)>& amend);
// Registers every op family once (thread-safe); find_op() and
// registered_op_names() call it, so callers rarely need to.
void register_all_ops();
const OpDef* find_op(const std::string& domain, const std::string& name);
// All registered op names, sorted ("Add", "com.microsoft:Gelu", ...).
std::vector<std::string> registered_op_names();

// Runs inference for every node in order; errors name the node and op and
// the graph's source file. A node from a model file not yet checked
// (Node::onnx_schema_pending) is first checked against its ONNX operator
// schema (counts, attributes, input types), and its inferred outputs after. Nodes whose op is not registered are skipped (the
// driver reports unsupported ops all at once). Before a node is inferred, its
// small constant integer inputs (i32/i64, <= 64 elements) get a sym_value.
Status infer_shapes(Graph& g, InferContext& ctx);
// Infers one node added after its graph was inferred (a gradient rule's:
// ops/gradient.h), with the context that graph's inference left.
Status infer_node(Node& n, InferContext& ctx);

// Helpers for op implementations.
// Multidirectional (numpy) broadcast of shapes; error when incompatible.
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const SymbolBounds& bounds);

// An If's condition when it is known at compile time (a constant, or a shape
// computation that simplifies to one): only that branch is inferred strictly
// and compiled.
std::optional<bool> known_condition(const Node& n, const SymbolBounds& bounds);
// Indices into an input of shape `in` for an output index `out_idx` under broadcasting.
std::vector<Expr> broadcast_indices(const std::vector<Expr>& out_idx, const std::vector<Expr>& in_shape);

}  // namespace kiln::ops
