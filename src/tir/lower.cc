// lower(): a KernelDef and a Schedule to a PrimFunc.
//
// The schedule is replayed onto a per-stage loop description (spatial loops,
// reduce loops, the value of every original axis as an expression of the loop
// variables, and the bounds guards that non-dividing splits need). Each stage
// that is not inlined then becomes one loop nest; intermediate stages get an
// Allocate around the rest of the kernel.
#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "tir/schedule.h"

namespace kiln::tir {
namespace {

using ExprMap = std::map<std::string, Expr, std::less<>>;

struct Loop {
  std::string var;
  Expr extent;
  ForKind kind = ForKind::kSerial;
};

struct StagePlan {
  bool inlined = false;
  bool touched = false;  // a loop primitive was applied
  std::vector<Loop> spatial;
  std::vector<Loop> reduce;
  ExprMap axis_value;  // original axis (spatial and reduce) -> expression of loop vars
  std::vector<Expr> guards;
  // Guards of split_padded: only the stores to the stage's buffer are guarded
  // (a reduction computes its padded tile in full and writes back the valid part).
  std::vector<Expr> store_guards;
  std::string cache_axis;  // empty: no cache_write
  std::string rfactor_axis;  // empty: no rfactor; else a reduce loop accumulated in vector lanes
  std::string prefetch_axis;  // empty: no prefetch; else the spatial loop whose next iteration's data is prefetched
  int64_t prefetch_distance = 1;  // ... that many iterations ahead
  // pack(stage, buffer, axis[, lanes]): param `pack_buffer` is copied, at the
  // start of each iteration of loop `pack_axis`, into a local buffer indexed by
  // the loops below that its index uses (in nest order), and read from there.
  std::string pack_buffer, pack_axis;
  int64_t pack_lanes = 0;
  bool overlapped = false;    // a spatial axis was split_overlap (tiles share points)
  std::string hoisted;        // hoist_reduce: a reduce loop run outside the tile (empty: none)
  std::string hoisted_at;     // ... just inside this spatial loop (empty: outermost)
  bool fuse_epilogue = false;  // fuse_epilogue asked for
  std::string epilogue_axis;   // fuse_epilogue(stage, axis): the epilogue runs after each iteration of this loop
  int epilogue = -1;           // the stage computed in this one's write-back
  int fused_into = -1;         // this stage is computed in that stage's write-back
  // compute_at(stage, consumer, axis): this stage is computed inside loop
  // `attach_axis` of stage `attach_to`, for the region one iteration reads,
  // into a local buffer of shape `local_shape` allocated there; dim d of the
  // stage's buffer is addressed relative to `local_base[d]` (an expression of
  // the shared loops; undefined: the whole dim, unshifted).
  int attach_to = -1;
  std::string attach_axis;
  std::set<std::string> shared;  // the loops shared with the consumer (outermost through attach_axis)
  std::vector<Expr> local_base, local_shape;
};

bool is_reduction(const ComputeDef& st) {
  return st.combiner != Combiner::kNone || !st.reduce_axes.empty();
}

Expr cast_to(DType t, Expr e) { return e.dtype() == t ? e : cast(t, std::move(e)); }

Expr typed_const(DType t, double v) {
  if (dtype_is_float(t)) return float_imm(v, t);
  if (t == DType::kBool) return bool_imm(v != 0);
  return int_imm(static_cast<int64_t>(v), t);
}

// The neutral element of a combiner for dtype t.
Expr default_init(Combiner c, DType t) {
  bool is_max = c == Combiner::kMax;
  switch (c) {
    case Combiner::kNone:
    case Combiner::kSum: return typed_const(t, 0);
    case Combiner::kProd: return typed_const(t, 1);
    case Combiner::kMax:
    case Combiner::kMin: break;
  }
  if (dtype_is_float(t)) {
    double inf = std::numeric_limits<double>::infinity();
    return float_imm(is_max ? -inf : inf, t);
  }
  if (t == DType::kBool) return bool_imm(!is_max);
  int bits = static_cast<int>(dtype_size(t)) * 8;
  if (dtype_is_signed(t)) {
    int64_t hi = bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (bits - 1)) - 1;
    return int_imm(is_max ? -hi - 1 : hi, t);
  }
  uint64_t hi = bits == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << bits) - 1;
  return int_imm(is_max ? 0 : static_cast<int64_t>(hi), t);
}

Expr combine(Combiner c, Expr acc, Expr v) {
  switch (c) {
    case Combiner::kSum: return add(std::move(acc), std::move(v));
    case Combiner::kProd: return mul(std::move(acc), std::move(v));
    case Combiner::kMax: return max(std::move(acc), std::move(v));
    case Combiner::kMin: return min(std::move(acc), std::move(v));
    case Combiner::kNone: break;
  }
  return v;
}

struct Lowerer {
  const KernelDef& k;
  std::map<std::string, int, std::less<>> param_index;
  std::set<std::string> folded_buffers;  // deferred epilogues' stage buffers allocated per iteration (fold_deferred_buffer)
  std::map<std::string, int, std::less<>> stage_index;
  std::vector<StagePlan> plans;
  std::vector<ComputeDef> stages;  // bodies with inlined producers substituted

  explicit Lowerer(const KernelDef& kd) : k(kd) {}

  Status init() {
    for (size_t i = 0; i < k.params.size(); ++i) {
      if (!param_index.emplace(k.params[i].name, static_cast<int>(i)).second) {
        return invalid_argument() << "kernel " << k.name << ": duplicate param " << k.params[i].name;
      }
    }
    for (size_t s = 0; s < k.stages.size(); ++s) {
      const ComputeDef& st = k.stages[s];
      if (!stage_index.emplace(st.name, static_cast<int>(s)).second) {
        return invalid_argument() << "kernel " << k.name << ": duplicate stage " << st.name;
      }
      if (st.axes.size() != st.shape.size()) {
        return invalid_argument() << "stage " << st.name << ": " << st.axes.size() << " axes but "
                                  << st.shape.size() << " extents";
      }
      if (st.reduce_axes.size() != st.reduce_extents.size()) {
        return invalid_argument() << "stage " << st.name << ": " << st.reduce_axes.size()
                                  << " reduce axes but " << st.reduce_extents.size() << " extents";
      }
      if (!st.body.defined()) return invalid_argument() << "stage " << st.name << ": no body";
      if (!st.reduce_axes.empty() && st.combiner == Combiner::kNone) {
        return invalid_argument() << "stage " << st.name << ": reduce axes without a combiner";
      }
      if (!dtype_is_compilable(st.dtype)) {
        return unsupported() << "stage " << st.name << ": dtype " << dtype_name(st.dtype);
      }
      auto p = param_index.find(st.name);
      if (p != param_index.end()) {
        if (p->second < k.num_inputs) {
          return invalid_argument() << "stage " << st.name << " writes input " << st.name;
        }
        if (k.params[p->second].dtype != st.dtype) {
          return invalid_argument() << "stage " << st.name << ": dtype " << dtype_name(st.dtype)
                                    << " but the param is " << dtype_name(k.params[p->second].dtype);
        }
      }
      StagePlan plan;
      for (size_t a = 0; a < st.axes.size(); ++a) {
        plan.spatial.push_back({st.axes[a], st.shape[a]});
        plan.axis_value[st.axes[a]] = var(st.axes[a]);
      }
      for (size_t a = 0; a < st.reduce_axes.size(); ++a) {
        plan.reduce.push_back({st.reduce_axes[a], st.reduce_extents[a]});
        plan.axis_value[st.reduce_axes[a]] = var(st.reduce_axes[a]);
      }
      std::set<std::string> names;
      for (const auto& l : plan.spatial) names.insert(l.var);
      for (const auto& l : plan.reduce) names.insert(l.var);
      if (names.size() != plan.spatial.size() + plan.reduce.size()) {
        return invalid_argument() << "stage " << st.name << ": duplicate axis names";
      }
      plans.push_back(std::move(plan));
    }
    for (int i = k.num_inputs; i < static_cast<int>(k.params.size()); ++i) {
      if (!stage_index.count(k.params[i].name)) {
        return invalid_argument() << "kernel " << k.name << ": output " << k.params[i].name
                                  << " is computed by no stage";
      }
    }
    return Status::ok();
  }

  // Checks and normalizes the loads of stage s: params get their position,
  // earlier stages -1; anything else is an error.
  Result<Expr> check_loads(const Expr& e, int s) {
    if (!e.defined()) return e;
    Status err;
    Expr out = rewrite(e, [&](const Expr& n) -> Expr {
      if (n.kind() != ExprKind::kLoad) return Expr();
      auto p = param_index.find(n->name);
      if (p != param_index.end()) {
        if (n->int_value == p->second) return Expr();
        if (n->int_value != -1 && err.is_ok()) {
          err = invalid_argument() << "stage " << k.stages[s].name << ": load of param " << n->name
                                   << " with buffer index " << n->int_value << ", expected "
                                   << p->second;
        }
        return load(n->name, p->second, n->dtype, n->args);
      }
      auto st = stage_index.find(n->name);
      if (st == stage_index.end() || st->second >= s) {
        if (err.is_ok()) {
          err = invalid_argument() << "stage " << k.stages[s].name << " loads " << n->name
                                   << ", which is neither a param nor an earlier stage";
        }
        return Expr();
      }
      if (n->dtype != k.stages[st->second].dtype && err.is_ok()) {
        err = invalid_argument() << "stage " << k.stages[s].name << " loads " << n->name << " as "
                                 << dtype_name(n->dtype);
      }
      if (n->args.size() != k.stages[st->second].axes.size() && err.is_ok()) {
        err = invalid_argument() << "stage " << k.stages[s].name << " loads " << n->name << " with "
                                 << n->args.size() << " indices";
      }
      if (n->int_value != -1) return load(n->name, -1, n->dtype, n->args);
      return Expr();
    });
    if (!err.is_ok()) return err;
    return out;
  }

  Result<int> find_stage(const Primitive& p) {
    auto it = stage_index.find(p.stage);
    if (it == stage_index.end()) {
      return invalid_argument() << "schedule: unknown stage '" << p.stage << "' in " << p.kind;
    }
    return it->second;
  }

  // Locates a loop by name: (is_reduce, position), or an error.
  Result<std::pair<bool, size_t>> find_loop(const StagePlan& plan, const Primitive& p,
                                            const std::string& axis) {
    for (size_t i = 0; i < plan.spatial.size(); ++i) {
      if (plan.spatial[i].var == axis) return std::make_pair(false, i);
    }
    for (size_t i = 0; i < plan.reduce.size(); ++i) {
      if (plan.reduce[i].var == axis) return std::make_pair(true, i);
    }
    return invalid_argument() << "schedule: " << p.kind << "(" << p.stage << "): unknown axis '"
                              << axis << "'";
  }

