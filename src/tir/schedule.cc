#include "tir/schedule.h"

#include "support/target.h"

#include <optional>

#include <cctype>
#include <map>
#include <set>

namespace kiln::tir {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_reduction(const ComputeDef& st) {
  return st.combiner != Combiner::kNone || !st.reduce_axes.empty();
}

Primitive prim(std::string kind, const std::string& stage, std::vector<std::string> axes = {},
               int64_t factor = 0) {
  Primitive p;
  p.kind = std::move(kind);
  p.stage = stage;
  p.axes = std::move(axes);
  p.factor = factor;
  return p;
}

// For each load in `e`: the variables of its last index and of all its indices.
struct LoadVars {
  std::string name;
  std::set<std::string> last, all;
  std::vector<std::set<std::string>> index;  // per index
};

std::vector<LoadVars> collect_loads(const Expr& e) {
  std::vector<LoadVars> out;
  if (!e.defined()) return out;
  rewrite(e, [&](const Expr& n) -> Expr {
    if (n.kind() != ExprKind::kLoad || n->args.empty()) return Expr();
    LoadVars lv;
    lv.name = n->name;
    for (const std::string& v : free_vars(n->args.back())) lv.last.insert(v);
    for (const Expr& a : n->args) {
      lv.index.emplace_back();
      for (const std::string& v : free_vars(a)) {
        lv.all.insert(v);
        lv.index.back().insert(v);
      }
    }
    out.push_back(std::move(lv));
    return Expr();
  });
  return out;
}

// True when `index` steps by exactly one element when variable v does (v + c
// for c independent of v): a vector along v reads contiguous elements.
bool unit_stride(const Expr& index, const std::string& v) {
  bool uses = false;
  for (const std::string& f : free_vars(index)) uses = uses || f == v;
  if (!uses) return false;
  Expr next = substitute(index, {{v, var(v) + 1}});
  return prove_equal(next - index, Expr(1));
}


// Elements of the buffer `name` (a param or a stage of k); nullopt when symbolic.
std::optional<int64_t> buffer_elements(const KernelDef& k, const std::string& name) {
  const std::vector<Expr>* shape = nullptr;
  for (const Buffer& b : k.params)
    if (b.name == name) shape = &b.shape;
  for (const ComputeDef& c : k.stages)
    if (c.name == name) shape = &c.shape;
  if (shape == nullptr) return std::nullopt;
  int64_t n = 1;
  for (const Expr& d : *shape) {
    auto c = d.as_const();
    if (!c || *c < 0 || __builtin_mul_overflow(n, *c, &n)) return std::nullopt;  // symbolic, or past int64
  }
  return n;
}

// The outer loop to run in parallel: among those with more than one
// iteration, the one whose axis indexes the most input data, so that each
// thread streams its share of the largest operand instead of all of it (the
// rows of a 1x1 convolution's 1.6 MB input rather than its two 8-channel
// tiles of 2 KB of weights, which made each of two threads read the whole
// input and ran slower than one thread). axis_of[i] is the stage axis that
// loop i walks. Falls back to choose_parallel where a size is symbolic.
int choose_parallel_by_footprint(const KernelDef& k, const std::vector<LoadVars>& loads,
                                 const std::vector<std::string>& axis_of,
                                 const std::vector<std::optional<int64_t>>& counts) {
  int best = -1;
  int64_t best_size = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (!counts[i]) return choose_parallel(counts);
    if (*counts[i] <= 1) continue;
    std::set<std::string> seen;
    int64_t size = 0;
    for (const LoadVars& l : loads) {
      if (!l.all.count(axis_of[i]) || !seen.insert(l.name).second) continue;
      auto e = buffer_elements(k, l.name);
      if (!e || __builtin_add_overflow(size, *e, &size)) return choose_parallel(counts);
    }
    if (size > best_size) {
      best = static_cast<int>(i);
      best_size = size;
    }
  }
  return best;
}

