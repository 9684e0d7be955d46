// Several compiled models run at once from several threads: every output must
// equal the model's serial output bit for bit. The models share thread pools
// (two of them have the same thread count), mix static plans and symbolic
// shapes, and run enough times that a race in the pool or the runtime shows.
// Also built with ThreadSanitizer in CI (tests/tsan).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "driver/compile.h"
#include "runtime/vm.h"

namespace kiln::driver {
namespace {

Tensor random_tensor(DType dtype, std::vector<int64_t> shape, uint32_t seed, int64_t int_range = 0) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int64_t> ints(0, std::max<int64_t>(int_range - 1, 0));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kFloat32) t.data_as<float>()[i] = normal(rng);
    else t.data_as<int64_t>()[i] = ints(rng);
  }
  return t;
}

struct TestModel {
  std::string name;
  int threads = 1;
  std::shared_ptr<const runtime::Program> program;
  std::shared_ptr<codegen::CompiledModule> module;  // keeps the kernels' code alive
  std::vector<std::vector<Tensor>> inputs;     // several input sets
  std::vector<std::vector<Tensor>> expected;   // serial outputs per input set
};

// y = sigmoid(relu(x @ w1 + b1) @ w2), batch symbolic (pooled buffers).
std::unique_ptr<Graph> mlp() {
  auto g = std::make_unique<Graph>();
  g->source = "mlp";
  g->opsets[""] = 17;
  Expr n = var("n");
  g->bounds["n"] = Interval{1, std::nullopt};
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{n, 64}});
  Value* w1 = g->add_constant("w1", random_tensor(DType::kFloat32, {64, 256}, 11));
  Value* b1 = g->add_constant("b1", random_tensor(DType::kFloat32, {256}, 12));
  Value* w2 = g->add_constant("w2", random_tensor(DType::kFloat32, {256, 64}, 13));
  Node* mm1 = g->add_node("MatMul", {x, w1}, {"mm1"});
  Node* add = g->add_node("Add", {mm1->output(0), b1}, {"add"});
  Node* relu = g->add_node("Relu", {add->output(0)}, {"relu"});
  Node* mm2 = g->add_node("MatMul", {relu->output(0), w2}, {"mm2"});
  Node* y = g->add_node("Sigmoid", {mm2->output(0)}, {"y"});
  g->set_outputs({y->output(0)});
  return g;
}

// y = relu(conv3x3(x)) pooled to [1, 16, 1, 1]: static shapes (one arena).
std::unique_ptr<Graph> convnet() {
  auto g = std::make_unique<Graph>();
  g->source = "convnet";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{1, 8, 32, 32}});
  Value* w = g->add_constant("w", random_tensor(DType::kFloat32, {16, 8, 3, 3}, 21));
  Value* b = g->add_constant("b", random_tensor(DType::kFloat32, {16}, 22));
  Node* conv = g->add_node("Conv", {x, w, b}, {"conv"});
  conv->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  conv->set_attr("kernel_shape", Attribute::of_ints({3, 3}));
  Node* relu = g->add_node("Relu", {conv->output(0)}, {"relu"});
  Node* conv2 = g->add_node("Conv", {relu->output(0), g->add_constant("w2", random_tensor(DType::kFloat32, {16, 16, 3, 3}, 23))},
                            {"conv2"});
  conv2->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  conv2->set_attr("strides", Attribute::of_ints({2, 2}));
  Node* pool = g->add_node("GlobalAveragePool", {conv2->output(0)}, {"y"});
  g->set_outputs({relu->output(0), pool->output(0)});
  return g;
}

// y = softmax(x @ w) over the last axis: static, reductions.
std::unique_ptr<Graph> softmax_head() {
  auto g = std::make_unique<Graph>();
  g->source = "softmax_head";
  g->opsets[""] = 17;
  Value* x = g->add_input("x", TensorType{DType::kFloat32, Shape{48, 96}});
  Value* w = g->add_constant("w", random_tensor(DType::kFloat32, {96, 160}, 31));
  Node* mm = g->add_node("MatMul", {x, w}, {"mm"});
  Node* sm = g->add_node("Softmax", {mm->output(0)}, {"y"});
  g->set_outputs({sm->output(0)});
  return g;
}

