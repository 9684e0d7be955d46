#include "model_mutator.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kiln/kiln.h"
#include "ops/onnx_schema.h"

namespace kiln::fuzz {

namespace {

using Rng = std::mt19937;

template <typename T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

size_t below(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

int64_t odd_int(Rng& rng) {
  static const std::vector<int64_t> kOdd = {0,  1,  -1, 2,       -2,          3,         7,
                                            17, 1023, 1 << 20, int64_t{1} << 31, int64_t{1} << 40,
                                            std::numeric_limits<int64_t>::max(),
                                            std::numeric_limits<int64_t>::min(), -1000000};
  if (below(rng, 3) == 0) return std::uniform_int_distribution<int64_t>(-10, 10)(rng);
  return pick(rng, kOdd);
}

float odd_float(Rng& rng) {
  static const std::vector<float> kOdd = {0.f, -1.f, 1.f, 0.5f, 1e30f, -1e30f, 1e-30f,
                                          std::numeric_limits<float>::quiet_NaN(),
                                          std::numeric_limits<float>::infinity(),
                                          -std::numeric_limits<float>::infinity()};
  return pick(rng, kOdd);
}

const std::vector<std::string>& op_types() {
  static const std::vector<std::string> kOps = {
      "Add", "Sub", "Mul", "Div", "Mod", "Pow", "Relu", "Sigmoid", "Sin", "Cos", "Reciprocal", "Round", "Abs", "Neg",
      "Not", "And", "Or", "Xor", "Equal", "Less", "LessEqual", "Greater", "Where", "Cast", "CastLike", "Concat",
      "Split", "Slice", "Gather", "GatherND", "GatherElements", "Scatter", "ScatterND", "ScatterElements",
      "Reshape", "Transpose", "Tile", "Expand", "Pad", "MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool",
      "AveragePool", "GlobalAveragePool", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceSumSquare", "Softmax",
      "LogSoftmax", "LayerNormalization", "BatchNormalization", "Range", "HardSwish", "HannWindow", "TopK",
      "NonZero", "Squeeze", "Unsqueeze", "Flatten", "Shape", "Size", "ConstantOfShape", "Resize", "Einsum",
      "Clip", "Max", "Min", "Sum", "Mean", "CumSum", "OneHot", "Trilu", "DepthToSpace", "SpaceToDepth", "ArgMax",
      "Bernoulli", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "Identity", "Dropout", "BitShift",
      "QuantizeLinear", "DequantizeLinear", "Erf", "Sqrt", "Log", "Exp", "IsNaN", "Sign"};
  return kOps;
}

const std::vector<std::string>& attribute_names() {
  static const std::vector<std::string> kNames = {"axis", "axes", "perm", "kernel_shape", "strides", "pads",
                                                  "dilations", "group", "keepdims", "to", "mode", "alpha",
                                                  "ceil_mode", "count_include_pad", "batch_dims", "k"};
  return kNames;
}

// Every graph of the model: the main graph and the subgraphs of its nodes' attributes.
void collect_graphs(onnx::GraphProto* g, std::vector<onnx::GraphProto*>& out) {
  out.push_back(g);
  for (auto& n : *g->mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) collect_graphs(a.mutable_g(), out);
      for (auto& sg : *a.mutable_graphs()) collect_graphs(&sg, out);
    }
}

// Bytes of n elements of ONNX element type dt (Kiln's DType numbering is ONNX's).
int64_t element_bytes(int dt, int64_t n) {
  auto t = static_cast<DType>(dt);
  if (t == DType::kInt4 || t == DType::kUInt4 || t == DType::kFloat4E2M1) return (n + 1) / 2;
  return dtype_size(t) * n;
}

int random_dtype(Rng& rng) {
  int dt = static_cast<int>(std::uniform_int_distribution<int>(1, 23)(rng));
  return dt == onnx::TensorProto::STRING ? onnx::TensorProto::BOOL : dt;
}

int64_t numel(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 24) / d)) return -1;
    n *= d;
  }
  return n;
}

