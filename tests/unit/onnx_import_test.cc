// ONNX import: models built as protobufs in C++, good and malformed.
#include <gtest/gtest.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>

#include "frontend/onnx/export.h"
#include "frontend/onnx/import.h"
#include "ops/registry.h"
#include "train/algorithm.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

void set_type(onnx::ValueInfoProto* vi, const std::string& name, int elem, const std::vector<std::string>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  for (const std::string& d : dims) {
    auto* dim = shape->add_dim();
    if (d == "?") continue;
    if (!d.empty() && (std::isdigit(static_cast<unsigned char>(d[0])) || d[0] == '-')) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& ins,
                          const std::vector<std::string>& outs, const std::string& name = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : ins) n->add_input(i);
  for (const auto& o : outs) n->add_output(o);
  return n;
}

onnx::AttributeProto* add_ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
  return a;
}

onnx::AttributeProto* add_float(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
  return a;
}

onnx::ModelProto new_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  m.mutable_graph()->set_name("main");
  return m;
}

// Conv + Relu over a batch of symbolic size n.
onnx::ModelProto conv_relu_model() {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "X", onnx::TensorProto::FLOAT, {"n", "3", "8", "?"});
  // W is both an input and an initializer: a constant.
  set_type(g->add_input(), "W", onnx::TensorProto::FLOAT, {"4", "3", "3", "3"});
  auto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {4, 3, 3, 3}) w->add_dims(d);
  std::vector<float> wv(4 * 3 * 3 * 3);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<float>(i) * 0.25f;
  w->set_raw_data(std::string(reinterpret_cast<const char*>(wv.data()), wv.size() * sizeof(float)));
  auto* b = g->add_initializer();
  b->set_name("B");
  b->set_data_type(onnx::TensorProto::FLOAT);
  b->add_dims(4);
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) b->add_float_data(v);
  auto* conv = add_node(g, "Conv", {"X", "W", "B"}, {"c"}, "conv1");
  add_ints(conv, "pads", {1, 1, 1, 1});
  add_ints(conv, "kernel_shape", {3, 3});
  add_node(g, "Relu", {"c"}, {"Y"}, "relu1");
  set_type(g->add_output(), "Y", onnx::TensorProto::FLOAT, {"n", "4", "8", "?"});
  return m;
}

std::string bytes_of(const onnx::ModelProto& m) {
  std::string s;
  EXPECT_TRUE(m.SerializeToString(&s));
  return s;
}

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("kiln_onnx_import_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Status import_error(const onnx::ModelProto& m, const std::string& source = "bad.onnx") {
  auto r = import_onnx_bytes(bytes_of(m), source);
  EXPECT_FALSE(r.is_ok()) << "import unexpectedly succeeded:\n" << (r.is_ok() ? print_graph(*r.value()) : "");
  return r.is_ok() ? Status::ok() : r.status();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(OnnxImport, ConvReluWithSymbolicBatch) {
  auto r = import_onnx_bytes(bytes_of(conv_relu_model()), "dir/conv.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Graph& g = *r.value();
  EXPECT_EQ(g.source, "dir/conv.onnx");
  EXPECT_EQ(g.opsets.at(""), 17);
  ASSERT_EQ(g.inputs().size(), 1u);
  EXPECT_EQ(g.inputs()[0]->name(), "X");
  EXPECT_EQ(g.inputs()[0]->type().to_string(), "f32[n, 3, 8, _u0]");
  EXPECT_EQ(g.bounds.at("n").lo, 1);
  EXPECT_EQ(g.bounds.at("_u0").lo, 0);
  Value* w = g.find_value("W");
  ASSERT_TRUE(w && w->is_constant());
  EXPECT_EQ(w->constant().describe(), "f32[4,3,3,3]");
  EXPECT_EQ(w->constant().data_as<float>()[5], 1.25f);
  EXPECT_EQ(w->type().to_string(), "f32[4, 3, 3, 3]");
  Value* b = g.find_value("B");
  ASSERT_TRUE(b && b->is_constant());
  EXPECT_EQ(b->constant().data_as<float>()[3], 4.0f);
  auto nodes = g.nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0]->describe(), "Conv 'conv1'");
  EXPECT_EQ(nodes[0]->attr_ints("pads"), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(nodes[0]->input(1), w);
  EXPECT_EQ(nodes[1]->op_type(), "Relu");
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.outputs()[0], nodes[1]->output(0));
  EXPECT_TRUE(g.verify().is_ok());
  // The imported graph prints and parses back to the same text.
  std::string text = print_graph(g);
  auto p = parse_graph(text);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string() << "\n" << text;
  EXPECT_EQ(print_graph(*p.value()), text);
}

