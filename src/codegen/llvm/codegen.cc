// Loop IR (tir::PrimFunc) to LLVM IR.
//
// Values live in SSA registers: loop variables are phis, symbols are loaded
// once at function entry. Buffers are row-major; a load or store flattens its
// indices with the buffer's shape (i64, nsw). Every parameter buffer with a
// distinct name gets its own alias scope, so LLVM knows stores to one do not
// clobber loads from another (the equivalent of noalias parameters, but also
// valid inside outlined parallel bodies); so does every scratch buffer. Bools are i1 in registers, i8 in memory.
//
// Float transcendental functions (exp, log, tanh, erf, sigmoid, pow, sin, cos)
// of f32 are expanded inline into range reduction + polynomials so that the
// loop vectorizer can widen them; f64 versions call scalar libm.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <functional>
#include <vector>

#include "codegen/llvm/codegen_internal.h"
#include "support/kernel_abi.h"
#include "support/scratch.h"
#include "support/thread_pool.h"

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

namespace kiln::codegen::detail {

namespace {

// True when evaluating `e` may fault or be undefined if its guard is false:
// loads (index out of bounds; not counted with count_loads false, for a
// widened select arm that reads them under the arm's lane mask) and integer
// division by a non-constant.
bool may_trap(const Expr& e, bool count_loads = true) {
  switch (e.kind()) {
    case ExprKind::kLoad:
      if (count_loads) return true;
      break;
    case ExprKind::kDiv:
    case ExprKind::kFloorDiv:
    case ExprKind::kMod:
      if (!dtype_is_float(e.dtype())) {
        for (size_t i = 1; i < e->args.size(); ++i) {
          auto c = e->args[i].as_const();
          if (!c || *c == 0) return true;
        }
      }
      break;
    default:
      break;
  }
  for (const Expr& a : e->args)
    if (may_trap(a, count_loads)) return true;
  return false;
}

bool is_signed_int(DType t) { return dtype_is_int(t) && dtype_is_signed(t); }

// Widest element (bits) loaded or stored in a statement; 0 if none.
int widest_access_bits(const Expr& e) {
  int bits = 0;
  if (e.kind() == ExprKind::kLoad) bits = static_cast<int>(dtype_size(e.dtype())) * 8;
  for (const Expr& a : e->args) bits = std::max(bits, widest_access_bits(a));
  return bits;
}

int widest_access_bits(const tir::Stmt& s) {
  if (!s) return 0;
  int bits = 0;
  switch (s->kind) {
    case tir::StmtKind::kStore:
      bits = std::max(static_cast<int>(dtype_size(s->value.dtype())) * 8,
                      widest_access_bits(s->value));
      break;
    case tir::StmtKind::kIfThenElse:
      bits = std::max({widest_access_bits(s->cond), widest_access_bits(s->then_case),
                       widest_access_bits(s->else_case)});
      break;
    case tir::StmtKind::kFor:
    case tir::StmtKind::kAllocate:
      bits = widest_access_bits(s->body);
      break;
    case tir::StmtKind::kSeq:
      for (const tir::Stmt& c : s->seq) bits = std::max(bits, widest_access_bits(c));
      break;
    case tir::StmtKind::kPrefetch:
      break;
  }
  return bits;
}

// True when `s` contains a loop the schedule marked vectorized.
bool contains_vectorized_loop(const tir::Stmt& s) {
  if (!s) return false;
  switch (s->kind) {
    case tir::StmtKind::kFor:
      return s->for_kind == tir::ForKind::kVectorized || contains_vectorized_loop(s->body);
    case tir::StmtKind::kAllocate:
      return contains_vectorized_loop(s->body);
    case tir::StmtKind::kIfThenElse:
      return contains_vectorized_loop(s->then_case) || contains_vectorized_loop(s->else_case);
    case tir::StmtKind::kSeq:
      for (const tir::Stmt& c : s->seq)
        if (contains_vectorized_loop(c)) return true;
      return false;
    case tir::StmtKind::kStore:
    case tir::StmtKind::kPrefetch:
      return false;
  }
  return false;
}

// A buffer visible to the code being emitted.
struct BufferRef {
  llvm::Value* ptr = nullptr;
  const tir::Buffer* buffer = nullptr;
  llvm::MDNode* alias_scope = nullptr;  // !alias.scope of its accesses
  llvm::MDNode* noalias = nullptr;      // !noalias of its accesses
};

// State of the LLVM function being emitted (the kernel or an outlined parallel body).
struct Frame {
  llvm::Function* fn = nullptr;
  llvm::BasicBlock* entry = nullptr;
  std::vector<BufferRef> params;
  std::map<std::string, llvm::Value*> vars;     // loop variables and symbols (i64)
  std::map<std::string, BufferRef> scratch;     // Allocate buffers in scope
  bool in_parallel = false;
};

class Emitter {
 public:
  Emitter(llvm::Module& m, const TargetInfo& target)
      : m_(m), ctx_(m.getContext()), b_(ctx_), target_(target) {
    llvm::FastMathFlags fmf;
    fmf.setAllowContract(true);
    b_.setFastMathFlags(fmf);
  }

  Status emit_func(const tir::PrimFunc& f);

 private:
  // ---- types and constants ----
  llvm::Type* reg_type(DType t) {
    switch (t) {
      case DType::kBool: return b_.getInt1Ty();
      case DType::kInt8: case DType::kUInt8: case DType::kInt4: case DType::kUInt4: return b_.getInt8Ty();
      case DType::kInt16: case DType::kUInt16: return b_.getInt16Ty();
      case DType::kInt32: case DType::kUInt32: return b_.getInt32Ty();
      case DType::kInt64: case DType::kUInt64: return b_.getInt64Ty();
      case DType::kFloat32: return b_.getFloatTy();
      case DType::kFloat64: return b_.getDoubleTy();
      default: return dtype_is_narrow_float(t) ? b_.getFloatTy() : nullptr;
    }
  }
  llvm::Type* mem_type(DType t) {
    if (t == DType::kBool) return b_.getInt8Ty();
    if (t == DType::kFloat16) return b_.getHalfTy();
    if (t == DType::kBFloat16) return b_.getInt16Ty();
    if (dtype_is_narrow_float(t)) return b_.getInt8Ty();
    return reg_type(t);
  }
  llvm::Type* checked_reg_type(DType t, const char* what) {
    llvm::Type* ty = reg_type(t);
    if (!ty) {
      fail(std::string("dtype ") + dtype_name(t) + " is not compilable (" + what + ")");
      return b_.getInt64Ty();
    }
    return ty;
  }
  llvm::Value* fc(llvm::Type* t, double v) { return llvm::ConstantFP::get(t, v); }
  // `scalar`, or a vector of it with as many lanes as `like` has.
  static llvm::Type* same_lanes(llvm::Type* scalar, llvm::Type* like) {
    if (auto* vt = llvm::dyn_cast<llvm::VectorType>(like)) return llvm::VectorType::get(scalar, vt->getElementCount());
    return scalar;
  }
  llvm::Value* ic(llvm::Type* t, int64_t v) {
    return llvm::ConstantInt::get(t, static_cast<uint64_t>(v), true);
  }
  llvm::Value* i64(int64_t v) { return ic(b_.getInt64Ty(), v); }

  llvm::Value* fail(const std::string& msg) {
    if (error_.is_ok()) error_ = internal_error() << "codegen of " << func_->name << ": " << msg;
    return nullptr;
  }
  llvm::Value* poison(llvm::Type* t) { return llvm::PoisonValue::get(t); }

  // ---- expressions ----
  llvm::Value* emit(const Expr& e);
  llvm::Value* emit_as(const Expr& e, DType t) { return convert(emit(e), e.dtype(), t); }
  llvm::Value* convert(llvm::Value* v, DType from, DType to);
  // Narrow float types (f16, bf16, float8) are f32 in registers: decode after
  // a load, encode before a store, and round a value converted to them.
  llvm::Value* decode_narrow(llvm::Value* mem, DType t);
  llvm::Value* encode_narrow(llvm::Value* v, DType t);
  llvm::Value* round_narrow(llvm::Value* v, DType t, bool saturate);
  llvm::Value* call_helper(const char* name, llvm::Type* ret, std::vector<llvm::Value*> args);
  llvm::Value* emit_binary(ExprKind k, DType t, llvm::Value* a, llvm::Value* b, bool reduction);
  llvm::Value* emit_compare(ExprKind k, DType t, llvm::Value* a, llvm::Value* b);
  llvm::Value* emit_select(const Expr& e);
  // cond ? then_value() : else_value(), each emitted only on its branch.
  llvm::Value* branch_select(llvm::Value* cond, const std::function<llvm::Value*()>& then_value,
                             const std::function<llvm::Value*()>& else_value);
  llvm::Value* emit_logical(const Expr& e);
  llvm::Value* emit_load(const Expr& e);
  llvm::Value* emit_call(const Expr& e);
  BufferRef* find_buffer(const std::string& name, int index);
  llvm::Value* flat_offset(const tir::Buffer& buf, const std::vector<Expr>& indices);
  void set_alias_md(llvm::Instruction* inst, const BufferRef& ref);

  // ---- f32 math expansions ----
  llvm::Value* fmuladd(llvm::Value* a, llvm::Value* b, llvm::Value* c) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, b, c});
  }
  llvm::Value* horner(llvm::Value* x, std::initializer_list<double> coeffs_high_first);
  llvm::Value* unary(llvm::Intrinsic::ID id, llvm::Value* x) {
    return b_.CreateUnaryIntrinsic(id, x);
  }
  llvm::Value* isnan(llvm::Value* x) { return b_.CreateFCmpUNO(x, x); }
  llvm::Value* exp_f32(llvm::Value* x, bool nonpositive = false);
  llvm::Value* log_f32(llvm::Value* x);
  llvm::Value* tanh_f32(llvm::Value* x);
  llvm::Value* sigmoid_f32(llvm::Value* x);
  llvm::Value* erf_f32(llvm::Value* x);
  llvm::Value* pow_f32(llvm::Value* x, llvm::Value* y);
  llvm::Value* sincos_f32(llvm::Value* x, bool cosine);
  llvm::Value* atan_f32(llvm::Value* x);
  llvm::Value* asin_small_f32(llvm::Value* x);
  llvm::Value* asin_f32(llvm::Value* x);
  llvm::Value* acos_f32(llvm::Value* x);
  llvm::Value* log_abs_f32_as_f64(llvm::Value* ax);
  llvm::Value* exp_f64_to_f32(llvm::Value* t);
  llvm::Value* libm_call(const char* name, llvm::Value* x);
  llvm::Value* libm_call2(const char* name, llvm::Value* x, llvm::Value* y);

  // ---- explicit vectorization (a vectorized loop of constant extent W) ----
  // The loop `for v in 0..W vectorized { store }` becomes straight-line code
  // on <W x T> values: loads contiguous in v are vector loads, loads that do
  // not depend on v are scalars broadcast once, other loads are gathers;
  // stores likewise (scatter when strided). Returns false, emitting nothing,
  // where the body is not a single store of supported expressions (then the
  // loop carries LLVM's vectorize metadata instead).
  bool emit_widened(const tir::Stmt& loop);
  bool emit_transposed_store(const tir::Stmt& loop);
  bool widenable(const Expr& e) const;
  bool depends(const Expr& e) const;
  llvm::Value* emit_w(const Expr& e);
  llvm::Value* splat(llvm::Value* v) {
    return v->getType()->isVectorTy() ? v : b_.CreateVectorSplat(wlanes_, v);
  }
  // Flat element offset of buffer `buf` at `indices` as an Expr (row-major).
  Expr flat_index(const tir::Buffer& buf, const std::vector<Expr>& indices) const;
  // Pointer(s) for a widened access: {scalar base pointer, true} when the
  // offset is contiguous in the lane variable, else {vector of pointers, false}.
  std::pair<llvm::Value*, bool> widened_address(const BufferRef& ref, const std::vector<Expr>& indices);
  llvm::Value* strided_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type* vt);
  llvm::Value* permuted_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type* vt);
  llvm::Value* widened_load(const ExprNode& n, llvm::Type* vt);
  // Lanes a widened load may read (inside a select arm); null: all.
  llvm::Value* wmask_ = nullptr;
  std::vector<Expr> wfacts_;  // conjuncts of the select conditions true on the lanes of wmask_
  Expr merge_lane_terms(const Expr& e) const;
  llvm::Value* float_unary(const std::string& name, llvm::Value* a, bool f32);
  llvm::Value* clamped_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type* vt);
  llvm::Value* span_load(const BufferRef& ref, const Expr& base, unsigned stride, llvm::Value* lanes);

  // ---- statements ----
  void emit_stmt(const tir::Stmt& s);
  void emit_store(const tir::Stmt& s);
  void emit_prefetch(const tir::Stmt& s);
  void emit_for(const tir::Stmt& s);
  void emit_parallel_for(const tir::Stmt& s);
  void emit_loop(const std::string& var, llvm::Value* begin, llvm::Value* end,
                 llvm::MDNode* (Emitter::*md)(const tir::Stmt&), const tir::Stmt& loop);
  llvm::MDNode* loop_md(const tir::Stmt& loop);
  llvm::MDNode* no_loop_md(const tir::Stmt&) { return nullptr; }
  void emit_allocate(const tir::Stmt& s);
  void emit_if(const tir::Stmt& s);
  llvm::AllocaInst* entry_alloca(llvm::Type* t, llvm::Value* count, const char* name);
  void setup_function_attrs(llvm::Function* fn);
  llvm::Value* assume_aligned(llvm::Value* ptr);

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const TargetInfo& target_;
  Status error_;
  const tir::PrimFunc* func_ = nullptr;
  Frame* frame_ = nullptr;
  const ExprNode* reduction_root_ = nullptr;
  int parallel_count_ = 0;
  // The function's alias scope domain and every scope made in it so far
  // (parameters', then scratch buffers' as they are allocated).
  llvm::MDNode* alias_domain_ = nullptr;
  std::vector<llvm::Metadata*> alias_scopes_;
  std::string wvar_;      // lane variable of the loop being widened ("" outside)
  unsigned wlanes_ = 0;
};

// ============================== expressions ==============================

