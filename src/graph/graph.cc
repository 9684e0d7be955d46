#include "graph/graph.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kiln {

Attribute Attribute::of_int(int64_t v) {
  Attribute a;
  a.kind = Kind::kInt;
  a.i = v;
  return a;
}
Attribute Attribute::of_float(double v) {
  Attribute a;
  a.kind = Kind::kFloat;
  a.f = v;
  return a;
}
Attribute Attribute::of_string(std::string v) {
  Attribute a;
  a.kind = Kind::kString;
  a.s = std::move(v);
  return a;
}
Attribute Attribute::of_tensor(Tensor v) {
  Attribute a;
  a.kind = Kind::kTensor;
  a.t = std::move(v);
  return a;
}
Attribute Attribute::of_graph(std::shared_ptr<Graph> v) {
  Attribute a;
  a.kind = Kind::kGraph;
  a.g = std::move(v);
  return a;
}
Attribute Attribute::of_ints(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Kind::kInts;
  a.ints = std::move(v);
  return a;
}
Attribute Attribute::of_floats(std::vector<double> v) {
  Attribute a;
  a.kind = Kind::kFloats;
  a.floats = std::move(v);
  return a;
}
Attribute Attribute::of_strings(std::vector<std::string> v) {
  Attribute a;
  a.kind = Kind::kStrings;
  a.strings = std::move(v);
  return a;
}


std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i].to_string();
  }
  return s + "]";
}

bool TensorType::is_static() const {
  if (!shape) return false;
  for (const Dim& d : *shape)
    if (!d.is_const()) return false;
  return true;
}

std::vector<int64_t> TensorType::static_shape() const {
  KILN_CHECK(is_static()) << "static_shape() of " << to_string();
  std::vector<int64_t> out;
  out.reserve(shape->size());
  for (const Dim& d : *shape) out.push_back(*d.as_const());
  return out;
}

Expr TensorType::numel() const {
  KILN_CHECK(shape.has_value()) << "numel() of a tensor of unknown rank";
  Expr n = int64_t{1};
  for (const Dim& d : *shape) n = mul(n, d);
  return simplify(n);
}

TensorType TensorType::container(DType kind, TensorType elem, Dim length) {
  TensorType t;
  t.dtype = kind;
  t.shape = Shape{std::move(length)};
  t.elem = std::make_shared<const TensorType>(std::move(elem));
  return t;
}

std::string TensorType::to_string() const {
  std::string s = dtype_name(dtype);
  if (elem) s += "<" + elem->to_string() + ">";
  if (!shape) return s + "[?]";
  return s + shape_to_string(*shape);
}

// ---------------------------------------------------------------------------
// Node

const Attribute* Node::attr(const std::string& k) const {
  auto it = attrs_.find(k);
  return it == attrs_.end() ? nullptr : &it->second;
}

int64_t Node::attr_int(const std::string& k, int64_t def) const {
  const Attribute* a = attr(k);
  return a && a->kind == Attribute::Kind::kInt ? a->i : def;
}

double Node::attr_float(const std::string& k, double def) const {
  const Attribute* a = attr(k);
  if (!a) return def;
  if (a->kind == Attribute::Kind::kFloat) return a->f;
  if (a->kind == Attribute::Kind::kInt) return static_cast<double>(a->i);
  return def;
}

std::string Node::attr_string(const std::string& k, const std::string& def) const {
  const Attribute* a = attr(k);
  return a && a->kind == Attribute::Kind::kString ? a->s : def;
}

std::vector<int64_t> Node::attr_ints(const std::string& k, std::vector<int64_t> def) const {
  const Attribute* a = attr(k);
  return a && a->kind == Attribute::Kind::kInts ? a->ints : def;
}

std::vector<double> Node::attr_floats(const std::string& k) const {
  const Attribute* a = attr(k);
  return a && a->kind == Attribute::Kind::kFloats ? a->floats : std::vector<double>{};
}

std::string Node::describe() const {
  std::string s = domain_.empty() ? op_type_ : domain_ + "::" + op_type_;
  if (!name_.empty()) s += " '" + name_ + "'";
  return s;
}

// ---------------------------------------------------------------------------
// Graph: values

