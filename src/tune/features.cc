#include "tune/features.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "support/sha256.h"
#include "tir/knobs.h"

namespace kiln::tune {

namespace {

struct Loop {
  std::string var;
  double extent = 1;
  tir::ForKind kind = tir::ForKind::kSerial;
};

struct Access {
  std::string buffer;
  int elem_bytes = 4;
  std::set<std::string> vars;       // loop variables its indices use
  std::set<std::string> last_vars;  // those of its last (contiguous) index
  std::vector<Loop> loops;          // enclosing loops, outermost first
  bool store = false;
  double n = 0;                     // iterations that make it
  // Elements between consecutive iterations of the innermost vectorized loop
  // and of the innermost loop: 0 (the same element), 1 (contiguous), another
  // stride, or unknown (nullopt: a shape or an index not known here).
  std::optional<int64_t> vector_stride, inner_stride;
  bool in_vector = false;
};

void collect_vars(const Expr& e, std::set<std::string>& out) {
  if (!e.defined()) return;
  if (e.kind() == ExprKind::kVar) out.insert(e->name);
  for (const Expr& a : e->args) collect_vars(a, out);
}

// Bytes of cache lines one access touches in one execution of loops[from..]:
// the loops its last index uses run along a line, the others' each start new
// lines; the loops it does not use reuse what it touched.
double access_bytes(const Access& a, const std::vector<Loop>& loops, size_t from) {
  double along = 1, across = 1;
  for (size_t i = from; i < loops.size(); ++i) {
    if (a.last_vars.count(loops[i].var)) along *= loops[i].extent;
    else if (a.vars.count(loops[i].var)) across *= loops[i].extent;
  }
  return std::ceil(along * a.elem_bytes / 64.0) * 64.0 * across;
}

// A statement's bytes brought from beyond a cache of `capacity` bytes: the
// outermost loop whose body's lines (per buffer, its widest access) fit in
// the cache keeps them there, and every iteration of the loops around it
// brings them again.
double cache_traffic(const std::vector<const Access*>& accesses, const std::vector<Loop>& loops, double capacity) {
  for (size_t k = 0; k <= loops.size(); ++k) {
    std::map<std::string, double> per_buffer;
    for (const Access* a : accesses) {
      double& b = per_buffer[a->buffer];
      b = std::max(b, access_bytes(*a, loops, k));
    }
    double footprint = 0;
    for (const auto& [name, b] : per_buffer) footprint += b;
    if (footprint <= capacity || k == loops.size()) {
      double outer = 1;
      for (size_t i = 0; i < k; ++i) outer *= loops[i].extent;
      return footprint * outer;
    }
  }
  return 0;
}

// Its buffer's flat offset at `env` (row-major over `shape`); nullopt when
// an index or a dim is not known.
std::optional<int64_t> flat_offset(const std::vector<Expr>& indices, const std::vector<Expr>* shape,
                                   const std::map<std::string, int64_t, std::less<>>& env) {
  int64_t off = 0;
  for (size_t d = 0; d < indices.size(); ++d) {
    auto v = evaluate(indices[d], env);
    if (!v.is_ok()) return std::nullopt;
    int64_t dim = 1;
    if (shape != nullptr && shape->size() == indices.size() && d > 0) {
      auto c = (*shape)[d].as_const();
      if (!c) return std::nullopt;
      dim = *c;
    } else if (d > 0) {
      return std::nullopt;
    }
    off = off * dim + *v;
  }
  return off;
}

struct Walker {
  std::vector<Loop> loops;
  std::map<std::string, std::vector<Expr>> shapes;  // params' and scratch buffers'
  double traffic[3] = {0, 0, 0};                    // estimated bytes from the next level, per cache level
  double caches[3] = {48 << 10, 1 << 20, 32 << 20};
  double acc_regs_max = 0, acc_regs_sum = 0, acc_iters = 0;
  int vector_registers = 32;
  std::vector<Access> accesses;
  double store_iters = 0, load_iters = 0, arith = 0, transcendental = 0;
  double vector_iters = 0, vector_lanes = 0, lane_util = 0, unrolled = 0, innermost = 0, accumulate = 0;
  double guards = 0, scratch_bytes = 0;
  int allocs = 0, prefetches = 0, num_loops = 0, max_depth = 0, stores = 0;
  double parallel_extent = 0;
  int target_lanes = 16;

  double iters() const {
    double n = 1;
    for (const Loop& l : loops) n *= l.extent;
    return n;
  }

