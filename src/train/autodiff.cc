// Reverse mode over the graph IR: the nodes between the parameters and the
// loss, visited last to first, each through its op's gradient rule
// (OpDef::gradient); gradients reaching one value from several uses are added.
#include "train/autodiff.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "ops/registry.h"

namespace kiln {

namespace train {

namespace {

class Builder : public ops::GradBuilder {
 public:
  Builder(Graph& g, ops::InferContext& ctx, std::map<const Value*, Value*>& grads, const std::set<const Value*>& live)
      : g_(g), ctx_(ctx), grads_(grads), live_(live) {}

  void visit(Node* n) { node_ = n; }

  const Node& node() const override { return *node_; }
  Value* output_grad(size_t i) const override {
    auto it = grads_.find(node_->output(i));
    return it == grads_.end() ? nullptr : it->second;
  }
  bool wants(size_t i) const override { return node_->input(i) != nullptr && live_.count(node_->input(i)) != 0; }
  int64_t opset() const override {
    auto it = g_.opsets.find("");
    return it == g_.opsets.end() ? 0 : it->second;
  }

  Result<std::vector<Value*>> add(const std::string& op_type, const std::vector<Value*>& inputs,
                                  const std::map<std::string, Attribute>& attrs, size_t num_outputs,
                                  const std::string& domain) override {
    std::vector<std::string> names;
    std::string base = (node_->name().empty() ? node_->op_type() : node_->name()) + "_grad_" + op_type;
    // unique_name sees only existing values: one base per output keeps them distinct.
    for (size_t k = 0; k < num_outputs; ++k)
      names.push_back(g_.unique_name(num_outputs == 1 ? base : base + ".o" + std::to_string(k)));
    Node* m = g_.add_node(op_type, inputs, names, domain);
    for (const auto& [key, a] : attrs) m->set_attr(key, a);
    Status st = ops::infer_node(*m, ctx_);
    if (!st.is_ok()) return st.with_context("the gradient of " + node_->describe());
    return m->outputs();
  }

  Value* constant(Tensor t) override { return g_.add_constant(g_.unique_name("grad_const"), std::move(t)); }

  std::vector<Value*> implicit_inputs() const override { return g_.implicit_inputs(node_); }
  bool wants_value(const Value* v) const override { return v != nullptr && live_.count(v) != 0; }
  Status add_value_grad(Value* v, Value* grad) override { return add_grad(v, grad, "value '" + (v ? v->name() : "") + "'"); }
  Result<std::vector<Value*>> differentiate(Graph& sub, Value* loss, const std::vector<Value*>& params) override {
    ops::InferContext ctx;
    ctx.graph = &sub;
    ctx.bounds = g_.bounds;
    ctx.next_fresh = ctx_.next_fresh + (1 << 16);
    KILN_RETURN_IF_ERROR(ops::infer_shapes(sub, ctx));
    return append_gradients(sub, loss, params, /*computed_params=*/true);
  }

  Status set_input_grad(size_t i, Value* grad) override {
    return add_grad(node_->input(i), grad, "input " + std::to_string(i));
  }

 private:
  Status add_grad(Value* in, Value* grad, const std::string& what) {
    if (in == nullptr || grad == nullptr || !live_.count(in)) return Status::ok();
    if (grad->dtype() != in->dtype())
      return internal_error() << node_->describe() << ": the gradient rule gave " << what << " dtype "
                              << dtype_name(grad->dtype()) << ", not " << dtype_name(in->dtype());
    auto it = grads_.find(in);
    if (it == grads_.end()) {
      grads_[in] = grad;
      return Status::ok();
    }
    KILN_ASSIGN_OR_RETURN(Value* sum, add1("Add", {it->second, grad}));
    it->second = sum;
    return Status::ok();
  }