namespace {

void remove_use(Value* v, Node* n, int index, std::vector<std::pair<Node*, int>>& uses) {
  auto it = std::find(uses.begin(), uses.end(), std::make_pair(n, index));
  KILN_CHECK(it != uses.end()) << "use list of %" << v->name() << " lacks (" << n->describe() << ", "
                               << index << ")";
  uses.erase(it);
}

// The names a node's subgraphs capture from the graph holding the node.
std::set<std::string> captured_names(const Node* n) {
  std::set<std::string> names;
  auto add = [&](const std::shared_ptr<Graph>& g) {
    if (!g) return;
    for (Value* c : g->captures()) names.insert(c->name());
  };
  for (const auto& [k, a] : n->attrs()) {
    if (a.kind == Attribute::Kind::kGraph) add(a.g);
    if (a.kind == Attribute::Kind::kGraphs)
      for (const auto& g : a.graphs) add(g);
  }
  return names;
}

template <typename F>
void for_each_subgraph(const Node* n, F&& f) {
  for (const auto& [k, a] : n->attrs()) {
    if (a.kind == Attribute::Kind::kGraph && a.g) f(*a.g);
    if (a.kind == Attribute::Kind::kGraphs)
      for (const auto& g : a.graphs)
        if (g) f(*g);
  }
}

}  // namespace

std::string Graph::unique_name(const std::string& base) const {
  std::string b = base.empty() ? "_v" : base;
  if (!by_name_.count(b)) return b;
  for (int64_t i = 1;; ++i) {
    std::string candidate = b + "_" + std::to_string(i);
    if (!by_name_.count(candidate)) return candidate;
  }
}

Value* Graph::add_value(const std::string& name, TensorType type) {
  auto v = std::make_unique<Value>();
  v->name_ = unique_name(name);
  v->type_ = std::move(type);
  Value* raw = v.get();
  by_name_[raw->name_] = raw;
  values_.push_back(std::move(v));
  return raw;
}

Value* Graph::add_input(const std::string& name, TensorType type) {
  Value* v = add_value(name, std::move(type));
  inputs_.push_back(v);
  return v;
}

Value* Graph::add_capture(const std::string& name, TensorType type) {
  KILN_CHECK(!by_name_.count(name)) << "capture %" << name << " clashes with a value of graph " << this->name;
  Value* v = add_value(name, std::move(type));
  captures_.push_back(v);
  return v;
}

Value* Graph::add_constant(const std::string& name, Tensor t) {
  TensorType type;
  type.dtype = t.dtype();
  Shape shape;
  for (int64_t d : t.shape()) shape.push_back(Dim(d));
  type.shape = std::move(shape);
  Value* v = add_value(name, std::move(type));
  v->constant_ = std::move(t);
  return v;
}

Value* Graph::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void Graph::rename_value(Value* v, const std::string& new_name) {
  if (v->name_ == new_name) return;
  KILN_CHECK(!by_name_.count(new_name)) << "rename %" << v->name_ << " to existing name %" << new_name;
  KILN_CHECK(find_value(v->name_) == v) << "rename of a value not in graph " << name;
  std::string old = v->name_;
  by_name_.erase(old);
  v->name_ = new_name;
  by_name_[new_name] = v;
  for (auto& n : nodes_) {
    if (!captured_names(n.get()).count(old)) continue;
    for_each_subgraph(n.get(), [&](Graph& sg) {
      Value* c = sg.find_value(old);
      if (!c || std::find(sg.captures_.begin(), sg.captures_.end(), c) == sg.captures_.end()) return;
      if (Value* existing = sg.find_value(new_name)) {
        KILN_CHECK(std::find(sg.captures_.begin(), sg.captures_.end(), existing) != sg.captures_.end())
            << "renaming capture %" << old << " to %" << new_name << " clashes with a local value";
        sg.replace_all_uses(c, existing);
        sg.captures_.erase(std::find(sg.captures_.begin(), sg.captures_.end(), c));
        sg.by_name_.erase(old);
        sg.values_.erase(std::find_if(sg.values_.begin(), sg.values_.end(),
                                      [&](const std::unique_ptr<Value>& p) { return p.get() == c; }));
      } else {
        sg.rename_value(c, new_name);
      }
    });
  }
}