llvm::Value* Emitter::emit(const Expr& e) {
  llvm::Type* ty = checked_reg_type(e.dtype(), "expression");
  if (!error_.is_ok()) return poison(ty);
  const ExprNode& n = *e.get();
  switch (n.kind) {
    case ExprKind::kIntImm:
      if (dtype_is_float(n.dtype)) return fc(ty, static_cast<double>(n.int_value));
      if (n.dtype == DType::kBool) return b_.getInt1(n.int_value != 0);
      return ic(ty, n.int_value);
    case ExprKind::kFloatImm:
      if (!dtype_is_float(n.dtype)) {
        return n.dtype == DType::kBool ? b_.getInt1(n.float_value != 0.0)
                                       : ic(ty, static_cast<int64_t>(n.float_value));
      }
      return fc(ty, n.float_value);
    case ExprKind::kVar: {
      auto it = frame_->vars.find(n.name);
      if (it == frame_->vars.end()) {
        fail("unbound variable '" + n.name + "'");
        return poison(ty);
      }
      return convert(it->second, DType::kInt64, n.dtype);
    }
    case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kDiv:
    case ExprKind::kFloorDiv: case ExprKind::kMod: case ExprKind::kMin: case ExprKind::kMax: {
      if (n.args.size() < 2) {
        fail("arithmetic node with fewer than two operands: " + e.to_string());
        return poison(ty);
      }
      bool reduction = e.get() == reduction_root_;
      llvm::Value* acc = emit_as(n.args[0], n.dtype);
      for (size_t i = 1; i < n.args.size(); ++i)
        acc = emit_binary(n.kind, n.dtype, acc, emit_as(n.args[i], n.dtype), reduction);
      return acc;
    }
    case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE: {
      DType t = n.args[0].dtype();
      llvm::Value* a = emit_as(n.args[0], t);
      llvm::Value* c = emit_as(n.args[1], t);
      return emit_compare(n.kind, t, a, c);
    }
    case ExprKind::kAnd: case ExprKind::kOr:
      return emit_logical(e);
    case ExprKind::kNot:
      return b_.CreateNot(emit_as(n.args[0], DType::kBool));
    case ExprKind::kSelect:
      return emit_select(e);
    case ExprKind::kCast:
      return convert(emit(n.args[0]), n.args[0].dtype(), n.dtype);
    case ExprKind::kLoad:
      return emit_load(e);
    case ExprKind::kCall:
      return emit_call(e);
  }
  fail("unknown expression kind");
  return poison(ty);
}

llvm::Value* Emitter::convert(llvm::Value* v, DType from, DType to) {
  if (!error_.is_ok()) {
    llvm::Type* t = reg_type(to);
    return t ? poison(t) : v;
  }
  if (from == to) return v;
  llvm::Type* t = checked_reg_type(to, "cast");
  // Widened code (emit_widened) converts whole vectors; its dtypes are never narrow floats.
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(v->getType())) t = llvm::VectorType::get(t, vt->getElementCount());
  if (!reg_type(from)) {
    fail(std::string("cast from non-compilable dtype ") + dtype_name(from));
    return poison(t);
  }
  if (dtype_is_narrow_float(from)) from = DType::kFloat32;
  if (dtype_is_narrow_float(to)) {
    if (to == DType::kFloat16 && from == DType::kFloat64)  // one rounding, not two
      return b_.CreateFPExt(b_.CreateFPTrunc(v, b_.getHalfTy()), b_.getFloatTy());
    return round_narrow(convert(v, from, DType::kFloat32), to, true);
  }
  if (from == to) return v;
  bool ff = dtype_is_float(from), tf = dtype_is_float(to);
  if (to == DType::kBool) {
    if (ff) return b_.CreateFCmpUNE(v, fc(v->getType(), 0.0));
    return b_.CreateICmpNE(v, ic(v->getType(), 0));
  }
  if (from == DType::kBool) return tf ? b_.CreateUIToFP(v, t) : b_.CreateZExt(v, t);
  if (!ff && !tf) return b_.CreateIntCast(v, t, is_signed_int(from));
  if (!ff && tf) return is_signed_int(from) ? b_.CreateSIToFP(v, t) : b_.CreateUIToFP(v, t);
  if (ff && !tf) {
    // Saturating conversions: out-of-range values clamp and NaN becomes 0 instead of poison.
    auto id = is_signed_int(to) ? llvm::Intrinsic::fptosi_sat : llvm::Intrinsic::fptoui_sat;
    return b_.CreateIntrinsic(id, {t, v->getType()}, {v});
  }
  return b_.CreateFPCast(v, t);
}

llvm::Value* Emitter::call_helper(const char* name, llvm::Type* ret, std::vector<llvm::Value*> args) {
  std::vector<llvm::Type*> types;
  for (llvm::Value* a : args) types.push_back(a->getType());
  llvm::FunctionCallee fn = m_.getOrInsertFunction(name, llvm::FunctionType::get(ret, types, false));
  llvm::CallInst* c = b_.CreateCall(fn, args);
  c->setDoesNotAccessMemory();
  c->setDoesNotThrow();
  return c;
}

llvm::Value* Emitter::decode_narrow(llvm::Value* mem, DType t) {
  if (t == DType::kFloat16) return b_.CreateFPExt(mem, b_.getFloatTy());
  if (t == DType::kBFloat16)
    return b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(mem, b_.getInt32Ty()), 16), b_.getFloatTy());
  return call_helper("kiln_f8_to_f32", b_.getFloatTy(),
                     {b_.CreateZExt(mem, b_.getInt32Ty()), b_.getInt32(static_cast<int>(t))});
}

llvm::Value* Emitter::encode_narrow(llvm::Value* v, DType t) {
  if (t == DType::kFloat16) return b_.CreateFPTrunc(v, b_.getHalfTy());
  if (t == DType::kBFloat16) {
    // Round to nearest even on the low 16 bits; NaN stays a (quiet) NaN.
    llvm::Value* bits = b_.CreateBitCast(v, b_.getInt32Ty());
    llvm::Value* lsb = b_.CreateAnd(b_.CreateLShr(bits, 16), b_.getInt32(1));
    llvm::Value* rounded = b_.CreateAdd(b_.CreateAdd(bits, b_.getInt32(0x7FFF)), lsb);
    llvm::Value* quiet = b_.CreateOr(bits, b_.getInt32(0x400000));
    llvm::Value* r = b_.CreateSelect(isnan(v), quiet, rounded);
    return b_.CreateTrunc(b_.CreateLShr(r, 16), b_.getInt16Ty());
  }
  llvm::Value* r = call_helper("kiln_f32_to_f8", b_.getInt32Ty(), {v, b_.getInt32(static_cast<int>(t))});
  return b_.CreateTrunc(r, b_.getInt8Ty());
}

llvm::Value* Emitter::round_narrow(llvm::Value* v, DType t, bool saturate) {
  if (t == DType::kFloat16 || t == DType::kBFloat16) return decode_narrow(encode_narrow(v, t), t);
  return call_helper("kiln_round_f8", b_.getFloatTy(),
                     {v, b_.getInt32(static_cast<int>(t)), b_.getInt32(saturate ? 1 : 0)});
}

llvm::Value* Emitter::emit_binary(ExprKind k, DType t, llvm::Value* a, llvm::Value* c,
                                  bool reduction) {
  if (dtype_is_float(t)) {
    llvm::IRBuilderBase::FastMathFlagGuard guard(b_);
    if (reduction) {
      llvm::FastMathFlags fmf;
      fmf.setAllowContract(true);
      fmf.setAllowReassoc(true);
      b_.setFastMathFlags(fmf);
    }
    switch (k) {
      case ExprKind::kAdd: return b_.CreateFAdd(a, c);
      case ExprKind::kSub: return b_.CreateFSub(a, c);
      case ExprKind::kMul: return b_.CreateFMul(a, c);
      case ExprKind::kDiv: return b_.CreateFDiv(a, c);
      case ExprKind::kFloorDiv: return unary(llvm::Intrinsic::floor, b_.CreateFDiv(a, c));
      case ExprKind::kMod: return b_.CreateFRem(a, c);
      case ExprKind::kMin: case ExprKind::kMax: {
        if (!reduction)  // NaN-propagating, +0 above -0, like ONNX Min and Max
          return k == ExprKind::kMin ? b_.CreateMinimum(a, c) : b_.CreateMaximum(a, c);
        // A reduction step (max pooling, ReduceMax, softmax's row max): still
        // NaN-propagating from either operand, but a tie of -0 and +0 may keep
        // either, which the reassociation a reduction already allows. While
        // the accumulator a is a number: a > c ? a : c, which is c when c is
        // NaN (x86's maxps/minps); once a is NaN it stays. x86 matches it to
        // an ordered-compare of a into a mask and one masked vmaxps/vminps:
        // two operations per step. llvm.maximum lowers to six; the previous
        // form here (max, and a blend on c's NaN test) to three, and 3x3 max
        // pools were throughput-bound on them.
        llvm::Value* keep = k == ExprKind::kMin ? b_.CreateFCmpOLT(a, c) : b_.CreateFCmpOGT(a, c);
        return b_.CreateSelect(b_.CreateFCmpORD(a, a), b_.CreateSelect(keep, a, c), a);
      }
      default: break;
    }
    fail("bad float binary op");
    return poison(a->getType());
  }
  bool s = is_signed_int(t);
  // Index arithmetic is i64 and never wraps; narrower and unsigned ints wrap like C.
  bool nsw = t == DType::kInt64;
  llvm::Type* ty = a->getType();
  // Integer division never traps: a zero divisor gives 0 (quotient and
  // remainder), and the signed MIN / -1 wraps to MIN with remainder 0. Unless
  // the divisor is a constant that cannot trap, the division runs on a
  // divisor of 1 in those cases and a zero divisor's result is selected.
  llvm::Value* zero_divisor = nullptr;
  if (k == ExprKind::kDiv || k == ExprKind::kFloorDiv || k == ExprKind::kMod) {
    bool safe = false;
    if (auto* kc = llvm::dyn_cast<llvm::Constant>(c)) {
      llvm::Constant* splat = kc->getType()->isVectorTy() ? kc->getSplatValue() : kc;
      auto* ci = llvm::dyn_cast_or_null<llvm::ConstantInt>(splat);
      safe = ci && !ci->isZero() && !(s && ci->isMinusOne());
    }
    if (!safe) {
      zero_divisor = b_.CreateICmpEQ(c, ic(ty, 0));
      llvm::Value* trap = zero_divisor;
      if (s) {
        unsigned bits = ty->getScalarSizeInBits();
        llvm::Value* min = llvm::ConstantInt::get(ty, llvm::APInt::getSignedMinValue(bits));
        trap = b_.CreateOr(trap, b_.CreateAnd(b_.CreateICmpEQ(a, min), b_.CreateICmpEQ(c, ic(ty, -1))));
      }
      c = b_.CreateSelect(trap, ic(ty, 1), c);
    }
  }
  auto defined = [&](llvm::Value* v) { return zero_divisor ? b_.CreateSelect(zero_divisor, ic(ty, 0), v) : v; };
  switch (k) {
    case ExprKind::kAdd: return b_.CreateAdd(a, c, "", false, nsw);
    case ExprKind::kSub: return b_.CreateSub(a, c, "", false, nsw);
    case ExprKind::kMul: return b_.CreateMul(a, c, "", false, nsw);
    case ExprKind::kDiv: return defined(s ? b_.CreateSDiv(a, c) : b_.CreateUDiv(a, c));
    case ExprKind::kFloorDiv: {
      if (!s) return defined(b_.CreateUDiv(a, c));
      llvm::Value* q = b_.CreateSDiv(a, c);
      llvm::Value* r = b_.CreateSRem(a, c);
      llvm::Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, ic(ty, 0)),
                                         b_.CreateICmpSLT(b_.CreateXor(r, c), ic(ty, 0)));
      return defined(b_.CreateSub(q, b_.CreateZExt(adjust, ty)));
    }
    case ExprKind::kMod: {
      if (!s) return defined(b_.CreateURem(a, c));
      llvm::Value* r = b_.CreateSRem(a, c);
      llvm::Value* adjust = b_.CreateAnd(b_.CreateICmpNE(r, ic(ty, 0)),
                                         b_.CreateICmpSLT(b_.CreateXor(r, c), ic(ty, 0)));
      return defined(b_.CreateAdd(r, b_.CreateSelect(adjust, c, ic(ty, 0))));
    }
    case ExprKind::kMin:
      return b_.CreateBinaryIntrinsic(s ? llvm::Intrinsic::smin : llvm::Intrinsic::umin, a, c);
    case ExprKind::kMax:
      return b_.CreateBinaryIntrinsic(s ? llvm::Intrinsic::smax : llvm::Intrinsic::umax, a, c);
    default: break;
  }
  fail("bad integer binary op");
  return poison(ty);
}

llvm::Value* Emitter::emit_compare(ExprKind k, DType t, llvm::Value* a, llvm::Value* c) {
  if (dtype_is_float(t)) {
    switch (k) {
      case ExprKind::kLT: return b_.CreateFCmpOLT(a, c);
      case ExprKind::kLE: return b_.CreateFCmpOLE(a, c);
      case ExprKind::kEQ: return b_.CreateFCmpOEQ(a, c);
      default: return b_.CreateFCmpUNE(a, c);  // the negation of ==: NaN != x
    }
  }
  bool s = is_signed_int(t);
  switch (k) {
    case ExprKind::kLT: return s ? b_.CreateICmpSLT(a, c) : b_.CreateICmpULT(a, c);
    case ExprKind::kLE: return s ? b_.CreateICmpSLE(a, c) : b_.CreateICmpULE(a, c);
    case ExprKind::kEQ: return b_.CreateICmpEQ(a, c);
    default: return b_.CreateICmpNE(a, c);
  }
}

llvm::Value* Emitter::emit_logical(const Expr& e) {
  bool is_and = e.kind() == ExprKind::kAnd;
  llvm::Value* lhs = emit_as(e->args[0], DType::kBool);
  if (!may_trap(e->args[1])) {
    llvm::Value* rhs = emit_as(e->args[1], DType::kBool);
    return is_and ? b_.CreateAnd(lhs, rhs) : b_.CreateOr(lhs, rhs);
  }
  // Short-circuit: the right operand may only be valid when the left one allows it.
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::BasicBlock* rhs_bb = llvm::BasicBlock::Create(ctx_, "sc.rhs", frame_->fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "sc.done", frame_->fn);
  if (is_and) b_.CreateCondBr(lhs, rhs_bb, done);
  else b_.CreateCondBr(lhs, done, rhs_bb);
  b_.SetInsertPoint(rhs_bb);
  llvm::Value* rhs = emit_as(e->args[1], DType::kBool);
  llvm::BasicBlock* rhs_end = b_.GetInsertBlock();
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
  llvm::PHINode* phi = b_.CreatePHI(b_.getInt1Ty(), 2);
  phi->addIncoming(b_.getInt1(!is_and), from);
  phi->addIncoming(rhs, rhs_end);
  return phi;
}

