// conv.blocked: the convolution on blocked-channel activations
// (kiln:ConvBlocked, ops/layout.cc; made by the pass block-layout). Output
// axes [n, ob, oh, ow, o], o one vector of b channels: the template tiles
// nb output blocks by mr output columns in registers (loops n, ob.o, oh, ow.o
// | reduce | ob.i, ow.i, o), so each reduction step loads nb weight vectors
// (contiguous: the weights are [ob, ib, kh, kw, ii, o]) and mr broadcasts of
// the input (one input channel of mr positions; contiguous in ii), and the
// write-back stores whole vectors of one position's channels: contiguous,
// unlike conv.panels' across NCHW planes. Depthwise: each step loads mr input
// vectors and nb weight vectors. Knobs: mr, nb, rows (threads split output
// rows, else whichever outer loop choose_parallel picks), epi (the fused
// epilogue on the tile in registers, or deferred to after each output row,
// over the outputs its tiles wrote; for the tuner, off by default).
#include <algorithm>

#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

struct BlockedShape {
  int64_t blocks = 0, width = 0, height = 0;
  bool depthwise = false;
};

std::optional<BlockedShape> blocked_shape(const Node& n) {
  const TensorType& yt = n.output(0)->type();
  if (!yt.shape || yt.shape->size() != 5) return std::nullopt;
  auto ob = (*yt.shape)[1].as_const(), h = (*yt.shape)[2].as_const(), w = (*yt.shape)[3].as_const(),
       b = (*yt.shape)[4].as_const();
  if (!ob || !b) return std::nullopt;
  BlockedShape s;
  s.blocks = *ob;
  s.height = h.value_or(0);  // 0: symbolic
  s.width = w.value_or(0);
  s.depthwise = n.attr_int("group", 1) != 1;
  return s;
}

bool blocked_applies(const Node& n, std::string* why) {
  if (n.output(0) == nullptr || n.output(0)->dtype() != DType::kFloat32) {
    if (why) *why = "not f32";
    return false;
  }
  if (!blocked_shape(n)) {
    if (why) *why = "output blocks or block size not constant";
    return false;
  }
  return true;
}

tir::KnobSpace blocked_space(const Node& n, const Target& t) {
  tir::KnobSpace s;
  auto bs = blocked_shape(n);
  tir::Knob mr{"mr", {1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 24}};
  // A tile of one whole output row where the row fits the accumulators.
  if (bs && bs->width > 0 && bs->width <= t.accumulators() &&
      std::find(mr.values.begin(), mr.values.end(), bs->width) == mr.values.end())
    mr.values.push_back(bs->width);
  s.knobs.push_back(mr);
  s.knobs.push_back(tir::Knob{"nb", {1, 2, 4}});
  s.knobs.push_back(tir::Knob{"rows", {0, 1}});
  s.knobs.push_back(tir::Knob{"epi", {0, 1}, 0});
  const int64_t acc = t.accumulators();
  const int64_t blocks = bs ? bs->blocks : 1;
  s.valid = [acc, blocks](const tir::Knobs& k) { return k.at("mr") * k.at("nb") <= acc && blocks % k.at("nb") == 0; };
  return s;
}

