#include "ops/onnx_schema.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

namespace kiln::ops {

namespace {

// One formal parameter: allowed element types per container kind, a bit per
// ONNX element type (kinds: tensor, seq(tensor), optional(tensor),
// optional(seq(tensor))).
struct SchemaFormal {
  const char* name;
  const char* type_str;  // a type variable ("T") or a literal type ("tensor(int64)")
  int option;            // 0 single, 1 optional, 2 variadic
  bool homogeneous;
  uint32_t masks[4];
};

struct SchemaAttribute {
  const char* name;
  int type;  // onnx AttributeProto::AttributeType
  bool required;
};

struct SchemaRow {
  const char* domain;
  const char* name;
  int since_version;
  int min_input, max_input, min_output, max_output;
  int inputs_begin, num_inputs, outputs_begin, num_outputs, attributes_begin, num_attributes;
  bool deprecated;
};

#include "onnx_schemas.inc"

constexpr size_t kNumSchemas = sizeof(kSchemas) / sizeof(kSchemas[0]);

// ONNX's element type names, indexed by TensorProto.DataType.
const char* const kOnnxElem[] = {"undefined", "float",      "uint8",          "int8",          "uint16",
                                 "int16",     "int32",      "int64",          "string",        "bool",
                                 "float16",   "double",     "uint32",         "uint64",        "complex64",
                                 "complex128", "bfloat16",  "float8e4m3fn",   "float8e4m3fnuz", "float8e5m2",
                                 "float8e5m2fnuz", "uint4", "int4",           "float4e2m1"};
static_assert(sizeof(kOnnxElem) / sizeof(kOnnxElem[0]) == kMaxDType + 1);

// A value's type as (container kind, element type); kind -1 when Kiln does not
// know it yet (no dtype, or a container without a known element type).
struct Kind {
  int kind = -1;
  int elem = 0;
  bool operator==(const Kind&) const = default;
};

Kind kind_of(const TensorType& t) {
  int d = static_cast<int>(t.dtype);
  if (t.dtype == DType::kUndefined) return {};
  if (!t.is_container()) return d <= kMaxDType ? Kind{0, d} : Kind{};
  if (!t.elem) return {};
  const TensorType& e = *t.elem;
  if (t.dtype == DType::kSequence) {
    if (e.is_container() || e.dtype == DType::kUndefined) return {};
    return {1, static_cast<int>(e.dtype)};
  }
  if (e.dtype == DType::kSequence) {
    if (!e.elem || e.elem->is_container() || e.elem->dtype == DType::kUndefined) return {};
    return {3, static_cast<int>(e.elem->dtype)};
  }
  if (e.is_container() || e.dtype == DType::kUndefined) return {};
  return {2, static_cast<int>(e.dtype)};
}

std::string kind_name(Kind k) {
  std::string e = std::string("tensor(") + kOnnxElem[k.elem] + ")";
  switch (k.kind) {
    case 1: return "seq(" + e + ")";
    case 2: return "optional(" + e + ")";
    case 3: return "optional(seq(" + e + "))";
    default: return e;
  }
}

std::string allowed_names(const SchemaFormal& f) {
  std::string out;
  for (int kind = 0; kind < 4; ++kind)
    for (int e = 1; e <= kMaxDType; ++e)
      if (f.masks[kind] & (1u << e)) out += (out.empty() ? "" : ", ") + kind_name({kind, e});
  return out;
}

bool is_type_variable(const SchemaFormal& f) { return std::strchr(f.type_str, '(') == nullptr; }

const char* attribute_type_name(int type) {
  switch (type) {
    case 1: return "float";
    case 2: return "int";
    case 3: return "string";
    case 4: return "tensor";
    case 5: return "graph";
    case 6: return "floats";
    case 7: return "ints";
    case 8: return "strings";
    case 9: return "tensors";
    case 10: return "graphs";
    case 11: return "sparse tensor";
    case 12: return "sparse tensors";
    case 13: return "type";
    case 14: return "types";
    default: return "unknown";
  }
}

// Whether an imported attribute of `kind` holds a value of ONNX type `type`
// (the importer keeps sparse tensors dense and a type as [container, dtype]).
bool attribute_matches(Attribute::Kind kind, int type) {
  using K = Attribute::Kind;
  switch (type) {
    case 1: return kind == K::kFloat;
    case 2: return kind == K::kInt;
    case 3: return kind == K::kString;
    case 4: case 11: return kind == K::kTensor;
    case 5: return kind == K::kGraph;
    case 6: return kind == K::kFloats;
    case 7: case 13: return kind == K::kInts;
    case 8: return kind == K::kStrings;
    case 9: case 12: return kind == K::kTensors;
    case 10: return kind == K::kGraphs;
    default: return false;
  }
}

const char* attribute_kind_name(Attribute::Kind kind) {
  using K = Attribute::Kind;
  switch (kind) {
    case K::kFloat: return "float";
    case K::kInt: return "int";
    case K::kString: return "string";
    case K::kTensor: return "tensor";
    case K::kGraph: return "graph";
    case K::kFloats: return "floats";
    case K::kInts: return "ints";
    case K::kStrings: return "strings";
    case K::kTensors: return "tensors";
    case K::kGraphs: return "graphs";
  }
  return "unknown";
}

// Checks the values `vs` (a node's inputs or outputs) against `count` formal
// parameters from `formals`, binding type variables in `bound`.
Status check_values(const OnnxSchema& schema, const char* side, const std::vector<Value*>& vs,
                    const SchemaFormal* formals, int count, std::map<std::string, Kind>& bound);

}  // namespace

struct OnnxSchema {
  const SchemaRow* row;
};

namespace {

const OnnxSchema* schema_at(size_t i) {
  static const std::vector<OnnxSchema> all = [] {
    std::vector<OnnxSchema> v;
    v.reserve(kNumSchemas);
    for (size_t k = 0; k < kNumSchemas; ++k) v.push_back({&kSchemas[k]});
    return v;
  }();
  return &all[i];
}

Status check_values(const OnnxSchema& schema, const char* side, const std::vector<Value*>& vs,
                    const SchemaFormal* formals, int count, std::map<std::string, Kind>& bound) {
  std::map<std::string, size_t> first_of;  // type variable -> index of the value that bound it
  for (size_t i = 0; i < vs.size(); ++i) {
    if (count == 0) break;
    int fi = std::min<int>(static_cast<int>(i), count - 1);
    const SchemaFormal& f = formals[fi];
    if (static_cast<int>(i) >= count && f.option != 2) break;  // counted by the caller
    const Value* v = vs[i];
    if (v == nullptr) {
      if (f.option != 1)
        return invalid_model() << side << " " << i << " ('" << f.name << "') of " << onnx_schema_name(schema)
                               << " is required but omitted";
      continue;
    }
    Kind k = kind_of(v->type());
    if (k.kind < 0) continue;
    if (!(f.masks[k.kind] & (1u << k.elem)))
      return invalid_model() << side << " " << i << " ('" << v->name() << "', formal '" << f.name << "') has type "
                             << kind_name(k) << "; " << onnx_schema_name(schema) << " accepts "
                             << (is_type_variable(f) ? std::string(f.type_str) + " in " : std::string()) << "{"
                             << allowed_names(f) << "}";
    // A heterogeneous variadic's values are each of some allowed type.
    if (!is_type_variable(f) || (f.option == 2 && !f.homogeneous)) continue;
    auto [it, inserted] = bound.emplace(f.type_str, k);
    if (inserted) {
      first_of[f.type_str] = i;
    } else if (!(it->second == k)) {
      auto first = first_of.find(f.type_str);
      std::ostringstream where;
      if (first != first_of.end()) where << side << " " << first->second << " ('" << vs[first->second]->name() << "')";
      else where << "the inputs";
      return invalid_model() << side << " " << i << " ('" << v->name() << "') has type " << kind_name(k) << " but "
                             << where.str() << " bound " << f.type_str << " of " << onnx_schema_name(schema) << " to "
                             << kind_name(it->second) << "; values of one type variable must have one dtype";
    }
  }
  return Status::ok();
}

}  // namespace

const OnnxSchema* find_onnx_schema(const std::string& domain, const std::string& op, int64_t opset) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  // kSchemas is sorted by (domain, name, since_version).
  const SchemaRow* best = nullptr;
  size_t best_index = 0;
  auto lo = std::lower_bound(kSchemas, kSchemas + kNumSchemas, std::make_pair(d, op), [](const SchemaRow& r, const auto& key) {
    int c = std::strcmp(r.domain, key.first.c_str());
    return c < 0 || (c == 0 && std::strcmp(r.name, key.second.c_str()) < 0);
  });
  for (const SchemaRow* r = lo; r != kSchemas + kNumSchemas && d == r->domain && op == r->name; ++r)
    if (r->since_version <= opset) {
      best = r;
      best_index = static_cast<size_t>(r - kSchemas);
    }
  return best ? schema_at(best_index) : nullptr;
}