llvm::Value* Emitter::emit_select(const Expr& e) {
  llvm::Value* cond = emit_as(e->args[0], DType::kBool);
  DType t = e.dtype();
  if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(cond)) return emit_as(e->args[k->isOne() ? 1 : 2], t);
  if (!may_trap(e->args[1]) && !may_trap(e->args[2]))
    return b_.CreateSelect(cond, emit_as(e->args[1], t), emit_as(e->args[2], t));
  // An arm with a load is only evaluated when chosen (it may be out of bounds otherwise).
  return branch_select(cond, [&] { return emit_as(e->args[1], t); }, [&] { return emit_as(e->args[2], t); });
}

llvm::Value* Emitter::branch_select(llvm::Value* cond, const std::function<llvm::Value*()>& then_value,
                                    const std::function<llvm::Value*()>& else_value) {
  llvm::BasicBlock* then_bb = llvm::BasicBlock::Create(ctx_, "sel.then", frame_->fn);
  llvm::BasicBlock* else_bb = llvm::BasicBlock::Create(ctx_, "sel.else", frame_->fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "sel.done", frame_->fn);
  b_.CreateCondBr(cond, then_bb, else_bb);
  b_.SetInsertPoint(then_bb);
  llvm::Value* tv = then_value();
  llvm::BasicBlock* then_end = b_.GetInsertBlock();
  b_.CreateBr(done);
  b_.SetInsertPoint(else_bb);
  llvm::Value* ev = else_value();
  llvm::BasicBlock* else_end = b_.GetInsertBlock();
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
  llvm::PHINode* phi = b_.CreatePHI(tv->getType(), 2);
  phi->addIncoming(tv, then_end);
  phi->addIncoming(ev, else_end);
  return phi;
}

BufferRef* Emitter::find_buffer(const std::string& name, int index) {
  if (index >= 0) {
    if (index >= static_cast<int>(frame_->params.size())) {
      fail("buffer index " + std::to_string(index) + " of '" + name + "' out of range");
      return nullptr;
    }
    return &frame_->params[index];
  }
  auto it = frame_->scratch.find(name);
  if (it == frame_->scratch.end()) {
    fail("buffer '" + name + "' is neither a parameter nor allocated in scope");
    return nullptr;
  }
  return &it->second;
}

llvm::Value* Emitter::flat_offset(const tir::Buffer& buf, const std::vector<Expr>& indices) {
  if (indices.empty()) return i64(0);
  if (indices.size() != buf.shape.size() && indices.size() != 1) {
    fail("buffer '" + buf.name + "' has rank " + std::to_string(buf.shape.size()) +
         " but is indexed with " + std::to_string(indices.size()) + " indices");
    return i64(0);
  }
  llvm::Value* off = emit_as(indices[0], DType::kInt64);
  for (size_t d = 1; d < indices.size(); ++d) {
    llvm::Value* extent = emit_as(buf.shape[d], DType::kInt64);
    off = b_.CreateMul(off, extent, "", false, true);
    off = b_.CreateAdd(off, emit_as(indices[d], DType::kInt64), "", false, true);
  }
  return off;
}

void Emitter::set_alias_md(llvm::Instruction* inst, const BufferRef& ref) {
  if (ref.alias_scope) inst->setMetadata(llvm::LLVMContext::MD_alias_scope, ref.alias_scope);
  if (ref.noalias) inst->setMetadata(llvm::LLVMContext::MD_noalias, ref.noalias);
}

llvm::Value* Emitter::emit_load(const Expr& e) {
  llvm::Type* ty = checked_reg_type(e.dtype(), "load");
  BufferRef* ref = find_buffer(e->name, static_cast<int>(e->int_value));
  if (!ref) return poison(ty);
  DType bt = ref->buffer->dtype;
  llvm::Type* mt = mem_type(bt);
  if (!mt) {
    fail("buffer '" + ref->buffer->name + "' has non-compilable dtype");
    return poison(ty);
  }
  llvm::Value* off = flat_offset(*ref->buffer, e->args);
  llvm::Value* ptr = b_.CreateInBoundsGEP(mt, ref->ptr, off);
  llvm::LoadInst* ld = b_.CreateAlignedLoad(mt, ptr, llvm::Align(dtype_size(bt)));
  set_alias_md(ld, *ref);
  llvm::Value* v = ld;
  if (bt == DType::kBool) v = b_.CreateICmpNE(v, b_.getInt8(0));
  if (dtype_is_narrow_float(bt)) v = decode_narrow(v, bt);
  return convert(v, bt, e.dtype());
}

// ---- math ----

llvm::Value* Emitter::horner(llvm::Value* x, std::initializer_list<double> coeffs) {
  llvm::Type* t = x->getType();
  auto it = coeffs.begin();
  llvm::Value* p = fc(t, *it++);
  for (; it != coeffs.end(); ++it) p = fmuladd(p, x, fc(t, *it));
  return p;
}

// exp(x), f32: n = round(x / ln2), r = x - n ln2 (two-part ln2), exp(r) by the
// Cephes minimax polynomial, times 2^n built in two halves. Max error about
// 1 ulp over normal results. Results below FLT_MIN (x < -126 ln2) are 0, as in
// MLAS: an arithmetic result in the subnormal range costs a microcode assist
// of about 150 cycles per operation on Intel cores, so a masked softmax row
// (scores of -3.4e38) ran 20x slower than an unmasked one. The input is
// clamped at -126 ln2 rounded toward zero, where r >= 0 and 2^n is normal, so
// no lane computes a subnormal, and those lanes are then selected to 0.
//
// The clamps are compares and selects that x86 matches to one vmaxps/vminps
// each (minnum/maxnum's NaN rule costs a compare and a blend more); a NaN
// input is clamped like any other and restored at the end. With
// `nonpositive` (the caller knows x <= 0 or NaN: sigmoid's exp(-|x|)), no
// upper clamp, and 2^n is one normal power (n >= -126) instead of two halves.
llvm::Value* Emitter::exp_f32(llvm::Value* x, bool nonpositive) {
  llvm::Type* f = x->getType();
  llvm::Type* i32 = same_lanes(b_.getInt32Ty(), x->getType());
  llvm::Value* lowest = fc(f, -87.33654f);  // float(-126 ln2) rounded toward zero
  llvm::Value* xc = b_.CreateSelect(b_.CreateFCmpOGT(x, lowest), x, lowest);
  if (!nonpositive) xc = b_.CreateSelect(b_.CreateFCmpOLT(xc, fc(f, 89.0)), xc, fc(f, 89.0));
  llvm::Value* n = unary(llvm::Intrinsic::roundeven, b_.CreateFMul(xc, fc(f, 1.44269504088896341)));
  llvm::Value* r = fmuladd(n, fc(f, -0.693359375), xc);
  r = fmuladd(n, fc(f, 2.12194440e-4), r);
  llvm::Value* z = b_.CreateFMul(r, r);
  llvm::Value* p = horner(r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2,
                              1.6666665459E-1, 5.0000001201E-1});
  llvm::Value* y = b_.CreateFAdd(fmuladd(p, z, r), fc(f, 1.0));
  llvm::Value* ni = b_.CreateFPToSI(n, i32);
  llvm::Value* h = b_.CreateAShr(ni, 1);
  auto pow2 = [&](llvm::Value* k) {
    return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(k, ic(i32, 127)), 23), f);
  };
  llvm::Value* res = nonpositive ? b_.CreateFMul(y, pow2(ni))
                                 : b_.CreateFMul(b_.CreateFMul(y, pow2(h)), pow2(b_.CreateSub(ni, h)));
  res = b_.CreateSelect(b_.CreateFCmpOLT(x, lowest), fc(f, 0.0), res);
  return b_.CreateSelect(isnan(x), x, res);
}

// log(x), f32: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by the Cephes
// polynomial in (m - 1), plus e ln2 in two parts. Subnormals are pre-scaled.
llvm::Value* Emitter::log_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Type* i32 = same_lanes(b_.getInt32Ty(), x->getType());
  llvm::Value* sub = b_.CreateFCmpOLT(x, fc(f, 1.17549435e-38));
  llvm::Value* xs = b_.CreateSelect(sub, b_.CreateFMul(x, fc(f, 8388608.0)), x);
  llvm::Value* bits = b_.CreateBitCast(xs, i32);
  llvm::Value* e = b_.CreateSub(b_.CreateAnd(b_.CreateLShr(bits, 23), ic(i32, 0xff)), ic(i32, 126));
  e = b_.CreateSub(e, b_.CreateSelect(sub, ic(i32, 23), ic(i32, 0)));
  llvm::Value* m = b_.CreateBitCast(
      b_.CreateOr(b_.CreateAnd(bits, ic(i32, 0x807fffff)), ic(i32, 0x3f000000)), f);  // [0.5, 1)
  llvm::Value* small = b_.CreateFCmpOLT(m, fc(f, 0.707106781186547524));
  e = b_.CreateSub(e, b_.CreateZExt(small, i32));
  llvm::Value* t = b_.CreateFSub(b_.CreateSelect(small, b_.CreateFAdd(m, m), m), fc(f, 1.0));
  llvm::Value* z = b_.CreateFMul(t, t);
  llvm::Value* p = horner(t, {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1,
                              -1.2420140846E-1, 1.4249322787E-1, -1.6668057665E-1,
                              2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1});
  llvm::Value* y = b_.CreateFMul(b_.CreateFMul(p, t), z);
  llvm::Value* fe = b_.CreateSIToFP(e, f);
  y = fmuladd(fe, fc(f, -2.12194440e-4), y);
  y = fmuladd(z, fc(f, -0.5), y);
  llvm::Value* res = b_.CreateFAdd(t, y);
  res = fmuladd(fe, fc(f, 0.693359375), res);
  llvm::Value* inf = fc(f, INFINITY);
  res = b_.CreateSelect(b_.CreateFCmpOEQ(x, inf), inf, res);
  res = b_.CreateSelect(b_.CreateFCmpOEQ(x, fc(f, 0.0)), fc(f, -INFINITY), res);
  llvm::Value* bad = b_.CreateFCmpULT(x, fc(f, 0.0));  // negative or NaN
  return b_.CreateSelect(bad, fc(f, NAN), res);
}

// tanh(x), f32: odd polynomial for |x| < 0.625 (Cephes), else
// sign(x) (1 - 2 / (exp(2|x|) + 1)).
llvm::Value* Emitter::tanh_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* ax = unary(llvm::Intrinsic::fabs, x);
  llvm::Value* z = b_.CreateFMul(x, x);
  llvm::Value* p = horner(z, {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                              1.33314422036E-1, -3.33332819422E-1});
  llvm::Value* small = fmuladd(b_.CreateFMul(p, z), x, x);
  llvm::Value* e = exp_f32(b_.CreateFAdd(ax, ax));
  llvm::Value* big = b_.CreateFSub(fc(f, 1.0), b_.CreateFDiv(fc(f, 2.0), b_.CreateFAdd(e, fc(f, 1.0))));
  big = b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, big, x);
  return b_.CreateSelect(b_.CreateFCmpOGE(ax, fc(f, 0.625)), big, small);
}

// sigmoid(x) = 1 / (1 + exp(-x)), computed from e = exp(-|x|) so that large
// negative inputs give e * (1 / (1 + e)) without overflow.
llvm::Value* Emitter::sigmoid_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* e = exp_f32(b_.CreateFNeg(unary(llvm::Intrinsic::fabs, x)), /*nonpositive=*/true);
  llvm::Value* d = b_.CreateFAdd(fc(f, 1.0), e);
  llvm::Value* pos = b_.CreateFDiv(fc(f, 1.0), d);
  llvm::Value* neg = b_.CreateFMul(e, pos);  // e / (1 + e) with one division for both signs
  return b_.CreateSelect(b_.CreateFCmpOLT(x, fc(f, 0.0)), neg, pos);
}

// erf(x), f32: x P(x^2) / Q(x^2) on x clamped to [-4, 4] (the rational
// approximation used by Eigen and XLA); max absolute error about 5e-7.
llvm::Value* Emitter::erf_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* xc = b_.CreateMinNum(b_.CreateMaxNum(x, fc(f, -4.0)), fc(f, 4.0));
  llvm::Value* x2 = b_.CreateFMul(xc, xc);
  llvm::Value* p = horner(x2, {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                               -5.69250639462346e-05, -7.34990630326855e-04,
                               -2.95459980854025e-03, -1.60960333262415e-02});
  llvm::Value* q = horner(x2, {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                               -7.37332916720468e-03, -1.42647390514189e-02});
  // x (p / q), not (x p) / q: x p would underflow for tiny x.
  llvm::Value* res = b_.CreateFMul(xc, b_.CreateFDiv(p, q));
  return b_.CreateSelect(isnan(x), x, res);
}

// log(ax) in double for a non-negative f32 ax: m in [1, sqrt 2) ... via
// 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, series to s^17 (error < 1e-16).
llvm::Value* Emitter::log_abs_f32_as_f64(llvm::Value* ax) {
  llvm::Type* f = ax->getType();
  llvm::Type* d = b_.getDoubleTy();
  llvm::Type* i32 = b_.getInt32Ty();
  llvm::Value* sub = b_.CreateFCmpOLT(ax, fc(f, 1.17549435e-38));
  llvm::Value* xs = b_.CreateSelect(sub, b_.CreateFMul(ax, fc(f, 8388608.0)), ax);
  llvm::Value* bits = b_.CreateBitCast(xs, i32);
  llvm::Value* e = b_.CreateSub(b_.CreateAnd(b_.CreateLShr(bits, 23), ic(i32, 0xff)), ic(i32, 127));
  e = b_.CreateSub(e, b_.CreateSelect(sub, ic(i32, 23), ic(i32, 0)));
  llvm::Value* m = b_.CreateBitCast(
      b_.CreateOr(b_.CreateAnd(bits, ic(i32, 0x007fffff)), ic(i32, 0x3f800000)), f);  // [1, 2)
  llvm::Value* big = b_.CreateFCmpOGT(m, fc(f, 1.41421356));
  m = b_.CreateSelect(big, b_.CreateFMul(m, fc(f, 0.5)), m);
  e = b_.CreateAdd(e, b_.CreateZExt(big, i32));
  llvm::Value* md = b_.CreateFPExt(m, d);
  llvm::Value* s = b_.CreateFDiv(b_.CreateFSub(md, fc(d, 1.0)), b_.CreateFAdd(md, fc(d, 1.0)));
  llvm::Value* s2 = b_.CreateFMul(s, s);
  llvm::Value* p = horner(s2, {1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5,
                               1.0 / 3, 1.0});
  llvm::Value* logm = b_.CreateFMul(b_.CreateFMul(s, p), fc(d, 2.0));
  llvm::Value* res = fmuladd(b_.CreateSIToFP(e, d), fc(d, 0.693147180559945309417), logm);
  res = b_.CreateSelect(b_.CreateFCmpOEQ(ax, fc(f, 0.0)), fc(d, -INFINITY), res);
  res = b_.CreateSelect(b_.CreateFCmpOEQ(ax, fc(f, INFINITY)), fc(d, INFINITY), res);
  return b_.CreateSelect(isnan(ax), fc(d, NAN), res);
}

