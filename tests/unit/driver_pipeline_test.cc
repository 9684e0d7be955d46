// The whole pipeline on graphs built with the Graph API: inference, fusion,
// lowering, code generation, the VM (static plan and symbolic shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include <onnx/onnx_pb.h>

#include "driver/compile.h"
#include "frontend/onnx/import.h"
#include "kiln/kiln.h"
#include "runtime/vm.h"

namespace kiln::driver {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
  return t;
}

// y = relu(x @ w + b) * 0.5 + sigmoid(x @ w)
std::unique_ptr<Graph> mlp_graph(Expr batch, const Tensor& w, const Tensor& b) {
  auto g = std::make_unique<Graph>();
  g->source = "mlp";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{batch, 7}});
  Value* wv = g->add_constant("w", w);
  Value* bv = g->add_constant("b", b);
  Tensor half(DType::kFloat32, {});
  half.data_as<float>()[0] = 0.5f;
  Value* hv = g->add_constant("half", half);
  Node* mm = g->add_node("MatMul", {x, wv}, {"mm"});
  Node* add = g->add_node("Add", {mm->output(0), bv}, {"add"});
  Node* relu = g->add_node("Relu", {add->output(0)}, {"relu"});
  Node* mul = g->add_node("Mul", {relu->output(0), hv}, {"mul"});
  Node* sig = g->add_node("Sigmoid", {mm->output(0)}, {"sig"});
  Node* y = g->add_node("Add", {mul->output(0), sig->output(0)}, {"y"});
  g->set_outputs({y->output(0)});
  if (batch.is_var()) g->bounds[batch->name] = Interval{1, std::nullopt};
  return g;
}

std::vector<float> mlp_reference(const Tensor& x, const Tensor& w, const Tensor& b) {
  int64_t n = x.shape()[0], k = 7, m = w.shape()[1];
  std::vector<float> out(n * m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += x.data_as<float>()[i * k + p] * w.data_as<float>()[p * m + j];
      double a = acc + b.data_as<float>()[j];
      out[i * m + j] = static_cast<float>(std::max(a, 0.0) * 0.5 + 1.0 / (1.0 + std::exp(-acc)));
    }
  return out;
}

void expect_close(const Tensor& got, const std::vector<float>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data_as<float>()[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << "element " << i;
}

// Opset 6 Add with broadcast = 1, axis = 1: B [3] is aligned with A's dim 1
// (of [2, 3, 4, 3]), not with its last dim as numpy would (the shapes allow
// both, so the wrong rule would run and give other numbers). PRelu of opset 6
// applies a 1-D slope per channel.
TEST(Pipeline, LegacyBroadcastAlignsAtAxis) {
  auto build = [](const std::string& op, bool with_axis) {
    onnx::ModelProto m;
    m.set_ir_version(3);
    auto* os = m.add_opset_import();
    os->set_version(6);
    auto* g = m.mutable_graph();
    g->set_name("legacy");
    auto input = [&](const std::string& name, std::vector<int64_t> dims) {
      auto* vi = g->add_input();
      vi->set_name(name);
      auto* tt = vi->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(onnx::TensorProto::FLOAT);
      for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
    };
    input("A", {2, 3, 4, 3});
    input("B", {3});
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name("legacy_node");
    n->add_input("A");
    n->add_input("B");
    n->add_output("Y");
    if (with_axis) {
      auto* b = n->add_attribute();
      b->set_name("broadcast");
      b->set_type(onnx::AttributeProto::INT);
      b->set_i(1);
      auto* a = n->add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(1);
    }
    g->add_output()->set_name("Y");
    return m.SerializeAsString();
  };
  Tensor a = random_tensor({2, 3, 4, 3}, 5);
  Tensor b = random_tensor({3}, 6);
  for (const char* op : {"Add", "PRelu"}) {
    SCOPED_TRACE(op);
    auto g = import_onnx_bytes(build(op, std::string(op) == "Add"), "legacy.onnx");
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto compiled = compile_graph(std::move(g).value(), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    runtime::VM vm(compiled.value().program, 1);
    auto out = vm.run({a, b});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const float* y = out.value()[0].data_as<float>();
    ASSERT_EQ(out.value()[0].shape(), (std::vector<int64_t>{2, 3, 4, 3}));
    for (int64_t i = 0; i < a.numel(); ++i) {
      float x = a.data_as<float>()[i], s = b.data_as<float>()[(i / 12) % 3];
      float want = std::string(op) == "Add" ? x + s : (x < 0 ? x * s : x);
      ASSERT_FLOAT_EQ(y[i], want) << "element " << i;
    }
  }
}

// A named input dim (dim_param) is compiled as at least 1; a run that gives
// it 0 (an empty batch) runs on a second program compiled with the dim at
// least 0, made on first need, and later runs go back to the first.
TEST(Pipeline, EmptyNamedDimsRunOnARelaxedProgram) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("empty_batch");
  auto* vi = g->add_input();
  vi->set_name("X");
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("n");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("X");
  relu->add_output("Z");
  auto* axes = g->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(onnx::TensorProto::INT64);
  axes->add_dims(1);
  axes->add_int64_data(0);
  auto* sum = g->add_node();
  sum->set_op_type("ReduceSum");
  sum->add_input("Z");
  sum->add_input("axes");
  sum->add_output("Y");
  auto* keep = sum->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  g->add_output()->set_name("Z");
  g->add_output()->set_name("Y");
  auto model = Model::compile_bytes(m.SerializeAsString(), CompileOptions{}, "empty_batch.onnx");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (int64_t n : {2, 0, 3, 0}) {
    Tensor x = random_tensor({n, 3}, static_cast<uint32_t>(7 + n));
    auto out = model->run({{"X", x}});
    ASSERT_TRUE(out.is_ok()) << "n = " << n << ": " << out.status().to_string();
    const Tensor& z = out->at("Z");
    const Tensor& y = out->at("Y");
    ASSERT_EQ(z.shape(), (std::vector<int64_t>{n, 3}));
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{3}));
    for (int j = 0; j < 3; ++j) {
      float want = 0;
      for (int64_t i = 0; i < n; ++i) want += std::max(0.f, x.data_as<float>()[i * 3 + j]);
      EXPECT_NEAR(y.data_as<float>()[j], want, 1e-5) << "n = " << n;
    }
  }
  // A negative or mismatched dim is still an error naming the input.
  auto bad = model->run({{"X", random_tensor({2, 4}, 1)}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("input 'X'"), std::string::npos) << bad.status().message();
}

