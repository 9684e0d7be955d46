// The last stages of compilation, each one call of driver/compile.cc:
//   build_bytecode  the VM program (runtime/vm.h) of the partitioned graph:
//                   kernel calls, views, host kernels, shape computations and
//                   control flow (If branches and Loop/Scan bodies spliced in
//                   with jumps; SequenceMap and batched Scan bodies as
//                   sub-programs), with the run-time checks of dims and indices
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
  std::vector<kernels::KernelChoiceInfo> host_choices;  // host kernels a candidate chose (conv.onednn)
  int num_host_calls = 0;
};

Result<Bytecode> build_bytecode(const partition::Partition& p, const kernels::KernelSet& ks,
                                const SymbolBounds& bounds);

void plan_memory(Bytecode& bc);

// Sets every program's kernel table: `lookup` gives a kernel's entry point
// by name (codegen::CompiledModule::lookup).
Status link_kernels(Bytecode& bc, const kernels::KernelSet& ks,
                    const std::function<runtime::KernelFn(const std::string&)>& lookup);

}  // namespace kiln::bytecode
