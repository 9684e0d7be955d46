// kiln::Model (include/kiln/kiln.h), the compiler side: compiling a model
// (and again for empty dims or input values), its graph page, packages.
#include <map>
#include <sstream>

#include "driver/compile.h"
#include "driver/model_impl.h"
#include "frontend/onnx/import.h"
#include "ops/registry.h"
#include "package/write.h"

namespace kiln {

namespace {

// An input whose values a specialization binds: integer, static shape, at
// most 64 elements (shapes, sizes, axes computed by the caller).
bool is_small_int(DType t, const std::optional<Shape>& shape) {
  if ((t != DType::kInt64 && t != DType::kInt32) || !shape) return false;
  int64_t n = 1;
  for (const Expr& d : *shape) {
    auto c = d.as_const();
    if (!c) return false;
    n *= *c;
  }
  return n <= 64;
}

// Imports the model an Impl was made from; with empty_dims, every named
// input dim's lower bound becomes 0.
// With `bind`, the model specialized to those inputs: small integer inputs
// become constants of their values, the others get their static shapes.
Result<std::unique_ptr<Model::Impl>> build_impl(const std::string& path, const std::string& bytes,
                                         const std::string& source_name, const CompileOptions& options,
                                         bool empty_dims, const std::map<std::string, Tensor>* bind = nullptr) {
  auto import = [&] { return path.empty() ? import_onnx_bytes(bytes, source_name) : import_onnx_file(path); };
  auto adjust = [&](Graph& g) {
    if (empty_dims)
      for (auto& [name, bound] : g.bounds)
        if (bound.lo && *bound.lo > 0) bound.lo = 0;
    if (!bind) return;
    for (Value* v : g.inputs()) {
      if (v->is_constant()) continue;
      const Tensor& t = bind->at(v->name());
      if (is_small_int(v->dtype(), v->type().shape)) {
        v->set_constant(t.clone());  // the program is kept: never the caller's memory
        continue;
      }
      // A sequence or optional keeps its declared type (its element type; the
      // tensor given has no shape of its own to bind).
      if (v->type().is_container()) continue;
      Shape shape;
      for (int64_t d : t.shape()) shape.push_back(Expr(d));
      v->set_type(TensorType{v->dtype(), shape});
    }
  };
  driver::ModelSource source{path, bytes, source_name};
  auto compiled = driver::compile_model(source, options, adjust);
  if (!compiled.is_ok()) {
    if (bind || compiled.status().code() != StatusCode::kUnsupported) return compiled.status();
    // Deferred to run time when every op is supported, shape inference is
    // what fails, and input values could decide it.
    auto again = import();
    if (!again.is_ok()) return compiled.status();
    Graph& g = **again;
    bool small_input = false;
    for (const Value* v : g.inputs()) small_input |= !v->is_constant() && is_small_int(v->dtype(), v->type().shape);
    if (!small_input || !driver::check_supported(g).is_ok()) return compiled.status();
    ops::InferContext ctx;
    ctx.graph = &g;
    ctx.bounds = g.bounds;
    if (ops::infer_shapes(g, ctx).is_ok()) return compiled.status();
    auto impl = std::make_unique<Model::Impl>();
    impl->specialize = true;
    impl->rebuild = [p = impl.get()](bool empty, const std::map<std::string, Tensor>* values) {
      return build_impl(p->path, p->bytes, p->source_name, p->options, empty, values);
    };
    impl->general_error = compiled.status();
    for (const Value* v : g.inputs()) {
      if (v->is_constant()) continue;
      impl->compiled.inputs.push_back(driver::make_info(v));
      impl->bind_values.push_back(is_small_int(v->dtype(), v->type().shape));
      impl->input_ranks.push_back(v->type().is_container() ? -1 : v->type().rank());
    }
    for (const Value* v : g.outputs()) impl->compiled.outputs.push_back(driver::make_info(v));
    impl->compiled.graph = std::move(*again);
    impl->path = path;
    impl->bytes = bytes;
    impl->source_name = source_name;
    impl->options = options;
    return impl;
  }
  auto impl = std::make_unique<Model::Impl>();
  impl->rebuild = [p = impl.get()](bool empty, const std::map<std::string, Tensor>* values) {
    return build_impl(p->path, p->bytes, p->source_name, p->options, empty, values);
  };
  impl->compiled = std::move(*compiled);
  impl->vm = std::make_unique<runtime::VM>(impl->compiled.program, driver::resolve_threads(options.threads));
  impl->vm->set_memory_limit(options.max_memory_bytes);
  impl->path = path;
  impl->bytes = bytes;
  impl->source_name = source_name;
  impl->options = options;
  return impl;
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

Status Model::save(const std::string& path) const {
  if (impl_->package) return unsupported() << "this model was loaded from the package '" << impl_->path << "': copy that file";
  if (impl_->specialize) {
    return unsupported() << "this model is compiled at run time for each set of input shapes and values (its shapes "
                            "depend on them: "
                         << impl_->general_error.message() << "), so it cannot be packaged ahead of time";
  }
  std::string source = impl_->path.empty() ? impl_->source_name : impl_->path;
  // A model with named input dims also gets the program for empty ones
  // (what run() compiles on first need), so a package runs them too.
  const runtime::Program& p = *impl_->compiled.program;
  bool named_dims = false;
  for (int r : p.input_registers)
    for (const Expr& d : p.registers[static_cast<size_t>(r)].shape)
      if (d.is_var()) {
        auto b = p.bounds.find(d->name);
        named_dims |= b != p.bounds.end() && b->second.lo && *b->second.lo > 0;
      }
  std::lock_guard<std::mutex> lock(impl_->mu);  // run() makes empty_dims too
  if (named_dims && !impl_->empty_dims && impl_->rebuild) {
    auto relaxed = impl_->rebuild(true, nullptr);
    if (relaxed.is_ok()) impl_->empty_dims = std::move(*relaxed);
  }
  return package::write(path, impl_->compiled, source, impl_->empty_dims ? &impl_->empty_dims->compiled : nullptr);
}

std::string Model::graph_html() const { return impl_->compiled.graph ? driver::graph_html(impl_->compiled) : ""; }

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
