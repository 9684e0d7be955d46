// The `kiln._kiln` extension module: kiln::Model for Python. The pure-Python
// package (python/kiln/__init__.py) wraps it; this file only converts between numpy
// arrays and kiln::Tensor and turns a kiln Status into kiln.KilnError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "support/memory_limit.h"
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/memory_limit.h"

namespace py = pybind11;

namespace {

py::handle g_kiln_error;

[[noreturn]] void raise_kiln_error(const std::string& message) {
  PyErr_SetString(g_kiln_error.ptr(), message.c_str());
  throw py::error_already_set();
}

[[noreturn]] void raise_status(const kiln::Status& status) { raise_kiln_error(status.to_string()); }

// numpy dtype name for a kiln dtype; nullptr when numpy has no equivalent.
const char* numpy_name(kiln::DType t) {
  using kiln::DType;
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBool: return "bool";
    case DType::kComplex64: return "complex64";
    case DType::kComplex128: return "complex128";
    case DType::kString: return "object";
    // Kiln unpacks 4-bit integers to one element per byte.
    case DType::kInt4: return "int8";
    case DType::kUInt4: return "uint8";
    // Bit patterns, as onnx.numpy_helper represents them.
    case DType::kBFloat16: return "uint16";
    case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ: case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: return "uint8";
    default: return nullptr;
  }
}

kiln::DType dtype_from_numpy(const py::dtype& dt) {
  using kiln::DType;
  char kind = dt.kind();
  auto size = dt.itemsize();
  switch (kind) {
    case 'f':
      if (size == 2) return DType::kFloat16;
      if (size == 4) return DType::kFloat32;
      if (size == 8) return DType::kFloat64;
      break;
    case 'i':
      if (size == 1) return DType::kInt8;
      if (size == 2) return DType::kInt16;
      if (size == 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
      break;
    case 'u':
      if (size == 1) return DType::kUInt8;
      if (size == 2) return DType::kUInt16;
      if (size == 4) return DType::kUInt32;
      if (size == 8) return DType::kUInt64;
      break;
    case 'b':
      if (size == 1) return DType::kBool;
      break;
    case 'c':
      if (size == 8) return DType::kComplex64;
      if (size == 16) return DType::kComplex128;
      break;
    case 'U':
    case 'S':
    case 'O':
      return DType::kString;
    default:
      break;
  }
  return DType::kUndefined;
}

std::string dtype_label(kiln::DType t) {
  if (kiln::dtype_is_narrow_float(t) && t != kiln::DType::kFloat16) return kiln::dtype_name(t);
  const char* n = numpy_name(t);
  return n ? n : kiln::dtype_name(t);
}

struct TensorInfoView {
  std::string name;
  std::string dtype;  // numpy name ("float32"), or kiln's name when numpy has none ("bf16")
  std::vector<std::string> dims;
};

std::vector<TensorInfoView> info_views(const std::vector<kiln::TensorInfo>& infos) {
  std::vector<TensorInfoView> out;
  for (const auto& i : infos) out.push_back({i.name, dtype_label(i.dtype), i.dims});
  return out;
}

// DLPack's C ABI (the structs a "dltensor" capsule points to), as far as
// this module reads it: another library's tensor lent without a copy.
namespace dl {
struct Device {
  int32_t type;  // 1: CPU
  int32_t id;
};
struct DataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: row-major contiguous
  uint64_t byte_offset;
};
struct Managed {
  Tensor tensor;
  void* manager_ctx;
  void (*deleter)(Managed*);
};
constexpr int32_t kCPU = 1;
}  // namespace dl

// An object with __dlpack__ (a torch tensor, say) that is not a numpy array.
bool is_dlpack(const py::handle& v) { return !py::isinstance<py::array>(v) && py::hasattr(v, "__dlpack__"); }

