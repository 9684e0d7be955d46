#include "passes/pack_conv_weights.h"

#include <cstring>
#include <map>

namespace kiln::passes {

namespace {

// [O, I, KH, KW] -> [I, KH, KW, O] (element bytes copied as they are).
Tensor pack_ihwo(const Tensor& t) {
  const std::vector<int64_t>& s = t.shape();
  int64_t o = s[0], i = s[1], kh = s[2], kw = s[3];
  Tensor out(t.dtype(), {i, kh, kw, o});
  size_t esize = dtype_size(t.dtype());
  const char* src = static_cast<const char*>(t.data());
  char* dst = static_cast<char*>(out.data());
  int64_t inner = i * kh * kw;  // elements of one output channel in the source
  for (int64_t m = 0; m < o; ++m) {
    for (int64_t r = 0; r < inner; ++r) {
      std::memcpy(dst + (r * o + m) * esize, src + (m * inner + r) * esize, esize);
    }
  }
  return out;
}

// Output width a constant below 8, or a horizontal stride other than 1 with an
// output at least 16 wide; and a
// kernel of at most 3x3; and a reduction of at least 64 products per output;
// and an output height that tiles into rows (see below).
// (Measured: the 7x7 stride-2 stem of resnet18, 3 input channels, ran 5x
// slower packed: LLVM no longer keeps that larger tile's accumulators in
// vector registers. squeezenet's 3x3 stride-2 stem, 3 input channels (27
// products), ran 5x slower packed: the 16 scattered NCHW stores per output
// vector outweigh so short a reduction.)
bool worth_packing(const Node& n) {
  const Value* w = n.input(1);
  if (w == nullptr || !w->is_constant() || w->constant().rank() != 4) return false;
  const std::vector<int64_t>& ws = w->constant().shape();
  if (ws[2] > 3 || ws[3] > 3) return false;
  if (ws[1] * ws[2] * ws[3] < 64) return false;
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || y->type().rank() != 4) return false;
  // The packed schedule tiles output rows by 8..4 (or whole when <= 8); a
  // height with no such divisor needs overlapping row tiles, which LLVM
  // leaves scalar (inception's 17x17 stride-2 conv ran 1.8x slower packed).
  auto height = (*y->type().shape)[2].as_const();
  if (!height) return false;
  bool rows_tile = *height <= 8;
  for (int64_t f = 8; f >= 4 && !rows_tile; --f) rows_tile = *height % f == 0;
  if (!rows_tile) return false;
  auto width = (*y->type().shape)[3].as_const();
  if (!width) return false;
  if (*width < 8) return true;
  // Strided: packed wins on wide outputs (56x56 -> 28x28: 23 -> 60 GFLOP/s)
  // and loses on narrow ones (inception's 17x17 -> 8x8: 1.7 -> 7.8 ms).
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  return strides.size() == 2 && strides[1] != 1 && *width >= 16;
}

}  // namespace

Result<int> pack_conv_weights(Graph& g) {
  int rewrites = 0;
  std::map<Value*, Value*> packed;
  for (Node* n : g.nodes()) {
    if (!n->domain().empty() || n->op_type() != "Conv" || n->num_inputs() < 2) continue;
    if (n->attr_int("group", 1) != 1 || n->has_attr(kConvWeightLayoutAttr)) continue;
    if (!worth_packing(*n)) continue;
    Value* w = n->input(1);
    if (w == nullptr || !w->is_constant()) continue;
    const Tensor& t = w->constant();
    if (t.rank() != 4 || t.dtype() == DType::kString || t.numel() == 0) continue;
    auto it = packed.find(w);
    if (it == packed.end()) {
      Value* c = g.add_constant(g.unique_name(w->name() + ".ihwo"), pack_ihwo(t));
      it = packed.emplace(w, c).first;
    }
    g.set_input(n, 1, it->second);
    Attribute a;
    a.kind = Attribute::Kind::kString;
    a.s = kConvWeightLayoutIHWO;
    n->set_attr(kConvWeightLayoutAttr, a);
    ++rewrites;
  }
  if (rewrites > 0) g.remove_dead_values();
  return rewrites;
}

}  // namespace kiln::passes
