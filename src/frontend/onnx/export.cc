#include "frontend/onnx/export.h"

#include <algorithm>
#include <fstream>

#include <onnx/onnx_pb.h>

namespace kiln {

namespace {

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* tp) {
  tp->set_name(name);
  tp->set_data_type(static_cast<int>(t.dtype()));
  for (int64_t d : t.shape()) tp->add_dims(d);
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) tp->add_string_data(t.data_as<std::string>()[i]);
    return;
  }
  const auto* bytes = static_cast<const unsigned char*>(t.data());
  if (t.dtype() == DType::kInt4 || t.dtype() == DType::kUInt4 || t.dtype() == DType::kFloat4E2M1) {
    std::string packed(static_cast<size_t>((t.numel() + 1) / 2), '\0');
    for (int64_t i = 0; i < t.numel(); ++i)
      packed[i / 2] = static_cast<char>(packed[i / 2] | ((bytes[i] & 0xF) << (i % 2 ? 4 : 0)));
    tp->set_raw_data(packed);
    return;
  }
  tp->set_raw_data(std::string(reinterpret_cast<const char*>(bytes), static_cast<size_t>(t.nbytes())));
}

// A value's type: a tensor type, or a sequence / optional of its element type
// (the container's length is not part of an ONNX type).
Status type_proto(const TensorType& t, const std::string& name, onnx::TypeProto* tp) {
  if (t.dtype == DType::kUndefined) return unsupported() << "value '" << name << "' has no dtype";
  if (t.is_container()) {
    if (!t.elem) return internal_error() << "container value '" << name << "' without an element type";
    onnx::TypeProto* elem = t.dtype == DType::kSequence ? tp->mutable_sequence_type()->mutable_elem_type()
                                                       : tp->mutable_optional_type()->mutable_elem_type();
    if (!t.elem->is_container()) {
      // Element dims other than constants vary per element: left unnamed.
      onnx::TypeProto_Tensor* tt = elem->mutable_tensor_type();
      tt->set_elem_type(static_cast<int>(t.elem->dtype));
      if (t.elem->shape)
        for (const Expr& d : *t.elem->shape) {
          auto* dim = tt->mutable_shape()->add_dim();
          if (auto c = d.as_const()) dim->set_dim_value(*c);
        }
      return Status::ok();
    }
    return type_proto(*t.elem, name, elem);
  }
  onnx::TypeProto_Tensor* tt = tp->mutable_tensor_type();
  tt->set_elem_type(static_cast<int>(t.dtype));
  if (!t.shape) return Status::ok();
  onnx::TensorShapeProto* shape = tt->mutable_shape();
  for (const Expr& d : *t.shape) {
    auto* dim = shape->add_dim();
    if (auto c = d.as_const()) dim->set_dim_value(*c);
    else dim->set_dim_param(print_expr(d));
  }
  return Status::ok();
}

Status value_info(const Value* v, onnx::ValueInfoProto* vi) {
  vi->set_name(v->name());
  return type_proto(v->type(), v->name(), vi->mutable_type());
}

Status graph_to_proto(const Graph& g, onnx::GraphProto* gp);

Status attribute_to_proto(const std::string& key, const Attribute& a, const Node& n, onnx::AttributeProto* ap) {
  using AP = onnx::AttributeProto;
  ap->set_name(key);
  if (n.domain().empty() && n.op_type() == "Optional" && key == "type" && a.kind == Attribute::Kind::kInts &&
      a.ints.size() == 2) {
    // The importer keeps Optional's TYPE_PROTO as [0 or kSequence, dtype].
    ap->set_type(AP::TYPE_PROTO);
    onnx::TypeProto* t = ap->mutable_tp();
    if (a.ints[0] == static_cast<int64_t>(DType::kSequence)) t = t->mutable_sequence_type()->mutable_elem_type();
    t->mutable_tensor_type()->set_elem_type(static_cast<int>(a.ints[1]));
    return Status::ok();
  }
  switch (a.kind) {
    case Attribute::Kind::kFloat: ap->set_type(AP::FLOAT); ap->set_f(static_cast<float>(a.f)); break;
    case Attribute::Kind::kInt: ap->set_type(AP::INT); ap->set_i(a.i); break;
    case Attribute::Kind::kString: ap->set_type(AP::STRING); ap->set_s(a.s); break;
    case Attribute::Kind::kTensor:
      ap->set_type(AP::TENSOR);
      tensor_to_proto(a.t, "", ap->mutable_t());
      break;
    case Attribute::Kind::kGraph:
      ap->set_type(AP::GRAPH);
      if (!a.g) return internal_error() << n.describe() << ": attribute '" << key << "' has no graph";
      KILN_RETURN_IF_ERROR(graph_to_proto(*a.g, ap->mutable_g()));
      break;
    case Attribute::Kind::kFloats:
      ap->set_type(AP::FLOATS);
      for (double f : a.floats) ap->add_floats(static_cast<float>(f));
      break;
    case Attribute::Kind::kInts:
      ap->set_type(AP::INTS);
      for (int64_t i : a.ints) ap->add_ints(i);
      break;
    case Attribute::Kind::kStrings:
      ap->set_type(AP::STRINGS);
      for (const std::string& s : a.strings) ap->add_strings(s);
      break;
    case Attribute::Kind::kTensors:
      ap->set_type(AP::TENSORS);
      for (const Tensor& t : a.tensors) tensor_to_proto(t, "", ap->add_tensors());
      break;
    case Attribute::Kind::kGraphs:
      ap->set_type(AP::GRAPHS);
      for (const auto& sg : a.graphs) {
        if (!sg) return internal_error() << n.describe() << ": attribute '" << key << "' has a null graph";
        KILN_RETURN_IF_ERROR(graph_to_proto(*sg, ap->add_graphs()));
      }
      break;
  }
  return Status::ok();
}