TEST(OnnxImport, FromFileAndOddDimNames) {
  onnx::ModelProto m = conv_relu_model();
  auto* dim = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0);
  dim->set_dim_param("batch size");
  fs::path dir = temp_dir("file");
  write_file(dir / "m.onnx", bytes_of(m));
  auto r = import_onnx_file((dir / "m.onnx").string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->inputs()[0]->type().to_string(), "f32[batch_size, 3, 8, _u0]");
  auto missing = import_onnx_file((dir / "nope.onnx").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_TRUE(contains(missing.status().message(), "nope.onnx"));
  fs::remove_all(dir);
}

TEST(OnnxImport, UnsortedNodesAreSorted) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Neg", {"a"}, {"y"}, "second");
  add_node(g, "Relu", {"x"}, {"a"}, "first");
  set_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  auto r = import_onnx_bytes(bytes_of(m), "unsorted.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->nodes()[0]->name(), "first");
  EXPECT_EQ(r.value()->nodes()[1]->name(), "second");
}

TEST(OnnxImport, ExternalData) {
  fs::path dir = temp_dir("ext");
  std::vector<float> data = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::string blob(16, 'x');  // 16 bytes of padding before the tensor
  blob.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  write_file(dir / "weights.bin", blob);
  auto model_with = [&](const std::string& location, const std::string& offset, const std::string& length) {
    onnx::ModelProto m = new_model();
    auto* g = m.mutable_graph();
    set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2", "3"});
    auto* w = g->add_initializer();
    w->set_name("weight");
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(2);
    w->add_dims(3);
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add_kv = [&](const std::string& k, const std::string& v) {
      auto* e = w->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add_kv("location", location);
    if (!offset.empty()) add_kv("offset", offset);
    if (!length.empty()) add_kv("length", length);
    add_node(g, "Add", {"x", "weight"}, {"y"}, "add");
    set_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2", "3"});
    return m;
  };
  write_file(dir / "good.onnx", bytes_of(model_with("weights.bin", "16", "24")));
  auto r = import_onnx_file((dir / "good.onnx").string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const Tensor& t = r.value()->find_value("weight")->constant();
  ASSERT_EQ(t.numel(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data_as<float>()[i], data[static_cast<size_t>(i)]);

  // Offset such that the data runs past the end of the file.
  std::string bad_path = (dir / "bad_offset.onnx").string();
  write_file(bad_path, bytes_of(model_with("weights.bin", "20", "")));
  auto bad = import_onnx_file(bad_path);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(contains(bad.status().message(), bad_path)) << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "weight")) << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "offset 20")) << bad.status().message();

  for (auto [loc, off, len, expect] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"missing.bin", "0", "", "not found"},
           {"../weights.bin", "0", "", "leaves the model's directory"},
           {"/etc/passwd", "0", "", "absolute"},
           {"weights.bin", "-4", "", "bad external data offset"},
           {"weights.bin", "16", "20", "length 20"}}) {
    std::string path = (dir / "bad.onnx").string();
    write_file(path, bytes_of(model_with(loc, off, len)));
    auto e = import_onnx_file(path);
    ASSERT_FALSE(e.is_ok()) << loc;
    EXPECT_TRUE(contains(e.status().message(), expect)) << e.status().message();
    EXPECT_TRUE(contains(e.status().message(), path)) << e.status().message();
  }
  fs::remove_all(dir);
}

