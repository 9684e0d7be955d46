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
#include <utility>

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
        std::vector<std::pair<int, int>> made;
        list.push_back(rerun(at, out, copy, &made));
        for (auto [r, fresh] : made) copy[r] = fresh;
        ++*added;
      }
      // The backward reads the copies of what was dropped (all its reads of
      // them are at `first` or later).
      for (int r : drop) rename[r] = copy.at(r);
    }
    return splice(std::move(out), before, rename, index_of);
  }

  // A saved value one forward call makes; dropping it alone means running
  // that call again in the backward.
  struct Single {
    int reg = -1;
    int64_t bytes = 0;
    double cost = 0;
    bool helped = false;  // made through values nothing keeps (helpers_of)
  };

  // Candidates for single recomputation, most bytes freed per compute
  // first: saved values of kernel calls (not views, not host calls).
  std::vector<Single> singles() const {
    std::vector<Single> out;
    const std::vector<bool> none(saved_.size(), false);
    for (size_t u = 0; u < saved_.size(); ++u) {
      if (!saved_[u] || pinned_[u] || def_at_[u] < 0 || root_[u] != static_cast<int>(u) || bytes_[u] <= 0) continue;
      const size_t at = static_cast<size_t>(def_at_[u]);
      if (!is_forward_[at] || p_->instrs[at].op != OpCode::kCall) continue;
      std::vector<int> helpers;
      double cost = cost_[at];
      if (!helpers_of(static_cast<int>(u), none, &helpers, &cost)) continue;
      out.push_back({static_cast<int>(u), bytes_[u], cost, !helpers.empty()});
    }
    std::stable_sort(out.begin(), out.end(), [](const Single& a, const Single& b) {
      return static_cast<double>(a.bytes) * (b.cost + 1) > static_cast<double>(b.bytes) * (a.cost + 1);
    });
    return out;
  }

  // The forward values, not kept across the turn, that making `reg` again
  // needs made again first (a BatchNormalization's output on the way from
  // the convolution output the backward keeps to the ReLU output dropped),
  // appended to `*helpers` with their compute added to `*cost`; false where
  // one cannot run twice or the chain is longer than a few calls. Values
  // kept (saved and not in `drop`), dropped ones and the step's inputs are
  // there already.
  bool helpers_of(int reg, const std::vector<bool>& drop, std::vector<int>* helpers, double* cost) const {
    std::vector<int> stack = {reg};
    while (!stack.empty()) {
      const int r = stack.back();
      stack.pop_back();
      for (int s : p_->instrs[static_cast<size_t>(def_at_[static_cast<size_t>(r)])].inputs) {
        if (s < 0) continue;
        const size_t u = static_cast<size_t>(s);
        if (pinned_[u] || def_at_[u] < 0 || saved_[u] || drop[u] ||
            std::find(helpers->begin(), helpers->end(), s) != helpers->end())
          continue;
        const size_t at = static_cast<size_t>(def_at_[u]);
        const OpCode op = p_->instrs[at].op;
        if (!is_forward_[at] || (op != OpCode::kCall && op != OpCode::kView) || helpers->size() >= 4) return false;
        helpers->push_back(s);
        *cost += cost_[at];
        stack.push_back(s);
      }
    }
    return true;
  }

  // The program with each of `candidates` that can be dropped alone dropped:
  // the call that made it runs again (new registers) just before the
  // backward first reads it (or a recomputation reads it), after the calls
  // making its helpers (helpers_of), reading the recomputed copies of
  // dropped values and otherwise values the backward reads anyway or the
  // step's inputs, so nothing else lives longer across the turn.
  // `*dropped` counts the saved values dropped, `*cost` the compute added.
  Program rematerialize(const std::vector<Single>& candidates, std::vector<int>* index_of, int* added, int* dropped,
                        double* cost) const {
    const size_t ni = p_->instrs.size();
    std::vector<bool> drop(saved_.size(), false);
    std::vector<int> chosen;
    int saved_dropped = 0;
    for (const Single& c : candidates) {
      std::vector<int> helpers;
      double unused = 0;
      if (!helpers_of(c.reg, drop, &helpers, &unused)) continue;
      drop[static_cast<size_t>(c.reg)] = true;
      chosen.push_back(c.reg);
      ++saved_dropped;
      for (int h : helpers) {
        drop[static_cast<size_t>(h)] = true;
        chosen.push_back(h);
      }
    }
    // Where each is needed: its first backward read, or earlier where the
    // recomputation of another dropped value reads it.
    std::sort(chosen.begin(), chosen.end(), [&](int a, int b) {
      return def_at_[static_cast<size_t>(a)] > def_at_[static_cast<size_t>(b)];
    });
    std::vector<int> needed_at(saved_.size(), static_cast<int>(ni));
    for (int r : chosen) {
      const size_t u = static_cast<size_t>(r);
      if (first_backward_read_[u] >= 0) needed_at[u] = std::min(needed_at[u], first_backward_read_[u]);
      for (int s : p_->instrs[static_cast<size_t>(def_at_[u])].inputs)
        if (s >= 0 && drop[static_cast<size_t>(s)])
          needed_at[static_cast<size_t>(s)] = std::min(needed_at[static_cast<size_t>(s)], needed_at[u]);
    }
    std::reverse(chosen.begin(), chosen.end());  // in forward order
    std::stable_sort(chosen.begin(), chosen.end(), [&](int a, int b) {
      return needed_at[static_cast<size_t>(a)] < needed_at[static_cast<size_t>(b)];
    });
    Program out = *p_;
    std::map<int, int> copy;  // a dropped value -> its recomputed copy
    std::map<int, std::vector<Instr>> before;
    *added = 0;
    *dropped = saved_dropped;
    *cost = 0;
    std::set<int> emitted;  // a call with several dropped outputs runs once, where the first is needed
    for (int r : chosen) {
      const size_t at = static_cast<size_t>(def_at_[static_cast<size_t>(r)]);
      if (!emitted.insert(static_cast<int>(at)).second) continue;
      std::vector<std::pair<int, int>> made;
      before[needed_at[static_cast<size_t>(r)]].push_back(rerun(static_cast<int>(at), out, copy, &made));
      for (auto [o, fresh] : made)
        if (drop[static_cast<size_t>(o)]) copy[o] = fresh;
      ++*added;
      *cost += cost_[at];
    }
    return splice(std::move(out), before, copy, index_of);
  }

 private:
  // Forward instruction `at` run again on new registers (named
  // "(recomputed)"), reading `copy`'s copies of its inputs; `*made` gets
  // (register, its copy) per output.
  Instr rerun(int at, Program& out, const std::map<int, int>& copy, std::vector<std::pair<int, int>>* made) const {
    Instr in = p_->instrs[static_cast<size_t>(at)];
    for (int& r : in.inputs)
      if (auto it = copy.find(r); it != copy.end()) r = it->second;
    for (int& r : in.outputs) {
      if (r < 0) continue;
      runtime::RegisterInfo info = p_->registers[static_cast<size_t>(r)];
      info.name += " (recomputed)";
      info.is_output = false;
      info.arena_offset = -1;
      const int fresh = static_cast<int>(out.registers.size());
      out.registers.push_back(std::move(info));
      made->push_back({r, fresh});
      r = fresh;
    }
    in.where += " (recomputed)";
    return in;
  }

  // `out` (a copy of the program with the new registers) with `before[k]`
  // inserted before instruction k and the backward reading `rename`'s
  // copies; `index_of` maps old instruction indices to new.
  Program splice(Program out, std::map<int, std::vector<Instr>>& before, const std::map<int, int>& rename,
                 std::vector<int>* index_of) const {
    const size_t ni = p_->instrs.size();
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

// The instruction defining each register (-1: none), or false where the
// program has control flow or defines a register twice.
bool straight_line_definitions(const Program& p, std::vector<int>* def_at) {
  def_at->assign(p.registers.size(), -1);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    if (is_control_flow(in)) return false;
    for (int r : in.outputs)
      if (r >= 0) {
        if ((*def_at)[static_cast<size_t>(r)] >= 0) return false;
        (*def_at)[static_cast<size_t>(r)] = static_cast<int>(i);
      }
  }
  return true;
}

