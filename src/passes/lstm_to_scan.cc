#include "passes/lstm_to_scan.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool is_real(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

bool present(const Node* n, size_t i) { return n->input(i) != nullptr; }

// The directions of an LSTM: forward, reverse or both (nullopt: another value).
std::optional<std::vector<bool>> reversed_directions(const Node* n) {
  std::string d = n->attr_string("direction", "forward");
  if (d == "forward") return std::vector<bool>{false};
  if (d == "reverse") return std::vector<bool>{true};
  if (d == "bidirectional") return std::vector<bool>{false, true};
  return std::nullopt;
}

bool default_activations(const Node* n, size_t dirs) {
  if (n->has_attr("activation_alpha") || n->has_attr("activation_beta")) return false;
  const Attribute* a = n->attr("activations");
  if (a == nullptr) return true;
  if (a->kind != Attribute::Kind::kStrings || a->strings.size() != 3 * dirs) return false;
  for (size_t d = 0; d < dirs; ++d)
    if (a->strings[3 * d] != "Sigmoid" || a->strings[3 * d + 1] != "Tanh" || a->strings[3 * d + 2] != "Tanh")
      return false;
  return true;
}

bool applies(const Graph& g, const Node* n) {
  if (!is_op(n, "LSTM") || n->has_attr("kiln_projected_input")) return false;
  auto opset = g.opsets.find("");
  if (opset != g.opsets.end() && opset->second < 9) return false;  // Scan of opset 8 is batched
  auto dirs = reversed_directions(n);
  if (!dirs || !default_activations(n, dirs->size())) return false;
  if (n->has_attr("clip") || n->attr_int("input_forget", 0) != 0 || n->attr_int("layout", 0) != 0) return false;
  if (present(n, 4) || present(n, 7)) return false;  // sequence_lens, peepholes
  const Value* x = n->input(0);
  const Tensor* w = constant_of(n->input(1));
  const Tensor* r = constant_of(n->input(2));
  if (x == nullptr || w == nullptr || r == nullptr || !is_real(w->dtype()) || x->dtype() != w->dtype() ||
      r->dtype() != w->dtype() || w->rank() != 3 || r->rank() != 3 || x->type().rank() != 3)
    return false;
  const int64_t nd = static_cast<int64_t>(dirs->size()), h = r->shape()[2];
  if (h < 1 || w->shape()[0] != nd || w->shape()[1] != 4 * h || r->shape()[0] != nd || r->shape()[1] != 4 * h ||
      w->numel() == 0)
    return false;
  if (n->attr_int("hidden_size", h) != h) return false;
  auto in = (*x->type().shape)[2].as_const();
  if (!in || *in != w->shape()[2]) return false;
  if (present(n, 3)) {
    const Tensor* b = constant_of(n->input(3));
    if (b == nullptr || b->dtype() != w->dtype() || b->shape() != std::vector<int64_t>{nd, 8 * h}) return false;
  }
  for (size_t i : {size_t{5}, size_t{6}}) {
    const Value* s = n->input(i);
    if (s != nullptr && (s->dtype() != w->dtype() || s->type().rank() != 3)) return false;
  }
  return true;
}

// Element (i, j) of a [rows, cols] block at `src` (elements of `es` bytes)
// copied to (j, i) of `dst`.
void transpose_block(const char* src, char* dst, int64_t rows, int64_t cols, size_t es) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) std::memcpy(dst + (j * rows + i) * es, src + (i * cols + j) * es, es);
}

