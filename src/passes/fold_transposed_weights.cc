#include "passes/fold_transposed_weights.h"

#include <numeric>

#include "passes/rewrite.h"

namespace kiln::passes {

namespace {

bool foldable(const Value* v) {
  return v != nullptr && v->is_constant() && v->constant().dtype() != DType::kString;
}

}  // namespace

Result<int> fold_transposed_weights(Graph& g) {
  int rewrites = 0;
  std::vector<Node*> folded;
  for (Node* n : g.nodes()) {
    if (!n->domain().empty()) continue;
    if (n->op_type() == "Gemm") {
      for (int operand : {0, 1}) {
        const char* flag = operand == 0 ? "transA" : "transB";
        Value* v = n->input(operand);
        if (n->attr_int(flag, 0) == 0 || !foldable(v) || v->constant().rank() != 2) continue;
        Tensor t = transpose_tensor(v->constant(), {1, 0});
        Value* c = g.add_constant(g.unique_name(v->name() + ".T"), std::move(t));
        g.set_input(n, operand, c);
        n->set_attr(flag, Attribute::of_int(0));
        ++rewrites;
      }
    } else if (n->op_type() == "Transpose" && foldable(n->input(0)) && n->output(0) != nullptr) {
      const Tensor& in = n->input(0)->constant();
      std::vector<int64_t> perm = n->attr_ints("perm");
      if (perm.empty()) {
        perm.resize(in.rank());
        std::iota(perm.rbegin(), perm.rend(), 0);
      }
      if (static_cast<int64_t>(perm.size()) != in.rank()) continue;  // invalid: inference reports it
      std::vector<bool> seen(perm.size(), false);
      bool valid = true;
      for (int64_t p : perm) {
        if (p < 0 || p >= in.rank() || seen[p]) valid = false;
        if (valid) seen[p] = true;
      }
      if (!valid) continue;
      Value* out = n->output(0);
      Value* c = g.add_constant(g.unique_name(out->name() + ".folded"), transpose_tensor(in, perm));
      g.replace_all_uses(out, c);
      folded.push_back(n);
      ++rewrites;
    }
  }
  // The folded Transposes (their readers, subgraph captures included, now
  // read the constant), then constants nobody reads.
  for (Node* n : folded) {
    bool is_output = false;
    for (const Value* o : g.outputs()) is_output |= o == n->output(0);
    if (!is_output && n->output(0)->uses().empty()) g.remove_node(n);
  }
  g.remove_dead_values();
  return rewrites;
}

}  // namespace kiln::passes
