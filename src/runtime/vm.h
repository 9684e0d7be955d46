// The runtime VM: a register machine over tensors. A Program is built by the
// driver (driver/pipeline.cc) and holds everything needed to run a model:
// compiled kernel entry points, host (C++) kernels, constants, the memory plan.
// The runtime does not link LLVM, the op registry or the graph IR.
//
// Registers hold tensors; a sequence or an optional is a tensor of dtype
// kSequence / kOptional whose elements are tensors (support/dtype.h), made and
// read by host kernels only. Instructions:
//   kCall      call a compiled kernel: buffers = arg registers (inputs then
//              outputs); outputs are allocated first (shapes from their
//              symbolic types under the current symbol bindings)
//   kCallHost  call a C++ kernel; it allocates its outputs, whose dims bind
//              fresh (data-dependent) symbols, except with fills_outputs:
//              outputs whose shapes are known before the call are passed in
//              (from the memory plan or the run's pool) and the kernel writes
//              them in place
//   kView      output register = input's storage with the output's shape
//   kBind      output registers take their planned arena storage; nothing is
//              computed (a Concat whose inputs the memory plan placed in the
//              slices of its output: the producers already wrote the result)
//   kShapeOf   output = an integer tensor whose elements are symbolic Exprs
//              evaluated now (shape subgraphs resolved at compile time)
//   kCopy      output = a fresh copy of the input (graph outputs that alias
//              inputs or constants)
//   kCheckIndices  inputs [indices]: every element must lie in [-e, e), e the
//              extent `values[position % values.size()]` evaluated now (an
//              index tensor of a compiled Gather-like kernel); else an error
//              naming the node
//   kCheckBroadcast  values [d_in, d_out, ...] in pairs, attrs [input, axis,
//              exact, ...] in triples: each d_in, evaluated now, must equal
//              d_out, or with exact 0 also be 1 (a symbolic
//              dim of an input that inference broadcast to the output without
//              proof, e.g. [n] + [m] -> [max(m, n)]), or a symbolic axis a
//              compiled Squeeze drops (d_out the constant 1: it must be 1);
//              else an error naming the node, the input, the axis and both sizes
//   kJump / kBranch / kRet  control flow (kBranch: jump when a bool scalar is false)
//   kMove      parallel move, inputs[i] -> outputs[i]; per pair attrs[i] flags
//              (kMoveInto, kMoveDetach, kMoveAlias below). The
//              destination's dims are bound from the tensor. A destination the
//              memory plan placed in the arena receives a copy of the data;
//              otherwise it shares the source's storage, except that a source
//              in the arena (unless aliased) and a kMoveDetach pair whose
//              storage anyone else holds are copied into a fresh buffer.
//   kEndIf     nothing; ends an If (`end` of its kBranch): registers last read
//              in either branch are released here
//
// ONNX control flow runs in the program's own bytecode: a subgraph is
// compiled by the same builder and its instructions are spliced into the
// parent's, its registers after the parent's (driver/pipeline.cc). Captured
// outer values are moved (kMoveAlias) into the subgraph's capture registers.
//   If:   kBranch cond -> else (end = join); then body; kMove outs; kJump join;
//         else body; kMove outs; join: kEndIf
//   Loop / Scan (opset 9+):
//     P: kLoopBegin  Loop: inputs [M or -1, cond or -1], attrs [0, endless]
//                    (endless: no M and the body passes cond through, so a
//                    true cond is refused); Scan:
//                    inputs [scan inputs...], attrs [1, (axis, reverse) per
//                    scan input]; end = X. Starts the loop's state: trip count
//                    or length, iteration 0, the symbol-binding mark
//        kMove       initial carried values -> the body's carried inputs
//     H: kLoopTest   loop = P, target = X: jumps to X when done; else writes the
//                    body's per-iteration inputs: Loop: outputs [iteration_num,
//                    cond], two scalars rewritten in place while nothing else
//                    holds them (else fresh ones); Scan: inputs [scan inputs...],
//                    outputs [their slices]
//        ... body ...
//        kLoopNext   loop = P, target = H: inputs [cond out (Loop only), carried
//                    outs..., scan outs...], outputs [carried inputs...];
//                    attrs [kind, move flags per carried value]. Appends the scan
//                    outs to the loop's accumulators (copies), forgets the
//                    symbols bound since P (the next iteration binds them
//                    afresh), moves the carried values, jumps to H
//     X: kLoopEnd    loop = P: inputs [carried inputs...], outputs [final carried
//                    values..., scan outputs...], attrs [(axis, reverse) per scan
//                    output]. Forgets the symbols bound since P, detaches the
//                    final values, stacks the accumulators
//   With static shapes the body's intermediates, carried values and slices live
//   in the arena (the memory plan keeps what a loop reads alive until its X), and
//   a warm iteration allocates nothing; loop state and accumulators persist in
//   the VM across runs. Errors inside a loop name it and the iteration.
//
// Sub-programs remain for two ops that map a body over elements: each is
// compiled to its own Program (Program::subprograms) and run on a sub-VM of
// its own (created on first use, kept across runs). A sub-program's inputs are
// the subgraph's own inputs in order, then the outer values it captures
// (Instr::captures: parent registers).
//   kScan  (opset 8, batched) inputs [sequence_lens (or -1), initial state...,
//          scan inputs..., captures...], outputs [final state..., scan
//          outputs...], attrs = [num_scan_inputs, 1, (axis, direction) per
//          scan input, (axis, direction) per scan output], axes those of one
//          batch element; each batch element is scanned on its own, for its
//          sequence length, and its scan outputs are zero past it
//   kSequenceMap  inputs [operands..., captures...]; attrs: per operand 1 for a
//          sequence (iterated: the body gets its element i), 0 for a tensor
//          (passed whole); the body runs once per element of operand 0 (every
//          sequence operand must have that length) and output k is the
//          sequence of the body's output k
//
// Memory: with static shapes every intermediate lives at a fixed offset of one
// arena planned at compile time (runtime/memory_plan.h); with symbolic shapes
// buffers come from a size-class pool and return to it after their last use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shape/expr.h"
#include "support/status.h"
#include "support/tensor.h"

