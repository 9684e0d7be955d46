#include "driver/pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "ops/registry.h"
#include "passes/default_pipeline.h"
#include "passes/fuse_elementwise.h"
#include "passes/pass_manager.h"
#include "runtime/memory_plan.h"
#include "support/memory_limit.h"
#include "strategy/strategy.h"
#include "tir/schedule.h"

namespace kiln::driver {

namespace {

enum class Mode { kSkip, kCompiled, kView, kHost, kShape, kControl };

// If / Loop / Scan / SequenceMap: each subgraph becomes a sub-program run by the VM.
bool is_control_flow(const Node* n) {
  return n->domain().empty() && (n->op_type() == "If" || n->op_type() == "Loop" || n->op_type() == "Scan" ||
                                 n->op_type() == "SequenceMap");
}

std::string describe(const Node* n) { return n->describe(); }

// "f32[2,3], i64[]": the types of a node's inputs, for errors.
std::string input_types(const Node* n) {
  std::string out;
  for (const Value* v : n->inputs()) out += (out.empty() ? "" : ", ") + (v ? v->type().to_string() : "-");
  return out;
}

bool fusion_enabled(const CompileOptions& o) {
  return !o.naive && std::find(o.disable_passes.begin(), o.disable_passes.end(), "fuse-elementwise") ==
                         o.disable_passes.end();
}

bool shape_is_static(const std::vector<Expr>& shape) {
  for (const Expr& d : shape)
    if (!d.is_const()) return false;
  return true;
}

// Every element of an integer output is known symbolically: compute it from
// the shapes at run time instead of running the node.
bool has_complete_sym_value(const Value* v) {
  if (v == nullptr || !v->sym_value() || !v->type().is_static()) return false;
  if (v->dtype() != DType::kInt64 && v->dtype() != DType::kInt32) return false;
  int64_t n = 1;
  for (int64_t d : v->type().static_shape()) n *= d;
  return n == static_cast<int64_t>(v->sym_value()->size());
}

// An output whose rank is unknown or whose dims use a symbol not yet bound
// (by the graph inputs or by an earlier runtime kernel's outputs) is
// data-dependent: only a runtime kernel, which allocates its outputs once the
// values are known, can produce it.
bool has_data_dependent_output(const Node* n, const std::set<std::string>& bound) {
  for (const Value* out : n->outputs()) {
    if (!out) continue;
    if (!out->type().shape) return true;
    for (const Expr& d : *out->type().shape)
      for (const std::string& v : free_vars(d))
        if (!bound.count(v)) return true;
  }
  // CumSum lowers only with a constant axis.
  if (n->op_type() == "CumSum" && n->input(1) && !n->input(1)->is_constant()) return true;
  return false;
}

// Walks a graph and its nested graphs.
void for_each_node(const Graph& g, const std::function<void(const Node*)>& f) {
  for (const Node* n : g.nodes()) {
    f(n);
    for (const auto& [name, a] : n->attrs()) {
      if (a.g) for_each_node(*a.g, f);
      for (const auto& sub : a.graphs)
        if (sub) for_each_node(*sub, f);
    }
  }
}



// State shared by the builder of the top-level graph and the builders of its
// subgraphs: all kernels go to one code-generation module, and every program
// gets the whole kernel table.
struct BuildState {
  std::vector<tir::PrimFunc> funcs;
  std::vector<KernelChoiceInfo> choices;  // one per func
  // Functions by workload key (canonical kernel text and the implementation
  // chosen): a kernel is compiled once however many groups compute it.
  std::map<std::string, int, std::less<>> func_by_key;
  // Call targets: a function and the symbols a call passes it, in the order
  // of its (canonical) sym_names; Instr::callee indexes these.
  std::vector<std::pair<int, std::vector<std::string>>> entries;
  std::map<std::pair<int, std::vector<std::string>>, int> entry_index;
  std::vector<std::shared_ptr<runtime::Program>> programs;
  std::string kernels_text;
  int num_host_calls = 0;
  bool lower_only = false;
};

class ProgramBuilder {
 public:
  // inline_body: the graph is an If branch or a Loop/Scan body whose
  // instructions the parent splices into its own program (emit_control):
  // its outputs are not copied out and its memory is planned by the parent.
  ProgramBuilder(Graph& g, const CompileOptions& opts, std::shared_ptr<BuildState> state = nullptr,
                 bool inline_body = false)
      : g_(g), opts_(opts), state_(state ? std::move(state) : std::make_shared<BuildState>()),
        inline_(inline_body) {
    state_->programs.push_back(prog_);
  }

  Result<CompiledProgram> build(SymbolBounds bounds);
  // The program of this graph without code generation (subgraphs use it).
  Status build_program(SymbolBounds bounds);
  // Stops before code generation; kernels_text() then describes every kernel.
  void set_lower_only(bool v) { state_->lower_only = v; }
  const std::string& kernels_text() const { return state_->kernels_text; }
  std::string groups_text();

 private:
  int reg(const Value* v);
  Status classify();
  bool view_between_elementwise(const Node* n);
  Result<tir::KernelDef> make_kernel_def(const passes::FusedGroup& group, std::map<const Value*, std::string>& names,
                                         std::vector<int>& in_regs,
                                          std::vector<int>& out_regs);
  Status emit_group(const passes::FusedGroup& group);
  Status emit_node(const Node* n, Mode mode);
  // The run-time checks of the dims a node's lowering or view assumed (OpDef::dim_checks).
  void emit_dim_checks(const Node* n);
  Status emit_control(const Node* n);
  struct Inlined;
  Result<Inlined> inline_graph(const Node* n, const char* attr);
  // The captured values' moves, then the subgraph's instructions.
  void emit_body(const Inlined& body) {
    emit_body_captures(body);
    emit_body_instrs(body);
  }
  void emit_body_captures(const Inlined& body);
  void emit_body_instrs(const Inlined& body);
  Status emit_if(const Node* n);
  int64_t result_move_flags(const Value* v);
  Status emit_loop(const Node* n, bool scan);
  int emit(runtime::Instr in) {
    prog_->instrs.push_back(std::move(in));
    return static_cast<int>(prog_->instrs.size()) - 1;
  }
  void plan_memory();

