#include "tune/features.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
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
  std::set<std::string> vars;  // loop variables its indices use
  std::vector<Loop> loops;     // enclosing loops, outermost first
  bool store = false;
};

void collect_vars(const Expr& e, std::set<std::string>& out) {
  if (!e.defined()) return;
  if (e.kind() == ExprKind::kVar) out.insert(e->name);
  for (const Expr& a : e->args) collect_vars(a, out);
}

struct Walker {
  std::vector<Loop> loops;
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

  void expr(const Expr& e, double n, std::vector<Access>* loads, const std::string& stored) {
    if (!e.defined()) return;
    switch (e.kind()) {
      case ExprKind::kLoad: {
        load_iters += n;
        Access a;
        a.buffer = e->name;
        a.elem_bytes = static_cast<int>(std::max<int64_t>(1, dtype_size(e.dtype())));
        for (const Expr& i : e->args) collect_vars(i, a.vars);
        a.loops = loops;
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
        st.loops = loops;
        st.store = true;
        accesses.push_back(std::move(st));
        for (Access& a : loads) accesses.push_back(std::move(a));
        break;
      }
      case tir::StmtKind::kAllocate: {
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

const std::vector<std::string>& feature_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"store_iters", "load_iters", "arith_ops", "transcendental", "vector_fraction",
                                  "vector_lanes", "lane_utilization", "unrolled", "parallel_extent",
                                  "parallel_balance", "work_per_task", "max_depth", "loops", "stores",
                                  "scratch_bytes", "allocations", "input_bytes", "output_bytes",
                                  "arithmetic_intensity", "innermost_extent", "accumulate_fraction", "prefetches",
                                  "guarded_iters", "footprint_inner2_l1", "footprint_inner4_l2",
                                  "footprint_inner6_l2"};
    for (int i = 0; i < 8; ++i) v.push_back("candidate_" + std::to_string(i));
    for (int i = 0; i < 8; ++i) v.push_back("knob_" + std::to_string(i));
    return v;
  }();
  return names;
}

std::vector<float> kernel_features(const tir::PrimFunc& f, const std::string& candidate, const std::string& knobs,
                                   int threads, const Target& target) {
  Walker w;
  w.target_lanes = std::max(1, target.lanes());
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
  const double n = std::max(1.0, w.store_iters);
  const double par = w.parallel_extent;
  const double tasks = par > 0 ? std::ceil(par / std::max(1, threads)) * std::max(1, threads) : 0;
  const double l1 = 48 << 10, l2 = static_cast<double>(std::max<int64_t>(target.l2_bytes, 1));
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
      static_cast<float>(std::log2((footprint(w.accesses, 6) + 1) / l2))};
  std::vector<float> cand(8, 0.f), kn(8, 0.f);
  if (!candidate.empty()) cand[slot(candidate, 8)] = 1.f;
  if (auto k = tir::parse_knobs(knobs); k.is_ok())
    for (const auto& [name, value] : *k) kn[slot(name, 8)] += lg(static_cast<double>(value));
  v.insert(v.end(), cand.begin(), cand.end());
  v.insert(v.end(), kn.begin(), kn.end());
  v.resize(kNumFeatures, 0.f);
  return v;
}

}  // namespace kiln::tune