  // Fills an access's strides along the innermost vectorized loop and the innermost loop.
  void strides(Access& a, const std::vector<Expr>& indices) const {
    std::map<std::string, int64_t, std::less<>> env;
    for (const Loop& l : loops) env[l.var] = 0;
    auto it = shapes.find(a.buffer);
    const std::vector<Expr>* shape = it == shapes.end() ? nullptr : &it->second;
    auto base = flat_offset(indices, shape, env);
    auto along = [&](const std::string& var) -> std::optional<int64_t> {
      if (!base) return std::nullopt;
      env[var] = 1;
      auto o = flat_offset(indices, shape, env);
      env[var] = 0;
      if (!o) return std::nullopt;
      return *o - *base;
    };
    for (size_t i = loops.size(); i-- > 0;)
      if (loops[i].kind == tir::ForKind::kVectorized) {
        a.in_vector = true;
        a.vector_stride = along(loops[i].var);
        break;
      }
    if (!loops.empty()) a.inner_stride = along(loops.back().var);
  }

  void expr(const Expr& e, double n, std::vector<Access>* loads, const std::string& stored) {
    if (!e.defined()) return;
    switch (e.kind()) {
      case ExprKind::kLoad: {
        load_iters += n;
        Access a;
        a.buffer = e->name;
        a.elem_bytes = static_cast<int>(std::max<int64_t>(1, dtype_size(e.dtype())));
        for (const Expr& i : e->args) collect_vars(i, a.vars);
        if (!e->args.empty()) collect_vars(e->args.back(), a.last_vars);
        a.loops = loops;
        a.n = n;
        if (n > 0) strides(a, e->args);
        if (e->name == stored) accumulate += n;
        loads->push_back(std::move(a));
        break;
      }
      case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kDiv:
      case ExprKind::kMin: case ExprKind::kMax:
        if (e.dtype() == DType::kFloat32 || e.dtype() == DType::kFloat64 || e.dtype() == DType::kFloat16)
          arith += n * static_cast<double>(std::max<size_t>(1, e->args.size() - 1));
        break;
      case ExprKind::kCall:
        if (e->name == "exp" || e->name == "log" || e->name == "tanh" || e->name == "erf" || e->name == "sigmoid" ||
            e->name == "pow" || e->name == "sin" || e->name == "cos")
          transcendental += n;
        break;
      default:
        break;
    }
    for (const Expr& a : e->args) expr(a, n, loads, stored);
  }

