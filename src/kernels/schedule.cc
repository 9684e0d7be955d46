// schedule_kernels and lower_kernels: each kernel's schedule, then its loop IR.
#include "kernels/kernels.h"

#include <cstdio>

namespace kiln::kernels {

Status schedule_kernels(KernelSet& ks, bool naive) {
  for (Kernel& k : ks.kernels) {
    KernelChoiceInfo& info = k.info;
    info.kernel = k.func.name;
    info.node = (k.anchor ? k.anchor : k.root)->describe();
    if (k.choice) {
      info.impl = k.choice->candidate;
      info.knobs = tir::knobs_to_string(k.choice->knobs);
      info.source = k.choice->source;
      info.why = k.choice->why;
    } else {
      info.impl = naive ? "naive" : "default";
      info.source = naive ? "naive" : "no candidates";
    }
    if (naive) {
      k.schedule = tir::naive_schedule(k.canon.def);
    } else if (k.choice && k.choice->candidate == strategy::kGenericCandidate) {
      k.schedule = strategy::generic_schedule(k.canon.def, k.choice->knobs);
    } else {
      auto s = strategy::schedule_for(k.canon.def, k.anchor_stage, k.anchor);
      if (!s.is_ok()) return k.where->in_context(s.status().with_context(k.root->describe() + ": schedule"));
      k.schedule = std::move(*s);
    }
    info.schedule = k.schedule.to_string();
  }
  return Status::ok();
}

Status lower_kernels(KernelSet& ks, bool dump_ir) {
  for (Kernel& k : ks.kernels) {
    auto func = tir::lower(k.canon.def, k.schedule);
    if (!func.is_ok()) return k.where->in_context(func.status().with_context(k.root->describe() + ": lowering"));
    func->name = k.func.name;
    k.func = std::move(*func);
    if (dump_ir) std::fprintf(stderr, "%s\n", tir::print_func(k.func).c_str());
  }
  return Status::ok();
}

namespace {
// "// symbols s0 = batch, s1 = seq\n": the model's names of a canonical kernel's symbols.
std::string symbols_comment(const tir::CanonicalKernel& c) {
  if (c.symbols.empty()) return std::string();
  std::string out = "// symbols";
  for (size_t i = 0; i < c.symbols.size(); ++i) out += (i ? ", s" : " s") + std::to_string(i) + " = " + c.symbols[i];
  return out + "\n";
}
}  // namespace

std::string kernels_text(const KernelSet& ks) {
  std::string out;
  for (const Kernel& k : ks.kernels) {
    out += "// kernel " + k.func.name + " for " + k.root->describe() + "\n";
    if (k.choice) out += "// implementation " + k.info.impl + " (" + k.info.knobs + ") by " + k.info.source + "\n";
    out += symbols_comment(k.canon) + tir::print_kernel_def(k.canon.def) + "// schedule\n" + k.schedule.to_string() +
           "\n" + tir::print_func(k.func) + "\n";
  }
  return out;
}

}  // namespace kiln::kernels