// A rank that depends on an input's values (Squeeze without axes of a
// Reshape to a shape given as an input: which dims are 1 is known only at
// run time) cannot be inferred symbolically. The model compiles (every op is
// supported) and runs on programs specialized to each distinct set of input
// shapes and small integer input values, made on first need; its outputs
// change rank from run to run. Wrong inputs are still errors naming them.
TEST(Pipeline, ValueDependentRanksSpecializeAtRunTime) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("value_rank");
  auto add_input = [&](const char* name, int elem, std::vector<int64_t> dims) {
    auto* vi = g->add_input();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    for (int64_t d : dims) {
      if (d < 0) tt->mutable_shape()->add_dim()->set_dim_param("n");
      else tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
  };
  add_input("X", onnx::TensorProto::FLOAT, {-1});
  add_input("shape", onnx::TensorProto::INT64, {2});
  auto* reshape = g->add_node();
  reshape->set_op_type("Reshape");
  reshape->add_input("X");
  reshape->add_input("shape");
  reshape->add_output("R");
  auto* squeeze = g->add_node();
  squeeze->set_op_type("Squeeze");
  squeeze->add_input("R");
  squeeze->add_output("S");
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("S");
  relu->add_output("Y");
  g->add_output()->set_name("Y");
  auto model = Model::compile_bytes(m.SerializeAsString(), CompileOptions{}, "value_rank.onnx");
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  Tensor x = random_tensor({6}, 3);
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{2, 3}, {2, 3}}, {{1, 6}, {6}}, {{6, 1}, {6}}, {{3, 2}, {3, 2}}, {{2, 3}, {2, 3}}};
  for (const auto& [dims, want] : cases) {
    Tensor shape(DType::kInt64, {2});
    shape.data_as<int64_t>()[0] = dims[0];
    shape.data_as<int64_t>()[1] = dims[1];
    auto out = model->run({{"X", x}, {"shape", shape}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const Tensor& y = out->at("Y");
    ASSERT_EQ(y.shape(), want);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y.data_as<float>()[i], std::max(0.f, x.data_as<float>()[i]));
  }
  // A shape Reshape rejects is the specialized compile's error, with why it was compiled then.
  Tensor bad_shape(DType::kInt64, {2});
  bad_shape.data_as<int64_t>()[0] = 4;
  bad_shape.data_as<int64_t>()[1] = 4;
  auto bad = model->run({{"X", x}, {"shape", bad_shape}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("compiling for these inputs' values"), std::string::npos)
      << bad.status().message();
  // Inputs of the wrong dtype, rank or static dim are errors naming the input.
  Tensor f_shape(DType::kFloat32, {2});
  auto wrong = model->run({{"X", x}, {"shape", f_shape}});
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("input 'shape'"), std::string::npos) << wrong.status().message();
  auto wrong_rank = model->run({{"X", random_tensor({2, 3}, 1)}, {"shape", bad_shape}});
  ASSERT_FALSE(wrong_rank.is_ok());
  EXPECT_NE(wrong_rank.status().message().find("input 'X'"), std::string::npos) << wrong_rank.status().message();
  Tensor long_shape(DType::kInt64, {3});
  auto wrong_dim = model->run({{"X", x}, {"shape", long_shape}});
  ASSERT_FALSE(wrong_dim.is_ok());
  EXPECT_NE(wrong_dim.status().message().find("input 'shape'"), std::string::npos) << wrong_dim.status().message();
  // More distinct inputs than the cache holds (16): each still runs right.
  for (int64_t n = 1; n <= 40; ++n) {
    const int64_t len = n % 20 + 1;
    Tensor xs = random_tensor({2 * len}, static_cast<uint32_t>(n));
    Tensor shape(DType::kInt64, {2});
    shape.data_as<int64_t>()[0] = n % 2 ? 2 * len : 2;
    shape.data_as<int64_t>()[1] = n % 2 ? 1 : len;
    auto out = model->run({{"X", xs}, {"shape", shape}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->at("Y").rank(), n % 2 || len == 1 ? 1 : 2) << "n = " << n;
    EXPECT_EQ(out->at("Y").numel(), 2 * len);
  }
  // A one-element tensor for a declared scalar small integer input is
  // refused naming it (it was bound as a constant of the wrong rank).
  {
    onnx::ModelProto m2 = m;
    auto* g2 = m2.mutable_graph();
    auto* k = g2->add_input();
    k->set_name("k");
    k->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    k->mutable_type()->mutable_tensor_type()->mutable_shape();  // rank 0
    auto* twice = g2->add_node();
    twice->set_op_type("Add");
    twice->add_input("k");
    twice->add_input("k");
    twice->add_output("K2");
    g2->add_output()->set_name("K2");
    auto scalar_model = Model::compile_bytes(m2.SerializeAsString(), CompileOptions{}, "value_rank_k.onnx");
    ASSERT_TRUE(scalar_model.is_ok()) << scalar_model.status().to_string();
    Tensor k0(DType::kInt64, {}), k1(DType::kInt64, {1});
    k0.data_as<int64_t>()[0] = 4;
    k1.data_as<int64_t>()[0] = 4;
    Tensor shape23b(DType::kInt64, {2});
    shape23b.data_as<int64_t>()[0] = 2;
    shape23b.data_as<int64_t>()[1] = 3;
    auto ok = scalar_model->run({{"X", x}, {"shape", shape23b}, {"k", k0}});
    ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
    EXPECT_EQ(ok->at("K2").rank(), 0);
    EXPECT_EQ(ok->at("K2").data_as<int64_t>()[0], 8);
    auto refused = scalar_model->run({{"X", x}, {"shape", shape23b}, {"k", k1}});
    ASSERT_FALSE(refused.is_ok());
    EXPECT_NE(refused.status().message().find("input 'k': rank 1, the model takes 0"), std::string::npos)
        << refused.status().message();
  }
  // A sequence input of a specialized model keeps its element type (it was
  // re-typed from the sequence tensor given, losing it).
  {
    onnx::ModelProto m3 = m;
    auto* g3 = m3.mutable_graph();
    auto* seq = g3->add_input();
    seq->set_name("seq");
    auto* et = seq->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type();
    et->set_elem_type(onnx::TensorProto::FLOAT);
    et->mutable_shape()->add_dim()->set_dim_value(3);
    auto* pos = g3->add_initializer();
    pos->set_name("pos");
    pos->set_data_type(onnx::TensorProto::INT64);
    pos->add_int64_data(1);
    auto* at = g3->add_node();
    at->set_op_type("SequenceAt");
    at->add_input("seq");
    at->add_input("pos");
    at->add_output("E");
    auto* relu_e = g3->add_node();
    relu_e->set_op_type("Relu");
    relu_e->add_input("E");
    relu_e->add_output("RE");
    g3->add_output()->set_name("RE");
    auto seq_model = Model::compile_bytes(m3.SerializeAsString(), CompileOptions{}, "value_rank_seq.onnx");
    ASSERT_TRUE(seq_model.is_ok()) << seq_model.status().to_string();
    Tensor elems(DType::kSequence, {2});
    elems.data_as<Tensor>()[0] = random_tensor({3}, 5);
    elems.data_as<Tensor>()[1] = random_tensor({3}, 6);
    Tensor shape23c(DType::kInt64, {2});
    shape23c.data_as<int64_t>()[0] = 2;
    shape23c.data_as<int64_t>()[1] = 3;
    auto out = seq_model->run({{"X", x}, {"shape", shape23c}, {"seq", elems}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const Tensor& re = out->at("RE");
    ASSERT_EQ(re.shape(), (std::vector<int64_t>{3}));
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(re.data_as<float>()[i], std::max(0.f, elems.data_as<Tensor>()[1].data_as<float>()[i]));
  }
  // A profile of one specialization while another thread's runs evict it
  // from the cache: the profile keeps the program it times (it used to keep
  // a raw pointer into the cache, freed underneath it: a use after free that
  // ASan reports) and times every one of its runs on it.
  Tensor shape23(DType::kInt64, {2});
  shape23.data_as<int64_t>()[0] = 2;
  shape23.data_as<int64_t>()[1] = 3;
  std::atomic<bool> done{false};
  std::atomic<int> evictor_runs{0};
  std::thread evictor([&] {
    for (int64_t n = 1; !done.load(); n = n % 40 + 1, ++evictor_runs) {
      Tensor xs = random_tensor({n}, static_cast<uint32_t>(n));
      Tensor shape(DType::kInt64, {2});
      shape.data_as<int64_t>()[0] = n;
      shape.data_as<int64_t>()[1] = 1;
      auto out = model->run({{"X", xs}, {"shape", shape}});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    }
  });
  // Until the other thread has compiled 80 programs (5 evictions of this one).
  for (int round = 0; round < 5 || evictor_runs.load() < 80; ++round) {
    auto report = model->profile({{"X", x}, {"shape", shape23}}, 20);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_NE(report->find("over 20 runs"), std::string::npos) << *report;
  }
  done = true;
  evictor.join();
}

TEST(Pipeline, StaticShapesFusedAndPlanned) {
  Tensor w = random_tensor({7, 19}, 1), b = random_tensor({19}, 2), x = random_tensor({3, 7}, 3);
  for (bool naive : {false, true}) {
    for (int threads : {1, 2}) {
      CompileOptions opts;
      opts.naive = naive;
      opts.threads = threads;
      auto compiled = compile_graph(mlp_graph(3, w, b), opts);
      ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
      EXPECT_TRUE(compiled->program->static_plan);
      // Fused: one kernel for MatMul and its elementwise tail Add/Relu/Mul/Sigmoid/Add
      // (computed in the GEMM tile's write-back; the tail reads the product twice).
      if (!naive) EXPECT_EQ(compiled->stats.num_kernels, 1);
      runtime::VM vm(compiled->program, threads);
      auto out = vm.run({x});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      expect_close((*out)[0], mlp_reference(x, w, b));
    }
  }
}

TEST(Pipeline, SymbolicBatchRunsAtSeveralSizes) {
  Tensor w = random_tensor({7, 19}, 4), b = random_tensor({19}, 5);
  auto compiled = compile_graph(mlp_graph(var("batch"), w, b), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  // One kernel, no intermediate: only the output's [batch, 19] is sized at run time.
  EXPECT_EQ(compiled->stats.num_kernels, 1);
  runtime::VM vm(compiled->program, 2);
  for (int64_t n : {1, 17, 64}) {
    Tensor x = random_tensor({n, 7}, static_cast<uint32_t>(n));
    auto out = vm.run({x});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].shape(), (std::vector<int64_t>{n, 19}));
    expect_close((*out)[0], mlp_reference(x, w, b));
  }
  auto bad = vm.run({random_tensor({2, 8}, 9)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("input 'x'"), std::string::npos) << bad.status().message();
}

// Outputs into the caller's buffers: an aligned buffer of the output's dtype
// is written in place (the VM allocates nothing: it runs under a memory limit
// smaller than the output), a misaligned one gets the output copied in (so
// it needs the allocation), and a buffer of another shape is an error naming
// the output.
TEST(Pipeline, OutputsAreWrittenIntoTheCallersBuffers) {
  Tensor w = random_tensor({7, 19}, 11), b = random_tensor({19}, 12);
  auto compiled = compile_graph(mlp_graph(var("batch"), w, b), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  Tensor x = random_tensor({5, 7}, 13);
  std::vector<float> want = mlp_reference(x, w, b);
  const int64_t out_bytes = 5 * 19 * 4;
  Tensor storage(DType::kFloat32, {5 * 19 + 64});
  ASSERT_EQ(reinterpret_cast<uintptr_t>(storage.data()) % 64, 0u);
  for (int64_t i = 0; i < storage.numel(); ++i) storage.data_as<float>()[i] = NAN;
  runtime::VM vm(compiled->program, 1);
  vm.set_memory_limit(out_bytes / 2);
  auto plain = vm.run({x});
  ASSERT_FALSE(plain.is_ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kResourceExhausted) << plain.status().to_string();

  std::vector<Tensor> into{Tensor::borrow(DType::kFloat32, {5, 19}, storage.data())};
  auto in_place = vm.run({x}, &into);
  ASSERT_TRUE(in_place.is_ok()) << in_place.status().to_string();
  EXPECT_EQ((*in_place)[0].data(), storage.data());
  expect_close(into[0], want);

  // 16 bytes past the boundary: computed in the VM's memory, then copied.
  std::vector<Tensor> misaligned{Tensor::borrow(DType::kFloat32, {5, 19}, storage.data_as<float>() + 4)};
  EXPECT_FALSE(vm.run({x}, &misaligned).is_ok());
  vm.set_memory_limit(0);
  auto copied = vm.run({x}, &misaligned);
  ASSERT_TRUE(copied.is_ok()) << copied.status().to_string();
  EXPECT_EQ((*copied)[0].data(), misaligned[0].data());
  expect_close(misaligned[0], want);

  std::vector<Tensor> wrong{Tensor::borrow(DType::kFloat32, {5, 18}, storage.data())};
  auto bad = vm.run({x}, &wrong);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("output 'y': the buffer given is f32[5,18], the output is f32[5,19]"),
            std::string::npos)
      << bad.status().message();
  // Outputs without a buffer are still allocated by the VM.
  std::vector<Tensor> none(1);
  auto fresh = vm.run({x}, &none);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  expect_close((*fresh)[0], want);
}

// Two groups computing the same thing over differently named symbols (x is
// [a, 8], y is [b, 8]) share one compiled kernel (the workload key is the
// canonical kernel, symbols by position), each call passing its own symbol:
// at a = 3, b = 5 both outputs have their own rows and values.
TEST(Pipeline, KernelsAreSharedAcrossSymbolSpellings) {
  auto g = std::make_unique<Graph>();
  g->source = "shared";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{var("a"), 8}});
  Value* y = g->add_input("y", TensorType{DType::kFloat32, Shape{var("b"), 8}});
  Value* c = g->add_constant("c", random_tensor({8}, 3));
  Node* ax = g->add_node("Add", {x, c}, {"ax"});
  Node* ay = g->add_node("Add", {y, c}, {"ay"});
  Node* rx = g->add_node("Relu", {ax->output(0)}, {"rx"});
  Node* ry = g->add_node("Relu", {ay->output(0)}, {"ry"});
  g->set_outputs({rx->output(0), ry->output(0)});
  g->bounds["a"] = Interval{1, std::nullopt};
  g->bounds["b"] = Interval{1, std::nullopt};
  Tensor cv = g->find_value("c")->constant();
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  EXPECT_EQ(compiled->stats.num_kernels, 1);
  runtime::VM vm(compiled->program, 1);
  Tensor xv = random_tensor({3, 8}, 1), yv = random_tensor({5, 8}, 2);
  auto out = vm.run({xv, yv});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].shape(), (std::vector<int64_t>{3, 8}));
  ASSERT_EQ((*out)[1].shape(), (std::vector<int64_t>{5, 8}));
  for (int o = 0; o < 2; ++o) {
    const Tensor& in = o == 0 ? xv : yv;
    for (int64_t i = 0; i < in.numel(); ++i)
      ASSERT_EQ((*out)[o].data_as<float>()[i], std::max(0.f, in.data_as<float>()[i] + cv.data_as<float>()[i % 8]))
          << "output " << o << " element " << i;
  }
}