// Tensor t (of n elements) made of type dt, its data random bytes below
// `byte_limit` (small values stay valid indices and shapes more often).
void refill(Rng& rng, onnx::TensorProto& t, int64_t n, int dt, size_t byte_limit) {
  std::string name = t.name();
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  t.Clear();
  t.set_name(name);
  for (int64_t d : dims) t.add_dims(d);
  t.set_data_type(dt);
  if (dt == onnx::TensorProto::STRING) {
    for (int64_t i = 0; i < n; ++i) t.add_string_data(std::string(below(rng, 4), static_cast<char>('a' + below(rng, 3))));
    return;
  }
  std::string raw(static_cast<size_t>(element_bytes(dt, n)), '\0');
  for (char& c : raw) c = static_cast<char>(below(rng, byte_limit));
  t.set_raw_data(raw);
}

// The initializer retyped: its data becomes random bytes of the new type.
bool retype_initializer(Rng& rng, onnx::TensorProto& t, std::string* what) {
  int64_t n = numel(t);
  if (n < 0 || n > 4096) return false;
  int dt = random_dtype(rng);
  refill(rng, t, n, dt, 256);
  *what = "initializer '" + t.name() + "' retyped to " + std::to_string(dt);
  return true;
}

// Element i of a tensor of n elements of type T (raw bytes, or the typed
// field `typed`) set to v.
template <typename T, typename Field>
bool poke_element(onnx::TensorProto& t, int64_t n, size_t i, T v, Field* typed) {
  if (t.has_raw_data() && t.raw_data().size() == sizeof(T) * static_cast<size_t>(n)) {
    std::memcpy(t.mutable_raw_data()->data() + sizeof(T) * i, &v, sizeof(T));
  } else if (typed->size() == n) {
    typed->Set(static_cast<int>(i), v);
  } else {
    return false;
  }
  return true;
}

// One element of a small integer or float initializer set to an odd value.
bool poke_initializer(Rng& rng, onnx::TensorProto& t, std::string* what) {
  int64_t n = numel(t);
  if (n <= 0 || n > 256) return false;
  size_t i = below(rng, static_cast<size_t>(n));
  std::string value;
  bool done = false;
  switch (t.data_type()) {
    case onnx::TensorProto::INT64: {
      int64_t v = odd_int(rng);
      done = poke_element(t, n, i, v, t.mutable_int64_data());
      value = std::to_string(v);
      break;
    }
    case onnx::TensorProto::INT32: {
      auto v = static_cast<int32_t>(odd_int(rng));
      done = poke_element(t, n, i, v, t.mutable_int32_data());
      value = std::to_string(v);
      break;
    }
    case onnx::TensorProto::FLOAT: {
      float v = odd_float(rng);
      done = poke_element(t, n, i, v, t.mutable_float_data());
      value = std::to_string(v);
      break;
    }
    default:
      return false;
  }
  if (done) *what = "initializer '" + t.name() + "'[" + std::to_string(i) + "] = " + value;
  return done;
}