  Status apply(const Primitive& p) {
    KILN_ASSIGN_OR_RETURN(int s, find_stage(p));
    StagePlan& plan = plans[s];
    const ComputeDef& st = k.stages[s];
    if (plan.inlined) {
      return invalid_argument() << "schedule: " << p.kind << "(" << p.stage
                                << ") on an inlined stage";
    }
    if (p.kind == "inline") {
      if (param_index.count(st.name)) {
        return invalid_argument() << "schedule: cannot inline " << st.name << ", a kernel output";
      }
      if (is_reduction(st)) {
        return invalid_argument() << "schedule: cannot inline reduction stage " << st.name;
      }
      if (plan.touched) {
        return invalid_argument() << "schedule: cannot inline " << st.name
                                  << " after loop primitives were applied to it";
      }
      plan.inlined = true;
      return Status::ok();
    }
    if (p.kind == "split" || p.kind == "split_overlap" || p.kind == "split_padded") {
      if (p.axes.size() != 1) return invalid_argument() << "schedule: " << p.kind << " takes one axis";
      if (p.factor < 1) {
        return invalid_argument() << "schedule: split(" << p.stage << ", " << p.axes[0]
                                  << "): factor " << p.factor << " < 1";
      }
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      std::vector<Loop>& loops = where.first ? plan.reduce : plan.spatial;
      Loop old = loops[where.second];
      if (old.kind != ForKind::kSerial) {
        return invalid_argument() << "schedule: split(" << p.stage << ", " << old.var
                                  << ") of a loop already marked " << for_kind_name(old.kind);
      }
      if (old.var == plan.cache_axis || old.var == plan.rfactor_axis || old.var == plan.hoisted ||
          old.var == plan.hoisted_at) {
        return invalid_argument() << "schedule: split(" << p.stage << ", " << old.var << ") of the "
                                  << (old.var == plan.cache_axis     ? "cache_write"
                                      : old.var == plan.rfactor_axis ? "rfactor"
                                                                     : "hoist_reduce")
                                  << " axis";
      }
      std::string outer = old.var + ".o", inner = old.var + ".i";
      for (const std::string& n : {outer, inner}) {
        if (find_loop(plan, p, n).is_ok()) {
          return invalid_argument() << "schedule: split(" << p.stage << ", " << old.var
                                    << "): axis " << n << " exists";
        }
      }
      Expr f = int_imm(p.factor);
      if (p.kind == "split_overlap") {
        // Tiles of `factor` whose last one is shifted back to end at the
        // extent: no guard, some points are computed twice (same value).
        auto c = old.extent.as_const();
        if (where.first) {
          return invalid_argument() << "schedule: split_overlap(" << p.stage << ", " << old.var
                                    << ") of a reduce axis";
        }
        if (!c || *c < p.factor) {
          return invalid_argument() << "schedule: split_overlap(" << p.stage << ", " << old.var
                                    << ", " << p.factor << ") needs a constant extent >= the factor";
        }
        Expr start = *c % p.factor == 0 ? var(outer) * f
                                        : min(var(outer) * f, int_imm(*c - p.factor));
        Expr value = simplify(start + var(inner));
        plan.overlapped = plan.overlapped || *c % p.factor != 0;
        loops[where.second] = {outer, int_imm((*c + p.factor - 1) / p.factor)};
        loops.insert(loops.begin() + static_cast<long>(where.second) + 1, Loop{inner, f});
        ExprMap repl{{old.var, value}};
        for (auto& [axis, v] : plan.axis_value) v = simplify(substitute(v, repl));
        for (auto& g : plan.guards) g = simplify(substitute(g, repl));
        for (auto& g : plan.store_guards) g = simplify(substitute(g, repl));
        plan.touched = true;
        return Status::ok();
      }
      if (p.kind == "split_padded" && where.first) {
        return invalid_argument() << "schedule: split_padded(" << p.stage << ", " << old.var << ") of a reduce axis";
      }
      Expr outer_extent;
      bool divisible;
      if (auto c = old.extent.as_const()) {
        outer_extent = int_imm((*c + p.factor - 1) / p.factor);
        divisible = *c % p.factor == 0;
      } else {
        outer_extent = simplify(floordiv(old.extent + int_imm(p.factor - 1), f));
        auto rem = simplify(mod(old.extent, f)).as_const();
        divisible = p.factor == 1 || (rem && *rem == 0);
      }
      Expr value = simplify(var(outer) * f + var(inner));
      loops[where.second] = {outer, outer_extent};
      loops.insert(loops.begin() + static_cast<long>(where.second) + 1, Loop{inner, f});
      ExprMap repl{{old.var, value}};
      for (auto& [axis, v] : plan.axis_value) v = simplify(substitute(v, repl));
      for (auto& g : plan.guards) g = simplify(substitute(g, repl));
      for (auto& g : plan.store_guards) g = simplify(substitute(g, repl));
      if (!divisible) (p.kind == "split_padded" ? plan.store_guards : plan.guards).push_back(lt(value, old.extent));
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "fuse") {
      // fuse(stage, a, b): adjacent spatial loops a (outer) and b become one
      // loop a_b over extent(a) * extent(b); a = a_b floordiv extent(b), b =
      // a_b mod extent(b). Accesses row-major in (a, b) become contiguous in
      // a_b (the simplifier folds extent(b) * (x floordiv extent(b)) + x mod
      // extent(b) back to x).
      if (p.axes.size() != 2) return invalid_argument() << "schedule: fuse takes two axes";
      KILN_ASSIGN_OR_RETURN(auto wa, find_loop(plan, p, p.axes[0]));
      KILN_ASSIGN_OR_RETURN(auto wb, find_loop(plan, p, p.axes[1]));
      if (wa.first || wb.first) {
        return invalid_argument() << "schedule: fuse(" << p.stage << ", " << p.axes[0] << ", " << p.axes[1]
                                  << ") of a reduce axis";
      }
      if (wb.second != wa.second + 1) {
        return invalid_argument() << "schedule: fuse(" << p.stage << ", " << p.axes[0] << ", " << p.axes[1]
                                  << ") of loops that are not adjacent, outer first";
      }
      for (const std::string& a : p.axes) {
        const Loop& l = plan.spatial[a == p.axes[0] ? wa.second : wb.second];
        if (l.kind != ForKind::kSerial || a == plan.cache_axis || a == plan.prefetch_axis || a == plan.hoisted_at) {
          return invalid_argument() << "schedule: fuse(" << p.stage << ", " << a
                                    << ") of a loop already marked or cached";
        }
      }
      std::string fused = p.axes[0] + "_" + p.axes[1];
      if (find_loop(plan, p, fused).is_ok()) {
        return invalid_argument() << "schedule: fuse(" << p.stage << "): axis " << fused << " exists";
      }
      Expr inner_extent = plan.spatial[wb.second].extent;
      Expr extent = simplify(plan.spatial[wa.second].extent * inner_extent);
      ExprMap repl{{p.axes[0], floordiv(var(fused), inner_extent)}, {p.axes[1], mod(var(fused), inner_extent)}};
      plan.spatial[wa.second] = Loop{fused, extent};
      plan.spatial.erase(plan.spatial.begin() + static_cast<long>(wb.second));
      for (auto& [axis, v] : plan.axis_value) v = simplify(substitute(v, repl));
      for (auto& g : plan.guards) g = simplify(substitute(g, repl));
      for (auto& g : plan.store_guards) g = simplify(substitute(g, repl));
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "reorder") {
      if (p.axes.empty()) return invalid_argument() << "schedule: reorder names no axes";
      std::vector<size_t> positions;
      bool reduce = false;
      std::set<std::string> seen;
      for (size_t i = 0; i < p.axes.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[i]));
        if (i > 0 && where.first != reduce) {
          return invalid_argument() << "schedule: reorder(" << p.stage
                                    << ") mixes spatial and reduce axes";
        }
        if (!seen.insert(p.axes[i]).second) {
          return invalid_argument() << "schedule: reorder(" << p.stage << ") repeats axis "
                                    << p.axes[i];
        }
        reduce = where.first;
        positions.push_back(where.second);
      }
      std::vector<Loop>& loops = reduce ? plan.reduce : plan.spatial;
      std::vector<Loop> named;
      for (size_t pos : positions) named.push_back(loops[pos]);
      std::sort(positions.begin(), positions.end());
      for (size_t i = 0; i < positions.size(); ++i) loops[positions[i]] = named[i];
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "parallel" || p.kind == "vectorize" || p.kind == "unroll") {
      if (p.axes.size() != 1) return invalid_argument() << "schedule: " << p.kind << " takes one axis";
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      ForKind kind = p.kind == "parallel"    ? ForKind::kParallel
                     : p.kind == "vectorize" ? ForKind::kVectorized
                                             : ForKind::kUnrolled;
      if (where.first && kind != ForKind::kUnrolled) {
        return invalid_argument() << "schedule: " << p.kind << "(" << p.stage << ", " << p.axes[0]
                                  << ") of a reduce axis";
      }
      Loop& l = (where.first ? plan.reduce : plan.spatial)[where.second];
      if (l.kind != ForKind::kSerial && l.kind != kind) {
        return invalid_argument() << "schedule: " << p.kind << "(" << p.stage << ", " << p.axes[0]
                                  << ") of a loop already marked " << for_kind_name(l.kind);
      }
      l.kind = kind;
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "cache_write") {
      if (p.axes.size() != 1) return invalid_argument() << "schedule: cache_write takes one axis";
      if (!is_reduction(st)) {
        return invalid_argument() << "schedule: cache_write(" << p.stage
                                  << ") of a stage that is not a reduction";
      }
      if (!plan.cache_axis.empty()) {
        return invalid_argument() << "schedule: cache_write(" << p.stage << ") applied twice";
      }
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      if (where.first) {
        return invalid_argument() << "schedule: cache_write(" << p.stage << ", " << p.axes[0]
                                  << ") at a reduce axis";
      }
      plan.cache_axis = p.axes[0];
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "rfactor") {
      if (p.axes.size() != 1) return invalid_argument() << "schedule: rfactor takes one axis";
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      if (!where.first) {
        return invalid_argument() << "schedule: rfactor(" << p.stage << ", " << p.axes[0] << ") of a spatial axis";
      }
      if (!plan.rfactor_axis.empty()) {
        return invalid_argument() << "schedule: rfactor(" << p.stage << ") applied twice";
      }
      auto c = plan.reduce[where.second].extent.as_const();
      if (!c || *c < 1 || *c > 64) {
        return invalid_argument() << "schedule: rfactor(" << p.stage << ", " << p.axes[0]
                                  << ") needs a constant extent of 1 to 64 (split the axis first)";
      }
      if (p.axes[0] == plan.hoisted) {
        return invalid_argument() << "schedule: rfactor(" << p.stage << ", " << p.axes[0] << ") of the hoist_reduce axis";
      }
      plan.rfactor_axis = p.axes[0];
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "hoist_reduce") {
      if (p.axes.empty() || p.axes.size() > 2) return invalid_argument() << "schedule: hoist_reduce takes one or two axes";
      if (!is_reduction(st)) {
        return invalid_argument() << "schedule: hoist_reduce(" << p.stage << ") of a stage that is not a reduction";
      }
      if (!plan.hoisted.empty()) return invalid_argument() << "schedule: hoist_reduce(" << p.stage << ") applied twice";
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      if (!where.first) {
        return invalid_argument() << "schedule: hoist_reduce(" << p.stage << ", " << p.axes[0] << ") of a spatial axis";
      }
      if (p.axes[0] == plan.rfactor_axis || plan.reduce[where.second].kind != ForKind::kSerial) {
        return invalid_argument() << "schedule: hoist_reduce(" << p.stage << ", " << p.axes[0]
                                  << ") of a loop already marked or accumulated in lanes";
      }
      if (p.axes.size() == 2) {
        KILN_ASSIGN_OR_RETURN(auto at, find_loop(plan, p, p.axes[1]));
        if (at.first) {
          return invalid_argument() << "schedule: hoist_reduce(" << p.stage << ", " << p.axes[0] << ", " << p.axes[1]
                                    << "): the place must be a spatial loop";
        }
        plan.hoisted_at = p.axes[1];
      }
      plan.hoisted = p.axes[0];
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "prefetch") {
      if (p.axes.size() != 1) return invalid_argument() << "schedule: prefetch takes one axis";
      if (!is_reduction(st)) {
        return invalid_argument() << "schedule: prefetch(" << p.stage << ") of a stage that is not a reduction";
      }
      KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
      if (where.first) {
        return invalid_argument() << "schedule: prefetch(" << p.stage << ", " << p.axes[0] << ") of a reduce axis";
      }
      plan.prefetch_axis = p.axes[0];
      plan.prefetch_distance = p.factor > 0 ? p.factor : 1;
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "pack") {
      if (p.axes.size() != 2) return invalid_argument() << "schedule: pack takes a stage, a buffer and an axis";
      if (!is_reduction(st)) {
        return invalid_argument() << "schedule: pack(" << p.stage << ") of a stage that is not a reduction";
      }
      auto b = param_index.find(p.axes[0]);
      if (b == param_index.end() || b->second >= k.num_inputs) {
        return invalid_argument() << "schedule: pack(" << p.stage << ", " << p.axes[0] << "): not an input of the kernel";
      }
      KILN_RETURN_IF_ERROR(find_loop(plan, p, p.axes[1]).status());
      if (!plan.pack_buffer.empty()) return invalid_argument() << "schedule: pack(" << p.stage << ") applied twice";
      plan.pack_buffer = p.axes[0];
      plan.pack_axis = p.axes[1];
      plan.pack_lanes = p.factor;
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "compute_at") {
      if (p.axes.size() != 2) return invalid_argument() << "schedule: compute_at takes a stage, a consumer and an axis";
      if (param_index.count(st.name)) {
        return invalid_argument() << "schedule: compute_at(" << st.name << "): a kernel output is computed whole";
      }
      auto c = stage_index.find(p.axes[0]);
      if (c == stage_index.end()) {
        return invalid_argument() << "schedule: compute_at(" << st.name << "): unknown stage '" << p.axes[0] << "'";
      }
      if (c->second <= s) {
        return invalid_argument() << "schedule: compute_at(" << st.name << ", " << p.axes[0]
                                  << "): the consumer must be a later stage";
      }
      if (plan.attach_to >= 0) return invalid_argument() << "schedule: compute_at(" << st.name << ") applied twice";
      plan.attach_to = c->second;
      plan.attach_axis = p.axes[1];
      plan.touched = true;
      return Status::ok();
    }
    if (p.kind == "fuse_epilogue") {
      if (!is_reduction(st)) {
        return invalid_argument() << "schedule: fuse_epilogue(" << p.stage << ") of a stage that is not a reduction";
      }
      if (p.axes.size() > 1) return invalid_argument() << "schedule: fuse_epilogue takes at most one axis";
      if (p.axes.size() == 1) {
        KILN_ASSIGN_OR_RETURN(auto where, find_loop(plan, p, p.axes[0]));
        if (where.first) {
          return invalid_argument() << "schedule: fuse_epilogue(" << p.stage << ", " << p.axes[0]
                                    << ") of a reduce axis";
        }
        plan.epilogue_axis = p.axes[0];
      }
      plan.fuse_epilogue = true;
      return Status::ok();
    }
    return invalid_argument() << "schedule: unknown primitive '" << p.kind << "'";
  }

  // Whether e loads stage `name` anywhere.
  static bool loads_stage(const Expr& e, const std::string& name) {
    if (!e.defined()) return false;
    if (e.kind() == ExprKind::kLoad && e->int_value == -1 && e->name == name) return true;
    for (const Expr& a : e->args)
      if (loads_stage(a, name)) return true;
    return false;
  }
  // Every load of stage `name` in e is at exactly the point (axes...) of a
  // stage of that shape: index i is the variable axes[i], or 0 where the
  // extent is 1 (a broadcast index of a unit dim).
  static bool loads_pointwise(const Expr& e, const std::string& name, const std::vector<std::string>& axes,
                              const std::vector<Expr>& shape) {
    if (!e.defined()) return true;
    if (e.kind() == ExprKind::kLoad && e->int_value == -1 && e->name == name) {
      if (e->args.size() != axes.size()) return false;
      for (size_t i = 0; i < axes.size(); ++i) {
        const Expr& a = e->args[i];
        bool at_axis = a.kind() == ExprKind::kVar && a->name == axes[i];
        auto c = a.as_const();
        auto extent = shape[i].as_const();
        if (!at_axis && !(c && *c == 0 && extent && *extent == 1)) return false;
      }
    }
    for (const Expr& a : e->args)
      if (!loads_pointwise(a, name, axes, shape)) return false;
    return true;
  }

  // After inlining: pairs each fuse_epilogue stage with the stage it can
  // compute in its write-back (see schedule.h), when there is one.
  void plan_epilogues() {
    for (size_t r = 0; r < stages.size(); ++r) {
      if (!plans[r].fuse_epilogue || plans[r].inlined || param_index.count(stages[r].name)) continue;
      size_t e = r + 1;
      while (e < stages.size() && plans[e].inlined) ++e;
      if (e == stages.size() || plans[e].fused_into >= 0) continue;
      const ComputeDef& R = stages[r];
      const ComputeDef& E = stages[e];
      if (is_reduction(E) || E.axes.size() != R.axes.size()) continue;
      bool ok = loads_pointwise(E.body, R.name, E.axes, E.shape);
      for (size_t a = 0; a < R.shape.size() && ok; ++a) {
        auto d = simplify(E.shape[a] - R.shape[a]).as_const();
        ok = d && *d == 0;
      }
      // Nothing else reads R (inlined stages were substituted into their readers).
      for (size_t c = r + 1; c < stages.size() && ok; ++c) {
        if (c == e || plans[c].inlined) continue;
        ok = !loads_stage(stages[c].body, R.name) && !loads_stage(stages[c].init, R.name) &&
             !loads_stage(stages[c].finalize, R.name);
      }
      if (!ok) continue;
      plans[r].epilogue = static_cast<int>(e);
      plans[e].fused_into = static_cast<int>(r);
    }
  }

  // Every load of stage `name` in e.
  static void collect_loads(const Expr& e, const std::string& name, std::vector<Expr>& out) {
    if (!e.defined()) return;
    if (e.kind() == ExprKind::kLoad && e->int_value == -1 && e->name == name) out.push_back(e);
    for (const Expr& a : e->args) collect_loads(a, name, out);
  }

  // The extent of loop `v` in a plan (spatial or reduce); undefined if none.
  static Expr loop_extent(const StagePlan& plan, const std::string& v) {
    for (const auto* loops : {&plan.spatial, &plan.reduce})
      for (const Loop& l : *loops)
        if (l.var == v) return l.extent;
    return Expr();
  }

  // After inlining and epilogue pairing: checks each compute_at and plans the
  // producer's local buffer. The consumer's loops from the outermost through
  // the axis must be the producer's outermost loops (same names, extents), so
  // that one iteration of them fixes the same region in both; every other
  // stage that reads the producer must be the consumer or computed at the
  // same place, reading each dim that depends on the shared loops at exactly
  // the producer's own index there (so what it reads was computed in this
  // iteration). A dim that depends on a shared loop holds one region (its
  // extent over the producer's own loops, which must be constant); other dims
  // are whole.
  Status plan_attachments() {
    for (size_t s = 0; s < stages.size(); ++s) {
      StagePlan& plan = plans[s];
      if (plan.attach_to < 0) continue;
      const ComputeDef& P = stages[s];
      const size_t c = static_cast<size_t>(plan.attach_to);
      const StagePlan& cp = plans[c];
      const std::string where =
          "schedule: compute_at(" + P.name + ", " + stages[c].name + ", " + plan.attach_axis + "): ";
      if (cp.inlined || cp.fused_into >= 0) return invalid_argument() << where << "the consumer has no loop nest of its own (inlined or an epilogue)";
      if (cp.attach_to >= 0) return invalid_argument() << where << "the consumer is itself computed at another stage";
      if (!cp.hoisted.empty() || !cp.epilogue_axis.empty()) {
        return invalid_argument() << where << "the consumer hoists a reduce loop or defers its epilogue";
      }
      if (plan.epilogue >= 0 || plan.fused_into >= 0 || !plan.hoisted.empty()) {
        return invalid_argument() << where << "the stage computes an epilogue, is one, or hoists a reduce loop";
      }
      size_t pos = cp.spatial.size();
      for (size_t i = 0; i < cp.spatial.size(); ++i)
        if (cp.spatial[i].var == plan.attach_axis) pos = i;
      if (pos == cp.spatial.size()) return invalid_argument() << where << "no spatial loop of that name in the consumer";
      if (is_reduction(stages[c]) && !cp.cache_axis.empty()) {
        for (size_t i = 0; i < pos; ++i)
          if (cp.spatial[i].var == cp.cache_axis) return invalid_argument() << where << "the axis is inside the consumer's register tile";
      }
      if (plan.spatial.size() <= pos) return invalid_argument() << where << "the stage has fewer loops than the consumer has down to the axis";
      plan.shared.clear();
      for (size_t i = 0; i <= pos; ++i) {
        const Loop &a = cp.spatial[i], &b = plan.spatial[i];
        auto diff = simplify(a.extent - b.extent).as_const();
        if (a.var != b.var || !diff || *diff != 0) {
          return invalid_argument() << where << "loop " << i << " is " << a.var << " in the consumer but " << b.var
                        << " here, or their extents differ (split both alike)";
        }
        if (a.kind == ForKind::kVectorized) return invalid_argument() << where << "a shared loop is vectorized";
        plan.shared.insert(a.var);
      }
      if (is_reduction(P) && !plan.cache_axis.empty()) {
        for (size_t i = 0; i < pos; ++i)
          if (plan.spatial[i].var == plan.cache_axis) return invalid_argument() << where << "the axis is inside the stage's own register tile";
      }
      auto uses_shared = [&](const Expr& e) {
        for (const std::string& v : free_vars(e))
          if (plan.shared.count(v)) return true;
        return false;
      };
      // Guards on shared loops only are the consumer's to place: it must have them.
      std::vector<Expr> all_guards = plan.guards;
      all_guards.insert(all_guards.end(), plan.store_guards.begin(), plan.store_guards.end());
      for (const Expr& g : all_guards) {
        bool only_shared = uses_shared(g);
        for (const std::string& v : free_vars(g))
          if (!plan.shared.count(v) && loop_extent(plan, v).defined()) only_shared = false;
        if (!only_shared) continue;
        if (std::none_of(cp.guards.begin(), cp.guards.end(), [&](const Expr& h) { return h == g; })) {
          return invalid_argument() << where << "the stage's guard " << g.to_string() << " on shared loops is not the consumer's";
        }
      }
      // Loops of one iteration are at 0 (a unit batch dim is read at index 0).
      auto unit_loops_at_zero = [](const StagePlan& sp, const Expr& e) {
        ExprMap zero;
        for (const auto* loops : {&sp.spatial, &sp.reduce})
          for (const Loop& l : *loops)
            if (auto c = l.extent.as_const(); c && *c == 1) zero[l.var] = int_imm(0);
        return simplify(substitute(e, zero));
      };
      // The region of each dim.
      plan.local_base.assign(P.axes.size(), Expr());
      plan.local_shape = P.shape;
      for (size_t d = 0; d < P.axes.size(); ++d) {
        const Expr v = unit_loops_at_zero(plan, plan.axis_value.at(P.axes[d]));
        if (!uses_shared(v)) continue;
        ExprMap first, last;
        for (const std::string& u : free_vars(v)) {
          if (plan.shared.count(u)) continue;
          Expr ext = loop_extent(plan, u);
          auto e = ext.defined() ? ext.as_const() : std::nullopt;
          auto step = simplify(substitute(v, {{u, var(u) + int_imm(1)}}) - v).as_const();
          if (!e || *e < 1 || !step || *step < 0) {
            return invalid_argument() << where << "dim " << d << " (" << v.to_string()
                          << ") does not span a region of constant size over the stage's own loops";
          }
          first[u] = int_imm(0);
          last[u] = int_imm(*e - 1);
        }
        Expr base = simplify(substitute(v, first));
        auto size = simplify(substitute(v, last) - base + int_imm(1)).as_const();
        if (!size || *size < 1) {
          return invalid_argument() << where << "dim " << d << " (" << v.to_string() << ") does not span a region of constant size";
        }
        plan.local_base[d] = base;
        plan.local_shape[d] = int_imm(*size);
      }
      // Readers.
      for (size_t t = s + 1; t < stages.size(); ++t) {
        if (plans[t].inlined) continue;
        const ComputeDef& T = stages[t];
        std::vector<Expr> loads;
        for (const Expr* e : {&T.body, &T.init, &T.finalize}) collect_loads(*e, P.name, loads);
        if (loads.empty()) continue;
        bool co_located = t == c || (plans[t].attach_to == static_cast<int>(c) && plans[t].attach_axis == plan.attach_axis);
        if (!co_located || plans[t].fused_into >= 0) {
          return invalid_argument() << where << "stage " << T.name << " reads it outside the consumer's loop";
        }
        for (const Expr& l : loads) {
          for (size_t d = 0; d < P.axes.size(); ++d) {
            if (!plan.local_base[d].defined()) continue;
            const Expr own = unit_loops_at_zero(plan, plan.axis_value.at(P.axes[d]));
            Expr at = unit_loops_at_zero(plans[t], substitute(l->args[d], plans[t].axis_value));
            bool same = at == own;
            for (const std::string& u : free_vars(own)) {
              if (plan.shared.count(u) || !same) continue;
              Expr mine = loop_extent(plan, u), theirs = loop_extent(plans[t], u);
              auto diff = theirs.defined() ? simplify(mine - theirs).as_const() : std::nullopt;
              same = diff && *diff == 0;
            }
            if (!same) {
              return invalid_argument() << where << "stage " << T.name << " reads dim " << d << " at " << at.to_string()
                            << ", not at the stage's own index " << own.to_string();
            }
          }
        }
      }
      for (Loop& l : plan.spatial)
        if (l.kind == ForKind::kParallel) l.kind = ForKind::kSerial;  // inside the consumer's loops
    }
    return Status::ok();
  }

  // Substitutes inlined stages into the bodies of all later stages, in order.
  Status inline_stages() {
    stages = k.stages;
    for (size_t s = 0; s < stages.size(); ++s) {
      ComputeDef& st = stages[s];
      for (Expr* e : {&st.body, &st.init, &st.finalize}) {
        KILN_ASSIGN_OR_RETURN(*e, check_loads(*e, static_cast<int>(s)));
      }
    }
    for (size_t s = 0; s < stages.size(); ++s) {
      if (!plans[s].inlined) continue;
      const ComputeDef producer = stages[s];
      Expr value = cast_to(producer.dtype, producer.body);
      auto replace = [&](const Expr& e) -> Expr {
        if (!e.defined()) return e;
        return rewrite(e, [&](const Expr& n) -> Expr {
          if (n.kind() != ExprKind::kLoad || n->int_value != -1 || n->name != producer.name) {
            return Expr();
          }
          ExprMap repl;
          for (size_t a = 0; a < producer.axes.size(); ++a) repl[producer.axes[a]] = n->args[a];
          return substitute(value, repl);
        });
      };
      for (size_t c = s + 1; c < stages.size(); ++c) {
        stages[c].body = replace(stages[c].body);
        stages[c].init = replace(stages[c].init);
        stages[c].finalize = replace(stages[c].finalize);
      }
    }
    return Status::ok();
  }

  // Wraps `leaf` in `loops` (outermost first). Each guard goes right inside the
  // deepest loop of `loops` it references; guards that reference none of
  // `loops`, or a loop var bound neither here nor in `bound_outside`, are
  // placed by another call.
  Stmt build_nest(const std::vector<Loop>& loops, Stmt leaf, const std::vector<Expr>& guards,
                  const std::set<std::string>& bound_outside, const std::set<std::string>& loop_vars) {
    std::vector<std::vector<Expr>> at(loops.size());
    for (const Expr& g : guards) {
      int deepest = -1;
      bool placeable = true;
      for (const std::string& v : free_vars(g)) {
        if (!loop_vars.count(v)) continue;
        int pos = -1;
        for (size_t i = 0; i < loops.size(); ++i) {
          if (loops[i].var == v) pos = static_cast<int>(i);
        }
        if (pos < 0 && !bound_outside.count(v)) placeable = false;
        deepest = std::max(deepest, pos);
      }
      if (placeable && deepest >= 0) at[deepest].push_back(g);
    }
    Stmt body = std::move(leaf);
    for (size_t i = loops.size(); i-- > 0;) {
      if (!at[i].empty()) {
        Expr cond = at[i][0];
        for (size_t j = 1; j < at[i].size(); ++j) cond = logical_and(cond, at[i][j]);
        body = make_if(cond, body);
      }
      body = make_for(loops[i].var, loops[i].extent, loops[i].kind, body);
    }
    return body;
  }

  // `nest` with `prefix` run at the start of each iteration of loop `var`
  // (found through the loops and guards of the nest).
  static Stmt prepend_in_loop(const Stmt& nest, const std::string& var, const std::vector<Stmt>& prefix) {
    if (!nest) return nest;
    if (nest->kind == StmtKind::kFor) {
      if (nest->var == var) {
        std::vector<Stmt> body = prefix;
        body.push_back(nest->body);
        return make_for(nest->var, nest->extent, nest->for_kind, make_seq(body));
      }
      return make_for(nest->var, nest->extent, nest->for_kind, prepend_in_loop(nest->body, var, prefix));
    }
    if (nest->kind == StmtKind::kIfThenElse && !nest->else_case)
      return make_if(nest->cond, prepend_in_loop(nest->then_case, var, prefix));
    return nest;
  }

  // Prefetches, for each step of the reduction, of what the next iteration
  // of spatial loop `axis` will read from the stage's params whose index
  // depends on it (a GEMM's next weight panel, streamed from memory while the
  // current one is used from cache): the load at the current reduce point,
  // with `axis` one further and the inner loops at 0, spanning the vector
  // loop where the load is contiguous along it.
  std::vector<Stmt> prefetches(const Expr& body, const std::string& axis, int64_t distance, const std::vector<Loop>& inner) {
    std::vector<Stmt> out;
    std::set<std::string> seen;
    ExprMap at;
    at[axis] = var(axis) + int_imm(distance);
    std::string vec;
    int64_t lanes = 1;
    for (const Loop& l : inner) {
      at[l.var] = int_imm(0);
      auto c = l.extent.as_const();
      if (l.kind == ForKind::kVectorized && c) {
        vec = l.var;
        lanes = *c;
      }
    }
    add_load_prefetches(body, axis, at, vec, lanes, false, seen, out);
    return out;
  }

  // Appends a prefetch of each param load in `e` whose index uses loop
  // variable `uses`, at that index with `at` substituted, spanning the vector
  // loop `vec` (`lanes` wide) where the load is contiguous along it: its last
  // index steps by 1 and no other depends on it, or, with `wrapped`, its last
  // index steps by 1 or by no constant (a fused plane axis: x floordiv W,
  // x mod W is contiguous but at row ends). `seen` drops repeats.
  static void add_load_prefetches(const Expr& e, const std::string& uses, const ExprMap& at, const std::string& vec,
                                  int64_t lanes, bool wrapped, std::set<std::string>& seen, std::vector<Stmt>& out) {
    rewrite(e, [&](const Expr& ld) -> Expr {
      if (ld.kind() != ExprKind::kLoad || ld->int_value < 0 || ld->args.empty()) return Expr();
      bool found = false;
      for (const Expr& a : ld->args)
        for (const std::string& v : free_vars(a)) found = found || v == uses;
      if (!found) return Expr();
      std::vector<Expr> idx;
      for (const Expr& a : ld->args) idx.push_back(simplify(substitute(a, at)));
      int64_t span = 1;
      if (!vec.empty()) {
        bool contiguous = true;
        for (size_t i = 0; i + 1 < ld->args.size() && !wrapped; ++i)
          for (const std::string& v : free_vars(ld->args[i])) contiguous = contiguous && v != vec;
        auto step = simplify(substitute(ld->args.back(), {{vec, var(vec) + int_imm(1)}}) - ld->args.back()).as_const();
        if (contiguous && (step ? *step == 1 : wrapped)) span = lanes;
      }
      std::string key = ld->name;
      for (const Expr& i : idx) key += "," + i.to_string();
      if (seen.insert(key).second) out.push_back(make_prefetch(ld->name, static_cast<int>(ld->int_value), ld->dtype, idx, span));
      return Expr();
    });
  }

  // Prefetches, at the start of a register tile, of what its write-back
  // reads from params (a residual added in the epilogue): one per row of the
  // unrolled inner loops, spanning the vector loop where contiguous.
  std::vector<Stmt> epilogue_prefetches(const Expr& result, const std::vector<Loop>& inner) {
    std::vector<Stmt> out;
    std::vector<const Loop*> rows;
    std::string vec;
    int64_t lanes = 1, combos = 1;
    for (const Loop& l : inner) {
      auto c = l.extent.as_const();
      if (!c) return out;
      if (l.kind == ForKind::kVectorized) {
        vec = l.var;
        lanes = *c;
      } else {
        rows.push_back(&l);
        combos *= *c;
      }
    }
    if (combos > 64) return out;
    std::set<std::string> seen;
    for (int64_t k = 0; k < combos; ++k) {
      ExprMap at;
      int64_t rest = k;
      for (const Loop* l : rows) {
        int64_t e = *l->extent.as_const();
        at[l->var] = int_imm(rest % e);
        rest /= e;
      }
      if (!vec.empty()) at[vec] = int_imm(0);
      if (!vec.empty()) add_load_prefetches(result, vec, at, vec, lanes, true, seen, out);
    }
    return out;
  }

  // One comparison of a padding condition: l < r (strict) or l <= r.
  struct Bound {
    Expr l, r;
    bool strict = false;
  };

  static bool collect_bounds(const Expr& c, std::vector<Bound>& out) {
    if (c.kind() == ExprKind::kAnd) return collect_bounds(c->args[0], out) && collect_bounds(c->args[1], out);
    if (c.kind() == ExprKind::kLE || c.kind() == ExprKind::kLT) {
      if (!dtype_is_int(c->args[0].dtype()) || !dtype_is_int(c->args[1].dtype())) return false;
      out.push_back({c->args[0], c->args[1], c.kind() == ExprKind::kLT});
      return true;
    }
    return false;
  }

  static std::optional<int64_t> const_diff(const Expr& a, const Expr& b) { return simplify(a - b).as_const(); }

  // Whether the bounds prove x <= k.
  static bool proves_le(const std::vector<Bound>& bounds, const Expr& x, const Expr& k) {
    for (const Bound& b : bounds) {
      auto same = const_diff(b.l, x);
      auto c = const_diff(k, b.r);
      if (same && *same == 0 && c && *c >= (b.strict ? -1 : 0)) return true;
    }
    return false;
  }

  // Whether the bounds prove k <= x.
  static bool proves_ge(const std::vector<Bound>& bounds, const Expr& x, const Expr& k) {
    for (const Bound& b : bounds) {
      auto same = const_diff(b.r, x);
      auto c = const_diff(b.l, k);
      if (same && *same == 0 && c && *c >= (b.strict ? -1 : 0)) return true;
    }
    return false;
  }

  // e at the corner of the tile loops where it is smallest, when e changes
  // by a constant step along each of them (affine) and their extents are
  // constants; else undefined.
  static Expr tile_minimum(const Expr& e, const std::vector<Loop>& loops) {
    ExprMap corner;
    for (const std::string& v : free_vars(e)) {
      auto l = std::find_if(loops.begin(), loops.end(), [&](const Loop& x) { return x.var == v; });
      if (l == loops.end()) continue;
      auto extent = l->extent.as_const();
      auto step = simplify(substitute(e, {{v, var(v) + int_imm(1)}}) - e).as_const();
      if (!extent || *extent < 1 || !step) return Expr();
      corner[v] = int_imm(*step >= 0 ? 0 : *extent - 1);
    }
    return simplify(substitute(e, corner));
  }

  // `body` with each select(cond, x, pad) whose cond (a conjunction of
  // integer comparisons) holds over the whole tile replaced by x (pad, the
  // padding value, is never read there: 0 for a convolution, -inf for a max
  // pooling), its index clamps
  // min(k, i) / max(k, i) that cond makes redundant removed. *interior gets
  // the condition, over the loops outside the tile, under which that holds
  // (undefined: nothing replaced).
  // The body is the stage's own (over its axes, as the op's lowering wrote
  // the clamps); `to_loops` maps an expression to the loop variables.
  static Expr strip_padding(const Expr& body, const std::function<Expr(const Expr&)>& to_loops,
                            const std::vector<Loop>& tile_loops, Expr* interior) {
    std::vector<Expr> holds;
    Expr out = rewrite(body, [&](const Expr& n) -> Expr {
      if (n.kind() != ExprKind::kSelect) return Expr();
      std::vector<Bound> bounds;
      if (!collect_bounds(n->args[0], bounds)) return Expr();
      std::vector<Expr> conds;
      for (const Bound& b : bounds) {
        Expr slack = tile_minimum(to_loops(b.r - b.l), tile_loops);
        if (!slack.defined()) return Expr();
        conds.push_back(b.strict ? lt(int_imm(0), slack) : le(int_imm(0), slack));
      }
      holds.insert(holds.end(), conds.begin(), conds.end());
      return rewrite(n->args[1], [&](const Expr& m) -> Expr {
        if (m.kind() != ExprKind::kMin && m.kind() != ExprKind::kMax) return Expr();
        for (int i = 0; i < 2; ++i) {
          const Expr &k = m->args[static_cast<size_t>(i)], &x = m->args[static_cast<size_t>(1 - i)];
          if (m.kind() == ExprKind::kMin ? proves_le(bounds, x, k) : proves_ge(bounds, x, k)) return x;
        }
        return Expr();
      });
    });
    for (const Expr& h : holds) *interior = interior->defined() ? logical_and(*interior, h) : h;
    if (interior->defined()) *interior = simplify(*interior);
    return out;
  }

  // The loop nest of stage s and, inside the loop each compute_at names, the
  // stages computed there (in stage order) with their local buffers.
  Result<Stmt> lower_stage(int s) {
    KILN_ASSIGN_OR_RETURN(Stmt nest, lower_stage_nest(s));
    // Axis -> producers, innermost axis first: wrapping an outer loop's body
    // keeps the inner loops' (already wrapped) inside it.
    std::vector<std::pair<std::string, std::vector<size_t>>> at;
    const std::vector<Loop>& loops = plans[static_cast<size_t>(s)].spatial;
    for (size_t i = loops.size(); i-- > 0;) {
      std::vector<size_t> producers;
      for (size_t p = 0; p < stages.size(); ++p)
        if (plans[p].attach_to == s && plans[p].attach_axis == loops[i].var) producers.push_back(p);
      if (!producers.empty()) at.emplace_back(loops[i].var, std::move(producers));
    }
    for (const auto& entry : at) {
      // (Not a structured binding: clang before 16 cannot capture one in the lambda below.)
      const std::string& axis = entry.first;
      const std::vector<size_t>& producers = entry.second;
      std::vector<Stmt> prefix;
      for (size_t p : producers) {
        KILN_ASSIGN_OR_RETURN(Stmt pn, lower_stage_nest(static_cast<int>(p)));
        prefix.push_back(pn);
      }
      bool found = false;
      nest = wrap_loop_body(nest, axis, found, [&](const Stmt& body) {
        std::vector<Stmt> seq = prefix;
        seq.push_back(body);
        Stmt out = make_seq(std::move(seq));
        for (size_t p : producers) out = relocate(out, stages[p].name, plans[p].local_base);
        for (size_t i = producers.size(); i-- > 0;) {
          const ComputeDef& P = stages[producers[i]];
          out = make_allocate(Buffer{P.name, P.dtype, plans[producers[i]].local_shape}, out);
        }
        return out;
      });
      if (!found) {
        return internal_error() << "compute_at: loop " << axis << " of " << stages[static_cast<size_t>(s)].name
                                << " not found in its nest";
      }
    }
    return nest;
  }

  // `nest` with the body of loop `var` (inside the guards placed right in it)
  // replaced by f(body).
  static Stmt wrap_loop_body(const Stmt& nest, const std::string& var, bool& found,
                             const std::function<Stmt(const Stmt&)>& f) {
    if (!nest) return nest;
    if (nest->kind == StmtKind::kFor) {
      if (nest->var != var) return make_for(nest->var, nest->extent, nest->for_kind, wrap_loop_body(nest->body, var, found, f));
      found = true;
      std::function<Stmt(const Stmt&)> in_guards = [&](const Stmt& b) -> Stmt {
        if (b->kind == StmtKind::kIfThenElse && !b->else_case) return make_if(b->cond, in_guards(b->then_case));
        return f(b);
      };
      return make_for(nest->var, nest->extent, nest->for_kind, in_guards(nest->body));
    }
    if (nest->kind == StmtKind::kIfThenElse && !nest->else_case)
      return make_if(nest->cond, wrap_loop_body(nest->then_case, var, found, f));
    return nest;
  }

  // s with every access to scratch buffer `name` made relative to `base`
  // (per dim; undefined: unchanged): the buffer of a stage computed at
  // another holds only the region of one iteration.
  static Stmt relocate(const Stmt& s, const std::string& name, const std::vector<Expr>& base) {
    if (!s) return s;
    auto loads = [&](const Expr& e) { return e.defined() ? rewrite_loads_in(e, name, base) : e; };
    auto n = std::make_shared<StmtNode>(*s);
    for (Expr* e : {&n->extent, &n->value, &n->cond}) *e = loads(*e);
    for (Expr& e : n->indices) e = loads(e);
    if (n->kind == StmtKind::kStore && n->buffer_index == -1 && n->buffer.name == name) shift(n->indices, base);
    n->body = relocate(n->body, name, base);
    n->then_case = relocate(n->then_case, name, base);
    n->else_case = relocate(n->else_case, name, base);
    for (Stmt& c : n->seq) c = relocate(c, name, base);
    return n;
  }
  static void shift(std::vector<Expr>& idx, const std::vector<Expr>& base) {
    for (size_t d = 0; d < idx.size() && d < base.size(); ++d)
      if (base[d].defined()) idx[d] = simplify(idx[d] - base[d]);
  }
  // e with its loads of `name` made relative to `base`.
  static Expr rewrite_loads_in(const Expr& e, const std::string& name, const std::vector<Expr>& base) {
    return rewrite(e, [&](const Expr& n) -> Expr {
      if (n.kind() != ExprKind::kLoad || n->int_value != -1 || n->name != name) return Expr();
      std::vector<Expr> idx;
      for (const Expr& a : n->args) idx.push_back(rewrite_loads_in(a, name, base));
      shift(idx, base);
      return load(n->name, -1, n->dtype, idx);
    });
  }

  // pack(stage, buffer, axis): the local buffer, the copy that fills it, and
  // the rewrite of the stage's loads of `buffer` into loads of it.
  struct PackPlan {
    Buffer buffer;
    Stmt copy;
    std::string source;
    std::vector<Expr> index;  // into the local buffer: the loop variables it is indexed by
    Expr use(const Expr& e) const {
      return rewrite(e, [&](const Expr& n) -> Expr {
        if (n.kind() != ExprKind::kLoad || n->int_value < 0 || n->name != source) return Expr();
        return load(buffer.name, -1, buffer.dtype, index);
      });
    }
  };

  // The region of param plan.pack_buffer that one iteration of loop
  // plan.pack_axis (one of `outer`) reads: its dims are the loops below that
  // axis (`outer` after it, then `update_loops`) its index uses, in that
  // order, each whole; constant extents only. Every load of the param in
  // `body` must be at one index. The copy runs those loops with the guards
  // that involve them; its innermost loop is vectorized in pack_lanes-wide
  // steps where the load is contiguous along it and the extent divides.
  Result<PackPlan> plan_pack(const ComputeDef& st, const StagePlan& plan, const std::vector<Loop>& outer,
                             const std::vector<Loop>& update_loops, const Expr& body,
                             const std::set<std::string>& loop_vars) {
    std::string where = "schedule: pack(" + st.name + ", " + plan.pack_buffer + ", " + plan.pack_axis + "): ";
    auto at = std::find_if(outer.begin(), outer.end(), [&](const Loop& l) { return l.var == plan.pack_axis; });
    if (at == outer.end()) return invalid_argument() << where << "the loop must be outside the register tile (cache_write)";
    std::vector<Loop> below(at + 1, outer.end());
    below.insert(below.end(), update_loops.begin(), update_loops.end());
    std::set<std::string> outside = plan.shared;
    for (auto it = outer.begin(); it != at + 1; ++it) outside.insert(it->var);
    Expr src;
    bool several = false;
    rewrite(body, [&](const Expr& n) -> Expr {
      if (n.kind() != ExprKind::kLoad || n->int_value < 0 || n->name != plan.pack_buffer) return Expr();
      if (!src.defined()) src = n;
      else several = several || src.to_string() != n.to_string();
      return Expr();
    });
    if (!src.defined()) return invalid_argument() << where << "the stage does not read " << plan.pack_buffer;
    if (several) return invalid_argument() << where << "the stage reads " << plan.pack_buffer << " at several indices";
    std::set<std::string> used;
    for (const Expr& a : src->args)
      for (const std::string& v : free_vars(a)) used.insert(v);
    PackPlan out;
    out.source = plan.pack_buffer;
    out.buffer.name = plan.pack_buffer + ".pack";
    out.buffer.dtype = src->dtype;
    std::vector<Loop> loops;
    for (const Loop& l : below) {
      if (!used.count(l.var)) continue;
      auto c = l.extent.as_const();
      if (!c || *c < 1) return invalid_argument() << where << "loop " << l.var << " has no constant extent";
      loops.push_back(Loop{l.var, l.extent, ForKind::kSerial});
      out.buffer.shape.push_back(l.extent);
      out.index.push_back(var(l.var));
    }
    if (loops.empty()) return invalid_argument() << where << "no loop below the axis indexes " << plan.pack_buffer;
    std::set<std::string> copy_vars = loop_vars;
    std::vector<Expr> guards;
    for (const Expr& g : plan.guards) {
      bool mine = false, placeable = true;
      for (const std::string& v : free_vars(g)) {
        if (!loop_vars.count(v)) continue;
        bool in_copy = std::any_of(loops.begin(), loops.end(), [&](const Loop& l) { return l.var == v; });
        mine = mine || in_copy;
        placeable = placeable && (in_copy || outside.count(v) != 0);
      }
      if (!mine) continue;
      if (!placeable) return invalid_argument() << where << "guard " << g.to_string() << " involves loops the copy does not run";
      guards.push_back(g);
    }
    Expr value = src;
    std::vector<Expr> store_idx = out.index;
    const Loop last = loops.back();
    const int64_t extent = *last.extent.as_const(), lanes = plan.pack_lanes;
    bool contiguous = true;
    for (size_t i = 0; i + 1 < src->args.size(); ++i)
      for (const std::string& v : free_vars(src->args[i])) contiguous = contiguous && v != last.var;
    auto step = simplify(substitute(src->args.back(), {{last.var, var(last.var) + int_imm(1)}}) - src->args.back()).as_const();
    if (lanes > 1 && contiguous && step && *step == 1 && extent % lanes == 0) {
      if (extent == lanes) {
        loops.back().kind = ForKind::kVectorized;
      } else {
        std::string o = last.var + ".po", l = last.var + ".pl";
        copy_vars.insert(o);
        copy_vars.insert(l);
        ExprMap to = {{last.var, var(o) * int_imm(lanes) + var(l)}};
        value = substitute(value, to);
        for (Expr& e : store_idx) e = substitute(e, to);
        for (Expr& g : guards) g = substitute(g, to);
        loops.back() = Loop{o, int_imm(extent / lanes), ForKind::kSerial};
        loops.push_back(Loop{l, int_imm(lanes), ForKind::kVectorized});
      }
    }
    out.copy = build_nest(loops, make_store(out.buffer.name, -1, store_idx, value), guards, outside, copy_vars);
    return out;
  }

  Result<Stmt> lower_stage_nest(int s) {
    const ComputeDef& st = stages[s];
    const StagePlan& plan = plans[s];
    // The loops a compute_at shares with the consumer are the consumer's.
    auto own = [&](const std::vector<Loop>& loops) {
      std::vector<Loop> out;
      for (const Loop& l : loops)
        if (!plan.shared.count(l.var)) out.push_back(l);
      return out;
    };
    auto p = param_index.find(st.name);
    int out_index = p == param_index.end() ? -1 : p->second;

    std::set<std::string> loop_vars;
    for (const auto& l : plan.spatial) loop_vars.insert(l.var);
    for (const auto& l : plan.reduce) loop_vars.insert(l.var);
    // Loop variables range over [0, extent): with these bounds an index
    // like (o*16 + i) floordiv 16 of a split axis simplifies to o.
    SymbolBounds loop_bounds;
    for (const auto* loops : {&plan.spatial, &plan.reduce}) {
      for (const Loop& l : *loops) {
        auto c = l.extent.as_const();
        if (c && *c >= 1) loop_bounds[l.var] = Interval{0, *c - 1};
        else loop_bounds[l.var] = Interval{0, std::nullopt};
      }
    }
    std::vector<Expr> out_indices;
    for (const auto& a : st.axes) out_indices.push_back(simplify(plan.axis_value.at(a), loop_bounds));
    auto to_loops = [&](const Expr& e) { return simplify(substitute(e, plan.axis_value), loop_bounds); };
    Expr body = to_loops(cast_to(st.dtype, st.body));

    if (!is_reduction(st)) {
      for (const auto& l : plan.spatial) {
        if (l.kind == ForKind::kVectorized && l.var != plan.spatial.back().var) {
          return invalid_argument() << "schedule: vectorize(" << st.name << ", " << l.var
                                    << ") of a loop that is not innermost";
        }
      }
      Stmt store = make_store(st.name, out_index, out_indices, body);
      std::vector<Expr> all = plan.guards;
      all.insert(all.end(), plan.store_guards.begin(), plan.store_guards.end());
      return build_nest(own(plan.spatial), store, all, plan.shared, loop_vars);
    }

    // Reduction: outer spatial loops (up to and including the cache_write axis),
    // inner spatial loops accumulated in a local buffer, reduce loops.
    size_t split_at = plan.spatial.size();
    if (!plan.cache_axis.empty()) {
      auto it = std::find_if(plan.spatial.begin(), plan.spatial.end(),
                             [&](const Loop& l) { return l.var == plan.cache_axis; });
      if (it == plan.spatial.end()) {
        return invalid_argument() << "schedule: cache_write(" << st.name << ", " << plan.cache_axis
                                  << "): the axis no longer exists";
      }
      split_at = static_cast<size_t>(it - plan.spatial.begin()) + 1;
    }
    std::vector<Loop> outer(plan.spatial.begin(), plan.spatial.begin() + static_cast<long>(split_at));
    std::vector<Loop> inner(plan.spatial.begin() + static_cast<long>(split_at), plan.spatial.end());
    for (size_t i = 0; i < outer.size(); ++i) {
      if (outer[i].kind == ForKind::kVectorized) {
        return invalid_argument() << "schedule: vectorize(" << st.name << ", " << outer[i].var
                                  << "): the reduce loops are inside it (cache_write moves them out)";
      }
    }
    for (size_t i = 0; i + 1 < inner.size(); ++i) {
      if (inner[i].kind == ForKind::kVectorized) {
        return invalid_argument() << "schedule: vectorize(" << st.name << ", " << inner[i].var
                                  << ") of a loop that is not innermost";
      }
    }

    // hoist_reduce: that reduce loop runs among the outer loops, just inside
    // hoisted_at; the tile resumes from and saves partial results in the
    // stage's buffer (below).
    std::vector<Loop> reduce_loops = plan.reduce;
    std::optional<Loop> hoisted;
    if (!plan.hoisted.empty()) {
      auto it = std::find_if(reduce_loops.begin(), reduce_loops.end(),
                             [&](const Loop& l) { return l.var == plan.hoisted; });
      if (it == reduce_loops.end()) {
        return invalid_argument() << "schedule: hoist_reduce(" << st.name << ", " << plan.hoisted
                                  << "): the axis no longer exists";
      }
      if (plan.epilogue >= 0 && !plan.epilogue_axis.empty()) {
        return invalid_argument() << "schedule: hoist_reduce(" << st.name
                                  << ") with a deferred epilogue (fuse_epilogue with an axis)";
      }
      if (plan.overlapped) {
        // Two tiles sharing points would each add a block to the other's saved partial sums.
        return invalid_argument() << "schedule: hoist_reduce(" << st.name
                                  << ") with overlapping tiles (split_overlap): points two tiles share would get a block twice";
      }
      if (auto c = it->extent.as_const(); !c || *c < 1) {
        // With no block the tile would never run: no init, no write-back.
        return invalid_argument() << "schedule: hoist_reduce(" << st.name << ", " << plan.hoisted
                                  << ") needs a constant extent of at least 1";
      }
      hoisted = *it;
      reduce_loops.erase(it);
      size_t pos = 0;
      if (!plan.hoisted_at.empty()) {
        auto at = std::find_if(outer.begin(), outer.end(), [&](const Loop& l) { return l.var == plan.hoisted_at; });
        if (at == outer.end()) {
          return invalid_argument() << "schedule: hoist_reduce(" << st.name << ", " << plan.hoisted << ", "
                                    << plan.hoisted_at << "): the place is inside the register tile (cache_write) or no longer exists";
        }
        pos = static_cast<size_t>(at - outer.begin()) + 1;
      }
      outer.insert(outer.begin() + static_cast<long>(pos), *hoisted);
    }

    Buffer acc;
    acc.name = st.name + ".acc";
    acc.dtype = st.dtype;
    std::vector<Expr> acc_idx;
    for (const auto& l : inner) {
      acc.shape.push_back(l.extent);
      acc_idx.push_back(var(l.var));
    }
    if (inner.empty()) {
      acc.shape.push_back(int_imm(1));
      acc_idx.push_back(int_imm(0));
    } else if (auto c = inner.back().extent.as_const(); c && inner.back().kind == ForKind::kVectorized &&
                                                           inner.size() > 1 && (*c & (*c - 1)) != 0) {
      // Rows of a vector width that is not a power of two (14 of a 14x14
      // plane) start at power-of-two offsets, so that LLVM keeps each row of
      // the tile in a register instead of storing and reloading it per step.
      int64_t padded = 1;
      while (padded < *c) padded *= 2;
      acc.shape.back() = int_imm(padded);
    }
    std::set<std::string> bound_outside;
    for (const auto& l : outer) bound_outside.insert(l.var);

    Expr acc_load = load(acc.name, -1, acc.dtype, acc_idx);
    Expr init = st.init.defined() ? to_loops(cast_to(st.dtype, st.init))
                                  : default_init(st.combiner, st.dtype);
    // rfactor: the reduce loop rf runs innermost, vectorized, each lane
    // accumulating its own partial (from the combiner's neutral element) in
    // lanes[inner..., rf]; the lanes are then combined, from `init`, into acc,
    // which the write-back reads as without rfactor.
    std::optional<Loop> rf;
    Buffer lanes;
    std::vector<Expr> lane_idx = acc_idx;
    if (!plan.rfactor_axis.empty()) {
      auto it = std::find_if(reduce_loops.begin(), reduce_loops.end(),
                             [&](const Loop& l) { return l.var == plan.rfactor_axis; });
      if (it == reduce_loops.end()) {
        return invalid_argument() << "schedule: rfactor(" << st.name << ", " << plan.rfactor_axis
                                  << "): the axis no longer exists";
      }
      for (const Loop& l : inner)
        if (l.kind == ForKind::kVectorized) {
          return invalid_argument() << "schedule: rfactor(" << st.name << ") and vectorize(" << st.name << ", "
                                    << l.var << "): one vector loop per stage";
        }
      rf = *it;
      rf->kind = ForKind::kVectorized;
      reduce_loops.erase(it);
      lanes.name = st.name + ".lanes";
      lanes.dtype = st.dtype;
      lanes.shape = acc.shape;
      lanes.shape.push_back(rf->extent);
      lane_idx.push_back(var(rf->var));
    }
    Expr result = acc_load;
    if (st.finalize.defined()) {
      result = to_loops(cast_to(st.dtype, substitute(st.finalize, {{"acc", acc_load}})));
    }
    // The write-back: this stage's value, or the fused epilogue computed from it.
    std::string store_name = st.name;
    int store_index = out_index;
    const bool deferred = plan.epilogue >= 0 && !plan.epilogue_axis.empty();
    if (plan.epilogue >= 0 && !deferred) {
      const ComputeDef& E = stages[static_cast<size_t>(plan.epilogue)];
      ExprMap at;
      for (size_t a = 0; a < E.axes.size(); ++a) at[E.axes[a]] = out_indices[a];
      Expr acc_value = result;
      Expr v = rewrite(substitute(cast_to(E.dtype, E.body), at), [&](const Expr& n) -> Expr {
        if (n.kind() == ExprKind::kLoad && n->int_value == -1 && n->name == st.name) return acc_value;
        return Expr();
      });
      result = simplify(v, loop_bounds);
      store_name = E.name;
      auto pe = param_index.find(E.name);
      store_index = pe == param_index.end() ? -1 : pe->second;
    }
    std::vector<Loop> update_loops = reduce_loops;
    update_loops.insert(update_loops.end(), inner.begin(), inner.end());
    if (rf) update_loops.push_back(*rf);
    // The tile: init, update and write-back nests under `guards` (the
    // write-back also under split_padded's store guards), in the accumulator.
    // prefetch: at the top of each step of the innermost (non-lane) reduce loop.
    auto with_prefetch = [&](Stmt update_nest) {
      if (plan.prefetch_axis.empty() || reduce_loops.empty()) return update_nest;
      std::vector<Loop> below = inner;
      if (rf) below.push_back(*rf);
      return prepend_in_loop(update_nest, reduce_loops.back().var, prefetches(body, plan.prefetch_axis, plan.prefetch_distance, below));
    };
    // Stores to the accumulator under a guard on the vector loop (a partial
    // tile's columns) keep every lane and select the old value in the lanes
    // the guard excludes (their loads masked): a masked store would keep the
    // tile in memory instead of registers (a depthwise tile narrower than its
    // vector on a symbolic plane ran 5x slower). The other guards stay ifs;
    // the write-back keeps all of them.
    const bool lanes_guarded = !inner.empty() && inner.back().kind == ForKind::kVectorized;
    // With a guard on the lanes, the guards on the tile's rows join the
    // select too (the rows past the edge compute nothing they store, their
    // loads masked): no branch per row in the tile.
    auto acc_store = [&](const std::vector<Loop>& loops, const std::vector<Expr>& gs, Expr value, Expr otherwise) {
      std::set<std::string> in_nest;
      for (const Loop& l : loops) in_nest.insert(l.var);
      bool on_lane = false;
      std::vector<Expr> local;  // guards build_nest would place in these loops
      for (const Expr& g : gs) {
        bool placeable = true, inside = false;
        for (const std::string& v : free_vars(g)) {
          if (!loop_vars.count(v)) continue;
          inside = inside || in_nest.count(v) != 0;
          placeable = placeable && (in_nest.count(v) != 0 || bound_outside.count(v) != 0);
        }
        if (!placeable || !inside) continue;
        local.push_back(g);
        for (const std::string& v : free_vars(g)) on_lane = on_lane || (lanes_guarded && v == inner.back().var);
      }
      if (!on_lane) return build_nest(loops, make_store(acc.name, -1, acc_idx, value), gs, bound_outside, loop_vars);
      Expr cond = local[0];
      for (size_t i = 1; i < local.size(); ++i) cond = logical_and(cond, local[i]);
      return build_nest(loops, make_store(acc.name, -1, acc_idx, select(cond, value, otherwise)), {}, bound_outside,
                        loop_vars);
    };
    auto tile = [&](const std::vector<Expr>& guards, const Expr& body) {
      Stmt init_nest = acc_store(inner, guards, init, default_init(st.combiner, st.dtype));
      std::vector<Expr> final_guards = guards;
      final_guards.insert(final_guards.end(), plan.store_guards.begin(), plan.store_guards.end());
      Stmt final_nest = build_nest(inner, make_store(store_name, store_index, out_indices, result), final_guards,
                                   bound_outside, loop_vars);
      if (hoisted) {
        // First block: the init; later ones resume from the partial result
        // (its valid points; padded columns restart from the init, never
        // stored). Last block: the write-back; earlier ones save the partial.
        Stmt resume = acc_store(inner, final_guards, load(st.name, out_index, st.dtype, out_indices), init);
        Stmt save = build_nest(inner, make_store(st.name, out_index, out_indices, acc_load), final_guards, bound_outside,
                               loop_vars);
        init_nest = make_if(eq(var(hoisted->var), int_imm(0)), init_nest, resume);
        final_nest = make_if(eq(var(hoisted->var), simplify(hoisted->extent - int_imm(1))), final_nest, save);
      }
      if (!rf) {
        // What the write-back reads from params (a residual) is prefetched
        // at the start of the tile, so it arrives during the reduction: a
        // tile stores to as many rows as it has, which defeats the hardware
        // prefetcher (measured faster on resnet50's residual 1x1 convolutions).
        std::vector<Stmt> seq = {init_nest};
        for (Stmt& pf : epilogue_prefetches(result, inner)) seq.push_back(std::move(pf));
        Stmt update_nest = with_prefetch(acc_store(update_loops, guards, combine(st.combiner, acc_load, body), acc_load));
        seq.push_back(update_nest);
        seq.push_back(final_nest);
        return make_allocate(acc, make_seq(seq));
      }
      // Guards that involve reduce loops (the tail of a split reduce axis) mask
      // lanes of the update only: unplaceable in the other nests, where every
      // lane is written (a masked-off lane keeps the neutral element).
      std::vector<Loop> lane_loops = inner;
      lane_loops.push_back(*rf);
      Expr lane_load = load(lanes.name, -1, lanes.dtype, lane_idx);
      Stmt lanes_init = build_nest(lane_loops, make_store(lanes.name, -1, lane_idx, default_init(st.combiner, st.dtype)),
                                   guards, bound_outside, loop_vars);
      Stmt update_nest = with_prefetch(build_nest(
          update_loops, make_store(lanes.name, -1, lane_idx, combine(st.combiner, lane_load, body)), guards,
          bound_outside, loop_vars));
      Loop serial_rf = *rf;
      serial_rf.kind = ForKind::kSerial;
      std::vector<Loop> fold_loops = {serial_rf};  // outside any vector loop of `inner`
      fold_loops.insert(fold_loops.end(), inner.begin(), inner.end());
      Stmt fold_nest = build_nest(fold_loops, make_store(acc.name, -1, acc_idx, combine(st.combiner, acc_load, lane_load)),
                                  guards, bound_outside, loop_vars);
      return make_allocate(acc, make_allocate(lanes, make_seq({lanes_init, update_nest, init_nest, fold_nest, final_nest})));
    };
    // pack: the region of one input the loops below pack_axis read, copied
    // into a local buffer at the start of each of its iterations.
    PackPlan pack;
    if (!plan.pack_buffer.empty()) {
      if (deferred) {
        return invalid_argument() << "schedule: pack(" << st.name << ") with a deferred epilogue (fuse_epilogue with an axis)";
      }
      KILN_ASSIGN_OR_RETURN(pack, plan_pack(st, plan, outer, update_loops, body, loop_vars));
      body = pack.use(body);
    }
    Stmt alloc = tile(plan.guards, body);
    // A tile whose guards hold at the last point of every inner loop holds
    // them everywhere in the tile (each guard is value < limit with value
    // non-decreasing in the inner loop variables): such full tiles run a copy
    // without the guards, so the guard of a symbolic split is not evaluated
    // per row inside the reduction loop; only the last tile pays for it.
    std::vector<Expr> inner_guards, other_guards;
    std::set<std::string> inner_vars;
    for (const auto& l : inner) inner_vars.insert(l.var);
    for (const Expr& g : plan.guards) {
      bool uses_inner = false;
      for (const std::string& v : free_vars(g)) uses_inner = uses_inner || inner_vars.count(v) != 0;
      (uses_inner ? inner_guards : other_guards).push_back(g);
    }
    bool monotone = !inner_guards.empty();
    ExprMap last;
    for (const auto& l : inner) {
      auto c = l.extent.as_const();
      if (!c || *c < 1) monotone = false;
      else last[l.var] = int_imm(*c - 1);
    }
    Expr full;
    for (const Expr& g : inner_guards) {
      if (!monotone) break;
      if (g.kind() != ExprKind::kLT) {
        monotone = false;
        break;
      }
      for (const std::string& v : free_vars(g->args[1])) monotone = monotone && !inner_vars.count(v);
      for (const auto& l : inner) {
        auto step = simplify(substitute(g->args[0], {{l.var, var(l.var) + int_imm(1)}}) - g->args[0]).as_const();
        monotone = monotone && step && *step >= 0;
      }
      Expr at_last = simplify(substitute(g, last));
      full = full.defined() ? logical_and(full, at_last) : at_last;
    }
    // Tiles that read no padding: a padding select in the update whose
    // condition holds at every point of the tile (checked at the tile's
    // extreme corner) is replaced by its load with the clamps of the index
    // removed, so interior tiles load plain vectors instead of masked ones
    // (x86's masked loads, vmaskmovps, ran a depthwise kernel several times
    // slower, varying from process to process).
    std::vector<Loop> tile_loops = inner;
    tile_loops.insert(tile_loops.end(), reduce_loops.begin(), reduce_loops.end());
    if (rf) tile_loops.push_back(*rf);
    Expr interior;
    Expr interior_body = to_loops(strip_padding(cast_to(st.dtype, st.body), to_loops, tile_loops, &interior));
    if (pack.copy) interior_body = pack.use(interior_body);
    Expr fast_cond = monotone && full.defined() ? full : Expr();
    if (interior.defined()) fast_cond = fast_cond.defined() ? logical_and(fast_cond, interior) : interior;
    if (fast_cond.defined()) {
      Stmt fast = tile(monotone && full.defined() ? other_guards : plan.guards, interior_body);
      auto always = simplify(fast_cond).as_const();
      if (always && *always != 0) alloc = fast;
      else if (!always) alloc = make_if(fast_cond, fast, alloc);
    }
    if (!deferred) {
      Stmt nest = build_nest(own(outer), alloc, plan.guards, plan.shared, loop_vars);
      if (!pack.copy) return nest;
      bool found = false;
      nest = wrap_loop_body(nest, plan.pack_axis, found,
                            [&](const Stmt& b) { return make_allocate(pack.buffer, make_seq({pack.copy, b})); });
      if (!found) {
        return invalid_argument() << "schedule: pack(" << st.name << ", " << plan.pack_buffer << ", " << plan.pack_axis
                                  << "): the loop is shared with a compute_at consumer";
      }
      return nest;
    }
    return with_deferred_epilogue(s, outer, inner, out_indices, alloc, loop_vars, loop_bounds);
  }

  // fuse_epilogue(stage, axis): the reduction writes its own buffer; after
  // each iteration of loop `axis` (outside the register tile), a nest over the
  // same inner loops (serial where they were parallel) computes the epilogue
  // from the values just written, while they are in cache. A transcendental
  // activation on a short tile (depthwise, a 1x1 convolution of few input
  // channels) then runs as a stream of independent vectors instead of one
  // latency chain after each tile's multiply-adds, which the out-of-order
  // window cannot overlap with the next tile.
  Result<Stmt> with_deferred_epilogue(int s, const std::vector<Loop>& outer, const std::vector<Loop>& inner,
                                      const std::vector<Expr>& out_indices, Stmt tile_nest,
                                      const std::set<std::string>& loop_vars, const SymbolBounds& loop_bounds) {
    const ComputeDef& st = stages[s];
    const StagePlan& plan = plans[s];
    auto it = std::find_if(outer.begin(), outer.end(), [&](const Loop& l) { return l.var == plan.epilogue_axis; });
    if (it == outer.end()) {
      return invalid_argument() << "schedule: fuse_epilogue(" << st.name << ", " << plan.epilogue_axis
                                << "): the axis is inside the register tile (cache_write) or no longer exists";
    }
    size_t at = static_cast<size_t>(it - outer.begin()) + 1;
    std::vector<Loop> top(outer.begin(), outer.begin() + static_cast<long>(at));
    std::vector<Loop> below(outer.begin() + static_cast<long>(at), outer.end());
    std::set<std::string> bound_top;
    for (const Loop& l : top) bound_top.insert(l.var);
    Stmt reduce_nest = build_nest(below, tile_nest, plan.guards, bound_top, loop_vars);
    const ComputeDef& E = stages[static_cast<size_t>(plan.epilogue)];
    ExprMap point;
    for (size_t a = 0; a < E.axes.size(); ++a) point[E.axes[a]] = out_indices[a];
    Expr value = simplify(substitute(cast_to(E.dtype, E.body), point), loop_bounds);
    auto pe = param_index.find(E.name);
    Stmt store = make_store(E.name, pe == param_index.end() ? -1 : pe->second, out_indices, value);
    std::vector<Loop> epi_loops = below;
    epi_loops.insert(epi_loops.end(), inner.begin(), inner.end());
    for (Loop& l : epi_loops)
      if (l.kind == ForKind::kParallel) l.kind = ForKind::kSerial;
    std::vector<Expr> guards = plan.guards;
    guards.insert(guards.end(), plan.store_guards.begin(), plan.store_guards.end());
    Stmt epi_nest = build_nest(epi_loops, store, guards, bound_top, loop_vars);
    Stmt body = make_seq({reduce_nest, epi_nest});
    if (std::optional<Stmt> folded = fold_deferred_buffer(s, out_indices, bound_top, body)) body = *folded;
    return build_nest(top, body, plan.guards, {}, loop_vars);
  }

  // `body` (one iteration of the epilogue's axis: the tile nest, then the
  // epilogue over what it wrote) with the stage's buffer allocated in it,
  // its dims whose index is fixed by the loops at or outside the axis
  // (`bound_top`) cut to one element; nullopt where the buffer stays whole:
  // a param, a hoisted reduction (hoist_reduce keeps partial sums in it
  // across iterations), or no dim fixed there.
  std::optional<Stmt> fold_deferred_buffer(int s, const std::vector<Expr>& out_indices,
                                           const std::set<std::string>& bound_top, const Stmt& body) {
    const StagePlan& plan = plans[static_cast<size_t>(s)];
    const ComputeDef& st = stages[static_cast<size_t>(s)];
    if (!plan.hoisted.empty() || param_index.count(st.name)) return std::nullopt;
    if (out_indices.size() != st.shape.size()) return std::nullopt;
    std::vector<Expr> base(st.shape.size());
    Buffer b{st.name, st.dtype, st.shape};
    bool any = false;
    for (size_t d = 0; d < out_indices.size(); ++d) {
      if (st.shape[d].as_const() == int64_t{1}) continue;  // one element already (its index may read 0)
      bool outer_only = true;
      for (const std::string& v : free_vars(out_indices[d])) outer_only = outer_only && bound_top.count(v);
      if (!outer_only) continue;
      base[d] = out_indices[d];
      b.shape[d] = Expr(int64_t{1});
      any = true;
    }
    if (!any) return std::nullopt;
    // plan_epilogues paired the stage with an epilogue that alone reads it,
    // at its own point; the tile writes it at that point too: every access
    // in `body` is at out_indices, so at 0 in each folded dim once relocated.
    folded_buffers.insert(st.name);
    return make_allocate(b, relocate(body, st.name, base));
  }

  Result<Stmt> lower_from(size_t s) {
    // Inlined stages have no nest; a fused epilogue is written by its reduction's nest.
    // A stage computed at another is lowered inside that one's nest.
    while (s < stages.size() && (plans[s].inlined || plans[s].fused_into >= 0 || plans[s].attach_to >= 0)) ++s;
    if (s == stages.size()) return Stmt();
    KILN_ASSIGN_OR_RETURN(Stmt nest, lower_stage(static_cast<int>(s)));
    KILN_ASSIGN_OR_RETURN(Stmt rest, lower_from(s + 1));
    Stmt body = rest ? make_seq({nest, rest}) : nest;
    // The buffer this nest writes, when it is an intermediate: the stage's own,
    // or that of the epilogue it computes (then its own is never written).
    int e = plans[s].epilogue;
    const ComputeDef& written = e >= 0 ? stages[static_cast<size_t>(e)] : stages[s];
    if (!param_index.count(written.name)) {
      Buffer b{written.name, written.dtype, written.shape};
      body = make_allocate(b, body);
    }
    // A deferred epilogue reads the stage's own buffer too (allocated inside
    // the epilogue's loop where it folds); hoist_reduce keeps partial results in it.
    if (e >= 0 && (!plans[s].epilogue_axis.empty() || !plans[s].hoisted.empty()) && !param_index.count(stages[s].name) &&
        !folded_buffers.count(stages[s].name)) {
      Buffer b{stages[s].name, stages[s].dtype, stages[s].shape};
      body = make_allocate(b, body);
    }
    return body;
  }

  std::vector<std::string> sym_names() {
    std::set<std::string> syms;
    auto add_vars = [&](const Expr& e, const std::set<std::string>& bound) {
      if (!e.defined()) return;
      for (auto& v : free_vars(e)) {
        if (!bound.count(v)) syms.insert(v);
      }
    };
    for (const auto& b : k.params) {
      for (const auto& d : b.shape) add_vars(d, {});
    }
    for (const auto& st : k.stages) {
      for (const auto& d : st.shape) add_vars(d, {});
      for (const auto& d : st.reduce_extents) add_vars(d, {});
      std::set<std::string> bound(st.axes.begin(), st.axes.end());
      bound.insert(st.reduce_axes.begin(), st.reduce_axes.end());
      add_vars(st.body, bound);
      add_vars(st.init, bound);
      bound.insert("acc");
      add_vars(st.finalize, bound);
    }
    return {syms.begin(), syms.end()};
  }
};