// A model symbol that canonicalize keeps as spelled (named like a
// finalize's accumulator, "acc") is passed under its own name: the call
// used to parse kernel symbol names as s<N> and failed to compile.
TEST(Pipeline, SymbolsKeptAsSpelledPassThemselves) {
  auto g = std::make_unique<Graph>();
  g->source = "acc";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{var("acc"), 8}});
  Node* r = g->add_node("Relu", {x}, {"r"});
  g->set_outputs({r->output(0)});
  g->bounds["acc"] = Interval{1, std::nullopt};
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  runtime::VM vm(compiled->program, 1);
  Tensor xv = random_tensor({3, 8}, 4);
  auto out = vm.run({xv});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ((*out)[0].shape(), (std::vector<int64_t>{3, 8}));
  for (int64_t i = 0; i < xv.numel(); ++i)
    ASSERT_EQ((*out)[0].data_as<float>()[i], std::max(0.f, xv.data_as<float>()[i])) << i;
}

// [n] + [m] with unrelated symbols infers [max(m, n)]: a run where neither
// is 1 and they differ is an error naming the node and both sizes, never a
// read past the end of the shorter input; a run that broadcasts is right.
TEST(Pipeline, UnprovenSymbolicBroadcastIsCheckedAtRunTime) {
  auto g = std::make_unique<Graph>();
  g->source = "broadcast";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{var("n")}});
  Value* y = g->add_input("y", TensorType{DType::kFloat32, Shape{var("m")}});
  Node* add = g->add_node("Add", {x, y}, {"z"});
  Node* relu = g->add_node("Relu", {add->output(0)}, {"r"});
  g->set_outputs({relu->output(0)});
  g->bounds["n"] = Interval{1, std::nullopt};
  g->bounds["m"] = Interval{1, std::nullopt};
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  runtime::VM vm(compiled->program, 1);
  Tensor a = random_tensor({3}, 1), one = random_tensor({1}, 2);
  auto ok = vm.run({a, one});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  ASSERT_EQ((*ok)[0].shape(), (std::vector<int64_t>{3}));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ((*ok)[0].data_as<float>()[i], std::max(0.f, a.data_as<float>()[i] + one.data_as<float>()[0]));
  auto bad = vm.run({a, random_tensor({2}, 3)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("Add"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("input 1 has 2 on axis 0, which cannot broadcast to 3"), std::string::npos)
      << bad.status().message();
}

// Relu -> Squeeze(axis 1) -> Relu on [n, m, 5] fuses into one kernel, where no
// view checks the element count: the squeezed symbolic axis m is checked to be
// 1 before the kernel runs (m = 3 used to give a [2, 5] result from the
// first rows instead of an error).
TEST(Pipeline, FusedSqueezeOfASymbolicAxisIsCheckedAtRunTime) {
  auto g = std::make_unique<Graph>();
  g->source = "squeeze";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{var("n"), var("m"), 5}});
  Value* r = g->add_node("Relu", {x}, {"r"})->output(0);
  Tensor axes(DType::kInt64, {1});
  axes.data_as<int64_t>()[0] = 1;
  Value* sq = g->add_node("Squeeze", {r, g->add_constant("axes", axes)}, {"sq"})->output(0);
  g->set_outputs({g->add_node("Relu", {sq}, {"out"})->output(0)});
  g->bounds["n"] = Interval{1, std::nullopt};
  g->bounds["m"] = Interval{1, std::nullopt};
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  EXPECT_EQ(compiled->stats.num_kernels, 1);
  runtime::VM vm(compiled->program, 1);
  Tensor good = random_tensor({2, 1, 5}, 1);
  auto ok = vm.run({good});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  ASSERT_EQ((*ok)[0].shape(), (std::vector<int64_t>{2, 5}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ((*ok)[0].data_as<float>()[i], std::max(0.f, good.data_as<float>()[i]));
  auto bad = vm.run({random_tensor({2, 3, 5}, 2)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("input 0 has 3 on axis 1 (m), which must be 1 to be squeezed"),
            std::string::npos)
      << bad.status().message();
}

TEST(Pipeline, UnsupportedOpsAreListedAtOnce) {
  auto g = std::make_unique<Graph>();
  g->source = "bad.onnx";
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{4}});
  Node* a = g->add_node("FancyOpA", {x}, {"a"}, "", "first");
  Node* b = g->add_node("FancyOpB", {a->output(0)}, {"b"}, "", "second");
  Node* c = g->add_node("FancyOpA", {b->output(0)}, {"c"}, "", "third");
  g->set_outputs({c->output(0)});
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_FALSE(compiled.is_ok());
  const std::string& msg = compiled.status().message();
  EXPECT_NE(msg.find("bad.onnx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FancyOpA (nodes 'first', 'third')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FancyOpB (node 'second')"), std::string::npos) << msg;
}

