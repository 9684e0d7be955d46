// The cost model's features on a hand-checked loop nest, and the model
// itself on samples whose order is known.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tune/cost_model.h"
#include "tune/features.h"

namespace kiln::tune {
namespace {

float lg(double x) { return static_cast<float>(std::log2(1.0 + x)); }

size_t at(const std::string& name) {
  const auto& names = feature_names();
  auto it = std::find(names.begin(), names.end(), name);
  EXPECT_NE(it, names.end()) << name;
  return static_cast<size_t>(it - names.begin());
}

// parallel for i in 0..64: vectorized for j in 0..16: C[i, j] = A[i, j] * 2 + B[j]
tir::PrimFunc axpy() {
  tir::PrimFunc f;
  f.name = "axpy";
  f.params = {tir::Buffer{"A", DType::kFloat32, {64, 16}}, tir::Buffer{"B", DType::kFloat32, {16}},
              tir::Buffer{"C", DType::kFloat32, {64, 16}}};
  Expr i = var("i"), j = var("j");
  Expr value = load("A", 0, DType::kFloat32, {i, j}) * float_imm(2.0) + load("B", 1, DType::kFloat32, {j});
  f.body = tir::make_for("i", Expr(int64_t{64}), tir::ForKind::kParallel,
                         tir::make_for("j", Expr(int64_t{16}), tir::ForKind::kVectorized,
                                       tir::make_store("C", 2, {i, j}, value)));
  return f;
}

TEST(Features, HandCheckedLoopNest) {
  ASSERT_EQ(feature_names().size(), static_cast<size_t>(kNumFeatures));
  Target avx512 = *Target::named("avx512");
  std::vector<float> f = kernel_features(axpy(), "x.cand", "mr=4 nr=32", 2, avx512);
  ASSERT_EQ(f.size(), static_cast<size_t>(kNumFeatures));
  EXPECT_FLOAT_EQ(f[at("store_iters")], lg(1024));
  EXPECT_FLOAT_EQ(f[at("load_iters")], lg(2048));
  EXPECT_FLOAT_EQ(f[at("arith_ops")], lg(2048));  // a multiply and an add per point
  EXPECT_FLOAT_EQ(f[at("transcendental")], 0);
  EXPECT_FLOAT_EQ(f[at("vector_fraction")], 1);
  EXPECT_FLOAT_EQ(f[at("vector_lanes")], lg(16));
  EXPECT_FLOAT_EQ(f[at("lane_utilization")], 1);  // 16 lanes of f32 fill an AVX-512 vector
  EXPECT_FLOAT_EQ(f[at("parallel_extent")], lg(64));
  EXPECT_FLOAT_EQ(f[at("parallel_balance")], 1);  // 64 tasks over 2 threads
  EXPECT_FLOAT_EQ(f[at("work_per_task")], lg(16));
  EXPECT_FLOAT_EQ(f[at("max_depth")], 2);
  EXPECT_FLOAT_EQ(f[at("loops")], 2);
  EXPECT_FLOAT_EQ(f[at("stores")], 1);
  EXPECT_FLOAT_EQ(f[at("input_bytes")], lg(64 * 16 * 4 + 16 * 4));
  EXPECT_FLOAT_EQ(f[at("output_bytes")], lg(64 * 16 * 4));
  EXPECT_FLOAT_EQ(f[at("innermost_extent")], lg(16));
  // The two loops touch all of A and C and B once: 8256 bytes, against a 48 KB L1.
  EXPECT_NEAR(f[at("footprint_inner2_l1")], std::log2((8256.0 + 1) / (48 << 10)), 1e-5);
  // Three threads: 64 tasks in 22 rounds of 3.
  std::vector<float> f3 = kernel_features(axpy(), "x.cand", "mr=4 nr=32", 3, avx512);
  EXPECT_NEAR(f3[at("parallel_balance")], 64.0 / 66.0, 1e-6);
  // On AVX2 the same 16 lanes are two vectors: utilization capped at 1.
  std::vector<float> f2 = kernel_features(axpy(), "x.cand", "mr=4 nr=32", 2, *Target::named("avx2"));
  EXPECT_FLOAT_EQ(f2[at("lane_utilization")], 1);
  // The candidate is one slot; the knob values land in theirs.
  float cand = 0, knobs = 0;
  for (int i = 0; i < 8; ++i) {
    cand += f[at("candidate_" + std::to_string(i))];
    knobs += f[at("knob_" + std::to_string(i))];
  }
  EXPECT_FLOAT_EQ(cand, 1);
  EXPECT_FLOAT_EQ(knobs, lg(4) + lg(32));
}

// Workloads whose latency falls with feature 0 and rises with feature 1 (plus noise in feature 2).
std::vector<Sample> synthetic(int workloads, int points, uint32_t seed, const std::string& prefix) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<Sample> out;
  for (int w = 0; w < workloads; ++w) {
    double scale = 1e-3 * (1 + w);
    for (int p = 0; p < points; ++p) {
      Sample s;
      s.workload = prefix + std::to_string(w);
      s.features.assign(kNumFeatures, 0.f);
      s.features[0] = u(rng);
      s.features[1] = u(rng);
      s.features[2] = u(rng);
      s.features[3] = static_cast<float>(w);
      s.seconds = scale * (2.0 - s.features[0] + 0.5 * s.features[1]);
      out.push_back(s);
    }
  }
  return out;
}

TEST(CostModel, LearnsAnOrderAndKeepsItThroughSaveAndLoad) {
  std::vector<Sample> train = synthetic(20, 30, 1, "train"), test = synthetic(8, 30, 2, "test");
  for (Objective o : {Objective::kRegression, Objective::kRank}) {
    CostModel m;
    ASSERT_TRUE(m.train(train, o).is_ok());
    auto e = evaluate(m, test);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    EXPECT_EQ(e->workloads, 8);
    EXPECT_GT(e->pairwise, 0.85) << objective_name(o);
    EXPECT_GT(e->peak5, 0.95) << objective_name(o);
    auto blob = m.save();
    ASSERT_TRUE(blob.is_ok());
    CostModel back;
    ASSERT_TRUE(back.load(*blob).is_ok());
    EXPECT_EQ(back.objective(), o);
    std::vector<std::vector<float>> f;
    for (int i = 0; i < 10; ++i) f.push_back(test[i].features);
    EXPECT_EQ(*m.predict(f), *back.predict(f));
  }
  // What it cannot do is an error, not a crash.
  CostModel empty;
  EXPECT_FALSE(empty.predict({std::vector<float>(kNumFeatures, 0.f)}).is_ok());
  EXPECT_FALSE(empty.train({}, Objective::kRegression).is_ok());
  EXPECT_FALSE(empty.load("Gnot json").is_ok());
  EXPECT_FALSE(empty.load("").is_ok());
  CostModel m;
  ASSERT_TRUE(m.train(train, Objective::kRegression).is_ok());
  EXPECT_FALSE(m.predict({std::vector<float>(3, 0.f)}).is_ok());
}

// Held-out figures: high where the order carries over to unseen workloads,
// near chance where latencies have nothing to do with the features.
TEST(CostModel, CrossValidationHoldsOutWorkloads) {
  std::vector<Sample> learnable = synthetic(16, 20, 3, "w");
  auto good = cross_validate(learnable, Objective::kRegression);
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(good->workloads, 16) << "every workload is held out once";
  EXPECT_GT(good->pairwise, 0.85);
  std::vector<Sample> noise = learnable;
  std::mt19937 rng(4);
  std::uniform_real_distribution<double> u(1e-3, 2e-3);
  for (Sample& s : noise) s.seconds = u(rng);
  auto bad = cross_validate(noise, Objective::kRegression);
  ASSERT_TRUE(bad.is_ok());
  EXPECT_LT(bad->pairwise, 0.65);
  // One workload cannot be held out from itself.
  EXPECT_FALSE(cross_validate(synthetic(1, 20, 5, "one"), Objective::kRegression).is_ok());
  auto back = parse_heldout(heldout_text(*good));
  ASSERT_TRUE(back.has_value());
  EXPECT_NEAR(back->pairwise, good->pairwise, 1e-4);
  EXPECT_EQ(back->workloads, 16);
  EXPECT_FALSE(parse_heldout("").has_value());
  EXPECT_FALSE(parse_heldout("pairwise=1.5 peak1=1 peak5=1 workloads=3").has_value());
  EXPECT_FALSE(parse_heldout("pairwise=x").has_value());
}

}  // namespace
}  // namespace kiln::tune