bool mutate_attribute(Rng& rng, onnx::NodeProto& n, std::string* what) {
  using AP = onnx::AttributeProto;
  std::string label = n.op_type() + " '" + n.name() + "'";
  if (n.attribute_size() == 0 || below(rng, 5) == 0) {
    AP* a = n.add_attribute();
    a->set_name(pick(rng, attribute_names()));
    if (below(rng, 2)) {
      a->set_type(AP::INT);
      a->set_i(odd_int(rng));
    } else {
      a->set_type(AP::INTS);
      for (size_t k = 1 + below(rng, 4); k > 0; --k) a->add_ints(odd_int(rng));
    }
    *what = label + ": attribute '" + a->name() + "' added";
    return true;
  }
  int idx = static_cast<int>(below(rng, static_cast<size_t>(n.attribute_size())));
  AP& a = *n.mutable_attribute(idx);
  *what = label + ": attribute '" + a.name() + "' ";
  switch (below(rng, 8)) {
    case 0:
      n.mutable_attribute()->DeleteSubrange(idx, 1);
      *what += "removed";
      return true;
    case 1: {
      // Another type, with a value of that type.
      static const std::vector<int> kTypes = {AP::INT, AP::FLOAT, AP::INTS, AP::FLOATS, AP::STRING};
      int type = pick(rng, kTypes);
      std::string name = a.name();
      a.Clear();
      a.set_name(name);
      a.set_type(static_cast<AP::AttributeType>(type));
      if (type == AP::INT) a.set_i(odd_int(rng));
      if (type == AP::FLOAT) a.set_f(odd_float(rng));
      if (type == AP::INTS) a.add_ints(odd_int(rng));
      if (type == AP::FLOATS) a.add_floats(odd_float(rng));
      if (type == AP::STRING) a.set_s("garbage");
      *what += "retyped to " + std::to_string(type);
      return true;
    }
    default:
      break;
  }
  switch (a.type()) {
    case AP::INT:
      a.set_i(odd_int(rng));
      *what += "= " + std::to_string(a.i());
      return true;
    case AP::FLOAT:
      a.set_f(odd_float(rng));
      *what += "= " + std::to_string(a.f());
      return true;
    case AP::INTS:
      if (a.ints_size() == 0 || below(rng, 4) == 0) {
        a.add_ints(odd_int(rng));
        *what += "gained an element";
      } else if (below(rng, 4) == 0) {
        a.mutable_ints()->RemoveLast();
        *what += "lost an element";
      } else {
        int k = static_cast<int>(below(rng, static_cast<size_t>(a.ints_size())));
        a.set_ints(k, odd_int(rng));
        *what += "[" + std::to_string(k) + "] = " + std::to_string(a.ints(k));
      }
      return true;
    case AP::FLOATS:
      if (a.floats_size() == 0) {
        a.add_floats(odd_float(rng));
      } else {
        a.set_floats(static_cast<int>(below(rng, static_cast<size_t>(a.floats_size()))), odd_float(rng));
      }
      *what += "element changed";
      return true;
    case AP::STRING: {
      static const std::vector<std::string> kStrings = {"", "garbage", "NOTSET", "VALID", "SAME_UPPER",
                                                        "SAME_LOWER", "constant", "reflect", "edge", "nearest",
                                                        "linear", "cubic", "DCR", "CRD", "mean", "sum", "none"};
      a.set_s(pick(rng, kStrings));
      *what += "= '" + a.s() + "'";
      return true;
    }
    case AP::TENSOR:
      if (retype_initializer(rng, *a.mutable_t(), what)) return true;
      return poke_initializer(rng, *a.mutable_t(), what);
    default:
      return false;
  }
}

bool mutate_value_info(Rng& rng, onnx::ValueInfoProto& vi, bool dims, std::string* what) {
  if (!vi.type().has_tensor_type()) return false;
  auto* tt = vi.mutable_type()->mutable_tensor_type();
  if (!dims || below(rng, 3) == 0) {
    tt->set_elem_type(random_dtype(rng));
    *what = "value '" + vi.name() + "' retyped to " + std::to_string(tt->elem_type());
    return true;
  }
  auto* shape = tt->mutable_shape();
  switch (below(rng, 5)) {
    case 0:
      shape->add_dim()->set_dim_value(1 + static_cast<int64_t>(below(rng, 4)));
      *what = "value '" + vi.name() + "' gained a dim";
      return true;
    case 1:
      if (shape->dim_size() == 0) return false;
      shape->mutable_dim()->RemoveLast();
      *what = "value '" + vi.name() + "' lost a dim";
      return true;
    case 2:
      if (shape->dim_size() == 0) return false;
      shape->mutable_dim(static_cast<int>(below(rng, static_cast<size_t>(shape->dim_size()))))->set_dim_param("N");
      *what = "value '" + vi.name() + "' got a symbolic dim";
      return true;
    default: {
      if (shape->dim_size() == 0) return false;
      static const std::vector<int64_t> kDims = {0, 1, 2, 3, 5, 17, 1023, 1 << 20, int64_t{1} << 31,
                                                 int64_t{1} << 40};
      int k = static_cast<int>(below(rng, static_cast<size_t>(shape->dim_size())));
      shape->mutable_dim(k)->set_dim_value(pick(rng, kDims));
      *what = "value '" + vi.name() + "' dim " + std::to_string(k) + " = " + std::to_string(shape->dim(k).dim_value());
      return true;
    }
  }
}