TEST(OnnxImport, IfWithSubgraphsCapturesOuterValues) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "cond", onnx::TensorProto::BOOL, {});
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {"n"});
  add_node(g, "Relu", {"x"}, {"rx"}, "relu");
  auto* iff = add_node(g, "If", {"cond"}, {"out"}, "if0");
  auto* then_attr = iff->add_attribute();
  then_attr->set_name("then_branch");
  then_attr->set_type(onnx::AttributeProto::GRAPH);
  auto* tg = then_attr->mutable_g();
  tg->set_name("then");
  // A nested If inside the branch reads the top-level 'rx': both levels capture it.
  auto* inner = add_node(tg, "If", {"cond"}, {"t_out"}, "inner_if");
  auto* inner_attr = inner->add_attribute();
  inner_attr->set_name("then_branch");
  inner_attr->set_type(onnx::AttributeProto::GRAPH);
  auto* ig = inner_attr->mutable_g();
  ig->set_name("inner_then");
  add_node(ig, "Neg", {"rx"}, {"i_out"}, "neg");
  set_type(ig->add_output(), "i_out", onnx::TensorProto::FLOAT, {"n"});
  set_type(tg->add_output(), "t_out", onnx::TensorProto::FLOAT, {"n"});
  auto* else_attr = iff->add_attribute();
  else_attr->set_name("else_branch");
  else_attr->set_type(onnx::AttributeProto::GRAPH);
  auto* eg = else_attr->mutable_g();
  eg->set_name("else");
  set_type(eg->add_output(), "x", onnx::TensorProto::FLOAT, {"n"});  // an outer value as output
  set_type(g->add_output(), "out", onnx::TensorProto::FLOAT, {"n"});

  auto r = import_onnx_bytes(bytes_of(m), "if.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Graph& top = *r.value();
  Node* n = top.find_value("out")->producer();
  ASSERT_NE(n, nullptr);
  const Attribute* then_branch = n->attr("then_branch");
  ASSERT_TRUE(then_branch && then_branch->kind == Attribute::Kind::kGraph);
  Graph& then_g = *then_branch->g;
  ASSERT_EQ(then_g.captures().size(), 2u);  // cond (inner If input) and rx (for the inner branch)
  EXPECT_NE(then_g.find_value("rx"), nullptr);
  EXPECT_NE(then_g.find_value("cond"), nullptr);
  Node* inner_if = then_g.nodes()[0];
  Graph& inner_g = *inner_if->attr("then_branch")->g;
  ASSERT_EQ(inner_g.captures().size(), 1u);
  EXPECT_EQ(inner_g.captures()[0]->name(), "rx");
  EXPECT_EQ(inner_g.nodes()[0]->input(0), inner_g.captures()[0]);
  Graph& else_g = *n->attr("else_branch")->g;
  ASSERT_EQ(else_g.outputs().size(), 1u);
  EXPECT_EQ(else_g.outputs()[0], else_g.captures()[0]);
  std::vector<Value*> implicit = top.implicit_inputs(n);
  ASSERT_EQ(implicit.size(), 3u);  // cond, rx, x
  EXPECT_TRUE(top.verify().is_ok()) << top.verify().to_string();
  std::string text = print_graph(top);
  auto p = parse_graph(text);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(print_graph(*p.value()), text);
  EXPECT_TRUE(p.value()->verify().is_ok());
}

onnx::FunctionProto* add_function(onnx::ModelProto& m) {
  auto* fn = m.add_functions();
  fn->set_name("AddLeaky");
  fn->set_domain("custom");
  fn->add_input("a");
  fn->add_input("b");
  fn->add_output("c");
  fn->add_attribute("alpha");
  auto* op = fn->add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* add = fn->add_node();
  add->set_op_type("Add");
  add->add_input("a");
  add->add_input("b");
  add->add_output("t");
  auto* leaky = fn->add_node();
  leaky->set_op_type("LeakyRelu");
  leaky->add_input("t");
  leaky->add_output("c");
  auto* ref = leaky->add_attribute();
  ref->set_name("alpha");
  ref->set_type(onnx::AttributeProto::FLOAT);
  ref->set_ref_attr_name("alpha");
  return fn;
}