// A kernel without the modulo indices that hold only for some symbol values.
// Broadcasting an input whose dim may be 1 (seq against min(seq, 1024)) reads
// it at index mod(i, d): an integer division per element and, along the
// vector, a gather. Where the axis's extent E is at most d, mod(i, d) = i for
// every i in [0, E), whatever the operands are. `fast` has those modulos
// replaced; `cond` is the conjunction of the E <= d that simplification could
// not decide (undefined when every one was proved or none was found).
struct ModuloSpecialization {
  KernelDef fast;
  Expr cond;
  bool changed = false;
};

ModuloSpecialization specialize_modulo(const KernelDef& k) {
  ModuloSpecialization out{k, Expr(), false};
  std::vector<Expr> conds;
  for (ComputeDef& st : out.fast.stages) {
    ExprMap extents;
    for (size_t i = 0; i < st.axes.size(); ++i) extents[st.axes[i]] = st.shape[i];
    for (size_t i = 0; i < st.reduce_axes.size(); ++i) extents[st.reduce_axes[i]] = st.reduce_extents[i];
    auto drop_modulo = [&](const Expr& e) -> Expr {
      if (e.kind() != ExprKind::kMod || e.dtype() != DType::kInt64) return Expr();
      const Expr& i = e->args[0];
      const Expr& d = e->args[1];
      if (!i.is_var() || d.is_const()) return Expr();
      auto it = extents.find(i->name);
      if (it == extents.end()) return Expr();
      // The condition is checked once per call: d must be a function of the
      // symbols alone (no axis, no load).
      bool invariant = true;
      rewrite(d, [&](const Expr& x) -> Expr {
        invariant = invariant && x.kind() != ExprKind::kLoad && x.kind() != ExprKind::kCall;
        return Expr();
      });
      for (const std::string& v : free_vars(d)) invariant = invariant && !extents.count(v);
      if (!invariant) return Expr();
      Expr c = simplify(le(it->second, d));
      if (c.kind() == ExprKind::kIntImm) {
        if (c->int_value == 0) return Expr();
      } else {
        bool seen = false;
        for (const Expr& o : conds) seen = seen || o.same_as(c);
        if (!seen) conds.push_back(c);
      }
      out.changed = true;
      return i;
    };
    for (Expr* e : {&st.body, &st.init, &st.finalize})
      if (e->defined()) *e = rewrite(*e, drop_modulo);
  }
  for (const Expr& c : conds) out.cond = out.cond.defined() ? logical_and(out.cond, c) : c;
  return out;
}