bool mutate_inputs(Rng& rng, onnx::GraphProto& g, onnx::NodeProto& n, std::string* what) {
  std::string label = n.op_type() + " '" + n.name() + "'";
  auto* ins = n.mutable_input();
  switch (below(rng, 5)) {
    case 0:
      if (ins->size() < 2) return false;
      std::swap(*ins->Mutable(0), *ins->Mutable(static_cast<int>(1 + below(rng, static_cast<size_t>(ins->size() - 1)))));
      *what = label + ": inputs swapped";
      return true;
    case 1: {
      // Another value of the graph read instead.
      std::vector<std::string> names;
      for (const auto& vi : g.input()) names.push_back(vi.name());
      for (const auto& t : g.initializer()) names.push_back(t.name());
      for (const auto& m : g.node())
        for (const auto& o : m.output()) names.push_back(o);
      if (names.empty() || ins->empty()) return false;
      int k = static_cast<int>(below(rng, static_cast<size_t>(ins->size())));
      *ins->Mutable(k) = pick(rng, names);
      *what = label + ": input " + std::to_string(k) + " reads '" + ins->Get(k) + "'";
      return true;
    }
    case 2:
      if (ins->empty()) return false;
      if (below(rng, 2)) {
        ins->RemoveLast();
        *what = label + ": last input deleted";
      } else {
        *ins->Mutable(static_cast<int>(below(rng, static_cast<size_t>(ins->size())))) = "";
        *what = label + ": an input omitted";
      }
      return true;
    case 3:
      if (ins->empty()) return false;
      n.add_input(ins->Get(static_cast<int>(below(rng, static_cast<size_t>(ins->size())))));
      *what = label + ": an input duplicated";
      return true;
    default:
      if (below(rng, 2) && n.output_size() > 1) {
        n.mutable_output()->RemoveLast();
        *what = label + ": last output deleted";
      } else {
        n.add_output(n.output_size() ? n.output(0) + "_extra" : "extra");
        *what = label + ": an output added";
      }
      return true;
  }
}

// Every value of element type `from`, in every graph (inputs, outputs,
// value_info, initializers, Constant tensors, Cast targets), made `to`: a
// model that stays consistent, with a dtype its ops may not be written for.
bool retype_model(Rng& rng, const std::vector<onnx::GraphProto*>& graphs, int from, int to, std::string* what) {
  if (from == to) return false;
  auto retype_vi = [&](onnx::ValueInfoProto& vi) {
    if (vi.type().has_tensor_type() && vi.type().tensor_type().elem_type() == from)
      vi.mutable_type()->mutable_tensor_type()->set_elem_type(to);
  };
  auto retype_tensor = [&](onnx::TensorProto& t) {
    if (int64_t n = numel(t); t.data_type() == from && n >= 0) refill(rng, t, n, to, 4);
  };
  for (onnx::GraphProto* g : graphs) {
    for (auto& vi : *g->mutable_input()) retype_vi(vi);
    for (auto& vi : *g->mutable_output()) retype_vi(vi);
    for (auto& vi : *g->mutable_value_info()) retype_vi(vi);
    for (auto& t : *g->mutable_initializer()) retype_tensor(t);
    for (auto& n : *g->mutable_node())
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_t()) retype_tensor(*a.mutable_t());
        if (n.op_type() == "Cast" && a.name() == "to" && a.i() == from) a.set_i(to);
      }
  }
  *what = "every " + std::to_string(from) + " value retyped to " + std::to_string(to);
  return true;
}

