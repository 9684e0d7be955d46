// Convolution candidates.
//
// conv.panels: the constant weight is packed into panels of nr output
// channels [O / nr, I, KH, KW, nr] (attribute kiln_weight_layout "P<nr>"); the
// template (panels_schedule) splits the output channels into nr vector lanes
// and tiles the output width by mr register rows, the panel loop outermost, so
// each tile streams one contiguous weight panel and reuses every input value
// nr / 16 times from registers. Applies to 2-D group-1 convolutions with a
// constant f32 weight (output channels not a multiple of nr: the last panel
// is zero-padded, kiln_out_channels keeps O, and the channel split is
// split_padded, guarding only the write-back); priority 30 with at least 64
// products per output and at most a quarter of the 16-wide padded lanes idle,
// else 5 (its output vectors run across channels, so stores are strided: a
// shallow reduction does not pay for them). Knobs: nr (one to four target
// vectors), mr, rows (threads split rows or panels), prefetch (the next
// panel), ci (0: the input channels outermost in the reduction, the taps
// unrolled inside; 1, 2, 4: the taps outermost and ci channels per step).
// Measured faster than conv.direct and conv.ihwo on 3x3 kernels (stride 1
// and 2) and on a deep 1x1 kernel.
//
// conv.wvec: the weight packed into panels of mr output channels (layout
// "P<mr>", read as broadcasts); the template (wvec_schedule) computes an mr x
// vw tile with vectors along the output positions, so stores are contiguous.
// For 1x1 kernels (knob flat) the output plane is one pixel axis (tir fuse);
// strided 1x1 kernels read a subsampled dense copy of the input (Conv
// attribute kiln_subsample). Priority 35, over conv.panels, for 1x1 kernels
// whose plane is computed with at most 15% overlap (wvec_priority).
//
// conv.depthwise: see depthwise_schedule.
//
// conv.ihwo: the constant weight W[O, I, KH, KW] of a 2-D convolution with one
// group is stored [I, KH, KW, O] (attribute kiln_weight_layout "IHWO",
// understood by ops/conv.cc), so the default schedule vectorizes along the
// output channels with contiguous weight loads. conv.direct: the weights as
// stored, the schedule vectorizes along the output width and reads weights as
// broadcasts. Both apply to every such convolution (so --select=measure can
// time both); the priority rule below says which wins without measuring. It
// is a measured default, not a law (the tuner measures both per host):
// conv.ihwo gets priority 20 (over conv.direct's 10) when
//   - the kernel is at most 3x3 and the reduction has at least 64 products per
//     output, and
//   - the output height tiles into rows (a constant <= 8 or with a divisor in
//     8..4: overlapping row tiles stayed scalar, and inception's 17x17
//     stride-2 conv ran slower packed), and
//   - the output width is a constant below 8 (7x7 planes), or the horizontal
//     stride is not 1 and the output is at least 16 wide (56x56 -> 28x28
//     gained; inception's 17x17 -> 8x8 lost).
// Otherwise priority 5. (Measured losses that set the limits: resnet18's 7x7
// stride-2 stem ran slower packed, its larger tile spilled; so did
// squeezenet's 3x3 stem with 27 products, 16 scattered stores per vector.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "strategy/strategy.h"
#include "strategy/template.h"
#include "tir/winograd.h"

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

// The weight's dims: a constant's, or a computed weight's static type (a
// training step's, whose weights are graph inputs).
std::vector<int64_t> weight_dims(const Node& n) {
  const Value* w = n.input(1);
  return w->is_constant() ? w->constant().shape() : w->type().static_shape();
}

// A 4-D weight as ONNX stores it, and an output of rank 4. The weight is a
// constant, or with `computed_ok` any f32 value of static shape: candidates
// whose transform packs the weight by a kernel at run time (kiln:PackPanels)
// when it is not a constant.
bool onnx_weight_4d(const Node& n, std::string* why, bool computed_ok = false) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (n.has_attr("kiln_weight_layout")) return no("weights already re-laid out");
  const Value* w = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (w == nullptr) return no("no weight");
  if (w->is_constant()) {
    if (w->constant().rank() != 4) return no("weight is not 4-D");
    const Tensor& t = w->constant();
    if (t.dtype() == DType::kString || t.numel() == 0) return no("empty or string weight");
  } else {
    if (!computed_ok) return no("weight is not a 4-D constant");
    const TensorType& t = w->type();
    if (t.dtype != DType::kFloat32 || t.rank() != 4 || !t.is_static()) return no("weight is not a static 4-D f32 value");
    std::vector<int64_t> ws = t.static_shape();
    if (std::find(ws.begin(), ws.end(), 0) != ws.end()) return no("empty weight");
  }
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || y->type().rank() != 4) return no("output rank unknown");
  return true;
}

bool one_group(const Node& n, std::string* why) {
  if (n.attr_int("group", 1) != 1) {
    if (why) *why = "grouped";
    return false;
  }
  return true;
}

bool ihwo_applies(const Node& n, std::string* why) {
  if (!onnx_weight_4d(n, why)) return false;
  if (n.attr_int("group", 1) != 1) {
    if (why) *why = "grouped";
    return false;
  }
  return true;
}

int ihwo_priority(const Node& n, const Target&) {
  const std::vector<int64_t>& ws = weight_dims(n);
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
  set_string_attr(n, "kiln_weight_layout", "IHWO");
  return Status::ok();
}

// A 1x1 kernel's input copy (subsampled by kiln_subsample, or zero-padded), or
// a phase-split copy (kiln_phase_split), may be read without a window, so the
// default schedule would inline it back into the reduction (strided loads): it
// is computed in full instead, parallel over channels, vectorized along the row.
tir::Schedule materialize_subsampled(const tir::KernelDef& k, const std::string& stage, tir::Schedule s) {
  auto pad = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& c) { return c.name == stage + ".pad"; });
  if (pad == k.stages.end() || pad->axes.size() < 4) return s;
  for (size_t i = 0; i < s.prims.size(); ++i) {
    if (s.prims[i].kind != "inline" || s.prims[i].stage != pad->name) continue;
    s.prims[i] = prim("parallel", pad->name, {pad->axes[1]});
    s.prims.insert(s.prims.begin() + static_cast<long>(i) + 1, prim("vectorize", pad->name, {pad->axes.back()}));
    break;
  }
  return s;
}

// The zero-padded input copy of `stage` (a stage it reads, computed
// elementwise), if there is one, inlined into its loads: select(in bounds,
// load at the clamped index, 0), which code generation turns into masked span
// loads at the edges, and which lowering drops in tiles that touch no edge.
tir::Schedule inline_padded_input(const tir::KernelDef& k, const std::string& stage, tir::Schedule s) {
  const std::string pad = stage + ".pad";
  bool has_pad = std::any_of(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& c) { return c.name == pad; });
  if (!has_pad) return s;
  tir::Schedule out;
  out.prims.push_back(prim("inline", pad, {}));
  for (const tir::Primitive& p : s.prims)
    if (p.stage != pad) out.prims.push_back(p);
  return out;
}

// ---- conv.panels ------------------------------------------------------------

int64_t out_channels(const Node& n) { return weight_dims(n)[0]; }

bool one_by_one(const Node& n) {
  const std::vector<int64_t>& ws = weight_dims(n);
  return ws[2] == 1 && ws[3] == 1;
}

// A 1x1 kernel with strides: its input may be subsampled into a dense copy
// first (the Conv attribute kiln_subsample), so the reduction reads it
// contiguously instead of every stride-th element of every row.
bool strided_one_by_one(const Node& n) {
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  return one_by_one(n) && std::any_of(strides.begin(), strides.end(), [](int64_t s) { return s != 1; });
}

bool panels_applies(const Node& n, std::string* why) {
  if (!onnx_weight_4d(n, why, true) || !one_group(n, why)) return false;
  const Value* w = n.input(1);
  if ((w->is_constant() ? w->constant().dtype() : w->type().dtype) != DType::kFloat32) {
    if (why) *why = "weight is not f32";
    return false;
  }
  return true;
}

// Output vectors run across channels, so every tile is written with strided
// stores: worth it over a reduction of at least 64 products per output.
// Few output channels leave most vector lanes of the padded panel idle: the
// one-vector panels may waste at most a quarter of them (24 -> 32 channels
// with AVX-512's 16 lanes).
int panels_priority(const Node& n, const Target& t) {
  const std::vector<int64_t>& ws = weight_dims(n);
  const int64_t lanes = t.lanes();
  int64_t padded = (ws[0] + lanes - 1) / lanes * lanes;
  bool lanes_used = 4 * (padded - ws[0]) <= padded;
  return ws[1] * ws[2] * ws[3] >= 64 && lanes_used ? 30 : 5;
}

// Several taps along the width at stride 1 and dilation 1: neighbouring
// output columns read overlapping input columns.
bool slides_along_row(const Node& n) {
  const std::vector<int64_t>& ws = weight_dims(n);
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  std::vector<int64_t> dil = n.attr_ints("dilations", {1, 1});
  return ws[3] > 1 && strides.size() == 2 && strides[1] == 1 && dil.size() == 2 && dil[1] == 1;
}

