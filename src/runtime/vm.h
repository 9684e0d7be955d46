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
//   kCheckBroadcast  values [d_in, d_out, ...] in pairs, attrs [input, axis, ...]:
//              each d_in, evaluated now, must be 1 or equal to d_out (a symbolic
//              dim of an input that inference broadcast to the output without
//              proof, e.g. [n] + [m] -> [max(m, n)]), or a symbolic axis a
//              compiled Squeeze drops (d_out the constant 1: it must be 1);
//              else an error naming the node, the input, the axis and both sizes
//   kJump / kBranch / kRet  control flow (kBranch: jump when a bool scalar is false)
//   kIf / kLoop / kScan  ONNX control flow: run a sub-program (see below)
//
// ONNX control flow. Every subgraph (If branch, Loop or Scan body) is compiled
// to its own Program, held in Program::subprograms; it is not inlined into the
// parent's bytecode. A sub-program's inputs are the subgraph's own inputs in
// order, then the outer values it captures (Instr::captures: parent registers).
// The VM runs a sub-program on a sub-VM of its own (created on first use, kept
// across runs; with static shapes it has its own arena). Sub-program outputs are
// fresh tensors, so they can be handed to the parent's registers, carried to
// the next iteration or returned to the caller without copies. The outputs of a
// control-flow instruction are bound like host-kernel outputs: their dims may
// be data-dependent symbols, bound from the tensors the sub-program produced.
//   kIf    inputs [cond, captures...]; subprograms {then, else}; captures per branch
//   kLoop  inputs [M or -1, cond or -1, initial carried..., captures...];
//          outputs [final carried..., scan outputs...]; body inputs
//          (iteration_num, cond, carried..., captures...), body outputs
//          (cond, carried..., scan outputs...); scan outputs are stacked
//          along a new axis 0
//   kScan  inputs [initial state..., scan inputs..., captures...]; outputs
//          [final state..., scan outputs...]; attrs = [num_scan_inputs,
//          batched, (axis, direction) per scan input, (axis, direction) per
//          scan output], axes already non-negative. batched = 1 (Scan in
//          opset 8): inputs [sequence_lens (or -1), initial state...,
//          scan inputs..., captures...], every operand and output with a
//          leading batch axis; each batch element is scanned on its own (axes
//          are those of one element), for its sequence length, and its scan
//          outputs are zero past it
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

namespace kiln::runtime {

using KernelFn = void (*)(void** buffers, const int64_t* syms);
using HostKernel = std::function<Status(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs)>;

enum class OpCode : uint8_t {
  kCall, kCallHost, kView, kBind, kShapeOf, kCopy, kCheckIndices, kCheckBroadcast, kJump, kBranch, kRet, kIf, kLoop, kScan,
  kSequenceMap
};

struct Instr {
  OpCode op = OpCode::kRet;
  int callee = -1;            // kCall: index into Program::kernels; kCallHost: into host_kernels
  std::vector<int> inputs;    // registers read
  std::vector<int> outputs;   // registers written
  std::vector<int> release;   // registers whose last use is this instruction (pool mode)
  int target = -1;            // kJump / kBranch: instruction index
  std::vector<Expr> values;   // kShapeOf: element values; kCheckIndices: extents
  std::string where;          // node description for error messages ("Conv 'conv1'")
  // kIf / kLoop / kScan: indices into Program::subprograms, and per sub-program
  // the registers passed after its own inputs (captured outer values; they are
  // also listed in `inputs`, after the explicit operands, for lifetimes).
  std::vector<int> subprograms;
  std::vector<std::vector<int>> captures;
  std::vector<int64_t> attrs;  // kScan, kCheckBroadcast: see the file comment
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
  std::vector<std::shared_ptr<const Program>> subprograms;  // bodies of kIf / kLoop / kScan
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
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs);

  // Per-instruction timing, accumulated over runs while enabled (for `kiln profile`).
  struct InstrProfile {
    int64_t calls = 0;
    double seconds = 0;
  };
  void set_profiling(bool enabled);
  // Bytes a run may allocate (support/memory_limit.h); 0: the calling thread's limit.
  void set_memory_limit(int64_t bytes);
  const std::vector<InstrProfile>& profile() const;
  const Program& program() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime
