// matmul.attention: the attention chain as one kernel, a block of score rows
// at a time.
//
// Pattern (the MatMul this candidate is for is the second product):
//   S = MatMul(Q, Kt)                 scores [batch..., M, N]
//   T = e_k(...e_1(S, x_1)..., x_k)   elementwise ops of the scores' shape
//                                     (scale, mask add, Where), k >= 0
//   P = Softmax(T) over the last axis
//   O = MatMul(P, V)                  [batch..., M, D]
// where S, each e_i and P are read only by the next step and are no graph
// output. partition/fuse_elementwise.h puts the nodes in one kernel with O
// (attention_nodes below), whose stages are S, the e_i, the softmax's max,
// sum and normalized output, and O.
//
// Template: every stage of the chain is split along the row axis by `rb`
// and computed inside O's loop over row blocks (tir compute_at), so only rb
// rows of scores exist at once (scratch of rb x N per stage, not M x N): the
// scores' product as an rb x nr register tile over Kt's contiguous columns,
// the elementwise ops inlined into their readers, the row max and sum
// accumulated in vector lanes along the row (rfactor), the normalized row
// block vectorized, then O's rb x nr tile reads it from cache. The batch
// loops (or the row blocks) are the parallel loop. Knobs: rb (rows per block
// and per register tile), nr (columns of a tile: one or two vectors), vw
// (the vector width of the row reductions; fixed by the target).
#include <algorithm>
#include <set>

#include "ops/registry.h"
#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

bool same_dims(const Shape& a, const Shape& b, size_t count) {
  if (a.size() < count || b.size() < count) return false;
  for (size_t i = 0; i < count; ++i) {
    auto d = simplify(a[i] - b[i]).as_const();
    if (!d || *d != 0) return false;
  }
  return true;
}

bool is_elementwise_op(const Node& n) {
  const ops::OpDef* def = ops::find_op(n.domain(), n.op_type());
  return def != nullptr && def->is_elementwise && def->lower && n.num_outputs() == 1;
}

// The chain of `n` (a MatMul) as described above, producers first: the score
// MatMul, the elementwise ops, the Softmax. Empty, with *why set, when the
// pattern does not hold. Graph outputs and the opset are checked by
// attention_applies_in_graph.
std::vector<const Node*> find_chain(const Node& n, std::string* why) {
  auto no = [&](const char* reason) {
    if (why) *why = reason;
    return std::vector<const Node*>{};
  };
  if (!n.domain().empty() || n.op_type() != "MatMul" || n.num_inputs() != 2 || n.num_outputs() != 1)
    return no("not a MatMul");
  const Value* p = n.input(0);
  const Value* y = n.output(0);
  if (p == nullptr || y == nullptr || !p->type().shape || !y->type().shape) return no("shapes unknown");
  if (y->dtype() != DType::kFloat32) return no("not f32");
  const Shape& ps = *p->type().shape;
  const Shape& ys = *y->type().shape;
  if (ps.size() < 2 || ps.size() != ys.size() || !same_dims(ps, ys, ps.size() - 1))
    return no("A's batch and rows are not the output's");
  const Node* sm = p->producer();
  if (sm == nullptr || !sm->domain().empty() || sm->op_type() != "Softmax" || p->uses().size() != 1)
    return no("A is not a Softmax read only here");
  const Attribute* axis = sm->attr("axis");
  int64_t rank = static_cast<int64_t>(ps.size());
  // Without the attribute the default axis depends on the opset (1 before
  // 13, -1 after); the same only for rank 2.
  if (axis == nullptr ? rank != 2 : axis->i != -1 && axis->i != rank - 1) return no("Softmax not over the last axis");
  std::vector<const Node*> chain = {sm};
  const Value* v = sm->input(0);
  for (int depth = 0; depth < 16; ++depth) {
    if (v == nullptr || !v->type().shape || !same_dims(*v->type().shape, ps, ps.size()) || v->type().shape->size() != ps.size() ||
        v->uses().size() != 1 || v->dtype() != DType::kFloat32)
      return no("the scores are read elsewhere or change shape");
    const Node* q = v->producer();
    if (q == nullptr) return no("no score MatMul");
    if (q->domain().empty() && q->op_type() == "MatMul" && q->num_outputs() == 1) {
      chain.push_back(q);
      std::reverse(chain.begin(), chain.end());
      return chain;
    }
    if (!is_elementwise_op(*q)) return no("the scores pass through an op that is not elementwise");
    // The input that carries the scores: the one of their shape made by a MatMul or another elementwise op.
    const Value* next = nullptr;
    int found = 0;
    for (const Value* in : q->inputs()) {
      if (in == nullptr || in->producer() == nullptr || !in->type().shape || in->type().shape->size() != ps.size() ||
          !same_dims(*in->type().shape, ps, ps.size()))
        continue;
      const Node* pp = in->producer();
      if ((pp->domain().empty() && pp->op_type() == "MatMul") || is_elementwise_op(*pp)) {
        next = in;
        ++found;
      }
    }
    if (found != 1) return no("no single score operand in the elementwise chain");
    chain.push_back(q);
    v = next;
  }
  return no("elementwise chain too long");
}