Status graph_to_proto(const Graph& g, onnx::GraphProto* gp) {
  gp->set_name(g.name.empty() ? "main" : g.name);
  for (const Value* v : g.inputs()) {
    if (v->is_constant()) continue;
    KILN_RETURN_IF_ERROR(value_info(v, gp->add_input()));
  }
  for (const Value* v : g.outputs()) KILN_RETURN_IF_ERROR(value_info(v, gp->add_output()));
  for (const Value* c : g.constants()) tensor_to_proto(c->constant(), c->name(), gp->add_initializer());
  for (const Node* n : g.nodes()) {
    onnx::NodeProto* np = gp->add_node();
    np->set_op_type(n->op_type());
    if (!n->domain().empty()) np->set_domain(n->domain());
    if (!n->name().empty()) np->set_name(n->name());
    for (const Value* v : n->inputs()) np->add_input(v ? v->name() : "");
    for (const Value* v : n->outputs()) np->add_output(v ? v->name() : "");
    for (const auto& [key, a] : n->attrs()) {
      if (key.rfind("kiln_", 0) == 0)
        return unsupported() << n->describe() << " carries Kiln's internal attribute '" << key
                             << "', which ONNX does not have (export before the pass that sets it)";
      KILN_RETURN_IF_ERROR(attribute_to_proto(key, a, *n, np->add_attribute()));
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::string> export_onnx_bytes(const Graph& g) {
  onnx::ModelProto model;
  int64_t opset = 0;
  for (const auto& [domain, version] : g.opsets) {
    onnx::OperatorSetIdProto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
    if (domain.empty() || domain == "ai.onnx") opset = std::max(opset, version);
  }
  model.set_ir_version(opset >= 21 ? 10 : opset >= 19 ? 9 : 8);
  model.set_producer_name("kiln");
  Status st = graph_to_proto(g, model.mutable_graph());
  for (size_t i = 0; st.is_ok() && i < g.training_info.size(); ++i) {
    const TrainingInfo& info = g.training_info[i];
    onnx::TrainingInfoProto* tp = model.add_training_info();
    if (info.algorithm == nullptr) {
      st = internal_error() << "training_info[" << i << "] has no algorithm graph";
      break;
    }
    st = graph_to_proto(*info.algorithm, tp->mutable_algorithm());
    if (st.is_ok() && info.initialization != nullptr) st = graph_to_proto(*info.initialization, tp->mutable_initialization());
    for (const auto& [key, value] : info.update_binding) {
      onnx::StringStringEntryProto* e = tp->add_update_binding();
      e->set_key(key);
      e->set_value(value);
    }
    for (const auto& [key, value] : info.initialization_binding) {
      onnx::StringStringEntryProto* e = tp->add_initialization_binding();
      e->set_key(key);
      e->set_value(value);
    }
  }
  if (!st.is_ok()) return st.with_context(g.source.empty() ? "ONNX export" : g.source + ": ONNX export");
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    return unsupported() << "ONNX export: the model does not fit in one protobuf (2 GiB)";
  return bytes;
}

Status export_onnx_file(const Graph& g, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, export_onnx_bytes(g));
  std::ofstream out(path, std::ios::binary);
  if (!out) return io_error() << "cannot write '" << path << "'";
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return io_error() << "writing '" << path << "' failed";
  return Status::ok();
}

}  // namespace kiln
