// Convolution candidates.
//
// conv.ihwo: the constant weight W[O, I, KH, KW] of a 2-D convolution with one
// group is stored [I, KH, KW, O] (attribute kiln_weight_layout "IHWO",
// understood by ops/conv.cc), so the default schedule vectorizes along the
// output channels with contiguous weight loads. conv.direct: the weights as
// stored, the schedule vectorizes along the output width and reads weights as
// broadcasts. Both apply to every such convolution (so --select=measure can
// time both); the priority rule below says which wins without measuring. It
// was measured on one machine (AVX-512, 2 cores) and is a default, not a law:
// conv.ihwo gets priority 20 (over conv.direct's 10) when
//   - the kernel is at most 3x3 and the reduction has at least 64 products per
//     output, and
//   - the output height tiles into rows (a constant <= 8 or with a divisor in
//     8..4: overlapping row tiles stayed scalar, inception's 17x17 stride-2
//     conv ran 1.8x slower packed), and
//   - the output width is a constant below 8 (7x7 planes), or the horizontal
//     stride is not 1 and the output is at least 16 wide (56x56 -> 28x28:
//     23 -> 60 GFLOP/s; inception's 17x17 -> 8x8 lost, 1.7 -> 7.8 ms).
// Otherwise priority 5. (Measured losses that set the limits: resnet18's 7x7
// stride-2 stem ran 5x slower packed, its larger tile spilled; squeezenet's
// 3x3 stem with 27 products ran 5x slower, 16 scattered stores per vector.)
#include <cstring>

#include "strategy/strategy.h"

namespace kiln::strategy {

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
  for (int64_t m = 0; m < o; ++m)
    for (int64_t r = 0; r < inner; ++r) std::memcpy(dst + (r * o + m) * esize, src + (m * inner + r) * esize, esize);
  return out;
}

bool ihwo_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (n.has_attr("kiln_weight_layout")) return no("weights already re-laid out");
  if (n.attr_int("group", 1) != 1) return no("grouped");
  const Value* w = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (w == nullptr || !w->is_constant() || w->constant().rank() != 4) return no("weight is not a 4-D constant");
  const Tensor& t = w->constant();
  if (t.dtype() == DType::kString || t.numel() == 0) return no("empty or string weight");
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || y->type().rank() != 4) return no("output rank unknown");
  return true;
}

int ihwo_priority(const Node& n) {
  const std::vector<int64_t>& ws = n.input(1)->constant().shape();
  if (ws[2] > 3 || ws[3] > 3 || ws[1] * ws[2] * ws[3] < 64) return 5;
  const Shape& ys = *n.output(0)->type().shape;
  auto height = ys[2].as_const(), width = ys[3].as_const();
  if (!height || !width) return 5;
  bool rows_tile = *height <= 8;
  for (int64_t f = 8; f >= 4 && !rows_tile; --f) rows_tile = *height % f == 0;
  if (!rows_tile) return 5;
  if (*width < 8) return 20;
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  return strides.size() == 2 && strides[1] != 1 && *width >= 16 ? 20 : 5;
}

Status ihwo_transform(Graph& g, Node& n, const tir::Knobs&) {
  Value* w = n.input(1);
  // A weight shared by several convolutions is packed once.
  std::string name = w->name() + ".ihwo";
  Value* packed = nullptr;
  for (Value* v : g.values())
    if (v->name() == name && v->is_constant()) packed = v;
  if (packed == nullptr) packed = g.add_constant(g.unique_name(name), pack_ihwo(w->constant()));
  g.set_input(&n, 1, packed);
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = "IHWO";
  n.set_attr("kiln_weight_layout", a);
  return Status::ok();
}

}  // namespace

void register_conv_candidates() {
  Candidate packed;
  packed.name = "conv.ihwo";
  packed.op = "Conv";
  packed.priority = 20;
  packed.summary = "weights re-laid out [I, KH, KW, O]; vectorized over output channels";
  packed.applies = ihwo_applies;
  packed.priority_for = ihwo_priority;
  packed.transform = ihwo_transform;
  register_candidate(std::move(packed));

  Candidate direct;
  direct.name = "conv.direct";
  direct.op = "Conv";
  direct.priority = 10;
  direct.summary = "weights as stored [O, I, KH, KW]; vectorized over the output width";
  register_candidate(std::move(direct));
}

}  // namespace kiln::strategy
