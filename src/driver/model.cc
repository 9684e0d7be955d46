// kiln::Model (include/kiln/kiln.h), the run side: running, profiles,
// traces and loading packages. It needs no compiler (libkiln_runtime links
// it); compiling again for empty dims or input values goes through
// Impl::rebuild, set by the compiler side (driver/compiled_model.cc).
#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "driver/model_impl.h"
#include "support/json.h"
#include "support/target.h"
#include "support/trace.h"

namespace kiln {

namespace driver {
int resolve_threads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}
}  // namespace driver

namespace {
constexpr size_t kMaxSpecializations = 16;

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

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Result<Model> Model::load(const std::string& path, const CompileOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<package::Loaded> loaded, package::load(path));
  // The model's program, or its empty-dims one (whose kernels the library
  // names with a prefix), ready to run.
  auto make = [&](const std::shared_ptr<runtime::Program>& program, const std::string& kernel_prefix) {
    auto impl = std::make_unique<Impl>();
    const package::Contents& c = loaded->contents;
    impl->compiled.program = program;
    impl->compiled.inputs = c.inputs;
    impl->compiled.outputs = c.outputs;
    impl->compiled.kernel_choices = c.kernel_choices;
    for (kernels::KernelChoiceInfo& k : impl->compiled.kernel_choices) k.kernel = kernel_prefix + k.kernel;
    impl->compiled.stats = c.stats;
    impl->compiled.stats.compile_seconds = 0;
    impl->package = loaded;
    impl->vm = std::make_unique<runtime::VM>(program, driver::resolve_threads(options.threads));
    impl->vm->set_memory_limit(options.max_memory_bytes);
    return impl;
  };
  std::unique_ptr<Impl> impl = make(loaded->contents.program, "");
  if (loaded->contents.empty_dims) impl->empty_dims = make(loaded->contents.empty_dims, package::kEmptyDimsPrefix);
  impl->path = path;
  impl->options = options;
  return Model(std::move(impl));
}

bool Model::is_package_file(const std::string& path) { return package::is_package_file(path); }

bool Model::is_package() const { return impl_->package != nullptr; }

std::string Model::package_metadata() const { return impl_->package ? impl_->package->contents.metadata_json : ""; }

const std::vector<TensorInfo>& Model::inputs() const { return impl_->compiled.inputs; }
const std::vector<TensorInfo>& Model::outputs() const { return impl_->compiled.outputs; }
const CompileStats& Model::stats() const { return impl_->compiled.stats; }
std::string Model::graph_text() const { return impl_->compiled.graph ? print_graph(*impl_->compiled.graph) : ""; }

namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  auto a0 = reinterpret_cast<uintptr_t>(a.data()), b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + static_cast<uintptr_t>(b.nbytes()) && b0 < a0 + static_cast<uintptr_t>(a.nbytes());
}

}  // namespace

Result<std::map<std::string, Tensor>> Model::run(const std::map<std::string, Tensor>& inputs) {
  return run_checked(inputs, nullptr);
}

Status Model::run_into(const std::map<std::string, Tensor>& inputs, std::map<std::string, Tensor>& outputs) {
  const auto& outs = impl_->compiled.outputs;
  for (const auto& [name, buffer] : outputs) {
    bool known = false;
    for (const TensorInfo& info : outs) known |= info.name == name;
    if (!known) {
      std::ostringstream os;
      for (size_t i = 0; i < outs.size(); ++i) os << (i ? ", " : "") << "'" << outs[i].name << "'";
      return invalid_argument() << "unknown output '" << name << "' (the model's outputs: " << os.str() << ")";
    }
    if (!buffer.defined()) return invalid_argument() << "output '" << name << "': no buffer given";
    for (const auto& [in_name, in] : inputs)
      if (in.defined() && !dtype_is_container(in.dtype()) && overlaps(buffer, in))
        return invalid_argument() << "output '" << name << "': the buffer given overlaps input '" << in_name << "'";
    for (const auto& [other_name, other] : outputs)
      if (other_name < name && other.defined() && overlaps(buffer, other))
        return invalid_argument() << "output '" << name << "': the buffer given overlaps output '" << other_name << "'";
  }
  KILN_ASSIGN_OR_RETURN(auto result, run_checked(inputs, &outputs));
  for (auto& [name, t] : result)
    if (!outputs.count(name)) outputs[name] = std::move(t);
  return Status::ok();
}

Result<std::map<std::string, Tensor>> Model::run_checked(const std::map<std::string, Tensor>& inputs,
                                                         const std::map<std::string, Tensor>* into) {
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
  if (impl_->specialize) return run_specialized(inputs, into);
  if (below_lower_bounds(*impl_->compiled.program, ordered)) {
    if (!impl_->empty_dims) {
      if (!impl_->rebuild) {
        return invalid_argument() << "an input gives a named dim the size 0, and this package holds no program for "
                                     "empty dims (compiling it failed when the package was written)";
      }
      auto relaxed = impl_->rebuild(true, nullptr);
      if (!relaxed.is_ok()) return relaxed.status().with_context("compiling for inputs with empty dims");
      impl_->empty_dims = std::move(*relaxed);
    }
    return run_on(*impl_->empty_dims, inputs, into);
  }
  return run_on(*impl_, inputs, into);
}

