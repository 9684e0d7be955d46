// The graph IR: a Graph of Nodes over SSA Values. Each Value has a TensorType
// (dtype and a shape of symbolic Dims). Constants (ONNX initializers) are
// Values holding a Tensor. If/Loop/Scan carry nested Graphs as attributes.
//
// The graph is edited only through Graph methods, which keep producer and use
// lists valid. Nodes are kept in a topological order (Graph::topo_sort()).
//
// Nested graphs and outer-scope references. A subgraph (the body of an If,
// Loop or Scan, held in a kGraph/kGraphs attribute) may read values of the
// graphs around it, as ONNX allows. It does so through captures: a capture is
// a Value of the subgraph (no producer, not an input) whose name is the name of
// the outer value it stands for. The reference is by name, resolved in the
// graph that holds the node carrying the subgraph; when the value lives further
// out, each graph in between captures it as well, so every capture resolves one
// level up. The node carrying the subgraph thus reads its captured values
// implicitly: Graph::implicit_inputs() lists them, and topo_sort(), verify(),
// remove_dead_values() and replace_all_uses() take them into account (they are
// not in the outer values' use lists, which only hold explicit inputs).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shape/expr.h"
#include "support/status.h"
#include "support/tensor.h"

namespace kiln {

using Dim = Expr;
using Shape = std::vector<Dim>;

std::string shape_to_string(const Shape& shape);  // "[n, 3, 224, 224]"

struct TensorType {
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;  // nullopt: rank unknown
  // Containers (dtype kSequence / kOptional): the shape is [length] (an
  // optional's length is 0 or 1) and `elem` the type of every element; the
  // elements' dims are data, so an element type has a static shape, or a rank
  // of unknown dims (fresh symbols where an op reads one out), or no rank.
  std::shared_ptr<const TensorType> elem;

  bool has_shape() const { return shape.has_value(); }
  int64_t rank() const { return shape ? static_cast<int64_t>(shape->size()) : -1; }
  // True when every dim is a constant.
  bool is_static() const;
  std::vector<int64_t> static_shape() const;  // requires is_static()
  Expr numel() const;                         // product of dims (simplified)
  std::string to_string() const;              // "f32[n, 3, 224, 224]", "f32[?]" for unknown rank,
                                              // "seq<f32[?]>[n]" for a container
  bool is_container() const { return dtype_is_container(dtype); }
  static TensorType container(DType kind, TensorType elem, Dim length);
};

class Graph;
class Node;

class Value {
 public:
  const std::string& name() const { return name_; }
  const TensorType& type() const { return type_; }
  void set_type(TensorType t) { type_ = std::move(t); }
  DType dtype() const { return type_.dtype; }

  Node* producer() const { return producer_; }  // null for graph inputs and constants
  int producer_output() const { return producer_output_; }
  // (node, input index) pairs reading this value, in no particular order.
  const std::vector<std::pair<Node*, int>>& uses() const { return uses_; }

  bool is_constant() const { return constant_.has_value(); }
  const Tensor& constant() const { return *constant_; }
  void set_constant(Tensor t) { constant_ = std::move(t); }

  // For small integer tensors (shapes and indices computed in the graph): the
  // element values as symbolic Exprs, when known. This is how
  // Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains resolve to symbolic dims.
  const std::optional<std::vector<Expr>>& sym_value() const { return sym_value_; }
  void set_sym_value(std::optional<std::vector<Expr>> v) { sym_value_ = std::move(v); }

 private:
  friend class Graph;
  std::string name_;
  TensorType type_;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  std::vector<std::pair<Node*, int>> uses_;
  std::optional<Tensor> constant_;
  std::optional<std::vector<Expr>> sym_value_;
};

struct Attribute {
  enum class Kind : uint8_t { kFloat, kInt, kString, kTensor, kGraph, kFloats, kInts, kStrings, kTensors, kGraphs };

  static Attribute of_int(int64_t v);
  static Attribute of_float(double v);
  static Attribute of_string(std::string v);
  static Attribute of_tensor(Tensor v);
  static Attribute of_graph(std::shared_ptr<Graph> v);
  static Attribute of_ints(std::vector<int64_t> v);
  static Attribute of_floats(std::vector<double> v);
  static Attribute of_strings(std::vector<std::string> v);

