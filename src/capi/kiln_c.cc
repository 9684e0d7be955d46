// Kiln's C API (include/kiln/kiln_c.h) over kiln::Model. Built twice: into
// libkiln (the compiler inside) and, with KILN_C_RUNTIME_ONLY, into
// libkiln_runtime, where only packages load and kiln_compile_* say so.
#include "kiln/kiln_c.h"

#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "kiln/kiln.h"

struct kiln_status {
  kiln_code code;
  std::string message;
};

struct kiln_options {
  kiln::CompileOptions options;
};

struct kiln_model {
  explicit kiln_model(kiln::Model m) : model(std::move(m)) {
    auto describe = [](const std::vector<kiln::TensorInfo>& infos, std::vector<Info>& out) {
      out.resize(infos.size());
      for (size_t i = 0; i < infos.size(); ++i) {
        Info& info = out[i];
        info.name = infos[i].name;
        info.dtype = kiln::dtype_is_container(infos[i].dtype) || infos[i].dtype == kiln::DType::kString
                         ? 0
                         : static_cast<int32_t>(infos[i].dtype);
        info.dim_names = infos[i].dims;
        for (const std::string& d : info.dim_names) {
          char* end = nullptr;
          long long v = std::strtoll(d.c_str(), &end, 10);
          info.dims.push_back(!d.empty() && end != nullptr && *end == '\0' ? v : -1);
        }
        for (const std::string& d : info.dim_names) info.dim_name_ptrs.push_back(d.c_str());
      }
    };
    describe(model.inputs(), inputs);
    describe(model.outputs(), outputs);
  }
  struct Info {
    std::string name;
    int32_t dtype = 0;
    std::vector<int64_t> dims;
    std::vector<std::string> dim_names;
    std::vector<const char*> dim_name_ptrs;
  };
  kiln::Model model;
  std::vector<Info> inputs, outputs;
};

struct kiln_result {
  std::map<std::string, kiln::Tensor> outputs;  // Kiln-allocated outputs, alive until kiln_result_free
};

namespace {

// Returned when even an error cannot be allocated: never NULL (which would
// read as success), never freed.
kiln_status g_out_of_memory{KILN_RESOURCE_EXHAUSTED, "resource exhausted: out of memory"};

kiln_status* make_status(kiln_code code, std::string message) {
  try {
    return new kiln_status{code, std::move(message)};
  } catch (const std::bad_alloc&) {
    return &g_out_of_memory;
  }
}

kiln_code code_of(kiln::StatusCode c) {
  switch (c) {
    case kiln::StatusCode::kOk: return KILN_OK;
    case kiln::StatusCode::kInvalidModel: return KILN_INVALID_MODEL;
    case kiln::StatusCode::kUnsupported: return KILN_UNSUPPORTED;
    case kiln::StatusCode::kInvalidArgument: return KILN_INVALID_ARGUMENT;
    case kiln::StatusCode::kNotFound: return KILN_NOT_FOUND;
    case kiln::StatusCode::kIoError: return KILN_IO_ERROR;
    case kiln::StatusCode::kInternal: return KILN_INTERNAL;
    case kiln::StatusCode::kResourceExhausted: return KILN_RESOURCE_EXHAUSTED;
  }
  return KILN_INTERNAL;
}

kiln_status* from_status(const kiln::Status& s) {
  if (s.is_ok()) return nullptr;
  return make_status(code_of(s.code()), s.to_string());
}

kiln_status* invalid(std::string message) {
  return make_status(KILN_INVALID_ARGUMENT, "invalid argument: " + std::move(message));
}

// Exceptions (bad_alloc, a bug) never cross the C boundary.
template <typename F>
kiln_status* guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return &g_out_of_memory;
  } catch (const std::exception& e) {
    return make_status(KILN_INTERNAL, std::string("internal error: ") + e.what());
  }
}

bool known_dtype(int32_t d) {
  switch (d) {
    case KILN_FLOAT32: case KILN_UINT8: case KILN_INT8: case KILN_UINT16: case KILN_INT16: case KILN_INT32:
    case KILN_INT64: case KILN_BOOL: case KILN_FLOAT16: case KILN_FLOAT64: case KILN_UINT32: case KILN_UINT64:
    case KILN_BFLOAT16:
      return true;
    default:
      return false;
  }
}

