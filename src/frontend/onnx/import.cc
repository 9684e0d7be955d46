#include "frontend/onnx/import.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <unistd.h>

namespace kiln {

namespace {

namespace fs = std::filesystem;

std::string normalize_domain(const std::string& d) { return d == "ai.onnx" ? "" : d; }

std::string base_dir_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found() << path << ": no such file";
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error() << path << ": cannot open";
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error() << path << ": read failed";
  return bytes;
}

bool mul_overflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

// ---------------------------------------------------------------------------
// Tensors

class TensorReader {
 public:
  TensorReader(std::string base_dir, std::string source) : base_dir_(std::move(base_dir)), source_(std::move(source)) {}

  Result<Tensor> read(const onnx::TensorProto& tp, const std::string& what) {
    int dt = tp.data_type();
    if (dt <= 0 || dt > kMaxDType) return err() << what << " has unknown data type " << dt;
    DType dtype = static_cast<DType>(dt);
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (int64_t d : tp.dims()) {
      if (d < 0) return err() << what << " has a negative dimension " << d;
      if (mul_overflows(numel, d, &numel) || numel > (int64_t{1} << 50))
        return err() << what << " has too many elements";
      shape.push_back(d);
    }
    if (tp.has_segment()) return unsupported() << source_ << ": " << what << " is segmented";
    bool four_bit = dtype == DType::kInt4 || dtype == DType::kUInt4 || dtype == DType::kFloat4E2M1;
    // Bytes of the packed little-endian representation (raw_data, external).
    int64_t packed_bytes = four_bit ? (numel + 1) / 2 : numel * dtype_size(dtype);

    if (dtype == DType::kString) {
      if (tp.string_data_size() != numel)
        return err() << what << " has " << tp.string_data_size() << " strings for " << numel << " elements";
      Tensor t(dtype, shape);
      for (int64_t i = 0; i < numel; ++i) t.data_as<std::string>()[i] = tp.string_data(static_cast<int>(i));
      return t;
    }

    if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
      KILN_ASSIGN_OR_RETURN(std::string bytes, read_external(tp, what, packed_bytes));
      return from_packed(dtype, shape, bytes);
    }
    if (tp.has_raw_data()) {
      if (static_cast<int64_t>(tp.raw_data().size()) != packed_bytes)
        return err() << what << " has " << tp.raw_data().size() << " bytes of raw_data, expected " << packed_bytes
                     << " for " << dtype_name(dtype) << shape_to_string(shape);
      return from_packed(dtype, shape, tp.raw_data());
    }
    return from_typed_fields(tp, dtype, shape, numel, four_bit, what);
  }

 private:
  StatusBuilder err() const {
    StatusBuilder b(StatusCode::kInvalidModel);
    b << source_ << ": ";
    return b;
  }

  Result<std::string> read_external(const onnx::TensorProto& tp, const std::string& what, int64_t expected) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : tp.external_data()) {
      if (kv.key() == "location") {
        location = kv.value();
      } else if (kv.key() == "offset" || kv.key() == "length") {
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(kv.value().c_str(), &end, 10);
        if (kv.value().empty() || *end != '\0' || errno != 0 || v < 0)
          return err() << what << ": bad external data " << kv.key() << " '" << kv.value() << "'";
        (kv.key() == "offset" ? offset : length) = v;
      }
    }
    if (location.empty()) return err() << what << ": external data without a location";
    fs::path rel(location);
    if (rel.is_absolute()) return err() << what << ": external data location '" << location << "' is absolute";
    for (const auto& part : rel)
      if (part == "..") return err() << what << ": external data location '" << location << "' leaves the model's directory";
    fs::path file = fs::path(base_dir_) / rel;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) return err() << what << ": external data file '" << file.string() << "' not found";
    int64_t size = static_cast<int64_t>(fs::file_size(file, ec));
    if (ec) return err() << what << ": cannot stat external data file '" << file.string() << "'";
    if (length >= 0 && length != expected)
      return err() << what << ": external data length " << length << " does not match the tensor's " << expected << " bytes";
    if (offset > size || expected > size - offset)
      return err() << what << ": external data at offset " << offset << " with " << expected << " bytes runs past the end of '"
                   << file.string() << "' (" << size << " bytes)";
    std::ifstream in(file, std::ios::binary);
    if (!in) return err() << what << ": cannot open external data file '" << file.string() << "'";
    std::string bytes(static_cast<size_t>(expected), '\0');
    in.seekg(offset);
    in.read(bytes.data(), expected);
    if (!in) return err() << what << ": reading external data file '" << file.string() << "' failed";
    return bytes;
  }

  static Tensor from_packed(DType dtype, const std::vector<int64_t>& shape, const std::string& bytes) {
    Tensor t(dtype, shape);
    int64_t n = t.numel();
    auto* out = static_cast<uint8_t*>(t.data());
    if (dtype == DType::kInt4 || dtype == DType::kUInt4 || dtype == DType::kFloat4E2M1) {
      for (int64_t i = 0; i < n; ++i) {
        uint8_t b = static_cast<uint8_t>(bytes[static_cast<size_t>(i / 2)]);
        uint8_t v = (i % 2 == 0) ? (b & 0x0f) : (b >> 4);
        if (dtype == DType::kInt4 && (v & 0x08)) v |= 0xf0;
        out[i] = v;
      }
    } else if (!bytes.empty()) {
      std::memcpy(out, bytes.data(), bytes.size());
    }
    return t;
  }

  Result<Tensor> from_typed_fields(const onnx::TensorProto& tp, DType dtype, const std::vector<int64_t>& shape,
                                   int64_t numel, bool four_bit, const std::string& what) {
    auto count_error = [&](const char* field, int64_t have, int64_t want) -> Status {
      return err() << what << " has " << have << " values in " << field << ", expected " << want << " for "
                   << dtype_name(dtype) << shape_to_string(shape);
    };
    switch (dtype) {
      case DType::kFloat32:
      case DType::kComplex64: {
        int64_t want = dtype == DType::kComplex64 ? 2 * numel : numel;
        if (tp.float_data_size() != want) return count_error("float_data", tp.float_data_size(), want);
        Tensor t(dtype, shape);
        if (want) std::memcpy(t.data(), tp.float_data().data(), static_cast<size_t>(want) * sizeof(float));
        return t;
      }
      case DType::kFloat64:
      case DType::kComplex128: {
        int64_t want = dtype == DType::kComplex128 ? 2 * numel : numel;
        if (tp.double_data_size() != want) return count_error("double_data", tp.double_data_size(), want);
        Tensor t(dtype, shape);
        if (want) std::memcpy(t.data(), tp.double_data().data(), static_cast<size_t>(want) * sizeof(double));
        return t;
      }
      case DType::kInt64: {
        if (tp.int64_data_size() != numel) return count_error("int64_data", tp.int64_data_size(), numel);
        Tensor t(dtype, shape);
        if (numel) std::memcpy(t.data(), tp.int64_data().data(), static_cast<size_t>(numel) * sizeof(int64_t));
        return t;
      }
      case DType::kUInt32:
      case DType::kUInt64: {
        if (tp.uint64_data_size() != numel) return count_error("uint64_data", tp.uint64_data_size(), numel);
        Tensor t(dtype, shape);
        for (int64_t i = 0; i < numel; ++i) {
          uint64_t v = tp.uint64_data(static_cast<int>(i));
          if (dtype == DType::kUInt32) {
            t.data_as<uint32_t>()[i] = static_cast<uint32_t>(v);
          } else {
            t.data_as<uint64_t>()[i] = v;
          }
        }
        return t;
      }
      default:
        break;
    }
    // int32_data: one element per entry (bit pattern for f16/bf16/float8), or
    // for 4-bit types one packed byte (two elements) per entry.
    int64_t want = four_bit ? (numel + 1) / 2 : numel;
    if (tp.int32_data_size() != want) return count_error("int32_data", tp.int32_data_size(), want);
    if (four_bit) {
      std::string bytes(static_cast<size_t>(want), '\0');
      for (int64_t i = 0; i < want; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(tp.int32_data(static_cast<int>(i)));
      return from_packed(dtype, shape, bytes);
    }
    Tensor t(dtype, shape);
    int64_t size = dtype_size(dtype);
    for (int64_t i = 0; i < numel; ++i) {
      uint32_t v = static_cast<uint32_t>(tp.int32_data(static_cast<int>(i)));
      auto* dst = static_cast<uint8_t*>(t.data()) + i * size;
      if (dtype == DType::kBool) v = v != 0;
      std::memcpy(dst, &v, static_cast<size_t>(size));  // little-endian: the low bytes
    }
    return t;
  }

  std::string base_dir_, source_;
};