bool attention_applies(const Node& n, std::string* why) { return !find_chain(n, why).empty(); }

bool attention_applies_in_graph(const Graph& g, const Node& n, std::string* why) {
  std::vector<const Node*> chain = find_chain(n, why);
  std::set<const Value*> read_elsewhere(g.outputs().begin(), g.outputs().end());
  for (const Node* m : g.nodes())
    for (const Value* v : g.implicit_inputs(m)) read_elsewhere.insert(v);
  for (const Node* c : chain)
    if (read_elsewhere.count(c->output(0))) {
      if (why) *why = "a step of the chain is a graph output or read by a subgraph";
      return false;
    }
  // Softmax before opset 13 normalizes over every dim from `axis` on: the
  // same as the last axis only where axis is the last (checked above).
  return !chain.empty();
}

tir::KnobSpace attention_space(const Node&, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"rb", {1, 2, 4, 6, 8, 12}});
  s.knobs.push_back(tir::Knob{"nr", {lanes, 2 * lanes}});
  s.knobs.push_back(tir::Knob{"vw", {lanes}});
  s.valid = [lanes, acc](const tir::Knobs& k) { return k.at("rb") * k.at("nr") / lanes <= acc; };
  return s;
}

tir::Knobs attention_defaults(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  // Two vectors of columns where the head width fills them (64 = 2 x 16).
  const Value* y = n.output(0);
  std::optional<int64_t> d = y && y->type().shape && !y->type().shape->empty() ? y->type().shape->back().as_const()
                                                                                 : std::nullopt;
  int64_t nr = d && *d >= 2 * lanes ? 2 * lanes : lanes;
  int64_t rb = std::min<int64_t>(8, acc / (nr / lanes));
  return {{"rb", rb}, {"nr", nr}, {"vw", lanes}};
}

