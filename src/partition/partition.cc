#include "partition/partition.h"

#include "ops/registry.h"

namespace kiln::partition {

bool is_control_flow(const Node* n) {
  return n->domain().empty() && (n->op_type() == "If" || n->op_type() == "Loop" || n->op_type() == "Scan" ||
                                 n->op_type() == "SequenceMap");
}

Status GraphPartition::in_context(Status st) const {
  for (auto it = where.rbegin(); it != where.rend(); ++it) st = st.with_context(*it);
  return st;
}

bool has_complete_sym_value(const Value* v) {
  if (v == nullptr || !v->sym_value() || !v->type().is_static()) return false;
  if (v->dtype() != DType::kInt64 && v->dtype() != DType::kInt32) return false;
  int64_t n = 1;
  for (int64_t d : v->type().static_shape()) n *= d;
  return n == static_cast<int64_t>(v->sym_value()->size());
}

namespace {

// An output whose rank is unknown or whose dims use a symbol not yet bound
// (by the graph inputs or by an earlier runtime kernel's outputs) is
// data-dependent: only a runtime kernel, which allocates its outputs once the
// values are known, can produce it.
bool has_data_dependent_output(const Node* n, const std::set<std::string>& bound) {
  for (const Value* out : n->outputs()) {
    if (!out) continue;
    if (!out->type().shape) return true;
    for (const Expr& d : *out->type().shape)
      for (const std::string& v : free_vars(d))
        if (!bound.count(v)) return true;
  }
  // CumSum lowers only with a constant axis.
  if (n->op_type() == "CumSum" && n->input(1) && !n->input(1)->is_constant()) return true;
  return false;
}

class Classifier {
 public:
  Classifier(GraphPartition& p, bool fuse, bool anchors) : p_(p), g_(*p.graph), fuse_(fuse), anchors_(anchors) {}
  void run();

 private:
  bool view_between_elementwise(const Node* n);
  GraphPartition& p_;
  Graph& g_;
  bool fuse_;
  bool anchors_;
};

void Classifier::run() {
  for (const Value* v : g_.outputs()) p_.graph_outputs.insert(v);
  // Values needed by the outputs (dead nodes are skipped).
  std::set<const Value*> needed(g_.outputs().begin(), g_.outputs().end());
  std::vector<Node*> nodes = g_.nodes();
  // Symbols bound before each node runs: graph input dims, then the outputs
  // of every node in order.
  std::set<std::string> bound;
  std::set<const Node*> data_dependent;
  std::vector<const Value*> entry(g_.inputs().begin(), g_.inputs().end());
  entry.insert(entry.end(), g_.captures().begin(), g_.captures().end());
  for (const Value* in : entry)
    if (in->type().shape)
      for (const Expr& d : *in->type().shape)
        for (const std::string& v : free_vars(d)) bound.insert(v);
  // The node output whose dims first name each data-dependent symbol: it must
  // run wherever a live node's shape or symbolic value uses the symbol (a
  // Shape of a host kernel's output, computed from symbols, needs the kernel
  // to have bound them).
  std::map<std::string, const Value*> introduced_by;
  for (const Node* n : nodes) {
    p_.bound_before[n] = bound;
    if (has_data_dependent_output(n, bound)) data_dependent.insert(n);
    for (const Value* out : n->outputs())
      if (out && out->type().shape)
        for (const Expr& d : *out->type().shape)
          for (const std::string& v : free_vars(d))
            if (bound.insert(v).second) introduced_by.emplace(v, out);
  }
  auto need_symbols_of = [&](const Value* o) {
    std::vector<Expr> exprs;
    if (o->type().shape) exprs = *o->type().shape;
    if (o->sym_value()) exprs.insert(exprs.end(), o->sym_value()->begin(), o->sym_value()->end());
    for (const Expr& e : exprs)
      for (const std::string& v : free_vars(e))
        if (auto it = introduced_by.find(v); it != introduced_by.end() && it->second != o) needed.insert(it->second);
  };
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool live = false;
    for (const Value* o : n->outputs())
      if (o && needed.count(o)) live = true;
    if (!live) {
      p_.kind[n] = NodeKind::kSkip;
      continue;
    }
    bool shape_only = true;
    for (const Value* o : n->outputs())
      if (o && needed.count(o) && !has_complete_sym_value(o)) shape_only = false;
    for (const Value* o : n->outputs())
      if (o && needed.count(o)) need_symbols_of(o);
    if (shape_only) {
      p_.kind[n] = NodeKind::kShape;
      continue;
    }
    for (const Value* in : n->inputs())
      if (in) needed.insert(in);
    for (const Value* in : g_.implicit_inputs(n)) {
      needed.insert(in);
      p_.captured.insert(in);
    }
    if (is_control_flow(n)) {
      p_.kind[n] = NodeKind::kControl;
      continue;
    }
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    KILN_CHECK(def != nullptr) << "unchecked op " << n->describe();
    if (def->kernel && (data_dependent.count(n) || (def->runs_kernel && def->runs_kernel(*n))))
      p_.kind[n] = NodeKind::kHost;
    else if (def->is_view && n->num_outputs() >= 1)
      p_.kind[n] = NodeKind::kView;
    else if (def->lower)
      p_.kind[n] = NodeKind::kCompiled;
    else
      p_.kind[n] = NodeKind::kHost;
  }
  if (fuse_)
    for (Node* n : nodes)
      if (p_.kind[n] == NodeKind::kView && view_between_elementwise(n)) p_.kind[n] = NodeKind::kCompiled;