  Graph& g_;
  const CompileOptions& opts_;
  std::shared_ptr<runtime::Program> prog_ = std::make_shared<runtime::Program>();
  std::shared_ptr<BuildState> state_;
  bool inline_ = false;
  std::map<const Value*, int> regs_;
  std::map<const Node*, Mode> mode_;
  std::set<const Value*> graph_outputs_;
  SymbolBounds bounds_;
  std::map<const Node*, std::set<std::string>> bound_before_;
  // Captured outer values that are inputs of this (sub)program, after the graph inputs.
  std::vector<const Value*> capture_inputs_;
  // Values of this graph read by subgraphs (implicit inputs of control-flow nodes).
  std::set<const Value*> captured_;
  // Concat kernels whose inputs are contiguous blocks of the output (every dim
  // before the axis is 1): plan_memory may place the inputs in the output's
  // slices and turn the call into a kBind.
  // A lone Split likewise, the other way round (split: `output` is the
  // Split's input, `inputs` its outputs): its outputs may be placed in the
  // slices of its input, whose buffer then lives until their last use.
  struct ConcatSite {
    size_t instr = 0;
    int output = -1;
    std::vector<int> inputs;
    std::vector<int64_t> offsets;  // byte offset of each input in the output
    bool split = false;
  };
  std::vector<ConcatSite> concat_sites_;
  std::optional<ConcatSite> concat_site(const passes::FusedGroup& group);
  // A subgraph compiled for splicing: its registers, host kernels and
  // sub-programs already appended to this program's (numbers below are this
  // program's), its instructions not yet.
  struct Inlined {
    std::shared_ptr<runtime::Program> prog;
    int reg_offset = 0, host_offset = 0, sub_offset = 0;
    std::vector<int> inputs, outputs;                 // the subgraph's inputs and outputs
    std::vector<std::pair<int, int>> captures;        // (outer register, the subgraph's capture register)
    std::vector<ConcatSite> sites;
  };
};

int ProgramBuilder::reg(const Value* v) {
  auto it = regs_.find(v);
  if (it != regs_.end()) return it->second;
  runtime::RegisterInfo info;
  info.name = v->name();
  info.dtype = v->dtype();
  if (v->type().shape) info.shape = *v->type().shape;
  for (const TensorType* e = v->type().elem.get(); e != nullptr; e = e->elem.get()) info.elem_dtypes.push_back(e->dtype);
  if (v->is_constant()) {
    info.is_constant = true;
    info.constant = v->constant();
  }
  int r = static_cast<int>(prog_->registers.size());
  prog_->registers.push_back(std::move(info));
  regs_[v] = r;
  return r;
}

Status ProgramBuilder::classify() {
  for (const Value* v : g_.outputs()) graph_outputs_.insert(v);
  // Values needed by the outputs (dead nodes are skipped).
  std::set<const Value*> needed(g_.outputs().begin(), g_.outputs().end());
  std::vector<Node*> nodes = g_.nodes();
  // Symbols bound before each node runs: graph input dims, then the outputs
  // of every node in order.
  std::set<std::string> bound;
  std::set<const Node*> data_dependent;
  std::vector<const Value*> entry(g_.inputs().begin(), g_.inputs().end());
  entry.insert(entry.end(), g_.captures().begin(), g_.captures().end());
  for (const Value* in : entry)
    if (in->type().shape)
      for (const Expr& d : *in->type().shape)
        for (const std::string& v : free_vars(d)) bound.insert(v);
  // The node output whose dims first name each data-dependent symbol: it must
  // run wherever a live node's shape or symbolic value uses the symbol (a
  // Shape of a host kernel's output, computed from symbols, needs the kernel
  // to have bound them).
  std::map<std::string, const Value*> introduced_by;
  for (const Node* n : nodes) {
    bound_before_[n] = bound;
    if (has_data_dependent_output(n, bound)) data_dependent.insert(n);
    for (const Value* out : n->outputs())
      if (out && out->type().shape)
        for (const Expr& d : *out->type().shape)
          for (const std::string& v : free_vars(d))
            if (bound.insert(v).second) introduced_by.emplace(v, out);
  }
  auto need_symbols_of = [&](const Value* o, std::set<const Value*>& needed) {
    std::vector<Expr> exprs;
    if (o->type().shape) exprs = *o->type().shape;
    if (o->sym_value()) exprs.insert(exprs.end(), o->sym_value()->begin(), o->sym_value()->end());
    for (const Expr& e : exprs)
      for (const std::string& v : free_vars(e))
        if (auto it = introduced_by.find(v); it != introduced_by.end() && it->second != o) needed.insert(it->second);
  };
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool live = false;
    for (const Value* o : n->outputs())
      if (o && needed.count(o)) live = true;
    if (!live) {
      mode_[n] = Mode::kSkip;
      continue;
    }
    bool shape_only = true;
    for (const Value* o : n->outputs())
      if (o && needed.count(o) && !has_complete_sym_value(o)) shape_only = false;
    for (const Value* o : n->outputs())
      if (o && needed.count(o)) need_symbols_of(o, needed);
    if (shape_only) {
      mode_[n] = Mode::kShape;
      continue;
    }
    for (const Value* in : n->inputs())
      if (in) needed.insert(in);
    for (const Value* in : g_.implicit_inputs(n)) {
      needed.insert(in);
      captured_.insert(in);
    }
    if (is_control_flow(n)) {
      mode_[n] = Mode::kControl;
      continue;
    }
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    KILN_CHECK(def != nullptr) << "unchecked op " << describe(n);
    if (def->kernel && (data_dependent.count(n) || (def->runs_kernel && def->runs_kernel(*n))))
      mode_[n] = Mode::kHost;
    else if (def->is_view && n->num_outputs() >= 1)
      mode_[n] = Mode::kView;
    else if (def->lower)
      mode_[n] = Mode::kCompiled;
    else
      mode_[n] = Mode::kHost;
  }
  if (fusion_enabled(opts_))
    for (Node* n : nodes)
      if (mode_[n] == Mode::kView && view_between_elementwise(n)) mode_[n] = Mode::kCompiled;
  return Status::ok();
}

// A Reshape/Flatten/Squeeze/Unsqueeze whose input comes from a compiled
// elementwise node and whose output goes to one, each value read only there:
// compiled into their fused kernel (a reindexing of the producer's values,
// no buffer in between). Its output dims must be expressions of its input's,
// so the kernel can compute them (x:[a,b] -> [a*b] fuses; a dim taken from a
// run-time shape tensor does not).
bool ProgramBuilder::view_between_elementwise(const Node* n) {
  static const std::set<std::string> kViews = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"};
  if (!n->domain().empty() || !kViews.count(n->op_type()) || n->num_outputs() != 1) return false;
  const Value* in = n->input(0);
  const Value* out = n->output(0);
  if (in == nullptr || out == nullptr || !in->type().shape || !out->type().shape) return false;
  std::set<std::string> in_symbols;
  for (const Expr& d : *in->type().shape)
    for (const std::string& v : free_vars(d)) in_symbols.insert(v);
  for (const Expr& d : *out->type().shape)
    for (const std::string& v : free_vars(d))
      if (!in_symbols.count(v)) return false;
  auto fusable = [&](const Node* m) {
    if (m == nullptr || mode_[m] != Mode::kCompiled || m->num_outputs() != 1) return false;
    const ops::OpDef* def = ops::find_op(m->domain(), m->op_type());
    return def != nullptr && def->is_elementwise;
  };
  auto only_reader = [&](const Value* v) {
    return v->uses().size() == 1 && !graph_outputs_.count(v) && !captured_.count(v);
  };
  return fusable(in->producer()) && only_reader(in) && only_reader(out) && fusable(out->uses()[0].first);
}

Result<tir::KernelDef> ProgramBuilder::make_kernel_def(const passes::FusedGroup& group,
                                                        std::map<const Value*, std::string>& names,
                                                        std::vector<int>& in_regs,
                                                        std::vector<int>& out_regs) {
  std::set<const Node*> members(group.nodes.begin(), group.nodes.end());
  auto produced_inside = [&](const Value* v) { return v->producer() && members.count(v->producer()); };
  std::vector<const Value*> ext_inputs, outputs;
  for (const Node* n : group.nodes) {
    for (const Value* v : n->inputs())
      if (v && !produced_inside(v) && std::find(ext_inputs.begin(), ext_inputs.end(), v) == ext_inputs.end())
        ext_inputs.push_back(v);
    for (const Value* o : n->outputs()) {
      if (!o) continue;
      // Values read by subgraphs are not in use lists: fused or not, they are materialized.
      bool external_use = graph_outputs_.count(o) != 0 || captured_.count(o) != 0;
      for (const auto& [user, idx] : o->uses())
        if (!members.count(user)) external_use = true;
      if (external_use || n == group.nodes.back()) outputs.push_back(o);
    }
  }
  auto buffer_for = [&](const Value* v) -> Result<tir::Buffer> {
    if (!v->type().shape)
      return unsupported() << "cannot compile: rank of '" << v->name() << "' is unknown";
    if (!dtype_is_compilable(v->dtype()))
      return unsupported() << "dtype " << dtype_name(v->dtype()) << " of '" << v->name()
                           << "' is not supported by the code generator";
    // Named by position in the kernel (params first), not by register: the
    // same kernel from another model has the same names.
    auto [it, added] = names.emplace(v, "b" + std::to_string(names.size()));
    return tir::Buffer{it->second, v->dtype(), *v->type().shape};
  };

  tir::KernelDef k;
  k.name = group.nodes.back()->op_type();
  std::map<const Value*, int> param_index;
  for (const Value* v : ext_inputs) {
    KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(v));
    param_index[v] = static_cast<int>(k.params.size());
    k.params.push_back(b);
    in_regs.push_back(reg(v));
  }
  k.num_inputs = static_cast<int>(k.params.size());
  for (const Value* v : outputs) {
    KILN_ASSIGN_OR_RETURN(tir::Buffer b, buffer_for(v));
    k.params.push_back(b);
    out_regs.push_back(reg(v));
  }
  int counter = 0;
  for (const Node* n : group.nodes) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    ops::LowerContext ctx;
    ctx.name_counter = &counter;
    auto it = g_.opsets.find("");
    ctx.opset = it == g_.opsets.end() ? 0 : it->second;
    ctx.bounds = bounds_;
    ctx.bound_symbols = bound_before_[n];
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
    if (!stages.is_ok()) return stages.status().with_context(describe(n));
    if (trap.failed())
      return unsupported() << describe(n) << ": cannot lower for input types " << input_types(n) << " ("
                           << trap.error() << ")";
    for (auto& s : *stages) k.stages.push_back(std::move(s));
  }
  return k;
}

// "// symbols s0 = batch, s1 = seq\n": the model's names of a canonical kernel's symbols.
std::string symbols_comment(const tir::CanonicalKernel& c) {
  if (c.symbols.empty()) return std::string();
  std::string out = "// symbols";
  for (size_t i = 0; i < c.symbols.size(); ++i) out += (i ? ", s" : " s") + std::to_string(i) + " = " + c.symbols[i];
  return out + "\n";
}

