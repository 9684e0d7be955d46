// Operator strategy: which implementation computes each op.
//
// Per op, a list of candidate implementations (Candidate). Each has an
// applicability rule, a priority (higher wins when nothing else decides), an
// optional compile-time transform of the node's constants (weight packing,
// layout change) and a schedule template with named integer knobs and their
// ranges (its search space; tir/knobs.h samples it).
//
// Selection (select_kernels, run as the graph pass `select-kernels` at the end
// of the pipeline) asks, per node and in this order:
//   1. the choice sources (ChoiceSource: a tuning database plugs in here),
//   2. measurement, when SelectOptions::measure is set (`--select=measure`):
//      every applicable candidate with its default knobs is timed on the
//      node's real shapes and the fastest kept,
//   3. priority: the applicable candidate with the highest priority and its
//      default knobs (a rule of the candidate's, from the node's shapes).
// The choice is recorded on the node (attributes kiln_impl, kiln_knobs,
// kiln_choice_source) and the candidate's transform applied; the driver then
// asks schedule_for() for the kernel whose reduction that node defines.
// Nodes with no registered candidate keep the default schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "support/status.h"
#include "support/target.h"
#include "tir/knobs.h"
#include "tir/schedule.h"

namespace kiln::strategy {

// Node attributes that carry a choice (Kiln-internal; ONNX export refuses them).
inline constexpr const char* kImplAttr = "kiln_impl";
inline constexpr const char* kKnobsAttr = "kiln_knobs";
inline constexpr const char* kSourceAttr = "kiln_choice_source";

struct Candidate {
  std::string name;    // "gemm.packed", "matmul.default", "conv.ihwo", ...
  std::string op;      // ai.onnx op it implements ("MatMul")
  int priority = 0;    // default ranking; the rule below may lower it for a node
  std::string summary;
  // Applicability; when false, *why says what is missing.
  std::function<bool(const Node&, std::string* why)> applies;
  // Applicability that needs the graph (graph outputs, opsets); null: none.
  std::function<bool(const Graph&, const Node&, std::string* why)> applies_in_graph;
  // Priority for this node (defaults to `priority`): a candidate may know it
  // wins or loses on some shapes (the measured rules of conv.ihwo).
  // The target (support/target.h) sets register-tile limits and vector widths.
  std::function<int(const Node&, const Target&)> priority_for;
  // Search space and default point for this node (empty: no knobs).
  std::function<tir::KnobSpace(const Node&, const Target&)> space;
  std::function<tir::Knobs(const Node&, const Target&)> default_knobs;
  // Compile-time transform of the node's constants (null: none). Runs once
  // per node after the choice; may add constants and set attributes.
  std::function<Status(Graph&, Node&, const tir::Knobs&)> transform;
  // Schedule template: the schedule of the kernel whose anchor stage (the
  // reduction this node defines, `stage`) the candidate implements. Other
  // stages of the kernel (fused producers) keep the default schedule. Null:
  // the default schedule.
  std::function<Result<tir::Schedule>(const tir::KernelDef&, const std::string& stage, const tir::Knobs&)>
      schedule;
  // The most threads a model may run with for this candidate to apply (0:
  // any); an external library with its own threads (conv.onednn) sets it.
  int max_threads = 0;
  // The candidate's kernel also computes the node's producers (the
  // attention chain): timed alone, the node would not show what it does, so
  // measurement leaves the choice to priority where it applies.
  bool fuses_producers = false;
};

void register_candidate(Candidate c);
// Candidates registered for an op, highest priority first.
std::vector<const Candidate*> candidates_for(const std::string& domain, const std::string& op);
const Candidate* find_candidate(const std::string& name);
std::vector<const Candidate*> all_candidates();

// A decision for one node.
struct Choice {
  std::string candidate;
  tir::Knobs knobs;
  std::string source;  // "priority", "measured", or the choice source's label ("database", "preferred")
  std::string why;     // one line for `kiln info --kernels`
};

// A source of decisions consulted before measurement and priority (the
// tuning database of a later issue implements this).
class ChoiceSource {
 public:
  virtual ~ChoiceSource() = default;
  virtual std::string name() const = 0;
  // The workload key is the node's op, attributes and input types (shapes
  // with bounds), and the target the choice is for; std::nullopt: no record.
  virtual std::optional<Choice> lookup(const Node& n, const std::vector<const Candidate*>& applicable,
                                       const Target& target) = 0;
  // A choice of a strict source (what a user asked for, --impl) whose knobs
  // lie outside the candidate's space is an error; a non-strict source's (a
  // stale database record) is ignored.
  virtual bool strict() const { return false; }
};

struct SelectOptions {
  // The vector machine the priorities, spaces and default knobs are for.
  Target target = Target::host();
  // The thread count the model is compiled for (Candidate::max_threads).
  int threads = 1;
  std::vector<std::shared_ptr<ChoiceSource>> sources;
  // Times one node under a choice (seconds per run); set for --select=measure.
  std::function<Result<double>(const Node&, const Choice&)> measure;
};

// Chooses an implementation for every node that has candidates, records it
// and applies its transform. Returns the number of nodes given a candidate.
// A node that already carries kiln_impl keeps it (its transform is not re-run).
Result<int> select_kernels(Graph& g, const SelectOptions& options);

// The candidate select_kernels would give `n` without measuring: a choice
// source's record where one names an applicable candidate (*from_source
// set; also, with an empty name, for a strict source's record that
// select_kernels will report as an error), else the highest priority (empty:
// no applicable candidate). Changes nothing; the pass block-layout asks it
// which convolutions to leave in NCHW (those a source decides for, and those
// that would get conv.winograd).
std::string unmeasured_choice(const Graph& g, const Node& n, const SelectOptions& options,
                              bool* from_source = nullptr);

// The candidates of `n`'s op that apply to it (within the thread limit),
// highest priority for this node first; *rejected gets the others with why.
std::vector<const Candidate*> applicable_candidates(const Graph& g, const Node& n, const SelectOptions& options,
                                                    std::vector<std::string>* rejected = nullptr);

// The choice recorded on a node by select_kernels (nullopt: none).
std::optional<Choice> recorded_choice(const Node& n);
void record_choice(Node& n, const Choice& c);

// The schedule of a kernel whose anchor stage `stage` was defined by node
// `anchor` (null: no anchor). Falls back to tir::default_schedule where the
// node has no choice or the candidate has no template. With a choice, the
// schedule ends with fuse_epilogue(stage): the kernel also holds the
// elementwise group that reads the node when all its uses are in one
// (partition/fuse_elementwise.h), and that group is computed in the write-back.
Result<tir::Schedule> schedule_for(const tir::KernelDef& k, const std::string& stage, const Node* anchor);

// For a node whose recorded choice is matmul.attention (strategy/attention.cc):
// the nodes its kernel computes before it (the score MatMul, the elementwise
// ops on the scores, the Softmax), producers first; empty otherwise.
// partition/fuse_elementwise.h puts them in the node's group.
std::vector<const Node*> attention_nodes(const Node& anchor);

// Kernels without a candidate (elementwise groups, reductions, Softmax,
// LayerNormalization, pools, layout conversions) are tuned in a generic
// space (generic.cc): knobs that edit tir::default_schedule per stage
// (vector length, unrolling, which loop is parallel, the reduction's
// schedule), each value kept only where it changes the kernel's schedule.
// Its default point is the default schedule. A choice for such a kernel is
// recorded on its group's last node (the database's at kernel choice, a
// trial's when tuning) and define_kernels gives it to the kernel as the
// candidate "generic".
inline constexpr const char* kGenericCandidate = "generic";
inline constexpr const char* kGenericKnobsAttr = "kiln_generic_knobs";
inline constexpr const char* kGenericSourceAttr = "kiln_generic_source";  // "database: record ...", "tuning"
tir::KnobSpace generic_space(const tir::KernelDef& k, const Target& t, int threads);
tir::Knobs generic_defaults(const tir::KnobSpace& space);
tir::Schedule generic_schedule(const tir::KernelDef& k, const tir::Knobs& knobs);
// The generic choice recorded on a group's last node (nullopt: none or unparsable).
std::optional<Choice> recorded_generic_choice(const Node& n);
void record_generic_choice(Node& n, const Choice& c);

// Registers the built-in candidates (idempotent; the functions above call it).
void register_builtin_candidates();

}  // namespace kiln::strategy
