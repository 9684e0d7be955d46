// kiln::Model (include/kiln/kiln.h): import, compile, run.
#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "driver/pipeline.h"
#include "frontend/onnx/import.h"
#include "kiln/kiln.h"
#include "ops/registry.h"
#include "support/target.h"

namespace kiln {

struct Model::Impl {
  driver::CompiledProgram compiled;
  std::unique_ptr<runtime::VM> vm;
  std::mutex mu;  // run() is serialized: one VM, one arena
  // The model as given, to compile it again with relaxed assumptions.
  std::string path, bytes, source_name;
  CompileOptions options;
  // Named input dims are compiled as at least 1 (the import's bound: shape
  // proofs such as max(1, n) = n rely on it). A run that gives one of them 0
  // (an empty batch or sequence) runs on a second program compiled with those
  // dims at least 0, made on first need.
  std::unique_ptr<Impl> empty_dims;
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;


namespace {
// Imports the model an Impl was made from; with empty_dims, every named
// input dim's lower bound becomes 0.
Result<std::unique_ptr<Model::Impl>> build_impl(const std::string& path, const std::string& bytes,
                                         const std::string& source_name, const CompileOptions& options,
                                         bool empty_dims) {
  auto graph = path.empty() ? import_onnx_bytes(bytes, source_name) : import_onnx_file(path);
  if (!graph.is_ok()) return graph.status();
  if (empty_dims)
    for (auto& [name, bound] : (*graph)->bounds)
      if (bound.lo && *bound.lo > 0) bound.lo = 0;
  auto compiled = driver::compile_graph(std::move(*graph), options);
  if (!compiled.is_ok()) return compiled.status();
  auto impl = std::make_unique<Model::Impl>();
  impl->compiled = std::move(*compiled);
  impl->vm = std::make_unique<runtime::VM>(impl->compiled.program, driver::resolve_threads(options.threads));
  impl->vm->set_memory_limit(options.max_memory_bytes);
  impl->path = path;
  impl->bytes = bytes;
  impl->source_name = source_name;
  impl->options = options;
  return impl;
}

// True when an input gives a named dim a size below the bound the program
// was compiled with (0 for a dim compiled as at least 1).
bool below_lower_bounds(const runtime::Program& p, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size() && i < p.input_registers.size(); ++i) {
    const std::vector<Expr>& shape = p.registers[static_cast<size_t>(p.input_registers[i])].shape;
    if (!inputs[i].defined() || static_cast<size_t>(inputs[i].rank()) != shape.size()) continue;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!shape[d].is_var()) continue;
      auto it = p.bounds.find(shape[d]->name);
      if (it != p.bounds.end() && it->second.lo && inputs[i].shape()[d] >= 0 && inputs[i].shape()[d] < *it->second.lo)
        return true;
    }
  }
  return false;
}
}  // namespace

Result<Model> Model::compile_file(const std::string& path, const CompileOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, build_impl(path, "", "", options, false));
  return Model(std::move(impl));
}

Result<Model> Model::compile_bytes(const std::string& bytes, const CompileOptions& options,
                                   const std::string& source_name) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, build_impl("", bytes, source_name, options, false));
  return Model(std::move(impl));
}

const std::vector<TensorInfo>& Model::inputs() const { return impl_->compiled.inputs; }
const std::vector<TensorInfo>& Model::outputs() const { return impl_->compiled.outputs; }
const CompileStats& Model::stats() const { return impl_->compiled.stats; }
std::string Model::graph_text() const { return print_graph(*impl_->compiled.graph); }

Result<std::map<std::string, Tensor>> Model::run(const std::map<std::string, Tensor>& inputs) {
  const auto& infos = impl_->compiled.inputs;
  std::vector<Tensor> ordered;
  for (const TensorInfo& info : infos) {
    auto it = inputs.find(info.name);
    if (it == inputs.end()) return invalid_argument() << "missing input '" << info.name << "'";
    ordered.push_back(it->second);
  }
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const TensorInfo& info : infos) known |= info.name == name;
    if (!known) {
      std::ostringstream os;
      for (size_t i = 0; i < infos.size(); ++i) os << (i ? ", " : "") << "'" << infos[i].name << "'";
      return invalid_argument() << "unknown input '" << name << "' (the model's inputs: " << os.str() << ")";
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  runtime::VM* vm = impl_->vm.get();
  if (below_lower_bounds(*impl_->compiled.program, ordered)) {
    if (!impl_->empty_dims) {
      auto relaxed = build_impl(impl_->path, impl_->bytes, impl_->source_name, impl_->options, true);
      if (!relaxed.is_ok()) return relaxed.status().with_context("compiling for inputs with empty dims");
      impl_->empty_dims = std::move(*relaxed);
    }
    vm = impl_->empty_dims->vm.get();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, vm->run(ordered));
  std::map<std::string, Tensor> result;
  for (size_t i = 0; i < outs.size(); ++i) result[impl_->compiled.outputs[i].name] = std::move(outs[i]);
  return result;
}

