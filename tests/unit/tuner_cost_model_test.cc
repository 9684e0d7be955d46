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
  // The two loops touch all of A and C and B once: 8256 bytes, against the host's L1.
  const TargetKey host = TargetKey::host(avx512);
  const double l1 = host.l1d_bytes > 0 ? static_cast<double>(host.l1d_bytes) : 48 << 10;
  EXPECT_NEAR(f[at("footprint_inner2_l1")], std::log2((8256.0 + 1) / l1), 1e-5);
  // Every access runs along its last index: contiguous vectors, none strided.
  EXPECT_FLOAT_EQ(f[at("vector_loads_contiguous")], 1);
  EXPECT_FLOAT_EQ(f[at("vector_loads_broadcast")], 0);
  EXPECT_FLOAT_EQ(f[at("vector_loads_strided")], 0);
  EXPECT_FLOAT_EQ(f[at("vector_stores_strided")], 0);
  EXPECT_FLOAT_EQ(f[at("inner_loads_strided")], 0);
  EXPECT_FLOAT_EQ(f[at("accumulator_registers_max")], 0);  // nothing accumulates
  // All of it fits every cache: each line is brought once.
  for (const char* level : {"traffic_l1", "traffic_l2", "traffic_l3"}) EXPECT_FLOAT_EQ(f[at(level)], lg(8256)) << level;
  EXPECT_NEAR(f[at("intensity_l1")], std::log2(2048.0 / 8256.0), 1e-5);
  // Three threads: 64 tasks in 22 rounds of 3.
  std::vector<float> f3 = kernel_features(axpy(), "x.cand", "mr=4 nr=32", 3, avx512);
  EXPECT_NEAR(f3[at("parallel_balance")], 64.0 / 66.0, 1e-6);
  // On AVX2 the same 16 lanes are two vectors: utilization capped at 1.
  std::vector<float> f2 = kernel_features(axpy(), "x.cand", "mr=4 nr=32", 2, *Target::named("avx2"));
  EXPECT_FLOAT_EQ(f2[at("lane_utilization")], 1);
  // The candidate is one slot; the knob values land in theirs, an unknown knob in an overflow slot.
  float cand = 0;
  for (int i = 0; i < 16; ++i) cand += f[at("candidate_" + std::to_string(i))];
  EXPECT_FLOAT_EQ(cand, 1);
  EXPECT_FLOAT_EQ(f[at("knob_mr")], lg(4));
  EXPECT_FLOAT_EQ(f[at("knob_nr")], lg(32));
  std::vector<float> odd = kernel_features(axpy(), "x.cand", "zz=7", 2, avx512);
  float other = 0;
  for (int i = 0; i < 4; ++i) other += odd[at("knob_other_" + std::to_string(i))];
  EXPECT_FLOAT_EQ(other, lg(7));
  EXPECT_FLOAT_EQ(odd[at("knob_mr")], 0);
}

