// ORC LLJIT for the host: detect the CPU and its features, translate the
// PrimFuncs (codegen.cc), optimize with the new pass manager at the requested
// level, then hand the module to the JIT and resolve every kernel's address.

#include "codegen/llvm/jit.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "codegen/llvm/codegen_internal.h"
#include "support/cpu_features.h"
#include "support/kernel_abi.h"

#include <llvm/ADT/StringMap.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/OptimizationLevel.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>

namespace kiln::codegen {

namespace {

void initialize_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

Status to_status(llvm::Error err, const char* what) {
  return internal_error() << what << ": " << llvm::toString(std::move(err));
}

// Widest vector register the enabled features give, in bits.
int vector_bits_of(const std::vector<std::string>& features, const llvm::Triple& triple) {
  auto has = [&](const char* f) {
    return std::find(features.begin(), features.end(), std::string("+") + f) != features.end();
  };
  if (triple.isX86()) {
    if (has("avx512f")) return 512;
    if (has("avx") || has("avx2")) return 256;
  }
  return 128;
}

void optimize(llvm::Module& module, llvm::TargetMachine* tm, int opt_level) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopUnrolling = opt_level >= 2;
  pto.LoopVectorization = opt_level >= 2;
  pto.SLPVectorization = opt_level >= 2;
  llvm::PassBuilder pb(tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::OptimizationLevel level = opt_level <= 0   ? llvm::OptimizationLevel::O0
                                  : opt_level == 1 ? llvm::OptimizationLevel::O1
                                  : opt_level == 2 ? llvm::OptimizationLevel::O2
                                                   : llvm::OptimizationLevel::O3;
  llvm::ModulePassManager mpm = opt_level <= 0 ? pb.buildO0DefaultPipeline(level)
                                               : pb.buildPerModuleDefaultPipeline(level);
  mpm.run(module, mam);
}

// LLVM's diagnostics: errors are collected (and become a Status); warnings and
// remarks, such as "loop not vectorized" for a vectorized loop that is not
// innermost, are dropped instead of printed.
struct Diagnostics {
  std::mutex mu;
  std::string errors;

  static void handle(const llvm::DiagnosticInfo* info, void* context) {
    if (info->getSeverity() != llvm::DS_Error) return;
    auto* self = static_cast<Diagnostics*>(context);
    std::string text;
    llvm::raw_string_ostream os(text);
    llvm::DiagnosticPrinterRawOStream printer(os);
    info->print(printer);
    std::lock_guard<std::mutex> lock(self->mu);
    if (!self->errors.empty()) self->errors += "; ";
    self->errors += os.str();
  }
  std::string take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::exchange(errors, {});
  }
};

class JitModule : public CompiledModule {
 public:
  KernelFn lookup(const std::string& name) const override {
    auto it = kernels_.find(name);
    return it == kernels_.end() ? nullptr : it->second;
  }
  const std::string& llvm_ir() const override { return ir_; }

  std::shared_ptr<Diagnostics> diagnostics_;  // outlives the JIT's LLVMContext
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  std::map<std::string, KernelFn> kernels_;
  std::string ir_;
};

// The host's target machine builder at the options' optimization level.
Result<llvm::orc::JITTargetMachineBuilder> host_machine(const CodegenOptions& options) {
  initialize_llvm();
  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) return to_status(jtmb.takeError(), "detecting the host target");
  jtmb->setCodeGenOptLevel(options.opt_level >= 3   ? llvm::CodeGenOptLevel::Aggressive
                           : options.opt_level <= 0 ? llvm::CodeGenOptLevel::None
                                                    : llvm::CodeGenOptLevel::Default);
  return std::move(*jtmb);
}