  void stmt(const tir::Stmt& s) {
    if (!s) return;
    switch (s->kind) {
      case tir::StmtKind::kFor: {
        auto c = s->extent.as_const();
        Loop l{s->var, c ? static_cast<double>(std::max<int64_t>(*c, 0)) : 1.0, s->for_kind};
        if (l.kind == tir::ForKind::kParallel && parallel_extent == 0) parallel_extent = l.extent;
        ++num_loops;
        loops.push_back(l);
        max_depth = std::max(max_depth, static_cast<int>(loops.size()));
        stmt(s->body);
        loops.pop_back();
        break;
      }
      case tir::StmtKind::kStore: {
        ++stores;
        double n = iters();
        store_iters += n;
        double lanes = 1, unroll = 1;
        bool vec = false;
        for (const Loop& l : loops) {
          if (l.kind == tir::ForKind::kVectorized) {
            vec = true;
            lanes *= l.extent;
          }
          if (l.kind == tir::ForKind::kUnrolled) unroll *= l.extent;
        }
        if (vec) {
          vector_iters += n;
          vector_lanes += n * lanes;
          lane_util += n * std::min(1.0, lanes / target_lanes);
        }
        unrolled += n * unroll;
        innermost += n * (loops.empty() ? 1 : loops.back().extent);
        std::vector<Access> loads;
        expr(s->value, n, &loads, s->buffer.name);
        for (const Expr& i : s->indices) expr(i, 0, &loads, "");
        Access st;
        st.buffer = s->buffer.name;
        st.elem_bytes = static_cast<int>(std::max<int64_t>(1, dtype_size(s->buffer.dtype)));
        for (const Expr& i : s->indices) collect_vars(i, st.vars);
        if (!s->indices.empty()) collect_vars(s->indices.back(), st.last_vars);
        st.loops = loops;
        st.store = true;
        st.n = n;
        strides(st, s->indices);
        // An accumulating store (it reads what it writes) holds its unrolled
        // copies, each of its vector's registers, live across the loop above.
        bool accumulates = false;
        for (const Access& a : loads) accumulates = accumulates || a.buffer == st.buffer;
        if (accumulates) {
          double regs = unroll * std::max(1.0, std::ceil(lanes / target_lanes));
          acc_regs_max = std::max(acc_regs_max, regs / vector_registers);
          acc_regs_sum += n * regs / vector_registers;
          acc_iters += n;
        }
        std::vector<const Access*> stmt_accesses = {&st};
        for (const Access& a : loads) stmt_accesses.push_back(&a);
        for (int c = 0; c < 3; ++c) traffic[c] += cache_traffic(stmt_accesses, loops, caches[c]);
        accesses.push_back(std::move(st));
        for (Access& a : loads) accesses.push_back(std::move(a));
        break;
      }
      case tir::StmtKind::kAllocate: {
        shapes[s->buffer.name] = s->buffer.shape;
        double elems = 1;
        for (const Expr& d : s->buffer.shape) elems *= static_cast<double>(d.as_const().value_or(1));
        scratch_bytes += elems * static_cast<double>(dtype_size(s->buffer.dtype));
        ++allocs;
        stmt(s->body);
        break;
      }
      case tir::StmtKind::kIfThenElse:
        guards += iters();
        stmt(s->then_case);
        stmt(s->else_case);
        break;
      case tir::StmtKind::kSeq:
        for (const tir::Stmt& c : s->seq) stmt(c);
        break;
      case tir::StmtKind::kPrefetch:
        ++prefetches;
        break;
    }
  }
};

// Bytes the accesses under the loop at depth `depth` (from the innermost
// loop of each access) touch in one execution of that loop: per buffer, the
// most elements any access of it reaches through the loops it depends on.
double footprint(const std::vector<Access>& accesses, size_t levels) {
  std::map<std::string, double> per_buffer;
  for (const Access& a : accesses) {
    size_t first = a.loops.size() > levels ? a.loops.size() - levels : 0;
    double elems = 1;
    for (size_t i = first; i < a.loops.size(); ++i)
      if (a.vars.count(a.loops[i].var)) elems *= a.loops[i].extent;
    double& b = per_buffer[a.buffer];
    b = std::max(b, elems * a.elem_bytes);
  }
  double total = 0;
  for (const auto& [name, b] : per_buffer) total += b;
  return total;
}

float lg(double x) { return static_cast<float>(std::log2(1.0 + std::max(0.0, x))); }

// A stable slot in [0, n) for a name.
size_t slot(const std::string& name, size_t n) {
  std::string h = sha256_hex(name);
  return std::stoul(h.substr(0, 8), nullptr, 16) % n;
}

}  // namespace

// The knob names of Kiln's templates (strategy/), one feature each; a knob
// not listed here adds its value to one of the overflow slots.
const char* const kKnobNames[] = {"mr", "nr", "kc", "mb", "order", "pack", "packb", "prefetch", "rows", "nb",
                                  "vw", "epi", "col", "ci", "cl", "inline_pad", "m", "vt", "flat", "rb",
                                  "ct", "blocked", "vec", "unroll", "par", "red"};
constexpr int kKnobSlots = static_cast<int>(sizeof(kKnobNames) / sizeof(kKnobNames[0]));
constexpr int kKnobOverflow = 4;
constexpr int kCandidateSlots = 16;

const std::vector<std::string>& feature_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"store_iters", "load_iters", "arith_ops", "transcendental", "vector_fraction",
                                  "vector_lanes", "lane_utilization", "unrolled", "parallel_extent",
                                  "parallel_balance", "work_per_task", "max_depth", "loops", "stores",
                                  "scratch_bytes", "allocations", "input_bytes", "output_bytes",
                                  "arithmetic_intensity", "innermost_extent", "accumulate_fraction", "prefetches",
                                  "guarded_iters", "footprint_inner2_l1", "footprint_inner4_l2",
                                  "footprint_inner6_l2", "vector_loads_contiguous", "vector_loads_broadcast",
                                  "vector_loads_strided", "vector_stores_strided", "inner_loads_strided",
                                  "accumulator_registers_max", "accumulator_registers_mean", "traffic_l1",
                                  "traffic_l2", "traffic_l3", "intensity_l1", "intensity_l2", "intensity_l3"};
    for (int i = 0; i < kCandidateSlots; ++i) v.push_back("candidate_" + std::to_string(i));
    for (const char* k : kKnobNames) v.push_back(std::string("knob_") + k);
    for (int i = 0; i < kKnobOverflow; ++i) v.push_back("knob_other_" + std::to_string(i));
    return v;
  }();
  return names;
}

std::vector<float> kernel_features(const tir::PrimFunc& f, const std::string& candidate, const std::string& knobs,
                                   int threads, const Target& target, const TargetKey* cache_key) {
  const TargetKey key = cache_key ? *cache_key : TargetKey::host(target);
  Walker w;
  w.target_lanes = std::max(1, target.lanes());
  w.vector_registers = std::max(1, target.vector_registers);
  if (key.l1d_bytes > 0) w.caches[0] = static_cast<double>(key.l1d_bytes);
  w.caches[1] = static_cast<double>(std::max<int64_t>(key.l2_bytes > 0 ? key.l2_bytes : target.l2_bytes, 1));
  if (key.l3_bytes > 0) w.caches[2] = static_cast<double>(key.l3_bytes);
  for (const tir::Buffer& b : f.params) w.shapes[b.name] = b.shape;
  w.stmt(f.body);
  double in_bytes = 0, out_bytes = 0;
  std::set<std::string> stored;
  for (const Access& a : w.accesses)
    if (a.store) stored.insert(a.buffer);
  for (const tir::Buffer& b : f.params) {
    double elems = 1;
    for (const Expr& d : b.shape) elems *= static_cast<double>(d.as_const().value_or(1));
    (stored.count(b.name) ? out_bytes : in_bytes) += elems * static_cast<double>(dtype_size(b.dtype));
  }
  // Loads and stores by their stride along the vector loop and the innermost loop, weighted by iterations.
  double vl = 0, vl_contig = 0, vl_bcast = 0, vl_strided = 0, vs = 0, vs_strided = 0, il = 0, il_strided = 0;
  for (const Access& a : w.accesses) {
    if (a.n <= 0) continue;
    if (a.in_vector) {
      const bool contig = a.vector_stride && *a.vector_stride == 1, bcast = a.vector_stride && *a.vector_stride == 0;
      if (a.store) {
        vs += a.n;
        if (!contig) vs_strided += a.n;
      } else {
        vl += a.n;
        (contig ? vl_contig : bcast ? vl_bcast : vl_strided) += a.n;
      }
    }
    if (!a.store) {
      il += a.n;
      if (!a.inner_stride || std::abs(*a.inner_stride) > 1) il_strided += a.n;
    }
  }
  auto share = [](double part, double whole) { return static_cast<float>(whole > 0 ? part / whole : 0); };
  const double n = std::max(1.0, w.store_iters);
  const double par = w.parallel_extent;
  const double tasks = par > 0 ? std::ceil(par / std::max(1, threads)) * std::max(1, threads) : 0;
  const double l1 = w.caches[0], l2 = w.caches[1];
  const double work = std::max(1.0, w.arith + w.transcendental);
  std::vector<float> v = {
      lg(w.store_iters), lg(w.load_iters), lg(w.arith), lg(w.transcendental),
      static_cast<float>(w.vector_iters / n), lg(w.vector_iters > 0 ? w.vector_lanes / w.vector_iters : 0),
      static_cast<float>(w.lane_util / n), lg(w.unrolled / n), lg(par),
      static_cast<float>(tasks > 0 ? par / tasks : 0), lg(par > 0 ? w.store_iters / par : w.store_iters),
      static_cast<float>(w.max_depth), static_cast<float>(w.num_loops), static_cast<float>(w.stores),
      lg(w.scratch_bytes), static_cast<float>(w.allocs), lg(in_bytes), lg(out_bytes),
      lg(w.arith / std::max(1.0, in_bytes + out_bytes)), lg(w.innermost / n), static_cast<float>(w.accumulate / n),
      static_cast<float>(w.prefetches), lg(w.guards),
      static_cast<float>(std::log2((footprint(w.accesses, 2) + 1) / l1)),
      static_cast<float>(std::log2((footprint(w.accesses, 4) + 1) / l2)),
      static_cast<float>(std::log2((footprint(w.accesses, 6) + 1) / l2)),
      share(vl_contig, vl), share(vl_bcast, vl), share(vl_strided, vl), share(vs_strided, vs), share(il_strided, il),
      static_cast<float>(w.acc_regs_max), static_cast<float>(w.acc_iters > 0 ? w.acc_regs_sum / w.acc_iters : 0),
      lg(w.traffic[0]), lg(w.traffic[1]), lg(w.traffic[2]),
      static_cast<float>(std::log2(work / std::max(1.0, w.traffic[0]))),
      static_cast<float>(std::log2(work / std::max(1.0, w.traffic[1]))),
      static_cast<float>(std::log2(work / std::max(1.0, w.traffic[2])))};
  std::vector<float> cand(kCandidateSlots, 0.f), kn(kKnobSlots + kKnobOverflow, 0.f);
  if (!candidate.empty()) cand[slot(candidate, kCandidateSlots)] = 1.f;
  if (auto k = tir::parse_knobs(knobs); k.is_ok())
    for (const auto& [name, value] : *k) {
      size_t i = 0;
      while (i < static_cast<size_t>(kKnobSlots) && name != kKnobNames[i]) ++i;
      if (i == static_cast<size_t>(kKnobSlots)) i += slot(name, kKnobOverflow);
      kn[i] += lg(static_cast<double>(value));
    }
  v.insert(v.end(), cand.begin(), cand.end());
  v.insert(v.end(), kn.begin(), kn.end());
  KILN_CHECK(v.size() == static_cast<size_t>(kNumFeatures)) << "features: " << v.size() << " of " << kNumFeatures;
  return v;
}

}  // namespace kiln::tune