// y = exp(concat(a, b)) with a, b two elementwise maps of x [1, C, 4, 4]
// (or, for the cases that may not go in place, x itself or a twice). Concat
// on axis 1 of a batch of 1: every input is a contiguous block of the output,
// and the memory plan puts a and b there (the Concat becomes a kBind).
std::unique_ptr<Graph> concat_graph(int64_t channels, const std::string& mode) {
  auto g = std::make_unique<Graph>();
  g->source = "concat";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{1, channels, 4, 4}});
  Value* a = g->add_node("Relu", {x}, {"a"})->output(0);
  Value* b = g->add_node("Sigmoid", {x}, {"b"})->output(0);
  std::vector<Value*> ins = {a, b};
  if (mode == "input") ins = {x, a};
  if (mode == "twice") ins = {a, a};
  Node* cat = g->add_node("Concat", ins, {"c"});
  Attribute axis;
  axis.kind = Attribute::Kind::kInt;
  axis.i = 1;
  cat->set_attr("axis", axis);
  Node* y = g->add_node("Exp", {cat->output(0)}, {"y"});
  // b and the concat are also read after the Concat, from their slices.
  Node* z = g->add_node("Add", {y->output(0), cat->output(0)}, {"z"});
  g->set_outputs({z->output(0), g->add_node("Neg", {b}, {"nb"})->output(0)});
  return g;
}