tir::Knobs blocked_defaults(const Node& n, const Target& t) {
  auto bs = blocked_shape(n);
  const int64_t acc = t.accumulators();
  // Two output blocks per tile where they divide (each input broadcast feeds
  // two FMAs); depthwise one (nothing to share across blocks).
  int64_t nb = bs && !bs->depthwise && bs->blocks % 2 == 0 ? 2 : 1;
  int64_t cap = std::max<int64_t>(acc / nb, 1);
  // One block per tile: longer rows of accumulators (12 or 14 columns) hide
  // the FMA latency with one weight vector per step; a row that fits whole
  // is one tile (no column computed twice).
  std::vector<std::pair<int64_t, double>> tiles;
  for (auto [m, rate] : nb == 1 ? std::vector<std::pair<int64_t, double>>{{14, 1.0}, {12, 1.0}, {8, 0.95}, {7, 0.93}, {6, 0.9}}
                                : std::vector<std::pair<int64_t, double>>{{8, 1.0}, {7, 0.97}, {6, 0.92}, {5, 0.88}, {4, 0.85}})
    if (m <= cap) tiles.emplace_back(m, rate);
  int64_t mr = std::min<int64_t>(8, cap);
  const int64_t whole = nb == 1 ? std::min<int64_t>(cap, 24) : std::min<int64_t>(cap, 8);
  if (bs && bs->width > 0 && bs->width <= whole) {
    mr = bs->width;
  } else if (bs && bs->width > 0 && bs->width <= 14 && cap >= 7) {
    mr = 7;
  } else if (bs && bs->width > 0 && !tiles.empty()) {
    mr = least_overlap_tile(bs->width, tiles);
  }
  // Threads split output rows by conv.panels' rule (input_outweighs_weights)
  // where there are rows enough for an even share (at least 4 per thread of
  // 2); else the outer loop choose_parallel picks (the output blocks).
  const bool many_rows = bs && (bs->height == 0 || bs->height >= 8);
  const int64_t rows = many_rows && input_outweighs_weights(n) ? 1 : 0;
  return {{"mr", std::max<int64_t>(mr, 1)}, {"nb", nb}, {"rows", rows}, {"epi", 0}};
}

Result<tir::Schedule> blocked_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  const tir::ComputeDef* st = find_stage(k, stage);
  if (st == nullptr || st->axes.size() != 5) return tir::default_schedule(k);
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", "conv.blocked"));
  KILN_ASSIGN_OR_RETURN(int64_t nb, knob(knobs, "nb", "conv.blocked"));
  std::vector<tir::Primitive> prims;
  const std::string &n_ax = st->axes[0], &b_ax = st->axes[1], &h_ax = st->axes[2], &w_ax = st->axes[3],
                    &o_ax = st->axes[4];
  auto b_ext = st->shape[1].as_const();
  std::string b_outer = b_ax, b_inner;
  if (nb > 1 && b_ext && *b_ext % nb == 0 && *b_ext > nb) {
    prims.push_back(prim("split", stage, {b_ax}, nb));
    b_outer = b_ax + ".o";
    b_inner = b_ax + ".i";
  } else if (nb > 1 && b_ext && *b_ext == nb) {
    b_outer.clear();
    b_inner = b_ax;
  }
  auto w_ext = st->shape[3].as_const();
  ColumnTile w = tile_columns(prims, stage, w_ax, st->shape[3], mr);
  std::vector<std::string> outer = {n_ax};
  std::vector<std::optional<int64_t>> counts = {st->shape[0].as_const()};
  if (!b_outer.empty()) {
    outer.push_back(b_outer);
    counts.push_back(b_ext ? std::optional<int64_t>(b_inner.empty() ? *b_ext : *b_ext / nb) : std::nullopt);
  }
  outer.push_back(h_ax);
  counts.push_back(st->shape[2].as_const());
  if (!w.outer.empty()) {
    outer.push_back(w.outer);
    counts.push_back(w.count);
  }
  std::vector<std::string> order = outer;
  if (!b_inner.empty()) order.push_back(b_inner);
  order.push_back(w.inner);
  order.push_back(o_ax);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  if (!b_inner.empty()) prims.push_back(prim("unroll", stage, {b_inner}));
  if (!w_ext || *w_ext > 1) prims.push_back(prim("unroll", stage, {w.inner}));
  prims.push_back(prim("vectorize", stage, {o_ax}));
  parallelize_rows_or_outer(prims, stage, knobs, h_ax, st->shape[2], outer, counts);
  // Deferred: after each output row (its tiles' outputs, in L1), which is the
  // tile loop itself where one tile covers the row; inside the parallel loop either way.
  if (knob_on(knobs, "epi")) prims.push_back(prim("fuse_epilogue", stage, {h_ax}));
  return replace_stage_schedule(k, stage, prims);
}

