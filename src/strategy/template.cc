#include "strategy/template.h"

namespace kiln::strategy {

tir::Primitive prim(std::string kind, std::string stage, std::vector<std::string> axes, int64_t factor) {
  tir::Primitive p;
  p.kind = std::move(kind);
  p.stage = std::move(stage);
  p.axes = std::move(axes);
  p.factor = factor;
  return p;
}

tir::Schedule replace_stage_schedule(const tir::KernelDef& k, const std::string& stage,
                                     const std::vector<tir::Primitive>& prims) {
  tir::Schedule base = tir::default_schedule(k);
  tir::Schedule s;
  bool placed = false;
  for (const tir::Primitive& p : base.prims) {
    if (p.stage == stage) {
      if (!placed) s.prims.insert(s.prims.end(), prims.begin(), prims.end());
      placed = true;
      continue;
    }
    s.prims.push_back(p);
  }
  if (!placed) s.prims.insert(s.prims.end(), prims.begin(), prims.end());
  return s;
}

int first_parallel(const std::vector<std::optional<int64_t>>& counts) {
  // A known count above 1 first: a symbolic batch dim is often 1 at run time.
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] && *counts[i] > 1) return static_cast<int>(i);
  for (size_t i = 0; i < counts.size(); ++i)
    if (!counts[i]) return static_cast<int>(i);
  return -1;
}

void set_string_attr(Node& n, const std::string& name, const std::string& value) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = value;
  n.set_attr(name, a);
}

}  // namespace kiln::strategy
