// define_kernels: a fused group's nodes lowered (OpDef::lower) into one
// tir::KernelDef, put in canonical form; equal workloads share a kernel.
#include "kernels/kernels.h"

#include <algorithm>

#include "ops/registry.h"
#include "tune/tune.h"

namespace kiln::kernels {

namespace {

// "f32[2,3], i64[]": the types of a node's inputs, for errors.
std::string input_types(const Node* n) {
  std::string out;
  for (const Value* v : n->inputs()) out += (out.empty() ? "" : ", ") + (v ? v->type().to_string() : "-");
  return out;
}

struct Defined {
  tir::KernelDef def;
  std::map<const Value*, std::string> names;  // value -> parameter or stage name in `def`
  GroupCall call;
};

Result<Defined> define_group(const partition::GraphPartition& gp, const partition::FusedGroup& group,
                             const SymbolBounds& bounds) {
  Defined out;
  std::set<const Node*> members(group.nodes.begin(), group.nodes.end());
  auto produced_inside = [&](const Value* v) { return v->producer() && members.count(v->producer()); };
  std::vector<const Value*>& ext_inputs = out.call.inputs;
  std::vector<const Value*>& outputs = out.call.outputs;
  for (const Node* n : group.nodes) {
    for (const Value* v : n->inputs())
      if (v && !produced_inside(v) && std::find(ext_inputs.begin(), ext_inputs.end(), v) == ext_inputs.end())
        ext_inputs.push_back(v);
    for (const Value* o : n->outputs()) {
      if (!o) continue;
      // Values read by subgraphs are not in use lists: fused or not, they are materialized.
      bool external_use = gp.graph_outputs.count(o) != 0 || gp.captured.count(o) != 0;
      for (const auto& [user, idx] : o->uses())
        if (!members.count(user)) external_use = true;
      if (external_use || n == group.nodes.back()) outputs.push_back(o);
    }
  }
  auto buffer_for = [&](const Value* v) -> Result<tir::Buffer> {
    if (!v->type().shape) return unsupported() << "cannot compile: rank of '" << v->name() << "' is unknown";
    if (!dtype_is_compilable(v->dtype()))
      return unsupported() << "dtype " << dtype_name(v->dtype()) << " of '" << v->name()
                           << "' is not supported by the code generator";
    // Named by position in the kernel (params first), not by register: the
    // same kernel from another model has the same names.
    auto [it, added] = out.names.emplace(v, "b" + std::to_string(out.names.size()));
    return tir::Buffer{it->second, v->dtype(), *v->type().shape};
  };

  tir::KernelDef& k = out.def;
  k.name = group.nodes.back()->op_type();
  std::map<const Value*, int> param_index;
  for (const Value* v : ext_inputs) {
    KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(v));
    param_index[v] = static_cast<int>(k.params.size());
    k.params.push_back(b);
  }
  k.num_inputs = static_cast<int>(k.params.size());
  for (const Value* v : outputs) {
    KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(v));
    k.params.push_back(b);
  }
  int counter = 0;
  for (const Node* n : group.nodes) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    ops::LowerContext ctx;
    ctx.name_counter = &counter;
    auto it = gp.graph->opsets.find("");
    ctx.opset = it == gp.graph->opsets.end() ? 0 : it->second;
    ctx.bounds = bounds;
    if (auto bb = gp.bound_before.find(n); bb != gp.bound_before.end()) ctx.bound_symbols = bb->second;
    for (const Value* v : n->inputs()) {
      if (v == nullptr) {
        ctx.inputs.push_back(tir::Buffer{});
        ctx.input_index.push_back(-1);
        ctx.constants.push_back(nullptr);
        ctx.sym_values.push_back(std::nullopt);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(v));
      auto pi = param_index.find(v);
      ctx.inputs.push_back(b);
      ctx.input_index.push_back(pi == param_index.end() ? -1 : pi->second);
      ctx.constants.push_back(v->is_constant() ? &v->constant() : nullptr);
      ctx.sym_values.push_back(v->sym_value());
    }
    for (const Value* o : n->outputs()) {
      if (o == nullptr) {
        ctx.outputs.push_back(tir::Buffer{});
        continue;
      }
      KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(o));
      ctx.outputs.push_back(b);
    }
    // An op lowered for dtypes its lowering does not handle: an error naming
    // the node, not an abort (shape/expr.h).
    ExprErrorTrap trap;
    auto stages = def->lower(*n, ctx);
    if (!stages.is_ok()) return stages.status().with_context(n->describe());
    if (trap.failed())
      return unsupported() << n->describe() << ": cannot lower for input types " << input_types(n) << " ("
                           << trap.error() << ")";
    for (auto& s : *stages) k.stages.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Result<KernelSet> define_kernels(const partition::Partition& p, const SymbolBounds& bounds) {
  KernelSet ks;
  Status st = p.for_each_group([&](const partition::GraphPartition& gp, const partition::FusedGroup& group) -> Status {
    const Node* root = group.nodes.back();
    auto defined = define_group(gp, group, bounds);
    if (!defined.is_ok()) return gp.in_context(defined.status().with_context(root->describe()));
    // The node whose implementation the operator strategy chose (the group's
    // MatMul/Gemm/Conv), if any: its stage follows the candidate's template.
    const Node* anchor = nullptr;
    for (const Node* n : group.nodes)
      if (n->has_attr(strategy::kImplAttr) || (p.candidates_are_anchors && partition::is_anchor(n, true))) anchor = n;
    // Without one, a generic-space choice recorded on the group's last node
    // (strategy.h: the database's, or a tuning trial's).
    std::optional<strategy::Choice> choice =
        anchor ? strategy::recorded_choice(*anchor) : strategy::recorded_generic_choice(*root);
    // Kernels are compiled in canonical form, so a schedule trace names the
    // same stages and axes whichever model the kernel comes from.
    tir::CanonicalKernel canon = tir::canonicalize(defined->def, &bounds);
    std::string key = canon.text;
    if (choice) key += "impl " + choice->candidate + " " + tir::knobs_to_string(choice->knobs) + "\n";
    GroupCall call = std::move(defined->call);
    call.symbols = canon.symbols;
    auto it = ks.by_key.find(key);
    if (it != ks.by_key.end()) {
      call.kernel = it->second;
    } else {
      Kernel k;
      k.where = &gp;
      k.root = root;
      k.anchor = anchor;
      k.choice = choice;
      if (anchor) {
        auto own = defined->names.find(anchor->output(0));
        auto n = own == defined->names.end() ? canon.names.end() : canon.names.find(own->second);
        if (n != canon.names.end()) k.anchor_stage = n->second;
      }
      k.key = key;
      k.func.name = "kiln_k" + std::to_string(ks.kernels.size()) + "_" + defined->def.name;
      k.canon = std::move(canon);
      call.kernel = static_cast<int>(ks.kernels.size());
      ks.by_key.emplace(std::move(key), call.kernel);
      ks.kernels.push_back(std::move(k));
    }
    ks.calls.emplace(&group, std::move(call));
    return Status::ok();
  });
  KILN_RETURN_IF_ERROR(st);
  return ks;
}