kiln::DType dtype_from_dlpack(const dl::DataType& t) {
  using kiln::DType;
  if (t.lanes != 1) return DType::kUndefined;
  switch (t.code) {
    case 0: return t.bits == 8 ? DType::kInt8 : t.bits == 16 ? DType::kInt16 : t.bits == 32 ? DType::kInt32
                 : t.bits == 64 ? DType::kInt64 : DType::kUndefined;
    case 1: return t.bits == 8 ? DType::kUInt8 : t.bits == 16 ? DType::kUInt16 : t.bits == 32 ? DType::kUInt32
                 : t.bits == 64 ? DType::kUInt64 : DType::kUndefined;
    case 2: return t.bits == 16 ? DType::kFloat16 : t.bits == 32 ? DType::kFloat32 : t.bits == 64 ? DType::kFloat64
                 : DType::kUndefined;
    case 4: return t.bits == 16 ? DType::kBFloat16 : DType::kUndefined;
    case 5: return t.bits == 64 ? DType::kComplex64 : t.bits == 128 ? DType::kComplex128 : DType::kUndefined;
    case 6: return t.bits == 8 ? DType::kBool : DType::kUndefined;
    default: return DType::kUndefined;
  }
}

// A tensor lent through DLPack: the capsule's tensor, released (its
// deleter called) when the last holder drops it.
struct Lent {
  std::shared_ptr<dl::Managed> managed;
  kiln::Tensor tensor;
  bool contiguous = true;
};

Lent from_dlpack(const std::string& what, const py::handle& obj) {
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple dev = obj.attr("__dlpack_device__")();
    int type = dev[0].cast<int>();
    if (type != dl::kCPU)
      raise_kiln_error(what + " is on DLPack device type " + std::to_string(type) + "; Kiln runs on the CPU (type 1)");
  }
  py::object capsule = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    raise_kiln_error(what + ": __dlpack__ did not return a DLPack capsule (\"dltensor\")");
  auto* m = static_cast<dl::Managed*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // Taken: the capsule no longer frees the tensor, the Lent does.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  Lent lent;
  lent.managed = std::shared_ptr<dl::Managed>(m, [](dl::Managed* p) {
    if (p->deleter != nullptr) p->deleter(p);
  });
  const dl::Tensor& t = m->tensor;
  if (t.device.type != dl::kCPU)
    raise_kiln_error(what + " is on DLPack device type " + std::to_string(t.device.type) + "; Kiln runs on the CPU (type 1)");
  kiln::DType dtype = dtype_from_dlpack(t.dtype);
  if (dtype == kiln::DType::kUndefined) {
    raise_kiln_error(what + ": unsupported DLPack dtype (code " + std::to_string(t.dtype.code) + ", " +
                     std::to_string(t.dtype.bits) + " bits, " + std::to_string(t.dtype.lanes) + " lanes)");
  }
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) {
    int64_t expect = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && t.strides[d] != expect) lent.contiguous = false;
      expect *= shape[d];
    }
  }
  lent.tensor = kiln::Tensor::borrow(dtype, std::move(shape), static_cast<char*>(t.data) + t.byte_offset);
  return lent;
}

// A numpy array converted to a kiln Tensor. Numeric arrays are borrowed (the array is
// kept alive in `owner`); string arrays are copied.
struct InputTensor {
  py::object owner;                    // the numpy array
  std::shared_ptr<dl::Managed> lent;   // or the DLPack tensor
  kiln::Tensor tensor;
};

// numpy has no bfloat16 or float8 types: ONNX passes their bits as uint16 /
// uint8 arrays (numpy_helper.to_array), and so does this module.
bool is_bits_of(kiln::DType narrow, kiln::DType given) {
  using kiln::DType;
  if (narrow == DType::kBFloat16) return given == DType::kUInt16;
  return kiln::dtype_is_narrow_float(narrow) && narrow != DType::kFloat16 && given == DType::kUInt8;
}

InputTensor to_tensor(const std::string& name, const py::handle& value, kiln::DType expected);

// A sequence input is a list (or tuple) of arrays; an optional one is None or
// its element (an array, or a list for an optional sequence). Elements are
// copied: a container owns its elements' memory.
InputTensor to_container(const std::string& name, const py::handle& value, kiln::DType expected) {
  using kiln::DType;
  bool is_list = py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value);
  std::vector<kiln::Tensor> elems;
  if (expected == DType::kSequence) {
    if (!is_list) raise_kiln_error("input '" + name + "' is a sequence: pass a list of arrays");
    for (py::handle item : value) {
      if (py::isinstance<py::list>(item) || py::isinstance<py::tuple>(item) || item.is_none())
        raise_kiln_error("input '" + name + "': a sequence's elements are arrays");
      elems.push_back(to_tensor(name, item, DType::kUndefined).tensor.clone());
    }
  } else if (!value.is_none()) {
    InputTensor e = to_tensor(name, value, is_list ? DType::kSequence : DType::kUndefined);
    elems.push_back(e.tensor.owns_storage() ? e.tensor : e.tensor.clone());
  }
  InputTensor in;
  in.tensor = kiln::Tensor(expected, {static_cast<int64_t>(elems.size())});
  for (size_t i = 0; i < elems.size(); ++i) in.tensor.data_as<kiln::Tensor>()[i] = std::move(elems[i]);
  return in;
}