Status ProgramBuilder::emit_group(const passes::FusedGroup& group) {
  std::vector<int> in_regs, out_regs;
  std::map<const Value*, std::string> names;
  auto kdef = make_kernel_def(group, names, in_regs, out_regs);
  if (!kdef.is_ok()) return kdef.status().with_context(describe(group.nodes.back()));
  // The node whose implementation the operator strategy chose (the group's
  // MatMul/Gemm/Conv), if any: its stage follows the candidate's template.
  const Node* anchor = nullptr;
  for (const Node* n : group.nodes)
    if (n->has_attr(strategy::kImplAttr)) anchor = n;
  std::optional<strategy::Choice> choice = anchor ? strategy::recorded_choice(*anchor) : std::nullopt;
  // The workload key: the kernel in canonical form (names by position,
  // symbols renamed, their bounds) and the implementation chosen. Kernels are
  // compiled in canonical form, so a schedule trace names the same stages and
  // axes whichever model the kernel comes from.
  tir::CanonicalKernel canon = tir::canonicalize(*kdef, &bounds_);
  std::string key = canon.text;
  if (choice) key += "impl " + choice->candidate + " " + tir::knobs_to_string(choice->knobs) + "\n";
  int func_index;
  auto it = state_->func_by_key.find(key);
  if (it != state_->func_by_key.end()) {
    func_index = it->second;
  } else {
    tir::Schedule sched;
    if (opts_.naive) {
      sched = tir::naive_schedule(canon.def);
    } else {
      std::string stage;
      if (anchor) {
        auto own = names.find(anchor->output(0));
        auto n = own == names.end() ? canon.names.end() : canon.names.find(own->second);
        if (n != canon.names.end()) stage = n->second;
      }
      auto s = strategy::schedule_for(canon.def, stage, anchor);
      if (!s.is_ok()) return s.status().with_context(describe(group.nodes.back()) + ": schedule");
      sched = std::move(*s);
    }
    auto func = tir::lower(canon.def, sched);
    if (!func.is_ok())
      return func.status().with_context(describe(group.nodes.back()) + ": lowering");
    func->name = "kiln_k" + std::to_string(state_->funcs.size()) + "_" + kdef->name;
    func_index = static_cast<int>(state_->funcs.size());
    KernelChoiceInfo info;
    info.kernel = func->name;
    info.node = describe(anchor ? anchor : group.nodes.back());
    if (choice) {
      info.impl = choice->candidate;
      info.knobs = tir::knobs_to_string(choice->knobs);
      info.source = choice->source;
      info.why = choice->why;
    } else {
      info.impl = opts_.naive ? "naive" : "default";
      info.source = opts_.naive ? "naive" : "no candidates";
    }
    state_->choices.push_back(info);
    if (state_->lower_only)
      state_->kernels_text += "// kernel " + func->name + " for " + describe(group.nodes.back()) + "\n" +
                              (choice ? "// implementation " + info.impl + " (" + info.knobs + ") by " + info.source + "\n"
                                      : std::string()) +
                              symbols_comment(canon) + tir::print_kernel_def(canon.def) + "// schedule\n" + sched.to_string() + "\n" +
                       tir::print_func(*func) + "\n";
    if (opts_.dump_ir) std::fprintf(stderr, "%s\n", tir::print_func(*func).c_str());
    state_->funcs.push_back(std::move(*func));
    state_->func_by_key.emplace(std::move(key), func_index);
  }
  // The call passes this group's own symbols where the function names s<i>.
  // (A name canonicalize left alone is the model's own and passes itself.)
  std::map<std::string, std::string, std::less<>> original;
  for (size_t i = 0; i < canon.symbols.size(); ++i) original["s" + std::to_string(i)] = canon.symbols[i];
  std::vector<std::string> call_syms;
  for (const std::string& sym : state_->funcs[static_cast<size_t>(func_index)].sym_names) {
    auto o = original.find(sym);
    call_syms.push_back(o != original.end() ? o->second : sym);
  }
  auto entry = std::make_pair(func_index, std::move(call_syms));
  auto [ent, added] = state_->entry_index.emplace(entry, static_cast<int>(state_->entries.size()));
  if (added) state_->entries.push_back(std::move(entry));
  const int callee = ent->second;
  // Symbolic dims broadcast without proof (inference gave [n] + [m] the dim
  // max(m, n)) are checked before the kernel reads them.
  for (const Node* n : group.nodes) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    bool broadcasts = def && (def->is_elementwise || (n->domain().empty() && n->op_type() == "Expand"));
    const Value* out = n->output(0);
    if (!broadcasts || out == nullptr || !out->type().shape) continue;
    const Shape& os = *out->type().shape;
    runtime::Instr chk;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      // Expand's shape and CastLike's type target do not broadcast.
      bool broadcast_input = i == 0 || (n->op_type() != "Expand" && n->op_type() != "CastLike");
      if (v == nullptr || !v->type().shape || !broadcast_input) continue;
      const Shape& is = *v->type().shape;
      if (is.size() > os.size()) continue;
      for (size_t k = 0; k < is.size(); ++k) {
        const Expr& d_in = is[k];
        const Expr& d_out = os[os.size() - is.size() + k];
        auto c = d_in.as_const();
        if ((c && *c == 1) || prove_equal(d_in, d_out, bounds_)) continue;
        chk.values.push_back(d_in);
        chk.values.push_back(d_out);
        chk.attrs.push_back(static_cast<int64_t>(i));
        chk.attrs.push_back(static_cast<int64_t>(os.size() - is.size() + k));
        chk.attrs.push_back(0);
      }
    }
    if (chk.values.empty()) continue;
    chk.op = runtime::OpCode::kCheckBroadcast;
    chk.where = describe(n);
    prog_->instrs.push_back(std::move(chk));
  }
  // Dims the lowering assumed (OpDef::dim_checks: a fused Squeeze's axes)
  // are checked the same way.
  for (const Node* n : group.nodes) emit_dim_checks(n);
  // Index tensors read by the kernel are range-checked first (OpDef::index_checks).
  for (const Node* n : group.nodes) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    if (!def || !def->index_checks) continue;
    auto checks = def->index_checks(*n);
    if (!checks.is_ok()) return checks.status().with_context(describe(n));
    for (const ops::IndexCheck& c : *checks) {
      if (c.input >= n->num_inputs() || !n->input(c.input)) continue;
      runtime::Instr chk;
      chk.op = runtime::OpCode::kCheckIndices;
      chk.inputs = {reg(n->input(c.input))};
      chk.values = c.extents;
      chk.where = describe(n);
      prog_->instrs.push_back(std::move(chk));
    }
  }
  if (std::optional<ConcatSite> site = concat_site(group)) {
    site->instr = prog_->instrs.size();
    concat_sites_.push_back(std::move(*site));
  }
  runtime::Instr in;
  in.op = runtime::OpCode::kCall;
  in.callee = callee;
  in.inputs = in_regs;
  in.outputs = out_regs;
  in.where = describe(group.nodes.back());
  prog_->instrs.push_back(std::move(in));
  return Status::ok();
}

// A lone Concat with static shapes whose inputs are contiguous blocks of its
// output, each starting 64-byte aligned (kernels assume aligned buffers).
std::optional<ProgramBuilder::ConcatSite> ProgramBuilder::concat_site(const passes::FusedGroup& group) {
  if (group.nodes.size() != 1) return std::nullopt;
  const Node* n = group.nodes[0];
  const bool split = n->domain().empty() && n->op_type() == "Split";
  if (split ? n->num_inputs() < 1 || n->input(0) == nullptr
            : !n->domain().empty() || n->op_type() != "Concat" || n->num_outputs() != 1 || n->output(0) == nullptr)
    return std::nullopt;
  const Value* out = split ? n->input(0) : n->output(0);
  if (!out->type().shape || !shape_is_static(*out->type().shape)) return std::nullopt;
  const Shape& os = *out->type().shape;
  int64_t rank = static_cast<int64_t>(os.size());
  int64_t axis = n->attr_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  for (int64_t d = 0; d < axis; ++d)
    if (*os[d].as_const() != 1) return std::nullopt;
  ConcatSite site;
  site.output = reg(out);
  site.split = split;
  int64_t offset = 0;
  const std::vector<Value*>& parts = split ? n->outputs() : n->inputs();
  for (const Value* v : parts) {
    if (v == nullptr || !v->type().shape || !shape_is_static(*v->type().shape) || v->dtype() != out->dtype())
      return std::nullopt;
    std::vector<int64_t> dims;
    for (const Expr& d : *v->type().shape) dims.push_back(*d.as_const());
    std::optional<int64_t> nb = checked_nbytes(v->dtype(), dims);
    if (!nb || *nb == 0 || offset % 64 != 0) return std::nullopt;
    site.inputs.push_back(reg(v));
    site.offsets.push_back(offset);
    offset += *nb;
  }
  return site;
}

void ProgramBuilder::emit_dim_checks(const Node* n) {
  const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
  if (!def || !def->dim_checks) return;
  runtime::Instr chk;
  for (const ops::DimCheck& c : def->dim_checks(*n, bounds_)) {
    chk.values.push_back(c.dim);
    chk.values.push_back(c.to);
    chk.attrs.push_back(static_cast<int64_t>(c.input));
    chk.attrs.push_back(c.axis);
    chk.attrs.push_back(c.exact ? 1 : 0);
  }
  if (chk.values.empty()) return;
  chk.op = runtime::OpCode::kCheckBroadcast;
  chk.where = describe(n);
  prog_->instrs.push_back(std::move(chk));
}

Status ProgramBuilder::emit_node(const Node* n, Mode mode) {
  runtime::Instr in;
  in.where = describe(n);
  switch (mode) {
    case Mode::kShape: {
      for (const Value* o : n->outputs()) {
        if (!o || !has_complete_sym_value(o)) continue;
        runtime::Instr s;
        s.op = runtime::OpCode::kShapeOf;
        s.where = in.where;
        s.outputs = {reg(o)};
        s.values = *o->sym_value();
        prog_->instrs.push_back(std::move(s));
      }
      return Status::ok();
    }
    case Mode::kView: {
      const Value* src = n->input(0);
      const Value* out = n->output(0);
      if (!src || !out) return invalid_model() << in.where << ": view op without input or output";
      if (!out->type().shape) return unsupported() << in.where << ": output rank is unknown";
      emit_dim_checks(n);
      in.op = runtime::OpCode::kView;
      in.inputs = {reg(src)};
      // A Reshape whose target shape is only known at run time reads it from its input.
      if (n->op_type() == "Reshape" && n->input(1) && !shape_is_static(*out->type().shape) &&
          n->attr_int("allowzero", 0) == 0)
        in.inputs.push_back(reg(n->input(1)));
      int out_reg = reg(out);
      if (graph_outputs_.count(out) && !inline_) {
        // Graph outputs never alias an intermediate buffer: view into a temporary, then copy.
        runtime::RegisterInfo tmp = prog_->registers[out_reg];
        tmp.name += ".view";
        int t = static_cast<int>(prog_->registers.size());
        prog_->registers.push_back(tmp);
        in.outputs = {t};
        prog_->instrs.push_back(in);
        runtime::Instr c;
        c.op = runtime::OpCode::kCopy;
        c.inputs = {t};
        c.outputs = {out_reg};
        c.where = in.where;
        prog_->instrs.push_back(std::move(c));
      } else {
        in.outputs = {out_reg};
        prog_->instrs.push_back(std::move(in));
      }
      return Status::ok();
    }
    case Mode::kHost: {
      const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
      auto kernel = def->kernel(*n);
      if (!kernel.is_ok()) return kernel.status().with_context(in.where);
      in.op = runtime::OpCode::kCallHost;
      in.fills_outputs = def->kernel_fills_outputs;
      in.callee = static_cast<int>(prog_->host_kernels.size());
      prog_->host_kernels.push_back(std::move(*kernel));
      // A host kernel a candidate chose (conv.onednn) is listed with the compiled ones.
      if (auto choice = strategy::recorded_choice(*n)) {
        KernelChoiceInfo info;
        info.kernel = "host" + std::to_string(in.callee) + "_" + n->op_type();
        info.node = describe(n);
        info.impl = choice->candidate;
        info.knobs = tir::knobs_to_string(choice->knobs);
        info.source = choice->source;
        info.why = choice->why;
        state_->choices.push_back(std::move(info));
      }
      for (const Value* v : n->inputs()) in.inputs.push_back(v ? reg(v) : -1);
      for (const Value* o : n->outputs()) {
        if (!o) return unsupported() << in.where << ": omitted outputs of host kernels";
        in.outputs.push_back(reg(o));
      }
      ++state_->num_host_calls;
      prog_->instrs.push_back(std::move(in));
      return Status::ok();
    }
    case Mode::kControl:
      return emit_control(n);
    default:
      return Status::ok();
  }
}