const OnnxSchema* onnx_schema_for(const Node& n, const std::map<std::string, int64_t>& opsets) {
  const std::string d = n.domain() == "ai.onnx" ? "" : n.domain();
  if (d != "" && d != "ai.onnx.ml" && d != "ai.onnx.preview.training") return nullptr;
  auto it = opsets.find(d);
  if (it == opsets.end()) return nullptr;
  return find_onnx_schema(d, n.op_type(), it->second);
}

uint32_t onnx_input_tensor_types(const OnnxSchema& schema, int index) {
  const SchemaRow& r = *schema.row;
  if (index < 0 || r.num_inputs == 0 || index >= r.max_input) return 0;
  const int formal = std::min(index, r.num_inputs - 1);
  if (formal < index && kFormals[r.inputs_begin + formal].option != 2) return 0;
  return kFormals[r.inputs_begin + formal].masks[0];
}

int onnx_first_version(const std::string& domain, const std::string& op) {
  const OnnxSchema* s = find_onnx_schema(domain, op, std::numeric_limits<int>::max());
  if (s == nullptr) return 0;
  const SchemaRow* r = s->row;
  while (r > kSchemas && std::strcmp(r[-1].domain, r->domain) == 0 && std::strcmp(r[-1].name, r->name) == 0) --r;
  return r->since_version;
}