InputTensor to_tensor(const std::string& name, const py::handle& value, kiln::DType expected) {
  if (kiln::dtype_is_container(expected)) return to_container(name, value, expected);
  py::module_ np = py::module_::import("numpy");
  if (is_dlpack(value)) {
    // Borrowed without a copy when contiguous (a misaligned one is copied
    // by the VM: kernels assume 64-byte alignment); else through numpy.
    Lent lent = from_dlpack("input '" + name + "'", value);
    if (lent.contiguous) {
      InputTensor in;
      in.lent = std::move(lent.managed);
      in.tensor = std::move(lent.tensor);
      return in;
    }
  }
  py::array arr = is_dlpack(value) ? py::array(np.attr("from_dlpack")(value)) : py::array(np.attr("asarray")(value));
  kiln::DType dtype = dtype_from_numpy(arr.dtype());
  if (is_bits_of(expected, dtype)) dtype = expected;
  // 4-bit integers come as int8 / uint8 arrays (one value per byte), each in range.
  bool four_bit = (expected == kiln::DType::kInt4 && dtype == kiln::DType::kInt8) ||
                  (expected == kiln::DType::kUInt4 && dtype == kiln::DType::kUInt8);
  if (four_bit) dtype = expected;
  if (dtype == kiln::DType::kUndefined) {
    raise_kiln_error("input '" + name + "': unsupported numpy dtype " +
                     py::str(arr.dtype()).cast<std::string>());
  }
  std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
  InputTensor in;
  if (dtype == kiln::DType::kString) {
    kiln::Tensor t(dtype, shape);
    py::list flat = arr.attr("ravel")().attr("tolist")();
    auto* out = t.data_as<std::string>();
    for (size_t i = 0; i < flat.size(); ++i) {
      py::handle item = flat[i];
      if (py::isinstance<py::str>(item)) {
        out[i] = item.cast<std::string>();
      } else if (py::isinstance<py::bytes>(item)) {
        out[i] = item.cast<std::string>();
      } else {
        raise_kiln_error("input '" + name + "': element " + std::to_string(i) +
                         " of an object array is not a str or bytes");
      }
    }
    in.owner = arr;
    in.tensor = std::move(t);
    return in;
  }
  // Contiguous, aligned, native byte order; copies only when needed.
  if (!arr.dtype().attr("isnative").cast<bool>()) {
    arr = arr.attr("astype")(arr.dtype().attr("newbyteorder")("="));
  }
  arr = np.attr("ascontiguousarray")(arr);
  if (!(arr.flags() & py::array::c_style)) raise_kiln_error("input '" + name + "': not contiguous");
  if (four_bit) {
    const auto* bytes = static_cast<const int8_t*>(arr.data());
    for (py::ssize_t i = 0; i < arr.size(); ++i) {
      int v = expected == kiln::DType::kInt4 ? bytes[i] : static_cast<uint8_t>(bytes[i]);
      if (expected == kiln::DType::kInt4 ? (v < -8 || v > 7) : (v > 15))
        raise_kiln_error("input '" + name + "': element " + std::to_string(i) + " (" + std::to_string(v) +
                         ") is out of range for " + kiln::dtype_name(expected));
    }
  }
  in.owner = arr;
  // Kiln never writes to its inputs, so read-only arrays are borrowed as well.
  in.tensor = kiln::Tensor::borrow(dtype, shape, const_cast<void*>(arr.data()));
  return in;
}