// Register tiling of a reduction stage along a vector axis v that indexes the
// last (contiguous) dim of some load:
//   split v by the vector width V and a "row" axis r by R, move both tile
//   loops innermost, accumulate the R x V tile in a local buffer (cache_write
//   at the last outer loop, which moves the reduce loops outside the tile
//   loops), unroll the rows and vectorize v. The row axis is the innermost
//   other spatial axis that some load depending on v does not use (output
//   channels of a conv, rows of a matmul), so that each loaded vector is
//   reused R times from registers; without one, rows of the next outer axis
//   give independent accumulators. Tiles that do not divide an extent overlap
//   the previous tile (split_overlap) instead of being guarded.
// v is the innermost axis when some load reads it with unit stride and it is
// at least V/2 long (or symbolic). Otherwise, when another axis of at least V is
// read with unit stride (the output channels of a convolution whose weights
// are packed [I, KH, KW, O], on a narrow plane or with a strided input), that
// axis is v, the row axis is the output height (see below) split into tiles
// that divide it, and the output is stored with a stride, once per element.
// Otherwise v is the innermost axis if some load's last index uses it at all.
// A stage of one axis (a bias gradient: [tokens, C] summed over the tokens)
// is tiled along it with no row axis: each tile's vector of sums accumulates
// over the reduce loops, reading rows of the input contiguously, instead of
// one output at a time down a column.
// Returns false (and adds nothing) where the pattern does not apply.
bool tile_reduction(const KernelDef& k, const ComputeDef& st, Schedule& s) {
  size_t n = st.axes.size();
  if (n < 1) return false;
  int64_t elem = static_cast<int64_t>(dtype_size(st.dtype));
  if (elem <= 0 || elem > 8) return false;
  // One vector register of the target (support/target.h) per row of the tile.
  const int64_t vec = Target::host().vector_bytes / elem;
  std::vector<LoadVars> loads = collect_loads(st.body);
  std::vector<Expr> last_index;
  rewrite(st.body, [&](const Expr& e) -> Expr {
    if (e.kind() == ExprKind::kLoad && !e->args.empty()) last_index.push_back(e->args.back());
    return Expr();
  });
  auto read_unit = [&](size_t i) {
    for (const Expr& e : last_index)
      if (unit_stride(e, st.axes[i])) return true;
    return false;
  };
  size_t vi = n - 1;
  auto inner_c = st.shape[n - 1].as_const();
  if (!(read_unit(n - 1) && (!inner_c || *inner_c >= vec / 2))) {
    for (size_t i = n - 1; i-- > 0;) {
      auto c = st.shape[i].as_const();
      if (c && *c >= vec && read_unit(i)) {
        vi = i;
        break;
      }
    }
  }
  const std::string& v = st.axes[vi];
  if (vi == n - 1) {
    bool contiguous = false;
    for (const LoadVars& l : loads) contiguous = contiguous || l.last.count(v);
    if (!contiguous) return false;
  }
  auto vext = st.shape[vi].as_const();
  if (vext && *vext < vec / 2) return false;

  auto extent_ok = [&](size_t i) {
    auto c = st.shape[i].as_const();
    return !c || *c > 1;
  };
  auto reuses = [&](size_t i) {
    for (const LoadVars& l : loads)
      if (l.all.count(v) && !l.all.count(st.axes[i])) return true;
    return false;
  };
  // Rows whose broadcast operands lie next to each other in memory (the
  // output width of a convolution read along the input's last dim) tempt
  // LLVM's SLP vectorizer to pack those operands across rows and split the
  // accumulator tile; with v not innermost, rows of an axis that no load
  // reads along its last dim (the output height) are preferred.
  auto in_last_dim = [&](size_t i) {
    for (const LoadVars& l : loads)
      if (l.last.count(st.axes[i])) return true;
    return false;
  };
  int r = -1;
  bool reuse = false;
  if (vi != n - 1) {
    for (size_t i = n; i-- > 0 && r < 0;) {
      if (i != vi && extent_ok(i) && reuses(i) && !in_last_dim(i)) r = static_cast<int>(i);
    }
  }
  for (size_t i = n; i-- > 0 && r < 0;) {
    if (i != vi && extent_ok(i) && reuses(i)) r = static_cast<int>(i);
  }
  if (r >= 0) {
    reuse = true;
  } else if (vi == n - 1 && n >= 2 && extent_ok(n - 2)) {
    r = static_cast<int>(n - 2);
  }

  // Splits one axis into (outer, tile) names; an extent that fits in one tile is not split.
  auto tile = [&](size_t i, int64_t factor, std::string& outer, std::string& inner) {
    const std::string& a = st.axes[i];
    auto c = st.shape[i].as_const();
    if (c && *c <= factor) {
      inner = a;
      return;
    }
    if (c) {
      s.prims.push_back(prim("split_overlap", st.name, {a}, factor));
    } else {
      s.prims.push_back(prim("split", st.name, {a}, factor));
    }
    outer = a + ".o";
    inner = a + ".i";
  };
  int64_t vfactor = vext && *vext < vec ? vec / 2 : vec;
  int64_t rfactor = reuse ? 8 : 4;
  if (vi != n - 1 && r >= 0) {
    // Row tiles that divide the extent (7 of 14 or 28 output rows): LLVM
    // leaves an unrolled row tile whose start is a min() in scalar code.
    auto c = st.shape[static_cast<size_t>(r)].as_const();
    if (c) {
      for (int64_t f = 8; f >= 4; --f) {
        if (*c % f == 0) {
          rfactor = f;
          break;
        }
      }
    }
  }
  std::vector<std::string> outer_of(n), inner_of(n);
  std::string v_outer, v_inner, r_outer, r_inner;
  tile(vi, vfactor, v_outer, v_inner);
  if (r >= 0) tile(static_cast<size_t>(r), rfactor, r_outer, r_inner);

  std::vector<std::string> order;
  for (size_t i = 0; i < n; ++i) {
    if (i == vi) {
      if (!v_outer.empty()) order.push_back(v_outer);
    } else if (static_cast<int>(i) == r) {
      if (!r_outer.empty()) order.push_back(r_outer);
    } else {
      order.push_back(st.axes[i]);
    }
  }
  if (order.empty()) return false;
  // Matmul-like ([..., rows, cols] with the row axis next to the vector axis
  // and an operand the row tile reuses): walk column panels outermost, so one
  // panel of the right operand (K x 16) stays in cache while every row tile
  // uses it. Without such an operand (pooling: every load moves with the
  // rows) the tiles stay row-major, so the input streams through once row by
  // row instead of once per column strip (measured faster on the max pools
  // of inception_v3 and resnet50).
  if (reuse && vi == n - 1 && r == static_cast<int>(n) - 2 && !r_outer.empty() && !v_outer.empty() &&
      order.size() >= 2)
    std::swap(order[order.size() - 2], order[order.size() - 1]);
  std::vector<std::string> full = order;
  if (r >= 0) full.push_back(r_inner);
  full.push_back(v_inner);
  s.prims.push_back(prim("reorder", st.name, full));
  s.prims.push_back(prim("cache_write", st.name, {order.back()}));
  if (r >= 0) s.prims.push_back(prim("unroll", st.name, {r_inner}));
  s.prims.push_back(prim("vectorize", st.name, {v_inner}));
  // Iteration counts of the outer loops (split outer loops: tiles of a known extent).
  std::vector<std::optional<int64_t>> counts;
  for (const std::string& loop : order) {
    std::optional<int64_t> count;
    for (size_t a = 0; a < n; ++a) {
      auto c = st.shape[a].as_const();
      if (st.axes[a] == loop) count = c;
      if (c && a == vi && loop == v_outer) count = (*c + vfactor - 1) / vfactor;
      if (c && static_cast<int>(a) == r && loop == r_outer) count = (*c + rfactor - 1) / rfactor;
    }
    counts.push_back(count);
  }
  std::vector<std::string> axis_of;
  for (const std::string& loop : order) {
    std::string a = loop;
    if (loop == v_outer) a = v;
    if (r >= 0 && loop == r_outer) a = st.axes[static_cast<size_t>(r)];
    axis_of.push_back(a);
  }
  int par = choose_parallel_by_footprint(k, loads, axis_of, counts);
  if (par >= 0) s.prims.push_back(prim("parallel", st.name, {order[static_cast<size_t>(par)]}));
  return true;
}