// Embedding lookup of a symbolic number of ids, then a projection.
std::unique_ptr<Graph> embedding() {
  auto g = std::make_unique<Graph>();
  g->source = "embedding";
  g->opsets[""] = 17;
  Expr s = var("s");
  g->bounds["s"] = Interval{1, std::nullopt};
  Value* ids = g->add_input("ids", TensorType{DType::kInt64, Shape{s}});
  Value* table = g->add_constant("table", random_tensor(DType::kFloat32, {500, 64}, 41));
  Value* w = g->add_constant("w", random_tensor(DType::kFloat32, {64, 128}, 42));
  Node* gather = g->add_node("Gather", {table, ids}, {"emb"});
  Node* mm = g->add_node("MatMul", {gather->output(0), w}, {"mm"});
  Node* t = g->add_node("Tanh", {mm->output(0)}, {"y"});
  g->set_outputs({t->output(0)});
  return g;
}

TestModel make_model(const std::string& name, std::unique_ptr<Graph> g, int threads,
                     std::vector<std::vector<Tensor>> inputs) {
  TestModel m;
  m.name = name;
  m.threads = threads;
  CompileOptions opts;
  opts.threads = threads;
  auto compiled = compile_graph(std::move(g), opts);
  EXPECT_TRUE(compiled.is_ok()) << name << ": " << compiled.status().to_string();
  if (!compiled.is_ok()) return m;
  m.program = compiled->program;
  m.module = compiled->module;
  m.inputs = std::move(inputs);
  // The serial reference: one run per input set, nothing else running.
  runtime::VM vm(m.program, threads);
  for (const auto& in : m.inputs) {
    auto out = vm.run(in);
    EXPECT_TRUE(out.is_ok()) << name << ": " << out.status().to_string();
    m.expected.push_back(out.is_ok() ? *out : std::vector<Tensor>{});
  }
  return m;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

std::vector<TestModel> make_models() {
  std::vector<TestModel> models;
  std::vector<std::vector<Tensor>> mlp_in, conv_in, sm_in, emb_in;
  for (uint32_t k = 0; k < 3; ++k) {
    mlp_in.push_back({random_tensor(DType::kFloat32, {static_cast<int64_t>(1 + 7 * k), 64}, 100 + k)});
    conv_in.push_back({random_tensor(DType::kFloat32, {1, 8, 32, 32}, 200 + k)});
    sm_in.push_back({random_tensor(DType::kFloat32, {48, 96}, 300 + k)});
    emb_in.push_back({random_tensor(DType::kInt64, {static_cast<int64_t>(3 + 20 * k)}, 400 + k, 500)});
  }
  // mlp and convnet both use 2 threads: they share one pool.
  models.push_back(make_model("mlp", mlp(), 2, std::move(mlp_in)));
  models.push_back(make_model("convnet", convnet(), 2, std::move(conv_in)));
  models.push_back(make_model("softmax_head", softmax_head(), 3, std::move(sm_in)));
  models.push_back(make_model("embedding", embedding(), 4, std::move(emb_in)));
  return models;
}

TEST(Concurrency, ModelsRunFromManyThreadsMatchSerialBitForBit) {
  std::vector<TestModel> models = make_models();
  for (const TestModel& m : models) ASSERT_TRUE(m.program) << m.name;
  constexpr int kRunsPerThread = 150;
  // Two caller threads per model, each with its own VM (a Model holds one VM
  // and serializes its callers; separate VMs are what runs truly at once).
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0}, errors{0}, runs{0};
  std::atomic<bool> go{false};
  for (size_t i = 0; i < models.size() * 2; ++i) {
    const TestModel& m = models[i % models.size()];
    threads.emplace_back([&, i] {
      runtime::VM vm(m.program, m.threads);
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < kRunsPerThread; ++r) {
        size_t set = (r + i) % m.inputs.size();
        auto out = vm.run(m.inputs[set]);
        runs.fetch_add(1);
        if (!out.is_ok()) {
          errors.fetch_add(1);
          continue;
        }
        for (size_t o = 0; o < out->size(); ++o)
          if (!bitwise_equal((*out)[o], m.expected[set][o])) mismatches.fetch_add(1);
      }
    });
  }
  go.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(runs.load(), static_cast<int>(models.size()) * 2 * kRunsPerThread);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace kiln::driver