// Applies f to every expression of s: extents, indices, values, conditions
// and allocated shapes.
Stmt map_exprs(const Stmt& s, const std::function<Expr(const Expr&)>& f) {
  if (!s) return s;
  auto n = std::make_shared<StmtNode>(*s);
  auto apply = [&](Expr& e) {
    if (e.defined()) e = f(e);
  };
  apply(n->extent);
  apply(n->value);
  apply(n->cond);
  for (Expr& e : n->indices) apply(e);
  for (Expr& e : n->buffer.shape) apply(e);
  n->body = map_exprs(n->body, f);
  n->then_case = map_exprs(n->then_case, f);
  n->else_case = map_exprs(n->else_case, f);
  for (Stmt& c : n->seq) c = map_exprs(c, f);
  return n;
}

// The tail of a split axis masks vector lanes: `for o { for i in 0..16
// vectorized { if (i + 16*o < E) ... } }`. Every iteration then runs masked
// loads and stores, and a reduction's lane accumulator, stored under a mask,
// stays in memory (a softmax over a symbolic row ran at half the speed of the
// same kernel with the row length known). The loop is peeled: o in
// [0, M) runs without such guards, where M is the number of iterations whose
// every lane passes them, and the rest (at most a few) keeps them. A guard
// qualifies when it is `c*o + r < E` inside a vectorized loop below o, with c a
// positive constant, r non-decreasing in loop variables of constant extent
// below o, and E free of o and of those variables. Loops with a loop of
// symbolic extent below them are left alone (their bodies are register tiles
// versioned already, and copying them would double the code again).
struct PeelResult {
  Stmt stmt;
  bool peeled = false;
};