// A caller's tensor borrowed as a kiln::Tensor; `what` names it in errors.
kiln_status* borrow(const kiln_tensor& t, const char* what, kiln::Tensor& out) {
  std::string name = t.name ? t.name : "";
  if (!known_dtype(t.dtype)) return invalid(std::string(what) + " '" + name + "': unknown dtype " + std::to_string(t.dtype));
  if (t.rank > 0 && t.shape == nullptr) return invalid(std::string(what) + " '" + name + "': shape is NULL");
  std::vector<int64_t> shape(t.shape, t.shape + t.rank);
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid(std::string(what) + " '" + name + "': negative dim " + std::to_string(d));
    if (d != 0 && count > INT64_MAX / d) return invalid(std::string(what) + " '" + name + "': shape overflows");
    count *= d;
  }
  auto dtype = static_cast<kiln::DType>(t.dtype);
  int64_t elem = kiln::dtype_size(dtype);
  if (count > INT64_MAX / elem || static_cast<uint64_t>(count * elem) != static_cast<uint64_t>(t.bytes)) {
    return invalid(std::string(what) + " '" + name + "': " + std::to_string(t.bytes) + " bytes given, its dtype and shape need " +
                   std::to_string(count * elem));
  }
  if (count > 0 && t.data == nullptr) return invalid(std::string(what) + " '" + name + "': data is NULL");
  out = kiln::Tensor::borrow(dtype, std::move(shape), t.data);
  return nullptr;
}

kiln_status* describe(const std::vector<kiln_model::Info>& infos, size_t index, const char* what,
                      kiln_value_info* info) {
  if (info == nullptr) return invalid("kiln_value_info* is NULL");
  if (index >= infos.size()) {
    return invalid(std::string(what) + " index " + std::to_string(index) + " is out of range (the model has " +
                   std::to_string(infos.size()) + ")");
  }
  const kiln_model::Info& i = infos[index];
  info->name = i.name.c_str();
  info->dtype = i.dtype;
  info->rank = i.dims.size();
  info->dims = i.dims.data();
  info->dim_names = i.dim_name_ptrs.data();
  return nullptr;
}

}  // namespace