std::vector<Value*> Graph::values() const {
  std::vector<Value*> out;
  out.reserve(values_.size());
  for (const auto& v : values_) out.push_back(v.get());
  return out;
}

std::vector<Value*> Graph::constants() const {
  std::vector<Value*> out;
  for (const auto& v : values_)
    if (v->is_constant()) out.push_back(v.get());
  return out;
}

// ---------------------------------------------------------------------------
// Graph: nodes

Node* Graph::add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                      const std::vector<std::string>& output_names, const std::string& domain,
                      const std::string& node_name) {
  nodes_.push_back(std::make_unique<Node>());
  Node* n = nodes_.back().get();
  n->op_type_ = op_type;
  n->domain_ = domain;
  n->name_ = node_name;
  n->inputs_ = inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]) inputs[i]->uses_.emplace_back(n, static_cast<int>(i));
  for (size_t i = 0; i < output_names.size(); ++i) {
    Value* v = add_value(output_names[i].empty() ? "_unused" : output_names[i], TensorType{});
    v->producer_ = n;
    v->producer_output_ = static_cast<int>(i);
    n->outputs_.push_back(v);
  }
  return n;
}

Node* Graph::insert_node_before(Node* pos, const std::string& op_type, const std::vector<Value*>& inputs,
                                const std::vector<std::string>& output_names, const std::string& domain) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const std::unique_ptr<Node>& p) { return p.get() == pos; });
  KILN_CHECK(it != nodes_.end()) << "insert_node_before: node not in graph " << name;
  Node* n = add_node(op_type, inputs, output_names, domain);
  // add_node appended it; move it into place.
  auto last = std::prev(nodes_.end());
  nodes_.splice(it, nodes_, last);
  return n;
}

void Graph::set_input(Node* n, size_t i, Value* v) {
  if (i >= n->inputs_.size()) n->inputs_.resize(i + 1, nullptr);
  Value* old = n->inputs_[i];
  if (old == v) return;
  if (old) remove_use(old, n, static_cast<int>(i), old->uses_);
  n->inputs_[i] = v;
  if (v) v->uses_.emplace_back(n, static_cast<int>(i));
}

void Graph::remove_node(Node* n) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const std::unique_ptr<Node>& p) { return p.get() == n; });
  KILN_CHECK(it != nodes_.end()) << "remove_node: " << n->describe() << " not in graph " << name;
  for (Value* out : n->outputs_) {
    KILN_CHECK(out->uses_.empty()) << "remove_node: output %" << out->name() << " of " << n->describe()
                                   << " still has uses";
    KILN_CHECK(std::find(outputs_.begin(), outputs_.end(), out) == outputs_.end())
        << "remove_node: output %" << out->name() << " of " << n->describe() << " is a graph output";
  }
  for (size_t i = 0; i < n->inputs_.size(); ++i)
    if (Value* v = n->inputs_[i]) remove_use(v, n, static_cast<int>(i), v->uses_);
  std::unordered_set<Value*> dead(n->outputs_.begin(), n->outputs_.end());
  for (Value* out : n->outputs_) by_name_.erase(out->name_);
  values_.erase(std::remove_if(values_.begin(), values_.end(),
                               [&](const std::unique_ptr<Value>& p) { return dead.count(p.get()) != 0; }),
                values_.end());
  nodes_.erase(it);
}

void Graph::replace_all_uses(Value* from, Value* to) {
  if (from == to) return;
  for (auto [n, i] : from->uses_) {
    n->inputs_[i] = to;
    to->uses_.emplace_back(n, i);
  }
  from->uses_.clear();
  for (Value*& o : outputs_)
    if (o == from) o = to;
  // Captures by name in subgraphs.
  for (auto& n : nodes_) {
    if (!captured_names(n.get()).count(from->name())) continue;
    for_each_subgraph(n.get(), [&](Graph& sg) {
      Value* c = sg.find_value(from->name());
      if (!c || std::find(sg.captures_.begin(), sg.captures_.end(), c) == sg.captures_.end()) return;
      if (Value* existing = sg.find_value(to->name())) {
        KILN_CHECK(std::find(sg.captures_.begin(), sg.captures_.end(), existing) != sg.captures_.end())
            << "capture %" << to->name() << " clashes with a local value of a subgraph";
        sg.replace_all_uses(c, existing);
        sg.captures_.erase(std::find(sg.captures_.begin(), sg.captures_.end(), c));
        sg.by_name_.erase(c->name_);
        sg.values_.erase(std::find_if(sg.values_.begin(), sg.values_.end(),
                                      [&](const std::unique_ptr<Value>& p) { return p.get() == c; }));
      } else {
        sg.rename_value(c, to->name());
        c->type_ = to->type_;
      }
    });
  }
}