py::object to_numpy(const std::string& name, const kiln::Tensor& t) {
  // A sequence is a list of arrays; an optional None or its element.
  if (t.dtype() == kiln::DType::kSequence) {
    py::list items;
    for (int64_t i = 0; i < t.numel(); ++i) items.append(to_numpy(name, t.data_as<kiln::Tensor>()[i]));
    return items;
  }
  if (t.dtype() == kiln::DType::kOptional)
    return t.numel() == 0 ? py::object(py::none()) : to_numpy(name, t.data_as<kiln::Tensor>()[0]);
  const char* np_name = numpy_name(t.dtype());
  if (np_name == nullptr) {
    raise_kiln_error("output '" + name + "' has dtype " + kiln::dtype_name(t.dtype()) +
                     ", which numpy cannot represent");
  }
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (t.dtype() == kiln::DType::kString) {
    py::list items;
    const auto* s = t.data_as<std::string>();
    for (int64_t i = 0; i < t.numel(); ++i) items.append(py::str(s[i]));
    py::module_ np = py::module_::import("numpy");
    py::array arr = np.attr("array")(items, py::arg("dtype") = "object");
    return arr.attr("reshape")(py::tuple(py::cast(shape)));
  }
  // An output Kiln allocated is returned without a copy: the array keeps the
  // tensor's storage, which goes back to the model's pool only when the array
  // is gone. Memory Kiln does not own (a caller's buffer) is copied.
  if (t.owns_storage()) {
    auto* held = new kiln::Tensor(t);
    py::capsule owner(held, [](void* p) { delete static_cast<kiln::Tensor*>(p); });
    return py::array(py::dtype(np_name), shape, {}, held->data(), owner);
  }
  py::array arr(py::dtype(np_name), shape);
  if (t.nbytes() > 0) std::memcpy(arr.mutable_data(), t.data(), static_cast<size_t>(t.nbytes()));
  return arr;
}

class CompiledModel {
 public:
  explicit CompiledModel(kiln::Model model) : model_(std::move(model)) {}