// exp(t) for a double t, rounded to f32: Taylor series to degree 12 after
// reduction by ln2 (|r| < 0.35, error < 1e-14 before the final rounding).
llvm::Value* Emitter::exp_f64_to_f32(llvm::Value* t) {
  llvm::Type* d = t->getType();
  llvm::Type* i64t = b_.getInt64Ty();
  llvm::Value* tc = b_.CreateMinNum(b_.CreateMaxNum(t, fc(d, -200.0)), fc(d, 200.0));
  llvm::Value* n = unary(llvm::Intrinsic::roundeven, b_.CreateFMul(tc, fc(d, 1.44269504088896340736)));
  llvm::Value* r = fmuladd(n, fc(d, -6.93147180369123816490e-01), tc);
  r = fmuladd(n, fc(d, -1.90821492927058770002e-10), r);
  llvm::Value* p = horner(r, {1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880,
                              1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6,
                              0.5, 1.0, 1.0});
  llvm::Value* ni = b_.CreateFPToSI(n, i64t);
  llvm::Value* scale = b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(ni, ic(i64t, 1023)), 52), d);
  llvm::Value* res = b_.CreateFPTrunc(b_.CreateFMul(p, scale), b_.getFloatTy());
  return b_.CreateSelect(isnan(t), fc(b_.getFloatTy(), NAN), res);
}

// pow(x, y), f32, with C pow's special cases: exp(y log|x|) in double, the
// sign from odd integer y, NaN for negative finite x and non-integer y.
llvm::Value* Emitter::pow_f32(llvm::Value* x, llvm::Value* y) {
  llvm::Type* f = x->getType();
  llvm::Value* ax = unary(llvm::Intrinsic::fabs, x);
  llvm::Value* t = b_.CreateFMul(b_.CreateFPExt(y, b_.getDoubleTy()), log_abs_f32_as_f64(ax));
  llvm::Value* r = exp_f64_to_f32(t);
  llvm::Value* y_int = b_.CreateFCmpOEQ(unary(llvm::Intrinsic::floor, y), y);
  llvm::Value* half = b_.CreateFMul(y, fc(f, 0.5));
  llvm::Value* y_odd = b_.CreateAnd(y_int, b_.CreateFCmpUNE(unary(llvm::Intrinsic::floor, half), half));
  llvm::Value* x_neg = b_.CreateICmpSLT(b_.CreateBitCast(x, b_.getInt32Ty()), b_.getInt32(0));
  r = b_.CreateSelect(b_.CreateAnd(x_neg, y_odd), b_.CreateFNeg(r), r);
  llvm::Value* nan_case = b_.CreateAnd(
      b_.CreateAnd(b_.CreateFCmpOLT(x, fc(f, 0.0)), b_.CreateFCmpONE(x, fc(f, -INFINITY))),
      b_.CreateNot(y_int));
  r = b_.CreateSelect(nan_case, fc(f, NAN), r);
  llvm::Value* one_case = b_.CreateOr(
      b_.CreateAnd(b_.CreateFCmpOEQ(ax, fc(f, 1.0)),
                   b_.CreateFCmpOEQ(unary(llvm::Intrinsic::fabs, y), fc(f, INFINITY))),
      b_.CreateOr(b_.CreateFCmpOEQ(y, fc(f, 0.0)), b_.CreateFCmpOEQ(x, fc(f, 1.0))));
  return b_.CreateSelect(one_case, fc(f, 1.0), r);
}

// sin(x) / cos(x), f32: reduction by pi/2 in double with a three-part pi/2
// (accurate for |x| up to about 1e6; larger inputs lose accuracy), Cephes
// polynomials on [-pi/4, pi/4], quadrant selection.
llvm::Value* Emitter::sincos_f32(llvm::Value* x, bool cosine) {
  llvm::Type* f = x->getType();
  llvm::Type* d = b_.getDoubleTy();
  llvm::Type* i32 = b_.getInt32Ty();
  llvm::Value* finite = b_.CreateFCmpOLT(unary(llvm::Intrinsic::fabs, x), fc(f, INFINITY));
  llvm::Value* xd = b_.CreateFPExt(b_.CreateSelect(finite, x, fc(f, 0.0)), d);
  llvm::Value* n = unary(llvm::Intrinsic::roundeven, b_.CreateFMul(xd, fc(d, 6.36619772367581382433e-01)));
  llvm::Value* r = fmuladd(n, fc(d, -1.57079632673412561417e+00), xd);
  r = fmuladd(n, fc(d, -6.07710050630396597660e-11), r);
  r = fmuladd(n, fc(d, -2.02226624879595063154e-21), r);
  llvm::Value* n4 = b_.CreateFSub(n, b_.CreateFMul(unary(llvm::Intrinsic::floor,
                                                         b_.CreateFMul(n, fc(d, 0.25))),
                                                   fc(d, 4.0)));
  llvm::Value* q = b_.CreateFPToSI(n4, i32);
  if (cosine) q = b_.CreateAdd(q, ic(i32, 1));
  llvm::Value* rf = b_.CreateFPTrunc(r, f);
  llvm::Value* z = b_.CreateFMul(rf, rf);
  llvm::Value* ps = horner(z, {-1.9515295891E-4, 8.3321608736E-3, -1.6666654611E-1});
  llvm::Value* sin_r = fmuladd(b_.CreateFMul(ps, z), rf, rf);
  llvm::Value* pc = horner(z, {2.443315711809948E-005, -1.388731625493765E-003,
                               4.166664568298827E-002});
  llvm::Value* cos_r = b_.CreateFAdd(fmuladd(z, fc(f, -0.5), b_.CreateFMul(b_.CreateFMul(pc, z), z)),
                                     fc(f, 1.0));
  llvm::Value* odd = b_.CreateICmpNE(b_.CreateAnd(q, ic(i32, 1)), ic(i32, 0));
  llvm::Value* neg = b_.CreateICmpNE(b_.CreateAnd(q, ic(i32, 2)), ic(i32, 0));
  llvm::Value* res = b_.CreateSelect(odd, cos_r, sin_r);
  res = b_.CreateSelect(neg, b_.CreateFNeg(res), res);
  return b_.CreateSelect(finite, res, fc(f, NAN));
}

// atan(x), f32 (Cephes atanf): reduction to |x| <= tan(pi/8) with
// atan(x) = pi/2 - atan(1/x) and pi/4 + atan((x-1)/(x+1)), odd polynomial.
llvm::Value* Emitter::atan_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* ax = unary(llvm::Intrinsic::fabs, x);
  llvm::Value* big = b_.CreateFCmpOGT(ax, fc(f, 2.414213562373095));
  llvm::Value* mid = b_.CreateFCmpOGT(ax, fc(f, 0.4142135623730950));
  llvm::Value* xr = b_.CreateSelect(
      big, b_.CreateFDiv(fc(f, -1.0), ax),
      b_.CreateSelect(mid, b_.CreateFDiv(b_.CreateFSub(ax, fc(f, 1.0)), b_.CreateFAdd(ax, fc(f, 1.0))), ax));
  llvm::Value* y0 = b_.CreateSelect(big, fc(f, M_PI_2), b_.CreateSelect(mid, fc(f, M_PI_4), fc(f, 0.0)));
  llvm::Value* z = b_.CreateFMul(xr, xr);
  llvm::Value* p = horner(z, {8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1});
  llvm::Value* r = b_.CreateFAdd(y0, fmuladd(b_.CreateFMul(p, z), xr, xr));
  return b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, r, x);
}

// asin(x) for |x| <= 0.5, f32 (Cephes asinf polynomial).
llvm::Value* Emitter::asin_small_f32(llvm::Value* x) {
  llvm::Value* z = b_.CreateFMul(x, x);
  llvm::Value* p = horner(z, {4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2,
                              1.6666752422e-1});
  return fmuladd(b_.CreateFMul(p, z), x, x);
}

// asin(x), f32: for |x| > 0.5, asin(x) = pi/2 - 2 asin(sqrt((1 - |x|) / 2)).
// NaN outside [-1, 1] (sqrt of a negative number).
llvm::Value* Emitter::asin_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* ax = unary(llvm::Intrinsic::fabs, x);
  llvm::Value* big = b_.CreateFCmpOGT(ax, fc(f, 0.5));
  llvm::Value* arg = b_.CreateSelect(
      big, unary(llvm::Intrinsic::sqrt, b_.CreateFMul(fc(f, 0.5), b_.CreateFSub(fc(f, 1.0), ax))), ax);
  llvm::Value* s = asin_small_f32(arg);
  llvm::Value* r = b_.CreateSelect(big, fmuladd(s, fc(f, -2.0), fc(f, M_PI_2)), s);
  return b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, r, x);
}

// acos(x), f32 (Cephes acosf): 2 asin(sqrt((1 - x) / 2)) near 1,
// pi - 2 asin(sqrt((1 + x) / 2)) near -1, pi/2 - asin(x) in between.
llvm::Value* Emitter::acos_f32(llvm::Value* x) {
  llvm::Type* f = x->getType();
  llvm::Value* lo = b_.CreateFCmpOLT(x, fc(f, -0.5));
  llvm::Value* hi = b_.CreateFCmpOGT(x, fc(f, 0.5));
  llvm::Value* one_minus = b_.CreateFMul(fc(f, 0.5), b_.CreateFSub(fc(f, 1.0), x));
  llvm::Value* one_plus = b_.CreateFMul(fc(f, 0.5), b_.CreateFAdd(fc(f, 1.0), x));
  llvm::Value* arg = b_.CreateSelect(lo, unary(llvm::Intrinsic::sqrt, one_plus),
                                     b_.CreateSelect(hi, unary(llvm::Intrinsic::sqrt, one_minus), x));
  llvm::Value* s = asin_small_f32(arg);
  llvm::Value* two_s = b_.CreateFMul(s, fc(f, 2.0));
  return b_.CreateSelect(lo, b_.CreateFSub(fc(f, M_PI), two_s),
                         b_.CreateSelect(hi, two_s, b_.CreateFSub(fc(f, M_PI_2), s)));
}

llvm::Value* Emitter::libm_call(const char* name, llvm::Value* x) {
  llvm::Type* t = x->getType();
  llvm::FunctionCallee fn = m_.getOrInsertFunction(name, llvm::FunctionType::get(t, {t}, false));
  return b_.CreateCall(fn, {x});
}

llvm::Value* Emitter::libm_call2(const char* name, llvm::Value* x, llvm::Value* y) {
  llvm::Type* t = x->getType();
  llvm::FunctionCallee fn = m_.getOrInsertFunction(name, llvm::FunctionType::get(t, {t, t}, false));
  return b_.CreateCall(fn, {x, y});
}

llvm::Value* Emitter::emit_call(const Expr& e) {
  const std::string& name = e->name;
  DType t = e.dtype();
  llvm::Type* ty = checked_reg_type(t, "call");
  if (!error_.is_ok()) return poison(ty);
  size_t want = (name == "pow" || name == "bitand" || name == "bitor" || name == "bitxor" ||
                 name == "shl" || name == "shr") ? 2 : 1;
  if (e->args.size() != want) {
    fail("intrinsic " + name + " takes " + std::to_string(want) + " argument(s): " + e.to_string());
    return poison(ty);
  }
  bool is_float = dtype_is_float(t);
  if (name == "isnan" || name == "isinf") {
    DType at = e->args[0].dtype();
    llvm::Value* a = emit(e->args[0]);
    llvm::Value* r = b_.getFalse();
    if (dtype_is_float(at)) {
      r = name == "isnan" ? isnan(a)
                          : b_.CreateFCmpOEQ(unary(llvm::Intrinsic::fabs, a), fc(a->getType(), INFINITY));
    }
    return convert(r, DType::kBool, t);
  }
  if (name == "cast_nosat") {
    if (!dtype_is_narrow_float(t) || !dtype_is_float(e->args[0].dtype())) {
      fail("cast_nosat needs a float operand and a narrow float result: " + e.to_string());
      return poison(ty);
    }
    return round_narrow(emit_as(e->args[0], DType::kFloat32), t, false);
  }
  llvm::Value* a = emit_as(e->args[0], t);
  bool f32 = t == DType::kFloat32 || dtype_is_narrow_float(t);
  if (is_float && want == 1)
    if (llvm::Value* r = float_unary(name, a, f32)) return r;
  if (name == "neg") return b_.CreateNeg(a);
  if (name == "abs") {
    if (!is_signed_int(t)) return a;
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, a, b_.getFalse());
  }
  if (name == "floor" || name == "ceil" || name == "round") return a;  // integers
  if (name == "bitand" || name == "bitor" || name == "bitxor" || name == "shl" || name == "shr") {
    if (!dtype_is_int(t) && !(t == DType::kBool && name.rfind("bit", 0) == 0)) {
      fail("intrinsic " + name + " needs integer operands: " + e.to_string());
      return poison(ty);
    }
    llvm::Value* c = emit_as(e->args[1], t);
    if (name == "bitand") return b_.CreateAnd(a, c);
    if (name == "bitor") return b_.CreateOr(a, c);
    if (name == "bitxor") return b_.CreateXor(a, c);
    // Shifts by the bit width or more give 0 (ONNX BitShift), not poison.
    unsigned bits = ty->getIntegerBitWidth();
    llvm::Value* in_range = b_.CreateICmpULT(c, ic(ty, bits));
    llvm::Value* safe = b_.CreateSelect(in_range, c, ic(ty, 0));
    llvm::Value* sh = name == "shl" ? b_.CreateShl(a, safe)
                      : is_signed_int(t) ? b_.CreateAShr(a, safe) : b_.CreateLShr(a, safe);
    llvm::Value* overflow = (name == "shr" && is_signed_int(t))
                                ? b_.CreateAShr(a, ic(ty, bits - 1)) : ic(ty, 0);
    return b_.CreateSelect(in_range, sh, overflow);
  }
  if (!is_float) {
    fail("intrinsic " + name + " needs a float dtype: " + e.to_string());
    return poison(ty);
  }
  if (name == "pow") {
    llvm::Value* c = emit_as(e->args[1], t);
    return f32 ? pow_f32(a, c) : libm_call2("pow", a, c);
  }
  fail("unknown intrinsic '" + name + "'");
  return poison(ty);
}