// Translates `funcs` into `module` for the machine `tm` (built by `jtmb`);
// with `slots`, calls to Kiln's functions go through pointer variables
// (support/kernel_abi.h); then optimizes.
Status build_module(const std::vector<tir::PrimFunc>& funcs, const CodegenOptions& options,
                    const llvm::orc::JITTargetMachineBuilder& jtmb, llvm::TargetMachine& tm, llvm::Module& module,
                    Diagnostics& diagnostics, bool slots) {
  module.setDataLayout(tm.createDataLayout());
  module.setTargetTriple(tm.getTargetTriple().str());
  detail::TargetInfo target;
  target.cpu = jtmb.getCPU();
  std::vector<std::string> features = jtmb.getFeatures().getFeatures();
  target.features = jtmb.getFeatures().getString();
  target.vector_bits = vector_bits_of(features, tm.getTargetTriple());
  KILN_RETURN_IF_ERROR(detail::emit_module(funcs, target, module));
  if (slots) {
    for (const KernelCallback& c : kernel_callbacks()) {
      llvm::Function* fn = module.getFunction(c.name);
      if (fn == nullptr) continue;
      auto* slot = new llvm::GlobalVariable(module, fn->getType(), false, llvm::GlobalValue::ExternalLinkage,
                                            llvm::ConstantPointerNull::get(fn->getType()),
                                            std::string(kKernelSlotPrefix) + c.name);
      std::vector<llvm::User*> users(fn->user_begin(), fn->user_end());
      for (llvm::User* u : users) {
        auto* call = llvm::dyn_cast<llvm::CallInst>(u);
        if (call == nullptr || call->getCalledOperand() != fn)
          return internal_error() << "codegen: " << c.name << " is used other than as a callee";
        llvm::IRBuilder<> b(call);
        call->setCalledOperand(b.CreateLoad(fn->getType(), slot, c.name));
      }
      fn->eraseFromParent();
    }
  }
  optimize(module, &tm, options.opt_level);
  if (std::string errors = diagnostics.take(); !errors.empty())
    return internal_error() << "LLVM optimization failed: " << errors;
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CompiledModule>> compile(const std::vector<tir::PrimFunc>& funcs,
                                                const CodegenOptions& options) {
  KILN_ASSIGN_OR_RETURN(llvm::orc::JITTargetMachineBuilder jtmb, host_machine(options));
  auto tm = jtmb.createTargetMachine();
  if (!tm) return to_status(tm.takeError(), "creating the target machine");

  auto result = std::make_unique<JitModule>();
  result->diagnostics_ = std::make_shared<Diagnostics>();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  ctx->setDiagnosticHandlerCallBack(&Diagnostics::handle, result->diagnostics_.get());
  auto module = std::make_unique<llvm::Module>("kiln", *ctx);
  KILN_RETURN_IF_ERROR(build_module(funcs, options, jtmb, **tm, *module, *result->diagnostics_, false));
  {
    llvm::raw_string_ostream os(result->ir_);
    module->print(os, nullptr);
  }
  if (options.dump_ir) std::fprintf(stderr, "%s\n", result->ir_.c_str());

  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create();
  if (!jit) return to_status(jit.takeError(), "creating the JIT");
  llvm::orc::JITDylib& dylib = (*jit)->getMainJITDylib();
  llvm::orc::SymbolMap symbols;
  for (const detail::RuntimeSymbol& s : detail::runtime_symbols()) {
    symbols[(*jit)->mangleAndIntern(s.name)] = llvm::orc::ExecutorSymbolDef(
        llvm::orc::ExecutorAddr::fromPtr(s.address),
        llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable);
  }
  if (auto err = dylib.define(llvm::orc::absoluteSymbols(std::move(symbols))))
    return to_status(std::move(err), "defining runtime symbols");
  // Anything else the optimizer introduces (libm, libc) resolves in this process.
  auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!generator) return to_status(generator.takeError(), "searching process symbols");
  dylib.addGenerator(std::move(*generator));
  // Compiler-runtime helpers LLVM may call (double -> half conversion on hosts
  // without AVX512-FP16) live in libgcc_s; a host that loaded Kiln with
  // RTLD_LOCAL (Python) keeps them out of the process-wide search above.
  auto runtime_lib = llvm::orc::DynamicLibrarySearchGenerator::Load(
      "libgcc_s.so.1", (*jit)->getDataLayout().getGlobalPrefix(),
      [](const llvm::orc::SymbolStringPtr& name) { return (*name).starts_with("__"); });
  if (runtime_lib)
    dylib.addGenerator(std::move(*runtime_lib));
  else
    llvm::consumeError(runtime_lib.takeError());  // then only the process search applies

  if (auto err = (*jit)->addIRModule(llvm::orc::ThreadSafeModule(std::move(module), std::move(ctx))))
    return to_status(std::move(err), "adding the module to the JIT");
  for (const tir::PrimFunc& f : funcs) {
    auto addr = (*jit)->lookup(f.name);
    if (!addr) return to_status(addr.takeError(), ("looking up kernel " + f.name).c_str());
    result->kernels_[f.name] = addr->toPtr<KernelFn>();
  }
  if (std::string errors = result->diagnostics_->take(); !errors.empty())
    return internal_error() << "LLVM code generation failed: " << errors;
  result->jit_ = std::move(*jit);
  return Result<std::unique_ptr<CompiledModule>>(std::move(result));
}