// A kernel wider than 1 strided along the width: conv.wvec reads a copy of
// the input with its columns split by phase (the Conv attribute
// kiln_phase_split), so each tap's vector of output columns is one load.
bool phase_split(const Node& n) {
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  return !one_by_one(n) && strides.size() == 2 && strides[1] > 1;
}

// A window of 5 or more taps along a side, or a column window (KW = 1, KH > 1).
bool long_window(const Node& n) {
  const std::vector<int64_t>& ws = weight_dims(n);
  return ws[2] >= 5 || ws[3] >= 5 || (ws[3] == 1 && ws[2] > 1);
}

// A stride-1 1x1 kernel on a plane of at most 64 positions (7x7, 8x8) with
// at least 512 input and 160 output channels, on a 16-register target:
// conv.panels over a channels-last copy (knob cl) beats conv.wvec, whose
// vectors along the plane leave a ragged last one and whose weights are
// broadcast one at a time. A measured default: panels won on 512->2048,
// 2048->512 and 960->160 7x7 and lost on 1024->128 and 256->512, hence the
// channel limits; the tuner measures both candidates per host.
bool deep_small_plane_one_by_one(const Node& n, const Target& t) {
  if (t.vector_registers > 16 || !one_by_one(n) || strided_one_by_one(n)) return false;
  const std::vector<int64_t>& ws = weight_dims(n);
  const Shape& ys = *n.output(0)->type().shape;
  auto h = ys[2].as_const(), w = ys[3].as_const();
  return h && w && *h * *w <= 64 && ws[0] >= 160 && ws[1] >= 512;
}

tir::KnobSpace panels_space(const Node& n, const Target& t) {
  int64_t o = out_channels(n);
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  tir::KnobSpace s;
  tir::Knob nr{"nr", {}};
  for (int64_t v : {lanes, 2 * lanes, 3 * lanes, 4 * lanes})
    if (o % v == 0) nr.values.push_back(v);
  if (nr.values.empty()) nr.values = {lanes, 2 * lanes, 3 * lanes, 4 * lanes};  // the last panel is zero-padded
  tir::Knob mr{"mr", {1, 2, 3, 4, 5, 6, 7, 8, 12, 14}};
  // A tile of one whole output row (with one vector of channels) where the
  // row fits the accumulators: no column computed twice.
  if (auto w = (*n.output(0)->type().shape)[3].as_const();
      w && *w > 8 && *w <= acc && std::find(mr.values.begin(), mr.values.end(), *w) == mr.values.end())
    mr.values.push_back(*w);
  s.knobs.push_back(mr);
  s.knobs.push_back(nr);
  s.knobs.push_back(tir::Knob{"rows", {0, 1}});
  s.knobs.push_back(tir::Knob{"prefetch", {0, 1}});
  if (strided_one_by_one(n)) s.knobs.push_back(tir::Knob{"subsample", {0, 1}});
  s.knobs.push_back(tir::Knob{"ci", {0, 1, 2, 4}});
  if (!strided_one_by_one(n)) s.knobs.push_back(tir::Knob{"cl", {0, 1}});
  // inline_pad = 1: the padded input is read through the convolution's loads
  // instead of a copy per call (see inline_padded_input). Off by default: the
  // copy is 1/(KH KW O) of the work and inlining won and lost by a few
  // percent case by case when measured. In the space for a tuner to decide
  // per host.
  s.knobs.push_back(tir::Knob{"inline_pad", {0, 1}});
  // Three-vector panels only for one column (see gemm_packed_space: LLVM
  // spills register tiles of <48 x float> rows).
  s.valid = [lanes, acc](const tir::Knobs& k) {
    return k.at("mr") * k.at("nr") / lanes <= acc && (k.at("nr") != 3 * lanes || k.at("mr") == 1);
  };
  return s;
}

tir::Knobs panels_defaults(const Node& n, const Target& t) {
  int64_t o = out_channels(n);
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  // Two vectors of channels (twice the accumulators of one, enough to hide
  // the FMA latency with a row tile of 7) unless padding to two vectors
  // wastes more than an eighth of the lanes; then one. squeezenet's 512->1000
  // 1x1 conv ran well below the peak with 16 channels (7 accumulators).
  int64_t two = 2 * lanes;
  int64_t pad = (o + two - 1) / two * two - o;
  int64_t nr = pad * 8 <= o ? two : lanes;
  // With 16 registers, windows of 5 or more taps along a side and column
  // windows (KW = 1) run the input channels innermost (knob ci): each tap's
  // tile then reads one broadcast per column and the weight vectors once, and
  // LLVM does not keep broadcasts alive across unrolled taps, so 12
  // accumulators fit (a measured default: long and column windows gained, 3x3
  // kernels lose; ci is in the space for a tuner to decide per host).
  const bool few_registers = t.vector_registers <= 16;
  const bool channels_inner = few_registers && long_window(n);
  // Otherwise the tile holds 8 accumulators with 16 registers, not 12: the
  // unrolled taps' broadcasts need the rest (measured faster on 3x3 kernels
  // than 12 accumulators).
  const int64_t tile_acc = few_registers && !channels_inner ? std::min<int64_t>(acc, 8) : acc;
  // And where the taps slide along the row at stride 1, one vector of
  // channels by 8 columns: each broadcast input column serves up to KW taps,
  // so the tile loads fewer operands per FMA than 4 columns by two vectors
  // (measured faster on stride-1 3x3 kernels; strided rows lose).
  if (few_registers && !channels_inner && slides_along_row(n)) nr = lanes;
  auto width = (*n.output(0)->type().shape)[3].as_const();
  // Rows of the register tile: at most what the register file holds (12
  // with AVX-512 and two vectors, 4 with AVX2); narrow outputs whose rows
  // would not fit (7x7, 14x14 with AVX2) take one vector of channels and 7 rows.
  int64_t cap = std::max<int64_t>(tile_acc / (nr / lanes), 1);
  if (width && *width <= 14 && cap < std::min<int64_t>(*width, 7)) {
    nr = lanes;
    cap = tile_acc;
  }
  int64_t mr = std::min<int64_t>(8, cap);
  // A row tile that covers narrow outputs whole (7 of a 7x7 plane). Wider
  // rows: 8, 7 or 6 (5 or 4 where fewer fit), whichever computes the fewest
  // columns (the last tile overlaps the one before it) per accumulator-rate
  // (fewer rows hide less of the FMA latency): inception's 17-wide rows took
  // 24 columns with 8, 18 with 6; 35 and 147 divide by 7.
  std::vector<std::pair<int64_t, double>> tiles;
  for (auto [m, rate] : {std::pair<int64_t, double>{8, 1.0}, {7, 0.97}, {6, 0.92}, {5, 0.88}, {4, 0.85}})
    if (m <= cap) tiles.emplace_back(m, rate);
  if (width && *width <= std::min<int64_t>(cap, 8)) {
    mr = *width;
  } else if (width && *width <= 14 && cap >= 7) {
    mr = 7;
  } else if (width && !tiles.empty()) {
    mr = least_overlap_tile(*width, tiles);
  }
  // A whole output row as the tile, with one vector of channels, where the
  // row tiles above would compute some columns twice and the row fits the
  // accumulators (32 registers only; not measured with 16). Each step then
  // loads one weight vector and a broadcast per column, which the load ports
  // sustain next to the FMAs. Measured faster on inception_v3's 17-wide 1x7
  // and 7x1 kernels, whose 6-column tiles computed 18 columns; mr is in the
  // space for a tuner to decide per host.
  if (!few_registers && width && *width > 8 && *width <= acc && (*width + mr - 1) / mr * mr != *width) {
    nr = lanes;
    mr = *width;
  }
  // prefetch: the next weight panel streams in while the current one is used.
  tir::Knobs k = {{"mr", std::max<int64_t>(mr, 1)},
                  {"nr", nr},
                  {"rows", input_outweighs_weights(n) ? 1 : 0},
                  {"prefetch", 1},
                  {"ci", channels_inner ? 1 : 0},
                  {"inline_pad", 0}};
  // cl: a channels-last copy of the input (Conv attribute kiln_channels_last)
  // for kernels strided along the width with outputs wider than 14 and for
  // long windows, at least 16 input channels: consecutive input channels of
  // the reduction are then one cache line instead of 16 planes. A measured
  // default (cl is in the space for a tuner to decide per host): wide strided
  // outputs and long windows gained. Narrow strided outputs (7-column tiles of
  // one vector) did not gain. Stride-1 3x3 kernels lost (their 8-column tiles
  // reuse each broadcast across taps). Not measured with 32 registers.
  if (strided_one_by_one(n)) {
    k["subsample"] = 1;
    return k;
  }
  const bool wide_strided = phase_split(n) && width && *width > 14;
  const bool deep_input = weight_dims(n)[1] >= 16;
  const bool cl = (few_registers && deep_input && (wide_strided || channels_inner)) || deep_small_plane_one_by_one(n, t);
  k["cl"] = cl ? 1 : 0;
  return k;
}