// One-argument float math: f32 (and narrow floats, computed in f32) by the
// inline expansions above, which are element-wise and so take scalars or
// vectors alike; f64 by scalar libm calls. Null for another name.
llvm::Value* Emitter::float_unary(const std::string& name, llvm::Value* a, bool f32) {
  if (name == "neg") return b_.CreateFNeg(a);
  if (name == "abs") return unary(llvm::Intrinsic::fabs, a);
  if (name == "sqrt") return unary(llvm::Intrinsic::sqrt, a);
  if (name == "floor") return unary(llvm::Intrinsic::floor, a);
  if (name == "ceil") return unary(llvm::Intrinsic::ceil, a);
  if (name == "round") return unary(llvm::Intrinsic::roundeven, a);
  if (name == "exp") return f32 ? exp_f32(a) : libm_call("exp", a);
  if (name == "log") return f32 ? log_f32(a) : libm_call("log", a);
  if (name == "tanh") return f32 ? tanh_f32(a) : libm_call("tanh", a);
  if (name == "erf") return f32 ? erf_f32(a) : libm_call("erf", a);
  if (name == "sin") return f32 ? sincos_f32(a, false) : libm_call("sin", a);
  if (name == "cos") return f32 ? sincos_f32(a, true) : libm_call("cos", a);
  if (name == "atan") return f32 ? atan_f32(a) : libm_call("atan", a);
  if (name == "asin") return f32 ? asin_f32(a) : libm_call("asin", a);
  if (name == "acos") return f32 ? acos_f32(a) : libm_call("acos", a);
  if (name == "sigmoid") {
    if (f32) return sigmoid_f32(a);
    llvm::Type* ty = a->getType();
    llvm::Value* ex = libm_call("exp", b_.CreateFNeg(unary(llvm::Intrinsic::fabs, a)));
    llvm::Value* den = b_.CreateFAdd(fc(ty, 1.0), ex);
    return b_.CreateSelect(b_.CreateFCmpOLT(a, fc(ty, 0.0)), b_.CreateFDiv(ex, den),
                           b_.CreateFDiv(fc(ty, 1.0), den));
  }
  return nullptr;
}

// ============================== explicit vectorization ==============================

namespace {
bool widenable_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt32 || t == DType::kInt64;
}
bool expr_uses_var(const Expr& e, const std::string& v) {
  if (!e.defined()) return false;
  if (e.kind() == ExprKind::kVar) return e->name == v;
  for (const Expr& a : e->args)
    if (expr_uses_var(a, v)) return true;
  return false;
}
}  // namespace

bool Emitter::depends(const Expr& e) const { return expr_uses_var(e, wvar_); }

bool Emitter::widenable(const Expr& e) const {
  if (!depends(e)) return true;  // emitted as a scalar by the ordinary path
  const ExprNode& n = *e.get();
  switch (n.kind) {
    case ExprKind::kVar:
      return n.dtype == DType::kInt64;
    case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kMin: case ExprKind::kMax:
    case ExprKind::kFloorDiv: case ExprKind::kMod: case ExprKind::kDiv:
      if (!widenable_dtype(n.dtype) || n.args.size() < 2) return false;
      if (!dtype_is_float(n.dtype) && n.kind != ExprKind::kAdd && n.kind != ExprKind::kSub &&
          n.kind != ExprKind::kMul && n.kind != ExprKind::kMin && n.kind != ExprKind::kMax) {
        // Integer division only by a positive constant (no trap in any lane).
        for (size_t i = 1; i < n.args.size(); ++i) {
          auto c = n.args[i].as_const();
          if (!c || *c <= 0) return false;
        }
      }
      break;
    case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE:
      if (!widenable_dtype(n.args[0].dtype())) return false;
      break;
    case ExprKind::kNot:
      break;
    case ExprKind::kAnd: case ExprKind::kOr:
      if (may_trap(n.args[1])) return false;
      break;
    case ExprKind::kSelect:
      // Both arms are evaluated in every lane: they must not fault. Their loads
      // are masked to the lanes that choose the arm.
      if (may_trap(n.args[1], false) || may_trap(n.args[2], false) || !widenable_dtype(n.dtype)) return false;
      // Masked arms only on vectors of a power-of-two width: masks of odd
      // widths (a 114-wide row) legalize badly, LLVM's own vectorizer does better.
      // (A condition the same for every lane branches instead: no masks.)
      if ((may_trap(n.args[1]) || may_trap(n.args[2])) && (wlanes_ & (wlanes_ - 1)) != 0 && depends(n.args[0]))
        return false;
      break;
    case ExprKind::kCast: {
      DType from = n.args[0].dtype();
      if (!(widenable_dtype(n.dtype) || n.dtype == DType::kBool)) return false;
      if (!(widenable_dtype(from) || from == DType::kBool)) return false;
      break;
    }
    case ExprKind::kLoad: {
      // A bool (one byte per element) is loaded as bytes and compared with
      // zero: a Where's mask in a vector loop (scalar byte loads otherwise).
      if (!widenable_dtype(n.dtype) && n.dtype != DType::kBool) return false;
      break;
    }
    case ExprKind::kCall: {
      // f32 math with an inline expansion (exp, sigmoid, tanh, ...): an activation in a write-back.
      // (sin and cos reduce their argument in scalar double: not here.)
      static const std::set<std::string> kUnary = {"neg", "abs",  "sqrt", "floor",   "ceil", "round", "exp",
                                                   "log", "tanh", "erf",  "sigmoid", "atan", "asin",  "acos"};
      if (n.dtype != DType::kFloat32 || n.args.size() != 1 || n.args[0].dtype() != DType::kFloat32 ||
          !kUnary.count(n.name))
        return false;
      break;
    }
    default:
      return false;  // other calls, immediates of odd types
  }
  for (const Expr& a : n.args)
    if (!widenable(a)) return false;
  return true;
}

Expr Emitter::flat_index(const tir::Buffer& buf, const std::vector<Expr>& indices) const {
  if (indices.empty()) return int_imm(0);
  if (indices.size() == 1) return indices[0];
  Expr flat = indices[0];
  for (size_t d = 1; d < indices.size(); ++d) flat = flat * buf.shape[d] + indices[d];
  return simplify(flat);
}

std::pair<llvm::Value*, bool> Emitter::widened_address(const BufferRef& ref, const std::vector<Expr>& indices) {
  llvm::Type* mt = mem_type(ref.buffer->dtype);
  Expr flat = flat_index(*ref.buffer, indices);
  Expr next = simplify(substitute(flat, {{wvar_, var(wvar_) + int_imm(1)}}) - flat);
  auto stride = next.as_const();
  if (stride && *stride == 1) {
    Expr base = simplify(substitute(flat, {{wvar_, int_imm(0)}}));
    llvm::Value* off = emit_as(base, DType::kInt64);
    return {b_.CreateInBoundsGEP(mt, ref.ptr, off), true};
  }
  llvm::Value* offs = splat(emit_w(flat));
  return {b_.CreateInBoundsGEP(mt, ref.ptr, offs), false};
}

// Lanes at base + i*s for a constant s in 1..4, i < W, each read only where
// `lanes` (null: all) is set: for s = 1 one masked load, else one masked load
// of the span they cover (the mask set at every s-th element only) and the
// lanes picked out by a shuffle. Unread lanes are poison. The base pointer is
// a plain GEP (lane 0 may be an unread lane before the buffer).
llvm::Value* Emitter::span_load(const BufferRef& ref, const Expr& base, unsigned s, llvm::Value* lanes) {
  llvm::Type* mt = mem_type(ref.buffer->dtype);
  llvm::Align align(dtype_size(ref.buffer->dtype));
  llvm::Value* ptr = b_.CreateGEP(mt, ref.ptr, emit_as(base, DType::kInt64));
  unsigned wide = wlanes_ * s;
  llvm::Type* wt = llvm::VectorType::get(mt, wide, false);
  llvm::Value* mask;
  if (lanes == nullptr) {
    std::vector<llvm::Constant*> bits;
    for (unsigned j = 0; j < wide; ++j) bits.push_back(b_.getInt1(j % s == 0));
    mask = llvm::ConstantVector::get(bits);
  } else if (s == 1) {
    mask = lanes;
  } else {  // lane i's bit at element i*s, false between
    std::vector<int> spread;
    for (unsigned j = 0; j < wide; ++j) spread.push_back(j % s == 0 ? static_cast<int>(j / s) : static_cast<int>(wlanes_));
    mask = b_.CreateShuffleVector(lanes, llvm::Constant::getNullValue(lanes->getType()), spread);
  }
  llvm::Instruction* ld = b_.CreateMaskedLoad(wt, ptr, align, mask, llvm::PoisonValue::get(wt));
  set_alias_md(ld, ref);
  if (s == 1) return ld;
  std::vector<int> pick;
  for (unsigned i = 0; i < wlanes_; ++i) pick.push_back(static_cast<int>(i * s));
  return b_.CreateShuffleVector(ld, pick);
}

// Lanes a constant 2 to 4 elements apart (a stride-2 convolution or pooling
// window along the vector): one masked load of the span and a shuffle,
// instead of a gather; inside a select arm, only the arm's lanes.
llvm::Value* Emitter::strided_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type*) {
  Expr flat = flat_index(*ref.buffer, indices);
  auto stride = simplify(substitute(flat, {{wvar_, var(wvar_) + int_imm(1)}}) - flat).as_const();
  if (!stride || *stride < 2 || *stride > 4) return nullptr;
  return span_load(ref, simplify(substitute(flat, {{wvar_, int_imm(0)}})), static_cast<unsigned>(*stride), wmask_);
}

// Lanes at constant distances from lane 0 that are not a constant stride (an
// index built from the lane variable's floordiv and mod: the columns of
// Winograd output tiles, a depth-to-space, a nearest upsampling): one masked
// load of the span they cover, at most 4 W elements, and a shuffle, instead
// of a gather. Only the elements some lane reads are loaded (those of lanes
// in the select arm's mask, when distinct lanes read distinct elements).
llvm::Value* Emitter::permuted_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type*) {
  Expr flat = flat_index(*ref.buffer, indices);
  if (!depends(flat)) return nullptr;
  Expr base = simplify(substitute(flat, {{wvar_, int_imm(0)}}));
  std::vector<int64_t> off(wlanes_);
  for (unsigned i = 0; i < wlanes_; ++i) {
    auto d = simplify(substitute(flat, {{wvar_, int_imm(i)}}) - base).as_const();
    if (!d) return nullptr;
    off[i] = *d;
  }
  const int64_t lo = *std::min_element(off.begin(), off.end()), hi = *std::max_element(off.begin(), off.end());
  const int64_t span = hi - lo + 1;
  if (span > 4 * static_cast<int64_t>(wlanes_)) return nullptr;
  std::vector<int> lane_at(static_cast<size_t>(span), -1);  // the lane reading each element of the span
  bool distinct = true;
  for (unsigned i = 0; i < wlanes_; ++i) {
    int& l = lane_at[static_cast<size_t>(off[i] - lo)];
    if (l >= 0) distinct = false;
    else l = static_cast<int>(i);
  }
  if (wmask_ && !distinct) return nullptr;
  llvm::Type* mt = mem_type(ref.buffer->dtype);
  llvm::Type* wt = llvm::VectorType::get(mt, static_cast<unsigned>(span), false);
  llvm::Value* mask;
  if (!wmask_) {
    std::vector<llvm::Constant*> bits;
    for (int l : lane_at) bits.push_back(b_.getInt1(l >= 0));
    mask = llvm::ConstantVector::get(bits);
  } else {  // element j's bit is the mask bit of the lane reading it, false where none does
    std::vector<int> spread;
    for (int l : lane_at) spread.push_back(l >= 0 ? l : static_cast<int>(wlanes_));
    mask = b_.CreateShuffleVector(wmask_, llvm::Constant::getNullValue(wmask_->getType()), spread);
  }
  llvm::Value* ptr = b_.CreateGEP(mt, ref.ptr, emit_as(simplify(base + int_imm(lo)), DType::kInt64));
  llvm::Instruction* ld = b_.CreateMaskedLoad(wt, ptr, llvm::Align(dtype_size(ref.buffer->dtype)), mask,
                                              llvm::PoisonValue::get(wt));
  set_alias_md(ld, ref);
  std::vector<int> pick;
  for (unsigned i = 0; i < wlanes_; ++i) pick.push_back(static_cast<int>(off[i] - lo));
  return b_.CreateShuffleVector(ld, pick);
}

// An index clamped into range, max(lo, min(hi, i)) with i 1 to 4 elements
// apart along the vector (a padded convolution input or pooling window, an
// edge-replicating pad): the lanes where no clamp acts are one masked span
// load, the others (the edges) a masked gather at the clamped index, run only
// when a vector has such a lane. Each lane reads exactly the element the
// scalar code reads.
// A min (max) of several terms that depend on the lane variable, all a
// lane-invariant distance apart, as one term: min(d0, d1, ..., b...) ->
// min(b..., d0 + min(d1 - d0, ..., 0)). The simplifier distributes a split's
// min(40, 16*o) into a clamp (min(55, i + 39) and i + 16*o - 1 under one min),
// which otherwise hides the clamp from clamped_load.
// The conjuncts of a condition (a && b && ...), appended to `out`.
void add_conjuncts(const Expr& c, std::vector<Expr>& out) {
  if (c.kind() == ExprKind::kAnd) {
    for (const Expr& a : c->args) add_conjuncts(a, out);
  } else {
    out.push_back(c);
  }
}

// Whether a <= b (or a < b), `c`, follows from one of `facts` alone: a fact
// p <= q (p < q) with (b - a) - (q - p) a constant >= 0 (>= -1 for p < q).
bool implied(const Expr& c, const std::vector<Expr>& facts) {
  if ((c.kind() != ExprKind::kLE && c.kind() != ExprKind::kLT) || c->args.size() != 2) return false;
  Expr need = c->args[1] - c->args[0];
  if (c.kind() == ExprKind::kLT) need = need - int_imm(1, need.dtype());
  for (const Expr& f : facts) {
    if ((f.kind() != ExprKind::kLE && f.kind() != ExprKind::kLT) || f->args.size() != 2) continue;
    if (f->args[0].dtype() != c->args[0].dtype()) continue;
    Expr have = f->args[1] - f->args[0];
    if (f.kind() == ExprKind::kLT) have = have - int_imm(1, have.dtype());
    auto gap = simplify(need - have).as_const();
    if (gap && *gap >= 0) return true;
  }
  return false;
}

Expr Emitter::merge_lane_terms(const Expr& e) const {
  ExprKind k = e.kind();
  if ((k != ExprKind::kMin && k != ExprKind::kMax) || !depends(e)) return e;
  std::vector<Expr> terms;
  std::function<void(const Expr&)> collect = [&](const Expr& x) {
    if (x.kind() == k) {
      for (const Expr& a : x->args) collect(a);
    } else {
      terms.push_back(x);
    }
  };
  collect(e);
  std::vector<Expr> lane, fixed;
  for (const Expr& t : terms) (depends(t) ? lane : fixed).push_back(t);
  if (lane.size() < 2) return e;
  std::vector<Expr> offsets = {int_imm(0, lane[0].dtype())};
  for (size_t i = 1; i < lane.size(); ++i) {
    Expr d = simplify(lane[i] - lane[0]);
    if (depends(d)) return e;
    offsets.push_back(d);
  }
  auto fold = [&](std::vector<Expr> xs) {
    Expr r = xs[0];
    for (size_t i = 1; i < xs.size(); ++i) r = k == ExprKind::kMin ? min(r, xs[i]) : max(r, xs[i]);
    return r;
  };
  Expr merged = lane[0] + fold(offsets);
  if (fixed.empty()) return merged;
  return k == ExprKind::kMin ? min(fold(fixed), merged) : max(fold(fixed), merged);
}