// Scan's axes and directions, axes made non-negative: per scan input
// (axis, direction), then per scan output. Opset 8 (batched): those of one
// batch element (its leading axis dropped), outputs along axis 0.
Result<std::vector<int64_t>> scan_layout(const Node* n, bool batched, size_t num_scan_in) {
  size_t num_state = n->num_inputs() - num_scan_in - (batched ? 1 : 0);
  if (n->num_inputs() < num_scan_in + (batched ? 1 : 0) || n->num_outputs() < num_state)
    return invalid_model() << describe(n) << ": num_scan_inputs " << num_scan_in << " does not fit its inputs and outputs";
  size_t num_scan_out = n->num_outputs() - num_state;
  std::vector<int64_t> in_axes = batched ? std::vector<int64_t>(num_scan_in, 0)
                                         : n->attr_ints("scan_input_axes", std::vector<int64_t>(num_scan_in, 0));
  std::vector<int64_t> in_dirs =
      n->attr_ints(batched ? "directions" : "scan_input_directions", std::vector<int64_t>(num_scan_in, 0));
  std::vector<int64_t> out_axes = batched ? std::vector<int64_t>(num_scan_out, 0)
                                          : n->attr_ints("scan_output_axes", std::vector<int64_t>(num_scan_out, 0));
  std::vector<int64_t> out_dirs = batched ? std::vector<int64_t>(num_scan_out, 0)
                                          : n->attr_ints("scan_output_directions", std::vector<int64_t>(num_scan_out, 0));
  if (in_dirs.size() != num_scan_in || out_dirs.size() != num_scan_out || in_axes.size() != num_scan_in ||
      out_axes.size() != num_scan_out)
    return invalid_model() << describe(n) << ": scan axes / directions have the wrong length";
  std::vector<int64_t> attrs;
  size_t first_scan_in = num_state + (batched ? 1 : 0);
  for (size_t j = 0; j < num_scan_in; ++j) {
    const Value* x = n->input(first_scan_in + j);
    if (x == nullptr || !x->type().shape) return unsupported() << describe(n) << ": rank of scan input " << j << " is unknown";
    int64_t rank = x->type().rank() - (batched ? 1 : 0);
    int64_t axis = in_axes[j] < 0 ? in_axes[j] + rank : in_axes[j];
    if (axis < 0 || axis >= rank)
      return invalid_model() << describe(n) << ": scan_input_axes[" << j << "] = " << in_axes[j] << " out of range for rank " << rank;
    attrs.push_back(axis);
    attrs.push_back(in_dirs[j]);
  }
  for (size_t k = 0; k < num_scan_out; ++k) {
    const Value* o = n->output(num_state + k);
    if (o == nullptr || !o->type().shape) return unsupported() << describe(n) << ": rank of scan output " << k << " is unknown";
    int64_t rank = o->type().rank() - (batched ? 1 : 0);
    int64_t axis = out_axes[k] < 0 ? out_axes[k] + rank : out_axes[k];
    if (axis < 0 || axis >= rank)
      return invalid_model() << describe(n) << ": scan_output_axes[" << k << "] = " << out_axes[k] << " out of range for rank " << rank;
    attrs.push_back(axis);
    attrs.push_back(out_dirs[k]);
  }
  return attrs;
}

Result<ProgramBuilder::Inlined> ProgramBuilder::inline_graph(const Node* n, const char* attr) {
  const Attribute* a = n->attr(attr);
  if (!a || !a->g) return invalid_model() << describe(n) << ": missing subgraph " << attr;
  ProgramBuilder sub(*a->g, opts_, state_, /*inline_body=*/true);
  Status st = sub.build_program(bounds_);
  if (!st.is_ok()) return st.with_context(describe(n) + " " + attr);
  Inlined b;
  // Registers first (reg() may add one: an output nothing inside reads), then
  // the whole register file is appended.
  std::vector<int> ins, outs;
  for (const Value* v : a->g->inputs()) {
    if (v->is_constant())
      return unsupported() << describe(n) << " " << attr << ": input '" << v->name() << "' has an initializer";
    ins.push_back(sub.reg(v));
  }
  for (const Value* v : a->g->outputs()) outs.push_back(sub.reg(v));
  for (const Value* c : sub.capture_inputs_) {
    const Value* outer = g_.find_value(c->name());
    if (!outer) return internal_error() << describe(n) << ": capture '" << c->name() << "' does not resolve";
    b.captures.emplace_back(reg(outer), sub.reg(c));
  }
  b.prog = sub.prog_;
  b.reg_offset = static_cast<int>(prog_->registers.size());
  b.host_offset = static_cast<int>(prog_->host_kernels.size());
  b.sub_offset = static_cast<int>(prog_->subprograms.size());
  prog_->registers.insert(prog_->registers.end(), b.prog->registers.begin(), b.prog->registers.end());
  prog_->host_kernels.insert(prog_->host_kernels.end(), b.prog->host_kernels.begin(), b.prog->host_kernels.end());
  prog_->subprograms.insert(prog_->subprograms.end(), b.prog->subprograms.begin(), b.prog->subprograms.end());
  for (int r : ins) b.inputs.push_back(r + b.reg_offset);
  for (int r : outs) b.outputs.push_back(r + b.reg_offset);
  for (auto& [outer, inner] : b.captures) inner += b.reg_offset;
  for (ConcatSite site : sub.concat_sites_) {
    site.output += b.reg_offset;
    for (int& r : site.inputs) r += b.reg_offset;
    b.sites.push_back(std::move(site));
  }
  return b;
}

void ProgramBuilder::emit_body_captures(const Inlined& b) {
  if (!b.captures.empty()) {
    runtime::Instr mv;
    mv.op = runtime::OpCode::kMove;
    mv.where = "captured values";
    for (const auto& [outer, inner] : b.captures) {
      mv.inputs.push_back(outer);
      mv.outputs.push_back(inner);
      mv.attrs.push_back(runtime::kMoveAlias);
    }
    emit(std::move(mv));
  }
}

void ProgramBuilder::emit_body_instrs(const Inlined& b) {
  const int base = static_cast<int>(prog_->instrs.size());
  auto shift = [&](std::vector<int>& regs) {
    for (int& r : regs)
      if (r >= 0) r += b.reg_offset;
  };
  for (runtime::Instr in : b.prog->instrs) {
    shift(in.inputs);
    shift(in.outputs);
    shift(in.release);
    for (std::vector<int>& c : in.captures) shift(c);
    for (int& sp : in.subprograms) sp += b.sub_offset;
    if (in.op == runtime::OpCode::kCallHost) in.callee += b.host_offset;
    for (int* at : {&in.target, &in.end, &in.loop})
      if (*at >= 0) *at += base;
    emit(std::move(in));
  }
  for (ConcatSite site : b.sites) {
    site.instr += static_cast<size_t>(base);
    concat_sites_.push_back(std::move(site));
  }
}

// A tensor of static shape and plain dtype: it may live in the arena.
bool plain_static(const runtime::RegisterInfo& info) {
  return info.dtype != DType::kString && !dtype_is_container(info.dtype) && shape_is_static(info.shape);
}

// How a control-flow result (an If's output, a loop's final value) moves
// into its register: a graph output must own its storage (a branch may
// return a captured input or a constant); one of static shape is copied into
// the arena (no allocation, in a loop too); any other shares the buffer
// (the VM copies one that lies in the arena).
int64_t ProgramBuilder::result_move_flags(const Value* v) {
  if (!inline_ && graph_outputs_.count(v)) return runtime::kMoveDetach;
  return plain_static(prog_->registers[static_cast<size_t>(reg(v))]) ? runtime::kMoveInto : 0;
}