// The step of direction d as a Scan body: inputs h [B, H], c [B, H], p [B, 4H];
// outputs h', c', and h' again as the scan output.
std::shared_ptr<Graph> step_body(const Graph& g, const Tensor& rt, const Expr& batch, int64_t h, DType dt,
                                 const std::string& base) {
  auto body = std::make_shared<Graph>();
  body->opsets = g.opsets;
  body->source = g.source;
  Value* hv = body->add_input(base + ".h", TensorType{dt, Shape{batch, Expr(h)}});
  Value* cv = body->add_input(base + ".c", TensorType{dt, Shape{batch, Expr(h)}});
  Value* pv = body->add_input(base + ".p", TensorType{dt, Shape{batch, Expr(4 * h)}});
  Value* r = body->add_constant(base + ".rt", rt);
  auto op = [&](const char* type, std::vector<Value*> ins, const std::string& out) {
    return body->add_node(type, ins, {base + "." + out})->output(0);
  };
  Value* gates = op("Add", {op("MatMul", {hv, r}, "hr"), pv}, "g");
  Node* split = body->add_node("Split", {gates}, {base + ".gi", base + ".go", base + ".gf", base + ".gz"});
  split->set_attr("axis", Attribute::of_int(1));
  Value* i = op("Sigmoid", {split->output(0)}, "i");
  Value* o = op("Sigmoid", {split->output(1)}, "o");
  Value* f = op("Sigmoid", {split->output(2)}, "f");
  Value* z = op("Tanh", {split->output(3)}, "z");
  Value* c2 = op("Add", {op("Mul", {f, cv}, "fc"), op("Mul", {i, z}, "iz")}, "c2");
  Value* h2 = op("Mul", {o, op("Tanh", {c2}, "tc")}, "h2");
  Value* y = op("Identity", {h2}, "y");
  body->set_outputs({h2, c2, y});
  return body;
}

}  // namespace