TEST(Pipeline, ConcatInputsArePlannedInTheOutputsSlices) {
  struct Case {
    int64_t channels;
    std::string mode;
    int binds;  // Concats turned into kBind
  };
  // 16 channels x 16 floats: blocks of 1 KiB; 3 channels: 192 bytes, still
  // 64-byte aligned; 1 channel: 64 bytes. "input" and "twice" stay copies.
  for (const Case& c : {Case{16, "maps", 1}, Case{3, "maps", 1}, Case{1, "maps", 1}, Case{16, "input", 0},
                        Case{16, "twice", 0}}) {
    Tensor x = random_tensor({1, c.channels, 4, 4}, 7);
    auto compiled = compile_graph(concat_graph(c.channels, c.mode), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    int binds = 0;
    for (const runtime::Instr& in : compiled->program->instrs) binds += in.op == runtime::OpCode::kBind;
    EXPECT_EQ(binds, c.binds) << c.channels << " " << c.mode;
    runtime::VM vm(compiled->program, 2);
    for (int run = 0; run < 2; ++run) {
      auto out = vm.run({x});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      int64_t block = c.channels * 16;
      std::vector<float> z(2 * block), nb(block);
      for (int64_t i = 0; i < block; ++i) {
        float v = x.data_as<float>()[i];
        float a = std::max(v, 0.f), b = 1.f / (1.f + std::exp(-v));
        float first = c.mode == "input" ? v : a, second = c.mode == "maps" ? b : a;
        z[i] = std::exp(first) + first;
        z[block + i] = std::exp(second) + second;
        nb[i] = -b;
      }
      expect_close((*out)[0], z);
      expect_close((*out)[1], nb);
    }
  }
}

// m = relu(x) with x [1, C, 4, 4], split on axis 1 into halves p, q; then
// s = (exp(p) + q) * p and t = -q, so p and q are read after other kernels
// ran. The halves are contiguous blocks of m: the memory plan places them in
// m's buffer and the Split becomes a kBind. Splitting the graph input (not
// planned) or a split whose half is a graph output stays a copy.
std::unique_ptr<Graph> split_graph(int64_t channels, const std::string& mode) {
  auto g = std::make_unique<Graph>();
  g->source = "split";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{1, channels, 4, 4}});
  Value* m = mode == "input" ? x : g->add_node("Relu", {x}, {"m"})->output(0);
  Node* sp = g->add_node("Split", {m}, {"p", "q"});
  Attribute axis;
  axis.kind = Attribute::Kind::kInt;
  axis.i = 1;
  sp->set_attr("axis", axis);
  Value *p = sp->output(0), *q = sp->output(1);
  Value* e = g->add_node("Exp", {p}, {"e"})->output(0);
  Value* r = g->add_node("Add", {e, q}, {"r"})->output(0);
  Value* out = g->add_node("Mul", {r, p}, {"s"})->output(0);
  std::vector<Value*> outs = {out, g->add_node("Neg", {q}, {"t"})->output(0)};
  if (mode == "output") outs.push_back(p);
  g->set_outputs(outs);
  return g;
}