// layout.from_blocked: kiln:FromBlocked [N, Cb, H, W, b] -> [N, C, H, W]
// with the channels split by ct (loops n, c.o, h, c.i, w; w vectorized):
// the ct channels of one block read one input row of W x b values (3.5 KB
// for 56 columns of 16 lanes), which stays in the level-1 cache while they
// are written out as ct contiguous rows. The default schedule walks each
// output channel's whole plane in turn, re-reading every position's line of
// b lanes once per channel, from the level-2 cache or memory on large
// planes. Knob ct (channels per tile; the block is the default).
bool from_blocked_rank(const Node& n, std::string* why) {
  const Value* y = n.output(0);
  if (y == nullptr || !y->type().shape || y->type().shape->size() < 3) {
    if (why) *why = "output rank under 3";
    return false;
  }
  return true;
}

bool from_blocked_applies(const Node& n, std::string* why) {
  if (n.attr_int("channels_last", 0) != 0) {
    if (why) *why = "channels-last output";
    return false;
  }
  return from_blocked_rank(n, why);
}

bool from_blocked_cl_applies(const Node& n, std::string* why) {
  if (n.attr_int("channels_last", 0) != 1) {
    if (why) *why = "channels-first output";
    return false;
  }
  return from_blocked_rank(n, why);
}

tir::KnobSpace from_blocked_space(const Node& n, const Target&) {
  tir::KnobSpace s;
  tir::Knob ct{"ct", {4, 8, 16, 32}};
  int64_t b = n.attr_int("block", 16);
  if (std::find(ct.values.begin(), ct.values.end(), b) == ct.values.end()) ct.values.push_back(b);
  s.knobs.push_back(ct);
  return s;
}

tir::Knobs from_blocked_defaults(const Node& n, const Target&) { return {{"ct", std::max<int64_t>(n.attr_int("block", 16), 1)}}; }

// The stage a FromBlocked template schedules: the FromBlocked stage where it
// is the kernel's output; else (elementwise readers fused after it) the
// kernel's last stage, of the same shape, into which the default schedule
// inlines it, so the loads keep the template's order. Null: neither (the
// default schedule).
const tir::ComputeDef* from_blocked_target(const tir::KernelDef& k, const std::string& stage) {
  const tir::ComputeDef* st = find_stage(k, stage);
  if (st == nullptr || st->axes.size() < 3 || !st->reduce_axes.empty()) return nullptr;
  const tir::ComputeDef& last = k.stages.back();
  if (last.name == stage) return st;
  if (!last.reduce_axes.empty() || last.shape.size() != st->shape.size()) return nullptr;
  for (size_t i = 0; i < st->shape.size(); ++i)
    if (!(last.shape[i] == st->shape[i])) return nullptr;
  tir::Schedule base = tir::default_schedule(k);
  bool inlined = std::any_of(base.prims.begin(), base.prims.end(),
                             [&](const tir::Primitive& p) { return p.kind == "inline" && p.stage == stage; });
  return inlined ? &last : nullptr;
}