// The step's program with its instructions in `order` (`index_of`: old
// index -> new), its in-place Concat sites following them.
void reorder(Bytecode& bc, std::vector<Instr> order, const std::vector<int>& index_of) {
  bc.program->instrs = std::move(order);
  for (auto& [prog, sites] : bc.planned)
    if (prog == bc.program)
      for (ConcatSite& s : sites) s.instr = static_cast<size_t>(index_of[s.instr]);
}


}  // namespace

int sink_input_only_calls(Bytecode& bc) {
  Program& p = *bc.program;
  const size_t ni = p.instrs.size(), nr = p.registers.size();
  std::vector<int> def_at;
  if (!straight_line_definitions(p, &def_at)) return 0;
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
  reorder(bc, std::move(order), index_of);
  return moved;
}

int hoist_output_calls(Bytecode& bc) {
  Program& p = *bc.program;
  const size_t ni = p.instrs.size(), nr = p.registers.size();
  std::vector<int> def_at;
  if (!straight_line_definitions(p, &def_at)) return 0;
  std::vector<bool> is_output(nr, false);
  for (int r : p.output_registers) is_output[static_cast<size_t>(r)] = true;
  std::vector<std::vector<int>> readers(nr);
  for (size_t i = 0; i < ni; ++i)
    for (int r : p.instrs[i].inputs)
      if (r >= 0) readers[static_cast<size_t>(r)].push_back(static_cast<int>(i));
  // Candidates, last first: calls (no host calls: those may talk to other
  // processes, in order) whose every output is a program output or read
  // only by candidates.
  std::vector<bool> hoist(ni, false);
  for (size_t k = ni; k-- > 0;) {
    const Instr& in = p.instrs[k];
    if (in.op != OpCode::kCall && in.op != OpCode::kView && in.op != OpCode::kCopy) continue;
    bool ok = !in.outputs.empty();
    for (int r : in.outputs) {
      ok = ok && r >= 0;
      if (!ok) break;
      if (is_output[static_cast<size_t>(r)]) continue;
      ok = !readers[static_cast<size_t>(r)].empty();
      for (int reader : readers[static_cast<size_t>(r)]) ok = ok && hoist[static_cast<size_t>(reader)];
    }
    hoist[k] = ok;
  }
  // Each one's anchor: the last instruction that stays among those making
  // its inputs (through candidates). One reading only the step's inputs
  // stays where it is, and so does one making an intermediate that a
  // reader would not read until a later anchor (its output would live
  // longer).
  std::vector<int> anchor(ni, -1);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < ni; ++k) {
      if (!hoist[k]) continue;
      int a = -1;
      for (int r : p.instrs[k].inputs) {
        if (r < 0 || def_at[static_cast<size_t>(r)] < 0) continue;
        const size_t d = static_cast<size_t>(def_at[static_cast<size_t>(r)]);
        a = std::max(a, hoist[d] ? anchor[d] : static_cast<int>(d));
      }
      if (a < 0) hoist[k] = false;
      anchor[k] = a;
    }
    for (size_t k = 0; k < ni && !changed; ++k) {
      if (!hoist[k]) continue;
      for (int r : p.instrs[k].outputs)
        if (!is_output[static_cast<size_t>(r)])
          for (int reader : readers[static_cast<size_t>(r)])
            if (!hoist[static_cast<size_t>(reader)] || anchor[static_cast<size_t>(reader)] > anchor[k]) changed = true;
      if (changed) hoist[k] = false;
    }
  }
  std::vector<std::vector<int>> after(ni);
  int moved = 0;
  for (size_t k = 0; k < ni; ++k)
    if (hoist[k]) {
      after[static_cast<size_t>(anchor[k])].push_back(static_cast<int>(k));
      moved += static_cast<int>(k) > anchor[k] + 1;
    }
  if (moved == 0) return 0;
  std::vector<Instr> order;
  std::vector<int> index_of(ni, -1);
  for (size_t k = 0; k < ni; ++k) {
    if (hoist[k]) continue;
    index_of[k] = static_cast<int>(order.size());
    order.push_back(std::move(p.instrs[k]));
    for (int m : after[k]) {
      index_of[static_cast<size_t>(m)] = static_cast<int>(order.size());
      order.push_back(std::move(p.instrs[static_cast<size_t>(m)]));
    }
  }
  reorder(bc, std::move(order), index_of);
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

  std::vector<ConcatSite>* sites = nullptr;
  for (auto& [prog, s] : bc.planned)
    if (prog == bc.program) sites = &s;
  // A program derived from the step's, with its exact memory use and what
  // it recomputes.
  struct Candidate {
    std::shared_ptr<Program> program;
    std::vector<ConcatSite> sites;
    MemoryUse use;
    double cost = 0;
    int added = 0, segments = 0, singles = 0;
    bool fits = false;
  };
  int64_t budget = o.budget;  // the budget searched for (lowered by the search for the least below)
  // `index_of` maps the instructions of `base`'s program to `prog`'s.
  auto derive = [&](Program prog, const std::vector<int>& index_of, const Candidate& base) {
    Candidate c;
    c.program = std::make_shared<Program>(std::move(prog));
    c.sites = base.sites;
    for (ConcatSite& s : c.sites) s.instr = static_cast<size_t>(index_of[s.instr]);
    Bytecode copy;
    copy.program = c.program;
    copy.in_place = bc.in_place;
    copy.planned.emplace_back(c.program, c.sites);
    c.use = memory_use(copy);
    c.fits = c.use.known && c.use.activation_bytes() <= budget;
    c.cost = base.cost;
    c.added = base.added;
    c.singles = base.singles;
    return c;
  };
  Candidate step;
  step.program = bc.program;
  if (sites != nullptr) step.sites = *sites;
  step.use = report.before;

  // Segments of `base`'s forward `fb` recomputed as the dp plans them. The
  // unmodelled part of its memory (gradients, temporaries) is taken as what
  // the model misses of the whole-kept plan; the model's budget is lowered
  // by any excess of the exact figure until the plan fits.
  auto segments_dp = [&](const Forward& fb, const Candidate& base) -> std::optional<Candidate> {
    const SegmentTable table(fb);
    Plan keep_all = plan_dp(table, std::numeric_limits<int64_t>::max() / 4);
    int64_t unmodelled = std::max<int64_t>(0, base.use.activation_bytes() - keep_all.model_bytes);
    int64_t model_budget = budget - unmodelled;
    for (int round = 0; round < 12 && model_budget > 0; ++round) {
      Plan p = plan_dp(table, model_budget);
      if (!p.ok) break;
      std::vector<int> index_of;
      int added = 0;
      Candidate c = derive(fb.apply(p.recompute, &index_of, &added), index_of, base);
      if (c.fits) {
        c.cost += p.cost;
        c.added += added;
        c.segments = static_cast<int>(p.recompute.size());
        return c;
      }
      int64_t excess = c.use.activation_bytes() - budget;
      model_budget = std::min(model_budget - excess, p.model_bytes - std::max<int64_t>(excess, 1));
    }
    return std::nullopt;
  };
  // Equal segments (Chen et al.), every one recomputed: sqrt(n) long first,
  // then lengths growing by half, the least recomputation among those that
  // fit (only sqrt(n) for `sqrt_only`). `*least`: the least memory seen.
  auto segments_equal = [&](const Forward& fb, const Candidate& base, bool sqrt_only,
                            int64_t* least) -> std::optional<Candidate> {
    std::optional<Candidate> found;
    const int n = fb.n();
    const int root = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)))));
    std::vector<int> lens = {root};
    for (int len = 1; len <= n; len = std::max(len + 1, len * 3 / 2))
      if (len != root) lens.push_back(len);
    for (int len : lens) {
      Plan p = plan_segments(fb, len);
      std::vector<int> index_of;
      int added = 0;
      Candidate c = derive(fb.apply(p.recompute, &index_of, &added), index_of, base);
      if (c.use.known) *least = std::min(*least, c.use.activation_bytes());
      c.cost += p.cost;
      c.added += added;
      c.segments = static_cast<int>(p.recompute.size());
      if (c.fits && (!found || c.cost < found->cost)) found = std::move(c);
      if (len == root && sqrt_only && found) break;
    }
    return found;
  };

  // "dp": saved values that one cheap call makes are dropped alone (the
  // call runs again in the backward), most bytes per compute first; for
  // each number of them, the dp's segments on top; the least recomputation
  // that fits. "sqrt", and the fallback of "dp": equal segments.
  int64_t least = report.before.activation_bytes();
  // Two rankings of the values dropped alone: those one call makes from
  // values kept, and all of them (some made through helpers); the prefixes
  // of each are tried.
  const std::vector<Forward::Single> singles = o.policy == "dp" ? f.singles() : std::vector<Forward::Single>{};
  std::vector<Forward::Single> direct;
  for (const Forward::Single& c : singles)
    if (!c.helped) direct.push_back(c);
  auto drop_singles = [&](const std::vector<Forward::Single>& list, size_t k) {
    std::vector<int> index_of;
    int added = 0, dropped = 0;
    double cost = 0;
    Program prog = f.rematerialize({list.begin(), list.begin() + static_cast<std::ptrdiff_t>(k)}, &index_of, &added,
                                   &dropped, &cost);
    Candidate c = derive(std::move(prog), index_of, step);
    c.cost = cost;
    c.added = added;
    c.singles = dropped;
    if (c.use.known) least = std::min(least, c.use.activation_bytes());
    return c;
  };
  // The plan for `budget`; deterministic, so a budget once met is met again.
  auto search = [&](std::optional<Candidate>* best) -> Status {
    best->reset();
    if (o.policy == "dp") {
      for (const std::vector<Forward::Single>* list : {&std::as_const(direct), &singles}) {
        if (list == &singles && direct.size() == singles.size()) break;
        std::vector<size_t> counts = {list == &direct ? size_t{0} : size_t{1}};
        for (size_t k = counts[0] + 1; k < list->size(); k = std::max(k + 1, k * 3 / 2)) counts.push_back(k);
        if (!list->empty()) counts.push_back(list->size());
        for (size_t k : counts) {
          if (k > list->size()) break;
          Candidate base = k == 0 ? step : drop_singles(*list, k);
          if (*best && base.cost >= (*best)->cost) break;  // more singles only cost more
          if (base.fits) {
            *best = std::move(base);
            break;
          }
          Forward fb;
          KILN_RETURN_IF_ERROR(fb.analyze(*base.program, o.loss_output, o.entry_cost));
          std::optional<Candidate> c = segments_dp(fb, base);
          if (c && (!*best || c->cost < (*best)->cost)) *best = std::move(c);
        }
      }
    }
    if (!*best) {
      *best = segments_equal(f, step, o.policy == "sqrt", &least);
      if (!*best && !singles.empty()) {
        Candidate all = drop_singles(singles, singles.size());
        Forward fa;
        KILN_RETURN_IF_ERROR(fa.analyze(*all.program, o.loss_output, o.entry_cost));
        *best = segments_equal(fa, all, false, &least);
      }
    }
    return Status::ok();
  };
  std::optional<Candidate> best;
  KILN_RETURN_IF_ERROR(search(&best));
  if (!best) {
    // The least budget the search meets: between the one refused and the
    // least memory a budget-independent plan (equal segments, values
    // dropped alone) reached, which it meets; halved a few times.
    int64_t lo = o.budget, hi = least, reached = least;
    for (int round = 0; round < 10 && hi - lo > std::max<int64_t>(hi / 128, 1); ++round) {
      budget = lo + (hi - lo) / 2;
      std::optional<Candidate> c;
      KILN_RETURN_IF_ERROR(search(&c));
      (c ? hi : lo) = budget;
      if (c) reached = std::min(reached, c->use.activation_bytes());
    }
    // A plan found may lie below the budget it was found for: that figure,
    // where the search meets it as a budget too.
    if (reached < hi && reached > o.budget) {
      budget = reached;
      std::optional<Candidate> c;
      KILN_RETURN_IF_ERROR(search(&c));
      if (c) hi = reached;
    }
    return resource_exhausted() << "memory budget " << mb(o.budget) << " cannot be met: the step's activations take "
                                << mb(report.before.activation_bytes()) << " as planned, and the least Kiln reaches by "
                                << "recomputing them is " << mb(hi) << "; give a budget of at least " << mb(hi);
  }
  *bc.program = *best->program;
  if (sites != nullptr) *sites = best->sites;
  report.after = best->use;
  report.segments = best->segments;
  report.singles = best->singles;
  report.recomputed_calls = best->added;
  report.recompute_cost = best->cost;
  return report;
}

}  // namespace kiln::bytecode
