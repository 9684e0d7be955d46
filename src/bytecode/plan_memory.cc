#include "bytecode/bytecode.h"

#include <algorithm>
#include <limits>
#include <set>

#include "runtime/memory_plan.h"
#include "support/memory_limit.h"

namespace kiln::bytecode {

namespace {

bool shape_is_static(const std::vector<Expr>& shape) {
  for (const Expr& d : shape)
    if (!d.is_const()) return false;
  return true;
}

// Lifetimes of registers in instruction order; releases after last use; a
// static arena when every planned register has a static shape.
struct PlannedBuffer {
  int reg = -1;  // the register owning it (others share it in place)
  runtime::BufferLifetime life;
};

void plan_program(runtime::Program& p, const std::vector<ConcatSite>& concat_sites_,
                  const std::vector<std::vector<std::pair<int, int>>>& in_place,
                  std::vector<PlannedBuffer>* buffers = nullptr) {
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
  // Outputs written over an input (Bytecode::in_place): the call is the
  // input's last reader (and of every value already in its buffer), the
  // input appears once among the call's inputs, neither is in an in-place
  // Concat or Split, and both have the same size. The output then lives in
  // the input's buffer, which lives on to the output's last use; a chain of
  // such calls shares one buffer.
  std::vector<int> owner(nr, -1);
  std::vector<int64_t> size_of(nr, -1);
  for (size_t i = 0; i < planned.size(); ++i) size_of[static_cast<size_t>(planned[i])] = bytes[i];
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const runtime::Instr& in = p.instrs[i];
    if (in.op != runtime::OpCode::kCall || in.callee < 0 || static_cast<size_t>(in.callee) >= in_place.size()) continue;
    for (auto [ki, ko] : in_place[static_cast<size_t>(in.callee)]) {
      const size_t ni = in.inputs.size();
      if (ki < 0 || static_cast<size_t>(ki) >= ni || static_cast<size_t>(ko) < ni ||
          static_cast<size_t>(ko) - ni >= in.outputs.size())
        continue;
      const int r = in.inputs[static_cast<size_t>(ki)], o = in.outputs[static_cast<size_t>(ko) - ni];
      if (r < 0 || o < 0 || std::count(in.inputs.begin(), in.inputs.end(), r) != 1 || !is_planned.count(r) ||
          !is_planned.count(o) || host[r] >= 0 || host[o] >= 0 || owner[o] >= 0 || size_of[r] != size_of[o])
        continue;
      const int h = owner[r] >= 0 ? owner[r] : r;
      if (last[h] != static_cast<int>(i)) continue;
      owner[o] = h;
      last[h] = std::max(last[h], last[o]);
      break;
    }
  }
  std::vector<runtime::BufferLifetime> lifetimes;
  std::vector<int> owners;
  for (size_t i = 0; i < planned.size(); ++i) {
    int r = planned[i];
    if ((host[r] >= 0 && host[r] != r) || owner[r] >= 0) continue;
    owners.push_back(r);
    lifetimes.push_back({bytes[i], first[r], last[r]});
  }
  runtime::MemoryPlan plan = runtime::plan_memory(lifetimes);
  if (buffers != nullptr)
    for (size_t i = 0; i < owners.size(); ++i) buffers->push_back({owners[i], lifetimes[i]});
  for (size_t i = 0; i < owners.size(); ++i) p.registers[owners[i]].arena_offset = plan.offsets[i];
  for (int r : planned)
    if (host[r] >= 0 && host[r] != r) p.registers[r].arena_offset = p.registers[host[r]].arena_offset + slice[r];
    else if (owner[r] >= 0) p.registers[r].arena_offset = p.registers[owner[r]].arena_offset;
  p.arena_bytes = plan.arena_bytes;
}

}  // namespace

void plan_memory(Bytecode& bc) {
  for (auto& [prog, sites] : bc.planned) plan_program(*prog, sites, bc.in_place);
}