Status ProgramBuilder::emit_if(const Node* n) {
  const std::string where = describe(n);
  if (n->input(0) == nullptr) return invalid_model() << where << ": missing condition";
  std::vector<int> outs;
  for (const Value* o : n->outputs()) {
    if (!o) return unsupported() << where << ": omitted outputs";
    if (!o->type().shape) return unsupported() << where << ": rank of output '" << o->name() << "' is unknown";
    outs.push_back(reg(o));
  }
  std::vector<int64_t> flags;
  for (const Value* o : n->outputs()) flags.push_back(result_move_flags(o));
  // A branch's results become the If's (result_move_flags).
  auto results = [&](const Inlined& b) {
    runtime::Instr mv;
    mv.op = runtime::OpCode::kMove;
    mv.where = where;
    mv.inputs = b.outputs;
    mv.outputs = outs;
    mv.attrs = flags;
    emit(std::move(mv));
  };
  auto check_arity = [&](const Inlined& b) -> Status {
    if (b.outputs.size() == outs.size()) return Status::ok();
    return invalid_model() << where << ": a branch has " << b.outputs.size() << " outputs, the If " << outs.size();
  };
  // A condition known at compile time: the taken branch only, straight-line
  // (the other may not even infer for these shapes: ops/control_flow.cc).
  if (std::optional<bool> taken = ops::known_condition(*n, bounds_)) {
    KILN_ASSIGN_OR_RETURN(Inlined b, inline_graph(n, *taken ? "then_branch" : "else_branch"));
    KILN_RETURN_IF_ERROR(check_arity(b));
    emit_body(b);
    results(b);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Inlined then_b, inline_graph(n, "then_branch"));
  KILN_ASSIGN_OR_RETURN(Inlined else_b, inline_graph(n, "else_branch"));
  KILN_RETURN_IF_ERROR(check_arity(then_b));
  KILN_RETURN_IF_ERROR(check_arity(else_b));
  runtime::Instr br;
  br.op = runtime::OpCode::kBranch;
  br.inputs = {reg(n->input(0))};
  br.where = where;
  const int branch = emit(std::move(br));
  emit_body(then_b);
  results(then_b);
  runtime::Instr jump;
  jump.op = runtime::OpCode::kJump;
  jump.where = where;
  const int to_join = emit(std::move(jump));
  prog_->instrs[static_cast<size_t>(branch)].target = static_cast<int>(prog_->instrs.size());
  emit_body(else_b);
  results(else_b);
  runtime::Instr join;
  join.op = runtime::OpCode::kEndIf;
  join.where = where;
  const int end = emit(std::move(join));
  prog_->instrs[static_cast<size_t>(to_join)].target = end;
  prog_->instrs[static_cast<size_t>(branch)].end = end;
  return Status::ok();
}

// Whether the subgraph's output `out` is its input `in`, directly or through
// Identity nodes.
static bool body_passes_through(const Graph& body, size_t out, size_t in) {
  if (out >= body.outputs().size() || in >= body.inputs().size()) return false;
  const Value* v = body.outputs()[out];
  for (size_t hops = 0; v && hops <= body.num_nodes(); ++hops) {
    if (v == body.inputs()[in]) return true;
    const Node* p = v->producer();
    if (!p || p->op_type() != "Identity" || p->num_inputs() != 1) return false;
    v = p->input(0);
  }
  return false;
}

// Loop, and Scan of opset 9 on (scan): the body's instructions between
// kLoopTest and kLoopNext (runtime/vm.h).
Status ProgramBuilder::emit_loop(const Node* n, bool scan) {
  const std::string where = describe(n);
  std::vector<int> outs;
  for (const Value* o : n->outputs()) {
    if (!o) return unsupported() << where << ": omitted outputs";
    if (!o->type().shape) return unsupported() << where << ": rank of output '" << o->name() << "' is unknown";
    outs.push_back(reg(o));
  }
  KILN_ASSIGN_OR_RETURN(Inlined body, inline_graph(n, "body"));
  // Operands: Loop [M, cond, carried...]; Scan [state..., scan inputs...].
  // Body inputs: Loop [iteration_num, cond, carried...]; Scan [state..., slices...].
  // Body outputs: Loop [cond, carried..., scan outs...]; Scan [state..., scan outs...].
  size_t num_scan_in = scan ? static_cast<size_t>(std::max<int64_t>(n->attr_int("num_scan_inputs", 0), 0)) : 0;
  if (!scan && n->num_inputs() < 2) return invalid_model() << where << ": missing M, cond";
  if (scan && num_scan_in > n->num_inputs()) return invalid_model() << where << ": num_scan_inputs exceeds its inputs";
  const size_t carried = scan ? n->num_inputs() - num_scan_in : n->num_inputs() - 2;
  const size_t body_in0 = scan ? 0 : 2, body_out0 = scan ? 0 : 1;
  if (body.inputs.size() != body_in0 + carried + num_scan_in || body.outputs.size() != body_out0 + outs.size() ||
      outs.size() < carried)
    return invalid_model() << where << ": the body's " << body.inputs.size() << " inputs and " << body.outputs.size()
                           << " outputs do not match the node's " << n->num_inputs() << " inputs and " << outs.size()
                           << " outputs";
  for (size_t i = scan ? 0 : 2; i < n->num_inputs(); ++i)
    if (n->input(i) == nullptr) return invalid_model() << where << ": omitted input " << i;
  const size_t num_scan_out = outs.size() - carried;
  // A Loop with no trip count whose condition is absent, or which its body
  // passes through unchanged, never ends once it starts: refused rather than
  // run until its scan outputs exhaust memory.
  bool endless = false;
  if (!scan && n->input(0) == nullptr) {
    if (n->input(1) == nullptr)
      return invalid_model() << where << ": neither a trip count M nor a condition, so the loop never ends";
    endless = body_passes_through(*n->attr("body")->g, 0, 1);
  }
  std::vector<int64_t> layout;
  if (scan) {
    KILN_ASSIGN_OR_RETURN(layout, scan_layout(n, false, num_scan_in));
  }

  // Carried values: the body's carried inputs hold them. Static ones may live
  // in the arena (kMoveInto: the data is copied there), unless carried values
  // trade places (out_k is another carried input), which copies would clobber.
  std::vector<int> carried_regs(body.inputs.begin() + static_cast<long>(body_in0),
                                body.inputs.begin() + static_cast<long>(body_in0 + carried));
  std::vector<int> carried_outs(body.outputs.begin() + static_cast<long>(body_out0),
                                body.outputs.begin() + static_cast<long>(body_out0 + carried));
  std::vector<int64_t> flags(carried, 0);
  for (size_t j = 0; j < carried; ++j) {
    bool plain = plain_static(prog_->registers[static_cast<size_t>(carried_regs[j])]);
    for (size_t k = 0; k < carried; ++k)
      if (k != j && (carried_outs[k] == carried_regs[j] || carried_outs[j] == carried_regs[k])) plain = false;
    flags[j] = plain ? int64_t{runtime::kMoveInto} : int64_t{0};
  }

  emit_body_captures(body);
  runtime::Instr begin;
  begin.op = runtime::OpCode::kLoopBegin;
  begin.where = where;
  if (scan) {
    begin.attrs = {1};
    for (size_t j = 0; j < num_scan_in; ++j) {
      begin.inputs.push_back(reg(n->input(carried + j)));
      begin.attrs.push_back(layout[2 * j]);
      begin.attrs.push_back(layout[2 * j + 1]);
    }
  } else {
    begin.attrs = {0, endless ? 1 : 0};
    begin.inputs = {n->input(0) ? reg(n->input(0)) : -1, n->input(1) ? reg(n->input(1)) : -1};
  }
  const int p = emit(begin);
  if (carried > 0) {
    runtime::Instr init;
    init.op = runtime::OpCode::kMove;
    init.where = where;
    for (size_t j = 0; j < carried; ++j) init.inputs.push_back(reg(n->input((scan ? 0 : 2) + j)));
    init.outputs = carried_regs;
    for (size_t j = 0; j < carried; ++j) init.attrs.push_back(flags[j] & runtime::kMoveInto);
    emit(std::move(init));
  }
  runtime::Instr test;
  test.op = runtime::OpCode::kLoopTest;
  test.where = where;
  test.loop = p;
  if (scan) {
    test.inputs = begin.inputs;
    test.outputs.assign(body.inputs.begin() + static_cast<long>(carried), body.inputs.end());
  } else {
    test.outputs = {body.inputs[0], body.inputs[1]};
  }
  const int h = emit(std::move(test));
  emit_body_instrs(body);
  runtime::Instr step;
  step.op = runtime::OpCode::kLoopNext;
  step.where = where;
  step.loop = p;
  step.target = h;
  // Without a cond operand the body's cond output is ignored (ONNX: a for loop).
  if (!scan) step.inputs.push_back(n->input(1) ? body.outputs[0] : -1);
  step.inputs.insert(step.inputs.end(), body.outputs.begin() + static_cast<long>(body_out0), body.outputs.end());
  step.outputs = carried_regs;
  step.attrs = {scan ? 1 : 0};
  step.attrs.insert(step.attrs.end(), flags.begin(), flags.end());
  emit(std::move(step));
  runtime::Instr end;
  end.op = runtime::OpCode::kLoopEnd;
  end.where = where;
  end.loop = p;
  end.inputs = carried_regs;
  end.outputs = outs;
  // Final values (result_move_flags: a loop nested in a loop allocates nothing).
  for (size_t j = 0; j < carried; ++j) end.attrs.push_back(result_move_flags(n->output(j)));
  for (size_t k = 0; k < num_scan_out; ++k) {
    end.attrs.push_back(scan ? layout[2 * (num_scan_in + k)] : 0);
    end.attrs.push_back(scan ? layout[2 * (num_scan_in + k) + 1] : 0);
  }
  const int x = emit(std::move(end));
  prog_->instrs[static_cast<size_t>(p)].end = x;
  prog_->instrs[static_cast<size_t>(h)].target = x;
  return Status::ok();
}

