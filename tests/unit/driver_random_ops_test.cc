// Random ops (src/ops/random.cc) and Dropout in training mode (a driver test:
// one case compiles a model): values are
// checked for their distribution over many draws (with fixed seeds, so the
// checks are deterministic), for determinism under a seed, and for the
// errors bad inputs give. A compiled model checks that a training Dropout
// runs the random kernel, not the compiled identity.
#include <gtest/gtest.h>

#include <cmath>

#include "driver/compile.h"
#include "ops/registry.h"
#include "ops_test_harness.h"
#include "runtime/vm.h"

namespace kiln::ops {
namespace {

using testing::make_tensor;
using testing::try_kernel;
using testing::tt;

std::unique_ptr<Graph> new_graph() {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = 17;
  return g;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_f64(i));
  return v;
}

void mean_std(const std::vector<double>& v, double* mean, double* sd) {
  double s = 0, q = 0;
  for (double x : v) s += x;
  *mean = s / static_cast<double>(v.size());
  for (double x : v) q += (x - *mean) * (x - *mean);
  *sd = std::sqrt(q / static_cast<double>(v.size()));
}

TEST(RandomOps, UniformAndNormalFollowTheirAttributesAndSeeds) {
  const int64_t count = 200000;
  for (const char* op : {"RandomUniform", "RandomNormal"}) {
    SCOPED_TRACE(op);
    bool normal = std::string(op) == "RandomNormal";
    auto make = [&](double seed) {
      auto g = new_graph();
      Node* n = g->add_node(op, {}, {"y"});
      n->set_attr("shape", Attribute::of_ints({2, count / 2}));
      n->set_attr(normal ? "mean" : "low", Attribute::of_float(normal ? 3.0 : -2.0));
      n->set_attr(normal ? "scale" : "high", Attribute::of_float(normal ? 0.5 : 6.0));
      n->set_attr("dtype", Attribute::of_int(11));  // double
      if (seed >= 0) n->set_attr("seed", Attribute::of_float(seed));
      EXPECT_TRUE(testing::infer(*g).is_ok());
      EXPECT_EQ(n->output(0)->type().to_string(), "f64[2, " + std::to_string(count / 2) + "]");
      auto r = try_kernel(*n, {});
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      return values(r->at(0));
    };
    std::vector<double> a = make(7.0), b = make(7.0), c = make(8.0), d = make(-1), e = make(-1);
    EXPECT_EQ(a, b) << "same seed, same values";
    EXPECT_NE(a, c);
    EXPECT_NE(d, e) << "without a seed, each run draws anew";
    double mean, sd;
    mean_std(a, &mean, &sd);
    // Tolerances are about 5 standard errors at 200000 draws.
    if (normal) {
      EXPECT_NEAR(mean, 3.0, 0.006);
      EXPECT_NEAR(sd, 0.5, 0.005);
      size_t beyond_2sd = std::count_if(a.begin(), a.end(), [](double x) { return std::abs(x - 3.0) > 1.0; });
      EXPECT_NEAR(static_cast<double>(beyond_2sd) / count, 0.0455, 0.003);
    } else {
      EXPECT_NEAR(mean, 2.0, 0.03);
      EXPECT_NEAR(sd, 8.0 / std::sqrt(12.0), 0.02);
      EXPECT_GE(*std::min_element(a.begin(), a.end()), -2.0);
      EXPECT_LT(*std::max_element(a.begin(), a.end()), 6.0);
      size_t low_tenth = std::count_if(a.begin(), a.end(), [](double x) { return x < -1.2; });
      EXPECT_NEAR(static_cast<double>(low_tenth) / count, 0.1, 0.004);
    }
  }
}

TEST(RandomOps, LikeFormsTakeTheInputsShapeAndDtype) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {3, var("n")}));
  Node* u = g->add_node("RandomUniformLike", {x}, {"u"});
  Node* nn = g->add_node("RandomNormalLike", {x}, {"v"});
  nn->set_attr("dtype", Attribute::of_int(11));
  Value* i = g->add_input("i", tt(DType::kInt64, {4}));
  Node* bad = g->add_node("RandomUniformLike", {i}, {"w"});  // no float dtype to take
  Status st = testing::infer(*g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("without a float dtype"), std::string::npos) << st.to_string();
  g->remove_node(bad);
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(u->output(0)->type().to_string(), "f32[3, n]");
  EXPECT_EQ(nn->output(0)->type().to_string(), "f64[3, n]");
  auto r = try_kernel(*u, {make_tensor(DType::kFloat32, {3, 5}, std::vector<double>(15, 0))});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->at(0).shape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(r->at(0).dtype(), DType::kFloat32);
}

TEST(RandomOps, BernoulliDrawsWithEachProbability) {
  auto g = new_graph();
  const int64_t count = 100000;
  Value* p = g->add_input("p", tt(DType::kFloat32, {count}));
  Node* n = g->add_node("Bernoulli", {p}, {"y"});
  n->set_attr("seed", Attribute::of_float(3.0));
  n->set_attr("dtype", Attribute::of_int(9));  // bool
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "bool[" + std::to_string(count) + "]");
  std::vector<double> probs(count);
  for (int64_t i = 0; i < count; ++i) probs[i] = i % 3 == 0 ? 0.0 : i % 3 == 1 ? 1.0 : 0.3;
  auto r = try_kernel(*n, {make_tensor(DType::kFloat32, {count}, probs)});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  int64_t ones_at_03 = 0, n03 = 0;
  for (int64_t i = 0; i < count; ++i) {
    double y = r->at(0).get_f64(i);
    if (i % 3 == 0) ASSERT_EQ(y, 0.0) << i;
    if (i % 3 == 1) ASSERT_EQ(y, 1.0) << i;
    if (i % 3 == 2) {
      ones_at_03 += y != 0;
      ++n03;
    }
  }
  EXPECT_NEAR(static_cast<double>(ones_at_03) / static_cast<double>(n03), 0.3, 0.01);
  probs[5] = 1.5;
  auto bad = try_kernel(*n, {make_tensor(DType::kFloat32, {count}, probs)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("outside [0, 1]"), std::string::npos);
}