  Graph& g_;
  ops::InferContext& ctx_;
  std::map<const Value*, Value*>& grads_;
  const std::set<const Value*>& live_;
  Node* node_ = nullptr;
};

}  // namespace

bool differentiable_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 || t == DType::kBFloat16;
}

Result<std::vector<Value*>> append_gradients(Graph& g, Value* loss, const std::vector<Value*>& params,
                                             bool computed_params) {
  if (loss == nullptr || !differentiable_dtype(loss->dtype()) || !loss->type().has_shape() || !loss->type().is_static() ||
      loss->type().numel().as_const() != 1)
    return invalid_argument() << "the loss must be a float value of one element"
                              << (loss ? ", not '" + loss->name() + "' of type " + loss->type().to_string() : "");
  for (const Value* p : params) {
    if (p == nullptr || !differentiable_dtype(p->dtype()))
      return invalid_argument() << "parameter " << (p ? "'" + p->name() + "'" : "(null)") << " is not a float value";
    if (p->producer() != nullptr && !computed_params)
      return invalid_argument() << "parameter '" << p->name() << "' is computed by " << p->producer()->describe()
                                << "; parameters are graph inputs or constants";
  }
  std::vector<Node*> order = g.nodes();
  // Values a parameter reaches, forward.
  std::set<const Value*> from_params(params.begin(), params.end());
  for (Node* n : order) {
    bool reached = false;
    for (const Value* in : n->inputs()) reached |= in != nullptr && from_params.count(in);
    for (const Value* v : g.implicit_inputs(n)) reached |= from_params.count(v) != 0;
    if (reached)
      for (const Value* o : n->outputs())
        if (o != nullptr && differentiable_dtype(o->dtype())) from_params.insert(o);
  }
  // Of those, the values the loss depends on, backward: gradients flow there.
  std::set<const Value*> live;
  std::vector<Node*> on_path;
  if (from_params.count(loss)) live.insert(loss);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    bool feeds_loss = false;
    for (const Value* o : n->outputs()) feeds_loss |= o != nullptr && live.count(o);
    if (!feeds_loss) continue;
    on_path.push_back(n);
    for (const Value* in : n->inputs())
      if (in != nullptr && from_params.count(in)) live.insert(in);
    for (const Value* v : g.implicit_inputs(n))
      if (from_params.count(v)) live.insert(v);
  }
  // Every op on the path needs a rule: all missing ones in one error.
  std::map<std::string, std::vector<std::string>> missing;
  for (auto it = on_path.rbegin(); it != on_path.rend(); ++it) {  // in graph order
    const Node* n = *it;
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    if (def == nullptr || !def->gradient) {
      std::string op = n->domain().empty() ? n->op_type() : n->domain() + ":" + n->op_type();
      // The node by its name, else by its first output's.
      const std::string& name = n->name().empty() && n->output(0) ? n->output(0)->name() : n->name();
      missing[op].push_back("'" + name + "'");
    }
  }
  if (!missing.empty()) {
    std::ostringstream os;
    os << (g.source.empty() ? std::string("the graph") : g.source) << ": no gradient rule for " << missing.size()
       << " op" << (missing.size() == 1 ? "" : "s") << " between the parameters and the loss:";
    for (const auto& [op, nodes] : missing) {
      os << " " << op << " (" << nodes.front();
      if (nodes.size() > 1) os << " and " << nodes.size() - 1 << " more";
      os << ");";
    }
    std::string text = os.str();
    text.pop_back();
    return unsupported() << text;
  }

  ops::InferContext ctx;
  ctx.graph = &g;
  ctx.bounds = g.bounds;
  ctx.next_fresh = 1 << 20;  // past the forward inference's fresh symbols
  std::map<const Value*, Value*> grads;
  Builder b(g, ctx, grads, live);
  if (live.count(loss)) {
    Tensor one(loss->dtype(), loss->type().static_shape());
    one.set_f64(0, 1.0);
    grads[loss] = b.constant(std::move(one));
  }
  for (Node* n : on_path) {  // last to first
    bool any = false;
    for (const Value* o : n->outputs()) any |= o != nullptr && grads.count(o);
    if (!any) continue;
    b.visit(n);
    Status st = ops::find_op(n->domain(), n->op_type())->gradient(b);
    if (!st.is_ok()) return st.with_context("the gradient of " + n->describe());
  }
  std::vector<Value*> out;
  for (Value* p : params) {
    auto it = grads.find(p);
    if (it != grads.end()) {
      out.push_back(it->second);
      continue;
    }
    // Independent of the loss: zeros of its shape.
    if (!p->type().has_shape() || !p->type().is_static())
      return unsupported() << "parameter '" << p->name() << "' does not affect the loss and has no static shape";
    out.push_back(b.constant(Tensor(p->dtype(), p->type().static_shape())));
  }
  return out;
}

}  // namespace train
}  // namespace kiln
