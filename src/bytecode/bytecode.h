// The last stages of compilation, each one call of driver/compile.cc:
//   build_bytecode  the VM program (runtime/vm.h) of the partitioned graph:
//                   kernel calls, views, host kernels, shape computations and
//                   control flow (If branches and Loop/Scan bodies spliced in
//                   with jumps; SequenceMap and batched Scan bodies as
//                   sub-programs), with the run-time checks of dims and indices
//   checkpoint      a training step's activation memory under a budget:
//                   forward kernel calls repeated in the backward
//                   (checkpoint.cc)
//   plan_memory     register lifetimes and releases; where every planned
//                   register has a static shape, one arena with offsets (and
//                   Concat/Split in place)
//   link_kernels    every program's kernel table from the generated code
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "partition/partition.h"
#include "runtime/vm.h"

namespace kiln::bytecode {

// A lone Concat with static shapes whose inputs are contiguous blocks of its
// output (every dim before the axis is 1): plan_memory may place the inputs
// in the output's slices and turn the call into a kBind. A lone Split
// likewise, the other way round (`output` is the Split's input, `inputs` its
// outputs): its outputs may be placed in the slices of its input, whose
// buffer then lives until their last use.
struct ConcatSite {
  size_t instr = 0;
  int output = -1;
  std::vector<int> inputs;
  std::vector<int64_t> offsets;  // byte offset of each input in the output
  bool split = false;
};

struct Bytecode {
  std::shared_ptr<runtime::Program> program;  // the model's
  // Programs whose memory is planned on their own: the model's, and the
  // bodies kScan and kSequenceMap run per element, each with its in-place
  // Concat/Split sites.
  std::vector<std::pair<std::shared_ptr<runtime::Program>, std::vector<ConcatSite>>> planned;
  std::vector<std::shared_ptr<runtime::Program>> programs;  // all of them: every one gets the kernel table
  // Call targets: a kernel and the symbols a call passes it, in the order of
  // its (canonical) sym_names; runtime::Instr::callee indexes these.
  std::vector<std::pair<int, std::vector<std::string>>> entries;
  // Per entry: (input, output) parameter positions its kernel lets share one
  // buffer (tir::in_place_pairs); the memory plan writes such an output over
  // an input whose last reader is that call.
  std::vector<std::vector<std::pair<int, int>>> in_place;
  std::vector<kernels::KernelChoiceInfo> host_choices;  // host kernels a candidate chose (conv.onednn)
  int num_host_calls = 0;
};

Result<Bytecode> build_bytecode(const partition::Partition& p, const kernels::KernelSet& ks,
                                const SymbolBounds& bounds);

void plan_memory(Bytecode& bc);

// An instruction of a region (an If's branch or join, a loop's, a sub-program
// call) or a move between such regions' values.
bool is_control_flow(const runtime::Instr& in);

// What one run of the model's program allocates beyond its inputs and
// constants, from its static plan (planned on a copy; `known` is false where
// a register's shape is symbolic or the program has control flow).
struct MemoryUse {
  bool known = false;
  int64_t arena_bytes = 0;      // the static plan's arena
  int64_t unplanned_bytes = 0;  // intermediates allocated as they run (host kernels'), at their peak
  int64_t output_bytes = 0;     // the outputs, allocated fresh each run
  int64_t peak_bytes = 0;       // the arena plus unplanned intermediates and outputs at their peak together
  // Where the most arena bytes are live at once (the instruction's node) and
  // the largest values live there, largest first (at most five).
  std::string peak_at;
  std::vector<std::pair<std::string, int64_t>> peak_values;
  // Every intermediate: what a training step's memory budget bounds.
  int64_t activation_bytes() const { return arena_bytes + unplanned_bytes; }
};
MemoryUse memory_use(const Bytecode& bc);

// Automatic checkpointing (checkpoint.cc): of a training step's forward (the
// kernel calls its loss output depends on), which values the backward reads
// are kept from the forward and which are computed again, by the same
// kernels, just before the backward first reads them, so that the step's
// activation memory (MemoryUse::activation_bytes) is at most `budget` at
// the least added compute.
struct CheckpointOptions {
  int64_t budget = 0;
  // "dp": dynamic programming over the forward's order (segments recomputed
  // from kept boundaries, or kept whole; the least estimated compute under
  // the budget). "sqrt": Chen et al.'s baseline, equal segments all
  // recomputed, about sqrt(n) of them.
  std::string policy = "dp";
  std::vector<double> entry_cost;  // per call target (Bytecode::entries): its estimated compute
  int loss_output = 0;             // the program output whose computation is the forward
};
struct CheckpointReport {
  MemoryUse before, after;
  int segments = 0;              // forward segments recomputed
  int singles = 0;               // saved values recomputed alone, each by the call that made them
  int recomputed_calls = 0;      // instructions added
  double forward_cost = 0;       // estimated compute of the forward
  double recompute_cost = 0;     // of what is computed again
};
// Errors: a budget the step cannot meet (saying the least it can), a step
// with symbolic shapes or control flow, an unknown policy.
Result<CheckpointReport> checkpoint(Bytecode& bc, const CheckpointOptions& options);

// A training step's calls that read only its inputs and constants (a
// weight transposed, flipped or packed for the backward), and the calls
// reading only those, moved to just before their first reader: their
// results no longer live from the forward to the backward. Returns how many
// moved; a program with control flow is left as it is.
int sink_input_only_calls(Bytecode& bc);

// The opposite for a step's results: calls whose outputs are program
// outputs (an optimizer's update of one parameter), and the calls feeding
// only those, moved to just after the last call making their inputs, so a
// parameter's gradient dies once its update has run instead of living to
// the end of the backward. Returns how many moved; a program with control
// flow is left as it is.
int hoist_output_calls(Bytecode& bc);

// Sets every program's kernel table: `lookup` gives a kernel's entry point
// by name (codegen::CompiledModule::lookup).
Status link_kernels(Bytecode& bc, const kernels::KernelSet& ks,
                    const std::function<runtime::KernelFn(const std::string&)>& lookup);

}  // namespace kiln::bytecode