  // outputs: name -> a caller's buffer (a writable C-contiguous numpy array,
  // or a contiguous DLPack tensor on the CPU) of the output's dtype and shape.
  py::dict run(const py::dict& feeds, const std::optional<py::dict>& outputs) {
    std::vector<InputTensor> held;
    std::map<std::string, kiln::Tensor> inputs = convert_inputs(feeds, held);
    std::map<std::string, kiln::Tensor> into;
    std::vector<std::shared_ptr<dl::Managed>> lent_outputs;
    if (outputs) {
      for (auto item : *outputs) {
        if (!py::isinstance<py::str>(item.first)) {
          throw py::type_error("output names must be str, got " +
                               py::str(py::type::of(item.first)).cast<std::string>());
        }
        std::string name = item.first.cast<std::string>();
        into[name] = output_buffer(name, item.second, lent_outputs);
      }
    }
    std::optional<kiln::Status> status;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      status.emplace(model_.run_into(inputs, into));
    }
    if (!status->is_ok()) raise_status(*status);
    py::dict out;
    for (const auto& info : model_.outputs()) {
      if (outputs && outputs->contains(py::str(info.name))) {
        out[py::str(info.name)] = (*outputs)[py::str(info.name)];
        continue;
      }
      auto it = into.find(info.name);
      if (it == into.end()) raise_kiln_error("the model produced no value for output '" + info.name + "'");
      out[py::str(info.name)] = to_numpy(info.name, it->second);
    }
    return out;
  }

  std::string profile(const py::dict& feeds, int runs, const std::string& trace_path) {
    if (runs < 1) throw py::value_error("runs must be >= 1");
    std::vector<InputTensor> held;
    std::map<std::string, kiln::Tensor> inputs = convert_inputs(feeds, held);
    std::optional<kiln::Result<std::string>> report;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      report.emplace(model_.profile(inputs, runs, trace_path));
    }
    if (!*report) raise_status(report->status());
    return **report;
  }

  std::vector<TensorInfoView> inputs() const { return info_views(model_.inputs()); }
  std::vector<TensorInfoView> outputs() const { return info_views(model_.outputs()); }
  std::string graph_text() const { return model_.graph_text(); }
  std::string package_metadata() const { return model_.package_metadata(); }
  void save(const std::string& path) {
    kiln::Status st = kiln::Status::ok();
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);
      st = model_.save(path);
    }
    if (!st.is_ok()) raise_status(st);
  }
  py::dict stats() const {
    const auto& s = model_.stats();
    py::dict d;
    d["compile_seconds"] = s.compile_seconds;
    d["num_kernels"] = s.num_kernels;
    d["num_runtime_kernels"] = s.num_runtime_kernels;
    d["arena_bytes"] = s.arena_bytes;
    d["num_nodes_imported"] = s.num_nodes_imported;
    d["num_nodes"] = s.num_nodes;
    if (s.memory_known) {
      d["activation_bytes"] = s.activation_bytes;
      d["output_bytes"] = s.output_bytes;
      d["scratch_bytes"] = s.scratch_bytes;
      d["peak_bytes"] = s.peak_bytes;
      if (!s.peak_at.empty()) {
        d["peak_at"] = s.peak_at;
        py::list values;
        for (const auto& [name, bytes] : s.peak_values) values.append(py::make_tuple(name, bytes));
        d["peak_values"] = values;
      }
    }
    if (s.unbudgeted_activation_bytes > 0) {
      d["unbudgeted_activation_bytes"] = s.unbudgeted_activation_bytes;
      d["recomputed_segments"] = s.recomputed_segments;
      d["recomputed_values"] = s.recomputed_values;
      d["recomputed_calls"] = s.recomputed_calls;
      d["recompute_share"] = s.recompute_share;
    }
    return d;
  }

 private:
  // Inputs by name, checked against the model's; `held` keeps what they borrow alive.
  std::map<std::string, kiln::Tensor> convert_inputs(const py::dict& feeds, std::vector<InputTensor>& held) {
    std::map<std::string, kiln::Tensor> inputs;
    held.reserve(feeds.size());
    for (auto item : feeds) {
      if (!py::isinstance<py::str>(item.first)) {
        throw py::type_error("input names must be str, got " +
                             py::str(py::type::of(item.first)).cast<std::string>());
      }
      std::string name = item.first.cast<std::string>();
      bool known = false;
      kiln::DType expected = kiln::DType::kUndefined;
      std::string names;
      for (const auto& info : model_.inputs()) {
        if (info.name == name) expected = info.dtype;
        known = known || info.name == name;
        names += (names.empty() ? "" : ", ") + info.name;
      }
      if (!known) raise_kiln_error("the model has no input '" + name + "' (inputs: " + names + ")");
      held.push_back(to_tensor(name, item.second, expected));
      inputs[name] = held.back().tensor;
    }
    return inputs;
  }

  // A caller's buffer for output `name`, borrowed: written in place (or
  // filled with a copy when it is not 64-byte aligned).
  kiln::Tensor output_buffer(const std::string& name, const py::handle& value,
                             std::vector<std::shared_ptr<dl::Managed>>& lent) {
    const kiln::TensorInfo* info = nullptr;
    std::string names;
    for (const auto& i : model_.outputs()) {
      if (i.name == name) info = &i;
      names += (names.empty() ? "" : ", ") + i.name;
    }
    if (info == nullptr) raise_kiln_error("the model has no output '" + name + "' (outputs: " + names + ")");
    if (info->dtype == kiln::DType::kString || kiln::dtype_is_container(info->dtype))
      raise_kiln_error("output '" + name + "' has dtype " + kiln::dtype_name(info->dtype) +
                       ": it cannot be written into a caller's buffer");
    std::string what = "output '" + name + "'";
    if (is_dlpack(value)) {
      Lent l = from_dlpack(what, value);
      if (!l.contiguous) raise_kiln_error(what + ": the buffer given is not contiguous");
      lent.push_back(std::move(l.managed));
      return l.tensor;
    }
    if (!py::isinstance<py::array>(value)) {
      throw py::type_error(what + ": a buffer is a numpy array or an object with __dlpack__, got " +
                           py::str(py::type::of(value)).cast<std::string>());
    }
    py::array arr = py::reinterpret_borrow<py::array>(value);
    if (!arr.writeable()) raise_kiln_error(what + ": the array given is read-only");
    if (!(arr.flags() & py::array::c_style)) raise_kiln_error(what + ": the array given is not C-contiguous");
    if (!arr.dtype().attr("isnative").cast<bool>()) raise_kiln_error(what + ": the array given is not in native byte order");
    kiln::DType dtype = dtype_from_numpy(arr.dtype());
    if (is_bits_of(info->dtype, dtype)) dtype = info->dtype;
    if (dtype == kiln::DType::kUndefined) {
      raise_kiln_error(what + ": unsupported numpy dtype " + py::str(arr.dtype()).cast<std::string>());
    }
    std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
    return kiln::Tensor::borrow(dtype, std::move(shape), arr.mutable_data());
  }

  kiln::Model model_;
  std::mutex mutex_;  // one run at a time per model
};