// retype_model from an element type of a graph input to any other.
bool retype_model_at_random(Rng& rng, const std::vector<onnx::GraphProto*>& graphs, std::string* what) {
  std::vector<int> present;
  for (onnx::GraphProto* g : graphs)
    for (const auto& vi : g->input())
      if (vi.type().has_tensor_type()) present.push_back(vi.type().tensor_type().elem_type());
  if (present.empty()) return false;
  return retype_model(rng, graphs, pick(rng, present), random_dtype(rng), what);
}

// retype_model from the element type of a node's tensor input to another
// that the node's ONNX schema accepts there: most such models pass the
// schema check and reach inference, lowering and the kernels with a dtype
// that is legal but rare (strings, float8, 4-bit integers, complex).
bool retype_model_by_schema(Rng& rng, const onnx::ModelProto& m, const std::vector<onnx::GraphProto*>& graphs,
                            onnx::GraphProto& g, std::string* what) {
  if (g.node_size() == 0) return false;
  const onnx::NodeProto& n = g.node(static_cast<int>(below(rng, static_cast<size_t>(g.node_size()))));
  if (n.input_size() == 0) return false;
  const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
  int64_t opset = -1;
  for (const auto& o : m.opset_import())
    if ((o.domain() == "ai.onnx" ? "" : o.domain()) == domain) opset = o.version();
  const ops::OnnxSchema* schema = opset < 0 ? nullptr : ops::find_onnx_schema(domain, n.op_type(), opset);
  if (!schema) return false;
  const int k = static_cast<int>(below(rng, static_cast<size_t>(n.input_size())));
  // The input's element type, from the graph's declared types.
  int from = 0;
  for (onnx::GraphProto* h : graphs) {
    for (const auto& vi : h->input())
      if (vi.name() == n.input(k) && vi.type().has_tensor_type()) from = vi.type().tensor_type().elem_type();
    for (const auto& vi : h->value_info())
      if (vi.name() == n.input(k) && vi.type().has_tensor_type()) from = vi.type().tensor_type().elem_type();
    for (const auto& t : h->initializer())
      if (t.name() == n.input(k)) from = t.data_type();
  }
  const uint32_t allowed = ops::onnx_input_tensor_types(*schema, k);
  std::vector<int> choices;
  for (int dt = 1; dt <= 23; ++dt)
    if ((allowed & (1u << dt)) && dt != from) choices.push_back(dt);
  if (from == 0 || choices.empty()) return false;
  return retype_model(rng, graphs, from, pick(rng, choices), what);
}

bool mutate_once(Rng& rng, onnx::ModelProto& m, std::string* what) {
  std::vector<onnx::GraphProto*> graphs;
  collect_graphs(m.mutable_graph(), graphs);
  onnx::GraphProto& g = *graphs[below(rng, graphs.size())];
  switch (below(rng, 16)) {
    case 10:
    case 11:
      return retype_model_at_random(rng, graphs, what);
    case 12:
    case 13:
    case 14:
    case 15:
      return retype_model_by_schema(rng, m, graphs, g, what);
    case 0:
      if (g.input_size() == 0) return false;
      return mutate_value_info(rng, *g.mutable_input(static_cast<int>(below(rng, static_cast<size_t>(g.input_size())))),
                               true, what);
    case 1:
      if (g.output_size() == 0) return false;
      return mutate_value_info(rng, *g.mutable_output(static_cast<int>(below(rng, static_cast<size_t>(g.output_size())))),
                               below(rng, 2), what);
    case 2: {
      if (g.initializer_size() == 0) return false;
      auto& t = *g.mutable_initializer(static_cast<int>(below(rng, static_cast<size_t>(g.initializer_size()))));
      return below(rng, 2) ? retype_initializer(rng, t, what) : poke_initializer(rng, t, what);
    }
    case 3: {
      if (g.node_size() == 0) return false;
      auto& n = *g.mutable_node(static_cast<int>(below(rng, static_cast<size_t>(g.node_size()))));
      std::string before = n.op_type();
      n.set_op_type(pick(rng, op_types()));
      *what = "node '" + n.name() + "': " + before + " -> " + n.op_type();
      return true;
    }
    case 4:
    case 5:
    case 6: {
      if (g.node_size() == 0) return false;
      return mutate_attribute(rng, *g.mutable_node(static_cast<int>(below(rng, static_cast<size_t>(g.node_size())))),
                              what);
    }
    default: {
      if (g.node_size() == 0) return false;
      return mutate_inputs(rng, g, *g.mutable_node(static_cast<int>(below(rng, static_cast<size_t>(g.node_size())))),
                           what);
    }
  }
}

}  // namespace