TEST(RandomOps, MultinomialFollowsSoftmaxOfTheRow) {
  auto g = new_graph();
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
  Node* n = g->add_node("Multinomial", {x}, {"y"});
  const int64_t samples = 60000;
  n->set_attr("sample_size", Attribute::of_int(samples));
  n->set_attr("dtype", Attribute::of_int(7));
  n->set_attr("seed", Attribute::of_float(11.0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "i64[2, " + std::to_string(samples) + "]");
  // Row 0: probabilities 0.2, 0.5, 0.3 (as log-probabilities plus a constant);
  // row 1: all mass on class 2.
  std::vector<double> logits{std::log(0.2) + 4, std::log(0.5) + 4, std::log(0.3) + 4, -1e30, -1e30, 0};
  auto r = try_kernel(*n, {make_tensor(DType::kFloat32, {2, 3}, logits)});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<int64_t> hist(3, 0);
  for (int64_t k = 0; k < samples; ++k) {
    hist[r->at(0).get_i64(k)]++;
    ASSERT_EQ(r->at(0).get_i64(samples + k), 2);
  }
  EXPECT_NEAR(hist[0] / double(samples), 0.2, 0.01);
  EXPECT_NEAR(hist[1] / double(samples), 0.5, 0.01);
  EXPECT_NEAR(hist[2] / double(samples), 0.3, 0.01);
  g->add_node("Multinomial", {x}, {"z"})->set_attr("dtype", Attribute::of_int(1));
  EXPECT_FALSE(testing::infer(*g).is_ok());  // float samples
}

// Training Dropout: kept elements scaled by 1 / (1 - ratio), the mask marks
// them, about 1 - ratio of them survive; training_mode false is the identity.
TEST(RandomOps, DropoutKernelInTrainingMode) {
  auto g = new_graph();
  const int64_t count = 50000;
  Value* x = g->add_input("x", tt(DType::kFloat32, {count}));
  Value* ratio = g->add_input("r", tt(DType::kFloat32, {}));
  Value* training = g->add_input("t", tt(DType::kBool, {}));
  Node* n = g->add_node("Dropout", {x, ratio, training}, {"y", "mask"});
  n->set_attr("seed", Attribute::of_float(1.0));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  std::vector<double> xv(count);
  for (int64_t i = 0; i < count; ++i) xv[i] = 0.5 + static_cast<double>(i % 7);
  Tensor xt = make_tensor(DType::kFloat32, {count}, xv);
  auto r = try_kernel(*n, {xt, make_tensor(DType::kFloat32, {}, {0.25}), make_tensor(DType::kBool, {}, {1})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    bool m = r->at(1).get_f64(i) != 0;
    kept += m;
    ASSERT_EQ(r->at(0).get_f64(i), m ? static_cast<double>(static_cast<float>(xv[i] / 0.75)) : 0.0) << i;
  }
  EXPECT_NEAR(kept / double(count), 0.75, 0.01);
  r = try_kernel(*n, {xt, make_tensor(DType::kFloat32, {}, {0.25}), make_tensor(DType::kBool, {}, {0})});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(values(r->at(0)), values(xt));
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(r->at(1).get_f64(i), 1.0);
  auto bad = try_kernel(*n, {xt, make_tensor(DType::kFloat32, {}, {1.0}), make_tensor(DType::kBool, {}, {1})});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("outside [0, 1)"), std::string::npos);
}

// Through the compiler: a Dropout with constant training_mode true and ratio
// 0.5 runs the random kernel (about half the outputs zero); with ratio 0 it
// stays the compiled identity.
TEST(RandomOps, CompiledModelRunsTrainingDropoutKernel) {
  for (double ratio : {0.5, 0.0}) {
    SCOPED_TRACE(ratio);
    auto g = new_graph();
    Value* x = g->add_input("x", tt(DType::kFloat32, {4096}));
    Value* r = g->add_constant("ratio", make_tensor(DType::kFloat32, {}, {ratio}));
    Value* t = g->add_constant("training", make_tensor(DType::kBool, {}, {1}));
    Node* n = g->add_node("Dropout", {x, r, t}, {"y"});
    g->set_outputs({n->output(0)});
    auto compiled = driver::compile_graph(std::move(g), CompileOptions{});
    ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
    runtime::VM vm(compiled->program, 2);
    Tensor xt = make_tensor(DType::kFloat32, {4096}, std::vector<double>(4096, 1.0));
    auto out = vm.run({xt});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    int64_t zeros = 0;
    for (int64_t i = 0; i < 4096; ++i) zeros += (*out)[0].get_f64(i) == 0;
    if (ratio == 0.0) EXPECT_EQ(zeros, 0);
    else EXPECT_NEAR(zeros / 4096.0, 0.5, 0.05);
  }
}

}  // namespace
}  // namespace kiln::ops