  std::set<const Node*> compiled;
  for (const auto& [n, k] : p_.kind)
    if (k == NodeKind::kCompiled) compiled.insert(n);
  p_.groups = fuse_elementwise(g_, compiled, fuse_, anchors_);
  for (size_t i = 0; i < p_.groups.size(); ++i) p_.group_of_root[p_.groups[i].nodes.back()] = i;
}

// A Reshape/Flatten/Squeeze/Unsqueeze whose input comes from a compiled
// elementwise node and whose output goes to one, each value read only there:
// compiled into their fused kernel (a reindexing of the producer's values,
// no buffer in between). Its output dims must be expressions of its input's,
// so the kernel can compute them (x:[a,b] -> [a*b] fuses; a dim taken from a
// run-time shape tensor does not).
bool Classifier::view_between_elementwise(const Node* n) {
  static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};
  if (!n->domain().empty() || !kViews.count(n->op_type()) || n->num_outputs() != 1) return false;
  const Value* in = n->input(0);
  const Value* out = n->output(0);
  if (in == nullptr || out == nullptr || !in->type().shape || !out->type().shape) return false;
  std::set<std::string> in_symbols;
  for (const Expr& d : *in->type().shape)
    for (const std::string& v : free_vars(d)) in_symbols.insert(v);
  for (const Expr& d : *out->type().shape)
    for (const std::string& v : free_vars(d))
      if (!in_symbols.count(v)) return false;
  auto fusable = [&](const Node* m) {
    if (m == nullptr || p_.kind_of(m) != NodeKind::kCompiled || m->num_outputs() != 1) return false;
    const ops::OpDef* def = ops::find_op(m->domain(), m->op_type());
    return def != nullptr && def->is_elementwise;
  };
  auto only_reader = [&](const Value* v) {
    return v->uses().size() == 1 && !p_.graph_outputs.count(v) && !p_.captured.count(v);
  };
  return fusable(in->producer()) && only_reader(in) && only_reader(out) && fusable(out->uses()[0].first);
}

// The subgraphs a live control-flow node runs, in the order the bytecode
// places them.
std::vector<std::string> subgraph_attrs(const Node* n, const SymbolBounds& bounds) {
  if (n->op_type() != "If") return {"body"};
  // A condition known at compile time: the taken branch only (the other may
  // not even infer for these shapes: ops/control_flow.cc).
  if (std::optional<bool> taken = ops::known_condition(*n, bounds))
    return {*taken ? "then_branch" : "else_branch"};
  return {"then_branch", "else_branch"};
}

void partition_into(Partition& out, GraphPartition& p, const SymbolBounds& bounds, bool fuse) {
  Classifier(p, fuse, out.candidates_are_anchors).run();
  for (Node* n : p.graph->nodes()) {
    if (p.kind_of(n) != NodeKind::kControl) continue;
    for (const std::string& attr : subgraph_attrs(n, bounds)) {
      const Attribute* a = n->attr(attr);
      if (a == nullptr || a->g == nullptr) continue;  // the bytecode stage reports it
      auto sub = std::make_unique<GraphPartition>();
      sub->graph = a->g.get();
      sub->where = p.where;
      sub->where.push_back(n->describe() + " " + attr);
      GraphPartition* raw = sub.get();
      out.graphs.push_back(std::move(sub));
      p.subgraphs[n].emplace_back(attr, raw);
      partition_into(out, *raw, bounds, fuse);
    }
  }
}

Status visit_groups(const GraphPartition& p,
                    const std::function<Status(const GraphPartition&, const FusedGroup&)>& f) {
  for (const Node* n : p.graph->nodes()) {
    NodeKind k = p.kind_of(n);
    if (k == NodeKind::kCompiled) {
      auto it = p.group_of_root.find(n);
      if (it != p.group_of_root.end()) KILN_RETURN_IF_ERROR(f(p, p.groups[it->second]));
    } else if (k == NodeKind::kControl) {
      auto it = p.subgraphs.find(n);
      if (it == p.subgraphs.end()) continue;
      for (const auto& [attr, sub] : it->second) KILN_RETURN_IF_ERROR(visit_groups(*sub, f));
    }
  }
  return Status::ok();
}

}  // namespace

Status Partition::for_each_group(const std::function<Status(const GraphPartition&, const FusedGroup&)>& f) const {
  return visit_groups(top(), f);
}

Result<Partition> partition_graph(Graph& g, const SymbolBounds& bounds, bool fuse, bool candidates_are_anchors) {
  Partition out;
  out.candidates_are_anchors = candidates_are_anchors;
  auto top = std::make_unique<GraphPartition>();
  top->graph = &g;
  GraphPartition* raw = top.get();
  out.graphs.push_back(std::move(top));
  partition_into(out, *raw, bounds, fuse);
  return out;
}

}  // namespace kiln::partition
