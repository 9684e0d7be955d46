#include "bytecode/bytecode.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "ops/registry.h"
#include "support/memory_limit.h"

namespace kiln::bytecode {

namespace {

using partition::NodeKind;

std::string describe(const Node* n) { return n->describe(); }

// A host kernel's node alone in a graph, as text (runtime::Program::host_kernel_nodes).
std::string node_text(const Node* n) {
  Graph g;
  std::vector<Value*> inputs;
  for (const Value* v : n->inputs()) {
    if (v == nullptr) {
      inputs.push_back(nullptr);
      continue;
    }
    Value* in = g.find_value(v->name());
    if (in == nullptr) {
      in = g.add_input(v->name(), v->type());
      in->set_sym_value(v->sym_value());
    }
    inputs.push_back(in);
  }
  std::vector<std::string> names;
  for (const Value* o : n->outputs()) names.push_back(o ? o->name() : "");
  Node* copy = g.add_node(n->op_type(), inputs, names, n->domain(), n->name());
  for (const auto& [key, attr] : n->attrs()) copy->set_attr(key, attr);
  std::vector<Value*> outputs;
  for (size_t i = 0; i < n->num_outputs(); ++i) {
    if (n->output(i) == nullptr || copy->output(i) == nullptr) continue;
    copy->output(i)->set_type(n->output(i)->type());
    outputs.push_back(copy->output(i));
  }
  g.set_outputs(outputs);
  PrintOptions options;
  options.max_constant_elements = -1;
  return print_graph(g, options);
}

bool shape_is_static(const std::vector<Expr>& shape) {
  for (const Expr& d : shape)
    if (!d.is_const()) return false;
  return true;
}

using partition::has_complete_sym_value;

// State shared by the builder of the model's graph and the builders of its
// subgraphs: every program gets the whole kernel table.
struct BuildState {
  const partition::Partition* partition = nullptr;
  const kernels::KernelSet* kernels = nullptr;
  Bytecode* out = nullptr;
  std::map<std::pair<int, std::vector<std::string>>, int> entry_index;
};

class ProgramBuilder {
 public:
  // inline_body: the graph is an If branch or a Loop/Scan body whose
  // instructions the parent splices into its own program (emit_control):
  // its outputs are not copied out and its memory is planned by the parent.
  ProgramBuilder(const partition::GraphPartition& gp, BuildState& state, const SymbolBounds& bounds,
                 bool inline_body = false)
      : gp_(gp), g_(*gp.graph), state_(state), bounds_(bounds), inline_(inline_body) {
    state_.out->programs.push_back(prog_);
  }

  Status build_program();
  std::shared_ptr<runtime::Program> program() const { return prog_; }
  std::vector<ConcatSite>& concat_sites() { return concat_sites_; }

 private:
  int reg(const Value* v);
  Status emit_group(const partition::FusedGroup& group);
  Status emit_node(const Node* n, NodeKind kind);
  // The run-time checks of the dims a node's lowering or view assumed (OpDef::dim_checks).
  void emit_dim_checks(const Node* n);
  Status emit_control(const Node* n);
  struct Inlined;
  Result<Inlined> inline_graph(const Node* n, const char* attr);
  const partition::GraphPartition* subgraph(const Node* n, const std::string& attr) const;
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