// [O, I, KH, KW] -> [ceil(O / nr), I, KH, KW, nr], zero past O.
Tensor pack_panels(const Tensor& t, int64_t nr) {
  const std::vector<int64_t>& s = t.shape();
  int64_t o = s[0], inner = s[1] * s[2] * s[3];
  int64_t panels = (o + nr - 1) / nr;
  Tensor out(t.dtype(), {panels, s[1], s[2], s[3], nr});
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  std::fill(dst, dst + panels * inner * nr, 0.f);
  for (int64_t m = 0; m < o; ++m)
    for (int64_t r = 0; r < inner; ++r) dst[((m / nr) * inner + r) * nr + m % nr] = src[m * inner + r];
  return out;
}

// n's computed weight [O, I, KH, KW] packed by kiln:PackPanels into
// [ceil(O / nr), I, KH, KW, nr].
Value* runtime_panels(Graph& g, Node& n, int64_t nr) {
  const std::vector<int64_t> ws = weight_dims(n);
  return runtime_weight_node(g, n, n.input(1), "PackPanels", nullptr, {{"nr", nr}}, "p" + std::to_string(nr),
                             {(ws[0] + nr - 1) / nr, ws[1], ws[2], ws[3], nr});
}

// Packs the weight into panels of `nr` output channels (layout "P<nr>"): a
// constant at compile time; a computed weight (a training step's) by a
// kiln:PackPanels node, a kernel each run (one per weight and panel width).
Status pack_weight_panels(Graph& g, Node& n, int64_t nr) {
  Value* w = n.input(1);
  const std::vector<int64_t> ws = weight_dims(n);
  const int64_t o = ws[0];
  if (o % nr != 0) set_int_attr(n, "kiln_out_channels", o);  // the panels hold O rounded up to nr
  Value* packed = w->is_constant() ? g.add_constant(g.unique_name(w->name() + ".p" + std::to_string(nr)),
                                                    pack_panels(w->constant(), nr))
                                   : runtime_panels(g, n, nr);
  g.set_input(&n, 1, packed);
  set_string_attr(n, "kiln_weight_layout", "P" + std::to_string(nr));
  return Status::ok();
}

Status panels_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  if (knob_on(knobs, "subsample") && strided_one_by_one(n)) set_int_attr(n, "kiln_subsample", 1);
  if (knob_on(knobs, "cl") && !strided_one_by_one(n)) set_int_attr(n, "kiln_channels_last", 1);
  return pack_weight_panels(g, n, knobs.at("nr"));
}

// Output axes [n, co, oh, ow]: co split into panels of nr (vector lanes), ow
// tiled by mr (register rows); loops n, co.o, oh, ow.o | reduce | ow.i, co.i.
Result<tir::Schedule> panels_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto it = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& s) { return s.name == stage; });
  if (it == k.stages.end() || it->axes.size() != 4) return tir::default_schedule(k);
  const tir::ComputeDef& st = *it;
  KILN_ASSIGN_OR_RETURN(int64_t nr, knob(knobs, "nr", "conv.panels"));
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", "conv.panels"));
  std::vector<tir::Primitive> prims;
  const std::string &n_ax = st.axes[0], &c_ax = st.axes[1], &h_ax = st.axes[2], &w_ax = st.axes[3];
  auto c_ext = st.shape[1].as_const();
  std::string c_outer, c_inner = c_ax;
  if (!c_ext || *c_ext > nr || *c_ext % nr != 0) {
    // Zero-padded panels: a partial last panel is computed in full, written back guarded.
    prims.push_back(prim(c_ext && *c_ext % nr != 0 ? "split_padded" : "split", stage, {c_ax}, nr));
    c_outer = c_ax + ".o";
    c_inner = c_ax + ".i";
  }
  auto w_ext = st.shape[3].as_const();
  ColumnTile w = tile_columns(prims, stage, w_ax, st.shape[3], mr);
  std::vector<std::string> outer = {n_ax};
  std::vector<std::optional<int64_t>> counts = {st.shape[0].as_const()};
  if (!c_outer.empty()) {
    outer.push_back(c_outer);
    counts.push_back(c_ext ? std::optional<int64_t>((*c_ext + nr - 1) / nr) : std::nullopt);
  }
  outer.push_back(h_ax);
  counts.push_back(st.shape[2].as_const());
  if (!w.outer.empty()) {
    outer.push_back(w.outer);
    counts.push_back(w.count);
  }
  const std::string& w_inner = w.inner;
  std::vector<std::string> order = outer;
  order.push_back(w_inner);
  order.push_back(c_inner);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  if (!w_ext || *w_ext > 1) prims.push_back(prim("unroll", stage, {w_inner}));
  prims.push_back(prim("vectorize", stage, {c_inner}));
  // Knob ci > 0: the reduction walks the taps outermost and the input
  // channels innermost, ci channels per unrolled step (a split with a guarded
  // tail when ci does not divide them).
  if (int64_t ci = knobs.count("ci") ? knobs.at("ci") : 0; ci > 0 && st.reduce_axes.size() == 3) {
    const std::string& r_c = st.reduce_axes[0];
    prims.push_back(prim("reorder", stage, {st.reduce_axes[1], st.reduce_axes[2], r_c}));
    if (ci > 1) {
      prims.push_back(prim("split", stage, {r_c}, ci));
      prims.push_back(prim("unroll", stage, {r_c + ".i"}));
    }
  }
  if (knob_on(knobs, "prefetch") && !c_outer.empty()) prims.push_back(prim("prefetch", stage, {c_outer}));
  parallelize_rows_or_outer(prims, stage, knobs, h_ax, st.shape[2], outer, counts);
  tir::Schedule s = materialize_subsampled(k, stage, replace_stage_schedule(k, stage, prims));
  return knob_on(knobs, "inline_pad") ? inline_padded_input(k, stage, std::move(s)) : s;
}

// ---- conv.wvec --------------------------------------------------------------

// Stride 1 along the width, so that vw consecutive output columns read vw
// consecutive input columns (one vector load per tap and input channel); or a
// 1x1 kernel with any strides, which reads a subsampled copy of the input
// (the conv's attribute kiln_subsample).
bool wvec_applies(const Node& n, std::string* why) {
  if (!panels_applies(n, why)) return false;
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  std::vector<int64_t> dil = n.attr_ints("dilations", {1, 1});
  if (!one_by_one(n) && (strides.size() != 2 || dil.size() != 2 || dil[1] != 1)) {
    if (why) *why = "dilated along the width";
    return false;
  }
  return true;
}

// Whether the output feeds an activation computed with a polynomial and a
// division per element (Sigmoid of SiLU/Swish, Tanh, Erf of GELU, ...): fused
// into the write-back of a short reduction, its latency chain follows each
// tile's few multiply-adds and, with a tile of about 900 instructions, no
// other tile's work fits in the out-of-order window beside it.
bool expensive_activation_follows(const Node& n) {
  static const std::set<std::string> kExpensive = {"Sigmoid", "Tanh", "Erf",  "Exp",  "Gelu",
                                                   "Softplus", "Mish", "Elu", "Selu", "Log"};
  if (n.num_outputs() == 0 || n.output(0) == nullptr) return false;
  for (const auto& [user, slot] : n.output(0)->uses())
    if (user != nullptr && kExpensive.count(user->op_type())) return true;
  return false;
}

tir::KnobSpace wvec_space(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"mr", {1, 2, 3, 4, 6, 8, 12}});
  s.knobs.push_back(tir::Knob{"vw", {lanes, 2 * lanes, 4 * lanes}});
  s.knobs.push_back(tir::Knob{"rows", {1, 2, 4}});
  s.knobs.push_back(tir::Knob{"order", {0, 1}});
  if (one_by_one(n)) s.knobs.push_back(tir::Knob{"flat", {0, 1}});
  s.knobs.push_back(tir::Knob{"epi", {0, 1}});
  s.valid = [lanes, acc](const tir::Knobs& k) { return k.at("mr") * k.at("rows") * k.at("vw") / lanes <= acc; };
  return s;
}

// The output positions a vector runs along: the row, or for a 1x1 kernel the
// whole plane (knob flat: rows and columns fused into one contiguous axis).
std::optional<int64_t> wvec_extent(const Node& n, bool flat) {
  const Shape& ys = *n.output(0)->type().shape;
  auto h = ys[2].as_const(), w = ys[3].as_const();
  if (!flat) return w;
  int64_t hw = 0;
  if (!h || !w || __builtin_mul_overflow(*h, *w, &hw)) return std::nullopt;
  return hw;
}