  Kind kind = Kind::kInt;
  double f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<double> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
};

class Node {
 public:
  const std::string& op_type() const { return op_type_; }
  const std::string& domain() const { return domain_; }  // "" is the default ONNX domain
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  const std::vector<Value*>& inputs() const { return inputs_; }    // null for an omitted optional input
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }

  const std::map<std::string, Attribute>& attrs() const { return attrs_; }
  bool has_attr(const std::string& k) const { return attrs_.count(k) != 0; }
  const Attribute* attr(const std::string& k) const;
  void set_attr(const std::string& k, Attribute a) { attrs_[k] = std::move(a); }
  // Typed getters with defaults (the ONNX defaults are passed by the caller).
  int64_t attr_int(const std::string& k, int64_t def) const;
  double attr_float(const std::string& k, double def) const;
  std::string attr_string(const std::string& k, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& k, std::vector<int64_t> def = {}) const;
  std::vector<double> attr_floats(const std::string& k) const;

  // "Conv 'conv1'" — used in error messages.
  std::string describe() const;

  // Set by the ONNX importer on the nodes a model file holds (not on those
  // Kiln adds): shape inference checks such a node against its ONNX operator
  // schema before inferring it, and clears the flag (ops/onnx_schema.h).
  bool onnx_schema_pending() const { return onnx_schema_pending_; }
  void set_onnx_schema_pending(bool v) { onnx_schema_pending_ = v; }

 private:
  friend class Graph;
  std::string op_type_, domain_, name_;
  std::vector<Value*> inputs_, outputs_;
  std::map<std::string, Attribute> attrs_;
  bool onnx_schema_pending_ = false;
};

class Graph;

// ONNX's standard training form (ModelProto.training_info): one step of the
// training algorithm runs the model's graph and `algorithm` together (the
// algorithm reads the model's values by name, as captures, and computes
// losses, ai.onnx.preview.training:Gradient and optimizer ops), after which
// each initializer named in `update_binding` (of the model or of the
// algorithm) takes the value of the algorithm output bound to it. The
// initialization graph computes initial values of initializers once, before
// the first step (`initialization_binding`: initializer -> its output).
struct TrainingInfo {
  std::shared_ptr<Graph> algorithm;
  std::vector<std::pair<std::string, std::string>> update_binding;  // initializer, algorithm output
  std::shared_ptr<Graph> initialization;                            // may be null
  std::vector<std::pair<std::string, std::string>> initialization_binding;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  std::string name;
  // Opset versions by domain ("" = ai.onnx).
  std::map<std::string, int64_t> opsets;
  // Where it came from, for error messages ("model.onnx").
  std::string source;
  // Bounds of the shape symbols of this graph. The ONNX importer records every
  // symbol it creates here, in the top-level graph: named dims (dim_param) get
  // [1, inf), dims with neither value nor name ("_u<N>") get [0, inf).
  SymbolBounds bounds;
  // The top-level graph's training algorithms, in the order a step runs
  // them (the ONNX importer fills it; inference ignores it).
  std::vector<TrainingInfo> training_info;

  // Tensors that parse_graph() could not recreate because the text held only a
  // summary (see print_graph): zero-filled placeholders of the right type, with
  // the hash that was printed for the original data. The printer prints the
  // recorded hash for them, so print_graph(parse_graph(text)) == text. Keyed by
  // identity of the tensor's storage (the Tensor here keeps it alive).
  struct ElidedTensor {
    Tensor tensor;
    std::string hash;
  };
  std::vector<ElidedTensor> elided_tensors;

  // Values. Names are unique within a graph; add_value() renames on clash.
  Value* add_value(const std::string& name, TensorType type);
  Value* add_input(const std::string& name, TensorType type);
  Value* add_constant(const std::string& name, Tensor t);
  // A value standing for the outer value of the same name (see the file comment).
  Value* add_capture(const std::string& name, TensorType type);
  Value* find_value(const std::string& name) const;
  std::string unique_name(const std::string& base) const;
  // Renames a value (the new name must be free). Subgraph captures of the old
  // name (in subgraphs of this graph's nodes) are renamed with it.
  void rename_value(Value* v, const std::string& new_name);

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  const std::vector<Value*>& captures() const { return captures_; }
  void set_outputs(std::vector<Value*> outs) { outputs_ = std::move(outs); }
  // All values (inputs, captures, constants, node outputs) in creation order.
  std::vector<Value*> values() const;
  std::vector<Value*> constants() const;