class LanePeeler {
 public:
  PeelResult run(const Stmt& s) {
    if (!s) return {s, false};
    switch (s->kind) {
      case StmtKind::kFor: {
        PeelResult body = run(s->body);
        Stmt loop = body.stmt == s->body ? s : make_for(s->var, s->extent, s->for_kind, body.stmt);
        if (body.peeled || s->for_kind != ForKind::kSerial) return {loop, body.peeled};
        return peel(loop);
      }
      case StmtKind::kIfThenElse: {
        PeelResult t = run(s->then_case), e = run(s->else_case);
        if (t.stmt == s->then_case && e.stmt == s->else_case) return {s, t.peeled || e.peeled};
        return {make_if(s->cond, t.stmt, e.stmt), t.peeled || e.peeled};
      }
      case StmtKind::kAllocate: {
        PeelResult b = run(s->body);
        return {b.stmt == s->body ? s : make_allocate(s->buffer, b.stmt), b.peeled};
      }
      case StmtKind::kSeq: {
        std::vector<Stmt> seq;
        bool changed = false, peeled = false;
        for (const Stmt& c : s->seq) {
          PeelResult r = run(c);
          changed = changed || r.stmt != c;
          peeled = peeled || r.peeled;
          seq.push_back(r.stmt);
        }
        return {changed ? make_seq(std::move(seq)) : s, peeled};
      }
      default: return {s, false};
    }
  }