bool is_control_flow(const runtime::Instr& in) {
  return in.end >= 0 || in.target >= 0 || in.loop >= 0 || !in.subprograms.empty() || in.op == runtime::OpCode::kMove;
}

MemoryUse memory_use(const Bytecode& bc) {
  MemoryUse use;
  if (bc.program == nullptr) return use;
  for (const runtime::Instr& in : bc.program->instrs)
    if (is_control_flow(in)) return use;
  runtime::Program p = *bc.program;
  std::vector<PlannedBuffer> buffers;
  for (const auto& [prog, sites] : bc.planned)
    if (prog == bc.program) plan_program(p, sites, bc.in_place, &buffers);
  if (!p.static_plan) return use;
  // The instruction where the most arena bytes are live, and its largest.
  {
    std::vector<runtime::BufferLifetime> lives;
    for (const PlannedBuffer& b : buffers) lives.push_back(b.life);
    const runtime::LivePeak peak = runtime::peak_of(lives);
    const int at = peak.at;
    if (peak.bytes > 0 && at >= 0 && static_cast<size_t>(at) < p.instrs.size()) {
      use.peak_at = p.instrs[static_cast<size_t>(at)].where;
      for (const PlannedBuffer& b : buffers)
        if (b.life.first <= at && b.life.last >= at)
          use.peak_values.push_back({p.registers[static_cast<size_t>(b.reg)].name, b.life.bytes});
      std::stable_sort(use.peak_values.begin(), use.peak_values.end(),
                       [](const auto& a, const auto& b) { return a.second > b.second; });
      if (use.peak_values.size() > 5) use.peak_values.resize(5);
    }
  }
  // Registers the arena does not hold: outputs (live to the end) and
  // intermediates a host kernel allocates (live to their last use).
  const size_t nr = p.registers.size();
  std::vector<int> def_at(nr, -1), last_use(nr, -1);
  std::vector<bool> view(nr, false), input(nr, false);
  for (int r : p.input_registers) input[static_cast<size_t>(r)] = true;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const runtime::Instr& in = p.instrs[i];
    for (int r : in.inputs)
      if (r >= 0) last_use[static_cast<size_t>(r)] = static_cast<int>(i);
    for (int r : in.outputs) {
      if (r < 0 || def_at[static_cast<size_t>(r)] >= 0) continue;
      def_at[static_cast<size_t>(r)] = static_cast<int>(i);
      view[static_cast<size_t>(r)] = in.op == runtime::OpCode::kView;
    }
  }
  std::vector<int64_t> delta(p.instrs.size() + 1, 0), delta_out(p.instrs.size() + 1, 0);
  for (size_t r = 0; r < nr; ++r) {
    const runtime::RegisterInfo& info = p.registers[r];
    if (def_at[r] < 0 || input[r] || info.is_constant || view[r] || info.arena_offset >= 0) continue;
    if (!shape_is_static(info.shape) || dtype_is_container(info.dtype) || info.dtype == DType::kString) return use;
    std::vector<int64_t> dims;
    for (const Expr& d : info.shape) dims.push_back(*d.as_const());
    std::optional<int64_t> nb = checked_nbytes(info.dtype, dims);
    if (!nb) return use;
    if (info.is_output) {
      use.output_bytes += *nb;
      delta_out[static_cast<size_t>(def_at[r])] += *nb;
      continue;
    }
    delta[static_cast<size_t>(def_at[r])] += *nb;
    delta[static_cast<size_t>(std::max(last_use[r], def_at[r])) + 1] -= *nb;
  }
  int64_t live = 0, outputs = 0, peak_all = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    live += delta[i];
    outputs += delta_out[i];
    use.unplanned_bytes = std::max(use.unplanned_bytes, live);
    peak_all = std::max(peak_all, live + outputs);
  }
  use.arena_bytes = p.arena_bytes;
  use.peak_bytes = p.arena_bytes + peak_all;
  use.known = true;
  return use;
}

}  // namespace kiln::bytecode