// True when a reduction stage after `s` reads stage s through a sliding
// window (an index combining a spatial and a reduce axis, as in a padded
// convolution input): each element is read many times, so it is worth
// materializing instead of inlining (which would recompute it, with its
// bound checks, in the reduction's innermost loop).
bool read_by_window(const KernelDef& k, size_t s) {
  for (size_t c = s + 1; c < k.stages.size(); ++c) {
    const ComputeDef& st = k.stages[c];
    if (!is_reduction(st)) continue;
    std::set<std::string> spatial(st.axes.begin(), st.axes.end());
    std::set<std::string> reduce(st.reduce_axes.begin(), st.reduce_axes.end());
    for (const LoadVars& l : collect_loads(st.body)) {
      if (l.name != k.stages[s].name) continue;
      for (const auto& idx : l.index) {
        bool has_s = false, has_r = false;
        for (const std::string& v : idx) {
          has_s = has_s || spatial.count(v);
          has_r = has_r || reduce.count(v);
        }
        if (has_s && has_r) return true;
      }
    }
  }
  return false;
}

// A reduction along a contiguous dim (softmax's row max and sum, layer
// norm's mean, a ReduceSum over the last axis): some load reads the innermost
// reduce axis with unit stride in its last index and the innermost spatial
// axis (extent > 1) in another index, so vectorizing the spatial axis would
// gather one element per row. Instead the reduce axis is split into vector
// lanes (rfactor): contiguous loads, one combine of the lanes per output.
// Returns false (and adds nothing) where the pattern does not apply or the
// reduce axis is shorter than half a vector.
bool rfactor_reduction(const ComputeDef& st, Schedule& s) {
  size_t n = st.axes.size();
  if (n == 0 || st.reduce_axes.empty()) return false;
  int64_t elem = static_cast<int64_t>(dtype_size(st.dtype));
  if (elem <= 0 || elem > 8) return false;
  const int64_t vec = 64 / elem;
  const std::string& r = st.reduce_axes.back();
  auto rext = st.reduce_extents.back().as_const();
  if (rext && *rext < vec / 2) return false;
  int vi = -1;
  for (size_t i = n; i-- > 0 && vi < 0;) {
    auto c = st.shape[i].as_const();
    if (!c || *c > 1) vi = static_cast<int>(i);
  }
  if (vi < 0) return false;
  const std::string& v = st.axes[static_cast<size_t>(vi)];
  bool gathers = false;
  rewrite(st.body, [&](const Expr& e) -> Expr {
    if (e.kind() != ExprKind::kLoad || e->args.empty() || !unit_stride(e->args.back(), r)) return Expr();
    for (size_t a = 0; a + 1 < e->args.size(); ++a)
      for (const std::string& f : free_vars(e->args[a])) gathers = gathers || f == v;
    return Expr();
  });
  if (!gathers) return false;
  std::string lanes = r;
  if (!rext || *rext > vec) {
    s.prims.push_back(prim("split", st.name, {r}, vec));
    lanes = r + ".i";
  }
  s.prims.push_back(prim("rfactor", st.name, {lanes}));
  std::vector<std::optional<int64_t>> counts;
  for (size_t a = 0; a < n; ++a) counts.push_back(st.shape[a].as_const());
  int par = choose_parallel(counts);
  if (par >= 0) s.prims.push_back(prim("parallel", st.name, {st.axes[static_cast<size_t>(par)]}));
  return true;
}

}  // namespace

