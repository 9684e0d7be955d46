// Automatic checkpointing of a training step's program (bytecode.h).
//
// The forward is the kernel calls the loss output depends on, in program
// order: positions 1..n. The values the backward reads ("saved") stay alive
// from the forward to the backward, which is where a step's memory peaks.
// A plan splits the forward into consecutive segments, each either kept
// (its saved values stay) or recomputed: its saved values are dropped after
// the forward and the calls that make them run again, from values kept
// before them, just before the backward first reads any of them. Values a
// later forward call reads (a segment's boundary) are always kept, and so
// are the outputs of calls that cannot run twice (host kernels, which may
// draw random numbers or talk to other processes).
//
// The policy ("dp") is a dynamic program over segment ends in the spirit of
// Kusumoto et al. (NeurIPS 2019), on a linear order like Chen et al.: with
// the largest recomputed segment's memory bounded by a threshold T, the
// least recomputation whose kept memory fits the budget less T; every T
// among the segments' memories is tried. Memory here is a model (saved
// values only); the plan is then applied and its exact activation memory
// taken from the memory planner, and the model's budget lowered by any
// excess until the plan fits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "bytecode/bytecode.h"
#include "support/memory_limit.h"

namespace kiln::bytecode {

namespace {

using runtime::Instr;
using runtime::OpCode;
using runtime::Program;

// A segment (i, j] of forward positions and what recomputing it means.
struct SegmentCost {
  int64_t kept = 0;       // bytes kept across the turn when it is recomputed (its boundary)
  int64_t kept_all = 0;   // ... when it is kept whole
  int64_t transient = 0;  // bytes its recomputed values hold in the backward
  double cost = 0;        // compute of the calls run again
};

// The program's forward and what each position defines and reads.
class Forward {
 public:
  Status analyze(const Program& p, int loss_output, const std::vector<double>& entry_cost) {
    p_ = &p;
    const size_t ni = p.instrs.size(), nr = p.registers.size();
    if (loss_output < 0 || static_cast<size_t>(loss_output) >= p.output_registers.size())
      return internal_error() << "checkpoint: no output " << loss_output;
    def_at_.assign(nr, -1);
    for (size_t i = 0; i < ni; ++i) {
      const Instr& in = p.instrs[i];
      if (is_control_flow(in))
        return unsupported() << "checkpointing under a memory budget does not cross control flow (If, Loop, Scan) "
                                "yet; " << in.where << " is one";
      for (int r : in.outputs) {
        if (r < 0) continue;
        if (def_at_[static_cast<size_t>(r)] >= 0)
          return internal_error() << "checkpoint: register " << p.registers[static_cast<size_t>(r)].name
                                  << " is written twice";
        def_at_[static_cast<size_t>(r)] = static_cast<int>(i);
      }
    }
    pinned_.assign(nr, false);
    for (int r : p.input_registers) pinned_[static_cast<size_t>(r)] = true;
    for (int r : p.output_registers) pinned_[static_cast<size_t>(r)] = true;
    bytes_.assign(nr, 0);
    root_.resize(nr);
    for (size_t r = 0; r < nr; ++r) {
      root_[r] = static_cast<int>(r);
      const runtime::RegisterInfo& info = p.registers[r];
      if (info.is_constant) pinned_[r] = true;
      if (pinned_[r] || def_at_[r] < 0) continue;
      std::vector<int64_t> dims;
      for (const Expr& d : info.shape) {
        if (!d.is_const())
          return unsupported() << "a memory budget needs static shapes; '" << info.name << "' has shape "
                               << shape_to_string(info.shape) << " (export the model with fixed dims)";
        dims.push_back(*d.as_const());
      }
      if (dtype_is_container(info.dtype) || info.dtype == DType::kString)
        return unsupported() << "a memory budget needs tensors; '" << info.name << "' is a " << dtype_name(info.dtype);
      std::optional<int64_t> nb = checked_nbytes(info.dtype, dims);
      bytes_[r] = nb.value_or(std::numeric_limits<int64_t>::max() / 1024);
    }
    for (size_t i = 0; i < ni; ++i)
      if (p.instrs[i].op == OpCode::kView)
        for (int r : p.instrs[i].outputs) {
          root_[static_cast<size_t>(r)] = root_[static_cast<size_t>(p.instrs[i].inputs[0])];
          bytes_[static_cast<size_t>(r)] = 0;
        }

    // The forward: the calls the loss output depends on.
    is_forward_.assign(ni, false);
    std::vector<bool> needed(nr, false);
    needed[static_cast<size_t>(p.output_registers[static_cast<size_t>(loss_output)])] = true;
    for (size_t k = ni; k-- > 0;) {
      const Instr& in = p.instrs[k];
      bool makes = false;
      for (int r : in.outputs) makes |= r >= 0 && needed[static_cast<size_t>(r)];
      if (!makes) continue;
      is_forward_[k] = true;
      for (int r : in.inputs)
        if (r >= 0) needed[static_cast<size_t>(r)] = true;
    }
    pos_of_instr_.assign(ni, 0);
    int pos = 0;
    last_forward_ = -1;
    for (size_t i = 0; i < ni; ++i) {
      if (is_forward_[i]) {
        instr_at_.push_back(static_cast<int>(i));
        last_forward_ = static_cast<int>(i);
        ++pos;
      }
      pos_of_instr_[i] = pos;  // a forward call's position; others: the forward calls before them
    }
    n_ = pos;
    // Readers: forward calls and other calls before the forward ends read at
    // their position; the backward (the rest) reads "saved" values.
    fwd_last_read_.assign(nr, 0);
    first_backward_read_.assign(nr, -1);
    saved_.assign(nr, false);
    for (size_t i = 0; i < ni; ++i) {
      const bool backward = !is_forward_[i] && static_cast<int>(i) > last_forward_;
      for (int r : p.instrs[i].inputs) {
        if (r < 0) continue;
        const size_t u = static_cast<size_t>(r);
        if (!backward) {
          int at = is_forward_[i] ? pos_of_instr_[i] : pos_of_instr_[i] + 1;
          fwd_last_read_[u] = std::max(fwd_last_read_[u], at);
        } else if (def_at_[u] >= 0 && is_forward_[static_cast<size_t>(def_at_[u])]) {
          saved_[u] = true;
          if (first_backward_read_[u] < 0) first_backward_read_[u] = static_cast<int>(i);
        }
      }
    }
    cost_.assign(ni, 0);
    forward_cost_ = 0;
    for (size_t i = 0; i < ni; ++i) {
      const Instr& in = p.instrs[i];
      if (in.op == OpCode::kCall && in.callee >= 0 && static_cast<size_t>(in.callee) < entry_cost.size())
        cost_[i] = entry_cost[static_cast<size_t>(in.callee)];
      else if (in.op == OpCode::kCopy || in.op == OpCode::kCallHost)
        for (int r : in.outputs) cost_[i] += r >= 0 ? static_cast<double>(bytes_[static_cast<size_t>(r)]) / 4 : 0;
      if (is_forward_[i]) forward_cost_ += cost_[i];
    }
    return Status::ok();
  }