TEST(OnnxImport, ModelLocalFunctionsAreExpanded) {
  onnx::ModelProto m = new_model();
  auto* op = m.add_opset_import();
  op->set_domain("custom");
  op->set_version(1);
  onnx::FunctionProto* fn = add_function(m);
  // A default for alpha, stored as FunctionProto.attribute_proto (field 11).
  onnx::AttributeProto def;
  def.set_name("alpha");
  def.set_type(onnx::AttributeProto::FLOAT);
  def.set_f(0.25f);
  fn->GetReflection()->MutableUnknownFields(fn)->AddLengthDelimited(11, def.SerializeAsString());
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {"4"});
  set_type(g->add_input(), "y", onnx::TensorProto::FLOAT, {"4"});
  auto* call1 = add_node(g, "AddLeaky", {"x", "y"}, {"z1"}, "call1");
  call1->set_domain("custom");
  add_float(call1, "alpha", 0.5f);
  auto* call2 = add_node(g, "AddLeaky", {"z1", "x"}, {"z2"}, "call2");
  call2->set_domain("custom");
  set_type(g->add_output(), "z2", onnx::TensorProto::FLOAT, {"4"});

  auto r = import_onnx_bytes(bytes_of(m), "fn.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Graph& gr = *r.value();
  auto nodes = gr.nodes();
  ASSERT_EQ(nodes.size(), 4u) << print_graph(gr);
  EXPECT_EQ(nodes[0]->op_type(), "Add");
  EXPECT_EQ(nodes[0]->input(0), gr.find_value("x"));
  EXPECT_EQ(nodes[1]->op_type(), "LeakyRelu");
  EXPECT_EQ(nodes[1]->input(0), nodes[0]->output(0));
  EXPECT_EQ(nodes[1]->output(0)->name(), "z1");
  EXPECT_FLOAT_EQ(nodes[1]->attr_float("alpha", -1), 0.5);
  EXPECT_FLOAT_EQ(nodes[3]->attr_float("alpha", -1), 0.25);  // the default
  EXPECT_NE(nodes[0]->output(0)->name(), nodes[2]->output(0)->name());  // internals renamed apart
  EXPECT_EQ(nodes[3]->output(0), gr.outputs()[0]);
  EXPECT_EQ(nodes[1]->name(), "call1/LeakyRelu");
  EXPECT_TRUE(gr.verify().is_ok());
}