// SequenceMap, and Scan of opset 8: a sub-program run per element (runtime/vm.h).
Status ProgramBuilder::emit_control(const Node* n) {
  if (n->op_type() == "If") return emit_if(n);
  const bool batched_scan = n->op_type() == "Scan" && n->attr_int("kiln_scan_batched", 0) != 0;
  if (n->op_type() == "Loop" || (n->op_type() == "Scan" && !batched_scan)) return emit_loop(n, n->op_type() == "Scan");
  runtime::Instr in;
  in.where = describe(n);
  in.op = n->op_type() == "SequenceMap" ? runtime::OpCode::kSequenceMap : runtime::OpCode::kScan;
  if (in.op == runtime::OpCode::kSequenceMap)
    for (const Value* v : n->inputs()) in.attrs.push_back(v && v->dtype() == DType::kSequence ? 1 : 0);
  for (const Value* v : n->inputs()) in.inputs.push_back(v ? reg(v) : -1);
  for (const Value* o : n->outputs()) {
    if (!o) return unsupported() << in.where << ": omitted outputs";
    if (!o->type().shape) return unsupported() << in.where << ": rank of output '" << o->name() << "' is unknown";
    in.outputs.push_back(reg(o));
  }
  // Scan in opset 8: input 0, sequence_lens, may be omitted.
  for (size_t i = batched_scan ? 1 : 0; i < in.inputs.size(); ++i)
    if (in.inputs[i] < 0) return invalid_model() << in.where << ": omitted input";
  const Attribute* a = n->attr("body");
  if (!a || !a->g) return invalid_model() << in.where << ": missing subgraph body";
  ProgramBuilder sub(*a->g, opts_, state_);
  Status st = sub.build_program(bounds_);
  if (!st.is_ok()) return st.with_context(in.where + " body");
  std::vector<int> caps;
  for (const Value* c : sub.capture_inputs_) {
    const Value* outer = g_.find_value(c->name());
    if (!outer) return internal_error() << in.where << ": capture '" << c->name() << "' does not resolve";
    caps.push_back(reg(outer));
  }
  in.subprograms.push_back(static_cast<int>(prog_->subprograms.size()));
  prog_->subprograms.push_back(sub.prog_);
  if (in.op == runtime::OpCode::kScan) {
    size_t num_scan_in = static_cast<size_t>(std::max<int64_t>(n->attr_int("num_scan_inputs", 0), 0));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> layout, scan_layout(n, true, num_scan_in));
    in.attrs = {static_cast<int64_t>(num_scan_in), 1};
    in.attrs.insert(in.attrs.end(), layout.begin(), layout.end());
  }
  in.inputs.insert(in.inputs.end(), caps.begin(), caps.end());
  in.captures.push_back(std::move(caps));
  emit(std::move(in));
  return Status::ok();
}

// Lifetimes of registers in instruction order; releases after last use; a
// static arena when every planned register has a static shape.
void ProgramBuilder::plan_memory() {
  runtime::Program& p = *prog_;
  size_t nr = p.registers.size();
  std::vector<int> def_at(nr, -1), last_use(nr, -1), alias_of(nr, -1);
  std::vector<bool> host_owned(nr, false), pinned(nr, false);
  for (int r : p.input_registers) pinned[r] = true;
  for (int r : p.output_registers) pinned[r] = true;
  for (size_t r = 0; r < nr; ++r)
    if (p.registers[r].is_constant) pinned[r] = true;
  // Sources of moves that share their storage with the destination: their
  // buffers (their roots') must not be in the arena, which the next
  // iteration or a later kernel would overwrite.
  std::vector<int> shared_sources;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const runtime::Instr& in = p.instrs[i];
    for (int r : in.inputs)
      if (r >= 0) last_use[r] = static_cast<int>(i);
    for (int r : in.outputs) {
      if (r < 0) continue;
      if (def_at[r] < 0) def_at[r] = static_cast<int>(i);
      if (in.op == runtime::OpCode::kView) alias_of[r] = in.inputs[0];
      // Outputs a host kernel allocates itself are not planned; those it
      // fills (fills_outputs) are, like a compiled kernel's. Nor are a loop's
      // results and per-iteration scalars.
      if ((in.op == runtime::OpCode::kCallHost && !in.fills_outputs) || in.op == runtime::OpCode::kScan ||
          in.op == runtime::OpCode::kSequenceMap ||
          (in.op == runtime::OpCode::kLoopTest && p.instrs[static_cast<size_t>(in.loop)].attrs[0] == 0))
        host_owned[r] = true;
    }
    // Moves (runtime/vm.h): an alias names its source; a destination that
    // may not be planned shares the source's storage. kLoopEnd's first
    // outputs are moves of the carried values; its scan outputs are built.
    if (in.op == runtime::OpCode::kMove || in.op == runtime::OpCode::kLoopNext || in.op == runtime::OpCode::kLoopEnd) {
      size_t src0 = in.op == runtime::OpCode::kLoopNext && in.attrs[0] == 0 ? 1 : 0;
      size_t flags0 = in.op == runtime::OpCode::kLoopNext ? 1 : 0;
      size_t pairs = in.op == runtime::OpCode::kLoopEnd ? in.inputs.size() : in.outputs.size();
      for (size_t k = pairs; k < in.outputs.size(); ++k) host_owned[in.outputs[k]] = true;
      for (size_t k = 0; k < pairs; ++k) {
        int src = in.inputs[src0 + k], dst = in.outputs[k];
        int64_t flags = in.attrs[flags0 + k];
        if (flags & runtime::kMoveAlias) {
          alias_of[dst] = src;
        } else if (!(flags & runtime::kMoveInto)) {
          host_owned[dst] = true;
          // Detach never shares an arena source (the VM copies it).
          if (!(flags & runtime::kMoveDetach)) shared_sources.push_back(src);
        }
      }
    }
  }
  // Control flow (runtime/vm.h): a register read inside a loop or an If but
  // defined before it lives until the region's last instruction (a loop reads
  // it again each iteration; an If's branch that reads it may not run, and
  // the join releases it). Regions nest; each extends to its own end.
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    int e = p.instrs[s].end;
    if (e < 0) continue;
    for (int i = static_cast<int>(s); i <= e; ++i)
      for (int r : p.instrs[static_cast<size_t>(i)].inputs)
        if (r >= 0 && def_at[r] < static_cast<int>(s)) last_use[r] = std::max(last_use[r], e);
  }
  // A view keeps its source alive: extend the root's lifetime.
  auto root = [&](int r) {
    while (alias_of[r] >= 0) r = alias_of[r];
    return r;
  };
  std::vector<int> root_last(last_use);
  for (size_t r = 0; r < nr; ++r) {
    int rr = root(static_cast<int>(r));
    root_last[rr] = std::max(root_last[rr], last_use[r]);
  }
  for (int r : shared_sources) host_owned[root(r)] = true;
  for (size_t r = 0; r < nr; ++r) {
    if (pinned[r]) continue;
    // A value nothing reads (a Loop body's cond output when the Loop has no
    // cond operand) is released where it is made.
    int at = last_use[r] >= 0 ? last_use[r] : def_at[r];
    if (at >= 0) p.instrs[static_cast<size_t>(at)].release.push_back(static_cast<int>(r));
  }

  bool all_static = true;
  std::vector<int> planned;
  for (size_t r = 0; r < nr; ++r) {
    if (pinned[r] || host_owned[r] || alias_of[r] >= 0 || def_at[r] < 0) continue;
    if (!shape_is_static(p.registers[r].shape) || p.registers[r].dtype == DType::kString ||
        dtype_is_container(p.registers[r].dtype)) {
      all_static = false;
      continue;
    }
    planned.push_back(static_cast<int>(r));
  }
  // Byte sizes of the planned registers. A size (or their sum) that overflows
  // int64 cannot be planned: such registers are then allocated at run time,
  // where the allocation check reports the node and shape.
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (int r : planned) {
    std::vector<int64_t> dims;
    for (const Expr& d : p.registers[r].shape) dims.push_back(*d.as_const());
    std::optional<int64_t> nb = checked_nbytes(p.registers[r].dtype, dims);
    if (!nb || *nb > std::numeric_limits<int64_t>::max() / 4 - total) {
      all_static = false;
      break;
    }
    bytes.push_back(*nb);
    total += *nb + 64;
  }
  p.static_plan = all_static;
  if (!all_static) return;
  std::vector<int> first(nr, -1), last(nr, -1);
  for (int r : planned) {
    first[r] = def_at[r];
    last[r] = std::max(root_last[r], def_at[r]);
  }
  // Concats in place: each input is written by its producer straight into its
  // slice of the output, and the Concat only binds the output. The output's
  // buffer then lives from the first input's definition to the last use of
  // any of them. An input qualifies when it is planned, defined before the
  // Concat, appears once, and is in no other in-place Concat. Concats are
  // taken last first, so where features feed several (a densenet block's
  // Concats each take a prefix of the next one's inputs), the block's last
  // Concat hosts them all; the earlier ones then lie at the start of its
  // buffer (below) instead of copying.
  std::vector<int> host(nr, -1);  // host[r]: the output whose buffer holds r
  std::vector<int64_t> slice(nr, 0);
  std::set<int> is_planned(planned.begin(), planned.end());
  //
  // Splits in place, after the Concats (a Split output already placed in a
  // Concat's slice is copied): each output is a slice of the input's buffer,
  // which lives until the last use of any of them. An output qualifies when
  // it is planned, defined by the Split, appears once and is in no other
  // in-place site; the input when it is planned and hosts nothing yet.
  // resnet50's first block computes conv1 and the downsample branch as one
  // 1x1 convolution whose Split copied 4 MB per run.
  for (bool splits : {false, true}) {
    for (auto it = concat_sites_.rbegin(); it != concat_sites_.rend(); ++it) {
      const ConcatSite& site = *it;
      if (site.split != splits || !is_planned.count(site.output) || host[site.output] >= 0) continue;
      bool ok = true;
      std::set<int> seen;
      for (int r : site.inputs)
        ok = ok && is_planned.count(r) && host[r] < 0 && r != site.output && seen.insert(r).second &&
             (splits ? def_at[r] == static_cast<int>(site.instr) : def_at[r] < static_cast<int>(site.instr));
      if (!ok) continue;
      for (size_t i = 0; i < site.inputs.size(); ++i) {
        int r = site.inputs[i];
        host[r] = site.output;
        slice[r] = site.offsets[i];
        first[site.output] = std::min(first[site.output], first[r]);
        last[site.output] = std::max(last[site.output], last[r]);
      }
      host[site.output] = site.output;
      runtime::Instr& in = p.instrs[site.instr];
      in.op = runtime::OpCode::kBind;
      in.callee = -1;
      in.inputs.clear();
    }
  }
  // A Concat whose inputs all lie, in its order and back to back, in one
  // host buffer (a prefix of a later Concat's inputs) is that stretch of it.
  for (const ConcatSite& site : concat_sites_) {
    if (site.split || !is_planned.count(site.output) || host[site.output] >= 0 || site.inputs.empty()) continue;
    int h = host[site.inputs[0]];
    int64_t base = slice[site.inputs[0]] - site.offsets[0];
    bool ok = h >= 0 && h != site.inputs[0] && base >= 0;
    for (size_t i = 0; ok && i < site.inputs.size(); ++i) {
      int r = site.inputs[i];
      ok = host[r] == h && r != h && slice[r] - site.offsets[i] == base;
    }
    if (!ok) continue;
    host[site.output] = h;
    slice[site.output] = base;
    last[h] = std::max(last[h], last[site.output]);
    runtime::Instr& in = p.instrs[site.instr];
    in.op = runtime::OpCode::kBind;
    in.callee = -1;
    in.inputs.clear();
  }
  std::vector<runtime::BufferLifetime> lifetimes;
  std::vector<int> owners;
  for (size_t i = 0; i < planned.size(); ++i) {
    int r = planned[i];
    if (host[r] >= 0 && host[r] != r) continue;
    owners.push_back(r);
    lifetimes.push_back({bytes[i], first[r], last[r]});
  }
  runtime::MemoryPlan plan = runtime::plan_memory(lifetimes);
  for (size_t i = 0; i < owners.size(); ++i) p.registers[owners[i]].arena_offset = plan.offsets[i];
  for (int r : planned)
    if (host[r] >= 0 && host[r] != r) p.registers[r].arena_offset = p.registers[host[r]].arena_offset + slice[r];
  p.arena_bytes = plan.arena_bytes;
}