  int n() const { return n_; }
  double forward_cost() const { return forward_cost_; }

  // Forward values position j's recomputation may not drop: read by a
  // forward call past `end`, or made by a call that cannot run twice, or a
  // program input/output/constant.
  bool must_keep(int r, int end) const {
    const size_t u = static_cast<size_t>(r);
    if (pinned_[u] || fwd_last_read_[u] > end) return true;
    const Instr& in = p_->instrs[static_cast<size_t>(def_at_[u])];
    return !(in.op == OpCode::kCall || in.op == OpCode::kView || in.op == OpCode::kCopy);
  }

  // Registers defined at positions (i, j].
  template <typename F>
  void each_defined(int i, int j, F&& f) const {
    for (int q = i + 1; q <= j; ++q)
      for (int r : p_->instrs[static_cast<size_t>(instr_at_[static_cast<size_t>(q - 1)])].outputs)
        if (r >= 0) f(r);
  }

  // The saved values of (i, j] that recomputing it drops.
  std::vector<int> dropped(int i, int j) const {
    std::vector<int> out;
    each_defined(i, j, [&](int r) {
      if (saved_[static_cast<size_t>(r)] && !must_keep(r, j)) out.push_back(r);
    });
    return out;
  }

  // The forward instructions (program indices, in order) that recompute
  // `drop`, all defined in (i, j], from values kept.
  std::vector<int> closure(int i, int j, const std::vector<int>& drop) const {
    std::set<int> instrs;
    std::vector<int> stack(drop.begin(), drop.end());
    std::set<int> seen(drop.begin(), drop.end());
    while (!stack.empty()) {
      int r = stack.back();
      stack.pop_back();
      int at = def_at_[static_cast<size_t>(r)];
      if (!instrs.insert(at).second) continue;
      for (int s : p_->instrs[static_cast<size_t>(at)].inputs) {
        if (s < 0 || def_at_[static_cast<size_t>(s)] < 0 || seen.count(s)) continue;
        const size_t d = static_cast<size_t>(def_at_[static_cast<size_t>(s)]);
        if (!is_forward_[d] || pos_of_instr_[d] <= i || pos_of_instr_[d] > j || must_keep(s, j)) continue;
        seen.insert(s);
        stack.push_back(s);
      }
    }
    return {instrs.begin(), instrs.end()};
  }