TEST(OnnxImport, ConstantNodesAndTypedFields) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  auto* c1 = add_node(g, "Constant", {}, {"ints"}, "c1");
  auto* a = c1->add_attribute();
  a->set_name("value_ints");
  a->set_type(onnx::AttributeProto::INTS);
  a->add_ints(3);
  a->add_ints(-1);
  auto* c2 = add_node(g, "Constant", {}, {"f"}, "c2");
  add_float(c2, "value_float", 2.5f);
  auto* c3 = add_node(g, "Constant", {}, {"h"}, "c3");
  auto* ta = c3->add_attribute();
  ta->set_name("value");
  ta->set_type(onnx::AttributeProto::TENSOR);
  auto* t = ta->mutable_t();
  t->set_data_type(onnx::TensorProto::FLOAT16);
  t->add_dims(2);
  t->add_int32_data(0x3c00);
  t->add_int32_data(0xc000);
  auto add_init = [&](const std::string& name, int dt, std::vector<int64_t> dims) {
    auto* x = g->add_initializer();
    x->set_name(name);
    x->set_data_type(dt);
    for (int64_t d : dims) x->add_dims(d);
    return x;
  };
  auto* i8 = add_init("i8", onnx::TensorProto::INT8, {3});
  for (int v : {-128, 0, 127}) i8->add_int32_data(v);
  auto* bl = add_init("bl", onnx::TensorProto::BOOL, {2});
  bl->add_int32_data(1);
  bl->add_int32_data(0);
  auto* u64 = add_init("u64", onnx::TensorProto::UINT64, {1});
  u64->add_uint64_data(UINT64_MAX);
  auto* f64 = add_init("f64", onnx::TensorProto::DOUBLE, {});
  f64->add_double_data(0.1);
  auto* str = add_init("str", onnx::TensorProto::STRING, {2});
  str->add_string_data("hello");
  str->add_string_data(std::string("a\0b", 3));
  auto* i4 = add_init("i4", 22, {3});  // INT4 (not in the ONNX 1.12 enum)
  i4->set_raw_data(std::string("\xf7\x01", 2));  // elements 7, -1, 1
  add_node(g, "Concat", {"ints", "ints"}, {"out"}, "cat");
  set_type(g->add_output(), "out", onnx::TensorProto::INT64, {"4"});
  set_type(g->add_output(), "f", onnx::TensorProto::FLOAT, {});

  auto r = import_onnx_bytes(bytes_of(m), "consts.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  Graph& gr = *r.value();
  EXPECT_EQ(gr.num_nodes(), 1u);
  const Tensor& ints = gr.find_value("ints")->constant();
  EXPECT_EQ(ints.describe(), "i64[2]");
  EXPECT_EQ(ints.data_as<int64_t>()[1], -1);
  EXPECT_EQ(gr.find_value("f")->constant().describe(), "f32[]");
  EXPECT_EQ(gr.find_value("f")->constant().data_as<float>()[0], 2.5f);
  EXPECT_EQ(gr.outputs()[1], gr.find_value("f"));
  const Tensor& h = gr.find_value("h")->constant();
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.data_as<uint16_t>()[0], 0x3c00);
  EXPECT_EQ(h.data_as<uint16_t>()[1], 0xc000);
  EXPECT_EQ(gr.find_value("i8")->constant().data_as<int8_t>()[0], -128);
  EXPECT_EQ(gr.find_value("bl")->constant().data_as<uint8_t>()[0], 1);
  EXPECT_EQ(gr.find_value("u64")->constant().data_as<uint64_t>()[0], UINT64_MAX);
  EXPECT_EQ(gr.find_value("f64")->constant().data_as<double>()[0], 0.1);
  EXPECT_EQ(gr.find_value("str")->constant().data_as<std::string>()[1], std::string("a\0b", 3));
  const Tensor& q = gr.find_value("i4")->constant();
  EXPECT_EQ(q.data_as<int8_t>()[0], 7);
  EXPECT_EQ(q.data_as<int8_t>()[1], -1);
  EXPECT_EQ(q.data_as<int8_t>()[2], 1);
  std::string text = print_graph(gr);
  auto p = parse_graph(text);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string() << "\n" << text;
  EXPECT_EQ(print_graph(*p.value()), text);
}

TEST(OnnxImport, ReadTensorProtoFile) {
  fs::path dir = temp_dir("pb");
  onnx::TensorProto t;
  t.set_name("input_0");
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_dims(2);
  t.add_int64_data(7);
  t.add_int64_data(-9);
  write_file(dir / "input_0.pb", t.SerializeAsString());
  auto r = read_tensor_proto_file((dir / "input_0.pb").string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().describe(), "i64[2]");
  EXPECT_EQ(r.value().data_as<int64_t>()[1], -9);
  t.add_int64_data(3);  // three values for two elements
  write_file(dir / "bad.pb", t.SerializeAsString());
  auto bad = read_tensor_proto_file((dir / "bad.pb").string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_TRUE(contains(bad.status().message(), "bad.pb")) << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "int64_data")) << bad.status().message();
  fs::remove_all(dir);
}

// ---- malformed models