// A densenet-like block: c1 = concat(x, a), c2 = concat(x, a, b), c3 =
// concat(x, a, b, d), each new feature sigmoid(x + channel sum of the concat
// so far), every concat read afterwards. c3 hosts x, a, b and d; c1 and c2 lie
// at the start of its buffer (three binds, no copy), and results are exact.
TEST(Pipeline, ConcatsOfGrowingPrefixesShareOneBuffer) {
  const int64_t c = 16, plane = 16;
  auto g = std::make_unique<Graph>();
  g->source = "dense";
  g->opsets[""] = 17;
  Value* in = g->add_input("in", TensorType{DType::kFloat32, Shape{1, c, 4, 4}});
  Value* x = g->add_node("Relu", {in}, {"x"})->output(0);
  Tensor axes_t(DType::kInt64, {1});
  axes_t.data_as<int64_t>()[0] = 1;
  Value* axes = g->add_constant("axes", axes_t);
  auto cat = [&](const std::vector<Value*>& parts, const std::string& name) {
    Node* n = g->add_node("Concat", parts, {name});
    Attribute axis;
    axis.kind = Attribute::Kind::kInt;
    axis.i = 1;
    n->set_attr("axis", axis);
    return n->output(0);
  };
  auto feature = [&](Value* from, const std::string& name) {
    Value* sum = g->add_node("ReduceSum", {from, axes}, {name + "_s"})->output(0);
    Value* pre = g->add_node("Add", {x, sum}, {name + "_b"})->output(0);
    return g->add_node("Sigmoid", {pre}, {name})->output(0);
  };
  Value* a = feature(x, "a");
  Value* c1 = cat({x, a}, "c1");
  Value* b = feature(c1, "b");
  Value* c2 = cat({x, a, b}, "c2");
  Value* d = feature(c2, "d");
  Value* c3 = cat({x, a, b, d}, "c3");
  g->set_outputs({g->add_node("Neg", {c1}, {"n1"})->output(0), g->add_node("Neg", {c2}, {"n2"})->output(0),
                  g->add_node("Neg", {c3}, {"n3"})->output(0)});
  auto compiled = compile_graph(std::move(g), CompileOptions{});
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  int binds = 0;
  for (const runtime::Instr& instr : compiled->program->instrs) binds += instr.op == runtime::OpCode::kBind;
  EXPECT_EQ(binds, 3);

  Tensor t = random_tensor({1, c, 4, 4}, 5);
  // Reference: the features in channel blocks of c x plane.
  std::vector<float> all;
  for (int64_t i = 0; i < c * plane; ++i) all.push_back(std::max(t.data_as<float>()[i], 0.f));
  std::vector<std::vector<float>> prefixes;
  for (int f = 0; f < 3; ++f) {
    int64_t channels = static_cast<int64_t>(all.size()) / plane;
    std::vector<float> sum(plane, 0.f);
    for (int64_t ch = 0; ch < channels; ++ch)
      for (int64_t p = 0; p < plane; ++p) sum[p] += all[ch * plane + p];
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < plane; ++p) all.push_back(1.f / (1.f + std::exp(-(all[ch * plane + p] + sum[p]))));
    prefixes.push_back(all);
  }
  runtime::VM vm(compiled->program, 2);
  for (int run = 0; run < 2; ++run) {
    auto out = vm.run({t});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int k = 0; k < 3; ++k) {
      std::vector<float> want = k < 2 ? std::vector<float>(prefixes[static_cast<size_t>(k)].begin(),
                                                           prefixes[static_cast<size_t>(k)].begin() + (k + 2) * c * plane)
                                      : prefixes[2];
      for (float& v : want) v = -v;
      expect_close((*out)[static_cast<size_t>(k)], want);
    }
  }
}