 private:
  struct Scan {
    std::string o;
    std::map<std::string, int64_t> below;  // loop var -> constant extent
    bool symbolic_loop = false;
    std::vector<Expr> limits;  // M of each qualifying guard
    std::vector<Expr> guards;  // the qualifying conditions
  };

  static void scan(const Stmt& s, bool in_vector, Scan& sc) {
    if (!s) return;
    switch (s->kind) {
      case StmtKind::kFor: {
        auto c = s->extent.as_const();
        if (!c) {
          sc.symbolic_loop = true;
          return;
        }
        sc.below[s->var] = *c;
        scan(s->body, in_vector || s->for_kind == ForKind::kVectorized, sc);
        sc.below.erase(s->var);
        return;
      }
      case StmtKind::kIfThenElse:
        if (in_vector && !s->else_case) qualify(s->cond, sc);  // a lane guard has no else
        scan(s->then_case, in_vector, sc);
        scan(s->else_case, in_vector, sc);
        return;
      case StmtKind::kAllocate: scan(s->body, in_vector, sc); return;
      case StmtKind::kSeq:
        for (const Stmt& c : s->seq) scan(c, in_vector, sc);
        return;
      default: return;
    }
  }

  static void qualify(const Expr& cond, Scan& sc) {
    if (cond.kind() != ExprKind::kLT || cond->args[0].dtype() != DType::kInt64) return;
    const Expr& lhs = cond->args[0];
    const Expr& limit = cond->args[1];
    for (const std::string& v : free_vars(limit))
      if (v == sc.o || sc.below.count(v)) return;
    auto step = simplify(substitute(lhs, {{sc.o, var(sc.o) + int_imm(1)}}) - lhs).as_const();
    if (!step || *step <= 0) return;
    Expr rest = simplify(substitute(lhs, {{sc.o, int_imm(0)}}));
    ExprMap last;
    for (const std::string& v : free_vars(rest)) {
      auto it = sc.below.find(v);
      if (it == sc.below.end() || it->second < 1) return;
      auto inc = simplify(substitute(rest, {{v, var(v) + int_imm(1)}}) - rest).as_const();
      if (!inc || *inc < 0) return;
      last[v] = int_imm(it->second - 1);
    }
    auto rmax = simplify(substitute(rest, last)).as_const();
    if (!rmax) return;
    // c*o + rmax < E  <=>  o < floordiv(E - rmax - 1, c) + 1 (o >= 0).
    sc.limits.push_back(floordiv(limit - int_imm(*rmax + 1), int_imm(*step)) + int_imm(1));
    sc.guards.push_back(cond);
  }

