// The loop-level tensor IR.
//
// A kernel starts as a KernelDef: buffers and a list of compute stages
// (ComputeDef), each defining one tensor by an expression over its index
// variables, optionally reduced over reduce axes. lower() turns a KernelDef and
// a Schedule into a PrimFunc: loops (For), stores (Store), scratch buffers
// (Allocate), conditionals (IfThenElse) and sequences (Seq). The PrimFunc is
// what codegen/llvm compiles.
//
// Statements are immutable and shared, like Exprs.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "shape/expr.h"

namespace kiln::tir {

// A tensor a kernel reads or writes: row-major and contiguous. `shape` may
// use symbols; their values are passed to the kernel at run time.
struct Buffer {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<Expr> shape;
};

enum class StmtKind : uint8_t { kFor, kStore, kAllocate, kIfThenElse, kSeq, kPrefetch };
enum class ForKind : uint8_t { kSerial, kParallel, kVectorized, kUnrolled };
const char* for_kind_name(ForKind k);

struct StmtNode;
using Stmt = std::shared_ptr<const StmtNode>;

struct StmtNode {
  StmtKind kind;
  // kFor: for (var = 0; var < extent; ++var) body
  std::string var;
  Expr extent;
  ForKind for_kind = ForKind::kSerial;
  // kStore: buffer[buffer_index] at indices = value
  // kAllocate: scratch buffer `buffer` (name, dtype, shape) live within body;
  //            referenced by loads/stores with buffer_index = -1 and its name.
  Buffer buffer;
  int buffer_index = -1;
  std::vector<Expr> indices;
  Expr value;
  // kPrefetch: a hint to bring `extent` elements of buffer[buffer_index] from
  // `indices` on into the cache (no effect on results; may point past the end)
  // kIfThenElse
  Expr cond;
  Stmt then_case, else_case;  // else_case may be null
  // kFor / kAllocate: body; kSeq: seq
  Stmt body;
  std::vector<Stmt> seq;
};

Stmt make_for(std::string var, Expr extent, ForKind kind, Stmt body);
Stmt make_store(std::string buffer, int buffer_index, std::vector<Expr> indices, Expr value);
Stmt make_allocate(Buffer buffer, Stmt body);
Stmt make_if(Expr cond, Stmt then_case, Stmt else_case = nullptr);
Stmt make_seq(std::vector<Stmt> seq);
Stmt make_prefetch(std::string buffer, int buffer_index, DType dtype, std::vector<Expr> indices, int64_t elements);

// A compiled unit. Calling convention of the generated function:
//   void name(void** buffers, const int64_t* syms)
// buffers[i] points to the data of params[i]; syms[j] is the value of symbol sym_names[j].
struct PrimFunc {
  std::string name;
  std::vector<Buffer> params;
  std::vector<std::string> sym_names;
  Stmt body;
};

// Scratch buffers (kAllocate) of at most this many bytes and constant shape
// live on the stack; larger ones come from the runtime's per-thread cache
// (support/scratch.h).
inline constexpr int64_t kStackScratchBytes = 64 * 1024;

// The cached (heap) scratch buffers a function allocates, by size: the bytes
// (rounded up to 64), how many of that size are live at once at most, and
// whether one is allocated inside a parallel loop (then on every thread).
// Buffers of symbolic size are left out.
struct ScratchUse {
  int64_t bytes = 0;
  int count = 0;
  bool per_thread = false;
};
std::vector<ScratchUse> heap_scratch(const PrimFunc& f);

// How a reduction combines values.
enum class Combiner : uint8_t { kNone, kSum, kProd, kMax, kMin };

// One stage: out[axes...] = body, or, with reduce axes,
//   acc = init; for reduce axes: acc = combine(acc, body); out[axes...] = finalize(acc)
// where `finalize` uses the variable named "acc" (undefined: identity).
struct ComputeDef {
  std::string name;  // the buffer it defines
  DType dtype = DType::kFloat32;
  std::vector<std::string> axes;  // one index variable per output dim
  std::vector<Expr> shape;        // extents of axes
  std::vector<std::string> reduce_axes;
  std::vector<Expr> reduce_extents;
  Combiner combiner = Combiner::kNone;
  Expr init;
  Expr body;
  Expr finalize;
};

// A fused group ready to lower: params are the kernel's inputs then outputs;
// stages run in order; a stage whose name is a param writes that output,
// any other stage is an intermediate (inlined or allocated per the schedule).
// Loads in bodies name either a param (buffer_index = its position) or an
// earlier stage (buffer_index = -1).
struct KernelDef {
  std::string name;
  std::vector<Buffer> params;
  int num_inputs = 0;
  std::vector<ComputeDef> stages;
};

// A kernel in canonical form: buffers, stages and axes named by position
// (params p0.., other stages t<stage index>, axes a0.., reduce axes r0..)
// and symbols s0, s1, .. in order of first appearance (params' shapes first),
// so that the same computation compiled from two models (other register
// numbers, `batch` against `N`) has the same text. `text` is the workload key:
// the kernel printed, then each symbol's bounds where `bounds` gives them.
struct CanonicalKernel {
  KernelDef def;
  std::vector<std::string> symbols;  // symbols[i]: the original name of s<i>
  std::map<std::string, std::string, std::less<>> names;  // original buffer/stage name -> canonical
  std::string text;
  uint64_t hash = 0;  // FNV-1a of text (stable across runs and platforms)
};
CanonicalKernel canonicalize(const KernelDef& k, const SymbolBounds* bounds = nullptr);

// Structural hash of what a kernel computes (stage bodies, shapes, dtypes),
// independent of buffer, axis, symbol and kernel names: canonicalize(k).hash.
uint64_t structural_hash(const KernelDef& k);

// Pairs (input param, output param) of a kernel that may share one buffer,
// so a call may write its output over an input nothing reads afterwards: the
// kernel has one output, written by its last stage and never read; the input
// has the output's dtype and shape; and every stage that depends on the
// input is pointwise (no reduce axes) over the output's shape and reads the
// input and such stages only at the point it computes (stages that do not
// depend on it, such as per-channel factors, are free). Any schedule of such
// a kernel reads each element of the input before it writes the same element
// of the output, and no other.
std::vector<std::pair<int, int>> in_place_pairs(const KernelDef& k);

std::string print_stmt(const Stmt& s, int indent = 0);
std::string print_func(const PrimFunc& f);
std::string print_kernel_def(const KernelDef& k);

}  // namespace kiln::tir