  SegmentCost segment(int i, int j) const {
    SegmentCost c;
    std::set<int> kept, kept_all, transient;
    each_defined(i, j, [&](int r) {
      const size_t u = static_cast<size_t>(r);
      if (must_keep(r, j)) {
        if (saved_[u] || fwd_last_read_[u] > j) {
          kept.insert(root_[u]);
          kept_all.insert(root_[u]);
        }
      } else if (saved_[u]) {
        kept_all.insert(root_[u]);
        transient.insert(root_[u]);
      }
    });
    auto sum = [&](const std::set<int>& s) {
      int64_t b = 0;
      for (int r : s) b += pinned_[static_cast<size_t>(r)] ? 0 : bytes_[static_cast<size_t>(r)];
      return b;
    };
    c.kept = sum(kept);
    c.kept_all = sum(kept_all);
    for (int r : kept) transient.erase(r);
    c.transient = sum(transient);
    std::vector<int> drop = dropped(i, j);
    if (!drop.empty())
      for (int at : closure(i, j, drop)) c.cost += cost_[static_cast<size_t>(at)];
    return c;
  }

  // The program with the segments in `plan` recomputed: each one's calls
  // repeated (new registers) just before the backward first reads a value it
  // dropped, and the backward reading the copies. Returns the program and
  // the instructions added; `index_of` maps old instruction indices to new.
  Program apply(const std::vector<std::pair<int, int>>& plan, std::vector<int>* index_of, int* added) const {
    Program out = *p_;
    const size_t ni = p_->instrs.size();
    std::map<int, std::vector<Instr>> before;  // old index -> instructions inserted before it
    std::map<int, int> rename;                   // a dropped value -> its copy, for the backward
    *added = 0;
    for (auto [i, j] : plan) {
      std::vector<int> drop = dropped(i, j);
      if (drop.empty()) continue;
      int first = static_cast<int>(ni);
      for (int r : drop) first = std::min(first, first_backward_read_[static_cast<size_t>(r)]);
      std::map<int, int> copy;  // original register -> its recomputed copy
      std::vector<Instr>& list = before[first];
      for (int at : closure(i, j, drop)) {
        Instr in = p_->instrs[static_cast<size_t>(at)];
        for (int& r : in.inputs)
          if (auto it = copy.find(r); it != copy.end()) r = it->second;
        for (int& r : in.outputs) {
          if (r < 0) continue;
          runtime::RegisterInfo info = p_->registers[static_cast<size_t>(r)];
          info.name += " (recomputed)";
          info.is_output = false;
          info.arena_offset = -1;
          int fresh = static_cast<int>(out.registers.size());
          out.registers.push_back(std::move(info));
          copy[r] = fresh;
          r = fresh;
        }
        in.where += " (recomputed)";
        list.push_back(std::move(in));
        ++*added;
      }
      // The backward reads the copies of what was dropped (all its reads of
      // them are at `first` or later).
      for (int r : drop) rename[r] = copy.at(r);
    }
    out.instrs.clear();
    index_of->assign(ni, -1);
    for (size_t k = 0; k < ni; ++k) {
      if (auto it = before.find(static_cast<int>(k)); it != before.end())
        for (Instr& in : it->second) out.instrs.push_back(std::move(in));
      Instr in = p_->instrs[k];
      if (static_cast<int>(k) > last_forward_)
        for (int& r : in.inputs)
          if (auto it = rename.find(r); it != rename.end()) r = it->second;
      (*index_of)[k] = static_cast<int>(out.instrs.size());
      out.instrs.push_back(std::move(in));
    }
    return out;
  }

