// ai.onnx.ml ops (src/ops/ml.cc): Binarizer and ArrayFeatureExtractor
// kernels against hand-computed results, and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::make_tensor;
using testing::try_kernel;
using testing::tt;

std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_f64(i));
  return v;
}

TEST(MlOps, BinarizerComparesWithThreshold) {
  Graph g;
  g.opsets["ai.onnx.ml"] = 1;
  Value* x = g.add_input("x", tt(DType::kFloat32, {5}));
  Node* n = g.add_node("Binarizer", {x}, {"y"}, "ai.onnx.ml");
  n->set_attr("threshold", Attribute::of_float(1.0));
  ASSERT_TRUE(testing::infer(g).is_ok());
  auto r = try_kernel(*n, {make_tensor(DType::kFloat32, {5}, {1.0, 1.5, -3, NAN, 100})});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(values(r->at(0)), (std::vector<double>{0, 1, 0, 0, 1}));  // equal is not above; NaN is not above
  EXPECT_EQ(r->at(0).dtype(), DType::kFloat32);
}

// TreeEnsemble: two trees over 2 features, 2 targets. Tree 0: x0 <= 1 ?
// leaf 0 (target 0, weight 2) : (x1 < 5, a NaN going true ? leaf 1 (target 1,
// 4) : leaf 2 (target 0, -6)); tree 1: x0 <= 0 ? leaf 0 : leaf 3 (target 1,
// 10), which every row takes.
// Every aggregate and the logistic transform against values worked by hand;
// a tree with a cycle and a leaf target past n_targets are errors.
TEST(MlOps, TreeEnsembleAggregatesTransformsAndBadTrees) {
  auto make = [](int64_t aggregate, int64_t post, std::vector<int64_t> true_ids, int64_t target3) {
    auto g = std::make_unique<Graph>();
    g->opsets["ai.onnx.ml"] = 5;
    Value* x = g->add_input("x", tt(DType::kFloat32, {3, 2}));
    Node* n = g->add_node("TreeEnsemble", {x}, {"y"}, "ai.onnx.ml");
    n->set_attr("nodes_splits", Attribute::of_tensor(make_tensor(DType::kFloat32, {3}, {1, 5, 0})));  // node 2: x0 <= 0
    n->set_attr("nodes_featureids", Attribute::of_ints({0, 1, 0}));
    n->set_attr("nodes_modes", Attribute::of_tensor(make_tensor(DType::kUInt8, {3}, {0, 1, 0})));
    n->set_attr("nodes_truenodeids", Attribute::of_ints(std::move(true_ids)));
    n->set_attr("nodes_falsenodeids", Attribute::of_ints({1, 2, 3}));
    n->set_attr("nodes_trueleafs", Attribute::of_ints({1, 1, 1}));
    n->set_attr("nodes_falseleafs", Attribute::of_ints({0, 1, 1}));
    n->set_attr("nodes_missing_value_tracks_true", Attribute::of_ints({0, 1, 0}));
    n->set_attr("leaf_targetids", Attribute::of_ints({0, 1, 0, target3}));
    n->set_attr("leaf_weights", Attribute::of_tensor(make_tensor(DType::kFloat32, {4}, {2, 4, -6, 10})));
    n->set_attr("tree_roots", Attribute::of_ints({0, 2}));
    n->set_attr("n_targets", Attribute::of_int(2));
    n->set_attr("aggregate_function", Attribute::of_int(aggregate));
    n->set_attr("post_transform", Attribute::of_int(post));
    return g;
  };
  Tensor x = make_tensor(DType::kFloat32, {3, 2}, {0.5, 9, 3, NAN, 3, 7});
  // Row 0: leaf 0 and leaf 3; row 1: leaf 1 (NaN tracks true) and 3; row 2: leaf 2 and 3.
  const double fmax = std::numeric_limits<float>::max(), fmin = std::numeric_limits<float>::lowest();
  struct Case {
    int64_t aggregate, post;
    std::vector<double> want;
  };
  for (const Case& c : std::vector<Case>{
           {1, 0, {2, 10, 0, 14, -6, 10}},
           {0, 0, {1, 5, 0, 7, -3, 5}},
           {2, 0, {2, 10, fmax, 4, -6, 10}},
           {3, 0, {2, 10, fmin, 10, -6, 10}},
           {1, 2, {1 / (1 + std::exp(-2.0)), 1 / (1 + std::exp(-10.0)), 0.5, 1 / (1 + std::exp(-14.0)),
                   1 / (1 + std::exp(6.0)), 1 / (1 + std::exp(-10.0))}}}) {
    auto g = make(c.aggregate, c.post, {0, 1, 0}, 1);
    ASSERT_TRUE(testing::infer(*g).is_ok());
    EXPECT_EQ(g->nodes()[0]->output(0)->type().to_string(), "f32[3, 2]");
    auto r = try_kernel(*g->nodes()[0], {x});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    std::vector<double> got = values(r->at(0));
    ASSERT_EQ(got.size(), c.want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], c.want[i], 1e-6 * std::max(1.0, std::fabs(c.want[i])))
          << "aggregate " << c.aggregate << " post " << c.post << " element " << i;
  }
  // Node 1's true branch back to node 0 (not a leaf): a cycle on row 1.
  auto cyc = make(1, 0, {0, 0, 0}, 1);
  Node* cn = cyc->nodes()[0];
  cn->set_attr("nodes_trueleafs", Attribute::of_ints({1, 0, 1}));
  ASSERT_TRUE(testing::infer(*cyc).is_ok());
  auto r = try_kernel(*cn, {x});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("has a cycle"), std::string::npos) << r.status().message();
  auto bad = make(1, 0, {0, 1, 0}, 2);
  auto k = try_kernel(*bad->nodes()[0], {x});
  ASSERT_FALSE(k.is_ok());
  EXPECT_NE(k.status().message().find("leaf target 2 outside [0, 2)"), std::string::npos) << k.status().message();
  // SOFTMAX over the targets: row 0 sums to [2, 10].
  auto soft = make(1, 1, {0, 1, 0}, 1);
  auto sr = try_kernel(*soft->nodes()[0], {x});
  ASSERT_TRUE(sr.is_ok()) << sr.status().to_string();
  EXPECT_NEAR(values(sr->at(0))[0], 1 / (1 + std::exp(8.0)), 1e-6);
  EXPECT_NEAR(values(sr->at(0))[1], 1 / (1 + std::exp(-8.0)), 1e-6);
  // A root whose branches are one leaf is the leaf at the root's index (the
  // ONNX reference's reading), which must exist: tree_roots [0, 5] with 4 leaves.
  auto leafy = make(1, 0, {0, 1, 0}, 1);
  Node* ln = leafy->nodes()[0];
  ln->set_attr("nodes_splits", Attribute::of_tensor(make_tensor(DType::kFloat32, {6}, {1, 5, 0, 0, 0, 0})));
  ln->set_attr("nodes_featureids", Attribute::of_ints({0, 1, 0, 0, 0, 0}));
  ln->set_attr("nodes_modes", Attribute::of_tensor(make_tensor(DType::kUInt8, {6}, {0, 1, 0, 0, 0, 0})));
  ln->set_attr("nodes_truenodeids", Attribute::of_ints({0, 1, 0, 0, 0, 1}));
  ln->set_attr("nodes_falsenodeids", Attribute::of_ints({1, 2, 3, 0, 0, 1}));
  ln->set_attr("nodes_trueleafs", Attribute::of_ints({1, 1, 1, 1, 1, 1}));
  ln->set_attr("nodes_falseleafs", Attribute::of_ints({0, 1, 1, 1, 1, 1}));
  ln->set_attr("nodes_missing_value_tracks_true", Attribute::of_ints({0, 1, 0, 0, 0, 0}));
  ln->set_attr("tree_roots", Attribute::of_ints({0, 5}));
  auto lk = try_kernel(*ln, {x});
  ASSERT_FALSE(lk.is_ok());
  EXPECT_NE(lk.status().message().find("tree root 5 is a leaf but there are only 4 leaves"), std::string::npos)
      << lk.status().message();
  // A node reading a feature X does not have is an error when it runs.
  auto wide = make(1, 0, {0, 1, 0}, 1);
  wide->nodes()[0]->set_attr("nodes_featureids", Attribute::of_ints({0, 2, 0}));
  auto wr = try_kernel(*wide->nodes()[0], {x});
  ASSERT_FALSE(wr.is_ok());
  EXPECT_NE(wr.status().message().find("reads feature 2 of 2"), std::string::npos) << wr.status().message();
}