Result<tir::Schedule> from_blocked_schedule(const tir::KernelDef& k, const std::string& stage,
                                            const tir::Knobs& knobs) {
  const tir::ComputeDef* st = from_blocked_target(k, stage);
  if (st == nullptr) return tir::default_schedule(k);
  KILN_ASSIGN_OR_RETURN(int64_t ct, knob(knobs, "ct", "layout.from_blocked"));
  std::vector<tir::Primitive> prims;
  const std::string& target = st->name;
  const std::string &n_ax = st->axes[0], &w_ax = st->axes.back();
  ColumnTile c = tile_columns(prims, target, st->axes[1], st->shape[1], ct);
  std::vector<std::string> order = {n_ax};
  if (!c.outer.empty()) order.push_back(c.outer);
  for (size_t i = 2; i + 1 < st->axes.size(); ++i) order.push_back(st->axes[i]);
  order.push_back(c.inner);
  order.push_back(w_ax);
  prims.push_back(prim("reorder", target, order));
  prims.push_back(prim("vectorize", target, {w_ax}));
  // Threads split the channel tiles, else the rows.
  std::vector<std::optional<int64_t>> counts = {st->shape[0].as_const()};
  std::vector<std::string> outer = {n_ax};
  if (!c.outer.empty()) {
    outer.push_back(c.outer);
    counts.push_back(c.count);
  }
  for (size_t i = 2; i + 1 < st->axes.size(); ++i) {
    outer.push_back(st->axes[i]);
    counts.push_back(st->shape[i].as_const());
  }
  if (int par = tir::choose_parallel(counts); par >= 0) prims.push_back(prim("parallel", target, {outer[static_cast<size_t>(par)]}));
  return replace_stage_schedule(k, target, prims);
}

// layout.from_blocked_cl: kiln:FromBlocked with channels_last, [N, Cb, H, W,
// b] -> [N, H, W, C]: the channels split by ct (b by default) and the inner
// part vectorized, so each vector is one contiguous load of a position's
// lanes and one contiguous store (the default schedule vectorizes the
// channels unsplit: a gather through c / b and c % b).
Result<tir::Schedule> from_blocked_cl_schedule(const tir::KernelDef& k, const std::string& stage,
                                               const tir::Knobs& knobs) {
  const tir::ComputeDef* st = from_blocked_target(k, stage);
  if (st == nullptr) return tir::default_schedule(k);
  KILN_ASSIGN_OR_RETURN(int64_t ct, knob(knobs, "ct", "layout.from_blocked_cl"));
  std::vector<tir::Primitive> prims;
  const std::string& target = st->name;
  std::vector<std::string> outer(st->axes.begin(), st->axes.end() - 1);
  std::vector<std::optional<int64_t>> counts;
  for (size_t i = 0; i + 1 < st->axes.size(); ++i) counts.push_back(st->shape[i].as_const());
  ColumnTile c = tile_columns(prims, target, st->axes.back(), st->shape.back(), ct);
  if (!c.outer.empty()) {
    outer.push_back(c.outer);
    counts.push_back(c.count);
  }
  prims.push_back(prim("vectorize", target, {c.inner}));
  if (int par = tir::choose_parallel(counts); par >= 0) prims.push_back(prim("parallel", target, {outer[static_cast<size_t>(par)]}));
  return replace_stage_schedule(k, target, prims);
}

}  // namespace

void register_blocked_candidates() {
  Candidate c;
  c.name = "conv.blocked";
  c.op = "kiln:ConvBlocked";
  c.priority = 30;
  c.summary = "blocked-channel convolution: nb output blocks x mr columns register tile, contiguous vector stores";
  c.applies = blocked_applies;
  c.space = blocked_space;
  c.default_knobs = blocked_defaults;
  c.schedule = blocked_schedule;
  register_candidate(std::move(c));

  Candidate fb;
  fb.name = "layout.from_blocked";
  fb.op = "kiln:FromBlocked";
  fb.priority = 10;
  fb.summary = "blocked to NCHW a block of channels at a time: each input row read once from the level-1 cache";
  fb.applies = from_blocked_applies;
  fb.space = from_blocked_space;
  fb.default_knobs = from_blocked_defaults;
  fb.schedule = from_blocked_schedule;
  register_candidate(std::move(fb));

  Candidate cl;
  cl.name = "layout.from_blocked_cl";
  cl.op = "kiln:FromBlocked";
  cl.priority = 10;
  cl.summary = "blocked to channels-last: a position's b lanes one contiguous vector each way";
  cl.applies = from_blocked_cl_applies;
  cl.space = from_blocked_space;
  cl.default_knobs = from_blocked_defaults;
  cl.schedule = from_blocked_cl_schedule;
  register_candidate(std::move(cl));
}

}  // namespace kiln::strategy