// A model whose shapes depend on input values (Impl::specialize): the
// program compiled for these inputs' shapes and small integer values, made
// on first need. The caller holds impl_->mu.
Result<std::shared_ptr<Model::Impl>> Model::specialization(const std::map<std::string, Tensor>& inputs) {
  std::string key;
  for (size_t i = 0; i < impl_->compiled.inputs.size(); ++i) {
    const TensorInfo& info = impl_->compiled.inputs[i];
    auto found = inputs.find(info.name);
    if (found == inputs.end()) return invalid_argument() << "missing input '" << info.name << "'";
    const Tensor& t = found->second;
    if (!t.defined() || t.dtype() != info.dtype) {
      return invalid_argument() << "input '" << info.name << "': dtype " << (t.defined() ? dtype_name(t.dtype()) : "none")
                                << ", the model takes " << dtype_name(info.dtype);
    }
    // The declared rank (a scalar's too: a one-element tensor is not a scalar).
    if (impl_->input_ranks[i] >= 0 && t.rank() != impl_->input_ranks[i]) {
      return invalid_argument() << "input '" << info.name << "': rank " << t.rank() << ", the model takes "
                                << impl_->input_ranks[i];
    }
    for (size_t d = 0; d < info.dims.size(); ++d) {
      const std::string& dim = info.dims[d];
      bool digits = !dim.empty() && dim.find_first_not_of("0123456789") == std::string::npos;
      if (digits && std::to_string(t.shape()[d]) != dim) {
        return invalid_argument() << "input '" << info.name << "': dim " << d << " is " << t.shape()[d]
                                  << ", the model takes " << dim;
      }
    }
    key += info.name + ":" + shape_to_string(t.shape());
    if (impl_->bind_values[i]) {
      key += "=";
      for (int64_t e = 0; e < t.numel(); ++e)
        key += std::to_string(t.dtype() == DType::kInt64 ? t.data_as<int64_t>()[e] : t.data_as<int32_t>()[e]) + ",";
    }
    key += ";";
  }
  auto it = impl_->specialized.find(key);
  if (it == impl_->specialized.end()) {
    if (!impl_->rebuild) return internal_error() << "a model without its compiler needs a specialization";
    auto built = impl_->rebuild(false, &inputs);
    if (!built.is_ok()) {
      return built.status().with_context("compiling for these inputs' values (the model's shapes depend on them: " +
                                         impl_->general_error.message() + ")");
    }
    if (impl_->specialized_order.size() >= kMaxSpecializations) {
      impl_->specialized.erase(impl_->specialized_order.front());
      impl_->specialized_order.erase(impl_->specialized_order.begin());
    }
    impl_->specialized_order.push_back(key);
    it = impl_->specialized.emplace(key, std::shared_ptr<Impl>(std::move(*built))).first;
  }
  return it->second;
}

Result<std::map<std::string, Tensor>> Model::run_specialized(const std::map<std::string, Tensor>& inputs,
                                                             const std::map<std::string, Tensor>* into) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Impl> spec, specialization(inputs));
  return run_on(*spec, inputs, into);
}

// Runs the program of `spec` (the model's own, its empty-dims or a
// specialization; the caller holds the model's mutex).
Result<std::map<std::string, Tensor>> Model::run_on(Impl& spec, const std::map<std::string, Tensor>& inputs,
                                                    const std::map<std::string, Tensor>* into) {
  std::vector<Tensor> ordered;
  for (const TensorInfo& info : spec.compiled.inputs) ordered.push_back(inputs.at(info.name));
  const std::vector<TensorInfo>& outs = spec.compiled.outputs;
  // The caller's buffers by output position (undefined where none is given).
  std::vector<Tensor> buffers(into ? outs.size() : 0);
  for (size_t i = 0; i < buffers.size(); ++i)
    if (auto it = into->find(outs[i].name); it != into->end()) buffers[i] = it->second;
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> values, spec.vm->run(ordered, into ? &buffers : nullptr));
  std::map<std::string, Tensor> result;
  for (size_t i = 0; i < values.size(); ++i) result[outs[i].name] = std::move(values[i]);
  return result;
}

std::string Model::kernels_text() const {
  std::ostringstream os;
  const Target& t = Target::host();
  os << "tuned for target " << t.name << " (" << t.vector_bytes << "-byte vectors x " << t.vector_registers
     << " registers" << (t.split_fma() ? ", " + std::to_string(t.fma_bytes) + "-byte FMA datapath" : "") << ")\n";
  if (impl_->specialize) {
    os << "compiled at run time for each distinct set of input shapes and small integer input values (the model's "
          "shapes depend on them: "
       << impl_->general_error.message() << ")\n";
  }
  for (const driver::KernelChoiceInfo& k : impl_->compiled.kernel_choices) {
    os << k.kernel << "  " << k.node << "\n    " << k.impl;
    if (!k.knobs.empty()) os << " (" << k.knobs << ")";
    os << "  by " << k.source;
    if (!k.why.empty()) os << ": " << k.why;
    os << "\n";
  }
  return os.str();
}