// ---------------------------------------------------------------------------
// Models

// Names that parse_expr reads as operators rather than symbols.
const std::set<std::string> kExprKeywords = {"floordiv", "mod", "min", "max", "select", "cast", "load", "inf", "nan"};

class Importer {
 public:
  Importer(std::string source, std::string base_dir) : source_(source), tensors_(base_dir, source) {}

  // Frees the initializers' raw data of `m` as they are converted, so a large
  // model is held about once in memory, not twice.
  Result<std::unique_ptr<Graph>> import_model(onnx::ModelProto& m) {
    if (!m.has_graph()) return err() << "model has no graph";
    auto g = std::make_unique<Graph>();
    root_ = g.get();
    g->source = source_;
    for (const auto& op : m.opset_import()) g->opsets[normalize_domain(op.domain())] = op.version();
    for (const auto& fn : m.functions()) {
      auto key = std::make_pair(normalize_domain(fn.domain()), fn.name());
      if (functions_.count(key)) return err() << "model-local function " << fn.domain() << "::" << fn.name() << " is defined twice";
      functions_[key] = &fn;
      for (const auto& op : fn.opset_import()) g->opsets.emplace(normalize_domain(op.domain()), op.version());
    }
    if (m.graph().output_size() == 0) return err() << "graph " << graph_label(m.graph().name()) << " has no outputs";
    KILN_RETURN_IF_ERROR(import_graph(m.graph(), *g, nullptr, m.mutable_graph()));
    for (int i = 0; i < m.training_info_size(); ++i) {
      KILN_RETURN_IF_ERROR(import_training_info(m.training_info(i), *g, i));
    }
    Status v = g->verify();
    if (!v.is_ok()) return err() << "imported graph is inconsistent: " << v.message();
    return g;
  }

 private:
  struct Scope {
    Graph* graph;
    const Scope* parent;
  };

  StatusBuilder err() const {
    StatusBuilder b(StatusCode::kInvalidModel);
    b << source_ << ": ";
    return b;
  }

  static std::string graph_label(const std::string& name) { return name.empty() ? "<unnamed>" : "'" + name + "'"; }

  static std::string node_label(const onnx::NodeProto& n, size_t index) {
    std::string s = "node ";
    if (!n.domain().empty() && n.domain() != "ai.onnx") s += n.domain() + "::";
    s += n.op_type();
    s += n.name().empty() ? " (#" + std::to_string(index) + ")" : " '" + n.name() + "'";
    return s;
  }

  // ---- shapes