Status ProgramBuilder::build_program(SymbolBounds bounds) {
  bounds_ = bounds;
  for (const Value* v : g_.outputs()) graph_outputs_.insert(v);
  KILN_RETURN_IF_ERROR(classify());

  std::set<const Node*> compiled;
  for (const auto& [n, m] : mode_)
    if (m == Mode::kCompiled) compiled.insert(n);
  std::vector<passes::FusedGroup> groups = passes::fuse_elementwise(g_, compiled, fusion_enabled(opts_));
  std::map<const Node*, const passes::FusedGroup*> group_of_root;
  for (const auto& grp : groups) group_of_root[grp.nodes.back()] = &grp;

  for (const Value* v : g_.inputs()) {
    if (v->is_constant()) continue;
    if (!v->type().shape) return unsupported() << "input '" << v->name() << "' has unknown rank";
    prog_->input_registers.push_back(reg(v));
  }
  for (const Value* v : g_.captures()) {
    if (v->is_constant()) continue;
    if (!v->type().shape) return unsupported() << "captured value '" << v->name() << "' has unknown rank";
    prog_->input_registers.push_back(reg(v));
    capture_inputs_.push_back(v);
  }
  for (const Node* n : g_.nodes()) {
    Mode m = mode_[n];
    if (m == Mode::kCompiled) {
      auto it = group_of_root.find(n);
      if (it != group_of_root.end()) KILN_RETURN_IF_ERROR(emit_group(*it->second));
    } else {
      KILN_RETURN_IF_ERROR(emit_node(n, m));
    }
  }
  prog_->bounds = bounds;
  if (inline_) return Status::ok();
  // Graph outputs that are inputs or constants are copied out.
  for (const Value* v : g_.outputs()) {
    int r = reg(v);
    if (v->producer() == nullptr) {
      runtime::RegisterInfo copy = prog_->registers[r];
      copy.is_constant = false;
      copy.constant = Tensor();
      copy.name += ".out";
      int c = static_cast<int>(prog_->registers.size());
      prog_->registers.push_back(copy);
      runtime::Instr in;
      in.op = runtime::OpCode::kCopy;
      in.inputs = {r};
      in.outputs = {c};
      in.where = "output '" + v->name() + "'";
      prog_->instrs.push_back(std::move(in));
      r = c;
    }
    prog_->registers[r].is_output = true;
    prog_->output_registers.push_back(r);
  }
  plan_memory();
  prog_->bounds = std::move(bounds);
  return Status::ok();
}

Result<CompiledProgram> ProgramBuilder::build(SymbolBounds bounds) {
  auto t0 = std::chrono::steady_clock::now();
  CompiledProgram out;
  KILN_RETURN_IF_ERROR(build_program(std::move(bounds)));
  if (state_->lower_only) return out;
  // Code generation for all kernels (of this graph and its subgraphs) at once.
  codegen::CodegenOptions copts;
  copts.dump_ir = opts_.dump_ir;
  const std::vector<tir::PrimFunc>& funcs = state_->funcs;
  if (!funcs.empty()) {
    auto module = codegen::compile(funcs, copts);
    if (!module.is_ok()) return module.status().with_context("code generation for " + g_.source);
    out.module = std::shared_ptr<codegen::CompiledModule>(std::move(*module));
    std::vector<runtime::CompiledKernel> kernels;
    std::vector<std::string> symbols;
    std::map<std::string, int, std::less<>> slots;
    for (const auto& [func, call_syms] : state_->entries) {
      const tir::PrimFunc& f = funcs[static_cast<size_t>(func)];
      runtime::CompiledKernel k;
      k.name = f.name;
      k.fn = out.module->lookup(f.name);
      if (k.fn == nullptr) return internal_error() << "kernel " << f.name << " missing after code generation";
      k.sym_names = call_syms;
      for (const std::string& name : call_syms) {
        auto [it, added] = slots.emplace(name, static_cast<int>(symbols.size()));
        if (added) symbols.push_back(name);
        k.sym_slots.push_back(it->second);
      }
      kernels.push_back(std::move(k));
    }
    for (const auto& p : state_->programs) {
      p->kernels = kernels;
      p->symbols = symbols;
      p->symbol_slots = slots;
    }
  }

  for (const Value* v : g_.inputs())
    if (!v->is_constant()) out.inputs.push_back(make_info(v));
  for (const Value* v : g_.outputs()) out.outputs.push_back(make_info(v));
  out.stats.num_kernels = static_cast<int>(funcs.size());
  out.kernel_choices = state_->choices;
  out.stats.num_runtime_kernels = state_->num_host_calls;
  out.stats.arena_bytes = prog_->static_plan ? prog_->arena_bytes : 0;
  out.stats.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.program = prog_;
  return out;
}

std::string ProgramBuilder::groups_text() {
  if (Status st = classify(); !st.is_ok()) return "error: " + st.to_string() + "\n";
  std::set<const Node*> compiled;
  for (const auto& [n, m] : mode_)
    if (m == Mode::kCompiled) compiled.insert(n);
  std::ostringstream os;
  for (const auto& grp : passes::fuse_elementwise(g_, compiled, fusion_enabled(opts_))) {
    os << "group %" << grp.nodes.back()->output(0)->name() << ":";
    for (const Node* n : grp.nodes) os << " " << n->op_type();
    os << "\n";
  }
  return os.str();
}

}  // namespace

Result<std::string> lowered_kernels_text(Graph& g, const CompileOptions& options) {
  ProgramBuilder builder(g, options);
  builder.set_lower_only(true);
  KILN_RETURN_IF_ERROR(builder.build(g.bounds).status());
  return builder.kernels_text();
}

Result<std::string> fused_groups_text(Graph& g, const CompileOptions& options) {
  ProgramBuilder builder(g, options);
  return builder.groups_text();
}

