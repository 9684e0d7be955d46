// conv.wgrad: the template of kiln:ConvWeightGrad (ops/conv_grad.cc), a
// convolution's weight gradient [K..., R, V] summed over the images and the
// output positions [N, O...]. It is a product per tap: rows R read as
// broadcast scalars from the channels-first operand, lanes V as vectors
// from the channels-last one (depthwise, [K..., C]: the last kernel dim
// is R, both operands vectors along the channels). Template:
//   tile the lanes by nr and the rows by mr; tile loops outermost (threads
//   split the one with more tiles), then the taps, so that one tile's taps
//   read the same rows and overlapping windows of the other operand back to
//   back; then the reduction over images and positions; the mr x nr tile in
//   registers (cache_write at the last tap), rows unrolled, lanes
//   vectorized.
// Knob rb: the reduction in blocks of rb output rows (the rows of every image
// are one reduce axis), the block loop outermost (hoist_reduce), partial sums
// kept in the output between blocks, so that every tile reuses one block of
// both operands from cache; 0: no blocks, each tile streams every image.
// Knobs mr, nr as gemm.packed's.
#include <algorithm>

#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

struct WgradShape {
  std::optional<int64_t> rows, lanes;
  // Output rows of all images (the first reduce axis) and the bytes of both
  // operands per output row; unset where symbolic.
  std::optional<int64_t> out_rows, row_bytes;
};

std::optional<int64_t> static_product(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) {
    auto c = s[i].as_const();
    if (!c || *c < 0 || __builtin_mul_overflow(p, *c, &p)) return std::nullopt;
  }
  return p;
}

std::optional<WgradShape> wgrad_shape(const Node& n) {
  const Value* a = n.num_inputs() > 0 ? n.input(0) : nullptr;
  const Value* b = n.num_inputs() > 1 ? n.input(1) : nullptr;
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (a == nullptr || b == nullptr || y == nullptr || !a->type().shape || !b->type().shape || !y->type().shape)
    return std::nullopt;
  const Shape& ys = *y->type().shape;
  const Shape &as = *a->type().shape, &bs = *b->type().shape;
  if (ys.size() < 3 || as.size() < 3 || bs.size() != as.size()) return std::nullopt;
  WgradShape s;
  s.rows = ys[ys.size() - 2].as_const();
  s.lanes = ys.back().as_const();
  for (size_t i = 0; i + 2 < ys.size(); ++i)
    if (!ys[i].as_const()) return std::nullopt;
  // dY is the channels-first a (window 0: [N, M, O...]) or the
  // channels-last b (window 1: [N, O..., M]; depthwise: a [N, O..., C]);
  // its first output dim is O1, the rows each image has.
  const bool window_on_a = n.attr_int("window", 0) == 1, depthwise = n.attr_int("depthwise", 0) == 1;
  const Expr& o1 = window_on_a ? bs[1] : depthwise ? as[1] : as[2];
  auto batch = as[0].as_const(), rows = o1.as_const();
  auto pa = static_product(as, 1, as.size()), pb = static_product(bs, 1, bs.size());
  int64_t both = 0, out_rows = 0, row_bytes = 0;
  if (batch && rows && *rows > 0 && pa && pb && !__builtin_add_overflow(*pa, *pb, &both) &&
      !__builtin_mul_overflow(*batch, *rows, &out_rows) && !__builtin_mul_overflow(both / *rows, int64_t{4}, &row_bytes)) {
    s.out_rows = out_rows;
    s.row_bytes = row_bytes;
  }
  return s;
}

bool wgrad_applies(const Node& n, std::string* why) {
  const Value* y = n.num_outputs() > 0 ? n.output(0) : nullptr;
  if (y == nullptr || y->dtype() != DType::kFloat32) {
    if (why) *why = "output not f32";
    return false;
  }
  if (!wgrad_shape(n)) {
    if (why) *why = "shapes unknown or taps symbolic";
    return false;
  }
  return true;
}

bool divides_or_covers(std::optional<int64_t> extent, int64_t tile) {
  return extent && (*extent <= tile || *extent % tile == 0);
}

tir::KnobSpace wgrad_space(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  std::optional<WgradShape> shape = wgrad_shape(n);
  tir::KnobSpace s;
  s.knobs.push_back(tir::Knob{"mr", {1, 2, 3, 4, 6, 8, 12}});
  s.knobs.push_back(tir::Knob{"nr", {lanes, 2 * lanes, 3 * lanes, 4 * lanes}});
  s.knobs.push_back(tir::Knob{"rb", {0, 1, 2, 4, 8, 16, 32, 64, 128}});
  s.valid = [lanes, acc, shape](const tir::Knobs& k) {
    const int64_t mr = k.at("mr"), nr = k.at("nr"), rb = k.at("rb");
    if (mr * nr / lanes > acc || (nr == 3 * lanes && mr != 1)) return false;
    // Partial sums kept between blocks: tiles may not overlap (each would
    // add a block twice to the points they share), and the blocks tile the
    // rows of a known batch exactly, more than one of them.
    if (rb != 0 && (!shape || !shape->out_rows || *shape->out_rows % rb != 0 || *shape->out_rows == rb ||
                    !divides_or_covers(shape->rows, mr) || !divides_or_covers(shape->lanes, nr)))
      return false;
    return true;
  };
  return s;
}