  std::string symbol_for(const std::string& param) {
    auto it = symbols_.find(param);
    if (it != symbols_.end()) return it->second;
    std::string s;
    for (char c : param) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      s += ok ? c : '_';
    }
    if (s[0] >= '0' && s[0] <= '9') s = "_" + s;
    if (kExprKeywords.count(s)) s += "_";
    while (used_symbols_.count(s) && symbols_by_name_[s] != param) s += "_";
    symbols_[param] = s;
    symbols_by_name_[s] = param;
    used_symbols_.insert(s);
    root_->bounds[s] = Interval{1, std::nullopt};
    return s;
  }

  std::string fresh_symbol() {
    std::string s;
    do {
      s = "_u" + std::to_string(next_fresh_++);
    } while (used_symbols_.count(s));
    used_symbols_.insert(s);
    symbols_by_name_[s] = "";
    root_->bounds[s] = Interval{0, std::nullopt};
    return s;
  }

  // required: a top-level input, which must have a tensor type with a dtype.
  Result<TensorType> type_of(const onnx::ValueInfoProto& vi, bool required, const std::string& what) {
    if (!vi.has_type()) {
      if (required) return err() << what << " has no type";
      return TensorType{};
    }
    return type_of(vi.type(), required, what, 0);
  }

  // A sequence or optional type: a container of its element type (see
  // TensorType::elem) whose length is a fresh symbol. The element's dims are
  // per element, so named ones are not graph symbols: only a static shape
  // (or the rank, as fresh dims) is kept.
  Result<TensorType> type_of(const onnx::TypeProto& tp, bool required, const std::string& what, int depth) {
    if (tp.has_sequence_type() || tp.has_optional_type()) {
      if (depth > 4) return unsupported() << source_ << ": " << what << " nests containers too deeply";
      bool seq = tp.has_sequence_type();
      const onnx::TypeProto* et = seq ? (tp.sequence_type().has_elem_type() ? &tp.sequence_type().elem_type() : nullptr)
                                      : (tp.optional_type().has_elem_type() ? &tp.optional_type().elem_type() : nullptr);
      if (!et) return err() << what << " is a " << (seq ? "sequence" : "optional") << " without an element type";
      if (et->has_optional_type() || (seq && et->has_sequence_type()))
        return unsupported() << source_ << ": " << what << " has a " << (seq ? "sequence" : "optional") << " of "
                             << (et->has_optional_type() ? "optionals" : "sequences") << "; Kiln supports sequences of tensors and optionals of tensors or sequences";
      KILN_ASSIGN_OR_RETURN(TensorType e, type_of(*et, true, what + " element", depth + 1));
      if (!e.is_container() && e.shape) {
        bool all_static = true;
        for (const Dim& d : *e.shape) all_static = all_static && d.is_const();
        if (!all_static) {
          Shape fresh;
          for (size_t i = 0; i < e.shape->size(); ++i) fresh.push_back(var(fresh_symbol()));
          e.shape = std::move(fresh);
        }
      }
      Dim length = var(fresh_symbol());
      if (!seq) {
        // The length (0 or 1) is a symbol bounded to [0, 1].
        root_->bounds[length.to_string()] = Interval{0, 1};
      }
      return TensorType::container(seq ? DType::kSequence : DType::kOptional, std::move(e), length);
    }
    if (!tp.has_tensor_type()) {
      const char* kind = tp.has_map_type() ? "map" : tp.has_sparse_tensor_type() ? "sparse tensor" : "non-tensor";
      return unsupported() << source_ << ": " << what << " has a " << kind << " type; only tensors, sequences and optionals are supported";
    }
    TensorType t;
    const auto& tt = tp.tensor_type();
    int elem = tt.elem_type();
    if (elem < 0 || elem > kMaxDType || (elem == 0 && required))
      return err() << what << " has unknown data type " << elem;
    t.dtype = static_cast<DType>(elem);
    if (!tt.has_shape()) return t;
    Shape shape;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value()) {
        if (d.dim_value() < 0) return err() << what << " has a negative dimension " << d.dim_value();
        shape.push_back(Dim(d.dim_value()));
      } else if (d.has_dim_param() && !d.dim_param().empty()) {
        shape.push_back(var(symbol_for(d.dim_param())));
      } else {
        shape.push_back(var(fresh_symbol()));
      }
    }
    t.shape = std::move(shape);
    return t;
  }

  // ---- sparse tensors

  Result<Tensor> sparse_to_dense(const onnx::SparseTensorProto& sp, const std::string& what) {
    KILN_ASSIGN_OR_RETURN(Tensor values, tensors_.read(sp.values(), what + " (values)"));
    KILN_ASSIGN_OR_RETURN(Tensor indices, tensors_.read(sp.indices(), what + " (indices)"));
    std::vector<int64_t> shape;
    for (int64_t d : sp.dims()) {
      if (d < 0) return err() << what << " has a negative dimension " << d;
      shape.push_back(d);
    }
    DType dt = values.dtype();
    if (dt == DType::kInt4 || dt == DType::kUInt4 || dt == DType::kFloat4E2M1)
      return unsupported() << source_ << ": " << what << ": sparse 4-bit tensors are not supported";
    if (indices.dtype() != DType::kInt64) return err() << what << ": sparse indices must be int64";
    if (values.rank() != 1) return err() << what << ": sparse values must be 1-D";
    int64_t nnz = values.numel();
    bool linear = indices.rank() == 1;
    if (!(linear && indices.numel() == nnz) &&
        !(indices.rank() == 2 && indices.shape()[0] == nnz && indices.shape()[1] == static_cast<int64_t>(shape.size())))
      return err() << what << ": sparse indices " << indices.describe() << " do not match " << nnz << " values";
    Tensor dense(dt, shape);
    int64_t total = dense.numel();
    int64_t size = dtype_size(dt);
    const int64_t* idx = indices.data_as<int64_t>();
    for (int64_t k = 0; k < nnz; ++k) {
      int64_t flat = 0;
      if (linear) {
        flat = idx[k];
      } else {
        for (size_t d = 0; d < shape.size(); ++d) {
          int64_t i = idx[k * static_cast<int64_t>(shape.size()) + static_cast<int64_t>(d)];
          if (i < 0 || i >= shape[d]) return err() << what << ": sparse index out of range";
          flat = flat * shape[d] + i;
        }
      }
      if (flat < 0 || flat >= total) return err() << what << ": sparse index " << flat << " out of range";
      if (dt == DType::kString) {
        dense.data_as<std::string>()[flat] = values.data_as<std::string>()[k];
      } else {
        std::memcpy(static_cast<char*>(dense.data()) + flat * size, static_cast<const char*>(values.data()) + k * size,
                    static_cast<size_t>(size));
      }
    }
    return dense;
  }

  // ---- functions

  // Default attribute values of a function (FunctionProto.attribute_proto,
  // field 11, which the ONNX 1.12 protos keep as an unknown field).
  static std::map<std::string, onnx::AttributeProto> function_defaults(const onnx::FunctionProto& fn) {
    std::map<std::string, onnx::AttributeProto> out;
    const auto& unknown = fn.GetReflection()->GetUnknownFields(fn);
    for (int i = 0; i < unknown.field_count(); ++i) {
      const auto& f = unknown.field(i);
      if (f.number() != 11 || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      onnx::AttributeProto ap;
      if (ap.ParseFromString(f.length_delimited())) out[ap.name()] = ap;
    }
    return out;
  }

  // Renames every value name in a node (and in its subgraphs, consistently)
  // and substitutes attribute references.
  using Renamer = std::function<std::string(const std::string&)>;
  using AttrLookup = std::function<const onnx::AttributeProto*(const std::string&)>;

  static void rename_graph(onnx::GraphProto& g, const Renamer& rename, const AttrLookup& lookup) {
    for (auto& vi : *g.mutable_input()) vi.set_name(rename(vi.name()));
    for (auto& vi : *g.mutable_output()) vi.set_name(rename(vi.name()));
    for (auto& vi : *g.mutable_value_info()) vi.set_name(rename(vi.name()));
    for (auto& t : *g.mutable_initializer()) t.set_name(rename(t.name()));
    for (auto& s : *g.mutable_sparse_initializer()) {
      s.mutable_values()->set_name(rename(s.values().name()));
      s.mutable_indices()->set_name(rename(s.indices().name()));
    }
    for (auto& n : *g.mutable_node()) rename_node(n, rename, lookup);
  }

  static void rename_node(onnx::NodeProto& n, const Renamer& rename, const AttrLookup& lookup) {
    for (auto& s : *n.mutable_input()) s = s.empty() ? s : rename(s);
    for (auto& s : *n.mutable_output()) s = s.empty() ? s : rename(s);
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
    for (const auto& a : n.attribute()) {
      if (a.has_ref_attr_name()) {
        const onnx::AttributeProto* actual = lookup(a.ref_attr_name());
        if (!actual) continue;
        onnx::AttributeProto copy = *actual;
        copy.set_name(a.name());
        *attrs.Add() = std::move(copy);
        continue;
      }
      onnx::AttributeProto copy = a;
      if (copy.has_g()) rename_graph(*copy.mutable_g(), rename, lookup);
      for (auto& sg : *copy.mutable_graphs()) rename_graph(sg, rename, lookup);
      *attrs.Add() = std::move(copy);
    }
    *n.mutable_attribute() = std::move(attrs);
  }

  Status expand_functions(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& in,
                          std::vector<onnx::NodeProto>& out, int depth) {
    for (int ni = 0; ni < in.size(); ++ni) {
      const onnx::NodeProto& call = in[ni];
      auto it = functions_.find({normalize_domain(call.domain()), call.op_type()});
      if (it == functions_.end()) {
        out.push_back(call);
        continue;
      }
      const onnx::FunctionProto& fn = *it->second;
      if (depth > 64) return err() << node_label(call, static_cast<size_t>(ni)) << ": function expansion nests too deeply (recursive function?)";
      if (call.input_size() > fn.input_size() || call.output_size() > fn.output_size())
        return err() << node_label(call, static_cast<size_t>(ni)) << " passes " << call.input_size() << " inputs and "
                     << call.output_size() << " outputs to function " << fn.name() << ", which has " << fn.input_size()
                     << " and " << fn.output_size();
      std::map<std::string, std::string> formals;
      for (int i = 0; i < fn.input_size(); ++i) formals[fn.input(i)] = i < call.input_size() ? call.input(i) : "";
      for (int i = 0; i < fn.output_size(); ++i) formals[fn.output(i)] = i < call.output_size() ? call.output(i) : "";
      std::string prefix = fn.name() + "." + std::to_string(expansions_++) + ".";
      Renamer rename = [&](const std::string& name) {
        auto f = formals.find(name);
        return f != formals.end() ? f->second : prefix + name;
      };
      std::map<std::string, onnx::AttributeProto> defaults = function_defaults(fn);
      std::map<std::string, const onnx::AttributeProto*> caller;
      for (const auto& a : call.attribute()) caller[a.name()] = &a;
      AttrLookup lookup = [&](const std::string& name) -> const onnx::AttributeProto* {
        if (auto c = caller.find(name); c != caller.end()) return c->second;
        if (auto d = defaults.find(name); d != defaults.end()) return &d->second;
        return nullptr;
      };
      google::protobuf::RepeatedPtrField<onnx::NodeProto> body;
      for (const auto& bn : fn.node()) {
        onnx::NodeProto copy = bn;
        rename_node(copy, rename, lookup);
        std::string inner = bn.name().empty() ? bn.op_type() : bn.name();
        copy.set_name((call.name().empty() ? fn.name() : call.name()) + "/" + inner);
        *body.Add() = std::move(copy);
      }
      // Optional formal outputs the call omits are dropped by the renaming to "".
      KILN_RETURN_IF_ERROR(expand_functions(body, out, depth + 1));
    }
    return Status::ok();
  }

  // ---- graphs

  // Names read by a graph (its nodes, nested graphs and outputs) that it does
  // not define itself: the names it needs from enclosing graphs.
  static void free_names(const onnx::GraphProto& g, std::set<std::string>& out) {
    std::unordered_set<std::string> defined;
    for (const auto& vi : g.input()) defined.insert(vi.name());
    for (const auto& t : g.initializer()) defined.insert(t.name());
    for (const auto& s : g.sparse_initializer()) defined.insert(s.values().name());
    for (const auto& n : g.node())
      for (const auto& o : n.output()) defined.insert(o);
    std::set<std::string> used;
    for (const auto& n : g.node()) node_reads(n, used);
    for (const auto& o : g.output()) used.insert(o.name());
    for (const auto& u : used)
      if (!u.empty() && !defined.count(u)) out.insert(u);
  }

  // Explicit inputs plus names read by the node's subgraphs from outside.
  static void node_reads(const onnx::NodeProto& n, std::set<std::string>& out) {
    for (const auto& i : n.input())
      if (!i.empty()) out.insert(i);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) free_names(a.g(), out);
      for (const auto& sg : a.graphs()) free_names(sg, out);
    }
  }

  Value* resolve(const Scope& s, const std::string& name) {
    if (Value* v = s.graph->find_value(name)) return v;
    if (!s.parent) return nullptr;
    Value* outer = resolve(*s.parent, name);
    if (!outer) return nullptr;
    return s.graph->add_capture(name, outer->type());
  }

  Result<Attribute> attribute(const onnx::AttributeProto& ap, const Scope& scope, const std::string& where) {
    using AP = onnx::AttributeProto;
    Attribute a;
    int type = ap.type();
    if (type == AP::UNDEFINED) {
      if (ap.has_f()) type = AP::FLOAT;
      else if (ap.has_i()) type = AP::INT;
      else if (ap.has_s()) type = AP::STRING;
      else if (ap.has_t()) type = AP::TENSOR;
      else if (ap.has_g()) type = AP::GRAPH;
      else if (ap.floats_size()) type = AP::FLOATS;
      else if (ap.ints_size()) type = AP::INTS;
      else if (ap.strings_size()) type = AP::STRINGS;
      else if (ap.tensors_size()) type = AP::TENSORS;
      else if (ap.graphs_size()) type = AP::GRAPHS;
      else return err() << where << ": attribute '" << ap.name() << "' has no type and no value";
    }
    std::string what = where + " attribute '" + ap.name() + "'";
    switch (type) {
      case AP::FLOAT: a.kind = Attribute::Kind::kFloat; a.f = ap.f(); break;
      case AP::INT: a.kind = Attribute::Kind::kInt; a.i = ap.i(); break;
      case AP::STRING: a.kind = Attribute::Kind::kString; a.s = ap.s(); break;
      case AP::TENSOR: {
        a.kind = Attribute::Kind::kTensor;
        KILN_ASSIGN_OR_RETURN(a.t, tensors_.read(ap.t(), what));
        break;
      }
      case AP::SPARSE_TENSOR: {
        a.kind = Attribute::Kind::kTensor;
        KILN_ASSIGN_OR_RETURN(a.t, sparse_to_dense(ap.sparse_tensor(), what));
        break;
      }
      case AP::GRAPH: {
        a.kind = Attribute::Kind::kGraph;
        a.g = std::make_shared<Graph>();
        KILN_RETURN_IF_ERROR(import_graph(ap.g(), *a.g, &scope));
        break;
      }
      case AP::FLOATS:
        a.kind = Attribute::Kind::kFloats;
        a.floats.assign(ap.floats().begin(), ap.floats().end());
        break;
      case AP::INTS:
        a.kind = Attribute::Kind::kInts;
        a.ints.assign(ap.ints().begin(), ap.ints().end());
        break;
      case AP::STRINGS:
        a.kind = Attribute::Kind::kStrings;
        a.strings.assign(ap.strings().begin(), ap.strings().end());
        break;
      case AP::TENSORS:
        a.kind = Attribute::Kind::kTensors;
        for (const auto& t : ap.tensors()) {
          KILN_ASSIGN_OR_RETURN(Tensor x, tensors_.read(t, what));
          a.tensors.push_back(std::move(x));
        }
        break;
      case AP::SPARSE_TENSORS:
        a.kind = Attribute::Kind::kTensors;
        for (const auto& t : ap.sparse_tensors()) {
          KILN_ASSIGN_OR_RETURN(Tensor x, sparse_to_dense(t, what));
          a.tensors.push_back(std::move(x));
        }
        break;
      case AP::GRAPHS:
        a.kind = Attribute::Kind::kGraphs;
        for (const auto& sg : ap.graphs()) {
          auto g = std::make_shared<Graph>();
          KILN_RETURN_IF_ERROR(import_graph(sg, *g, &scope));
          a.graphs.push_back(std::move(g));
        }
        break;
      case AP::TYPE_PROTO: {
        // (Optional's `type`.) Kiln keeps [0, dtype] for a tensor type and
        // [kSequence, dtype] for a sequence of tensors.
        const onnx::TypeProto& tp = ap.tp();
        const onnx::TypeProto* t = &tp;
        int64_t container = 0;
        if (tp.has_sequence_type() && tp.sequence_type().has_elem_type()) {
          container = static_cast<int64_t>(DType::kSequence);
          t = &tp.sequence_type().elem_type();
        }
        if (!t->has_tensor_type() || t->tensor_type().elem_type() <= 0 || t->tensor_type().elem_type() > kMaxDType)
          return unsupported() << source_ << ": " << what << " is a type other than a tensor or a sequence of tensors";
        a.kind = Attribute::Kind::kInts;
        a.ints = {container, t->tensor_type().elem_type()};
        break;
      }
      default:
        return unsupported() << source_ << ": " << what << " has unsupported attribute type " << type;
    }
    return a;
  }

  // The tensor of a Constant node.
  Result<Tensor> constant_value(const onnx::NodeProto& n, const std::string& where) {
    for (const auto& ap : n.attribute()) {
      const std::string& k = ap.name();
      std::string what = where + " attribute '" + k + "'";
      if (k == "value") return tensors_.read(ap.t(), what);
      if (k == "sparse_value") return sparse_to_dense(ap.sparse_tensor(), what);
      if (k == "value_float") {
        Tensor t(DType::kFloat32, {});
        t.data_as<float>()[0] = ap.f();
        return t;
      }
      if (k == "value_int") {
        Tensor t(DType::kInt64, {});
        t.data_as<int64_t>()[0] = ap.i();
        return t;
      }
      if (k == "value_string") {
        Tensor t(DType::kString, {});
        t.data_as<std::string>()[0] = ap.s();
        return t;
      }
      if (k == "value_floats") {
        Tensor t(DType::kFloat32, {static_cast<int64_t>(ap.floats_size())});
        for (int i = 0; i < ap.floats_size(); ++i) t.data_as<float>()[i] = ap.floats(i);
        return t;
      }
      if (k == "value_ints") {
        Tensor t(DType::kInt64, {static_cast<int64_t>(ap.ints_size())});
        for (int i = 0; i < ap.ints_size(); ++i) t.data_as<int64_t>()[i] = ap.ints(i);
        return t;
      }
      if (k == "value_strings") {
        Tensor t(DType::kString, {static_cast<int64_t>(ap.strings_size())});
        for (int i = 0; i < ap.strings_size(); ++i) t.data_as<std::string>()[i] = ap.strings(i);
        return t;
      }
    }
    return err() << where << " has no value attribute";
  }

  // Before opset 7, a binary op broadcast its second input only with
  // `broadcast` = 1, aligning that input's dims with the first input's from
  // `axis` on (trailing dims, numpy's rule, when `axis` is absent); PRelu
  // applied a 1-D slope per channel (dim 1). Where the alignment is not
  // numpy's, the second input is reshaped here to rank(A) - axis trailing
  // ones more, with graph ops (Shape, Size, Sub, ConstantOfShape, Concat,
  // Reshape) that shape inference folds; a negative count (the input does not
  // fit after `axis`) fails in ConstantOfShape, named after this node.
  Status align_legacy_broadcast(Graph& g, const onnx::NodeProto& np, std::map<std::string, Attribute>& attrs,
                                std::vector<Value*>& ins, const std::unordered_map<std::string, size_t>& producer) {
    if (!normalize_domain(np.domain()).empty() || ins.size() < 2 || !ins[0] || !ins[1]) return Status::ok();
    auto op = root_->opsets.find("");
    if (op == root_->opsets.end() || op->second >= 7) return Status::ok();
    static const std::set<std::string> kLegacy = {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor",
                                                  "Equal", "Greater", "Less"};
    int64_t axis = 0;
    if (kLegacy.count(np.op_type())) {
      auto b = attrs.find("broadcast"), a = attrs.find("axis");
      if (b == attrs.end() || b->second.i != 1 || a == attrs.end()) return Status::ok();
      axis = a->second.i;
      attrs.erase(a);
    } else if (np.op_type() == "PRelu") {
      // Only a slope known to be 1-D with more than one element: a rank-1
      // tensor of size 1 broadcasts the same under either rule.
      Value* s = ins[1];
      if (s->type().rank() != 1 || (*s->type().shape)[0].as_const() == std::optional<int64_t>(1)) return Status::ok();
      axis = 1;
    } else {
      return Status::ok();
    }
    if (axis < 0) return err() << np.op_type() << " node '" << np.name() << "': legacy broadcast axis " << axis << " is negative";
    std::string base = (np.name().empty() ? np.op_type() : np.name()) + "/legacy_broadcast";
    auto fresh = [&](const std::string& what) {
      std::string name = g.unique_name(base + "/" + what);
      for (int k = 0; producer.count(name); ++k) name = g.unique_name(base + "/" + what + std::to_string(k));
      return name;
    };
    auto one_node = [&](const std::string& op_type, std::vector<Value*> in, const std::string& what) {
      return g.add_node(op_type, in, {fresh(what)}, "", base + "/" + what)->output(0);
    };
    auto i64 = [&](std::vector<int64_t> shape, std::vector<int64_t> vals, const std::string& what) {
      Tensor t(DType::kInt64, std::move(shape));
      for (size_t i = 0; i < vals.size(); ++i) t.data_as<int64_t>()[i] = vals[i];
      return g.add_constant(fresh(what), std::move(t));
    };
    Value* rank_a = one_node("Size", {one_node("Shape", {ins[0]}, "shape_a")}, "rank_a");
    Value* shape_b = one_node("Shape", {ins[1]}, "shape_b");
    Value* rank_b = one_node("Size", {shape_b}, "rank_b");
    Value* count = one_node("Sub", {one_node("Sub", {rank_a, i64({}, {axis}, "axis")}, "after_axis"), rank_b}, "count");
    Value* count1 = one_node("Reshape", {count, i64({1}, {1}, "one_dim")}, "count_1d");
    Node* ones = g.add_node("ConstantOfShape", {count1}, {fresh("ones")}, "", base + "/ones");
    Tensor one(DType::kInt64, {1});
    one.data_as<int64_t>()[0] = 1;
    ones->set_attr("value", Attribute::of_tensor(std::move(one)));
    Node* cat = g.add_node("Concat", {shape_b, ones->output(0)}, {fresh("new_shape")}, "", base + "/new_shape");
    cat->set_attr("axis", Attribute::of_int(0));
    ins[1] = one_node("Reshape", {ins[1], cat->output(0)}, "aligned");
    return Status::ok();
  }

  // release: the same GraphProto, mutable, to free initializer data once converted.
  // ModelProto.training_info[index]: its graphs read the model's values as
  // captures; their own names may not repeat the model's (ONNX runs the
  // model's graph and the algorithm as one). Bindings name initializers of
  // the model or of the algorithm, bound to outputs of the graph they come from.
  Status import_training_info(const onnx::TrainingInfoProto& tp, Graph& model, int index) {
    const std::string where = "training_info[" + std::to_string(index) + "]";
    TrainingInfo info;
    Scope outer{&model, nullptr};
    auto captured = [](const Graph& g, const Value* v) {
      return std::find(g.captures().begin(), g.captures().end(), v) != g.captures().end();
    };
    auto import_part = [&](const onnx::GraphProto& gp, const char* part) -> Result<std::shared_ptr<Graph>> {
      auto g = std::make_shared<Graph>();
      Status st = import_graph(gp, *g, &outer, nullptr, /*typed_inputs=*/true);
      if (!st.is_ok()) {
        // "<file>: <what>" becomes "<file>: training_info[i].<part>: <what>".
        std::string what = st.message();
        if (what.rfind(source_ + ": ", 0) == 0) what = what.substr(source_.size() + 2);
        return Status(st.code(), source_ + ": " + where + "." + part + ": " + what);
      }
      for (const Value* v : g->values())
        if (!captured(*g, v) && model.find_value(v->name()) != nullptr)
          return err() << where << "." << part << ": value '" << v->name()
                       << "' is defined twice (in the model's graph and in the " << part << " graph)";
      return g;
    };
    if (!tp.has_algorithm()) return err() << where << " has no algorithm graph";
    KILN_ASSIGN_OR_RETURN(info.algorithm, import_part(tp.algorithm(), "algorithm"));
    if (tp.has_initialization() && tp.initialization().node_size() + tp.initialization().output_size() > 0) {
      KILN_ASSIGN_OR_RETURN(info.initialization, import_part(tp.initialization(), "initialization"));
      if (!info.initialization->inputs().empty())
        return err() << where << ".initialization has inputs; ONNX's initialization graph has none";
    }
    auto is_initializer = [&](const std::string& name) {
      const Value* v = model.find_value(name);
      if (v == nullptr) v = info.algorithm->find_value(name);
      return v != nullptr && v->is_constant();
    };
    auto bindings = [&](const auto& entries, const Graph* from, const char* what,
                        std::vector<std::pair<std::string, std::string>>& out) -> Status {
      std::set<std::string> keys;
      for (const auto& e : entries) {
        if (!is_initializer(e.key()))
          return err() << where << "." << what << ": '" << e.key() << "' is not an initializer of the model or its algorithm";
        if (!keys.insert(e.key()).second) return err() << where << "." << what << ": '" << e.key() << "' is bound twice";
        const Value* to = from == nullptr ? nullptr : from->find_value(e.value());
        bool is_output = to != nullptr && std::find(from->outputs().begin(), from->outputs().end(), to) != from->outputs().end();
        if (!is_output)
          return err() << where << "." << what << ": '" << e.key() << "' is bound to '" << e.value()
                       << "', which is not an output of the " << (from == info.algorithm.get() ? "algorithm" : "initialization")
                       << " graph";
        out.emplace_back(e.key(), e.value());
      }
      return Status::ok();
    };
    KILN_RETURN_IF_ERROR(bindings(tp.update_binding(), info.algorithm.get(), "update_binding", info.update_binding));
    KILN_RETURN_IF_ERROR(bindings(tp.initialization_binding(), info.initialization.get(), "initialization_binding",
                                  info.initialization_binding));
    model.training_info.push_back(std::move(info));
    return Status::ok();
  }

  // typed_inputs: the graph's inputs must have tensor types, as the top
  // level's do (a training algorithm's are fed like the model's).
  Status import_graph(const onnx::GraphProto& gp, Graph& g, const Scope* parent, onnx::GraphProto* release = nullptr,
                      bool typed_inputs = false) {
    g.name = gp.name();
    Scope scope{&g, parent};
    bool top = parent == nullptr || typed_inputs;
    std::string gl = "graph " + graph_label(gp.name());
    auto define_check = [&](const std::string& name, const std::string& what) -> Status {
      if (name.empty()) return err() << gl << ": " << what << " has an empty name";
      if (g.find_value(name)) return err() << gl << ": value '" << name << "' is defined twice (" << what << ")";
      return Status::ok();
    };

    for (const auto& t : gp.initializer()) {
      std::string what = "initializer '" + t.name() + "'";
      KILN_RETURN_IF_ERROR(define_check(t.name(), what));
      KILN_ASSIGN_OR_RETURN(Tensor x, tensors_.read(t, what));
      g.add_constant(t.name(), std::move(x));
    }
    if (release)
      for (auto& t : *release->mutable_initializer())
        if (t.has_raw_data()) std::unique_ptr<std::string>(t.release_raw_data());
    for (const auto& s : gp.sparse_initializer()) {
      std::string what = "sparse initializer '" + s.values().name() + "'";
      KILN_RETURN_IF_ERROR(define_check(s.values().name(), what));
      KILN_ASSIGN_OR_RETURN(Tensor x, sparse_to_dense(s, what));
      g.add_constant(s.values().name(), std::move(x));
    }
    std::unordered_set<std::string> input_names;
    for (const auto& vi : gp.input()) {
      std::string what = gl + " input '" + vi.name() + "'";
      if (!input_names.insert(vi.name()).second) return err() << gl << ": input '" << vi.name() << "' is listed twice";
      Value* existing = g.find_value(vi.name());
      if (existing && existing->is_constant()) continue;  // an initializer: a constant
      KILN_RETURN_IF_ERROR(define_check(vi.name(), "graph input"));
      KILN_ASSIGN_OR_RETURN(TensorType t, type_of(vi, top, what));
      g.add_input(vi.name(), std::move(t));
    }

    std::vector<onnx::NodeProto> nodes;
    KILN_RETURN_IF_ERROR(expand_functions(gp.node(), nodes, 0));

    // Producers of names, duplicate definitions.
    std::unordered_map<std::string, size_t> producer;
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (const auto& o : nodes[i].output()) {
        if (o.empty()) continue;
        if (g.find_value(o) || producer.count(o))
          return err() << gl << ": " << node_label(nodes[i], i) << " defines value '" << o << "', which is already defined";
        producer[o] = i;
      }
    }
    // Topological order, keeping the file's order where it is one.
    std::vector<std::vector<size_t>> deps(nodes.size()), users(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      std::set<std::string> reads;
      node_reads(nodes[i], reads);
      std::set<size_t> seen;
      for (const auto& r : reads) {
        auto it = producer.find(r);
        if (it == producer.end() || !seen.insert(it->second).second) continue;
        deps[i].push_back(it->second);
        users[it->second].push_back(i);
      }
    }
    std::vector<size_t> pending(nodes.size()), order;
    std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
    for (size_t i = 0; i < nodes.size(); ++i)
      if ((pending[i] = deps[i].size()) == 0) ready.push(i);
    while (!ready.empty()) {
      size_t i = ready.top();
      ready.pop();
      order.push_back(i);
      for (size_t u : users[i])
        if (--pending[u] == 0) ready.push(u);
    }
    if (order.size() != nodes.size()) {
      std::vector<bool> done(nodes.size(), false);
      for (size_t i : order) done[i] = true;
      size_t cur = 0;
      while (done[cur]) ++cur;
      std::vector<bool> visited(nodes.size(), false);
      while (!visited[cur]) {
        visited[cur] = true;
        for (size_t d : deps[cur])
          if (!done[d]) {
            cur = d;
            break;
          }
      }
      return err() << gl << " has a cycle through " << node_label(nodes[cur], cur);
    }

    for (size_t idx : order) {
      const onnx::NodeProto& np = nodes[idx];
      std::string where = gl + ": " + node_label(np, idx);
      bool is_constant = np.op_type() == "Constant" && normalize_domain(np.domain()).empty();
      std::vector<Value*> ins;
      for (const auto& name : np.input()) {
        if (name.empty()) {
          ins.push_back(nullptr);
          continue;
        }
        Value* v = resolve(scope, name);
        if (!v) return err() << where << ": input '" << name << "' is never defined";
        ins.push_back(v);
      }
      if (is_constant) {
        if (np.output_size() != 1 || np.output(0).empty()) return err() << where << " must have exactly one output";
        KILN_ASSIGN_OR_RETURN(Tensor t, constant_value(np, where));
        g.add_constant(np.output(0), std::move(t));
        continue;
      }
      std::map<std::string, Attribute> attrs;
      for (const auto& ap : np.attribute()) {
        if (attrs.count(ap.name())) return err() << where << ": attribute '" << ap.name() << "' is given twice";
        // Kiln-internal attributes (weight layouts, implementation choices) are
        // set by the compiler on its own graph; from a file they could name a
        // layout the stored tensor does not have.
        if (ap.name().rfind("kiln_", 0) == 0)
          return err() << where << ": attribute '" << ap.name() << "' is internal to Kiln and not accepted in a model file";
        KILN_ASSIGN_OR_RETURN(Attribute a, attribute(ap, scope, where));
        attrs[ap.name()] = std::move(a);
      }
      // Captures added while importing subgraphs may not clash with this node's outputs.
      for (const auto& o : np.output())
        if (!o.empty() && g.find_value(o))
          return err() << where << " defines value '" << o << "', which is already defined (shadowing an outer value)";
      std::vector<std::string> outs(np.output().begin(), np.output().end());
      KILN_RETURN_IF_ERROR(align_legacy_broadcast(g, np, attrs, ins, producer));
      Node* n = g.add_node(np.op_type(), ins, outs, normalize_domain(np.domain()), np.name());
      for (auto& [k, a] : attrs) n->set_attr(k, std::move(a));
      n->set_onnx_schema_pending(true);
    }

    std::vector<Value*> outs;
    for (const auto& vi : gp.output()) {
      Value* v = vi.name().empty() ? nullptr : resolve(scope, vi.name());
      if (!v) return err() << gl << ": output '" << vi.name() << "' is never defined";
      outs.push_back(v);
    }
    g.set_outputs(std::move(outs));
    return Status::ok();
  }

  std::string source_;
  TensorReader tensors_;
  Graph* root_ = nullptr;
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> functions_;
  int expansions_ = 0;
  int next_fresh_ = 0;
  std::map<std::string, std::string> symbols_;          // dim_param -> symbol
  std::map<std::string, std::string> symbols_by_name_;  // symbol -> dim_param ("" for fresh)
  std::set<std::string> used_symbols_;
};

}  // namespace