// The default vector width over `extent` positions: two, four or one target
// vectors (32, 64 or 16 lanes with AVX-512), whichever computes the fewest
// positions twice, no wider than the extent (a 28-wide row in one 32-lane
// vector is 28 lanes: LLVM splits such vectors into pieces). A flat 1x1 tile
// on a split-FMA target (avx512-split) prefers one vector: measured faster on
// 1x1 kernels there; Winograd's products and the strided stems did not gain,
// so they keep the rule above. vw is in the space for a tuner to decide per
// host.
int64_t wvec_width(std::optional<int64_t> extent, const Target& t, bool flat) {
  const int64_t lanes = t.lanes();
  if (!extent) return 2 * lanes;
  double one = flat && t.split_fma() ? 1.1 : 0.9;
  std::vector<std::pair<int64_t, double>> tiles;
  for (auto [v, rate] : {std::pair<int64_t, double>{2 * lanes, 1.0}, {4 * lanes, 0.98}, {lanes, one}})
    if (v <= *extent) tiles.emplace_back(v, rate);
  return tiles.empty() ? lanes : least_overlap_tile(*extent, tiles);
}

// Knob order: channel tiles innermost (1: each input strip is read once and
// all the weights once per strip) or outermost (0: the weights once, all the
// input once per channel tile). Whichever re-reads fewer bytes, a re-read
// from beyond the level-2 cache counted three times: an operand larger than
// half of it is evicted between two passes. A measured default: the same
// layer went either way on hosts with different level-2 caches, and order is
// in the space for a tuner to decide per host.
int64_t wvec_order(const Node& n, const Target& t, int64_t mr, int64_t vw, int64_t rows, bool flat) {
  const Shape& ys = *n.output(0)->type().shape;
  const TensorType& xt = n.input(0)->type();
  auto oh = ys[2].as_const(), ow = ys[3].as_const();
  if (!oh || !ow || !xt.shape) return 1;  // symbolic plane: assume the activation is the larger
  const std::vector<int64_t>& ws = weight_dims(n);
  // The input the kernel reads: a strided 1x1 reads its subsampled copy.
  double input = 4.0 * static_cast<double>(ws[1]) * static_cast<double>(*oh) * static_cast<double>(*ow);
  if (!one_by_one(n)) {
    auto ih = (*xt.shape)[2].as_const(), iw = (*xt.shape)[3].as_const();
    if (!ih || !iw) return 1;
    input = 4.0 * static_cast<double>(ws[1]) * static_cast<double>(*ih) * static_cast<double>(*iw);
  }
  double weights = 4.0 * static_cast<double>(ws[0] * ws[1] * ws[2] * ws[3]);
  double strips = flat ? std::ceil(static_cast<double>(*oh * *ow) / static_cast<double>(vw))
                       : std::ceil(static_cast<double>(*oh) / static_cast<double>(rows)) *
                             std::ceil(static_cast<double>(*ow) / static_cast<double>(vw));
  double tiles = std::ceil(static_cast<double>(ws[0]) / static_cast<double>(mr));
  const double half_l2 = static_cast<double>(t.l2_bytes) / 2;
  auto cost = [&](double bytes, double passes) { return bytes * passes * (bytes > half_l2 ? 3.0 : 1.0); };
  return cost(weights, strips) <= cost(input, tiles) ? 1 : 0;
}

tir::Knobs wvec_defaults(const Node& n, const Target& t) {
  int64_t o = out_channels(n);
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  bool flat = one_by_one(n);
  int64_t vw = wvec_width(wvec_extent(n, flat), t, flat);
  // Two thirds of the register file or more in accumulators (16 to 24 of
  // AVX-512's 32): two rows of one-vector tiles.
  int64_t rows = vw == lanes && !flat ? 2 : 1;
  std::vector<std::pair<int64_t, double>> mrs;
  for (auto [m, rate] : {std::pair<int64_t, double>{8, 1.0}, {12, 1.05}, {6, 0.95}, {4, 0.85}, {3, 0.8}})
    if (m * rows * vw / lanes <= acc) mrs.emplace_back(m, rate);
  int64_t mr = least_overlap_tile(o, mrs);
  tir::Knobs k = {{"mr", mr}, {"vw", vw}, {"rows", rows}, {"order", wvec_order(n, t, mr, vw, rows, flat)}};
  if (flat) k["flat"] = 1;
  // epi (the epilogue after the tiles of one iteration of the next loop out)
  // stays off: a SiLU after a 1x1 kernel measured slower deferred than in the
  // tile, where a depthwise kernel gained (see depthwise_defaults); it is in
  // the space for a tuner to decide per host.
  k["epi"] = 0;
  return k;
}

// Weights in panels of mr channels; a strided 1x1 kernel reads a subsampled copy.
Status wvec_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  if (strided_one_by_one(n)) set_int_attr(n, "kiln_subsample", 1);
  if (phase_split(n)) set_int_attr(n, "kiln_phase_split", 1);
  return pack_weight_panels(g, n, knobs.at("mr"));
}

// 1x1 convolutions with the plane fused into one pixel axis measured faster
// than conv.panels or even with it, strided (subsampled) ones too. It lost
// where the last vector of the plane overlaps much of the one before it
// (2048->512 7x7: 49 pixels in 64 lanes), and on a 3x3 kernel (panels reuse
// each loaded input across 9 taps' weights in registers). Priority 35 (over
// panels) for 1x1 kernels whose plane is computed with at most 15% overlap.
//
// Image stems (at most 4 input channels) strided along the width read a
// phase-split copy and get priority 35 too: their reductions are short, so
// conv.panels' per-channel strided stores dominate (measured faster on 3x3
// and 7x7 stems). Deeper strided kernels stay with panels (measured slower
// with wvec).
int wvec_priority(const Node& n, const Target& t) {
  if (phase_split(n)) return weight_dims(n)[1] <= 4 ? 35 : 4;
  auto extent = wvec_extent(n, one_by_one(n));
  if (!one_by_one(n) || !extent || *extent < t.lanes() || deep_small_plane_one_by_one(n, t)) return 4;
  int64_t vw = wvec_width(extent, t, true);
  int64_t computed = (*extent + vw - 1) / vw * vw;
  if (computed * 100 > *extent * 115) return 4;
  if (panels_priority(n, t) < 30) return 35;
  // Unless conv.panels' rows of mr columns compute 5% fewer positions than
  // this plane of vw-lane vectors (14x14: 208 of 196 against 7-column rows'
  // 196). Measured on chains of 1x1 convolutions: panels won on
  // 1024->256->1024 14x14; kept with wvec (panels slower or even):
  // 768->192->768 17x17, 256->64->256 56x56, 512->64->512 13x13. Partial
  // channel panels (264 of 256 with mr 12) did not matter on 56x56. Only with
  // at least 256 input and output channels: narrower ones were even, and
  // mobilenet_v2 and efficientnet_b0 ran slower with panels. Panels'
  // whole-row tiles (17 columns, see panels_defaults) compute no column twice
  // (measured faster on 768->256 1x1 17x17).
  auto width = (*n.output(0)->type().shape)[3].as_const();
  const std::vector<int64_t>& ws = weight_dims(n);
  if (!width || ws[0] < 256 || ws[1] < 256) return 35;
  auto padded = [](int64_t x, int64_t f) { return static_cast<double>((x + f - 1) / f * f) / static_cast<double>(x); };
  double panels_work = padded(*width, panels_defaults(n, t).at("mr"));
  return padded(*extent, vw) <= panels_work * 1.05 ? 35 : 4;
}

