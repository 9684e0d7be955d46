#include "strategy/template.h"

#include <functional>
#include <set>

namespace kiln::strategy {

tir::Primitive prim(std::string kind, std::string stage, std::vector<std::string> axes, int64_t factor) {
  tir::Primitive p;
  p.kind = std::move(kind);
  p.stage = std::move(stage);
  p.axes = std::move(axes);
  p.factor = factor;
  return p;
}

tir::Schedule replace_stage_schedules(const tir::KernelDef& k,
                                      const std::map<std::string, std::vector<tir::Primitive>>& prims) {
  tir::Schedule base = tir::default_schedule(k);
  tir::Schedule s;
  std::set<std::string> placed;
  for (const tir::Primitive& p : base.prims) {
    auto it = prims.find(p.stage);
    if (it == prims.end()) {
      s.prims.push_back(p);
    } else if (placed.insert(p.stage).second) {
      s.prims.insert(s.prims.end(), it->second.begin(), it->second.end());
    }
  }
  for (const auto& [name, ps] : prims)
    if (!placed.count(name)) s.prims.insert(s.prims.end(), ps.begin(), ps.end());
  return s;
}

tir::Schedule replace_stage_schedule(const tir::KernelDef& k, const std::string& stage,
                                     const std::vector<tir::Primitive>& prims) {
  return replace_stage_schedules(k, {{stage, prims}});
}

const tir::ComputeDef* find_stage(const tir::KernelDef& k, const std::string& name) {
  for (const tir::ComputeDef& s : k.stages)
    if (s.name == name) return &s;
  return nullptr;
}

Result<int64_t> knob(const tir::Knobs& knobs, const std::string& name, const std::string& candidate) {
  auto it = knobs.find(name);
  if (it == knobs.end()) return invalid_argument() << candidate << ": knob '" << name << "' missing from kiln_knobs";
  if (it->second < 1) return invalid_argument() << candidate << ": knob " << name << " = " << it->second << " < 1";
  return it->second;
}

bool knob_on(const tir::Knobs& knobs, const std::string& name) {
  auto it = knobs.find(name);
  return it != knobs.end() && it->second == 1;
}

int64_t least_overlap_tile(int64_t extent, const std::vector<std::pair<int64_t, double>>& tiles) {
  int64_t best = tiles.front().first;
  if (extent < 1 || extent >= (int64_t{1} << 40)) return best;
  double best_cost = 0;
  for (auto [size, rate] : tiles) {
    double cost = static_cast<double>((extent + size - 1) / size * size) / rate;
    if (best_cost == 0 || cost < best_cost) {
      best_cost = cost;
      best = size;
    }
  }
  return best;
}

void set_string_attr(Node& n, const std::string& name, const std::string& value) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = value;
  n.set_attr(name, a);
}

void set_int_attr(Node& n, const std::string& name, int64_t value) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = value;
  n.set_attr(name, a);
}

ColumnTile tile_columns(std::vector<tir::Primitive>& prims, const std::string& stage, const std::string& axis,
                        const Expr& extent, int64_t mr) {
  auto ext = extent.as_const();
  if (ext && *ext <= mr) return {"", axis, std::nullopt};
  prims.push_back(prim(ext && *ext % mr != 0 ? "split_overlap" : "split", stage, {axis}, mr));
  return {axis + ".o", axis + ".i", ext ? std::optional<int64_t>((*ext + mr - 1) / mr) : std::nullopt};
}

bool input_outweighs_weights(const Node& n) {
  const Value* w = n.input(1);
  const TensorType& xt = n.input(0)->type();
  if (!xt.shape || w == nullptr || !w->is_constant()) return true;
  int64_t input = 1;
  for (const auto& d : *xt.shape) {
    auto c = d.as_const();
    if (!c || *c < 0 || __builtin_mul_overflow(input, *c, &input)) return true;
  }
  return input > w->constant().numel();
}

void parallelize_rows_or_outer(std::vector<tir::Primitive>& prims, const std::string& stage, const tir::Knobs& knobs,
                               const std::string& rows_axis, const Expr& rows, const std::vector<std::string>& outer,
                               const std::vector<std::optional<int64_t>>& counts) {
  auto row_count = rows.as_const();
  if (knob_on(knobs, "rows") && (!row_count || *row_count > 1)) {
    prims.push_back(prim("parallel", stage, {rows_axis}));
  } else if (int par = tir::choose_parallel(counts); par >= 0) {
    prims.push_back(prim("parallel", stage, {outer[static_cast<size_t>(par)]}));
  }
}

Value* runtime_weight_node(Graph& g, Node& n, Value* w, const std::string& op,
                           const std::function<std::vector<Value*>()>& extra,
                           const std::vector<std::pair<std::string, int64_t>>& attrs, const std::string& suffix,
                           std::vector<int64_t> dims) {
  for (const auto& [user, slot] : w->uses()) {
    if (slot != 0 || user->domain() != "kiln" || user->op_type() != op) continue;
    bool same = true;
    for (const auto& [k, v] : attrs) same = same && user->attr_int(k, -1) == v;
    if (same) return user->output(0);
  }
  std::vector<Value*> inputs = {w};
  if (extra) {
    std::vector<Value*> more = extra();
    inputs.insert(inputs.end(), more.begin(), more.end());
  }
  const std::string name = g.unique_name(w->name() + "." + suffix);
  Node* t = g.insert_node_before(&n, op, inputs, {name}, "kiln");
  t->set_name(name);
  for (const auto& [k, v] : attrs) set_int_attr(*t, k, v);
  TensorType tt;
  tt.dtype = w->type().dtype;
  tt.shape = Shape(dims.begin(), dims.end());
  t->output(0)->set_type(std::move(tt));
  return t->output(0);
}

}  // namespace kiln::strategy