// conv_relu_model with a training algorithm: MSE of Y against input T, the
// Gradient of it by W and B, W and B bound to a step of plain SGD, the
// algorithm's counter C to C + 1.
onnx::ModelProto training_model() {
  onnx::ModelProto m = conv_relu_model();
  auto* op = m.add_opset_import();
  op->set_domain("ai.onnx.preview.training");
  op->set_version(1);
  onnx::TrainingInfoProto* info = m.add_training_info();
  onnx::GraphProto* a = info->mutable_algorithm();
  a->set_name("sgd");
  set_type(a->add_input(), "T", onnx::TensorProto::FLOAT, {"n", "4", "8", "?"});
  auto* c = a->add_initializer();
  c->set_name("C");
  c->set_data_type(onnx::TensorProto::INT64);
  c->add_int64_data(0);
  auto* one = a->add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto::INT64);
  one->add_int64_data(1);
  auto* lr = a->add_initializer();
  lr->set_name("lr");
  lr->set_data_type(onnx::TensorProto::FLOAT);
  lr->add_float_data(0.1f);
  add_node(a, "Sub", {"Y", "T"}, {"d"});
  add_node(a, "Mul", {"d", "d"}, {"d2"});
  add_node(a, "ReduceMean", {"d2"}, {"loss"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto k;
    k.set_name("keepdims");
    k.set_type(onnx::AttributeProto::INT);
    k.set_i(0);
    return k;
  }());
  auto* grad = add_node(a, "Gradient", {"W", "B"}, {"gW", "gB"});
  grad->set_domain("ai.onnx.preview.training");
  auto* xs = grad->add_attribute();
  xs->set_name("xs");
  xs->set_type(onnx::AttributeProto::STRINGS);
  xs->add_strings("W");
  xs->add_strings("B");
  auto* y = grad->add_attribute();
  y->set_name("y");
  y->set_type(onnx::AttributeProto::STRING);
  y->set_s("loss");
  add_node(a, "Mul", {"gW", "lr"}, {"sW"});
  add_node(a, "Sub", {"W", "sW"}, {"W_new"});
  add_node(a, "Mul", {"gB", "lr"}, {"sB"});
  add_node(a, "Sub", {"B", "sB"}, {"B_new"});
  add_node(a, "Add", {"C", "one"}, {"C_new"});
  for (const char* o : {"loss", "W_new", "B_new", "C_new"}) a->add_output()->set_name(o);
  for (auto [k, v] : {std::pair{"W", "W_new"}, {"B", "B_new"}, {"C", "C_new"}}) {
    auto* e = info->add_update_binding();
    e->set_key(k);
    e->set_value(v);
  }
  return m;
}

TEST(OnnxImport, TrainingInfoRoundTrip) {
  auto g = import_onnx_bytes(bytes_of(training_model()), "train.onnx");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  ASSERT_EQ((*g)->training_info.size(), 1u);
  const TrainingInfo& info = (*g)->training_info[0];
  ASSERT_NE(info.algorithm, nullptr);
  EXPECT_EQ(info.initialization, nullptr);
  // The model's values it reads are captures; its own initializers are constants of its own.
  std::vector<std::string> captured;
  for (const Value* c : info.algorithm->captures()) captured.push_back(c->name());
  std::sort(captured.begin(), captured.end());
  EXPECT_EQ(captured, (std::vector<std::string>{"B", "W", "Y"}));
  ASSERT_NE(info.algorithm->find_value("C"), nullptr);
  EXPECT_TRUE(info.algorithm->find_value("C")->is_constant());
  EXPECT_EQ((*g)->find_value("C"), nullptr);
  const std::vector<std::pair<std::string, std::string>> bindings = {{"W", "W_new"}, {"B", "B_new"}, {"C", "C_new"}};
  EXPECT_EQ(info.update_binding, bindings);
  // Export (types inferred, the algorithm's from the model's) and import again: the same
  // algorithm and bindings.
  ops::InferContext ctx;
  ctx.graph = g->get();
  ctx.bounds = (*g)->bounds;
  ASSERT_TRUE(ops::infer_shapes(**g, ctx).is_ok());
  Status typed = train::infer_training_types(**g);
  ASSERT_TRUE(typed.is_ok()) << typed.to_string();
  EXPECT_EQ(info.algorithm->find_value("W_new")->type().to_string(), "f32[4, 3, 3, 3]");
  auto bytes = export_onnx_bytes(**g);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  onnx::ModelProto back;
  ASSERT_TRUE(back.ParseFromString(*bytes));
  ASSERT_EQ(back.training_info_size(), 1);
  EXPECT_EQ(back.training_info(0).algorithm().node_size(), 9);
  EXPECT_EQ(back.training_info(0).algorithm().initializer_size(), 3);
  auto again = import_onnx_bytes(*bytes, "again.onnx");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  ASSERT_EQ((*again)->training_info.size(), 1u);
  EXPECT_EQ((*again)->training_info[0].update_binding, bindings);
  EXPECT_EQ((*again)->training_info[0].algorithm->num_nodes(), info.algorithm->num_nodes());
}

