#include "passes/project_rnn_inputs.h"

#include <cstring>

#include "passes/rewrite.h"
#include "support/target.h"

namespace kiln::passes {

namespace {

int gates_of(const std::string& op) { return op == "LSTM" ? 4 : op == "GRU" ? 3 : op == "RNN" ? 1 : 0; }

bool is_real(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// R [nd, G*H, H] -> panels [nd, ceil(H / pw), H, G, pw] of pw hidden units,
// zero past H: a block of pw units streams one contiguous panel per step
// (ops/rnn.cc reads this layout). 256 bytes of units (64 f32) where the
// target has 32 vector registers, 64 bytes otherwise: the step's loop holds a
// panel row's gates in registers, and with 16 registers a 256-byte panel was
// read in four strided passes (measured slower on the LSTM model).
Tensor pack_r(const Tensor& r, int64_t gates) {
  int64_t nd = r.shape()[0], h = r.shape()[2];
  size_t es = dtype_size(r.dtype());
  int64_t pw = (Target::host().vector_registers >= 32 ? 256 : 64) / static_cast<int64_t>(es);
  int64_t panels = (h + pw - 1) / pw;
  Tensor out(r.dtype(), {nd, panels, h, gates, pw});
  char* dst = static_cast<char*>(out.data());
  std::memset(dst, 0, static_cast<size_t>(out.nbytes()));
  const char* src = static_cast<const char*>(r.data());
  for (int64_t d = 0; d < nd; ++d)
    for (int64_t g = 0; g < gates; ++g)
      for (int64_t u = 0; u < h; ++u)
        for (int64_t k = 0; k < h; ++k)
          std::memcpy(dst + ((((d * panels + u / pw) * h + k) * gates + g) * pw + u % pw) * es,
                      src + ((d * gates * h + g * h + u) * h + k) * es, es);
  return out;
}

// The input biases Wb of every direction, [nd * gh] (B is [nd, 2 * gh]).
Tensor input_bias(const Tensor& b, int64_t nd, int64_t gh) {
  Tensor out(b.dtype(), {nd * gh});
  size_t es = dtype_size(b.dtype());
  for (int64_t d = 0; d < nd; ++d)
    std::memcpy(static_cast<char*>(out.data()) + d * gh * es, static_cast<const char*>(b.data()) + d * 2 * gh * es,
                static_cast<size_t>(gh) * es);
  return out;
}

bool applies(const Node* n) {
  int gates = gates_of(n->op_type());
  if (!n->domain().empty() || gates == 0 || n->has_attr("kiln_projected_input")) return false;
  const Value* x = n->input(0);
  const Tensor* w = constant_of(n->input(1));
  const Tensor* r = constant_of(n->input(2));
  if (x == nullptr || w == nullptr || r == nullptr || !is_real(w->dtype()) || x->dtype() != w->dtype() ||
      r->dtype() != w->dtype() || w->rank() != 3 || r->rank() != 3 || x->type().rank() != 3)
    return false;
  int64_t nd = w->shape()[0], gh = w->shape()[1], h = r->shape()[2];
  if (nd < 1 || h < 1 || gh != gates * h || r->shape()[0] != nd || r->shape()[1] != gh || w->numel() == 0)
    return false;
  auto in = (*x->type().shape)[2].as_const();
  if (!in || *in != w->shape()[2]) return false;
  if (const Value* bv = n->input(3)) {
    const Tensor* b = constant_of(bv);
    if (b == nullptr || b->dtype() != w->dtype() || b->shape() != std::vector<int64_t>{nd, 2 * gh}) return false;
  }
  return true;
}

}  // namespace

Result<int> project_rnn_inputs(Graph& g, PassContext&) {
  std::vector<Node*> todo;
  for (Node* n : g.nodes())
    if (applies(n)) todo.push_back(n);
  for (Node* n : todo) {
    const Tensor& w = n->input(1)->constant();
    int64_t nd = w.shape()[0], gh = w.shape()[1];
    std::string base = n->output(0) != nullptr ? n->output(0)->name() : n->input(0)->name();
    Value* x = n->input(0);
    int64_t in = w.shape()[2];
    // The projection is one [seq * batch, input] x [input, nd * gates * hidden]
    // product (a 3-D MatMul would be seq products of batch rows each), then
    // viewed as [.., .., nd * gates * hidden] again: its shape comes from X's
    // first two dims (Shape/Gather/Concat, evaluated symbolically).
    Value* rows = view_as_rows(g, n, x, in, base);
    // W [nd, gh, in] -> W^T [in, nd * gh]: direction d's gates at columns d * gh.
    Value* wt = g.add_constant(g.unique_name(n->input(1)->name() + ".t"),
                               transpose_tensor(w, {2, 0, 1}).reshaped({in, nd * gh}));
    Node* mm = g.insert_node_before(n, "MatMul", {rows, wt}, {g.unique_name(base + ".proj")});
    Value* projected = mm->output(0);
    if (const Tensor* b = constant_of(n->input(3))) {
      Value* wb = g.add_constant(g.unique_name(n->input(3)->name() + ".wb"), input_bias(*b, nd, gh));
      Node* add = g.insert_node_before(n, "Add", {projected, wb}, {g.unique_name(base + ".proj_b")});
      projected = add->output(0);
    }
    projected = view_with_leading_dims(g, n, projected, x, 2, nd * gh, base + ".proj");
    Value* rt = g.add_constant(g.unique_name(n->input(2)->name() + ".panels"),
                               pack_r(n->input(2)->constant(), gates_of(n->op_type())));
    g.set_input(n, 0, projected);
    g.set_input(n, 1, nullptr);
    g.set_input(n, 2, rt);
    n->set_attr("kiln_projected_input", Attribute::of_int(1));
  }
  return static_cast<int>(todo.size());
}

}  // namespace kiln::passes