TEST(Pipeline, SplitOutputsArePlannedInTheInputsSlices) {
  struct Case {
    int64_t channels;
    std::string mode;
    int binds;
  };
  for (const Case& c : {Case{32, "maps", 1}, Case{6, "maps", 1}, Case{32, "input", 0}, Case{32, "output", 0}}) {
    Tensor x = random_tensor({1, c.channels, 4, 4}, 11);
    auto compiled = compile_graph(split_graph(c.channels, c.mode), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    int binds = 0;
    for (const runtime::Instr& in : compiled->program->instrs) binds += in.op == runtime::OpCode::kBind;
    EXPECT_EQ(binds, c.binds) << c.channels << " " << c.mode;
    runtime::VM vm(compiled->program, 2);
    for (int run = 0; run < 2; ++run) {
      auto out = vm.run({x});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      int64_t half = c.channels / 2 * 16;
      std::vector<float> s(half), t(half), p(half);
      for (int64_t i = 0; i < half; ++i) {
        float xp = x.data_as<float>()[i], xq = x.data_as<float>()[half + i];
        float pv = c.mode == "input" ? xp : std::max(xp, 0.f), qv = c.mode == "input" ? xq : std::max(xq, 0.f);
        s[i] = (std::exp(pv) + qv) * pv;
        t[i] = -qv;
        p[i] = pv;
      }
      expect_close((*out)[0], s);
      expect_close((*out)[1], t);
      if (c.mode == "output") expect_close((*out)[2], p);
    }
  }
}

}  // namespace
}  // namespace kiln::driver