Result<int> lstm_to_scan(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(g, n)) todo.push_back(n);
  for (Node* n : todo) {
    const std::vector<bool> dirs = *reversed_directions(n);
    const Tensor& w = n->input(1)->constant();
    const Tensor& r = n->input(2)->constant();
    const DType dt = w.dtype();
    const size_t es = dtype_size(dt);
    const int64_t nd = static_cast<int64_t>(dirs.size()), h = r.shape()[2], in = w.shape()[2];
    // Names derive from the LSTM's Y (every value made is given a unique name).
    const std::string base = n->output(0) != nullptr ? n->output(0)->name() : n->input(0)->name();
    Value* x = n->input(0);
    const Expr batch = (*x->type().shape)[1];
    // W [nd, 4H, in] -> W^T [in, nd * 4H]; bias Wb + Rb [nd * 4H].
    Tensor wt = transpose_tensor(w, {2, 0, 1}).reshaped({in, nd * 4 * h});
    Tensor bias(dt, {nd * 4 * h});
    if (const Tensor* b = constant_of(n->input(3))) {
      for (int64_t d = 0; d < nd; ++d)
        for (int64_t k = 0; k < 4 * h; ++k) {
          int64_t at = d * 8 * h + k;
          double v = b->get_f64(at) + b->get_f64(at + 4 * h);
          bias.set_f64(d * 4 * h + k, v);
        }
    }
    // One [seq * batch, input] x [input, nd * 4H] product (a 3-D MatMul would
    // be seq products of batch rows each), viewed as [seq, batch, nd * 4H].
    Value* rows = view_as_rows(g, n, x, in, base);
    Value* proj = g.insert_node_before(n, "MatMul", {rows, g.add_constant(g.unique_name(base + ".wt"), std::move(wt))},
                                       {g.unique_name(base + ".proj")})
                      ->output(0);
    if (present(n, 3))
      proj = g.insert_node_before(n, "Add", {proj, g.add_constant(g.unique_name(base + ".bias"), std::move(bias))},
                                  {g.unique_name(base + ".proj_b")})
                 ->output(0);
    proj = view_with_leading_dims(g, n, proj, x, 2, nd * 4 * h, base + ".proj");
    std::vector<Value*> per_dir = {proj};
    if (nd > 1) {
      Node* split = g.insert_node_before(n, "Split", {proj}, {g.unique_name(base + ".p0"), g.unique_name(base + ".p1")});
      split->set_attr("axis", Attribute::of_int(2));
      per_dir = {split->output(0), split->output(1)};
    }
    // Initial states: direction d of [nd, B, H], or zeros of [B, H].
    Value* zeros = nullptr;
    auto initial = [&](size_t input, int64_t d) -> Value* {
      if (Value* s = n->input(input)) {
        Value* idx = g.add_constant(g.unique_name(base + ".d" + std::to_string(d)), int64_vector({d}).reshaped({}));
        return g.insert_node_before(n, "Gather", {s, idx}, {g.unique_name(base + ".init")})->output(0);
      }
      if (zeros != nullptr) return zeros;
      if (auto b = batch.as_const()) {
        zeros = g.add_constant(g.unique_name(base + ".zeros"), Tensor(dt, {*b, h}));
      } else {
        Value* shape = g.insert_node_before(n, "Shape", {x}, {g.unique_name(base + ".xshape")})->output(0);
        Value* one = g.add_constant(g.unique_name(base + ".one"), int64_vector({1}));
        Value* b1 = g.insert_node_before(n, "Gather", {shape, one}, {g.unique_name(base + ".batch")})->output(0);
        Value* hv = g.add_constant(g.unique_name(base + ".hidden"), int64_vector({h}));
        Node* cat = g.insert_node_before(n, "Concat", {b1, hv}, {g.unique_name(base + ".state_shape")});
        cat->set_attr("axis", Attribute::of_int(0));
        Node* fill = g.insert_node_before(n, "ConstantOfShape", {cat->output(0)}, {g.unique_name(base + ".zeros")});
        fill->set_attr("value", Attribute::of_tensor(Tensor(dt, {1})));
        zeros = fill->output(0);
      }
      return zeros;
    };
    std::vector<Value*> ys, hs, cs;
    for (int64_t d = 0; d < nd; ++d) {
      // R_d [4H, H] -> R_d^T [H, 4H].
      Tensor rt(dt, {h, 4 * h});
      transpose_block(static_cast<const char*>(r.data()) + d * 4 * h * h * es, static_cast<char*>(rt.data()), 4 * h, h,
                      es);
      std::string db = base + ".dir" + std::to_string(d);
      auto body = step_body(g, rt, batch, h, dt, db);
      Node* scan = g.insert_node_before(n, "Scan", {initial(5, d), initial(6, d), per_dir[static_cast<size_t>(d)]},
                                        {g.unique_name(db + ".h"), g.unique_name(db + ".c"), g.unique_name(db + ".y")});
      scan->set_attr("body", Attribute::of_graph(body));
      scan->set_attr("num_scan_inputs", Attribute::of_int(1));
      if (dirs[static_cast<size_t>(d)]) {
        scan->set_attr("scan_input_directions", Attribute::of_ints({1}));
        scan->set_attr("scan_output_directions", Attribute::of_ints({1}));
      }
      hs.push_back(scan->output(0));
      cs.push_back(scan->output(1));
      ys.push_back(scan->output(2));
    }
    // [.., B, H] pieces with a direction axis inserted at `axis`, concatenated along it.
    auto stack = [&](const std::vector<Value*>& parts, const std::vector<int64_t>& shape, int64_t axis,
                     const std::string& name) {
      Value* target = g.add_constant(g.unique_name(name + "_shape"), int64_vector(shape));
      std::vector<Value*> views;
      for (Value* p : parts)
        views.push_back(g.insert_node_before(n, "Reshape", {p, target}, {g.unique_name(name + ".part")})->output(0));
      if (views.size() == 1) return views[0];
      Node* cat = g.insert_node_before(n, "Concat", views, {g.unique_name(name)});
      cat->set_attr("axis", Attribute::of_int(axis));
      return cat->output(0);
    };
    const std::vector<std::vector<int64_t>> shapes = {{0, 1, -1, h}, {1, -1, h}, {1, -1, h}};
    const std::vector<int64_t> axes = {1, 0, 0};
    const std::vector<std::vector<Value*>*> outs = {&ys, &hs, &cs};
    for (size_t k = 0; k < 3; ++k) {
      Value* old = n->output(k);
      if (old == nullptr || (old->uses().empty() && !is_graph_output(g, old))) continue;
      Value* v = stack(*outs[k], shapes[k], axes[k], base + (k == 0 ? ".Y" : k == 1 ? ".Y_h" : ".Y_c"));
      if (!replace_value(g, old, v)) return internal_error() << n->describe() << ": lstm-to-scan could not replace output " << k;
    }
    g.remove_node(n);
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