TEST(MlOps, ArrayFeatureExtractorSelectsAlongTheLastAxis) {
  Graph g;
  g.opsets["ai.onnx.ml"] = 1;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 4}));
  Value* v = g.add_input("v", tt(DType::kInt64, {3}));
  Value* i = g.add_input("i", tt(DType::kInt64, {1, 3}));
  Node* n = g.add_node("ArrayFeatureExtractor", {x, i}, {"y"}, "ai.onnx.ml");
  Node* n1 = g.add_node("ArrayFeatureExtractor", {v, i}, {"z"}, "ai.onnx.ml");
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "f32[2, 3]");
  EXPECT_EQ(n1->output(0)->type().to_string(), "i64[1, 3]");
  Tensor idx = make_tensor(DType::kInt64, {1, 3}, {3, 0, 3});
  auto r = try_kernel(*n, {make_tensor(DType::kFloat32, {2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}), idx});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(values(r->at(0)), (std::vector<double>{3, 0, 3, 7, 4, 7}));
  r = try_kernel(*n1, {make_tensor(DType::kInt64, {4}, {10, 11, 12, 13}), idx});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->at(0).shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(values(r->at(0)), (std::vector<double>{13, 10, 13}));
  auto bad = try_kernel(*n, {make_tensor(DType::kFloat32, {2, 4}, std::vector<double>(8, 0)),
                             make_tensor(DType::kInt64, {1, 3}, {0, 4, 1})});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("index 4 at position 1 is outside [0, 4)"), std::string::npos)
      << bad.status().to_string();
}

}  // namespace
}  // namespace kiln::ops