tir::Knobs wgrad_defaults(const Node& n, const Target& t) {
  const int64_t lanes = t.lanes(), acc = t.accumulators();
  std::optional<WgradShape> shape = wgrad_shape(n);
  tir::KnobSpace space = wgrad_space(n, t);
  // The register tile with the most accumulators that hold output (rows
  // past R hold none), in two thirds of the accumulator budget (the rest of
  // the registers hold a step's operand vectors and the window's bounds),
  // tiling R and V exactly where some tile does; more rows win a tie.
  tir::Knobs k = {{"mr", 1}, {"nr", lanes}, {"rb", 0}};
  int64_t best = -1;
  for (bool exact : {true, false}) {
    for (int64_t mr : {12, 8, 6, 4, 3, 2, 1}) {
      for (int64_t nr : {4 * lanes, 2 * lanes, lanes}) {
        if (mr * nr / lanes * 3 > acc * 2) continue;
        if (exact && !(shape && divides_or_covers(shape->rows, mr) && divides_or_covers(shape->lanes, nr))) continue;
        const int64_t used = (shape && shape->rows ? std::min(mr, *shape->rows) : mr) * nr / lanes;
        if (used > best) {
          best = used;
          k["mr"] = mr;
          k["nr"] = nr;
        }
      }
    }
    if (best > 0) break;
  }
  // Blocks where both operands do not fit half of a core's level-2 cache
  // together: the most rows whose operands do.
  int64_t all_bytes = 0;
  if (shape && shape->out_rows && shape->row_bytes &&
      (__builtin_mul_overflow(*shape->out_rows, *shape->row_bytes, &all_bytes) || all_bytes > t.l2_bytes / 2)) {
    for (int64_t rb : {128, 64, 32, 16, 8, 4, 2, 1}) {
      tir::Knobs b = k;
      b["rb"] = rb;
      int64_t block_bytes = 0;
      if (!__builtin_mul_overflow(rb, *shape->row_bytes, &block_bytes) && block_bytes <= t.l2_bytes / 2 &&
          space.valid(b)) {
        k = b;
        break;
      }
    }
  }
  return k;
}

Result<tir::Schedule> wgrad_schedule(const tir::KernelDef& k, const std::string& stage, const tir::Knobs& knobs) {
  const tir::ComputeDef* st = find_stage(k, stage);
  if (st == nullptr || st->axes.size() < 3 || st->reduce_axes.empty()) return tir::default_schedule(k);
  KILN_ASSIGN_OR_RETURN(int64_t mr, knob(knobs, "mr", "conv.wgrad"));
  KILN_ASSIGN_OR_RETURN(int64_t nr, knob(knobs, "nr", "conv.wgrad"));
  const size_t rank = st->axes.size();
  std::vector<tir::Primitive> prims;
  ColumnTile lanes = tile_columns(prims, stage, st->axes[rank - 1], st->shape[rank - 1], nr);
  ColumnTile rows = tile_columns(prims, stage, st->axes[rank - 2], st->shape[rank - 2], mr);
  std::vector<std::string> outer;
  std::vector<std::optional<int64_t>> counts;
  auto push = [&](const ColumnTile& c) {
    if (c.outer.empty()) return;
    outer.push_back(c.outer);
    counts.push_back(c.count);
  };
  // The tile loop with more tiles outermost (the one threads split).
  const bool rows_first = !lanes.count || (rows.count && *rows.count >= *lanes.count);
  push(rows_first ? rows : lanes);
  push(rows_first ? lanes : rows);
  const size_t tile_loops = outer.size();
  for (size_t i = 0; i + 2 < rank; ++i) {
    outer.push_back(st->axes[i]);
    counts.push_back(st->shape[i].as_const());
  }
  std::vector<std::string> order = outer;
  order.push_back(rows.inner);
  order.push_back(lanes.inner);
  prims.push_back(prim("reorder", stage, order));
  prims.push_back(prim("cache_write", stage, {outer.back()}));
  if (auto r = st->shape[rank - 2].as_const(); !r || *r > 1) prims.push_back(prim("unroll", stage, {rows.inner}));
  prims.push_back(prim("vectorize", stage, {lanes.inner}));
  // Threads split a tile loop where there is one (each thread its own
  // outputs), else the taps.
  std::vector<std::optional<int64_t>> tile_counts(counts.begin(), counts.begin() + static_cast<long>(tile_loops));
  int par = tir::choose_parallel(tile_counts);
  if (par < 0) par = tir::choose_parallel(counts);
  if (par >= 0) prims.push_back(prim("parallel", stage, {outer[static_cast<size_t>(par)]}));
  if (int64_t rb = knobs.count("rb") ? knobs.at("rb") : 0; rb > 0) {
    auto out_rows = st->reduce_extents[0].as_const();
    if (!out_rows || *out_rows % rb != 0 || *out_rows == rb)
      return invalid_argument() << "conv.wgrad: rb = " << rb << " does not block the reduction's rows exactly";
    prims.push_back(prim("split", stage, {st->reduce_axes[0]}, rb));
    prims.push_back(prim("hoist_reduce", stage, {st->reduce_axes[0] + ".o"}));
  }
  return replace_stage_schedule(k, stage, prims);
}

}  // namespace

void register_conv_grad_candidates() {
  Candidate c;
  c.name = "conv.wgrad";
  c.op = "kiln:ConvWeightGrad";
  c.priority = 20;
  c.summary = "weight gradient per tap: mr rows (broadcasts) x nr lanes (vectors) register tile, taps inside the "
              "tile loops, optionally one image at a time";
  c.applies = wgrad_applies;
  c.space = wgrad_space;
  c.default_knobs = wgrad_defaults;
  c.schedule = wgrad_schedule;
  register_candidate(std::move(c));
}

}  // namespace kiln::strategy