TEST(OnnxImportErrors, TrainingInfo) {
  auto expect = [](const std::function<void(onnx::ModelProto&)>& edit, const std::string& fragment) {
    onnx::ModelProto m = training_model();
    edit(m);
    auto g = import_onnx_bytes(bytes_of(m), "train.onnx");
    ASSERT_FALSE(g.is_ok()) << fragment;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidModel);
    EXPECT_NE(g.status().message().find(fragment), std::string::npos) << g.status().message();
  };
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->clear_algorithm(); }, "training_info[0] has no algorithm");
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->mutable_update_binding(0)->set_key("c"); },
         "training_info[0].update_binding: 'c' is not an initializer");
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->mutable_update_binding(1)->set_value("sB"); },
         "bound to 'sB', which is not an output of the algorithm");
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->add_update_binding()->set_key("W"); },
         "'W' is bound twice");
  expect(
      [](onnx::ModelProto& m) {
        onnx::GraphProto* a = m.mutable_training_info(0)->mutable_algorithm();
        a->mutable_node(0)->set_output(0, "c");
        a->mutable_node(1)->set_input(0, "c");
        a->mutable_node(1)->set_input(1, "c");
      },
      "train.onnx: training_info[0].algorithm: value 'c' is defined twice (in the model's graph and in the algorithm "
      "graph)");
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->mutable_algorithm()->mutable_node(0)->set_input(1, "U"); },
         "train.onnx: training_info[0].algorithm: graph 'sgd': node Sub (#0): input 'U' is never defined");
  expect([](onnx::ModelProto& m) { m.mutable_training_info(0)->mutable_algorithm()->mutable_input(0)->clear_type(); },
         "training_info[0].algorithm");
}

TEST(OnnxImportErrors, TruncatedBytes) {
  std::string bytes = bytes_of(conv_relu_model());
  auto r = import_onnx_bytes(bytes.substr(0, bytes.size() / 2), "trunc.onnx");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(contains(r.status().message(), "trunc.onnx")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "protobuf")) << r.status().message();
  auto garbage = import_onnx_bytes("\xff\xff\xff\xff not a model", "junk.onnx");
  ASSERT_FALSE(garbage.is_ok());
  EXPECT_TRUE(contains(garbage.status().message(), "junk.onnx"));
}