Status check_supported(const Graph& g) {
  // Op semantics are implemented up to the newest ai.onnx opset of the pinned
  // onnx package; a newer model may rely on semantics Kiln does not know.
  if (auto it = g.opsets.find(""); it != g.opsets.end() && it->second > kNewestOnnxOpset)
    return unsupported() << g.source << ": ai.onnx opset " << it->second << " is newer than the newest Kiln knows ("
                         << kNewestOnnxOpset << ")";
  std::map<std::string, std::vector<std::string>> missing;  // op -> node names
  for_each_node(g, [&](const Node* n) {
    const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
    bool ok = def != nullptr && (def->lower || def->kernel || def->is_view || is_control_flow(n));
    if (!ok) {
      std::string op = n->domain().empty() ? n->op_type() : n->domain() + ":" + n->op_type();
      missing[op].push_back(n->name().empty() ? "<unnamed>" : n->name());
    }
  });
  if (missing.empty()) return Status::ok();
  std::ostringstream os;
  os << g.source << ": " << missing.size() << " unsupported op" << (missing.size() > 1 ? "s" : "") << ": ";
  bool first = true;
  for (const auto& [op, nodes] : missing) {
    os << (first ? "" : "; ") << op << " (node" << (nodes.size() > 1 ? "s" : "") << " ";
    for (size_t i = 0; i < nodes.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << nodes[i] << "'";
    if (nodes.size() > 5) os << ", ... " << nodes.size() << " in all";
    os << ")";
    first = false;
  }
  return unsupported() << os.str();
}

std::vector<std::string> pipeline_for(const CompileOptions& options) {
  std::vector<std::string> list = options.passes ? *options.passes : passes::default_pipeline(options.naive);
  std::vector<std::string> out;
  for (const std::string& p : list)
    if (std::find(options.disable_passes.begin(), options.disable_passes.end(), p) == options.disable_passes.end())
      out.push_back(p);
  return passes::with_shape_inference(out);
}

namespace {

// CompileOptions::prefer_impls as a choice source: the first preferred
// candidate that applies to a node, with its default knobs where not given.
class PreferredImpls : public strategy::ChoiceSource {
 public:
  explicit PreferredImpls(std::vector<std::pair<std::string, std::optional<tir::Knobs>>> prefs)
      : prefs_(std::move(prefs)) {}
  std::string name() const override { return "--impl"; }
  bool strict() const override { return true; }
  std::optional<strategy::Choice> lookup(const Node& n, const std::vector<const strategy::Candidate*>& applicable,
                                         const Target& target) override {
    for (const auto& [name, knobs] : prefs_) {
      for (const strategy::Candidate* c : applicable) {
        if (c->name != name) continue;
        strategy::Choice ch;
        ch.candidate = name;
        // Knobs given override the candidate's defaults; those not given keep them.
        ch.knobs = c->default_knobs ? c->default_knobs(n, target) : tir::Knobs{};
        if (knobs)
          for (const auto& [k, v] : *knobs) ch.knobs[k] = v;
        ch.source = "preferred";
        ch.why = "--impl " + name;
        return ch;
      }
    }
    return std::nullopt;
  }

 private:
  std::vector<std::pair<std::string, std::optional<tir::Knobs>>> prefs_;
};

Result<std::shared_ptr<strategy::ChoiceSource>> preferred_source(const std::vector<std::string>& prefs) {
  std::vector<std::pair<std::string, std::optional<tir::Knobs>>> parsed;
  for (const std::string& p : prefs) {
    size_t colon = p.find(':');
    std::string name = p.substr(0, colon);
    if (strategy::find_candidate(name) == nullptr) {
      std::string known;
      for (const strategy::Candidate* c : strategy::all_candidates()) known += (known.empty() ? "" : ", ") + c->name;
      return invalid_argument() << "unknown implementation '" << name << "' (known: " << known << ")";
    }
    std::optional<tir::Knobs> knobs;
    if (colon != std::string::npos) {
      auto k = tir::parse_knobs(p.substr(colon + 1));
      if (!k.is_ok()) return k.status().with_context("implementation '" + p + "'");
      knobs = *k;
    }
    parsed.emplace_back(name, knobs);
  }
  return std::shared_ptr<strategy::ChoiceSource>(std::make_shared<PreferredImpls>(std::move(parsed)));
}

Tensor random_input(const TensorType& t, uint32_t seed) {
  std::vector<int64_t> dims;
  for (const Expr& d : *t.shape) dims.push_back(*d.as_const());
  Tensor x(t.dtype, dims);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (t.dtype == DType::kFloat32)
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = dist(rng);
  return x;
}

// Compiles node `n` alone under `choice` (its constants copied, the other
// inputs random) and returns the median seconds of a few runs. Errors for a
// node whose input shapes are not all constants.
Result<double> measure_choice(const Graph& parent, const Node& n, const strategy::Choice& choice,
                              const CompileOptions& options) {
  auto g = std::make_unique<Graph>();
  g->source = parent.source + " (measuring " + choice.candidate + ")";
  g->opsets = parent.opsets;
  std::vector<Value*> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v == nullptr) {
      ins.push_back(nullptr);
      continue;
    }
    if (v->is_constant()) {
      ins.push_back(g->add_constant(v->name(), v->constant()));
      continue;
    }
    const TensorType& t = v->type();
    if (!t.shape) return unsupported() << "input '" << v->name() << "' has unknown rank";
    for (const Expr& d : *t.shape)
      if (!d.as_const()) return unsupported() << "input '" << v->name() << "' has a symbolic shape";
    ins.push_back(g->add_input(v->name(), t));
    feeds.push_back(random_input(t, static_cast<uint32_t>(feeds.size() + 1)));
  }
  std::vector<std::string> outs;
  for (const Value* o : n.outputs()) outs.push_back(o ? o->name() : "");
  Node* m = g->add_node(n.op_type(), ins, outs, n.domain(), n.name());
  for (const auto& [k, a] : n.attrs())
    if (k.rfind("kiln_", 0) != 0) m->set_attr(k, a);
  std::vector<Value*> gouts;
  for (Value* o : m->outputs()) gouts.push_back(o);
  g->set_outputs(gouts);
  ops::InferContext ictx;
  ictx.graph = g.get();
  KILN_RETURN_IF_ERROR(ops::infer_shapes(*g, ictx));
  strategy::record_choice(*m, choice);
  const strategy::Candidate* c = strategy::find_candidate(choice.candidate);
  if (c && c->transform) KILN_RETURN_IF_ERROR(c->transform(*g, *m, choice.knobs));
  g->remove_dead_values();
  CompileOptions o = options;
  o.passes = std::vector<std::string>{};
  o.disable_passes.clear();
  o.dump_ir = false;
  KILN_ASSIGN_OR_RETURN(CompiledProgram p, compile_graph(std::move(g), o));
  runtime::VM vm(p.program, resolve_threads(options.threads));
  vm.set_memory_limit(options.max_memory_bytes);
  KILN_RETURN_IF_ERROR(vm.run(feeds).status());
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(vm.run(feeds).status());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What a measurement of `choice` on `n` depends on: the op, its attributes,
// its inputs' types and which are constants, and the choice. Not the names
// (two convolutions of one shape in a model are one measurement) nor the
// constants' values (timings do not depend on them).
std::string measure_key(const Node& n, const strategy::Choice& choice) {
  Graph g;
  std::vector<Value*> ins;
  std::string constness;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    constness += v == nullptr ? '-' : v->is_constant() ? 'c' : 'x';
    ins.push_back(v == nullptr ? nullptr : g.add_input("in" + std::to_string(i), v->type()));
  }
  std::vector<std::string> outs;
  for (size_t i = 0; i < n.num_outputs(); ++i) outs.push_back(n.output(i) ? "out" + std::to_string(i) : "");
  Node* m = g.add_node(n.op_type(), ins, outs, n.domain(), "");
  for (const auto& [k, a] : n.attrs())
    if (k.rfind("kiln_", 0) != 0) m->set_attr(k, a);
  return print_graph(g) + "\n" + constness + " " + choice.candidate + " " + tir::knobs_to_string(choice.knobs);
}

}  // namespace

TensorInfo make_info(const Value* v) {
  TensorInfo info;
  info.name = v->name();
  info.dtype = v->dtype();
  if (v->type().shape)
    for (const Expr& d : *v->type().shape) info.dims.push_back(print_expr(d));
  return info;
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

static Result<strategy::SelectOptions> select_options(const Graph& g, const CompileOptions& options) {
  strategy::SelectOptions so;
  so.threads = resolve_threads(options.threads);
  if (!options.prefer_impls.empty()) {
    KILN_ASSIGN_OR_RETURN(auto src, preferred_source(options.prefer_impls));
    so.sources.push_back(src);
  }
  if (options.select == "measure") {
    // One measurement per workload and choice: block-layout and
    // select-kernels ask for the same ones, and a model repeats its shapes.
    auto cache = std::make_shared<std::map<std::string, double>>();
    so.measure = [&g, options, cache](const Node& n, const strategy::Choice& c) -> Result<double> {
      std::string key = measure_key(n, c);
      if (auto it = cache->find(key); it != cache->end()) return it->second;
      KILN_ASSIGN_OR_RETURN(double t, measure_choice(g, n, c, options));
      cache->emplace(std::move(key), t);
      return t;
    };
  } else if (options.select != "priority") {
    return invalid_argument() << "select must be 'priority' or 'measure', not '" << options.select << "'";
  }
  return so;
}

passes::PassContext pass_context(const Graph& g, const CompileOptions& options) {
  passes::PassContext ctx;
  ctx.infer.bounds = g.bounds;
  // Constant folding runs the folded nodes through the compiler itself, with
  // no passes (shape inference only) so that it cannot recurse.
  ctx.evaluate = [options](std::unique_ptr<Graph> sub) -> Result<std::vector<Tensor>> {
    CompileOptions o = options;
    o.passes = std::vector<std::string>{};
    o.disable_passes.clear();
    o.dump_ir = false;
    KILN_ASSIGN_OR_RETURN(CompiledProgram p, compile_graph(std::move(sub), o));
    runtime::VM vm(p.program, 1);
    vm.set_memory_limit(options.max_memory_bytes);
    return vm.run({});
  };
  return ctx;
}

Result<OptimizedGraph> optimize_graph(Graph& g, const CompileOptions& options, const std::vector<std::string>& pipeline,
                                      const passes::Instrumentation& inst) {
  KILN_RETURN_IF_ERROR(check_supported(g));
  passes::PassContext ctx = pass_context(g, options);
  KILN_ASSIGN_OR_RETURN(ctx.select, select_options(g, options));
  OptimizedGraph out;
  KILN_ASSIGN_OR_RETURN(out.runs, passes::run_passes(g, pipeline, ctx, inst));
  out.bounds = ctx.infer.bounds;
  return out;
}

Result<CompiledProgram> compile_graph(std::unique_ptr<Graph> g, const CompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  int nodes_imported = static_cast<int>(g->num_nodes());
  KILN_ASSIGN_OR_RETURN(OptimizedGraph opt, optimize_graph(*g, options, pipeline_for(options)));
  if (options.dump_ir) std::fprintf(stderr, "%s\n", print_graph(*g).c_str());
  ProgramBuilder builder(*g, options);
  KILN_ASSIGN_OR_RETURN(CompiledProgram out, builder.build(opt.bounds));
  out.stats.num_nodes_imported = nodes_imported;
  out.stats.num_nodes = static_cast<int>(g->num_nodes());
  out.graph = std::move(g);
  out.stats.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kiln::driver