void Graph::remove_dead_values() {
  std::unordered_set<Value*> keep(inputs_.begin(), inputs_.end());
  keep.insert(outputs_.begin(), outputs_.end());
  keep.insert(captures_.begin(), captures_.end());
  for (auto& n : nodes_)
    for (Value* v : implicit_inputs(n.get())) keep.insert(v);
  std::vector<std::string> erased;
  values_.erase(std::remove_if(values_.begin(), values_.end(),
                               [&](const std::unique_ptr<Value>& p) {
                                 Value* v = p.get();
                                 bool dead = !v->producer_ && v->uses_.empty() && !keep.count(v);
                                 if (dead) erased.push_back(v->name_);
                                 return dead;
                               }),
                values_.end());
  for (const std::string& e : erased) by_name_.erase(e);
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

std::vector<Value*> Graph::implicit_inputs(const Node* n) const {
  std::vector<Value*> out;
  for (const std::string& name : captured_names(n)) {
    Value* v = find_value(name);
    if (v) out.push_back(v);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Graph: order and checks

Status Graph::topo_sort() {
  std::vector<Node*> order = nodes();
  std::unordered_map<Node*, size_t> index;
  for (size_t i = 0; i < order.size(); ++i) index[order[i]] = i;
  // Dependencies: producers (in this graph) of explicit and implicit inputs.
  std::vector<std::vector<size_t>> deps(order.size()), users(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    std::vector<Value*> ins = order[i]->inputs_;
    for (Value* v : implicit_inputs(order[i])) ins.push_back(v);
    std::set<size_t> seen;
    for (Value* v : ins) {
      if (!v || !v->producer_) continue;
      auto it = index.find(v->producer_);
      if (it == index.end() || !seen.insert(it->second).second) continue;
      deps[i].push_back(it->second);
      users[it->second].push_back(i);
    }
  }
  std::vector<size_t> pending(order.size());
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < order.size(); ++i) {
    pending[i] = deps[i].size();
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<size_t> sorted;
  sorted.reserve(order.size());
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    sorted.push_back(i);
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  if (sorted.size() != order.size()) {
    // Walk dependencies among the unsorted nodes until one repeats: it is on a cycle.
    std::vector<bool> done(order.size(), false);
    for (size_t i : sorted) done[i] = true;
    size_t cur = 0;
    while (done[cur]) ++cur;
    std::vector<int> visited(order.size(), -1);
    std::vector<size_t> path;
    while (visited[cur] < 0) {
      visited[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      for (size_t d : deps[cur])
        if (!done[d]) {
          cur = d;
          break;
        }
    }
    std::ostringstream cycle;
    for (size_t k = static_cast<size_t>(visited[cur]); k < path.size(); ++k)
      cycle << (k > static_cast<size_t>(visited[cur]) ? " <- " : "") << order[path[k]]->describe();
    return invalid_model() << "graph " << (name.empty() ? "<unnamed>" : name) << " has a cycle through node "
                           << order[cur]->describe() << " (" << cycle.str() << ")";
  }
  std::vector<std::unique_ptr<Node>> holder;
  holder.reserve(nodes_.size());
  for (auto& n : nodes_) holder.push_back(std::move(n));
  nodes_.clear();
  for (size_t i : sorted) nodes_.push_back(std::move(holder[i]));
  return Status::ok();
}

Status Graph::verify() const {
  std::string gname = name.empty() ? "<unnamed>" : name;
  auto err = [&]() {
    StatusBuilder b(StatusCode::kInvalidModel);
    b << "graph " << gname << ": ";
    return b;
  };
  // Names unique and the name table consistent.
  std::unordered_set<const Value*> owned;
  std::unordered_set<std::string> names;
  for (const auto& v : values_) {
    owned.insert(v.get());
    if (!names.insert(v->name_).second) return err() << "value name %" << v->name_ << " is not unique";
    if (find_value(v->name_) != v.get()) return err() << "value %" << v->name_ << " is missing from the name table";
  }
  if (by_name_.size() != values_.size()) return err() << "name table has " << by_name_.size() << " entries for "
                                                      << values_.size() << " values";
  std::unordered_set<const Value*> defined;
  for (Value* v : inputs_) {
    if (!owned.count(v)) return err() << "graph input is not a value of the graph";
    if (v->producer_ || v->is_constant()) return err() << "graph input %" << v->name_ << " has a producer or constant";
    defined.insert(v);
  }
  for (Value* v : captures_) {
    if (!owned.count(v)) return err() << "capture is not a value of the graph";
    defined.insert(v);
  }
  for (const auto& v : values_)
    if (v->is_constant()) {
      if (v->producer_) return err() << "constant %" << v->name_ << " has a producer";
      defined.insert(v.get());
    }
  // Nodes in order: inputs defined before use, outputs produced by the node.
  std::unordered_set<const Node*> node_set;
  for (const auto& n : nodes_) node_set.insert(n.get());
  for (const auto& np : nodes_) {
    const Node* n = np.get();
    for (size_t i = 0; i < n->inputs_.size(); ++i) {
      Value* v = n->inputs_[i];
      if (!v) continue;
      if (!owned.count(v)) return err() << "node " << n->describe() << " input " << i << " is not a value of the graph";
      if (!defined.count(v))
        return err() << "node " << n->describe() << " input " << i << " %" << v->name_ << " is not defined before it";
      auto& uses = v->uses_;
      if (std::find(uses.begin(), uses.end(), std::make_pair(const_cast<Node*>(n), static_cast<int>(i))) == uses.end())
        return err() << "use list of %" << v->name_ << " lacks node " << n->describe() << " input " << i;
    }
    for (const std::string& c : captured_names(n)) {
      Value* v = find_value(c);
      if (!v) return err() << "node " << n->describe() << ": a subgraph captures %" << c << ", not a value of the graph";
      if (!defined.count(v))
        return err() << "node " << n->describe() << ": a subgraph captures %" << c << ", not defined before it";
    }
    for (size_t i = 0; i < n->outputs_.size(); ++i) {
      Value* v = n->outputs_[i];
      if (!v || !owned.count(v)) return err() << "node " << n->describe() << " output " << i << " is not a value of the graph";
      if (v->producer_ != n || v->producer_output_ != static_cast<int>(i))
        return err() << "node " << n->describe() << " output %" << v->name_ << " has a wrong producer";
      if (defined.count(v)) return err() << "value %" << v->name_ << " is defined twice";
      defined.insert(v);
    }
    Status sub = Status::ok();
    for_each_subgraph(n, [&](const Graph& sg) {
      if (sub.is_ok()) sub = sg.verify().with_context("in a subgraph of node " + n->describe());
    });
    KILN_RETURN_IF_ERROR(sub);
  }
  // Every recorded use is real.
  std::unordered_map<const Value*, size_t> use_count;
  for (const auto& n : nodes_)
    for (Value* in : n->inputs_)
      if (in) ++use_count[in];
  for (const auto& v : values_) {
    for (auto [n, i] : v->uses_) {
      if (!node_set.count(n)) return err() << "use list of %" << v->name_ << " names a node not in the graph";
      if (i < 0 || static_cast<size_t>(i) >= n->inputs_.size() || n->inputs_[i] != v.get())
        return err() << "use list of %" << v->name_ << " names node " << n->describe() << " input " << i
                     << ", which reads another value";
    }
    size_t count = use_count.count(v.get()) ? use_count[v.get()] : 0;
    if (count != v->uses_.size())
      return err() << "use list of %" << v->name_ << " has " << v->uses_.size() << " entries for " << count << " uses";
    if (v->producer_ && !node_set.count(v->producer_))
      return err() << "value %" << v->name_ << " has a producer that is not in the graph";
  }
  for (Value* v : outputs_) {
    if (!owned.count(v)) return err() << "a graph output is not a value of the graph";
    if (!defined.count(v)) return err() << "graph output %" << v->name_ << " is never defined";
  }
  return Status::ok();
}

}  // namespace kiln