TEST(OnnxImportErrors, DanglingInput) {
  onnx::ModelProto m = conv_relu_model();
  m.mutable_graph()->mutable_node(1)->set_input(0, "nowhere");
  Status st = import_error(m, "dangling.onnx");
  EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(contains(st.message(), "dangling.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "Relu 'relu1'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'nowhere'")) << st.message();
}

// Kiln-internal attributes (kiln_weight_layout, kiln_impl, ...) describe the
// compiler's own rewrites; a model file carrying one is refused.
TEST(OnnxImportErrors, KilnInternalAttributeRefused) {
  onnx::ModelProto m = conv_relu_model();
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name("kiln_weight_layout");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s("P16");
  Status st = import_error(m, "internal.onnx");
  EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(contains(st.message(), "internal.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "Conv 'conv1'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'kiln_weight_layout' is internal to Kiln")) << st.message();
}

TEST(OnnxImportErrors, DanglingInputInsideSubgraph) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "cond", onnx::TensorProto::BOOL, {});
  auto* iff = add_node(g, "If", {"cond"}, {"out"}, "if0");
  auto* ta = iff->add_attribute();
  ta->set_name("then_branch");
  ta->set_type(onnx::AttributeProto::GRAPH);
  add_node(ta->mutable_g(), "Neg", {"ghost"}, {"o"}, "neg_in_branch");
  set_type(ta->mutable_g()->add_output(), "o", onnx::TensorProto::FLOAT, {});
  set_type(g->add_output(), "out", onnx::TensorProto::FLOAT, {});
  Status st = import_error(m, "sub.onnx");
  EXPECT_TRUE(contains(st.message(), "sub.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "Neg 'neg_in_branch'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'ghost'")) << st.message();
}

TEST(OnnxImportErrors, Cycle) {
  onnx::ModelProto m = new_model();
  auto* g = m.mutable_graph();
  set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {"2"});
  add_node(g, "Add", {"x", "b"}, {"a"}, "add_a");
  add_node(g, "Relu", {"a"}, {"b"}, "relu_b");
  add_node(g, "Neg", {"b"}, {"y"}, "neg");
  set_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {"2"});
  Status st = import_error(m, "cycle.onnx");
  EXPECT_EQ(st.code(), StatusCode::kInvalidModel);
  EXPECT_TRUE(contains(st.message(), "cycle.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "cycle")) << st.message();
  bool names_node = contains(st.message(), "Add 'add_a'") || contains(st.message(), "Relu 'relu_b'");
  EXPECT_TRUE(names_node) << st.message();
}

TEST(OnnxImportErrors, DuplicateNames) {
  onnx::ModelProto m = conv_relu_model();
  add_node(m.mutable_graph(), "Neg", {"c"}, {"Y"}, "dup");
  Status st = import_error(m, "dup.onnx");
  EXPECT_TRUE(contains(st.message(), "dup.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'Y'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "Neg 'dup'") || contains(st.message(), "Relu 'relu1'")) << st.message();
}

TEST(OnnxImportErrors, BadTensors) {
  onnx::ModelProto m = conv_relu_model();
  m.mutable_graph()->mutable_initializer(1)->set_data_type(0);
  Status st = import_error(m, "dtype.onnx");
  EXPECT_TRUE(contains(st.message(), "dtype.onnx")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'B'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "unknown data type 0")) << st.message();

  m = conv_relu_model();
  m.mutable_graph()->mutable_initializer(1)->set_dims(0, -4);
  st = import_error(m);
  EXPECT_TRUE(contains(st.message(), "negative dimension")) << st.message();

  m = conv_relu_model();
  m.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->pop_back();
  st = import_error(m);
  EXPECT_TRUE(contains(st.message(), "raw_data")) << st.message();
  EXPECT_TRUE(contains(st.message(), "'W'")) << st.message();

  m = conv_relu_model();
  set_type(m.mutable_graph()->mutable_input(0), "X", onnx::TensorProto::FLOAT, {"-3"});
  st = import_error(m);
  EXPECT_TRUE(contains(st.message(), "negative dimension")) << st.message();

  m = conv_relu_model();
  set_type(m.mutable_graph()->mutable_input(0), "X", 99, {"1"});
  st = import_error(m);
  EXPECT_TRUE(contains(st.message(), "unknown data type 99")) << st.message();
}

TEST(OnnxImportErrors, EmptyModelAndNoOutputs) {
  onnx::ModelProto m;
  Status st = import_error(m, "empty.onnx");
  EXPECT_TRUE(contains(st.message(), "empty.onnx: model has no graph")) << st.message();
  m = conv_relu_model();
  m.mutable_graph()->clear_output();
  st = import_error(m, "noout.onnx");
  EXPECT_TRUE(contains(st.message(), "no outputs")) << st.message();
}

TEST(OnnxImportErrors, UnsupportedOpsAreNotRejectedHere) {
  onnx::ModelProto m = conv_relu_model();
  m.mutable_graph()->mutable_node(1)->set_op_type("NoSuchOp");
  auto r = import_onnx_bytes(bytes_of(m), "x.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->nodes()[1]->op_type(), "NoSuchOp");
}

}  // namespace
}  // namespace kiln
