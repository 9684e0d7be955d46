// The whole pipeline on graphs built with the Graph API: inference, fusion,
// lowering, code generation, the VM (static plan and symbolic shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "driver/pipeline.h"
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

}  // namespace
}  // namespace kiln::driver