extern "C" {

const char* kiln_version(void) {
#ifdef KILN_VERSION
  return KILN_VERSION;
#else
  return "unknown";
#endif
}

int kiln_c_api_version(void) { return KILN_C_API_VERSION; }

kiln_code kiln_status_code(const kiln_status* status) { return status ? status->code : KILN_OK; }
const char* kiln_status_message(const kiln_status* status) { return status ? status->message.c_str() : ""; }
void kiln_status_free(kiln_status* status) {
  if (status != &g_out_of_memory) delete status;
}

kiln_options* kiln_options_create(void) { return new (std::nothrow) kiln_options(); }
void kiln_options_free(kiln_options* options) { delete options; }

kiln_status* kiln_options_set_threads(kiln_options* options, int threads) {
  if (options == nullptr) return invalid("kiln_options* is NULL");
  if (threads < 0) return invalid("threads must be >= 0 (0: all hardware threads), got " + std::to_string(threads));
  options->options.threads = threads;
  return nullptr;
}

kiln_status* kiln_options_set_db(kiln_options* options, const char* db) {
  if (options == nullptr || db == nullptr) return invalid("kiln_options_set_db: NULL argument");
  return guarded([&]() -> kiln_status* {
    options->options.no_db = db[0] == '\0';
    options->options.db = db;
    return nullptr;
  });
}

kiln_status* kiln_options_set_select(kiln_options* options, const char* select) {
  if (options == nullptr || select == nullptr) return invalid("kiln_options_set_select: NULL argument");
  std::string s = select;
  if (s != "priority" && s != "measure") return invalid("select must be 'priority' or 'measure', not '" + s + "'");
  options->options.select = s;
  return nullptr;
}

kiln_status* kiln_options_add_prefer(kiln_options* options, const char* impl) {
  if (options == nullptr || impl == nullptr) return invalid("kiln_options_add_prefer: NULL argument");
  return guarded([&]() -> kiln_status* {
    options->options.prefer_impls.emplace_back(impl);
    return nullptr;
  });
}

kiln_status* kiln_options_set_max_memory(kiln_options* options, int64_t bytes) {
  if (options == nullptr) return invalid("kiln_options* is NULL");
  if (bytes < 0) return invalid("max_memory must be >= 0 (0: 80% of physical memory)");
  options->options.max_memory_bytes = bytes;
  return nullptr;
}

#ifndef KILN_C_RUNTIME_ONLY
kiln_status* kiln_compile_file(const char* path, const kiln_options* options, kiln_model** model) {
  if (path == nullptr || model == nullptr) return invalid("kiln_compile_file: NULL argument");
  *model = nullptr;
  return guarded([&]() -> kiln_status* {
    auto m = kiln::Model::compile_file(path, options ? options->options : kiln::CompileOptions{});
    if (!m.is_ok()) return from_status(m.status());
    *model = new kiln_model(std::move(m).value());
    return nullptr;
  });
}

kiln_status* kiln_compile_bytes(const void* data, size_t size, const kiln_options* options, kiln_model** model) {
  if ((data == nullptr && size > 0) || model == nullptr) return invalid("kiln_compile_bytes: NULL argument");
  *model = nullptr;
  return guarded([&]() -> kiln_status* {
    std::string bytes(static_cast<const char*>(data), size);
    auto m = kiln::Model::compile_bytes(bytes, options ? options->options : kiln::CompileOptions{}, "<bytes>");
    if (!m.is_ok()) return from_status(m.status());
    *model = new kiln_model(std::move(m).value());
    return nullptr;
  });
}
#else
kiln_status* kiln_compile_file(const char* path, const kiln_options* options, kiln_model** model) {
  (void)path;
  (void)options;
  if (model != nullptr) *model = nullptr;
  return make_status(KILN_UNSUPPORTED, "unsupported: libkiln_runtime does not compile models: load a package written "
                                       "by `kiln compile` (kiln_load), or link libkiln");
}

kiln_status* kiln_compile_bytes(const void* data, size_t size, const kiln_options* options, kiln_model** model) {
  (void)data;
  (void)size;
  return kiln_compile_file(nullptr, options, model);
}
#endif

kiln_status* kiln_load(const char* path, const kiln_options* options, kiln_model** model) {
  if (path == nullptr || model == nullptr) return invalid("kiln_load: NULL argument");
  *model = nullptr;
  return guarded([&]() -> kiln_status* {
    auto m = kiln::Model::load(path, options ? options->options : kiln::CompileOptions{});
    if (!m.is_ok()) return from_status(m.status());
    *model = new kiln_model(std::move(m).value());
    return nullptr;
  });
}

void kiln_model_free(kiln_model* model) { delete model; }

size_t kiln_model_num_inputs(const kiln_model* model) { return model ? model->inputs.size() : 0; }
size_t kiln_model_num_outputs(const kiln_model* model) { return model ? model->outputs.size() : 0; }

kiln_status* kiln_model_input(const kiln_model* model, size_t index, kiln_value_info* info) {
  if (model == nullptr) return invalid("kiln_model* is NULL");
  return describe(model->inputs, index, "input", info);
}

kiln_status* kiln_model_output(const kiln_model* model, size_t index, kiln_value_info* info) {
  if (model == nullptr) return invalid("kiln_model* is NULL");
  return describe(model->outputs, index, "output", info);
}

kiln_status* kiln_run(kiln_model* model, const kiln_tensor* inputs, size_t num_inputs, kiln_tensor* outputs,
                      size_t num_outputs, kiln_result** result) {
  if (model == nullptr) return invalid("kiln_model* is NULL");
  if ((inputs == nullptr && num_inputs > 0) || (outputs == nullptr && num_outputs > 0))
    return invalid("kiln_run: NULL tensor array");
  if (result != nullptr) *result = nullptr;
  return guarded([&]() -> kiln_status* {
    std::map<std::string, kiln::Tensor> feeds;
    for (size_t i = 0; i < num_inputs; ++i) {
      if (inputs[i].name == nullptr) return invalid("input " + std::to_string(i) + " has no name");
      kiln::Tensor t;
      if (kiln_status* s = borrow(inputs[i], "input", t)) return s;
      if (!feeds.emplace(inputs[i].name, std::move(t)).second)
        return invalid(std::string("input '") + inputs[i].name + "' is given twice");
    }
    std::map<std::string, kiln::Tensor> into;
    std::vector<std::string> wanted;
    for (size_t i = 0; i < num_outputs; ++i) {
      if (outputs[i].name == nullptr) return invalid("output " + std::to_string(i) + " has no name");
      std::string name = outputs[i].name;
      bool known = false;
      for (const auto& o : model->outputs) known |= o.name == name;
      if (!known) return invalid("the model has no output '" + name + "'");
      for (const std::string& w : wanted)
        if (w == name) return invalid("output '" + name + "' is asked for twice");
      wanted.push_back(name);
      if (outputs[i].data != nullptr) {
        kiln::Tensor t;
        if (kiln_status* s = borrow(outputs[i], "output", t)) return s;
        into[name] = std::move(t);
      } else if (result == nullptr) {
        return invalid("output '" + name + "' has no buffer, and kiln_result** is NULL");
      }
    }
    if (kiln_status* s = from_status(model->model.run_into(feeds, into))) return s;
    auto* r = result != nullptr ? new kiln_result() : nullptr;
    for (size_t i = 0; i < num_outputs; ++i) {
      if (outputs[i].data != nullptr) continue;
      kiln::Tensor& t = into.at(outputs[i].name);
      if (t.dtype() == kiln::DType::kString || kiln::dtype_is_container(t.dtype())) {
        delete r;
        return make_status(KILN_UNSUPPORTED, std::string("unsupported: output '") + outputs[i].name + "' has dtype " +
                                                 kiln::dtype_name(t.dtype()) + ", which the C API does not pass");
      }
      kiln::Tensor& kept = r->outputs[outputs[i].name];
      kept = std::move(t);
      outputs[i].dtype = static_cast<int32_t>(kept.dtype());
      outputs[i].rank = kept.shape().size();
      outputs[i].shape = kept.shape().data();
      outputs[i].data = kept.data();
      outputs[i].bytes = static_cast<size_t>(kept.nbytes());
    }
    if (result != nullptr) *result = r;
    return nullptr;
  });
}

void kiln_result_free(kiln_result* result) { delete result; }

}  // extern "C"
