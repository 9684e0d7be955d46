// ai.onnx.ml ops (src/ops/ml.cc): Binarizer and ArrayFeatureExtractor
// kernels against hand-computed results, and their errors.
#include <gtest/gtest.h>

#include <cmath>

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