std::string Model::kernels_text() const {
  std::ostringstream os;
  const Target& t = Target::host();
  os << "tuned for target " << t.name << " (" << t.vector_bytes << "-byte vectors x " << t.vector_registers
     << " registers" << (t.split_fma() ? ", " + std::to_string(t.fma_bytes) + "-byte FMA datapath" : "") << ")\n";
  for (const driver::KernelChoiceInfo& k : impl_->compiled.kernel_choices) {
    os << k.kernel << "  " << k.node << "\n    " << k.impl;
    if (!k.knobs.empty()) os << " (" << k.knobs << ")";
    os << "  by " << k.source;
    if (!k.why.empty()) os << ": " << k.why;
    os << "\n";
  }
  return os.str();
}

Result<std::string> Model::profile(const std::map<std::string, Tensor>& inputs, int runs) {
  // Warm up once without timing.
  KILN_RETURN_IF_ERROR(run(inputs).status());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->vm->set_profiling(true);
  }
  for (int i = 0; i < runs; ++i) {
    auto r = run(inputs);
    if (!r.is_ok()) {
      impl_->vm->set_profiling(false);
      return r.status();
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  const runtime::Program& prog = impl_->vm->program();
  std::vector<runtime::VM::InstrProfile> prof = impl_->vm->profile();
  impl_->vm->set_profiling(false);
  std::vector<size_t> order(prof.size());
  double total = 0;
  for (size_t i = 0; i < prof.size(); ++i) {
    order[i] = i;
    total += prof[i].seconds;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prof[a].seconds > prof[b].seconds; });
  std::ostringstream os;
  os << std::fixed;
  os.precision(3);
  os << "total " << total * 1e3 / std::max(runs, 1) << " ms per run over " << runs << " runs, "
     << prog.instrs.size() << " instructions\n";
  os << "  ms/run   share  instruction\n";
  for (size_t i : order) {
    if (prof[i].calls == 0) continue;
    const runtime::Instr& in = prog.instrs[i];
    std::string what;
    switch (in.op) {
      case runtime::OpCode::kCall: what = prog.kernels[in.callee].name; break;
      case runtime::OpCode::kCallHost: what = "host kernel"; break;
      case runtime::OpCode::kView: what = "view"; break;
      case runtime::OpCode::kBind: what = "in place"; break;
      case runtime::OpCode::kShapeOf: what = "shape"; break;
      case runtime::OpCode::kCopy: what = "copy"; break;
      case runtime::OpCode::kCheckIndices: what = "index check"; break;
      case runtime::OpCode::kCheckBroadcast: what = "broadcast check"; break;
      default: what = "control"; break;
    }
    double ms = prof[i].seconds * 1e3 / std::max(runs, 1);
    os.width(8);
    os << ms << "  ";
    os.width(5);
    os.precision(1);
    os << (total > 0 ? 100.0 * prof[i].seconds / total : 0.0) << "%  " << what << "  (" << in.where << ")\n";
    os.precision(3);
  }
  return os.str();
}

Result<std::string> describe_model_file(const std::string& path) {
  auto graph = import_onnx_file(path);
  if (!graph.is_ok()) return graph.status();
  Graph& g = **graph;
  std::ostringstream os;
  os << "model: " << path << "\n";
  os << "opsets:";
  for (const auto& [domain, v] : g.opsets) os << " " << (domain.empty() ? "ai.onnx" : domain) << "=" << v;
  os << "\n";
  Status supported = driver::check_supported(g);
  ops::InferContext ctx;
  ctx.graph = &g;
  ctx.bounds = g.bounds;
  Status inferred = supported.is_ok() ? ops::infer_shapes(g, ctx) : supported;
  os << "inputs:\n";
  for (const Value* v : g.inputs())
    if (!v->is_constant()) os << "  " << v->name() << ": " << v->type().to_string() << "\n";
  os << "outputs:\n";
  for (const Value* v : g.outputs()) os << "  " << v->name() << ": " << v->type().to_string() << "\n";
  std::map<std::string, int> histogram;
  for (const Node* n : g.nodes()) histogram[n->domain().empty() ? n->op_type() : n->domain() + ":" + n->op_type()]++;
  os << "ops (" << g.num_nodes() << " nodes):\n";
  for (const auto& [op, count] : histogram) os << "  " << op << ": " << count << "\n";
  int64_t params = 0;
  for (const Value* v : g.constants()) params += v->constant().numel();
  os << "constants: " << g.constants().size() << " tensors, " << params << " elements\n";
  if (!inferred.is_ok()) os << "shape inference stopped: " << inferred.to_string() << "\n";
  os << "values:\n";
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs())
      if (v) os << "  " << v->name() << ": " << v->type().to_string() << "    (" << n->describe() << ")\n";
  return os.str();
}

}  // namespace kiln