llvm::Value* Emitter::clamped_load(const BufferRef& ref, const std::vector<Expr>& indices, llvm::Type* vt) {
  std::vector<Expr> conds;
  std::vector<Expr> bare;
  for (const Expr& idx : indices) {
    Expr e = idx;
    // Each level of the clamp may hide its lane terms (see merge_lane_terms).
    auto level = [&](const Expr& x) {
      if (x.kind() != ExprKind::kMax && x.kind() != ExprKind::kMin) return x;
      Expr m = merge_lane_terms(x);
      if (m.kind() != x.kind() || m->args.size() != 2) return x;
      Expr a = m->args[0], b = m->args[1];
      if (depends(a) && !depends(b)) std::swap(a, b);
      if (!depends(a) && depends(b)) b = merge_lane_terms(b);
      return x.kind() == ExprKind::kMin ? min(a, b) : max(a, b);
    };
    // A clamp the simplifier wrote with its offset outside, min(w, x + 1) - 1
    // (a symbolic row end), is min(w - 1, x): the offset goes in.
    auto offset_in = [&](const Expr& x) {
      ExprKind k = x.kind();
      if ((k != ExprKind::kAdd && k != ExprKind::kSub) || x->args.size() < 2 || !depends(x)) return x;
      int clamp = -1;
      for (size_t i = 0; i < x->args.size(); ++i) {
        const Expr& a = x->args[i];
        if (!depends(a)) continue;
        bool minmax = (a.kind() == ExprKind::kMin || a.kind() == ExprKind::kMax) && a->args.size() == 2;
        if (clamp >= 0 || !minmax || (k == ExprKind::kSub && i != 0)) return x;
        clamp = static_cast<int>(i);
      }
      if (clamp < 0) return x;
      Expr c;
      for (size_t i = 0; i < x->args.size(); ++i) {
        if (static_cast<int>(i) == clamp) continue;
        Expr t = k == ExprKind::kSub ? int_imm(0, x->args[i].dtype()) - x->args[i] : x->args[i];
        c = c.defined() ? c + t : t;
      }
      const Expr& m = x->args[static_cast<size_t>(clamp)];
      Expr a = simplify(m->args[0] + c), b = simplify(m->args[1] + c);
      return m.kind() == ExprKind::kMin ? min(a, b) : max(a, b);
    };
    e = level(offset_in(e));
    std::vector<std::pair<bool, Expr>> clamps;  // (a max, its bound) per level, outermost first
    while ((e.kind() == ExprKind::kMax || e.kind() == ExprKind::kMin) && e->args.size() == 2 && depends(e)) {
      const Expr &a = e->args[0], &b = e->args[1];
      bool a_dep = depends(a), b_dep = depends(b);
      if (a_dep == b_dep) break;
      clamps.emplace_back(e.kind() == ExprKind::kMax, a_dep ? b : a);
      e = level(offset_in(a_dep ? a : b));
    }
    // max(lo, x) is x where lo <= x; min(hi, x) is x where x <= hi. Where
    // every level is the identity, each level's operand is the bare index,
    // so the conditions are stated on it.
    for (const auto& [is_max, bound] : clamps) conds.push_back(is_max ? le(bound, e) : le(e, bound));
    bare.push_back(e);
  }
  if (conds.empty()) return nullptr;
  Expr flat = flat_index(*ref.buffer, bare);
  auto stride = simplify(substitute(flat, {{wvar_, var(wvar_) + int_imm(1)}}) - flat).as_const();
  if (!stride || *stride < 1 || *stride > 4) return nullptr;
  // In a select arm whose condition implies every clamp is the identity (a
  // zero-padding select around its clamped load: 0 <= x < w and max(0,
  // min(w - 1, x))), the lanes read are all in range: one masked span load.
  if (wmask_ && std::all_of(conds.begin(), conds.end(), [&](const Expr& c) { return implied(c, wfacts_); }))
    return span_load(ref, simplify(substitute(flat, {{wvar_, int_imm(0)}})), static_cast<unsigned>(*stride), wmask_);
  for (const Expr& c : conds)
    if (!widenable(c)) return nullptr;
  auto [edge_addr, contiguous] = widened_address(ref, indices);
  if (contiguous) return nullptr;  // the clamps did not change the access
  llvm::Value* in_range = splat(emit_w(conds[0]));
  for (size_t i = 1; i < conds.size(); ++i) in_range = b_.CreateAnd(in_range, splat(emit_w(conds[i])));
  llvm::Value* at_edge = b_.CreateNot(in_range);
  if (wmask_) {  // in a select arm: only the lanes that take it
    in_range = b_.CreateAnd(in_range, wmask_);
    at_edge = b_.CreateAnd(at_edge, wmask_);
  }
  llvm::Align align(dtype_size(ref.buffer->dtype));
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::BasicBlock* gather_bb = llvm::BasicBlock::Create(ctx_, "edge.gather", frame_->fn);
  llvm::BasicBlock* join_bb = llvm::BasicBlock::Create(ctx_, "edge.join", frame_->fn);
  b_.CreateCondBr(b_.CreateOrReduce(at_edge), gather_bb, join_bb);
  b_.SetInsertPoint(gather_bb);
  llvm::Instruction* gathered =
      b_.CreateMaskedGather(vt, edge_addr, align, at_edge, llvm::PoisonValue::get(vt));
  set_alias_md(gathered, ref);
  llvm::BasicBlock* gather_end = b_.GetInsertBlock();
  b_.CreateBr(join_bb);
  b_.SetInsertPoint(join_bb);
  llvm::PHINode* edges = b_.CreatePHI(vt, 2);
  edges->addIncoming(llvm::PoisonValue::get(vt), from);
  edges->addIncoming(gathered, gather_end);
  llvm::Value* inner = span_load(ref, simplify(substitute(flat, {{wvar_, int_imm(0)}})),
                                 static_cast<unsigned>(*stride), in_range);
  return b_.CreateSelect(in_range, inner, edges);
}

// One vector of load `n` (vt: its memory type, wlanes_ wide): a clamped,
// strided or permuted span where the index allows, a plain or masked load,
// else a gather.
llvm::Value* Emitter::widened_load(const ExprNode& n, llvm::Type* vt) {
  BufferRef* ref = find_buffer(n.name, static_cast<int>(n.int_value));
  if (!ref) return poison(vt);
  if (llvm::Value* v = clamped_load(*ref, n.args, vt)) return v;
  if (llvm::Value* v = strided_load(*ref, n.args, vt)) return v;
  auto [addr, contiguous] = widened_address(*ref, n.args);
  if (!contiguous)
    if (llvm::Value* v = permuted_load(*ref, n.args, vt)) return v;
  llvm::Align align(dtype_size(ref->buffer->dtype));
  llvm::Instruction* ld;
  if (wmask_) {  // in a select arm: only the lanes that take it
    llvm::Value* none = llvm::PoisonValue::get(vt);
    ld = contiguous ? b_.CreateMaskedLoad(vt, addr, align, wmask_, none)
                    : b_.CreateMaskedGather(vt, addr, align, wmask_, none);
  } else {
    ld = contiguous ? static_cast<llvm::Instruction*>(b_.CreateAlignedLoad(vt, addr, align))
                    : b_.CreateMaskedGather(vt, addr, align);
  }
  set_alias_md(ld, *ref);
  return ld;
}

llvm::Value* Emitter::emit_w(const Expr& e) {
  if (!depends(e)) return emit(e);
  const ExprNode& n = *e.get();
  switch (n.kind) {
    case ExprKind::kVar: {
      std::vector<llvm::Constant*> lanes;
      for (unsigned i = 0; i < wlanes_; ++i) lanes.push_back(llvm::ConstantInt::get(b_.getInt64Ty(), i));
      return llvm::ConstantVector::get(lanes);
    }
    case ExprKind::kAdd: case ExprKind::kSub: case ExprKind::kMul: case ExprKind::kDiv:
    case ExprKind::kFloorDiv: case ExprKind::kMod: case ExprKind::kMin: case ExprKind::kMax: {
      auto arg = [&](const Expr& a) { return splat(convert(splat(emit_w(a)), a.dtype(), n.dtype)); };
      // Of a vector reduction step only min and max take emit_binary's
      // reduction form (the sums keep their strict lane-wise arithmetic).
      bool reduction = e.get() == reduction_root_ && (n.kind == ExprKind::kMin || n.kind == ExprKind::kMax);
      llvm::Value* acc = arg(n.args[0]);
      for (size_t i = 1; i < n.args.size(); ++i) acc = emit_binary(n.kind, n.dtype, acc, arg(n.args[i]), reduction);
      return acc;
    }
    case ExprKind::kLT: case ExprKind::kLE: case ExprKind::kEQ: case ExprKind::kNE: {
      DType t = n.args[0].dtype();
      llvm::Value* a = splat(convert(splat(emit_w(n.args[0])), n.args[0].dtype(), t));
      llvm::Value* c = splat(convert(splat(emit_w(n.args[1])), n.args[1].dtype(), t));
      return emit_compare(n.kind, t, a, c);
    }
    case ExprKind::kAnd: case ExprKind::kOr: {
      llvm::Value* a = splat(emit_w(n.args[0]));
      llvm::Value* c = splat(emit_w(n.args[1]));
      return n.kind == ExprKind::kAnd ? b_.CreateAnd(a, c) : b_.CreateOr(a, c);
    }
    case ExprKind::kNot:
      return b_.CreateNot(splat(emit_w(n.args[0])));
    case ExprKind::kSelect: {
      if (!depends(n.args[0])) {
        auto arm = [&](const Expr& a) { return splat(convert(splat(emit_w(a)), a.dtype(), n.dtype)); };
        llvm::Value* cond = emit_as(n.args[0], DType::kBool);
        // A condition on unrolled loop variables (a Winograd transform's
        // tile position) is a constant: only its arm is emitted.
        if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(cond)) return arm(k->isOne() ? n.args[1] : n.args[2]);
        // The same arm for every lane (a Concat's part, chosen by an outer
        // loop): a branch evaluates only that arm, instead of masked loads of
        // every part for every vector.
        if (may_trap(n.args[1]) || may_trap(n.args[2]))
          return branch_select(cond, [&] { return arm(n.args[1]); }, [&] { return arm(n.args[2]); });
      }
      llvm::Value* c = splat(emit_w(n.args[0]));
      // An arm's loads read only the lanes that take the arm (as the scalar
      // code's branch would): the lane mask narrows while it is emitted.
      auto arm = [&](const Expr& a, llvm::Value* lanes, bool taken) {
        llvm::Value* saved = wmask_;
        size_t facts = wfacts_.size();
        if (may_trap(a)) {
          wmask_ = saved ? b_.CreateAnd(saved, lanes) : lanes;
          if (taken) add_conjuncts(n.args[0], wfacts_);
        }
        llvm::Value* v = splat(convert(splat(emit_w(a)), a.dtype(), n.dtype));
        wmask_ = saved;
        wfacts_.resize(facts);
        return v;
      };
      llvm::Value* t = arm(n.args[1], c, true);
      llvm::Value* f = arm(n.args[2], b_.CreateNot(c), false);
      return b_.CreateSelect(c, t, f);
    }
    case ExprKind::kCast:
      return convert(splat(emit_w(n.args[0])), n.args[0].dtype(), n.dtype);
    case ExprKind::kCall:
      return float_unary(n.name, splat(emit_w(n.args[0])), true);
    case ExprKind::kLoad: {
      llvm::Type* vt = llvm::VectorType::get(mem_type(n.dtype), wlanes_, false);
      llvm::Value* v = widened_load(n, vt);
      // Bools are stored one byte each: lanes true where the byte is not 0.
      return n.dtype == DType::kBool ? b_.CreateICmpNE(v, llvm::Constant::getNullValue(vt)) : v;
    }
    default:
      break;
  }
  fail("cannot widen expression " + e.to_string());
  return poison(llvm::VectorType::get(b_.getFloatTy(), wlanes_, false));
}

static bool is_reduction_update(const tir::Stmt& s);

bool Emitter::emit_widened(const tir::Stmt& loop) {
  auto c = loop->extent.as_const();
  if (!c || *c < 2 || *c > 256 || !wvar_.empty()) return false;
  // A guarded store (`if (cond) store`, the tail of a split axis) is a store
  // masked to the lanes where cond holds, its loads masked likewise; only for
  // power-of-two widths (masks of odd widths legalize poorly).
  Expr cond;
  tir::Stmt st = loop->body;
  if (st && st->kind == tir::StmtKind::kIfThenElse && !st->else_case && st->then_case &&
      st->then_case->kind == tir::StmtKind::kStore && (*c & (*c - 1)) == 0) {
    cond = st->cond;
    st = st->then_case;
  }
  if (!st || st->kind != tir::StmtKind::kStore) return false;
  BufferRef* ref = find_buffer(st->buffer.name, st->buffer_index);
  if (!ref) return false;
  DType bt = ref->buffer->dtype;
  if (!widenable_dtype(bt) || st->value.dtype() != bt) return false;
  std::string saved_var = wvar_;
  wvar_ = loop->var;
  wlanes_ = static_cast<unsigned>(*c);
  bool ok = widenable(st->value) && (!cond.defined() || widenable(cond));
  for (const Expr& i : st->indices) ok = ok && widenable(i);
  // The stored buffer may be read in the value only at the stored element
  // (a reduction update): lanes then never see each other's stores.
  std::function<bool(const Expr&)> reads_other = [&](const Expr& e) {
    if (!e.defined()) return false;
    if (e.kind() == ExprKind::kLoad && e->name == st->buffer.name && e->int_value == st->buffer_index) {
      if (e->args.size() != st->indices.size()) return true;
      for (size_t i = 0; i < e->args.size(); ++i)
        if (!(e->args[i] == st->indices[i])) return true;
    }
    for (const Expr& a : e->args)
      if (reads_other(a)) return true;
    return false;
  };
  ok = ok && !reads_other(st->value);
  if (!ok) {
    wvar_ = saved_var;
    return false;
  }
  llvm::Value* mask = cond.defined() ? splat(emit_w(cond)) : nullptr;
  llvm::Value* saved_mask = wmask_;
  wmask_ = mask;
  reduction_root_ = is_reduction_update(st) ? st->value.get() : nullptr;
  llvm::Value* v = splat(emit_w(st->value));
  reduction_root_ = nullptr;
  auto [addr, contiguous] = widened_address(*ref, st->indices);
  wmask_ = saved_mask;
  llvm::Align align(dtype_size(bt));
  llvm::Instruction* store;
  if (mask) {
    store = contiguous ? b_.CreateMaskedStore(v, addr, align, mask) : b_.CreateMaskedScatter(v, addr, align, mask);
  } else {
    store = contiguous ? static_cast<llvm::Instruction*>(b_.CreateAlignedStore(v, addr, align))
                       : b_.CreateMaskedScatter(v, addr, align);
  }
  set_alias_md(store, *ref);
  wvar_ = saved_var;
  return true;
}