  static PeelResult peel(const Stmt& loop) {
    Scan sc;
    sc.o = loop->var;
    scan(loop->body, false, sc);
    if (sc.symbolic_loop || sc.guards.empty()) return {loop, false};
    Expr m = sc.limits[0];
    for (size_t i = 1; i < sc.limits.size(); ++i) m = min(m, sc.limits[i]);
    m = simplify(max(int_imm(0), min(loop->extent, m)));
    // Guards are replaced only where this loop's own scan found them (inside
    // a vectorized loop); the same condition elsewhere stays.
    std::function<Stmt(const Stmt&, bool)> drop = [&](const Stmt& s, bool in_vector) -> Stmt {
      if (!s) return s;
      auto n = std::make_shared<StmtNode>(*s);
      if (s->kind == StmtKind::kIfThenElse && in_vector && !s->else_case) {
        for (const Expr& g : sc.guards)
          if (g.same_as(s->cond)) return drop(s->then_case, in_vector);
      }
      bool v = in_vector || (s->kind == StmtKind::kFor && s->for_kind == ForKind::kVectorized);
      n->body = drop(n->body, v);
      n->then_case = drop(n->then_case, v);
      n->else_case = drop(n->else_case, v);
      for (Stmt& c : n->seq) c = drop(c, v);
      return n;
    };
    Stmt main = make_for(loop->var, m, ForKind::kSerial, drop(loop->body, false));
    if (auto always = simplify(loop->extent - m).as_const(); always && *always == 0) return {main, true};
    // The tail: one iteration (a constant split) is the body at o = m.
    Expr rest = simplify(loop->extent - m);
    auto one = rest.as_const();
    ExprMap shift = {{loop->var, one && *one == 1 ? m : var(loop->var) + m}};
    Stmt tail = map_exprs(loop->body, [&](const Expr& e) { return simplify(substitute(e, shift)); });
    if (!one || *one != 1) tail = make_for(loop->var, rest, ForKind::kSerial, tail);
    return {make_seq({main, tail}), true};
  }
};

