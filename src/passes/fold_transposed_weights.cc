#include "passes/fold_transposed_weights.h"

#include <cstring>
#include <numeric>

namespace kiln::passes {

namespace {

// Transposes a constant tensor by `perm` (element bytes copied as they are).
Tensor transpose_tensor(const Tensor& t, const std::vector<int64_t>& perm) {
  int64_t rank = t.rank();
  std::vector<int64_t> out_shape(rank);
  for (int64_t i = 0; i < rank; ++i) out_shape[i] = t.shape()[perm[i]];
  Tensor out(t.dtype(), out_shape);
  std::vector<int64_t> in_strides(rank, 1);
  for (int64_t i = rank - 2; i >= 0; --i) in_strides[i] = in_strides[i + 1] * t.shape()[i + 1];
  int64_t esize = dtype_size(t.dtype());
  std::vector<int64_t> idx(rank, 0);
  const char* src = static_cast<const char*>(t.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    int64_t off = 0;
    for (int64_t i = 0; i < rank; ++i) off += idx[i] * in_strides[perm[i]];
    std::memcpy(dst + flat * esize, src + off * esize, static_cast<size_t>(esize));
    for (int64_t i = rank - 1; i >= 0; --i) {
      if (++idx[i] < out_shape[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

bool foldable(const Value* v) {
  return v != nullptr && v->is_constant() && v->constant().dtype() != DType::kString;
}

}  // namespace

Result<int> fold_transposed_weights(Graph& g) {
  int rewrites = 0;
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
      ++rewrites;
    }
  }
  // Transposes whose outputs lost all uses, then constants nobody reads.
  for (Node* n : g.nodes()) {
    if (n->op_type() != "Transpose" || n->output(0) == nullptr || !n->output(0)->uses().empty()) continue;
    bool is_output = false;
    for (const Value* o : g.outputs()) is_output |= o == n->output(0);
    if (!is_output) g.remove_node(n);
  }
  g.remove_dead_values();
  return rewrites;
}

}  // namespace kiln::passes