namespace {

// What an instruction is, for the profile's table and the trace's span names.
std::string instruction_label(const runtime::Program& prog, const runtime::Instr& in) {
  switch (in.op) {
    case runtime::OpCode::kCall: return prog.kernels[in.callee].name;
    case runtime::OpCode::kCallHost: return "host kernel";
    case runtime::OpCode::kView: return "view";
    case runtime::OpCode::kBind: return "in place";
    case runtime::OpCode::kShapeOf: return "shape";
    case runtime::OpCode::kCopy: return "copy";
    case runtime::OpCode::kCheckIndices: return "index check";
    case runtime::OpCode::kCheckBroadcast: return "broadcast check";
    default: return "control";
  }
}

// The Chrome trace event format ("X" complete events, microseconds), which
// chrome://tracing and Perfetto open.
Status write_trace(const std::string& path, const runtime::Program& prog,
                   const std::vector<driver::KernelChoiceInfo>& choices, const std::vector<trace::Span>& spans) {
  std::map<std::string, const driver::KernelChoiceInfo*> by_kernel;
  for (const auto& c : choices) by_kernel[c.kernel] = &c;
  int64_t origin = spans.empty() ? 0 : spans.front().begin_ns;
  for (const trace::Span& s : spans) origin = std::min(origin, s.begin_ns);
  std::ostringstream os;
  os << std::fixed;
  os.precision(3);
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  std::set<std::pair<int32_t, bool>> threads;
  bool first = true;
  for (const trace::Span& s : spans) {
    const runtime::Instr& in = prog.instrs[static_cast<size_t>(s.label)];
    std::string name = instruction_label(prog, in);
    threads.insert({s.thread, s.worker});
    os << (first ? "" : ",\n") << "{\"name\": " << json_quote(name) << ", \"cat\": \""
       << (in.op == runtime::OpCode::kCall ? "kernel" : "runtime") << (s.worker ? " chunk" : "")
       << "\", \"ph\": \"X\", \"pid\": 1, \"tid\": " << s.thread << ", \"ts\": " << (s.begin_ns - origin) / 1e3
       << ", \"dur\": " << (s.end_ns - s.begin_ns) / 1e3 << ", \"args\": {\"node\": " << json_quote(in.where);
    auto it = in.op == runtime::OpCode::kCall ? by_kernel.find(name) : by_kernel.end();
    if (it != by_kernel.end()) {
      const driver::KernelChoiceInfo& c = *it->second;
      os << ", \"impl\": " << json_quote(c.impl) << ", \"knobs\": " << json_quote(c.knobs)
         << ", \"source\": " << json_quote(c.source) << ", \"workload\": " << json_quote(c.workload);
    }
    os << "}}";
    first = false;
  }
  for (const auto& [tid, worker] : threads) {
    os << (first ? "" : ",\n") << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << tid
       << ", \"args\": {\"name\": " << json_quote(worker ? "worker " + std::to_string(tid) : "caller " + std::to_string(tid))
       << "}}";
    first = false;
  }
  os << "\n]}\n";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return io_error() << "cannot write the trace to '" << path << "'";
  f << os.str();
  f.close();
  if (!f) return io_error() << "writing the trace to '" << path << "' failed";
  return Status::ok();
}

}  // namespace

Result<std::string> Model::profile(const std::map<std::string, Tensor>& inputs, int runs,
                                   const std::string& trace_path) {
  // Warm up once without timing.
  KILN_RETURN_IF_ERROR(run(inputs).status());
  runtime::VM* vm = impl_->vm.get();
  // A value-specialized model: the program for these inputs, held here, so
  // a concurrent run that evicts it from the cache (16 kept) cannot free it
  // while it is timed, and run directly (run() would compile it anew once
  // evicted, and time nothing here).
  std::shared_ptr<Impl> spec;
  if (impl_->specialize) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    KILN_ASSIGN_OR_RETURN(spec, specialization(inputs));
    vm = spec->vm.get();
  }
  trace::Recorder recorder;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    vm->set_profiling(true);
    if (!trace_path.empty()) vm->set_trace(&recorder);
  }
  for (int i = 0; i < runs; ++i) {
    Status st = Status::ok();
    if (spec) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      st = run_on(*spec, inputs).status();
    } else {
      st = run(inputs).status();
    }
    if (!st.is_ok()) {
      std::lock_guard<std::mutex> lock(impl_->mu);
      vm->set_profiling(false);
      vm->set_trace(nullptr);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  const runtime::Program& prog = vm->program();
  std::vector<runtime::VM::InstrProfile> prof = vm->profile();
  vm->set_profiling(false);
  vm->set_trace(nullptr);
  if (!trace_path.empty()) {
    const auto& choices = spec ? spec->compiled.kernel_choices : impl_->compiled.kernel_choices;
    KILN_RETURN_IF_ERROR(write_trace(trace_path, prog, choices, recorder.take()));
  }
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
    std::string what = instruction_label(prog, in);
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

}  // namespace kiln