Result<Tensor> tensor_from_onnx(const onnx::TensorProto& proto, const std::string& base_dir, const std::string& source) {
  TensorReader reader(base_dir, source);
  return reader.read(proto, "tensor '" + proto.name() + "'");
}

namespace {
Status parse_model(google::protobuf::io::ZeroCopyInputStream* stream, onnx::ModelProto& model,
                   const std::string& source_name) {
  google::protobuf::io::CodedInputStream coded(stream);
  coded.SetTotalBytesLimit(INT_MAX);
  if (!model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    return invalid_model() << source_name << ": not a valid ONNX model (protobuf parse failed: truncated or corrupt file)";
  return Status::ok();
}
}  // namespace

Result<std::unique_ptr<Graph>> import_onnx_bytes(const std::string& bytes, const std::string& source_name) {
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    return invalid_model() << source_name << ": model is larger than 2 GiB; store the weights as external data";
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  KILN_RETURN_IF_ERROR(parse_model(&stream, model, source_name));
  Importer importer(source_name, base_dir_of(source_name));
  return importer.import_model(model);
}

Result<std::unique_ptr<Graph>> import_onnx_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return not_found() << path << ": no such file";
  if (fs::file_size(path, ec) > static_cast<uintmax_t>(INT_MAX))
    return invalid_model() << path << ": model is larger than 2 GiB; store the weights as external data";
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return io_error() << path << ": cannot open";
  onnx::ModelProto model;
  Status parsed;
  {
    google::protobuf::io::FileInputStream stream(fd);
    parsed = parse_model(&stream, model, path);
    if (parsed.is_ok() && stream.GetErrno() != 0) parsed = io_error() << path << ": read failed";
  }
  ::close(fd);
  KILN_RETURN_IF_ERROR(parsed);
  Importer importer(path, base_dir_of(path));
  return importer.import_model(model);
}

Result<Tensor> read_tensor_proto_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  onnx::TensorProto proto;
  if (bytes.size() > static_cast<size_t>(INT_MAX) || !proto.ParseFromString(bytes))
    return invalid_model() << path << ": not a valid TensorProto (protobuf parse failed)";
  return tensor_from_onnx(proto, base_dir_of(path), path);
}

}  // namespace kiln