Result<PrimFunc> lower_one(const KernelDef& k, const Schedule& s) {
  Lowerer l(k);
  KILN_RETURN_IF_ERROR(l.init());
  for (const Primitive& p : s.prims) KILN_RETURN_IF_ERROR(l.apply(p));
  KILN_RETURN_IF_ERROR(l.inline_stages());
  l.plan_epilogues();
  KILN_RETURN_IF_ERROR(l.plan_attachments());
  PrimFunc f;
  f.name = k.name;
  f.params = k.params;
  f.sym_names = l.sym_names();
  KILN_ASSIGN_OR_RETURN(Stmt body, l.lower_from(0));
  f.body = body ? LanePeeler().run(body).stmt : make_seq({});
  return f;
}

}  // namespace

Result<PrimFunc> lower(const KernelDef& k, const Schedule& s) {
  // split_padded evaluates a reduction's body past an axis's extent (only
  // its stores are guarded): there i mod d and i differ, so no copy without
  // modulos.
  bool padded = false;
  for (const Primitive& p : s.prims) padded = padded || p.kind == "split_padded";
  ModuloSpecialization m = padded ? ModuloSpecialization{k, Expr(), false} : specialize_modulo(k);
  if (!m.changed) return lower_one(k, s);
  Result<PrimFunc> lowered = lower_one(m.fast, s);
  if (!lowered.is_ok()) return lower_one(k, s);
  PrimFunc fast = std::move(*lowered);
  if (!m.cond.defined()) return fast;
  // Two copies: the one without modulos when every E <= d holds at run time
  // (checked once per call), the general one otherwise.
  KILN_ASSIGN_OR_RETURN(PrimFunc f, lower_one(k, s));
  f.body = make_if(m.cond, fast.body, f.body);
  return f;
}

}  // namespace kiln::tir