namespace {
// The groups of `g`'s partition with their kernels' workloads: every node
// that would anchor a candidate's kernel (`generic` false), or every group
// that has none (true: its last node stands for it, with its canonical
// kernel definition).
std::vector<GroupWorkload> group_workloads(Graph& g, const SymbolBounds& bounds, bool fuse,
                                           bool candidates_are_anchors, bool generic) {
  std::vector<GroupWorkload> out;
  auto parts = partition::partition_graph(g, bounds, fuse, candidates_are_anchors);
  if (!parts.is_ok()) return out;
  auto ks = define_kernels(*parts, bounds);
  if (!ks.is_ok()) return out;
  // In program order (for_each_group), so a model's workloads list the same way each time.
  (void)parts->for_each_group([&](const partition::GraphPartition&, const partition::FusedGroup& group) -> Status {
    const GroupCall& call = ks->calls.at(&group);
    const Kernel& k = ks->kernels[static_cast<size_t>(call.kernel)];
    std::vector<const Node*> anchors;
    if (!generic) {
      for (const Node* n : group.nodes)
        if (partition::is_anchor(n, true)) anchors.push_back(n);
    } else if (k.anchor == nullptr) {
      anchors.push_back(group.nodes.back());
    }
    for (const Node* n : anchors) {
      GroupWorkload gw;
      gw.anchor = n;
      gw.group = group.nodes;
      gw.inputs = call.inputs;
      gw.outputs = call.outputs;
      gw.workload = tune::Workload::make(n->op_type(), k.canon.text);
      if (generic) gw.def = k.canon.def;
      gw.generic = generic;
      out.push_back(std::move(gw));
    }
    return Status::ok();
  });
  return out;
}
}  // namespace

std::vector<GroupWorkload> candidate_workloads(Graph& g, const SymbolBounds& bounds, bool fuse) {
  return group_workloads(g, bounds, fuse, /*candidates_are_anchors=*/true, /*generic=*/false);
}

std::vector<GroupWorkload> generic_workloads(Graph& g, const SymbolBounds& bounds, bool fuse, bool before_choice) {
  return group_workloads(g, bounds, fuse, before_choice, /*generic=*/true);
}

}  // namespace kiln::kernels