// Output axes [n, co, oh, ow]: co split into tiles of mr (unrolled: each
// weight a broadcast from the mr-channel panel), ow into vectors of vw
// columns, oh into `rows`; loops n, [co.o], oh.o, ow.o, [co.o] | reduce |
// co.i, oh.i, ow.i. order=1 walks the channel tiles innermost, so one strip
// of input (all input channels x vw columns) is reused by every channel tile
// from cache and the weights (one pass per strip) are re-read instead.
// The wvec register tile over a stage with axes [batch..., co, oh, ow]
// (`batch` leading axes: the image, and Winograd's transformed positions),
// appended to `prims`.
Status wvec_tile(const tir::ComputeDef& st, size_t batch, const tir::Knobs& knobs, const std::string& who,
                 std::vector<tir::Primitive>& prims) {
  const std::string& stage = st.name;
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", who));
  KILN_ASSIGN_OR_RETURN(int64_t vw, knob(knobs, "vw", who));
  int64_t rows = 1;
  if (!knob_on(knobs, "flat")) {
    KILN_ASSIGN_OR_RETURN(rows, knob(knobs, "rows", who));
  }
  bool channels_inner = knob_on(knobs, "order");
  const std::string &c_ax = st.axes[batch], &h_ax = st.axes[batch + 1], &w_ax = st.axes[batch + 2];
  // Splits axis a of `extent` by f unless one tile covers it: {outer (or
  // empty), inner (or empty: f = 1), outer count}.
  struct Tiled {
    std::string outer, inner;
    std::optional<int64_t> count;
  };
  auto tile = [&](const std::string& a, const Expr& extent, int64_t f) -> Tiled {
    auto c = extent.as_const();
    if (f == 1) return {a, "", c};
    if (c && *c <= f) return {"", a, 1};
    prims.push_back(prim(!c || *c % f == 0 ? "split" : "split_overlap", stage, {a}, f));
    return {a + ".o", a + ".i", c ? std::optional<int64_t>((*c + f - 1) / f) : std::nullopt};
  };
  // The weight panels hold O rounded up to mr: a partial last tile is
  // computed in full, written back guarded.
  auto c_ext = st.shape[batch].as_const();
  Tiled c{"", c_ax, 1};
  if (!c_ext || *c_ext > mr || *c_ext % mr != 0) {
    prims.push_back(prim(c_ext && *c_ext % mr != 0 ? "split_padded" : "split", stage, {c_ax}, mr));
    c = {c_ax + ".o", c_ax + ".i", c_ext ? std::optional<int64_t>((*c_ext + mr - 1) / mr) : std::nullopt};
  }
  Tiled w, h;
  if (knob_on(knobs, "flat")) {
    // One pixel axis: the rows of a 1x1 convolution's output and input are
    // contiguous, so vectors run across row ends.
    prims.push_back(prim("fuse", stage, {h_ax, w_ax}));
    w = tile(h_ax + "_" + w_ax, simplify(st.shape[batch + 1] * st.shape[batch + 2]), vw);
  } else {
    w = tile(w_ax, st.shape[batch + 2], vw);
    h = tile(h_ax, st.shape[batch + 1], rows);
  }
  std::vector<std::string> outer;
  std::vector<std::optional<int64_t>> counts;
  for (size_t i = 0; i < batch; ++i) {
    outer.push_back(st.axes[i]);
    counts.push_back(st.shape[i].as_const());
  }
  auto push = [&](const Tiled& t) {
    if (t.outer.empty()) return;
    outer.push_back(t.outer);
    counts.push_back(t.count);
  };
  if (!channels_inner) push(c);
  push(h);
  push(w);
  if (channels_inner) push(c);
  std::vector<std::string> order = outer;
  for (const std::string& a : {c.inner, h.inner, w.inner})
    if (!a.empty()) order.push_back(a);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  if (!c_ext || *c_ext > 1) prims.push_back(prim("unroll", stage, {c.inner}));
  auto h_ext = st.shape[batch + 1].as_const();
  if (!h.inner.empty() && (!h_ext || *h_ext > 1)) prims.push_back(prim("unroll", stage, {h.inner}));
  prims.push_back(prim("vectorize", stage, {w.inner}));
  if (int par = tir::choose_parallel(counts); par >= 0)
    prims.push_back(prim("parallel", stage, {outer[static_cast<size_t>(par)]}));
  return Status::ok();
}

// The fused epilogue after each iteration of the loop just outside the
// register tile's loop (the tile loop itself when it is outermost).
void defer_epilogue(const std::string& stage, std::vector<tir::Primitive>& prims) {
  std::string tile_axis;
  std::vector<std::string> order;
  for (const tir::Primitive& p : prims) {
    if (p.stage != stage) continue;
    if (p.kind == "cache_write") tile_axis = p.axes[0];
    if (p.kind == "reorder") order = p.axes;
  }
  auto at = std::find(order.begin(), order.end(), tile_axis);
  if (at == order.end()) return;
  prims.push_back(prim("fuse_epilogue", stage, {at == order.begin() ? *at : *(at - 1)}));
}

Result<tir::Schedule> wvec_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto it = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& s) { return s.name == stage; });
  if (it == k.stages.end() || it->axes.size() != 4) return tir::default_schedule(k);
  std::vector<tir::Primitive> prims;
  KILN_RETURN_IF_ERROR(wvec_tile(*it, 1, knobs, "conv.wvec", prims));
  if (knob_on(knobs, "epi")) defer_epilogue(stage, prims);
  return materialize_subsampled(k, stage, replace_stage_schedule(k, stage, prims));
}

// ---- conv.depthwise ---------------------------------------------------------

// One input channel per output channel (group == C == O, weight [C, 1, KH, KW]),
// 2-D, constant f32 weight.
bool depthwise_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (n.has_attr("kiln_weight_layout")) return no("weights already re-laid out");
  // The weight is read as stored: a computed one (a training step's
  // parameter, an input gradient's reversed taps) as well as a constant.
  const Value* w = n.num_inputs() > 1 ? n.input(1) : nullptr;
  if (w == nullptr || !w->type().is_static() || w->type().rank() != 4) return no("weight is not of a static 4-D shape");
  if (w->dtype() != DType::kFloat32) return no("weight is not f32");
  const std::vector<int64_t> ws = w->type().static_shape();
  int64_t group = n.attr_int("group", 1);
  if (group == 1) return no("one group");
  if (ws[1] != 1 || ws[0] != group) return no("groups of several channels");
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || y->type().rank() != 4) return no("output rank unknown");
  return true;
}

tir::KnobSpace depthwise_space(const Node&, const Target&) {
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"rows", {1, 2, 4, 5, 6, 7, 8}});
  s.knobs.push_back(tir::Knob{"inline_pad", {0, 1}});
  s.knobs.push_back(tir::Knob{"vw", {8, 16, 32}});
  s.knobs.push_back(tir::Knob{"epi", {0, 1}});
  return s;
}


// Inlined padding costs a clamped load per tap (masks on every edge tile),
// the padded copy a pass over the input. A measured default (inline_pad is in
// the space for a tuner to decide per host): inlining won on 112-wide inputs
// and on strided ones, where the copy is of an input four times the output;
// it lost on stride 1 at 56 and 28, where most 16-wide tiles touch an edge.
// Strided kernels with outputs narrower than 28 (one or two 16-wide tiles,
// all at an edge) copy instead, since the copy is vectorized 16 lanes at a
// time; with 28-wide outputs inlining still won.
tir::Knobs depthwise_defaults(const Node& n, const Target& t) {
  int64_t inline_pad = 0;
  const TensorType& xt = n.input(0)->type();
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  bool strided = std::any_of(strides.begin(), strides.end(), [](int64_t s) { return s > 1; });
  const auto& yt = n.output(0)->type().shape;
  if (xt.shape && xt.shape->size() == 4) {
    auto w = (*xt.shape)[3].as_const();
    auto ow = yt && yt->size() == 4 ? (*yt)[3].as_const() : std::nullopt;
    inline_pad = (strided && (!ow || *ow >= 28)) || (w && *w >= 96) ? 1 : 0;
  }
  // Row tiles of 4, or of 7, 6 or 5 where fewer rows are computed twice (the
  // last tile overlaps): 7 on 14- and 7-high planes (measured faster on a 5x5
  // 14x14 kernel).
  auto h = (*n.output(0)->type().shape)[2].as_const();
  // The tile is rows x 16 lanes: rows vectors of AVX-512, twice as many of
  // AVX2 (at most 6 rows then, 12 accumulators).
  int64_t per_row = std::max(16 / t.lanes(), 1);
  std::vector<std::pair<int64_t, double>> tiles;
  for (int64_t r : {4, 7, 6, 5})
    if (r * per_row <= t.accumulators()) tiles.emplace_back(r, 1.0);
  int64_t rows = h ? least_overlap_tile(*h, tiles) : 4;
  // vw: 16 lanes; 8 and 32 are in the space for a tuner to decide per host:
  // measured, they won and lost case by case.
  // epi: a SiLU after the depthwise kernel in the tile's write-back cost
  // more than the convolution; deferred to a pass over each channel's plane
  // while it is in L1, it costs what the activation alone does.
  int64_t epi = expensive_activation_follows(n) ? 1 : 0;
  return {{"rows", rows}, {"inline_pad", inline_pad}, {"vw", 16}, {"epi", epi}};
}