std::string onnx_schema_name(const OnnxSchema& schema) {
  std::string d = schema.row->domain;
  return (d.empty() ? "" : d + ".") + schema.row->name + "-" + std::to_string(schema.row->since_version);
}

const char* onnx_schema_source() { return kSchemaSource; }

Status check_onnx_inputs(const Node& n, const OnnxSchema& schema) {
  const SchemaRow& r = *schema.row;
  auto count_error = [&](const char* what, size_t have, int lo, int hi) -> Status {
    StatusBuilder b = invalid_model();
    b << "has " << have << " " << what << "; " << onnx_schema_name(schema) << " takes ";
    if (lo == hi) b << lo;
    else if (hi >= (1 << 30)) b << lo << " or more";
    else b << lo << " to " << hi;
    return b;
  };
  if (n.num_inputs() < static_cast<size_t>(r.min_input) || n.num_inputs() > static_cast<size_t>(r.max_input))
    return count_error("inputs", n.num_inputs(), r.min_input, r.max_input);
  if (n.num_outputs() < static_cast<size_t>(r.min_output) || n.num_outputs() > static_cast<size_t>(r.max_output))
    return count_error("outputs", n.num_outputs(), r.min_output, r.max_output);

  const SchemaAttribute* attrs = kAttributes + r.attributes_begin;
  for (const auto& [name, a] : n.attrs()) {
    if (name.rfind("kiln_", 0) == 0) continue;
    const SchemaAttribute* decl = nullptr;
    for (int i = 0; i < r.num_attributes && !decl; ++i)
      if (name == attrs[i].name) decl = &attrs[i];
    if (decl == nullptr) {
      std::string known;
      for (int i = 0; i < r.num_attributes; ++i) known += (i ? ", " : "") + std::string(attrs[i].name);
      return invalid_model() << "attribute '" << name << "' is not an attribute of " << onnx_schema_name(schema)
                             << " (" << (known.empty() ? "it has none" : "it has " + known) << ")";
    }
    if (!attribute_matches(a.kind, decl->type))
      return invalid_model() << "attribute '" << name << "' is a " << attribute_kind_name(a.kind) << "; "
                             << onnx_schema_name(schema) << " declares it a " << attribute_type_name(decl->type);
  }
  for (int i = 0; i < r.num_attributes; ++i)
    if (attrs[i].required && !n.has_attr(attrs[i].name))
      return invalid_model() << "required attribute '" << attrs[i].name << "' of " << onnx_schema_name(schema)
                             << " is missing";

  std::map<std::string, Kind> bound;
  return check_values(schema, "input", n.inputs(), kFormals + r.inputs_begin, r.num_inputs, bound);
}

Status check_onnx_outputs(const Node& n, const OnnxSchema& schema) {
  const SchemaRow& r = *schema.row;
  std::map<std::string, Kind> bound;
  KILN_RETURN_IF_ERROR(check_values(schema, "input", n.inputs(), kFormals + r.inputs_begin, r.num_inputs, bound));
  return check_values(schema, "output", n.outputs(), kFormals + r.outputs_begin, r.num_outputs, bound);
}

}  // namespace kiln::ops