kiln::CompileOptions make_options(int threads, bool naive, int64_t max_memory,
                                  const std::optional<std::vector<std::string>>& passes,
                                  const std::optional<std::string>& db, const std::string& select,
                                  const std::vector<std::string>& prefer, const std::string& gradient_of = "",
                                  const std::vector<std::string>& gradient_wrt = {}) {
  if (threads < 0) throw py::value_error("threads must be >= 0 (0: all hardware threads)");
  if (max_memory < 0) throw py::value_error("max_memory must be >= 0 (0: 80% of physical memory)");
  kiln::CompileOptions options;
  options.threads = threads;
  options.naive = naive;
  options.max_memory_bytes = max_memory;
  options.passes = passes;
  options.select = select;
  options.prefer_impls = prefer;
  options.gradient_of = gradient_of;
  options.gradient_wrt = gradient_wrt;
  // db: None asks the default database ($KILN_DB, ~/.cache/kiln/tuning.db
  // where it exists), "" none, else that path or URL.
  if (db) {
    if (db->empty()) options.no_db = true;
    else options.db = *db;
  }
  return options;
}

std::unique_ptr<CompiledModel> compile_file(const std::string& path, int threads, bool naive, int64_t max_memory,
                                            const std::optional<std::vector<std::string>>& passes,
                                            const std::optional<std::string>& db, const std::string& select,
                                            const std::vector<std::string>& prefer, const std::string& gradient_of,
                                            const std::vector<std::string>& gradient_wrt) {
  kiln::CompileOptions options =
      make_options(threads, naive, max_memory, passes, db, select, prefer, gradient_of, gradient_wrt);
  std::optional<kiln::Result<kiln::Model>> model;
  {
    py::gil_scoped_release release;
    model.emplace(kiln::Model::compile_file(path, options));
  }
  if (!*model) raise_status(model->status());
  return std::make_unique<CompiledModel>(std::move(*model).value());
}

// kiln.Trainer's settings (python/kiln/__init__.py) as TrainOptions.
kiln::TrainOptions train_options(const py::dict& d) {
  kiln::TrainOptions t;
  t.loss = d["loss"].cast<std::string>();
  t.params = d["params"].cast<std::vector<std::string>>();
  t.optimizer = d["optimizer"].cast<std::string>();
  t.momentum = d["momentum"].cast<double>();
  t.nesterov = d["nesterov"].cast<bool>();
  t.beta1 = d["beta1"].cast<double>();
  t.beta2 = d["beta2"].cast<double>();
  t.eps = d["eps"].cast<double>();
  t.weight_decay = d["weight_decay"].cast<double>();
  t.clip_norm = d["clip_norm"].cast<double>();
  t.loss_kind = d["loss_kind"].cast<std::string>();
  t.prediction = d["prediction"].cast<std::string>();
  t.target = d["target"].cast<std::string>();
  t.memory_budget = d["memory_budget"].cast<int64_t>();
  t.checkpoint_policy = d["checkpoint_policy"].cast<std::string>();
  t.model_algorithm = d.contains("model_algorithm") && d["model_algorithm"].cast<bool>();
  return t;
}

std::unique_ptr<CompiledModel> compile_bytes(const py::bytes& data, int threads, bool naive,
                                             const std::string& source_name, int64_t max_memory,
                                             const std::optional<std::vector<std::string>>& passes,
                                             const std::optional<std::string>& db, const std::string& select,
                                             const std::vector<std::string>& prefer, const std::string& gradient_of,
                                             const std::vector<std::string>& gradient_wrt,
                                             const std::optional<py::dict>& train) {
  kiln::CompileOptions options =
      make_options(threads, naive, max_memory, passes, db, select, prefer, gradient_of, gradient_wrt);
  if (train) options.train = train_options(*train);
  std::string bytes = data;
  std::optional<kiln::Result<kiln::Model>> model;
  {
    py::gil_scoped_release release;
    model.emplace(kiln::Model::compile_bytes(bytes, options, source_name));
  }
  if (!*model) raise_status(model->status());
  return std::make_unique<CompiledModel>(std::move(*model).value());
}