  const partition::GraphPartition& gp_;
  const Graph& g_;
  BuildState& state_;
  const SymbolBounds& bounds_;
  std::shared_ptr<runtime::Program> prog_ = std::make_shared<runtime::Program>();
  bool inline_ = false;
  std::map<const Value*, int> regs_;
  // Captured outer values that are inputs of this (sub)program, after the graph inputs.
  std::vector<const Value*> capture_inputs_;
  std::vector<ConcatSite> concat_sites_;
  std::optional<ConcatSite> concat_site(const partition::FusedGroup& group);
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

Status ProgramBuilder::emit_group(const partition::FusedGroup& group) {
  auto call_it = state_.kernels->calls.find(&group);
  KILN_CHECK(call_it != state_.kernels->calls.end()) << "no kernel for the group of " << describe(group.nodes.back());
  const kernels::GroupCall& call = call_it->second;
  std::vector<int> in_regs, out_regs;
  for (const Value* v : call.inputs) in_regs.push_back(reg(v));
  for (const Value* v : call.outputs) out_regs.push_back(reg(v));
  // The call passes this group's own symbols where the kernel names s<i>.
  // (A name canonicalize left alone is the model's own and passes itself.)
  std::map<std::string, std::string, std::less<>> original;
  for (size_t i = 0; i < call.symbols.size(); ++i) original["s" + std::to_string(i)] = call.symbols[i];
  std::vector<std::string> call_syms;
  for (const std::string& sym : state_.kernels->kernels[static_cast<size_t>(call.kernel)].func.sym_names) {
    auto o = original.find(sym);
    call_syms.push_back(o != original.end() ? o->second : sym);
  }
  auto entry = std::make_pair(call.kernel, std::move(call_syms));
  auto [ent, added] = state_.entry_index.emplace(entry, static_cast<int>(state_.out->entries.size()));
  if (added) state_.out->entries.push_back(std::move(entry));
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
std::optional<ConcatSite> ProgramBuilder::concat_site(const partition::FusedGroup& group) {
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

Status ProgramBuilder::emit_node(const Node* n, NodeKind mode) {
  runtime::Instr in;
  in.where = describe(n);
  switch (mode) {
    case NodeKind::kShape: {
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
    case NodeKind::kView: {
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
      if (gp_.graph_outputs.count(out) && !inline_) {
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
    case NodeKind::kHost: {
      const ops::OpDef* def = ops::find_op(n->domain(), n->op_type());
      auto kernel = def->kernel(*n);
      if (!kernel.is_ok()) return kernel.status().with_context(in.where);
      in.op = runtime::OpCode::kCallHost;
      in.fills_outputs = def->kernel_fills_outputs;
      in.callee = static_cast<int>(prog_->host_kernels.size());
      prog_->host_kernels.push_back(std::move(*kernel));
      prog_->host_kernel_nodes.push_back(node_text(n));
      // A host kernel a candidate chose (conv.onednn) is listed with the compiled ones.
      if (auto choice = strategy::recorded_choice(*n)) {
        kernels::KernelChoiceInfo info;
        info.kernel = "host" + std::to_string(in.callee) + "_" + n->op_type();
        info.node = describe(n);
        info.impl = choice->candidate;
        info.knobs = tir::knobs_to_string(choice->knobs);
        info.source = choice->source;
        info.why = choice->why;
        state_.out->host_choices.push_back(std::move(info));
      }
      for (const Value* v : n->inputs()) in.inputs.push_back(v ? reg(v) : -1);
      for (const Value* o : n->outputs()) {
        if (!o) return unsupported() << in.where << ": omitted outputs of host kernels";
        in.outputs.push_back(reg(o));
      }
      ++state_.out->num_host_calls;
      prog_->instrs.push_back(std::move(in));
      return Status::ok();
    }
    case NodeKind::kControl:
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
  const partition::GraphPartition* part = subgraph(n, attr);
  if (!a || !a->g || part == nullptr) return invalid_model() << describe(n) << ": missing subgraph " << attr;
  ProgramBuilder sub(*part, state_, bounds_, /*inline_body=*/true);
  Status st = sub.build_program();
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
  prog_->host_kernel_nodes.insert(prog_->host_kernel_nodes.end(), b.prog->host_kernel_nodes.begin(),
                                  b.prog->host_kernel_nodes.end());
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
  if (!inline_ && gp_.graph_outputs.count(v)) return runtime::kMoveDetach;
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
  const partition::GraphPartition* part = subgraph(n, "body");
  if (!a || !a->g || part == nullptr) return invalid_model() << in.where << ": missing subgraph body";
  ProgramBuilder sub(*part, state_, bounds_);
  Status st = sub.build_program();
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

const partition::GraphPartition* ProgramBuilder::subgraph(const Node* n, const std::string& attr) const {
  auto it = gp_.subgraphs.find(n);
  if (it == gp_.subgraphs.end()) return nullptr;
  for (const auto& [name, part] : it->second)
    if (name == attr) return part;
  return nullptr;
}

Status ProgramBuilder::build_program() {
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
    NodeKind m = gp_.kind_of(n);
    if (m == NodeKind::kCompiled) {
      auto it = gp_.group_of_root.find(n);
      if (it != gp_.group_of_root.end()) KILN_RETURN_IF_ERROR(emit_group(gp_.groups[it->second]));
    } else {
      KILN_RETURN_IF_ERROR(emit_node(n, m));
    }
  }
  prog_->bounds = bounds_;
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
  // Planned on its own (plan_memory), with its in-place sites.
  state_.out->planned.emplace_back(prog_, std::move(concat_sites_));
  return Status::ok();
}

}  // namespace

Result<Bytecode> build_bytecode(const partition::Partition& p, const kernels::KernelSet& ks,
                                const SymbolBounds& bounds) {
  Bytecode out;
  BuildState state;
  state.partition = &p;
  state.kernels = &ks;
  state.out = &out;
  ProgramBuilder top(p.top(), state, bounds);
  KILN_RETURN_IF_ERROR(top.build_program());
  out.program = top.program();
  for (const auto& [kernel, syms] : out.entries)
    out.in_place.push_back(kernel >= 0 && static_cast<size_t>(kernel) < ks.kernels.size()
                               ? tir::in_place_pairs(ks.kernels[static_cast<size_t>(kernel)].canon.def)
                               : std::vector<std::pair<int, int>>{});
  return out;
}

Status link_kernels(Bytecode& bc, const kernels::KernelSet& ks,
                    const std::function<runtime::KernelFn(const std::string&)>& lookup) {
  std::vector<runtime::CompiledKernel> table;
  std::vector<std::string> symbols;
  std::map<std::string, int, std::less<>> slots;
  for (const auto& [kernel, call_syms] : bc.entries) {
    const tir::PrimFunc& f = ks.kernels[static_cast<size_t>(kernel)].func;
    runtime::CompiledKernel k;
    k.name = f.name;
    k.fn = lookup(f.name);
    if (k.fn == nullptr) return internal_error() << "kernel " << f.name << " missing after code generation";
    k.sym_names = call_syms;
    for (const std::string& name : call_syms) {
      auto [it, added] = slots.emplace(name, static_cast<int>(symbols.size()));
      if (added) symbols.push_back(name);
      k.sym_slots.push_back(it->second);
    }
    table.push_back(std::move(k));
  }
  for (const auto& prog : bc.programs) {
    prog->kernels = table;
    prog->symbols = symbols;
    prog->symbol_slots = slots;
  }
  return Status::ok();
}

}  // namespace kiln::bytecode
