// The graph IR: a Graph of Nodes over SSA Values. Each Value has a TensorType
// (dtype and a shape of symbolic Dims). Constants (ONNX initializers) are
// Values holding a Tensor. If/Loop/Scan carry nested Graphs as attributes.
//
// The graph is edited only through Graph methods, which keep producer and use
// lists valid. Nodes are kept in a topological order (Graph::topo_sort()).
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

  bool has_shape() const { return shape.has_value(); }
  int64_t rank() const { return shape ? static_cast<int64_t>(shape->size()) : -1; }
  // True when every dim is a constant.
  bool is_static() const;
  std::vector<int64_t> static_shape() const;  // requires is_static()
  Expr numel() const;                         // product of dims (simplified)
  std::string to_string() const;              // "f32[n, 3, 224, 224]", "f32[?]" for unknown rank
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

 private:
  friend class Graph;
  std::string op_type_, domain_, name_;
  std::vector<Value*> inputs_, outputs_;
  std::map<std::string, Attribute> attrs_;
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

  // Values. Names are unique within a graph; make_value() renames on clash.
  Value* add_value(const std::string& name, TensorType type);
  Value* add_input(const std::string& name, TensorType type);
  Value* add_constant(const std::string& name, Tensor t);
  Value* find_value(const std::string& name) const;
  std::string unique_name(const std::string& base) const;

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  void set_outputs(std::vector<Value*> outs) { outputs_ = std::move(outs); }
  // All values (inputs, constants, node outputs) in creation order.
  std::vector<Value*> values() const;
  std::vector<Value*> constants() const;

  // Nodes in order. Appends a node whose outputs are new values with the given names.
  Node* add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                 const std::vector<std::string>& output_names, const std::string& domain = "",
                 const std::string& node_name = "");
  // Inserts before `pos` instead of at the end.
  Node* insert_node_before(Node* pos, const std::string& op_type, const std::vector<Value*>& inputs,
                           const std::vector<std::string>& output_names, const std::string& domain = "");
  void set_input(Node* n, size_t i, Value* v);
  // Removes a node whose outputs have no uses and are not graph outputs.
  void remove_node(Node* n);
  // Redirects all uses of `from` (and graph outputs) to `to`.
  void replace_all_uses(Value* from, Value* to);
  // Removes values with no producer, no uses that are not inputs/outputs.
  void remove_dead_values();

  std::vector<Node*> nodes() const;
  size_t num_nodes() const { return nodes_.size(); }

  // Reorders nodes topologically. Error (naming a node on the cycle) if the graph has a cycle.
  Status topo_sort();
  // Checks structure: every input of a node is defined before it, names unique,
  // use lists consistent. Errors name the node.
  Status verify() const;

 private:
  std::vector<std::unique_ptr<Value>> values_;
  std::map<std::string, Value*, std::less<>> by_name_;
  std::vector<Value*> inputs_, outputs_;
  std::list<std::unique_ptr<Node>> nodes_;
};

// Deterministic text form, e.g.
//   graph main(%x: f32[n, 3], %w: f32[3, 4] = const<...>) -> (%y) {
//     %y: f32[n, 4] = MatMul(%x, %w) {}
//   }
// and its parser (round trip exact).
std::string print_graph(const Graph& g);
Result<std::unique_ptr<Graph>> parse_graph(std::string_view text);

}  // namespace kiln