// A register-tiled product, rows of C in tiles of 4 (unrolled), 16 columns
// in one vector:
//   for io in 0..8: for k in 0..64: unrolled ii in 0..4: vectorized j in 0..16:
//     C[io*4 + ii, j] += A[io*4 + ii, k] * B[k, j]
// and a transposing copy: for i in 0..16: vectorized j in 0..16: T[i, j] = A[j, i].
TEST(Features, StridesRegistersAndCacheTrafficOnAHandCheckedProduct) {
  tir::PrimFunc f;
  f.name = "tile";
  f.params = {tir::Buffer{"A", DType::kFloat32, {32, 64}}, tir::Buffer{"B", DType::kFloat32, {64, 16}},
              tir::Buffer{"C", DType::kFloat32, {32, 16}}};
  Expr io = var("io"), k = var("k"), ii = var("ii"), j = var("j");
  Expr row = io * Expr(int64_t{4}) + ii;
  Expr value = load("C", 2, DType::kFloat32, {row, j}) +
               load("A", 0, DType::kFloat32, {row, k}) * load("B", 1, DType::kFloat32, {k, j});
  f.body = tir::make_for(
      "io", Expr(int64_t{8}), tir::ForKind::kSerial,
      tir::make_for("k", Expr(int64_t{64}), tir::ForKind::kSerial,
                    tir::make_for("ii", Expr(int64_t{4}), tir::ForKind::kUnrolled,
                                  tir::make_for("j", Expr(int64_t{16}), tir::ForKind::kVectorized,
                                                tir::make_store("C", 2, {row, j}, value)))));
  Target avx512 = *Target::named("avx512");
  TargetKey small = TargetKey::host(avx512);
  small.l1d_bytes = 4096;
  small.l2_bytes = 16384;
  small.l3_bytes = 65536;
  std::vector<float> v = kernel_features(f, "", "", 1, avx512, &small);
  // Along j: C and B contiguous, A[row, k] the same element (broadcast).
  EXPECT_FLOAT_EQ(v[at("vector_loads_contiguous")], 2.0f / 3.0f);
  EXPECT_FLOAT_EQ(v[at("vector_loads_broadcast")], 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(v[at("vector_loads_strided")], 0);
  EXPECT_FLOAT_EQ(v[at("vector_stores_strided")], 0);
  // 4 unrolled rows of one 16-lane vector accumulate: 4 of AVX-512's 32 registers.
  EXPECT_FLOAT_EQ(v[at("accumulator_registers_max")], 4.0f / 32.0f);
  EXPECT_FLOAT_EQ(v[at("accumulator_registers_mean")], 4.0f / 32.0f);
  // Lines per execution of each loop: all four loops 8192 (A) + 4096 (B) + 2048 (C) = 14336 bytes;
  // k's loop (per io) 1024 + 4096 + 256 = 5376; ii's 256 + 64 + 256 = 576.
  // A 4 KB L1 holds ii's loop: 576 bytes for each of 8 x 64 (io, k); 16 KB holds everything once.
  EXPECT_FLOAT_EQ(v[at("traffic_l1")], lg(576.0 * 8 * 64));
  EXPECT_FLOAT_EQ(v[at("traffic_l2")], lg(14336));
  EXPECT_FLOAT_EQ(v[at("traffic_l3")], lg(14336));
  // A multiply and an add per iteration: 2 x 32768.
  EXPECT_NEAR(v[at("intensity_l1")], std::log2(65536.0 / (576.0 * 8 * 64)), 1e-5);

  tir::PrimFunc t;
  t.name = "transpose";
  t.params = {tir::Buffer{"A", DType::kFloat32, {16, 16}}, tir::Buffer{"T", DType::kFloat32, {16, 16}}};
  Expr i = var("i");
  t.body = tir::make_for("i", Expr(int64_t{16}), tir::ForKind::kSerial,
                         tir::make_for("j", Expr(int64_t{16}), tir::ForKind::kVectorized,
                                       tir::make_store("T", 1, {i, j}, load("A", 0, DType::kFloat32, {j, i}))));
  std::vector<float> tv = kernel_features(t, "", "", 1, avx512, &small);
  EXPECT_FLOAT_EQ(tv[at("vector_loads_strided")], 1);  // A[j, i]: 16 elements apart along j
  EXPECT_FLOAT_EQ(tv[at("inner_loads_strided")], 1);
  EXPECT_FLOAT_EQ(tv[at("vector_stores_strided")], 0);
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
  // A model trained on other features is refused by name, never used: one
  // stored before features were versioned (version 1's), and one of another version.
  auto blob = m.save();
  ASSERT_TRUE(blob.is_ok());
  const std::string json = blob->substr(blob->find(':') + 1);
  const std::string prefix = "Gf" + std::to_string(kFeatureVersion) + ":";
  ASSERT_EQ(blob->substr(0, prefix.size()), prefix);
  for (const std::string& stale : {"G" + json, "Gf" + std::to_string(kFeatureVersion + 1) + ":" + json}) {
    Status st = CostModel().load(stale);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
    EXPECT_NE(st.to_string().find("features of version"), std::string::npos) << st.to_string();
  }
  for (const std::string& bad : {std::string("Gf"), std::string("Gfx:{}"), std::string("Gf0:") + json, std::string("Gf2")})
    EXPECT_FALSE(CostModel().load(bad).is_ok()) << bad;
}

// Records train the model only with features of this Kiln's version.
TEST(CostModel, SamplesAreRecordsWithCurrentFeatures) {
  Record r;
  r.workload = std::string(64, 'a');
  r.target = "t";
  r.latencies_s = {1e-3};
  r.features.assign(kNumFeatures, 0.5f);
  r.feature_version = kFeatureVersion;
  EXPECT_TRUE(sample_of(r).has_value());
  r.feature_version = kFeatureVersion - 1;
  EXPECT_FALSE(sample_of(r).has_value());
  r.feature_version = kFeatureVersion;
  r.features.pop_back();
  EXPECT_FALSE(sample_of(r).has_value());
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