Result<tir::Schedule> attention_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  KILN_ASSIGN_OR_RETURN(int64_t rb, knob(knobs, "rb", "matmul.attention"));
  KILN_ASSIGN_OR_RETURN(int64_t nr, knob(knobs, "nr", "matmul.attention"));
  KILN_ASSIGN_OR_RETURN(int64_t vw, knob(knobs, "vw", "matmul.attention"));
  auto oi = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& s) { return s.name == stage; });
  if (oi == k.stages.end()) return invalid_argument() << "matmul.attention: kernel has no stage '" << stage << "'";
  const tir::ComputeDef& O = *oi;
  const size_t r = O.axes.size();
  // Where the kernel is not the chain (its nodes could not join one group),
  // the MatMul alone gets the default schedule, like matmul.default.
  if (r < 2 || O.reduce_axes.size() != 1) return tir::default_schedule(k);
  std::set<std::string> params;
  for (const tir::Buffer& b : k.params) params.insert(b.name);
  auto reads = [](const tir::ComputeDef& c, const std::string& name) {
    bool found = false;
    for (const Expr* e : {&c.body, &c.init, &c.finalize}) {
      if (!e->defined()) continue;
      rewrite(*e, [&](const Expr& x) -> Expr {
        if (x.kind() == ExprKind::kLoad && x->int_value == -1 && x->name == name) found = true;
        return Expr();
      });
    }
    return found;
  };
  std::vector<const tir::ComputeDef*> blocked;  // computed per row block, in stage order
  std::vector<std::string> inlined;
  int softmax_reductions = 0;
  for (auto it = k.stages.begin(); it != oi; ++it) {
    const tir::ComputeDef& x = *it;
    if (params.count(x.name)) return tir::default_schedule(k);  // a value the kernel also outputs
    const bool reduction = !x.reduce_axes.empty();
    if (!reduction && !reads(O, x.name)) {
      inlined.push_back(x.name);
      continue;
    }
    // Batch and rows first, as O's: rank r (the scores, the normalized
    // scores) or r - 1 (the row max and sum).
    if ((x.axes.size() != r && x.axes.size() != r - 1) || x.shape.size() < r - 1) return tir::default_schedule(k);
    for (size_t i = 0; i + 1 < r; ++i) {
      auto d = simplify(x.shape[i] - O.shape[i]).as_const();
      if (!d || *d != 0 || x.axes[i] != O.axes[i]) return tir::default_schedule(k);
    }
    if (reduction && x.axes.size() == r - 1) ++softmax_reductions;
    blocked.push_back(&x);
  }
  if (softmax_reductions < 2) return tir::default_schedule(k);

  const std::string& rows = O.axes[r - 2];
  const std::string ro = rows + ".o", ri = rows + ".i";
  std::vector<std::string> batch(O.axes.begin(), O.axes.begin() + static_cast<long>(r - 2));
  std::map<std::string, std::vector<tir::Primitive>> prims;
  for (const std::string& name : inlined) prims[name].push_back(prim("inline", name, {}));
  // A register tile: rows.i (unrolled) x cols.i (vectorized), reduce loops outside it.
  auto tile = [&](const tir::ComputeDef& x, int64_t cols_per_tile) {
    std::vector<tir::Primitive> ps;
    const std::string& cols = x.axes[r - 1];
    ps.push_back(prim("split", x.name, {rows}, rb));
    ps.push_back(prim("split", x.name, {cols}, cols_per_tile));
    std::vector<std::string> order = batch;
    for (const std::string& a : {ro, cols + ".o", ri, cols + ".i"}) order.push_back(a);
    ps.push_back(prim("reorder", x.name, order));
    ps.push_back(prim("cache_write", x.name, {cols + ".o"}));
    if (rb > 1) ps.push_back(prim("unroll", x.name, {ri}));
    ps.push_back(prim("vectorize", x.name, {cols + ".i"}));
    return ps;
  };
  for (const tir::ComputeDef* x : blocked) {
    std::vector<tir::Primitive> ps;
    if (!x->reduce_axes.empty() && x->axes.size() == r) {
      ps = tile(*x, nr);  // the scores' product
    } else if (!x->reduce_axes.empty()) {
      // Row max / sum: lanes along the row (contiguous), one combine per row.
      const std::string& red = x->reduce_axes.back();
      ps.push_back(prim("split", x->name, {rows}, rb));
      ps.push_back(prim("split", x->name, {red}, vw));
      ps.push_back(prim("rfactor", x->name, {red + ".i"}));
    } else {
      const std::string& cols = x->axes[r - 1];
      ps.push_back(prim("split", x->name, {rows}, rb));
      ps.push_back(prim("split", x->name, {cols}, vw));
      ps.push_back(prim("vectorize", x->name, {cols + ".i"}));
    }
    ps.push_back(prim("compute_at", x->name, {stage, ro}));
    prims[x->name] = std::move(ps);
  }
  std::vector<tir::Primitive> ops = tile(O, nr);
  std::vector<std::optional<int64_t>> counts;
  std::vector<std::string> outer = batch;
  for (size_t i = 0; i + 2 < r; ++i) counts.push_back(O.shape[i].as_const());
  auto m = O.shape[r - 2].as_const();
  outer.push_back(ro);
  counts.push_back(m ? std::optional<int64_t>((*m + rb - 1) / rb) : std::nullopt);
  if (int par = tir::choose_parallel(counts); par >= 0) ops.push_back(prim("parallel", stage, {outer[static_cast<size_t>(par)]}));
  prims[stage] = std::move(ops);
  // The stages were recognised by their ranks and leading dims only (a
  // kernel may hold other stages, e.g. a bias from another product joined to
  // the chain): where compute_at's checks refuse the placement, the kernel
  // keeps the default schedule.
  tir::Schedule s = replace_stage_schedules(k, prims);
  if (!tir::lower(k, s).is_ok()) return tir::default_schedule(k);
  return s;
}

}  // namespace

std::vector<const Node*> attention_nodes(const Node& anchor) {
  std::optional<Choice> c = recorded_choice(anchor);
  if (!c || c->candidate != "matmul.attention") return {};
  return find_chain(anchor, nullptr);
}

void register_attention_candidates() {
  Candidate c;
  c.name = "matmul.attention";
  c.op = "MatMul";
  c.priority = 15;
  c.summary = "Softmax(elementwise(A B)) V as one kernel, a block of score rows at a time (compute_at)";
  c.applies = attention_applies;
  c.applies_in_graph = attention_applies_in_graph;
  c.space = attention_space;
  c.default_knobs = attention_defaults;
  c.schedule = attention_schedule;
  c.fuses_producers = true;
  register_candidate(std::move(c));
}

}  // namespace kiln::strategy