std::unique_ptr<CompiledModel> load(const std::string& path, int threads, int64_t max_memory) {
  kiln::CompileOptions options = make_options(threads, false, max_memory, std::nullopt, std::nullopt, "priority", {});
  std::optional<kiln::Result<kiln::Model>> model;
  {
    py::gil_scoped_release release;
    model.emplace(kiln::Model::load(path, options));
  }
  if (!*model) raise_status(model->status());
  return std::make_unique<CompiledModel>(std::move(*model).value());
}

std::string describe_model_file(const std::string& path) {
  auto text = kiln::describe_model_file(path);
  if (!text) raise_status(text.status());
  return *text;
}

}  // namespace

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln: compile and run ONNX models (extension module; use the `kiln` package)";
  m.attr("__version__") = KILN_VERSION;

  static py::exception<std::runtime_error> kiln_error(m, "KilnError", PyExc_RuntimeError);
  g_kiln_error = kiln_error;

  py::class_<TensorInfoView>(m, "TensorInfo")
      .def_readonly("name", &TensorInfoView::name)
      .def_readonly("dtype", &TensorInfoView::dtype)
      .def_readonly("dims", &TensorInfoView::dims)
      .def("__repr__", [](const TensorInfoView& t) {
        std::string dims;
        for (const auto& d : t.dims) dims += (dims.empty() ? "" : ", ") + d;
        return "TensorInfo(name='" + t.name + "', dtype=" + t.dtype + ", dims=[" + dims + "])";
      });

  py::class_<CompiledModel>(m, "CompiledModel")
      .def("run", &CompiledModel::run, py::arg("inputs"), py::arg("outputs") = py::none(),
           "Runs the model on a dict name -> array (numpy, or anything with __dlpack__ on the CPU);\n"
           "returns a dict name -> numpy array. outputs: name -> the caller's buffer to write into\n"
           "(a writable C-contiguous numpy array or a __dlpack__ tensor of the output's dtype and shape).")
      .def("_profile", &CompiledModel::profile, py::arg("inputs"), py::arg("runs"), py::arg("trace_path") = "")
      .def_property_readonly("inputs", &CompiledModel::inputs)
      .def_property_readonly("outputs", &CompiledModel::outputs)
      .def_property_readonly("stats", &CompiledModel::stats)
      .def("graph_text", &CompiledModel::graph_text)
      .def("save", &CompiledModel::save, py::arg("path"))
      .def_property_readonly("package_metadata", &CompiledModel::package_metadata);

  m.def("compile_file", &compile_file, py::arg("path"), py::arg("threads") = 0,
        py::arg("naive") = false, py::arg("max_memory") = 0, py::arg("passes") = py::none(),
        py::arg("db") = py::none(), py::arg("select") = "priority",
        py::arg("prefer") = std::vector<std::string>{}, py::arg("gradient_of") = "",
        py::arg("gradient_wrt") = std::vector<std::string>{});
  m.def("compile_bytes", &compile_bytes, py::arg("data"), py::arg("threads") = 0,
        py::arg("naive") = false, py::arg("source_name") = "<bytes>", py::arg("max_memory") = 0,
        py::arg("passes") = py::none(), py::arg("db") = py::none(), py::arg("select") = "priority",
        py::arg("prefer") = std::vector<std::string>{}, py::arg("gradient_of") = "",
        py::arg("gradient_wrt") = std::vector<std::string>{}, py::arg("train") = py::none());
  m.def("describe_model_file", &describe_model_file, py::arg("path"));
  m.def(
      "parse_byte_size",
      [](const std::string& text) {
        auto v = kiln::parse_byte_size(text);
        if (!v) raise_status(v.status());
        return *v;
      },
      py::arg("text"));
  m.def("load", &load, py::arg("path"), py::arg("threads") = 0, py::arg("max_memory") = 0);
}