// Output axes [n, c, oh, ow], reduce [ci (1), kh, kw]: a tile of `rows`
// output rows x vw columns (vector lanes; 16 without the knob) per channel,
// walked row-major, the kernel window unrolled so the rows a tile shares are
// loaded once; parallel over channels. inline_pad=1 reads the input through clamped loads instead
// of a zero-padded copy made per call.
Result<tir::Schedule> depthwise_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto it = std::find_if(k.stages.begin(), k.stages.end(), [&](const tir::ComputeDef& s) { return s.name == stage; });
  if (it == k.stages.end() || it->axes.size() != 4 || it->reduce_axes.size() != 3) return tir::default_schedule(k);
  const tir::ComputeDef& st = *it;
  KILN_ASSIGN_OR_RETURN(int64_t rows, knob(knobs, "rows", "conv.depthwise"));
  bool inline_pad = knob_on(knobs, "inline_pad");
  const int64_t lanes = knobs.count("vw") ? knobs.at("vw") : 16;
  std::vector<tir::Primitive> prims;
  const std::string &n_ax = st.axes[0], &c_ax = st.axes[1], &h_ax = st.axes[2], &w_ax = st.axes[3];
  // Splits axis a by f unless one tile covers it; returns {outer (or empty), inner}.
  auto tile = [&](const std::string& a, const Expr& extent, int64_t f) -> std::pair<std::string, std::string> {
    auto c = extent.as_const();
    if (c && *c <= f) return {"", a};
    prims.push_back(prim(c ? "split_overlap" : "split", stage, {a}, f));
    return {a + ".o", a + ".i"};
  };
  auto [w_outer, w_inner] = tile(w_ax, st.shape[3], lanes);
  auto [h_outer, h_inner] = tile(h_ax, st.shape[2], rows);
  std::vector<std::string> outer = {n_ax, c_ax};
  if (!h_outer.empty()) outer.push_back(h_outer);
  if (!w_outer.empty()) outer.push_back(w_outer);
  std::vector<std::string> order = outer;
  order.push_back(h_inner);
  order.push_back(w_inner);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  auto h_ext = st.shape[2].as_const();
  if (!h_ext || *h_ext > 1) prims.push_back(prim("unroll", stage, {h_inner}));
  for (size_t r = 1; r < 3; ++r) {
    auto c = st.reduce_extents[r].as_const();
    if (c && *c <= 7) prims.push_back(prim("unroll", stage, {st.reduce_axes[r]}));
  }
  prims.push_back(prim("vectorize", stage, {w_inner}));
  prims.push_back(prim("parallel", stage, {c_ax}));
  // epi=1: the fused epilogue runs over each channel's plane after its tiles.
  if (knob_on(knobs, "epi")) prims.push_back(prim("fuse_epilogue", stage, {c_ax}));
  tir::Schedule s = replace_stage_schedule(k, stage, prims);
  return inline_pad ? inline_padded_input(k, stage, std::move(s)) : s;
}

// ---- conv.winograd ----------------------------------------------------------

// A 3x3 kernel at stride 1 and dilation 1 (2-D, one group, constant f32 weight).
bool winograd_applies(const Node& n, std::string* why) {
  if (!panels_applies(n, why)) return false;
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  const std::vector<int64_t>& ws = weight_dims(n);
  if (ws[2] != 3 || ws[3] != 3) return no("not a 3x3 kernel");
  std::vector<int64_t> strides = n.attr_ints("strides", {1, 1});
  std::vector<int64_t> dil = n.attr_ints("dilations", {1, 1});
  if (strides != std::vector<int64_t>{1, 1} || dil != std::vector<int64_t>{1, 1}) return no("strided or dilated");
  return true;
}

// Tiles of m x m outputs over the plane; nullopt when symbolic.
std::optional<int64_t> winograd_tiles(const Node& n, int64_t m) {
  const Shape& ys = *n.output(0)->type().shape;
  auto h = ys[2].as_const(), w = ys[3].as_const();
  if (!h || !w || *h < 1 || *w < 1 || *h > (int64_t{1} << 20) || *w > (int64_t{1} << 20)) return std::nullopt;
  return ((*h + m - 1) / m) * ((*w + m - 1) / m);
}

// The default tile side: 4 on planes of at least 16 tiles of 4x4, else 2
// (see winograd_defaults); winograd_priority's rules follow the same choice.
int64_t winograd_default_m(const Node& n) {
  auto tiles4 = winograd_tiles(n, 4);
  return tiles4 && *tiles4 >= 16 ? 4 : 2;
}

tir::KnobSpace winograd_space(const Node&, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"m", {2, 4}});
  s.knobs.push_back(tir::Knob{"mr", {1, 2, 3, 4, 6, 8, 12}});
  s.knobs.push_back(tir::Knob{"vw", {lanes, 2 * lanes}});
  s.knobs.push_back(tir::Knob{"order", {0, 1}});
  s.knobs.push_back(tir::Knob{"vt", {lanes, 2 * lanes}});
  s.valid = [lanes, acc](const tir::Knobs& k) { return k.at("mr") * k.at("vw") / lanes <= acc; };
  return s;
}

// The products as conv.wvec's flat 1x1 tile over the tiles of the plane (vw
// from the tile count, mr output channels by the register file).
tir::Knobs winograd_defaults(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  // F(4x4, 3x3) where the plane has at least 16 tiles of 4x4 (13x13 and up),
  // F(2x2) below: F(4x4) multiplies 1.8 times fewer products, and since its
  // transforms are separable sums over inputs loaded once (ops/conv.cc) they
  // cost less than the products they save; on a small plane its few tiles
  // leave most of a vector's lanes idle (the products vectorize over tiles).
  // F(4x4)'s transformed weights are 36/16 of F(2x2)'s: where they come from
  // memory in the model, that can outweigh the products saved, so m is in the
  // space for the tuner to decide per host. Its rounding error is
  // 2.7 times F(2x2)'s (interpolation points in tir/winograd.h; 5.7 times
  // with 0, +-1, +-2).
  const int64_t m = winograd_default_m(n);
  int64_t vw = wvec_width(winograd_tiles(n, m), t, false);
  std::vector<std::pair<int64_t, double>> mrs;
  for (auto [r, rate] : {std::pair<int64_t, double>{8, 1.0}, {12, 1.05}, {6, 0.95}, {4, 0.85}, {3, 0.8}})
    if (r * vw / lanes <= acc) mrs.emplace_back(r, rate);
  int64_t mr = least_overlap_tile(out_channels(n), mrs);
  return {{"m", m}, {"mr", mr}, {"vw", vw}, {"order", 0}, {"vt", lanes}};
}

// The weights' transform U = G w GT (tir/winograd.h): at compile time for a
// constant, else by a kiln:WinogradWeights node (a kernel each run, one per
// weight and layout) reading G as a constant.
Status winograd_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  int64_t m = knobs.at("m"), mr = knobs.at("mr");
  Value* w = n.input(1);
  const std::vector<int64_t> ws = weight_dims(n);
  int64_t o = ws[0], i = ws[1];
  const tir::WinogradMatrices* mats = tir::winograd_matrices(m);
  if (mats == nullptr) return invalid_argument() << "conv.winograd: m = " << m << " (2 or 4)";
  int64_t panels = (o + mr - 1) / mr;
  if (o % mr != 0) set_int_attr(n, "kiln_out_channels", o);
  std::string layout = "W" + std::to_string(m) + "P" + std::to_string(mr);
  Value* packed = nullptr;
  if (w->is_constant()) {
    Tensor u(DType::kFloat32, {mats->alpha, mats->alpha, panels, i, mr});
    tir::winograd_weights(w->constant().data_as<float>(), o, i, m, mr, u.data_as<float>());
    packed = g.add_constant(g.unique_name(w->name() + "." + layout), std::move(u));
  } else {
    // From the weight packed in panels of mr (contiguous along the lanes the transform writes).
    auto g_matrix = [&] {
      Tensor gm(DType::kFloat32, {mats->alpha, 3});
      for (int64_t k = 0; k < mats->alpha * 3; ++k) gm.data_as<float>()[k] = static_cast<float>(mats->g[k]);
      return std::vector<Value*>{g.add_constant(g.unique_name("winograd_g" + std::to_string(m)), std::move(gm))};
    };
    packed = runtime_weight_node(g, n, runtime_panels(g, n, mr), "WinogradWeights", g_matrix, {{"m", m}}, layout,
                                 {mats->alpha, mats->alpha, panels, i, mr});
  }
  g.set_input(&n, 1, packed);
  set_string_attr(n, "kiln_weight_layout", layout);
  return Status::ok();
}

// The stages of ops/conv.cc's F(m x m, 3 x 3), all materialized: the padded
// phase-split input (parallel over channels, vectorized along the tile
// columns), the input transform (positions unrolled, vt tiles per vector),
// the products (conv.wvec's flat tile over the tiles, the positions as batch
// axes), the output transform (like the input's), and the output (the
// default schedule: its own loops, or inlined into a fused epilogue).
Result<tir::Schedule> winograd_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto find = [&](const std::string& name) { return find_stage(k, name); };
  const tir::ComputeDef *pad = find(stage + ".pad"), *vin = find(stage + ".wi"), *prod = find(stage + ".wm"),
                        *out = find(stage + ".wo");
  if (!pad || !vin || !prod || !out || pad->axes.size() != 5 || vin->axes.size() != 6 || prod->axes.size() != 6 ||
      out->axes.size() != 6)
    return invalid_argument() << "conv.winograd: kernel lacks the Winograd stages of '" << stage << "'";
  KILN_ASSIGN_OR_RETURN(int64_t vt, knob(knobs, "vt", "conv.winograd"));
  std::map<std::string, std::vector<tir::Primitive>> mine;
  mine[pad->name] = {prim("parallel", pad->name, {pad->axes[1]}), prim("vectorize", pad->name, {pad->axes[4]})};
  // Transforms: axes [n, x, y, c, th, tw] and [n, c, th, x, y, tw] (x, y the
  // unrolled tile positions) -> n, c, th, tw.o | x, y | tw.i (vector).
  auto transform = [&](const tir::ComputeDef& st, size_t c, size_t th, size_t x, size_t y) {
    std::vector<tir::Primitive>& p = mine[st.name];
    const std::string& tw = st.axes[5];
    auto ext = st.shape[5].as_const();
    std::string tw_outer, tw_inner = tw;
    if (!ext || *ext > vt) {
      p.push_back(prim(ext && *ext % vt != 0 ? "split_overlap" : "split", st.name, {tw}, vt));
      tw_outer = tw + ".o";
      tw_inner = tw + ".i";
    }
    std::vector<std::string> order = {st.axes[0], st.axes[c], st.axes[th]};
    if (!tw_outer.empty()) order.push_back(tw_outer);
    order.insert(order.end(), {st.axes[x], st.axes[y], tw_inner});
    p.push_back(prim("reorder", st.name, order));
    p.push_back(prim("unroll", st.name, {st.axes[x]}));
    p.push_back(prim("unroll", st.name, {st.axes[y]}));
    p.push_back(prim("vectorize", st.name, {tw_inner}));
    p.push_back(prim("parallel", st.name, {st.axes[c]}));
  };
  transform(*vin, 3, 4, 1, 2);
  transform(*out, 1, 2, 3, 4);
  tir::Knobs tile = knobs;
  tile["flat"] = 1;
  KILN_RETURN_IF_ERROR(wvec_tile(*prod, 3, tile, "conv.winograd", mine[prod->name]));
  return replace_stage_schedules(k, mine);
}