// A register tile written back across its vector lanes,
//   for u in 0..U unrolled { for v in 0..V vectorized { buf[...] = value } }
// where the stored element moves by one along u and by a constant stride of
// at least U along v (conv.panels' tile of pixels x output channels written
// into NCHW), would be U scatters of V lanes each. Instead the U row vectors
// are computed, transposed in registers (log2 U rounds of interleaving
// shuffles, 16 lanes at a time), and stored as V contiguous runs of U
// elements. Only where the value never reads the stored buffer, so computing
// every row before the first store changes nothing.
bool Emitter::emit_transposed_store(const tir::Stmt& loop) {
  auto uc = loop->extent.as_const();
  if (!uc || *uc < 2 || *uc > 16 || !wvar_.empty()) return false;
  const tir::Stmt& inner = loop->body;
  if (!inner || inner->kind != tir::StmtKind::kFor || inner->for_kind != tir::ForKind::kVectorized) return false;
  auto vc = inner->extent.as_const();
  if (!vc || *vc < 2 || *vc > 256) return false;
  const tir::Stmt& st = inner->body;
  if (!st || st->kind != tir::StmtKind::kStore) return false;
  BufferRef* ref = find_buffer(st->buffer.name, st->buffer_index);
  if (!ref) return false;
  DType bt = ref->buffer->dtype;
  if (!widenable_dtype(bt) || dtype_is_narrow_float(bt) || bt == DType::kBool || st->value.dtype() != bt)
    return false;
  Expr flat = flat_index(*ref->buffer, st->indices);
  auto step = [&](const std::string& v) {
    return simplify(substitute(flat, {{v, var(v) + int_imm(1)}}) - flat).as_const();
  };
  auto along_u = step(loop->var), along_v = step(inner->var);
  if (!along_u || *along_u != 1 || !along_v || std::llabs(*along_v) < *uc) return false;
  std::function<bool(const Expr&)> reads_buffer = [&](const Expr& e) {
    if (!e.defined()) return false;
    if (e.kind() == ExprKind::kLoad && e->name == st->buffer.name && e->int_value == st->buffer_index) return true;
    for (const Expr& a : e->args)
      if (reads_buffer(a)) return true;
    return false;
  };
  if (reads_buffer(st->value)) return false;
  const unsigned rows = static_cast<unsigned>(*uc), lanes = static_cast<unsigned>(*vc);
  wvar_ = inner->var;
  wlanes_ = lanes;
  bool ok = widenable(st->value);
  wvar_.clear();
  if (!ok) return false;

  std::optional<llvm::Value*> saved;
  if (auto it = frame_->vars.find(loop->var); it != frame_->vars.end()) saved = it->second;
  std::vector<llvm::Value*> vals;
  for (unsigned u = 0; u < rows && error_.is_ok(); ++u) {
    frame_->vars[loop->var] = i64(u);
    wvar_ = inner->var;
    wlanes_ = lanes;
    vals.push_back(splat(emit_w(st->value)));
    wvar_.clear();
  }
  if (!error_.is_ok()) return true;
  llvm::Type* mt = mem_type(bt);
  llvm::Align align(dtype_size(bt));
  unsigned padded = 1;
  while (padded < rows) padded *= 2;
  const unsigned chunk = std::min(lanes, 16u);
  for (unsigned c0 = 0; c0 < lanes; c0 += chunk) {
    const unsigned n = std::min(chunk, lanes - c0);
    // Rows restricted to lanes c0..c0+n, padded with poison rows to a power of two.
    std::vector<llvm::Value*> level;
    std::vector<int> pick;
    for (unsigned l = 0; l < n; ++l) pick.push_back(static_cast<int>(c0 + l));
    for (unsigned u = 0; u < padded; ++u)
      level.push_back(u < rows ? (n == lanes ? vals[u] : b_.CreateShuffleVector(vals[u], pick))
                               : llvm::PoisonValue::get(llvm::VectorType::get(mt, n, false)));
    // Interleave neighbours in groups of g: element l * 2g + t of the result
    // is row (pair index * 2g + t) at lane l.
    for (unsigned g = 1; level.size() > 1; g *= 2) {
      std::vector<llvm::Value*> next;
      for (size_t j = 0; j + 1 < level.size(); j += 2) {
        std::vector<int> mix;
        for (unsigned grp = 0; grp < n; ++grp) {
          for (unsigned t = 0; t < g; ++t) mix.push_back(static_cast<int>(grp * g + t));
          for (unsigned t = 0; t < g; ++t) mix.push_back(static_cast<int>(n * g + grp * g + t));
        }
        next.push_back(b_.CreateShuffleVector(level[j], level[j + 1], mix));
      }
      level = std::move(next);
    }
    for (unsigned l = 0; l < n; ++l) {
      std::vector<int> run;
      for (unsigned u = 0; u < rows; ++u) run.push_back(static_cast<int>(l * padded + u));
      llvm::Value* v = b_.CreateShuffleVector(level[0], run);
      Expr at = simplify(substitute(flat, {{loop->var, int_imm(0)}, {inner->var, int_imm(c0 + l)}}));
      llvm::Value* ptr = b_.CreateInBoundsGEP(mt, ref->ptr, emit_as(at, DType::kInt64));
      llvm::StoreInst* store = b_.CreateAlignedStore(v, ptr, align);
      set_alias_md(store, *ref);
    }
  }
  if (saved) frame_->vars[loop->var] = *saved;
  else frame_->vars.erase(loop->var);
  return true;
}

// ============================== statements ==============================

void Emitter::emit_stmt(const tir::Stmt& s) {
  if (!s || !error_.is_ok()) return;
  switch (s->kind) {
    case tir::StmtKind::kStore: emit_store(s); return;
    case tir::StmtKind::kPrefetch: emit_prefetch(s); return;
    case tir::StmtKind::kFor: emit_for(s); return;
    case tir::StmtKind::kAllocate: emit_allocate(s); return;
    case tir::StmtKind::kIfThenElse: emit_if(s); return;
    case tir::StmtKind::kSeq:
      for (const tir::Stmt& c : s->seq) emit_stmt(c);
      return;
  }
}

// A store `buf[idx] = buf[idx] op v` with op in {+, *, min, max} on floats is
// a reduction update: its combining op may be reassociated so that LLVM can
// vectorize the reduction loop. Nothing else gets reassociation.
static bool is_reduction_update(const tir::Stmt& s) {
  const Expr& v = s->value;
  if (!v.defined() || !dtype_is_float(v.dtype())) return false;
  ExprKind k = v.kind();
  if (k != ExprKind::kAdd && k != ExprKind::kMul && k != ExprKind::kMin && k != ExprKind::kMax)
    return false;
  for (const Expr& a : v->args) {
    if (a.kind() != ExprKind::kLoad || a->name != s->buffer.name ||
        a->int_value != s->buffer_index || a->args.size() != s->indices.size())
      continue;
    bool same = true;
    for (size_t i = 0; i < s->indices.size(); ++i) same = same && a->args[i] == s->indices[i];
    if (same) return true;
  }
  return false;
}

void Emitter::emit_store(const tir::Stmt& s) {
  BufferRef* ref = find_buffer(s->buffer.name, s->buffer_index);
  if (!ref) return;
  DType bt = ref->buffer->dtype;
  llvm::Type* mt = mem_type(bt);
  if (!mt) {
    fail("buffer '" + ref->buffer->name + "' has non-compilable dtype");
    return;
  }
  reduction_root_ = is_reduction_update(s) ? s->value.get() : nullptr;
  llvm::Value* v = emit_as(s->value, bt);
  reduction_root_ = nullptr;
  if (!error_.is_ok()) return;
  if (bt == DType::kBool) v = b_.CreateZExt(v, mt);
  if (dtype_is_narrow_float(bt)) v = encode_narrow(v, bt);
  llvm::Value* off = flat_offset(*ref->buffer, s->indices);
  llvm::Value* ptr = b_.CreateInBoundsGEP(mt, ref->ptr, off);
  llvm::StoreInst* st = b_.CreateAlignedStore(v, ptr, llvm::Align(dtype_size(bt)));
  set_alias_md(st, *ref);
}

// A prefetch of each 64-byte line of the span into L2 (locality 2): a hint
// that never faults, so the address may lie past the buffer (plain GEP).
void Emitter::emit_prefetch(const tir::Stmt& s) {
  BufferRef* ref = find_buffer(s->buffer.name, s->buffer_index);
  if (!ref) return;
  llvm::Type* mt = mem_type(ref->buffer->dtype);
  auto elements = s->extent.as_const();
  if (!mt || !elements) return;
  llvm::Value* ptr = b_.CreateGEP(mt, ref->ptr, flat_offset(*ref->buffer, s->indices));
  int64_t bytes = *elements * static_cast<int64_t>(dtype_size(ref->buffer->dtype));
  for (int64_t b = 0; b < bytes; b += 64) {
    llvm::Value* p = b == 0 ? ptr : b_.CreateGEP(b_.getInt8Ty(), ptr, b_.getInt64(b));
    b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {p->getType()}, {p, b_.getInt32(0), b_.getInt32(2), b_.getInt32(1)});
  }
}

llvm::MDNode* Emitter::loop_md(const tir::Stmt& loop) {
  std::vector<llvm::Metadata*> ops;
  ops.push_back(nullptr);  // self reference, filled below
  ops.push_back(llvm::MDNode::get(ctx_, {llvm::MDString::get(ctx_, "llvm.loop.mustprogress")}));
  if (loop->for_kind == tir::ForKind::kVectorized) {
    int bits = widest_access_bits(loop->body);
    if (bits <= 0) bits = 32;
    int width = std::max(2, target_.vector_bits / bits);
    ops.push_back(llvm::MDNode::get(
        ctx_, {llvm::MDString::get(ctx_, "llvm.loop.vectorize.enable"),
               llvm::ConstantAsMetadata::get(b_.getTrue())}));
    ops.push_back(llvm::MDNode::get(
        ctx_, {llvm::MDString::get(ctx_, "llvm.loop.vectorize.width"),
               llvm::ConstantAsMetadata::get(b_.getInt32(width))}));
  } else if (loop->for_kind == tir::ForKind::kUnrolled) {
    ops.push_back(llvm::MDNode::get(ctx_, {llvm::MDString::get(ctx_, "llvm.loop.unroll.full")}));
  } else if (contains_vectorized_loop(loop->body)) {
    // The schedule vectorizes an inner loop (once LLVM has fully unrolled
    // small tile loops, the SLP vectorizer widens them); widening this outer
    // loop instead would turn the tile's contiguous accesses into gathers.
    ops.push_back(llvm::MDNode::get(
        ctx_, {llvm::MDString::get(ctx_, "llvm.loop.vectorize.enable"),
               llvm::ConstantAsMetadata::get(b_.getFalse())}));
  }
  llvm::MDNode* md = llvm::MDNode::getDistinct(ctx_, ops);
  md->replaceOperandWith(0, md);
  return md;
}

// for (var = begin; var < end; ++var) loop->body, in the current function.
void Emitter::emit_loop(const std::string& var, llvm::Value* begin, llvm::Value* end,
                        llvm::MDNode* (Emitter::*md)(const tir::Stmt&), const tir::Stmt& loop) {
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  llvm::BasicBlock* header = llvm::BasicBlock::Create(ctx_, "for." + var, frame_->fn);
  llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, "for." + var + ".body", frame_->fn);
  llvm::BasicBlock* latch = llvm::BasicBlock::Create(ctx_, "for." + var + ".latch", frame_->fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx_, "for." + var + ".end", frame_->fn);
  b_.CreateBr(header);
  b_.SetInsertPoint(header);
  llvm::PHINode* iv = b_.CreatePHI(b_.getInt64Ty(), 2, var);
  iv->addIncoming(begin, pre);
  b_.CreateCondBr(b_.CreateICmpSLT(iv, end), body, exit);
  b_.SetInsertPoint(body);
  std::optional<llvm::Value*> saved;
  if (auto it = frame_->vars.find(var); it != frame_->vars.end()) saved = it->second;
  frame_->vars[var] = iv;
  emit_stmt(loop->body);
  if (saved) frame_->vars[var] = *saved;
  else frame_->vars.erase(var);
  b_.CreateBr(latch);
  b_.SetInsertPoint(latch);
  llvm::Value* next = b_.CreateAdd(iv, i64(1), var + ".next", true, true);
  iv->addIncoming(next, latch);
  llvm::BranchInst* back = b_.CreateBr(header);
  if (llvm::MDNode* node = (this->*md)(loop)) back->setMetadata(llvm::LLVMContext::MD_loop, node);
  b_.SetInsertPoint(exit);
}

void Emitter::emit_for(const tir::Stmt& s) {
  if (s->for_kind == tir::ForKind::kParallel && !frame_->in_parallel) {
    emit_parallel_for(s);
    return;
  }
  if (s->for_kind == tir::ForKind::kVectorized && emit_widened(s)) return;
  if (s->for_kind == tir::ForKind::kUnrolled && emit_transposed_store(s)) return;
  if (s->for_kind == tir::ForKind::kUnrolled) {
    // Fully unrolled here (a constant extent up to 32): each copy sees its
    // row as a constant, so register tiles have constant offsets.
    auto c = s->extent.as_const();
    if (c && *c >= 0 && *c <= 32) {
      std::optional<llvm::Value*> saved;
      if (auto it = frame_->vars.find(s->var); it != frame_->vars.end()) saved = it->second;
      for (int64_t j = 0; j < *c && error_.is_ok(); ++j) {
        frame_->vars[s->var] = i64(j);
        emit_stmt(s->body);
      }
      if (saved) frame_->vars[s->var] = *saved;
      else frame_->vars.erase(s->var);
      return;
    }
  }
  llvm::Value* extent = emit_as(s->extent, DType::kInt64);
  emit_loop(s->var, i64(0), extent, &Emitter::loop_md, s);
}