int choose_parallel(const std::vector<std::optional<int64_t>>& loops) {
  for (size_t i = 0; i < loops.size(); ++i)
    if (loops[i] && *loops[i] > 1) return static_cast<int>(i);
  for (size_t i = 0; i < loops.size(); ++i)
    if (!loops[i]) return static_cast<int>(i);
  return -1;
}

std::string Schedule::to_string() const {
  std::string out;
  for (const Primitive& p : prims) {
    out += p.kind + "(" + p.stage;
    for (const auto& a : p.axes) out += ", " + a;
    if (p.kind == "split" || p.kind == "split_overlap" || p.kind == "split_padded") out += ", " + std::to_string(p.factor);
    if ((p.kind == "prefetch" && p.factor > 1) || (p.kind == "pack" && p.factor > 0)) out += ", " + std::to_string(p.factor);
    out += ")\n";
  }
  return out;
}

Result<Schedule> parse_schedule(std::string_view text) {
  Schedule s;
  int line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    size_t open = line.find('(');
    if (open == std::string_view::npos || line.back() != ')') {
      return invalid_argument() << "schedule line " << line_no << ": expected kind(args): " << line;
    }
    Primitive p;
    p.kind = std::string(trim(line.substr(0, open)));
    std::vector<std::string> args;
    std::string_view rest = line.substr(open + 1, line.size() - open - 2);
    while (true) {
      size_t comma = rest.find(',');
      std::string_view arg = trim(rest.substr(0, comma));
      if (arg.empty() || arg.find_first_of("() \t") != std::string_view::npos) {
        return invalid_argument() << "schedule line " << line_no << ": bad argument in: " << line;
      }
      args.emplace_back(arg);
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    static const std::map<std::string, std::pair<size_t, size_t>, std::less<>> kArity = {
        {"inline", {1, 1}},   {"split", {3, 3}}, {"split_overlap", {3, 3}}, {"split_padded", {3, 3}},     {"reorder", {2, 1000}}, {"parallel", {2, 2}},
        {"vectorize", {2, 2}}, {"unroll", {2, 2}}, {"cache_write", {2, 2}}, {"fuse_epilogue", {1, 2}}, {"rfactor", {2, 2}}, {"hoist_reduce", {2, 3}}, {"prefetch", {2, 3}}, {"fuse", {3, 3}}, {"compute_at", {3, 3}}, {"pack", {3, 4}}};
    auto ar = kArity.find(p.kind);
    if (ar == kArity.end()) {
      return invalid_argument() << "schedule line " << line_no << ": unknown primitive '" << p.kind
                                << "'";
    }
    if (args.size() < ar->second.first || args.size() > ar->second.second) {
      return invalid_argument() << "schedule line " << line_no << ": wrong number of arguments: "
                                << line;
    }
    p.stage = args[0];
    // A count argument: digits only (at most 18), at least `least`.
    auto count = [](const std::string& f, int64_t least) -> std::optional<int64_t> {
      if (f.empty() || f.size() > 18 || f.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
      int64_t v = std::stoll(f);
      return v < least ? std::nullopt : std::optional<int64_t>(v);
    };
    if (p.kind == "split" || p.kind == "split_overlap" || p.kind == "split_padded") {
      auto f = count(args[2], 0);
      if (!f) return invalid_argument() << "schedule line " << line_no << ": bad split factor '" << args[2] << "'";
      p.factor = *f;
      p.axes = {args[1]};
    } else if ((p.kind == "prefetch" && args.size() == 3) || (p.kind == "pack" && args.size() == 4)) {
      // The optional last argument: prefetch's distance, pack's copy vector width.
      auto f = count(args.back(), 1);
      if (!f) return invalid_argument() << "schedule line " << line_no << ": bad " << p.kind << " count '" << args.back() << "'";
      p.factor = *f;
      p.axes.assign(args.begin() + 1, args.end() - 1);
    } else {
      p.axes.assign(args.begin() + 1, args.end());
    }
    s.prims.push_back(std::move(p));
  }
  return s;
}

Schedule naive_schedule(const KernelDef&) { return Schedule(); }

void plain_reduction_schedule(const ComputeDef& st, Schedule& s) {
  const size_t n = st.axes.size();
  if (n == 0) return;
  const auto inner_extent = st.shape[n - 1].as_const();
  size_t limit = n;
  if (n >= 2 && (!inner_extent || *inner_extent >= 8)) {
    s.prims.push_back(prim("cache_write", st.name, {st.axes[n - 2]}));
    s.prims.push_back(prim("vectorize", st.name, {st.axes[n - 1]}));
    limit = n - 1;
  }
  // Parallel over an axis with more than one iteration (a batch of 1 is not).
  std::vector<std::optional<int64_t>> counts;
  for (size_t a = 0; a < limit; ++a) counts.push_back(st.shape[a].as_const());
  int par = choose_parallel(counts);
  s.prims.push_back(prim("parallel", st.name, {st.axes[par < 0 ? 0 : static_cast<size_t>(par)]}));
}

namespace {
// A stage that transposes: some load steps by one element along an outer
// axis `a` (its last index) and reads the innermost axis `v` in another
// index, so a vector along v gathers one element from each of its lines.
// Where one sweep of v touches more lines than half a 32 KB L1 holds (over
// 256 elements of v, a line each), they are gone before the next step of a
// reads the next element of each: tiled in blocks of 16 x 16 (a.o, v.o
// outside a.i, v.i), the 16 lines a block's gathers touch stay in L1 while
// the 16 steps of a.i use them. Returns false (nothing added) when no load
// transposes, v is shorter or symbolic, or a's extent is under 32.
bool tile_transpose(const ComputeDef& st, Schedule& s) {
  constexpr int64_t kTile = 16, kLines = 256;
  const size_t n = st.axes.size();
  if (n < 2) return false;
  const std::string& v = st.axes[n - 1];
  auto v_ext = st.shape[n - 1].as_const();
  if (!v_ext || *v_ext <= kLines) return false;
  int outer = -1;
  rewrite(st.body, [&](const Expr& e) -> Expr {
    if (outer >= 0 || e.kind() != ExprKind::kLoad || e->args.size() < 2) return Expr();
    bool reads_v = false;
    for (size_t i = 0; i + 1 < e->args.size(); ++i)
      for (const std::string& f : free_vars(e->args[i])) reads_v = reads_v || f == v;
    if (!reads_v) return Expr();
    for (size_t a = 0; a + 1 < n; ++a) {
      auto ext = st.shape[a].as_const();
      if (ext && *ext >= 2 * kTile && unit_stride(e->args.back(), st.axes[a])) outer = static_cast<int>(a);
    }
    return Expr();
  });
  if (outer < 0) return false;
  const std::string& a = st.axes[static_cast<size_t>(outer)];
  const int64_t a_ext = *st.shape[static_cast<size_t>(outer)].as_const();
  s.prims.push_back(prim(a_ext % kTile == 0 ? "split" : "split_overlap", st.name, {a}, kTile));
  s.prims.push_back(prim(*v_ext % kTile == 0 ? "split" : "split_overlap", st.name, {v}, kTile));
  std::vector<std::string> order;
  std::vector<std::optional<int64_t>> counts;
  for (size_t i = 0; i + 1 < n; ++i) {
    if (static_cast<int>(i) == outer) continue;
    order.push_back(st.axes[i]);
    counts.push_back(st.shape[i].as_const());
  }
  order.push_back(a + ".o");
  counts.push_back((a_ext + kTile - 1) / kTile);
  order.push_back(v + ".o");
  counts.push_back((*v_ext + kTile - 1) / kTile);
  const size_t tiled = order.size();
  order.push_back(a + ".i");
  order.push_back(v + ".i");
  s.prims.push_back(prim("reorder", st.name, order));
  s.prims.push_back(prim("vectorize", st.name, {v + ".i"}));
  int par = choose_parallel(counts);
  if (par >= 0 && static_cast<size_t>(par) < tiled) s.prims.push_back(prim("parallel", st.name, {order[static_cast<size_t>(par)]}));
  return true;
}
}  // namespace

Schedule default_schedule(const KernelDef& k) {
  Schedule s;
  std::set<std::string> params;
  for (const auto& b : k.params) params.insert(b.name);
  for (size_t si = 0; si < k.stages.size(); ++si) {
    const ComputeDef& st = k.stages[si];
    if (!params.count(st.name) && !is_reduction(st) && !read_by_window(k, si)) {
      s.prims.push_back(prim("inline", st.name));
      continue;
    }
    size_t n = st.axes.size();
    if (n == 0) continue;
    const std::string& innermost = st.axes[n - 1];
    auto inner_extent = st.shape[n - 1].as_const();
    if (is_reduction(st)) {
      if (rfactor_reduction(st, s) || tile_reduction(k, st, s)) continue;
      plain_reduction_schedule(st, s);
    } else {
      // A padded copy read by a window (kept, not inlined) whose rows are not
      // a power of two wide: vectors of 16 lanes, the last overlapping the one
      // before (recomputing a copy is harmless). One vector of the whole row
      // (58 lanes for a 56-wide plane padded by one) cannot mask its padding
      // select's loads, so that row fell back to a scalar loop with a branch
      // per element, which took most of a depthwise 3x3 kernel's time.
      bool odd_copy = !params.count(st.name) && inner_extent && *inner_extent > 16 &&
                      (*inner_extent & (*inner_extent - 1)) != 0;
      if (params.count(st.name) && tile_transpose(st, s)) continue;
      if (odd_copy) {
        s.prims.push_back(prim("split_overlap", st.name, {innermost}, 16));
        s.prims.push_back(prim("vectorize", st.name, {innermost + ".i"}));
      } else if (!inner_extent || *inner_extent > 1) {
        s.prims.push_back(prim("vectorize", st.name, {innermost}));
      }
      std::vector<std::optional<int64_t>> counts;
      for (size_t a = 0; a + 1 < n; ++a) counts.push_back(st.shape[a].as_const());
      int par = choose_parallel(counts);
      if (par >= 0) s.prims.push_back(prim("parallel", st.name, {st.axes[static_cast<size_t>(par)]}));
    }
  }
  return s;
}

}  // namespace kiln::tir