// Priority 40 (over conv.panels' 30) where the products have enough work
// to pay for the two transforms: at least 16 input and 64 output channels
// (each input tile's transform serves every output channel) and 16 tiles.
// Measured faster than conv.panels at 1 and 2 threads on such layers from 7x7
// to 56x56; with 32 output channels it won and lost.
//
// And where the transformed input and the products ((m + 2)^2 (C + O) floats
// per tile, m the default tile side: 16 for F(2x2), 36 per 4x4 tile for
// F(4x4)) take at most 16 MB, or their products do enough work per byte (C O /
// (C + O) at least 40): the stages pass over them whole, so larger ones
// stream from memory, which two threads do not speed up (32->64 147x147, 33
// MB and 21 products per byte, won at 1 thread but lost at 2; 80->192 71x71,
// 23 MB and 56, gained little at 2).
//
// And never below 16 products per byte: with so few, the five passes of the
// Winograd kernel (padding, input transform, products, output transform,
// copy out) over buffers larger than L2 do not scale to two threads
// (16->64 55x55, 12.8 per byte: conv.winograd ran slower at 2 threads than
// at 1, conv.panels faster).
//
// With F(4x4)'s cheap transforms, Winograd wins on more layers than that
// rule admits (measured on 128->32 28x28 and 16->64 55x55, at 1 and 2
// threads). Admitted: 32 to 63 output channels on planes of 16 or more 4x4
// tiles with at least 24 products per byte (densenet121's 128->32 growth
// layers, measured faster in the model) and 16 MB of transformed data at
// most. Not admitted: fewer products per byte (16->64, 32->32): with them
// inception_v3's 32->32 147x147 layer went to Winograd and its logits past
// the model test's tolerance against ONNX Runtime (err/tol 0.93 -> 1.14: an
// early layer's rounding carried through 90 more), so this rule stays short
// of where Winograd is fastest until an accuracy budget over a model's depth
// decides where the extra rounding can go.
int winograd_priority(const Node& n, const Target&) {
  const std::vector<int64_t>& ws = weight_dims(n);
  const int64_t m = winograd_default_m(n);
  auto tiles = winograd_tiles(n, m);
  if (!tiles || *tiles < 16 || ws[1] < 16) return 3;
  const double o = static_cast<double>(ws[0]), c = static_cast<double>(ws[1]);
  const double per_byte = c * o / (c + o);
  // The transformed input and products: (m + 2)^2 (C + O) floats per tile.
  const double bytes = static_cast<double>((m + 2) * (m + 2)) * 4.0 * (c + o) * static_cast<double>(*tiles);
  if (m == 4 && ws[0] >= 32 && ws[0] < 64) return per_byte >= 24 && bytes <= 16.0 * (1 << 20) ? 40 : 3;
  if (ws[0] < 64 || per_byte < 16) return 3;
  return bytes <= 16.0 * (1 << 20) || per_byte >= 40 ? 40 : 3;
}

// ---- conv.im2col -------------------------------------------------------------

int64_t conv_groups(const Node& n) { return n.attr_int("group", 1); }

// Any 2-D convolution with a constant f32 weight, grouped or not, except
// depthwise ones (one input and one output channel per group: conv.depthwise).
bool im2col_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (!onnx_weight_4d(n, why)) return false;
  const Tensor& t = n.input(1)->constant();
  if (t.dtype() != DType::kFloat32) return no("weight is not f32");
  const int64_t groups = conv_groups(n);
  if (groups <= 0 || t.shape()[0] % groups != 0) return no("output channels not a multiple of the groups");
  if (groups > 1 && t.shape()[1] == 1 && t.shape()[0] == groups) return no("depthwise (conv.depthwise)");
  return true;
}

// The output positions of one group's GEMM (OH OW), when known.
std::optional<int64_t> plane(const Node& n) { return wvec_extent(n, true); }

tir::KnobSpace im2col_space(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"col", {0, 1}});
  s.knobs.push_back(tir::Knob{"mr", {1, 2, 3, 4, 6, 8, 12}});
  s.knobs.push_back(tir::Knob{"vw", {lanes, 2 * lanes, 4 * lanes}});
  s.knobs.push_back(tir::Knob{"rows", {1, 2, 4}});
  s.knobs.push_back(tir::Knob{"order", {0, 1}});
  if (conv_groups(n) == 1) s.knobs.push_back(tir::Knob{"epi", {0, 1}});
  s.valid = [lanes, acc](const tir::Knobs& k) {
    int64_t rows = k.at("col") != 0 ? 1 : k.at("rows");
    return k.at("mr") * rows * k.at("vw") / lanes <= acc;
  };
  return s;
}

tir::Knobs im2col_defaults(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  const int64_t per_group = out_channels(n) / conv_groups(n);
  // With one group the columns are materialized (vectors across the whole
  // plane); grouped, the products read the input through the index map.
  // Grouped planes at most half a vector wide are materialized too (measured
  // faster flat than in rows of 7 of 16 lanes; col is in the space for a tuner
  // to decide per host).
  const Shape& ys = *n.output(0)->type().shape;
  auto width = ys[3].as_const();
  const bool col = conv_groups(n) == 1 || (width && *width * 2 <= lanes);
  // Grouped: one-vector rows, two of them (measured faster than one row of
  // two vectors, which puts a 28-wide row in two overlapping vectors).
  int64_t vw = col ? wvec_width(plane(n), t, true) : lanes;
  int64_t rows = col ? 1 : 2;
  std::vector<std::pair<int64_t, double>> mrs;
  for (auto [m, rate] : {std::pair<int64_t, double>{8, 1.0}, {12, 1.05}, {6, 0.95}, {4, 0.85}, {3, 0.8}, {2, 0.6}, {1, 0.4}})
    if (m * rows * vw / lanes <= acc) mrs.emplace_back(m, rate);
  int64_t mr = least_overlap_tile(per_group, mrs);
  tir::Knobs k = {{"col", col ? 1 : 0}, {"mr", mr}, {"vw", vw}, {"rows", rows}, {"order", 1}};
  if (conv_groups(n) == 1) k["epi"] = 0;
  return k;
}

// [O, Cg, KH, KW] -> [G, ceil(Og / mr), Cg, KH, KW, mr], zero past Og in each group.
Tensor pack_grouped_panels(const Tensor& t, int64_t groups, int64_t mr) {
  const std::vector<int64_t>& s = t.shape();
  int64_t per_group = s[0] / groups, inner = s[1] * s[2] * s[3];
  int64_t panels = (per_group + mr - 1) / mr;
  Tensor out(t.dtype(), {groups, panels, s[1], s[2], s[3], mr});
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  std::fill(dst, dst + groups * panels * inner * mr, 0.f);
  for (int64_t gi = 0; gi < groups; ++gi)
    for (int64_t m = 0; m < per_group; ++m)
      for (int64_t r = 0; r < inner; ++r)
        dst[((gi * panels + m / mr) * inner + r) * mr + m % mr] = src[(gi * per_group + m) * inner + r];
  return out;
}

Status im2col_transform(Graph& g, Node& n, const tir::Knobs& knobs) {
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", "conv.im2col"));
  Value* w = n.input(1);
  const int64_t groups = conv_groups(n), o = w->constant().shape()[0];
  if (groups <= 0 || o % groups != 0) return invalid_argument() << "conv.im2col: " << o << " output channels in " << groups << " groups";
  if ((o / groups) % mr != 0) set_int_attr(n, "kiln_out_channels", o);
  std::string layout = "G" + std::to_string(groups) + "P" + std::to_string(mr);
  Value* packed = g.add_constant(g.unique_name(w->name() + "." + layout), pack_grouped_panels(w->constant(), groups, mr));
  g.set_input(&n, 1, packed);
  set_string_attr(n, "kiln_weight_layout", layout);
  set_int_attr(n, "kiln_im2col", knob_on(knobs, "col") ? 1 : 0);
  return Status::ok();
}