  // Nodes in order. Appends a node whose outputs are new values with the given
  // names (renamed on clash; an empty name, an omitted optional output, gets a
  // fresh "_unused..." name).
  Node* add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                 const std::vector<std::string>& output_names, const std::string& domain = "",
                 const std::string& node_name = "");
  // Inserts before `pos` instead of at the end.
  Node* insert_node_before(Node* pos, const std::string& op_type, const std::vector<Value*>& inputs,
                           const std::vector<std::string>& output_names, const std::string& domain = "");
  void set_input(Node* n, size_t i, Value* v);
  // Removes a node whose outputs have no uses and are not graph outputs. Its
  // output Values are destroyed with it.
  void remove_node(Node* n);
  // Redirects all uses of `from` (and graph outputs) to `to`. Subgraph captures
  // of `from` are renamed to capture `to`.
  void replace_all_uses(Value* from, Value* to);
  // Removes values with no producer and no uses that are not inputs, outputs,
  // captures, or read by a subgraph (unused constants, stray values).
  void remove_dead_values();

  std::vector<Node*> nodes() const;
  size_t num_nodes() const { return nodes_.size(); }
  // Values of this graph read by the subgraphs of `n` through captures, sorted
  // by name (each once). Empty for a node without graph attributes.
  std::vector<Value*> implicit_inputs(const Node* n) const;

  // Reorders nodes topologically. Error (naming a node on the cycle) if the graph has a cycle.
  Status topo_sort();
  // Checks structure: every input of a node is defined before it, names unique,
  // use lists consistent. Errors name the node.
  Status verify() const;

 private:
  std::vector<std::unique_ptr<Value>> values_;
  std::map<std::string, Value*, std::less<>> by_name_;
  std::vector<Value*> inputs_, outputs_, captures_;
  std::list<std::unique_ptr<Node>> nodes_;
};

// Deterministic text form and its parser. Example:
//
//   graph main(%x: f32[n, 3]) -> (%y, %s) {
//     opset "" 17
//     source "model.onnx"
//     bound n [1, inf]
//     %w: f32[3, 2] = const<f32[3,2] [1, 2, 3, 4, 5, 6]>
//     %big: f32[64, 3, 7, 7] = const<f32[64,3,7,7] fnv:1f0c2e4d5a6b7c8d>
//     %y: f32[n, 2] = MatMul(%x, %w) name "mm"
//     %s: i64[2] sym [n, 2] = Shape(%y)
//     %p: f32[n, 2], %q: f32[n, 2] = com.example::Split2(%y, _) {axis = 1, ratio = 0.5}
//   }
//
// Lines in order: opsets, source, symbol bounds (inf for a missing side),
// captures ("capture %c: f32[3]"), constants, then nodes in graph order. A value
// name prints as %name when it is made of [A-Za-z0-9_.$/-] and as %"..."
// otherwise; `_` is an omitted optional input; a domain prints as domain::Op;
// "sym [...]" is a value's sym_value. Attributes are sorted by name: ints as
// 1, floats always with '.', 'e', inf or nan (a float that is not exactly an
// f32 gets a 'd' suffix: 0.1d), strings quoted with C escapes, tensors as
// const<...>, graphs as nested `graph` blocks, lists in brackets (empty lists
// name their kind: ints[], floats[], strings[], tensors[], graphs[]).
//
// Tensors print as const<dtype[shape] data>. Data is printed in full (decimal
// for ints and bool, shortest round-trip decimal for f32/f64, quoted for
// strings, hex:<bytes> for f16, bf16, float8, 4-bit and complex types) when the
// tensor has at most PrintOptions::max_constant_elements elements. A larger
// tensor prints as a summary, fnv:<16 hex digits> (FNV-1a 64 of its bytes; of
// the strings' lengths and bytes for kString). The parser cannot invert that: it
// creates a zero-filled tensor of the printed type and records the hash in
// Graph::elided_tensors, so a reprint is identical but the data is gone. Set
// max_constant_elements to -1 to print every tensor in full (exact round trip
// of the data too).
//
// NaN payloads and the sign of NaN are not preserved.
struct PrintOptions {
  int64_t max_constant_elements = 16;  // -1: no limit
};
std::string print_graph(const Graph& g, const PrintOptions& options = {});
Result<std::unique_ptr<Graph>> parse_graph(std::string_view text);

}  // namespace kiln
