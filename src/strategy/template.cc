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

Result<int64_t> knob(const tir::Knobs& knobs, const std::string& name, const std::string& candidate) {
  auto it = knobs.find(name);
  if (it == knobs.end()) return invalid_argument() << candidate << ": knob '" << name << "' missing from kiln_knobs";
  if (it->second < 1) return invalid_argument() << candidate << ": knob " << name << " = " << it->second << " < 1";
  return it->second;
}

void set_string_attr(Node& n, const std::string& name, const std::string& value) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = value;
  n.set_attr(name, a);
}

}  // namespace kiln::strategy