 private:
  const Program* p_ = nullptr;
  int n_ = 0, last_forward_ = -1;
  std::vector<int> def_at_, root_, instr_at_, pos_of_instr_, fwd_last_read_, first_backward_read_;
  std::vector<int64_t> bytes_;
  std::vector<bool> pinned_, is_forward_, saved_;
  std::vector<double> cost_;
  double forward_cost_ = 0;
};

// Segment costs for every (i, j], 0 <= i < j <= n, j - i <= max_len.
class SegmentTable {
 public:
  static constexpr int kMaxLen = 128;
  explicit SegmentTable(const Forward& f)
      : n_(f.n()), len_(std::min(n_, kMaxLen)), table_(static_cast<size_t>(n_ + 1) * (len_ + 1)) {
    for (int i = 0; i < n_; ++i)
      for (int j = i + 1; j <= std::min(n_, i + len_); ++j) table_[idx(i, j)] = f.segment(i, j);
  }
  const SegmentCost& at(int i, int j) const { return table_[idx(i, j)]; }
  int n() const { return n_; }
  int max_len() const { return len_; }

 private:
  size_t idx(int i, int j) const { return static_cast<size_t>(i) * (len_ + 1) + static_cast<size_t>(j - i); }
  int n_, len_;
  std::vector<SegmentCost> table_;
};

struct Plan {
  bool ok = false;
  double cost = 0;
  int64_t model_bytes = 0;                  // kept + the largest recomputed segment's transient
  std::vector<std::pair<int, int>> recompute;  // segments (i, j] recomputed
};

// The DP: the least-cost plan whose modelled memory fits `budget`.
Plan plan_dp(const SegmentTable& t, int64_t budget) {
  const int n = t.n();
  constexpr int kUnits = 128;
  std::vector<int64_t> thresholds = {0};
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j <= std::min(n, i + t.max_len()); ++j)
      if (t.at(i, j).transient <= budget) thresholds.push_back(t.at(i, j).transient);
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  if (thresholds.size() > 32) {  // quantiles of them
    std::vector<int64_t> some;
    for (size_t k = 0; k < 32; ++k) some.push_back(thresholds[k * (thresholds.size() - 1) / 31]);
    some.erase(std::unique(some.begin(), some.end()), some.end());
    thresholds = some;
  }
  Plan best;
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t T : thresholds) {
    const int64_t room = budget - T;
    if (room < 0) continue;
    const double unit = std::max<double>(1.0, static_cast<double>(room) / kUnits);
    auto units = [&](int64_t b) { return static_cast<int>(std::ceil(static_cast<double>(b) / unit - 1e-9)); };
    // dp[j][m]: least cost covering positions 1..j with m units kept.
    std::vector<std::vector<double>> dp(static_cast<size_t>(n + 1), std::vector<double>(kUnits + 1, inf));
    struct From {
      int i = -1;
      int m = -1;
      bool recompute = false;
    };
    std::vector<std::vector<From>> from(static_cast<size_t>(n + 1), std::vector<From>(kUnits + 1));
    dp[0][0] = 0;
    for (int j = 1; j <= n; ++j) {
      for (int i = std::max(0, j - t.max_len()); i < j; ++i) {
        const SegmentCost& s = t.at(i, j);
        for (int mode = 0; mode < 2; ++mode) {
          // mode 0: kept whole (only as a one-position segment); 1: recomputed.
          if (mode == 0 && i != j - 1) continue;
          if (mode == 1 && s.transient > T) continue;
          const int add = units(mode == 0 ? s.kept_all : s.kept);
          const double c = mode == 0 ? 0 : s.cost;
          if (add > kUnits) continue;
          for (int m = 0; m + add <= kUnits; ++m) {
            const double v = dp[static_cast<size_t>(i)][static_cast<size_t>(m)];
            if (v == inf) continue;
            double& d = dp[static_cast<size_t>(j)][static_cast<size_t>(m + add)];
            if (v + c < d) {
              d = v + c;
              from[static_cast<size_t>(j)][static_cast<size_t>(m + add)] = {i, m, mode == 1};
            }
          }
        }
      }
    }
    int bm = -1;
    for (int m = 0; m <= kUnits; ++m)
      if (dp[static_cast<size_t>(n)][static_cast<size_t>(m)] < inf &&
          (bm < 0 || dp[static_cast<size_t>(n)][static_cast<size_t>(m)] < dp[static_cast<size_t>(n)][static_cast<size_t>(bm)]))
        bm = m;
    if (bm < 0) continue;
    const double c = dp[static_cast<size_t>(n)][static_cast<size_t>(bm)];
    if (best.ok && c >= best.cost) continue;
    Plan p;
    p.ok = true;
    p.cost = c;
    int64_t kept = 0, largest = 0;
    for (int j = n, m = bm; j > 0;) {
      From f = from[static_cast<size_t>(j)][static_cast<size_t>(m)];
      const SegmentCost& s = t.at(f.i, j);
      if (f.recompute) {
        p.recompute.push_back({f.i, j});
        kept += s.kept;
        largest = std::max(largest, s.transient);
      } else {
        kept += s.kept_all;
      }
      j = f.i;
      m = f.m;
    }
    std::reverse(p.recompute.begin(), p.recompute.end());
    p.model_bytes = kept + largest;
    best = std::move(p);
  }
  return best;
}

// Chen et al.: segments of `len` positions, every one recomputed.
Plan plan_segments(const Forward& f, int len) {
  Plan p;
  p.ok = true;
  int64_t kept = 0, largest = 0;
  for (int i = 0; i < f.n(); i += len) {
    int j = std::min(f.n(), i + len);
    const SegmentCost s = f.segment(i, j);
    p.recompute.push_back({i, j});
    p.cost += s.cost;
    kept += s.kept;
    largest = std::max(largest, s.transient);
  }
  p.model_bytes = kept + largest;
  return p;
}

std::string mb(int64_t b) { return format_bytes(b); }

}  // namespace

int sink_input_only_calls(Bytecode& bc) {
  Program& p = *bc.program;
  const size_t ni = p.instrs.size(), nr = p.registers.size();
  std::vector<int> def_at(nr, -1);
  for (size_t i = 0; i < ni; ++i) {
    const Instr& in = p.instrs[i];
    if (is_control_flow(in)) return 0;
    for (int r : in.outputs)
      if (r >= 0) {
        if (def_at[static_cast<size_t>(r)] >= 0) return 0;
        def_at[static_cast<size_t>(r)] = static_cast<int>(i);
      }
  }
  // Input-only calls, in order: every input a step input, a constant, or
  // another such call's. Outputs of the program stay where they are made.
  std::vector<bool> sink(ni, false), is_output(nr, false);
  for (int r : p.output_registers) is_output[static_cast<size_t>(r)] = true;
  for (size_t i = 0; i < ni; ++i) {
    const Instr& in = p.instrs[i];
    if (in.op != OpCode::kCall && in.op != OpCode::kView && in.op != OpCode::kCopy) continue;
    bool ok = !in.outputs.empty();
    for (int r : in.inputs) ok = ok && (r < 0 || def_at[static_cast<size_t>(r)] < 0 || sink[static_cast<size_t>(def_at[static_cast<size_t>(r)])]);
    for (int r : in.outputs) ok = ok && r >= 0 && !is_output[static_cast<size_t>(r)];
    sink[i] = ok;
  }
  // Each one's anchor: its first reader that stays, through readers that move.
  std::vector<std::vector<int>> readers(nr);
  for (size_t i = 0; i < ni; ++i)
    for (int r : p.instrs[i].inputs)
      if (r >= 0) readers[static_cast<size_t>(r)].push_back(static_cast<int>(i));
  std::vector<int> anchor(ni, -1);
  int moved = 0;
  for (size_t k = ni; k-- > 0;) {
    if (!sink[k]) continue;
    int a = -1;
    for (int r : p.instrs[k].outputs)
      for (int reader : readers[static_cast<size_t>(r)]) {
        int at = sink[static_cast<size_t>(reader)] ? anchor[static_cast<size_t>(reader)] : reader;
        if (at >= 0 && (a < 0 || at < a)) a = at;
      }
    if (a < 0) {
      sink[k] = false;  // nothing reads it: it stays
      continue;
    }
    anchor[k] = a;
  }
  std::vector<std::vector<int>> before(ni);
  for (size_t k = 0; k < ni; ++k)
    if (sink[k]) {
      before[static_cast<size_t>(anchor[k])].push_back(static_cast<int>(k));
      moved += anchor[k] > static_cast<int>(k) + 1;
    }
  if (moved == 0) return 0;
  std::vector<Instr> order;
  std::vector<int> index_of(ni, -1);
  for (size_t k = 0; k < ni; ++k) {
    for (int m : before[k]) {
      index_of[static_cast<size_t>(m)] = static_cast<int>(order.size());
      order.push_back(std::move(p.instrs[static_cast<size_t>(m)]));
    }
    if (sink[k]) continue;
    index_of[k] = static_cast<int>(order.size());
    order.push_back(std::move(p.instrs[k]));
  }
  p.instrs = std::move(order);
  for (auto& [prog, sites] : bc.planned)
    if (prog == bc.program)
      for (ConcatSite& s : sites) s.instr = static_cast<size_t>(index_of[s.instr]);
  return moved;
}