// The columns (or the padded input) in full, parallel over channels and
// vectorized along the row; the products as conv.wvec's tile, flat over the
// plane when they read the columns (the group a batch axis); the grouped
// output copy on the default schedule.
Result<tir::Schedule> im2col_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  auto find = [&](const std::string& name) { return find_stage(k, name); };
  const tir::ComputeDef *col = find(stage + ".col"), *pad = find(stage + ".pad"), *gm = find(stage + ".gm");
  const tir::ComputeDef* prod = gm ? gm : find(stage);
  if (prod == nullptr || prod->axes.size() != (gm ? 5u : 4u) || (col && col->axes.size() != 7) ||
      (pad && pad->axes.size() != 4))
    return invalid_argument() << "conv.im2col: kernel lacks the im2col stages of '" << stage << "'";
  std::map<std::string, std::vector<tir::Primitive>> mine;
  if (col) {
    std::vector<std::optional<int64_t>> counts;
    for (size_t i = 0; i < 3; ++i) counts.push_back(col->shape[i].as_const());
    int par = tir::choose_parallel(counts);
    if (par >= 0) mine[col->name].push_back(prim("parallel", col->name, {col->axes[static_cast<size_t>(par)]}));
    mine[col->name].push_back(prim("vectorize", col->name, {col->axes[6]}));
  }
  if (pad) mine[pad->name] = {prim("parallel", pad->name, {pad->axes[1]}), prim("vectorize", pad->name, {pad->axes[3]})};
  tir::Knobs tile = knobs;
  tile["flat"] = col ? 1 : 0;
  KILN_RETURN_IF_ERROR(wvec_tile(*prod, prod->axes.size() - 3, tile, "conv.im2col", mine[prod->name]));
  if (!gm && knob_on(knobs, "epi")) defer_epilogue(prod->name, mine[prod->name]);
  return replace_stage_schedules(k, mine);
}

// Grouped convolutions with several channels per group have no other
// candidate than conv.direct (vectorized along the output rows, one output
// channel at a time). conv.im2col at its defaults measured faster than
// conv.direct with 8 or more channels per group, slower with 4 (36 products
// per output). Priority 25 (over conv.direct's 10) from 64 products per
// output.
//
// With one group conv.panels, conv.wvec and conv.winograd won wherever
// measured against conv.im2col with its columns: priority 2, chosen by
// measurement only.
int im2col_priority(const Node& n, const Target&) {
  if (conv_groups(n) == 1) return 2;
  const std::vector<int64_t>& ws = weight_dims(n);
  return ws[1] * ws[2] * ws[3] >= 64 ? 25 : 8;
}

// ---- conv.onednn -------------------------------------------------------------

// oneDNN's convolution (onednn/conv.h: a host kernel; the weight reordered
// once at compile time): 2-D f32 convolutions with a constant weight and bias
// and static shapes, which its primitive needs at creation.
bool onednn_applies(const Node& n, std::string* why) {
  auto no = [&](const char* w) {
    if (why) *why = w;
    return false;
  };
  if (!onnx_weight_4d(n, why)) return false;
  if (n.input(1)->constant().dtype() != DType::kFloat32 || n.input(0)->type().dtype != DType::kFloat32)
    return no("not f32");
  if (n.num_inputs() > 2 && n.input(2) != nullptr &&
      (!n.input(2)->is_constant() || n.input(2)->constant().dtype() != DType::kFloat32))
    return no("bias is not an f32 constant");
  for (const Value* v : {n.input(0), n.output(0)}) {
    if (!v->type().shape) return no("shapes not static");
    for (const Expr& d : *v->type().shape)
      if (auto c = d.as_const(); !c || *c < 1) return no("shapes not static and non-empty");
  }
  return true;
}

// Knob blocked: 1 lets oneDNN choose the activations' layout (its blocked
// kernels, brgconv on AVX-512) with a reorder of the input and output around
// each call, 0 keeps them NCHW (its GEMM-based kernels). Default 1: blocked
// measured faster in a oneDNN program (without the reorders); the knob is in
// the space for a tuner to decide per host.
tir::KnobSpace onednn_space(const Node&, const Target&) {
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"blocked", {0, 1}});
  return s;
}

tir::Knobs onednn_defaults(const Node&, const Target&) { return {{"blocked", 1}}; }

Status onednn_transform(Graph&, Node& n, const tir::Knobs& knobs) {
  set_int_attr(n, "kiln_onednn", 1);
  set_int_attr(n, "kiln_onednn_blocked", knob_on(knobs, "blocked") ? 1 : 0);
  return Status::ok();
}

}  // namespace

void register_conv_candidates() {
  Candidate dw;
  dw.name = "conv.depthwise";
  dw.op = "Conv";
  dw.priority = 15;
  dw.summary = "depthwise: rows x 16 output tile per channel, kernel window unrolled, optional inlined padding";
  dw.applies = depthwise_applies;
  dw.space = depthwise_space;
  dw.default_knobs = depthwise_defaults;
  dw.schedule = depthwise_schedule;
  register_candidate(std::move(dw));

  Candidate wino;
  wino.name = "conv.winograd";
  wino.op = "Conv";
  wino.priority = 3;
  wino.summary = "Winograd F(m x m, 3 x 3): input transform, (m+2)^2 products over the input channels (conv.wvec's "
                 "tile over the tiles), output transform; weights transformed at compile time";
  wino.applies = winograd_applies;
  wino.priority_for = winograd_priority;
  wino.space = winograd_space;
  wino.default_knobs = winograd_defaults;
  wino.transform = winograd_transform;
  wino.schedule = winograd_schedule;
  register_candidate(std::move(wino));

  Candidate wvec;
  wvec.name = "conv.wvec";
  wvec.op = "Conv";
  wvec.priority = 4;
  wvec.summary = "weights packed [O/mr, I, KH, KW, mr]; mr output channels (broadcasts) x rows x vw output "
                 "columns (vector lanes) register tile, contiguous stores";
  wvec.applies = wvec_applies;
  wvec.priority_for = wvec_priority;
  wvec.space = wvec_space;
  wvec.default_knobs = wvec_defaults;
  wvec.transform = wvec_transform;
  wvec.schedule = wvec_schedule;
  register_candidate(std::move(wvec));

  Candidate panels;
  panels.name = "conv.panels";
  panels.op = "Conv";
  panels.priority = 30;
  panels.summary = "weights packed [O/nr, I, KH, KW, nr]; nr output channels (vector lanes) x mr output columns "
                   "register tile, one contiguous weight panel per tile";
  panels.applies = panels_applies;
  panels.priority_for = panels_priority;
  panels.space = panels_space;
  panels.default_knobs = panels_defaults;
  panels.transform = panels_transform;
  panels.schedule = panels_schedule;
  register_candidate(std::move(panels));

  Candidate packed;
  packed.name = "conv.ihwo";
  packed.op = "Conv";
  packed.priority = 20;
  packed.summary = "weights re-laid out [I, KH, KW, O]; vectorized over output channels";
  packed.applies = ihwo_applies;
  packed.priority_for = ihwo_priority;
  packed.transform = ihwo_transform;
  register_candidate(std::move(packed));

  Candidate im2col;
  im2col.name = "conv.im2col";
  im2col.op = "Conv";
  im2col.priority = 2;
  im2col.summary = "one GEMM per image and group: weights packed [G, Og/mr, Cg, KH, KW, mr], the input's columns "
                   "materialized (col=1, vectors across the plane) or read through the im2col index map (col=0); "
                   "conv.wvec's register tile";
  im2col.applies = im2col_applies;
  im2col.priority_for = im2col_priority;
  im2col.space = im2col_space;
  im2col.default_knobs = im2col_defaults;
  im2col.transform = im2col_transform;
  im2col.schedule = im2col_schedule;
  register_candidate(std::move(im2col));

  // Priority 1: chosen only where measured faster (--select measure) or
  // asked for; Kiln's own templates win by priority.
  Candidate onednn;
  onednn.name = "conv.onednn";
  onednn.op = "Conv";
  onednn.priority = 1;
  onednn.summary = "oneDNN's convolution primitive (libdnnl, OpenMP threads), weight reordered at compile time; "
                   "knob blocked: its own activation layout with reorders around each call";
  onednn.applies = onednn_applies;
  onednn.space = onednn_space;
  onednn.default_knobs = onednn_defaults;
  onednn.transform = onednn_transform;
  onednn.max_threads = 1;  // OpenMP's spinning workers slow Kiln's own pool (onednn/conv.cc)
  register_candidate(std::move(onednn));

  Candidate direct;
  direct.name = "conv.direct";
  direct.op = "Conv";
  direct.priority = 10;
  direct.summary = "weights as stored [O, I, KH, KW]; vectorized over the output width";
  register_candidate(std::move(direct));
}

}  // namespace kiln::strategy