namespace kiln::trace {
class Recorder;
}

namespace kiln::runtime {

using KernelFn = void (*)(void** buffers, const int64_t* syms);
using HostKernel = std::function<Status(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>;

// kMove flags, per pair.
enum MoveFlags : int64_t {
  kMoveInto = 1,    // the destination may be planned in the arena (then the data is copied there)
  kMoveDetach = 2,  // the result must own its storage: copied unless no one else holds it
  kMoveAlias = 4,   // the destination is another name for the source (a captured value): shares it
};

enum class OpCode : uint8_t {
  kCall, kCallHost, kView, kBind, kShapeOf, kCopy, kCheckIndices, kCheckBroadcast, kJump, kBranch, kRet, kMove,
  kEndIf, kLoopBegin, kLoopTest, kLoopNext, kLoopEnd, kScan, kSequenceMap
};

struct Instr {
  OpCode op = OpCode::kRet;
  int callee = -1;            // kCall: index into Program::kernels; kCallHost: into host_kernels
  std::vector<int> inputs;    // registers read
  std::vector<int> outputs;   // registers written
  std::vector<int> release;   // registers whose last use is this instruction (pool mode)
  int target = -1;            // kJump / kBranch / kLoopTest / kLoopNext: instruction index
  int end = -1;               // kLoopBegin, an If's kBranch: the last instruction of the region (for lifetimes)
  int loop = -1;              // kLoopTest / kLoopNext / kLoopEnd: the loop's kLoopBegin
  std::vector<Expr> values;   // kShapeOf: element values; kCheckIndices: extents
  std::string where;          // node description for error messages ("Conv 'conv1'")
  // kScan / kSequenceMap: indices into Program::subprograms, and per sub-program
  // the registers passed after its own inputs (captured outer values; they are
  // also listed in `inputs`, after the explicit operands, for lifetimes).
  std::vector<int> subprograms;
  std::vector<std::vector<int>> captures;
  std::vector<int64_t> attrs;  // kMove, kLoop*, kScan, kCheckBroadcast: see the file comment
  bool fills_outputs = false;  // kCallHost: the kernel writes outputs passed in (OpDef::kernel_fills_outputs)
};

struct RegisterInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<Expr> shape;            // symbolic shape
  bool is_constant = false;
  Tensor constant;                    // when is_constant
  int64_t arena_offset = -1;          // static plan: byte offset in the arena; -1: not planned
  bool is_output = false;             // a graph output: allocated fresh each run, returned to the caller
  // Containers (kSequence, kOptional): the dtypes of its elements, of theirs, ...
  // ([kSequence, kFloat32] for an optional sequence of f32 tensors); checked on inputs.
  std::vector<DType> elem_dtypes;
};

struct CompiledKernel {
  std::string name;
  KernelFn fn = nullptr;
  std::vector<std::string> sym_names;  // values passed in the syms array, in order
  std::vector<int> sym_slots;          // the same symbols as indices into Program::symbols (the VM reads these)
};

struct Program {
  std::vector<RegisterInfo> registers;
  std::vector<Instr> instrs;
  std::vector<CompiledKernel> kernels;
  std::vector<HostKernel> host_kernels;
  // Per host kernel, what rebuilds it when the program is read from a package
  // (package/): its node as graph IR text (graph/graph.h), the node's inputs
  // as graph inputs of their types. Inputs whose register is a constant get
  // that constant when the kernel is rebuilt.
  std::vector<std::string> host_kernel_nodes;
  std::vector<std::shared_ptr<const Program>> subprograms;  // bodies of kScan / kSequenceMap
  std::vector<int> input_registers;
  std::vector<int> output_registers;
  SymbolBounds bounds;
  // The symbols kernels take, by slot: the VM keeps each one's value in a
  // vector as it binds it (once per run), so a kernel call reads its
  // arguments by index instead of looking names up.
  std::vector<std::string> symbols;
  std::map<std::string, int, std::less<>> symbol_slots;
  bool static_plan = false;  // true: every register has an arena_offset or is an input/constant/output
  int64_t arena_bytes = 0;
};

// Executes a Program. Not thread-safe: one VM per concurrent caller. The VM
// owns the arena and the pool, reused across runs.
class VM {
 public:
  VM(std::shared_ptr<const Program> program, int num_threads);
  ~VM();

  // Inputs by position of Program::input_registers. Checks dtype and shape
  // (static dims equal, symbolic dims bound consistently) and names the input
  // in errors. Returns the outputs by position of Program::output_registers.
  // `into`, when given, holds a caller's buffer per output (undefined: the VM
  // allocates it): the kernels write into a buffer of the output's dtype that
  // is 64-byte aligned, any other gets the output copied in; a buffer whose
  // dtype or shape is not the output's is an error naming the output.
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs, const std::vector<Tensor>* into = nullptr);

  // Per-instruction timing, accumulated over runs while enabled (for `kiln profile`).
  struct InstrProfile {
    int64_t calls = 0;
    double seconds = 0;
  };
  void set_profiling(bool enabled);
  // Records a span per instruction (its index as the label) on the calling
  // thread, and the thread pool one per chunk its workers run (support/trace.h).
  // Null: none. Subprograms (If branches, Loop bodies run by a sub-VM) are
  // one span of the instruction that runs them.
  void set_trace(trace::Recorder* recorder);
  // Bytes a run may allocate (support/memory_limit.h); 0: the calling thread's limit.
  void set_memory_limit(int64_t bytes);
  const std::vector<InstrProfile>& profile() const;
  const Program& program() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime
