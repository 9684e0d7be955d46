// The generic schedule space of kernels without a candidate (strategy.h):
// tir::default_schedule edited per stage by four knobs.
//   vec     elementwise stages whose default vectorizes the whole innermost
//           axis: 0 keeps that; v > 0 splits it into vectors of v elements
//           (half a target vector to four), the last one guarded
//   unroll  with vec > 0: that many vectors per iteration, unrolled
//   par     with several threads: 0 the default parallel loop, 1 none (the
//           kernel runs on one thread), 2 the next loop inward that has work
//   red     reductions the default tiles or splits into vector lanes
//           (rfactor): 0 keeps that, 1 the plain schedule (output tile
//           accumulated in registers, innermost spatial axis vectorized)
// A knob value that changes no stage of the kernel is not in its space, nor
// a point where some knob, set back to its default, gives the same
// schedule: the points of a space are different schedules.
#include <algorithm>
#include <set>

#include "strategy/strategy.h"
#include "strategy/template.h"

namespace kiln::strategy {

namespace {

// Every knob's default, the default schedule's (also the value of its absence).
int64_t default_of(const std::string& knob) { return knob == "unroll" ? 1 : 0; }

bool has_prim(const std::vector<tir::Primitive>& ps, const char* kind) {
  return std::any_of(ps.begin(), ps.end(), [&](const tir::Primitive& p) { return p.kind == kind; });
}

bool mentions(const std::vector<tir::Primitive>& ps, const std::string& axis) {
  for (const tir::Primitive& p : ps)
    if (std::find(p.axes.begin(), p.axes.end(), axis) != p.axes.end()) return true;
  return false;
}

// The parallel primitive of a stage moved per knob par (1: dropped; 2: to
// the first loop inside it, among the stage's own axes that no other
// primitive names, that has more than one iteration or an unknown count).
void edit_parallel(const tir::ComputeDef& st, std::vector<tir::Primitive>& ps, int64_t par) {
  auto it = std::find_if(ps.begin(), ps.end(), [](const tir::Primitive& p) { return p.kind == "parallel"; });
  if (it == ps.end() || par == 0) return;
  if (par == 1) {
    ps.erase(it);
    return;
  }
  auto at = std::find(st.axes.begin(), st.axes.end(), it->axes[0]);
  if (at == st.axes.end()) return;  // a tiled loop: left where the default put it
  std::vector<tir::Primitive> others;
  for (const tir::Primitive& p : ps)
    if (p.kind != "parallel") others.push_back(p);
  for (size_t i = static_cast<size_t>(at - st.axes.begin()) + 1; i < st.axes.size(); ++i) {
    auto c = st.shape[i].as_const();
    if ((c && *c < 2) || mentions(others, st.axes[i])) continue;
    it->axes[0] = st.axes[i];
    return;
  }
}

// Stage `st`'s primitives (the default schedule's, `ps`) under `knobs`.
std::vector<tir::Primitive> edit_stage(const tir::ComputeDef& st, std::vector<tir::Primitive> ps,
                                       const tir::Knobs& knobs) {
  auto get = [&](const char* name) {
    auto it = knobs.find(name);
    return it == knobs.end() ? default_of(name) : it->second;
  };
  const size_t n = st.axes.size();
  if (n == 0 || has_prim(ps, "inline")) return ps;
  const std::string& x = st.axes[n - 1];
  const auto inner = st.shape[n - 1].as_const();
  if (!st.reduce_axes.empty()) {
    if (get("red") == 1 && (has_prim(ps, "rfactor") || has_prim(ps, "reorder"))) {
      tir::Schedule plain;
      tir::plain_reduction_schedule(st, plain);
      ps = std::move(plain.prims);
    }
    edit_parallel(st, ps, get("par"));
    return ps;
  }
  const int64_t vec = get("vec"), unroll = get("unroll");
  auto v = std::find_if(ps.begin(), ps.end(), [&](const tir::Primitive& p) { return p.kind == "vectorize"; });
  const bool whole = v != ps.end() && v->axes[0] == x && !has_prim(ps, "split") && !has_prim(ps, "split_overlap");
  if (whole && vec > 0 && (!inner || *inner > vec)) {
    std::vector<tir::Primitive> repl = {prim("split", st.name, {x}, vec)};
    if (unroll > 1 && (!inner || *inner >= 2 * vec)) {
      repl.push_back(prim("split", st.name, {x + ".o"}, unroll));
      repl.push_back(prim("unroll", st.name, {x + ".o.i"}));
    }
    repl.push_back(prim("vectorize", st.name, {x + ".i"}));
    v = ps.erase(v);
    ps.insert(v, repl.begin(), repl.end());
  }
  edit_parallel(st, ps, get("par"));
  return ps;
}

}  // namespace

tir::Schedule generic_schedule(const tir::KernelDef& k, const tir::Knobs& knobs) {
  const tir::Schedule def = tir::default_schedule(k);
  tir::Schedule out;
  for (const tir::ComputeDef& st : k.stages) {
    std::vector<tir::Primitive> ps;
    for (const tir::Primitive& p : def.prims)
      if (p.stage == st.name) ps.push_back(p);
    for (tir::Primitive& p : edit_stage(st, std::move(ps), knobs)) out.prims.push_back(std::move(p));
  }
  return out;
}

tir::Knobs generic_defaults(const tir::KnobSpace& space) {
  tir::Knobs out;
  for (const tir::Knob& k : space.knobs) out[k.name] = default_of(k.name);
  return out;
}

tir::KnobSpace generic_space(const tir::KernelDef& k, const Target& t, int threads) {
  const int64_t lanes = t.lanes();
  const std::vector<tir::Knob> wide = {
      {"vec", {0, lanes / 2, lanes, 2 * lanes, 4 * lanes}},
      {"unroll", {1, 2, 4}},
      {"par", threads > 1 ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{0}},
      {"red", {0, 1}},
  };
  // Each knob keeps the values that change the schedule with the others at
  // their defaults (unroll: with the narrowest vectors that apply).
  tir::Knobs base;
  for (const tir::Knob& knob : wide) base[knob.name] = default_of(knob.name);
  const std::string plain = generic_schedule(k, base).to_string();
  tir::KnobSpace space;
  for (const tir::Knob& knob : wide) {
    // A point without the knob (one tuned at another thread count, say) has its default.
    const int64_t def = default_of(knob.name);
    tir::Knob kept{knob.name, {def}, def};
    for (int64_t value : knob.values) {
      if (value == def || value <= 0) continue;
      tir::Knobs at = base;
      at[knob.name] = value;
      std::string without;
      if (knob.name == "unroll") {
        at["vec"] = lanes / 2;
        tir::Knobs one = at;
        one["unroll"] = 1;
        without = generic_schedule(k, one).to_string();
      } else {
        without = plain;
      }
      if (generic_schedule(k, at).to_string() != without) kept.values.push_back(value);
    }
    if (kept.values.size() > 1) space.knobs.push_back(std::move(kept));
  }
  // A point whose knob, set back to its default, gives the same schedule
  // (unrolling vectors that are too few for it, say) is not in the space.
  space.valid = [k](const tir::Knobs& p) {
    const std::string at = generic_schedule(k, p).to_string();
    for (const auto& [name, value] : p) {
      if (value == default_of(name)) continue;
      tir::Knobs q = p;
      q[name] = default_of(name);
      if (generic_schedule(k, q).to_string() == at) return false;
    }
    return true;
  };
  return space;
}

}  // namespace kiln::strategy