Result<ObjectCode> compile_object(const std::vector<tir::PrimFunc>& funcs, const CodegenOptions& options) {
  KILN_ASSIGN_OR_RETURN(llvm::orc::JITTargetMachineBuilder jtmb, host_machine(options));
  jtmb.setRelocationModel(llvm::Reloc::PIC_);
  auto tm = jtmb.createTargetMachine();
  if (!tm) return to_status(tm.takeError(), "creating the target machine");
  Diagnostics diagnostics;
  llvm::LLVMContext ctx;
  ctx.setDiagnosticHandlerCallBack(&Diagnostics::handle, &diagnostics);
  llvm::Module module("kiln", ctx);
  module.setPICLevel(llvm::PICLevel::BigPIC);
  KILN_RETURN_IF_ERROR(build_module(funcs, options, jtmb, **tm, module, diagnostics, true));
  if (options.dump_ir) module.print(llvm::errs(), nullptr);
  ObjectCode out;
  {
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream os(buffer);
    llvm::legacy::PassManager pm;
    if ((*tm)->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
      return internal_error() << "the target cannot emit object files";
    pm.run(module);
    out.bytes.assign(buffer.begin(), buffer.end());
  }
  if (std::string errors = diagnostics.take(); !errors.empty())
    return internal_error() << "LLVM code generation failed: " << errors;
  out.cpu = jtmb.getCPU();
  const std::vector<std::string>& checked = checked_cpu_features();
  for (const std::string& f : jtmb.getFeatures().getFeatures())
    if (f.size() > 1 && f[0] == '+' && std::binary_search(checked.begin(), checked.end(), f.substr(1)))
      out.cpu_features.push_back(f.substr(1));
  std::sort(out.cpu_features.begin(), out.cpu_features.end());
  return out;
}

std::string host_target_string() {
  initialize_llvm();
  static const std::set<std::string> kRelevant = {
      "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512cd", "avx512bw", "avx512dq",
      "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avx512vbmi", "avx512ifma",
      "avxvnni", "amx-tile", "amx-int8", "amx-bf16", "neon", "sve", "sve2", "dotprod",
      "fullfp16", "bf16", "i8mm"};
  llvm::Triple triple(llvm::sys::getProcessTriple());
  std::string s = triple.getArchName().str() + "-" + llvm::sys::getHostCPUName().str();
  std::vector<std::string> enabled;
  for (const auto& entry : llvm::sys::getHostCPUFeatures())
    if (entry.getValue() && kRelevant.count(entry.getKey().str())) enabled.push_back(entry.getKey().str());
  std::sort(enabled.begin(), enabled.end());
  for (const std::string& f : enabled) s += "+" + f;
  return s;
}

}  // namespace kiln::codegen