Result<CheckpointReport> checkpoint(Bytecode& bc, const CheckpointOptions& o) {
  CheckpointReport report;
  if (o.policy != "dp" && o.policy != "sqrt")
    return invalid_argument() << "checkpoint policy '" << o.policy << "': Kiln has dp and sqrt";
  if (o.budget <= 0) return invalid_argument() << "a memory budget must be positive";
  Forward f;
  KILN_RETURN_IF_ERROR(f.analyze(*bc.program, o.loss_output, o.entry_cost));
  report.before = memory_use(bc);
  report.forward_cost = f.forward_cost();
  if (!report.before.known) return unsupported() << "a memory budget needs a static memory plan";
  report.after = report.before;
  if (report.before.activation_bytes() <= o.budget) return report;
  const SegmentTable table(f);

  std::vector<ConcatSite>* sites = nullptr;
  for (auto& [prog, s] : bc.planned)
    if (prog == bc.program) sites = &s;
  // A plan applied to a copy of the bytecode: its exact memory use.
  struct Applied {
    Bytecode bc;
    std::vector<ConcatSite> sites;
    int added = 0;
    MemoryUse use;
  };
  auto apply = [&](const Plan& plan) {
    Applied a;
    std::vector<int> index_of;
    auto prog = std::make_shared<Program>(f.apply(plan.recompute, &index_of, &a.added));
    if (sites != nullptr) {
      a.sites = *sites;
      for (ConcatSite& s : a.sites) s.instr = static_cast<size_t>(index_of[s.instr]);
    }
    a.bc.program = prog;
    a.bc.planned.emplace_back(prog, a.sites);
    a.use = memory_use(a.bc);
    return a;
  };

  // The unmodelled part (gradients, temporaries) is taken as what the
  // model misses of the whole-kept plan; the model's budget is lowered by
  // any excess of the exact figure until the plan fits.
  Plan keep_all = plan_dp(table, std::numeric_limits<int64_t>::max() / 4);
  int64_t unmodelled = std::max<int64_t>(0, report.before.activation_bytes() - keep_all.model_bytes);
  std::optional<Applied> found;
  Plan chosen;
  // The least an equal-segment plan reaches: a budget of that much is met
  // (the search below finds that plan again).
  int64_t least = report.before.activation_bytes();
  if (o.policy == "dp") {
    int64_t model_budget = o.budget - unmodelled;
    for (int round = 0; round < 12 && model_budget > 0; ++round) {
      Plan p = plan_dp(table, model_budget);
      if (!p.ok) break;
      Applied a = apply(p);
      if (a.use.known && a.use.activation_bytes() <= o.budget) {
        found = std::move(a);
        chosen = std::move(p);
        break;
      }
      int64_t excess = a.use.activation_bytes() - o.budget;
      model_budget = std::min(model_budget - excess, p.model_bytes - std::max<int64_t>(excess, 1));
    }
  }
  if (!found) {
    // Equal segments (Chen et al.), every one recomputed: sqrt(n) long
    // first, then lengths growing by half, the least recomputation among
    // those that fit. The "sqrt" policy, and the fallback of "dp".
    const int n = f.n();
    const int root = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)))));
    std::vector<int> lens = {root};
    for (int len = 1; len <= n; len = std::max(len + 1, len * 3 / 2))
      if (len != root) lens.push_back(len);
    for (int len : lens) {
      Plan p = plan_segments(f, len);
      Applied a = apply(p);
      if (a.use.known) least = std::min(least, a.use.activation_bytes());
      if (!a.use.known || a.use.activation_bytes() > o.budget) continue;
      if (!found || p.cost < chosen.cost) {
        found = std::move(a);
        chosen = std::move(p);
      }
      if (len == root && o.policy == "sqrt") break;
    }
  }
  if (!found) {
    return resource_exhausted() << "memory budget " << mb(o.budget) << " cannot be met: the step's activations take "
                                << mb(report.before.activation_bytes()) << " as planned, and the least Kiln reaches by "
                                << "recomputing them is " << mb(least) << "; give a budget of at least " << mb(least);
  }
  *bc.program = *found->bc.program;
  if (sites != nullptr) *sites = found->sites;
  report.after = found->use;
  report.segments = static_cast<int>(chosen.recompute.size());
  report.recomputed_calls = found->added;
  report.recompute_cost = chosen.cost;
  return report;
}

}  // namespace kiln::bytecode