std::string mutate_model(const std::string& bytes, uint32_t seed, size_t max_size, std::string* what) {
  Rng rng(seed);
  std::string local;
  if (what == nullptr) what = &local;
  if (below(rng, 20) == 0 && !bytes.empty()) {
    std::string out = bytes;
    for (size_t k = 1 + below(rng, 4); k > 0; --k) out[below(rng, out.size())] ^= static_cast<char>(1 << below(rng, 8));
    *what = "bytes flipped";
    return out;
  }
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes) || !m.has_graph()) return bytes;
  bool changed = false;
  for (int tries = 0; tries < 8 && !changed; ++tries) changed = mutate_once(rng, m, what);
  if (!changed) return bytes;
  std::string out;
  if (!m.SerializeToString(&out) || out.size() > max_size) return bytes;
  return out;
}

std::string compile_and_run(const std::string& bytes, const std::string& source_name) {
  CompileOptions options;
  options.threads = 1;
  options.max_memory_bytes = int64_t{1} << 30;
  auto model = Model::compile_bytes(bytes, options, source_name);
  if (!model.is_ok()) return model.status().to_string();
  std::mt19937_64 rng(20240229);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small_int(0, 9);
  std::map<std::string, Tensor> inputs;
  for (const TensorInfo& info : model->inputs()) {
    std::vector<int64_t> shape;
    int64_t elements = 1;
    for (const std::string& d : info.dims) {
      int64_t v = 2;
      if (!d.empty() && std::all_of(d.begin(), d.end(), ::isdigit)) {
        v = d.size() > 12 ? int64_t{1} << 40 : std::stoll(d);
      } else if (!d.empty() && !(std::isalpha(static_cast<unsigned char>(d[0])) || d[0] == '_')) {
        return "input '" + info.name + "' has a dim a random input cannot bind: " + d;
      }
      if (v > 0 && elements > (int64_t{1} << 24) / v) return "input '" + info.name + "' is too large for a random input";
      elements *= v;
      shape.push_back(v);
    }
    bool numeric = dtype_is_float(info.dtype) || dtype_is_int(info.dtype) || info.dtype == DType::kBool;
    if (info.dtype == DType::kString) {
      Tensor t(info.dtype, shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.data_as<std::string>()[i] = std::string(small_int(rng) % 4, 'a');
      inputs[info.name] = std::move(t);
      continue;
    }
    if (!numeric || !dtype_is_compilable(info.dtype)) return "input '" + info.name + "' has no random values";
    Tensor t(info.dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dtype_is_float(info.dtype)) t.set_f64(i, real(rng));
      else if (info.dtype == DType::kBool) t.set_f64(i, small_int(rng) % 2);
      else t.set_f64(i, small_int(rng));
    }
    inputs[info.name] = std::move(t);
  }
  auto outputs = model->run(inputs);
  return outputs.is_ok() ? std::string() : outputs.status().to_string();
}

}  // namespace kiln::fuzz
