// The kernel stages of compilation, after partitioning and before code
// generation, each one call of driver/compile.cc:
//   define_kernels    every fused group's compute definition (ops' lower()),
//                     in canonical form; groups computing the same thing with
//                     the same implementation share one kernel
//   schedule_kernels  every kernel's schedule (the chosen candidate's
//                     template, the default schedule, or naive)
//   lower_kernels     every kernel's loop IR (tir::lower)
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kernels/choice.h"
#include "partition/partition.h"
#include "strategy/strategy.h"
#include "tir/schedule.h"
#include "tir/tir.h"
#include "tune/tune.h"

namespace kiln::kernels {

// One kernel: the compute definition of the groups that share it.
struct Kernel {
  // The workload key: the canonical text (names by position, symbols
  // renamed, their bounds) and the implementation chosen.
  std::string key;
  tir::CanonicalKernel canon;  // of the first group
  const partition::GraphPartition* where = nullptr;
  const Node* root = nullptr;    // the first group's last node
  const Node* anchor = nullptr;  // the node whose implementation was chosen (MatMul, Conv), if any
  std::string anchor_stage;      // its stage's canonical name
  std::optional<strategy::Choice> choice;
  tir::Schedule schedule;  // schedule_kernels
  tir::PrimFunc func;      // lower_kernels; named kiln_k<index>_<op>
  KernelChoiceInfo info;
};

// A fused group's call of its kernel.
struct GroupCall {
  int kernel = -1;
  std::vector<const Value*> inputs, outputs;  // the kernel's parameters in order
  std::vector<std::string> symbols;           // the group's own names of the kernel's s0, s1, ...
};

struct KernelSet {
  std::vector<Kernel> kernels;  // in program order of their first group
  std::map<std::string, int, std::less<>> by_key;
  std::map<const partition::FusedGroup*, GroupCall> calls;
};

Result<KernelSet> define_kernels(const partition::Partition& p, const SymbolBounds& bounds);
Status schedule_kernels(KernelSet& ks, bool naive);
Status lower_kernels(KernelSet& ks, bool dump_ir);

// Kernel choice's workloads: for every node that has candidates, the
// workload of the kernel it will anchor (its group as fuse_elementwise forms
// it once an implementation is chosen, on the weights before any
// candidate's transform). Nodes whose kernels cannot be defined are left out.
struct GroupWorkload {
  const Node* anchor = nullptr;
  std::vector<Node*> group;                   // the group's nodes in order (the anchor among them)
  std::vector<const Value*> inputs, outputs;  // the kernel's parameters
  tune::Workload workload;
  bool generic = false;  // a group without a candidate: `anchor` is its last node
  tir::KernelDef def;    // generic: the kernel's canonical definition (its space's)
};
std::vector<GroupWorkload> candidate_workloads(Graph& g, const SymbolBounds& bounds, bool fuse);
// The workloads of the kernels without a candidate (the generic space's,
// strategy.h), one per group, its last node as the anchor. `before_choice`:
// grouped as candidate_workloads groups (for `kiln tune`, before kernel
// choice); else as the graph's recorded choices group it.
std::vector<GroupWorkload> generic_workloads(Graph& g, const SymbolBounds& bounds, bool fuse, bool before_choice);

// Every kernel's compute definition, schedule and loop IR as text (kiln opt --lower).
std::string kernels_text(const KernelSet& ks);

}  // namespace kiln::kernels