// The loop body becomes `void body(int64_t begin, int64_t end, void* env)`;
// env holds every value in scope (parameter and scratch buffer pointers, loop
// variables and symbols). Parallel loops inside it run serially.
void Emitter::emit_parallel_for(const tir::Stmt& s) {
  llvm::Value* extent = emit_as(s->extent, DType::kInt64);
  llvm::Type* ptr_t = b_.getPtrTy();
  llvm::Type* i64_t = b_.getInt64Ty();

  std::vector<llvm::Type*> fields;
  for (size_t i = 0; i < frame_->params.size(); ++i) fields.push_back(ptr_t);
  std::vector<std::string> scratch_names, var_names;
  for (auto& [name, ref] : frame_->scratch) {
    scratch_names.push_back(name);
    fields.push_back(ptr_t);
  }
  for (auto& [name, v] : frame_->vars) {
    var_names.push_back(name);
    fields.push_back(i64_t);
  }
  if (fields.empty()) fields.push_back(i64_t);
  llvm::StructType* env_t = llvm::StructType::get(ctx_, fields);

  // Fill the environment in the caller.
  llvm::AllocaInst* env = entry_alloca(env_t, nullptr, "env");
  unsigned field = 0;
  auto store_field = [&](llvm::Value* v) { b_.CreateStore(v, b_.CreateStructGEP(env_t, env, field++)); };
  for (BufferRef& p : frame_->params) store_field(p.ptr);
  for (auto& name : scratch_names) store_field(frame_->scratch[name].ptr);
  for (auto& name : var_names) store_field(frame_->vars[name]);

  llvm::FunctionType* body_t = llvm::FunctionType::get(b_.getVoidTy(), {i64_t, i64_t, ptr_t}, false);
  llvm::Function* body_fn =
      llvm::Function::Create(body_t, llvm::Function::InternalLinkage,
                             func_->name + ".par" + std::to_string(parallel_count_++), m_);
  setup_function_attrs(body_fn);
  body_fn->addParamAttr(2, llvm::Attribute::NoAlias);

  llvm::FunctionCallee pfor = m_.getOrInsertFunction(
      "kiln_parallel_for", llvm::FunctionType::get(b_.getVoidTy(), {i64_t, ptr_t, ptr_t}, false));
  b_.CreateCall(pfor, {extent, body_fn, env});
  llvm::BasicBlock* resume = b_.GetInsertBlock();

  // Emit the outlined body with its own frame.
  Frame inner;
  inner.fn = body_fn;
  inner.in_parallel = true;
  inner.entry = llvm::BasicBlock::Create(ctx_, "entry", body_fn);
  b_.SetInsertPoint(inner.entry);
  llvm::Value* env_arg = body_fn->getArg(2);
  field = 0;
  auto load_field = [&](llvm::Type* t) {
    return b_.CreateLoad(t, b_.CreateStructGEP(env_t, env_arg, field++));
  };
  for (BufferRef& p : frame_->params) {
    BufferRef q = p;
    q.ptr = assume_aligned(load_field(ptr_t));
    inner.params.push_back(q);
  }
  for (auto& name : scratch_names) {
    BufferRef q = frame_->scratch[name];
    q.ptr = load_field(ptr_t);
    inner.scratch[name] = q;
  }
  for (auto& name : var_names) inner.vars[name] = load_field(i64_t);
  Frame* outer = frame_;
  frame_ = &inner;
  emit_loop(s->var, body_fn->getArg(0), body_fn->getArg(1), &Emitter::no_loop_md, s);
  b_.CreateRetVoid();
  frame_ = outer;
  b_.SetInsertPoint(resume);
}

llvm::AllocaInst* Emitter::entry_alloca(llvm::Type* t, llvm::Value* count, const char* name) {
  llvm::IRBuilder<> ab(frame_->entry, frame_->entry->begin());
  llvm::AllocaInst* a = ab.CreateAlloca(t, count, name);
  a->setAlignment(llvm::Align(64));
  return a;
}

void Emitter::emit_allocate(const tir::Stmt& s) {
  const tir::Buffer& buf = s->buffer;
  llvm::Type* mt = mem_type(buf.dtype);
  if (!mt) {
    fail("scratch buffer '" + buf.name + "' has non-compilable dtype");
    return;
  }
  int64_t elem = dtype_size(buf.dtype);
  bool is_const = true;
  int64_t const_elems = 1;
  for (const Expr& d : buf.shape) {
    auto c = d.as_const();
    if (!c || *c < 0 || const_elems > (int64_t{1} << 40)) is_const = false;
    else const_elems *= *c;
  }
  BufferRef ref;
  ref.buffer = &buf;
  // A scratch buffer is fresh memory: its accesses alias no parameter and no
  // other scratch buffer live with it, so its scope is listed as disjoint
  // from every scope made before it (one side of each pair suffices for
  // LLVM's scoped alias analysis). Loads of one stage then stay valid across
  // stores to the next (unrolled Winograd transforms read each input once).
  // A later Allocate may get the freed block of an earlier one from the
  // per-thread cache; that stays sound because kiln_scratch_alloc and
  // kiln_scratch_free are opaque calls LLVM cannot move accesses across.
  // Declaring them allocator functions (noalias returns, allockind) would
  // need this revisited.
  if (alias_domain_) {
    llvm::MDBuilder mdb(ctx_);
    llvm::MDNode* scope = mdb.createAnonymousAliasScope(alias_domain_, buf.name);
    ref.alias_scope = llvm::MDNode::get(ctx_, {scope});
    if (!alias_scopes_.empty()) ref.noalias = llvm::MDNode::get(ctx_, alias_scopes_);
    alias_scopes_.push_back(scope);
  }
  llvm::Value* heap = nullptr;
  llvm::Value* heap_bytes = nullptr;
  if (is_const && const_elems * elem <= tir::kStackScratchBytes) {
    ref.ptr = entry_alloca(mt, i64(std::max<int64_t>(const_elems, 1)), buf.name.c_str());
  } else {
    llvm::Value* bytes = i64(elem);
    for (const Expr& d : buf.shape)
      bytes = b_.CreateMul(bytes, emit_as(d, DType::kInt64), "", false, true);
    // Cached per thread by the runtime (support/scratch.h): no malloc once warm.
    llvm::FunctionCallee alloc = m_.getOrInsertFunction(
        "kiln_scratch_alloc", llvm::FunctionType::get(b_.getPtrTy(), {b_.getInt64Ty()}, false));
    heap = b_.CreateCall(alloc, {bytes}, buf.name);
    heap_bytes = bytes;
    ref.ptr = heap;
  }
  std::optional<BufferRef> saved;
  if (auto it = frame_->scratch.find(buf.name); it != frame_->scratch.end()) saved = it->second;
  frame_->scratch[buf.name] = ref;
  if (heap) {
    // A null block (too large, or out of memory) skips the body; the runtime
    // counted the failure and reports it for the node (support/scratch.h).
    llvm::BasicBlock* body_bb = llvm::BasicBlock::Create(ctx_, "scratch.ok", frame_->fn);
    llvm::BasicBlock* done_bb = llvm::BasicBlock::Create(ctx_, "scratch.done", frame_->fn);
    b_.CreateCondBr(b_.CreateIsNotNull(heap), body_bb, done_bb);
    b_.SetInsertPoint(body_bb);
    emit_stmt(s->body);
    b_.CreateBr(done_bb);
    b_.SetInsertPoint(done_bb);
  } else {
    emit_stmt(s->body);
  }
  if (saved) frame_->scratch[buf.name] = *saved;
  else frame_->scratch.erase(buf.name);
  if (heap) {
    llvm::FunctionCallee free_fn = m_.getOrInsertFunction(
        "kiln_scratch_free", llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy(), b_.getInt64Ty()}, false));
    b_.CreateCall(free_fn, {heap, heap_bytes});
  }
}

void Emitter::emit_if(const tir::Stmt& s) {
  llvm::Value* cond = emit_as(s->cond, DType::kBool);
  llvm::BasicBlock* then_bb = llvm::BasicBlock::Create(ctx_, "if.then", frame_->fn);
  llvm::BasicBlock* else_bb = s->else_case ? llvm::BasicBlock::Create(ctx_, "if.else", frame_->fn) : nullptr;
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "if.end", frame_->fn);
  b_.CreateCondBr(cond, then_bb, else_bb ? else_bb : done);
  b_.SetInsertPoint(then_bb);
  emit_stmt(s->then_case);
  b_.CreateBr(done);
  if (else_bb) {
    b_.SetInsertPoint(else_bb);
    emit_stmt(s->else_case);
    b_.CreateBr(done);
  }
  b_.SetInsertPoint(done);
}

void Emitter::setup_function_attrs(llvm::Function* fn) {
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  if (!target_.cpu.empty()) fn->addFnAttr("target-cpu", target_.cpu);
  if (!target_.features.empty()) fn->addFnAttr("target-features", target_.features);
  fn->addFnAttr("prefer-vector-width", std::to_string(target_.vector_bits));
  fn->addFnAttr("min-legal-vector-width", "0");
}

// Tells LLVM a parameter buffer's base is 64-byte aligned (the runtime guarantees it).
llvm::Value* Emitter::assume_aligned(llvm::Value* ptr) {
  b_.CreateAlignmentAssumption(m_.getDataLayout(), ptr, 64);
  return ptr;
}

Status Emitter::emit_func(const tir::PrimFunc& f) {
  func_ = &f;
  error_ = Status::ok();
  if (m_.getFunction(f.name)) return internal_error() << "duplicate kernel name '" << f.name << "'";
  llvm::Type* ptr_t = b_.getPtrTy();
  llvm::FunctionType* ft = llvm::FunctionType::get(b_.getVoidTy(), {ptr_t, ptr_t}, false);
  llvm::Function* fn = llvm::Function::Create(ft, llvm::Function::ExternalLinkage, f.name, m_);
  setup_function_attrs(fn);
  fn->getArg(0)->setName("buffers");
  fn->getArg(1)->setName("syms");
  for (unsigned i = 0; i < 2; ++i) {
    fn->addParamAttr(i, llvm::Attribute::NoCapture);
    fn->addParamAttr(i, llvm::Attribute::ReadOnly);
  }

  Frame frame;
  frame.fn = fn;
  frame.entry = llvm::BasicBlock::Create(ctx_, "entry", fn);
  frame_ = &frame;
  b_.SetInsertPoint(frame.entry);

  // One alias scope per parameter whose name no other parameter has.
  std::map<std::string, int> name_count;
  for (const tir::Buffer& p : f.params) ++name_count[p.name];
  llvm::MDBuilder mdb(ctx_);
  llvm::MDNode* domain = mdb.createAnonymousAliasScopeDomain(f.name);
  alias_domain_ = domain;
  alias_scopes_.clear();
  std::vector<llvm::MDNode*> scopes(f.params.size(), nullptr);
  for (size_t i = 0; i < f.params.size(); ++i)
    if (name_count[f.params[i].name] == 1) {
      scopes[i] = mdb.createAnonymousAliasScope(domain, f.params[i].name);
      alias_scopes_.push_back(scopes[i]);
    }

  for (size_t i = 0; i < f.params.size(); ++i) {
    BufferRef ref;
    ref.buffer = &f.params[i];
    llvm::Value* slot = b_.CreateConstInBoundsGEP1_64(ptr_t, fn->getArg(0), i);
    llvm::LoadInst* p = b_.CreateAlignedLoad(ptr_t, slot, llvm::Align(8), f.params[i].name);
    ref.ptr = assume_aligned(p);
    if (scopes[i]) {
      ref.alias_scope = llvm::MDNode::get(ctx_, {scopes[i]});
      std::vector<llvm::Metadata*> others;
      for (size_t j = 0; j < scopes.size(); ++j)
        if (j != i && scopes[j]) others.push_back(scopes[j]);
      if (!others.empty()) ref.noalias = llvm::MDNode::get(ctx_, others);
    }
    frame.params.push_back(ref);
  }
  for (size_t j = 0; j < f.sym_names.size(); ++j) {
    llvm::Value* slot = b_.CreateConstInBoundsGEP1_64(b_.getInt64Ty(), fn->getArg(1), j);
    llvm::LoadInst* v = b_.CreateAlignedLoad(b_.getInt64Ty(), slot, llvm::Align(8), f.sym_names[j]);
    frame.vars[f.sym_names[j]] = v;
  }

  emit_stmt(f.body);
  b_.CreateRetVoid();
  frame_ = nullptr;
  if (!error_.is_ok()) return error_;
  std::string msg;
  llvm::raw_string_ostream os(msg);
  if (llvm::verifyFunction(*fn, &os)) {
    return internal_error() << "codegen of " << f.name << " produced invalid LLVM IR: " << os.str();
  }
  return Status::ok();
}

}  // namespace

Status emit_module(const std::vector<tir::PrimFunc>& funcs, const TargetInfo& target,
                   llvm::Module& module) {
  Emitter emitter(module, target);
  for (const tir::PrimFunc& f : funcs) KILN_RETURN_IF_ERROR(emitter.emit_func(f));
  std::string msg;
  llvm::raw_string_ostream os(msg);
  if (llvm::verifyModule(module, &os))
    return internal_error() << "codegen produced an invalid LLVM module: " << os.str();
  return Status::ok();
}

std::vector<RuntimeSymbol> runtime_symbols() {
  using D1 = double (*)(double);
  using D2 = double (*)(double, double);
  using F2 = float (*)(float, float);
  std::vector<RuntimeSymbol> symbols = {
      {"memset", reinterpret_cast<void*>(&::memset)},
      {"memcpy", reinterpret_cast<void*>(&::memcpy)},
      {"memmove", reinterpret_cast<void*>(&::memmove)},
      {"exp", reinterpret_cast<void*>(static_cast<D1>(&::exp))},
      {"log", reinterpret_cast<void*>(static_cast<D1>(&::log))},
      {"tanh", reinterpret_cast<void*>(static_cast<D1>(&::tanh))},
      {"erf", reinterpret_cast<void*>(static_cast<D1>(&::erf))},
      {"sin", reinterpret_cast<void*>(static_cast<D1>(&::sin))},
      {"cos", reinterpret_cast<void*>(static_cast<D1>(&::cos))},
      {"atan", reinterpret_cast<void*>(static_cast<D1>(&::atan))},
      {"asin", reinterpret_cast<void*>(static_cast<D1>(&::asin))},
      {"acos", reinterpret_cast<void*>(static_cast<D1>(&::acos))},
      {"pow", reinterpret_cast<void*>(static_cast<D2>(&::pow))},
      {"fmod", reinterpret_cast<void*>(static_cast<D2>(&::fmod))},
      {"fmodf", reinterpret_cast<void*>(static_cast<F2>(&::fmodf))},
  };
  for (const KernelCallback& c : kernel_callbacks()) symbols.push_back({c.name, c.address});
  return symbols;
}

}  // namespace kiln::codegen::detail
