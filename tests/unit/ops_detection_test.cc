// Detection ops (src/ops/detection.cc): RoiAlign's runtime kernel against
// outputs of the ONNX reference implementation, its shape inference, and its
// errors on bad models and bad inputs; DeformConv's kernel against a direct
// per-output-element reference (and, with zero offsets, a plain convolution),
// its shape inference and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "ops_test_harness.h"
#include "support/thread_pool.h"

namespace kiln::ops {
namespace {

using testing::expect_close;
using testing::make_tensor;
using testing::tt;

constexpr int64_t kN = 2, kC = 2, kH = 5, kW = 6;

// X[i] = ((i * 37) mod 23) / 4 - 2 over [2, 2, 5, 6]: both signs, exact in f16.
std::vector<double> image_values() {
  std::vector<double> v;
  for (int64_t i = 0; i < kN * kC * kH * kW; ++i) v.push_back(static_cast<double>((i * 37) % 23) / 4.0 - 2.0);
  return v;
}

// Roi 0 inside image 0; roi 1 inside image 1, needing a 3 x 2 adaptive grid
// (2 x 2 for the others); roi 2 partly left of and above image 1.
const std::vector<double> kRois = {0.5, 1.0, 4.0, 3.5, 1.0, 0.25, 5.75, 4.5, -2.0, -1.5, 3.0, 2.25};
const std::vector<double> kBatchIndices = {0, 1, 1};

struct ReferenceCase {
  const char* mode;
  const char* coordinates;
  int64_t sampling_ratio;
  std::vector<double> want;  // Y [3, 2, 2, 3]
};

// Computed with the onnx 1.17.0 reference implementation
// (onnx/reference/ops/op_roi_align.py, via onnx.reference.ReferenceEvaluator,
// opset 16) on the X, rois and batch_indices above with output_height 2,
// output_width 3, spatial_scale 1, and printed with %.9g.
const std::vector<ReferenceCase>& reference_cases() {
  static const std::vector<ReferenceCase> cases = {
      {"avg", "half_pixel", 0,
       {0.696614563, 1.71402991, 0.717447937, 1.94010413, 0.857421875, 0.313802093,  1.46289062,  0.0620117188,
        0.963378906, 0.4453125,  1.33919275,  -0.087890625, 0.716778815, 0.0380135998, 1.30128765, 0.144133389,
        1.05052805,  1.47858799, -0.165328413, 0.716109693, 1.21903932, 0.813078701,  1.4079318,   0.667607069,
        0,           0.265625,   0.421875,    0,            0.351236969, 0.701171875, 0,           1.015625,
        -0.505208313, 0,         0.574707031, -0.044921875}},
      {"avg", "half_pixel", 2,
       {0.696614563, 1.71402991, 0.717447937, 1.94010413, 0.857421875, 0.313802093, 1.46289062,  0.0620117188,
        0.963378906, 0.4453125,  1.33919275,  -0.087890625, 0.722290039, 0.0319824219, 1.29671228, 0.172729492,
        1.07340491,  1.41910803, -0.167928055, 0.714029968, 1.22444665, 0.76961261,  1.39420569,  0.676757812,
        0,           0.265625,   0.421875,    0,            0.351236969, 0.701171875, 0,           1.015625,
        -0.505208313, 0,         0.574707031, -0.044921875}},
      {"avg", "output_half_pixel", 0,
       {1.68619788,  1.14257812,  0.0598958321, 1.28255212, 0.285970062, 1.078776,    0.236328125, 1.04036462,
        0.0625,      1.37874353,  0.307291657,  -0.251302093, 0.124529801, 0.283058435, 1.09125435, 0.730975091,
        1.80374706,  0.600857198, 0.418294281,  1.46735752, 0.482421875, 1.1403718,   0.684968174, 1.15375435,
        0.25,        -0.0625,     0.578125,     0.310546875, 1.0234375,  -0.151041672, 0.625,      0.6875,
        -0.348958343, -0.0625,    -0.126953125, 0.705078125}},
      {"avg", "output_half_pixel", 2,
       {1.68619788,  1.14257812,  0.0598958321, 1.28255212, 0.285970062, 1.078776,    0.236328125, 1.04036462,
        0.0625,      1.37874353,  0.307291657,  -0.251302093, 0.131184891, 0.212972,   1.0123291,  0.796386719,
        1.82340491,  0.558227539, 0.437011719,  1.46402991, 0.479614258, 1.19392908,  0.601888001, 1.25805664,
        0.25,        -0.0625,     0.578125,     0.310546875, 1.0234375,  -0.151041672, 0.625,      0.6875,
        -0.348958343, -0.0625,    -0.126953125, 0.705078125}},
      {"max", "half_pixel", 0,
       {1.24414062, 2.3359375,  0.9140625,  2.66601562, 1.65039062, 1.36067712, 1.87044275, 1.04817712,
        1.44726562, 1.65429688, 2.24609375, 0.87890625, 1.8196615,  1.04980469, 2.93945312, 1.30175781,
        1.64822054, 2.85644531, 0.977539062, 1.23426652, 2.28515625, 2.25585938, 1.8267144, 2.00195312,
        0,          1,          2.0625,     0,          0.7734375,  1.35351562, 0,          2.5,
        0.1875,     0,          1.640625,   1.15299475}},
      {"max", "half_pixel", 2,
       {1.24414062, 2.3359375,   0.9140625,   2.66601562, 1.65039062, 1.36067712, 1.87044275, 1.04817712,
        1.44726562, 1.65429688,  2.24609375,  0.87890625, 1.46972656, 0.842285156, 2.35839844, 0.944824219,
        1.19628906, 1.61865234,  0.789550781, 0.814615905, 1.84570312, 1.27832031, 1.40706384, 1.20849609,
        0,          1,           2.0625,      0,          0.7734375,  1.35351562, 0,          2.5,
        0.1875,     0,           1.640625,    1.15299475}},
      {"max", "output_half_pixel", 0,
       {2.41210938, 1.9765625,  1.49414062, 1.125651,   1.10026038, 1.77734375, 0.87890625, 2.24609375,
        1.35351562, 1.76888025, 1.04817712, 1.0071615,  1.0384115,  1.67784286, 2.9375,     1.359375,
        3.42708325, 1.03678381, 1.18315971, 3.11599398, 1.08854163, 2.07356763, 2.11979175, 1.82291663,
        1,          0.916666687, 1.6875,    2.1484375,  1.969401,   0.797526062, 2.5,       2.29166675,
        0.875,      0.421875,   1.43229163, 1.48111975}},
      {"max", "output_half_pixel", 2,
       {2.41210938, 1.9765625,  1.49414062, 1.125651,   1.10026038, 1.77734375, 0.87890625, 2.24609375,
        1.35351562, 1.76888025, 1.04817712, 1.0071615,  1.18001306, 1.44580078, 2.53125,    1.47265625,
        3.31998706, 1.28857422, 1.11083984, 2.68505859, 1.02539062, 2.57714844, 2.0535481,  2.265625,
        1,          0.916666687, 1.6875,    2.1484375,  1.969401,   0.797526062, 2.5,       2.29166675,
        0.875,      0.421875,   1.43229163, 1.48111975}},
  };
  return cases;
}

// A graph of one RoiAlign node over inputs X, rois and batch_indices of the
// given types; attributes are set by the caller before infer().
struct RoiAlignGraph {
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  Node* node = nullptr;

  RoiAlignGraph(int64_t opset, TensorType x, TensorType rois, TensorType indices) {
    g->opsets[""] = opset;
    Value* xv = g->add_input("X", std::move(x));
    Value* rv = g->add_input("rois", std::move(rois));
    Value* iv = g->add_input("batch_indices", std::move(indices));
    node = g->add_node("RoiAlign", {xv, rv, iv}, {"Y"}, "", "roi_align");
  }
  void set(const std::string& k, int64_t v) { node->set_attr(k, Attribute::of_int(v)); }
  void set(const std::string& k, const char* v) { node->set_attr(k, Attribute::of_string(v)); }
  Status infer() { return testing::infer(*g); }
  const TensorType& y_type() const { return node->output(0)->type(); }

  // Builds the node's runtime kernel and runs it; the kernel's status.
  Status run(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) const {
    const OpDef* def = find_op("", "RoiAlign");
    if (def == nullptr || !def->kernel) return internal_error() << "RoiAlign has no runtime kernel";
    auto kernel = def->kernel(*node);
    if (!kernel.is_ok()) return kernel.status();
    return (*kernel)(inputs, outputs);
  }
};

RoiAlignGraph standard_graph(DType dtype, int64_t opset = 16) {
  return RoiAlignGraph(opset, tt(dtype, {kN, kC, kH, kW}), tt(dtype, {3, 4}), tt(DType::kInt64, {3}));
}

std::vector<Tensor> standard_inputs(DType dtype) {
  return {make_tensor(dtype, {kN, kC, kH, kW}, image_values()), make_tensor(dtype, {3, 4}, kRois),
          make_tensor(DType::kInt64, {3}, kBatchIndices)};
}

std::string case_name(const ReferenceCase& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " mode=" + c.mode + " " + c.coordinates +
         " sampling_ratio=" + std::to_string(c.sampling_ratio);
}

void check_against_reference(DType dtype, double tol) {
  for (const ReferenceCase& c : reference_cases()) {
    SCOPED_TRACE(case_name(c, dtype));
    RoiAlignGraph ra = standard_graph(dtype);
    ra.set("mode", c.mode);
    ra.set("coordinate_transformation_mode", c.coordinates);
    ra.set("sampling_ratio", c.sampling_ratio);
    ra.set("output_height", 2);
    ra.set("output_width", 3);
    ASSERT_TRUE(ra.infer().is_ok());
    EXPECT_EQ(ra.y_type().to_string(), std::string(dtype_name(dtype)) + "[3, 2, 2, 3]");
    std::vector<Tensor> out;
    Status s = ra.run(standard_inputs(dtype), out);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].dtype(), dtype);
    EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{3, kC, 2, 3}));
    expect_close(out[0], c.want, tol, case_name(c, dtype));
  }
}

TEST(RoiAlign, MatchesOnnxReferenceF32) { check_against_reference(DType::kFloat32, 1e-6); }
TEST(RoiAlign, MatchesOnnxReferenceF64) { check_against_reference(DType::kFloat64, 1e-6); }
// f16 inputs are exact; the outputs are rounded to f16 (11 significant bits).
TEST(RoiAlign, MatchesOnnxReferenceF16) { check_against_reference(DType::kFloat16, 1e-3); }

// Opset 10 has no coordinate_transformation_mode and behaves as
// output_half_pixel; from opset 16 the default is half_pixel.
TEST(RoiAlign, DefaultCoordinatesFollowTheOpset) {
  for (int64_t opset : {10, 16, 22}) {
    SCOPED_TRACE("opset " + std::to_string(opset));
    RoiAlignGraph ra = standard_graph(DType::kFloat32, opset);
    ra.set("output_height", 2);
    ra.set("output_width", 3);
    ASSERT_TRUE(ra.infer().is_ok());
    std::vector<Tensor> out;
    ASSERT_TRUE(ra.run(standard_inputs(DType::kFloat32), out).is_ok());
    // Cases 0 and 2: avg, sampling_ratio 0, half_pixel and output_half_pixel.
    expect_close(out.at(0), reference_cases()[opset < 16 ? 2 : 0].want, 1e-6, "default coordinates");
  }
}

// X linear in x and y: interpolation is exact, so the average of a bin's
// symmetric sampling grid is X at the bin's centre.
TEST(RoiAlign, AverageOfLinearImageIsBinCentre) {
  RoiAlignGraph ra(16, tt(DType::kFloat64, {1, 1, 8, 8}), tt(DType::kFloat64, {1, 4}), tt(DType::kInt64, {1}));
  ra.set("output_height", 2);
  ra.set("output_width", 2);
  ra.node->set_attr("spatial_scale", Attribute::of_float(0.5));
  ASSERT_TRUE(ra.infer().is_ok());
  std::vector<double> x;
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) x.push_back(10.0 * static_cast<double>(i) + static_cast<double>(j));
  // Roi (2, 2)-(10, 10) in image coordinates is (1, 1)-(5, 5) at scale 0.5,
  // (0.5, 0.5)-(4.5, 4.5) after the half-pixel shift: bins of 2 x 2 pixels.
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat64, {1, 1, 8, 8}, x),
                                make_tensor(DType::kFloat64, {1, 4}, {2, 2, 10, 10}),
                                make_tensor(DType::kInt64, {1}, {0})};
  std::vector<Tensor> out;
  ASSERT_TRUE(ra.run(inputs, out).is_ok());
  auto at = [](double row, double col) { return 10.0 * row + col; };
  expect_close(out.at(0), {at(1.5, 1.5), at(1.5, 3.5), at(3.5, 1.5), at(3.5, 3.5)}, 1e-12, "bin centres");
}

TEST(RoiAlign, ShapeInferenceKeepsSymbolicRoiCount) {
  RoiAlignGraph ra(16, tt(DType::kFloat32, {var("n"), 7, var("h"), var("w")}), tt(DType::kFloat32, {var("r"), 4}),
                   tt(DType::kInt64, {var("r")}));
  ra.set("output_height", 3);
  ra.set("output_width", 5);
  ASSERT_TRUE(ra.infer().is_ok());
  EXPECT_EQ(ra.y_type().to_string(), "f32[r, 7, 3, 5]");

  // rois of unknown rank: the roi count is batch_indices', then a fresh dim.
  RoiAlignGraph unranked(16, tt(DType::kFloat32, {1, 2, 4, 4}), TensorType{DType::kFloat32, std::nullopt},
                         TensorType{DType::kInt64, std::nullopt});
  ASSERT_TRUE(unranked.infer().is_ok());
  ASSERT_EQ(unranked.y_type().rank(), 4);
  EXPECT_FALSE((*unranked.y_type().shape)[0].as_const().has_value());
  EXPECT_EQ((*unranked.y_type().shape)[1].as_const(), 2);
}

// Bad models: each is an error naming the node, from inference.
TEST(RoiAlign, InferenceRejectsBadModels) {
  struct BadModel {
    const char* what;
    TensorType x, rois, indices;
    const char* attr = nullptr;
    int64_t value = 0;
  };
  const std::vector<BadModel> cases = {
      {"X of rank 3", tt(DType::kFloat32, {2, 5, 6}), tt(DType::kFloat32, {3, 4}), tt(DType::kInt64, {3})},
      {"integer X", tt(DType::kInt32, {2, 2, 5, 6}), tt(DType::kInt32, {3, 4}), tt(DType::kInt64, {3})},
      {"rois [3, 5]", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 5}), tt(DType::kInt64, {3})},
      {"rois of rank 1", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {12}), tt(DType::kInt64, {3})},
      {"rois of another dtype", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat64, {3, 4}), tt(DType::kInt64, {3})},
      {"3 rois, 2 batch indices", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 4}),
       tt(DType::kInt64, {2})},
      {"float batch indices", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 4}),
       tt(DType::kFloat32, {3})},
      {"output_height 0", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 4}), tt(DType::kInt64, {3}),
       "output_height", 0},
      {"output_width -2", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 4}), tt(DType::kInt64, {3}),
       "output_width", -2},
      {"sampling_ratio -1", tt(DType::kFloat32, {2, 2, 5, 6}), tt(DType::kFloat32, {3, 4}), tt(DType::kInt64, {3}),
       "sampling_ratio", -1},
  };
  for (const BadModel& c : cases) {
    SCOPED_TRACE(c.what);
    RoiAlignGraph ra(16, c.x, c.rois, c.indices);
    if (c.attr != nullptr) ra.set(c.attr, c.value);
    Status s = ra.infer();
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("RoiAlign 'roi_align'"), std::string::npos) << s.to_string();
  }
  for (const char* attr : {"mode", "coordinate_transformation_mode"}) {
    SCOPED_TRACE(attr);
    RoiAlignGraph ra = standard_graph(DType::kFloat32);
    ra.set(attr, "bilinear");
    Status s = ra.infer();
    EXPECT_EQ(s.code(), StatusCode::kInvalidModel) << s.to_string();
    EXPECT_NE(s.message().find("bilinear"), std::string::npos) << s.to_string();
  }
}

// Bad inputs at run time: a Status error from the kernel, never a crash.
TEST(RoiAlign, KernelRejectsBadInputs) {
  RoiAlignGraph ra = standard_graph(DType::kFloat32);
  ASSERT_TRUE(ra.infer().is_ok());
  Tensor x = make_tensor(DType::kFloat32, {kN, kC, kH, kW}, image_values());
  Tensor rois = make_tensor(DType::kFloat32, {3, 4}, kRois);
  struct BadInput {
    const char* what;
    std::vector<Tensor> inputs;
    const char* message;  // a part of the error
  };
  const std::vector<BadInput> cases = {
      {"batch index 2 of 2 images", {x, rois, make_tensor(DType::kInt64, {3}, {0, 2, 1})}, "batch_indices[1] = 2"},
      {"batch index -1", {x, rois, make_tensor(DType::kInt64, {3}, {0, 1, -1})}, "batch_indices[2] = -1"},
      {"rois [3, 5]", {x, make_tensor(DType::kFloat32, {3, 5}, std::vector<double>(15, 1.0)),
                       make_tensor(DType::kInt64, {3}, kBatchIndices)}, "[num_rois, 4]"},
      {"rois of rank 1", {x, make_tensor(DType::kFloat32, {12}, kRois), make_tensor(DType::kInt64, {3}, kBatchIndices)},
       "[num_rois, 4]"},
      {"3 rois, 2 batch indices", {x, rois, make_tensor(DType::kInt64, {2}, {0, 1})},
       "batch_indices must be [num_rois]"},
      {"X of rank 3", {make_tensor(DType::kFloat32, {2, 5, 6}, std::vector<double>(60, 1.0)), rois,
                       make_tensor(DType::kInt64, {3}, kBatchIndices)}, "4-D"},
      {"integer X", {make_tensor(DType::kInt32, {kN, kC, kH, kW}, image_values()), rois,
                     make_tensor(DType::kInt64, {3}, kBatchIndices)}, "X must be"},
      {"a NaN coordinate", {x, make_tensor(DType::kFloat32, {3, 4}, {0, 0, 1, 1, 0, NAN, 1, 1, 0, 0, 1, 1}),
                            make_tensor(DType::kInt64, {3}, kBatchIndices)}, "roi 1 has a non-finite coordinate"},
      {"an roi far larger than the image", {x, make_tensor(DType::kFloat32, {1, 4}, {0, 0, 1e9, 1e9}),
                                            make_tensor(DType::kInt64, {1}, {0})}, "sampling grid"},
      {"empty image", {make_tensor(DType::kFloat32, {kN, kC, 0, kW}, {}), rois,
                       make_tensor(DType::kInt64, {3}, kBatchIndices)}, "no pixels"},
      {"missing batch_indices", {x, rois}, "required"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<Tensor> out;
    Status s = ra.run(c.inputs, out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.to_string();
  }
}

// Rois are split among the threads of the model's pool; every roi is
// computed the same way, so the output equals the serial one bit for bit.
TEST(RoiAlign, ThreadPoolGivesSerialResult) {
  constexpr int64_t kRoiCount = 37;
  RoiAlignGraph ra(16, tt(DType::kFloat32, {kN, kC, kH, kW}), tt(DType::kFloat32, {kRoiCount, 4}),
                   tt(DType::kInt64, {kRoiCount}));
  ra.set("mode", "max");
  ra.set("output_height", 3);
  ra.set("output_width", 2);
  ASSERT_TRUE(ra.infer().is_ok());
  std::vector<double> corners = testing::ramp(kRoiCount * 2, -2, 7, 3), sizes = testing::ramp(kRoiCount * 2, 0, 5, 4);
  std::vector<double> rois, indices;
  for (int64_t r = 0; r < kRoiCount; ++r) {
    double x1 = corners[2 * r], y1 = corners[2 * r + 1];
    rois.insert(rois.end(), {x1, y1, x1 + sizes[2 * r], y1 + sizes[2 * r + 1]});
    indices.push_back(static_cast<double>(r % kN));
  }
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat32, {kN, kC, kH, kW}, image_values()),
                                make_tensor(DType::kFloat32, {kRoiCount, 4}, rois),
                                make_tensor(DType::kInt64, {kRoiCount}, indices)};
  std::vector<Tensor> serial, parallel;
  ASSERT_TRUE(ra.run(inputs, serial).is_ok());
  set_current_thread_pool(shared_thread_pool(4));
  Status s = ra.run(inputs, parallel);
  set_current_thread_pool(nullptr);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(same_contents(serial.at(0), parallel.at(0)));
}

// No rois: an empty output, no reads of X.
TEST(RoiAlign, NoRoisGiveEmptyOutput) {
  RoiAlignGraph ra(16, tt(DType::kFloat32, {kN, kC, kH, kW}), tt(DType::kFloat32, {0, 4}), tt(DType::kInt64, {0}));
  ASSERT_TRUE(ra.infer().is_ok());
  std::vector<Tensor> out;
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat32, {kN, kC, kH, kW}, image_values()),
                                make_tensor(DType::kFloat32, {0, 4}, {}), make_tensor(DType::kInt64, {0}, {})};
  ASSERT_TRUE(ra.run(inputs, out).is_ok());
  EXPECT_EQ(out.at(0).shape(), (std::vector<int64_t>{0, kC, 1, 1}));
}

// ---- DeformConv ----------------------------------------------------------------------------------

// The attributes and shapes of one DeformConv case (any spatial rank).
struct DeformCase {
  const char* what;
  std::vector<int64_t> x_shape;  // [N, C, D1, ...]
  std::vector<int64_t> w_shape;  // [oC, C / group, K1, ...]
  int64_t group = 1, offset_group = 1;
  std::vector<int64_t> strides, dilations, pads;  // empty: defaults
  bool bias = false, mask = false;
  double offset_range = 0;  // offsets drawn from [-range, range)
};

size_t spatial_of(const DeformCase& c) { return c.x_shape.size() - 2; }
int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}
std::vector<int64_t> strides_of(const DeformCase& c) {
  return c.strides.empty() ? std::vector<int64_t>(spatial_of(c), 1) : c.strides;
}
std::vector<int64_t> dilations_of(const DeformCase& c) {
  return c.dilations.empty() ? std::vector<int64_t>(spatial_of(c), 1) : c.dilations;
}
std::vector<int64_t> pads_of(const DeformCase& c) {
  return c.pads.empty() ? std::vector<int64_t>(2 * spatial_of(c), 0) : c.pads;
}
std::vector<int64_t> out_dims(const DeformCase& c) {
  size_t s = spatial_of(c);
  std::vector<int64_t> out;
  for (size_t d = 0; d < s; ++d) {
    int64_t span = dilations_of(c)[d] * (c.w_shape[d + 2] - 1) + 1;
    out.push_back((c.x_shape[d + 2] + pads_of(c)[d] + pads_of(c)[d + s] - span) / strides_of(c)[d] + 1);
  }
  return out;
}
int64_t kernel_size(const DeformCase& c) { return product(c.w_shape, 2); }
std::vector<int64_t> offset_shape(const DeformCase& c) {
  std::vector<int64_t> s = {c.x_shape[0], c.offset_group * static_cast<int64_t>(spatial_of(c)) * kernel_size(c)};
  for (int64_t o : out_dims(c)) s.push_back(o);
  return s;
}
std::vector<int64_t> mask_shape(const DeformCase& c) {
  std::vector<int64_t> s = {c.x_shape[0], c.offset_group * kernel_size(c)};
  for (int64_t o : out_dims(c)) s.push_back(o);
  return s;
}
std::vector<int64_t> y_shape(const DeformCase& c) {
  std::vector<int64_t> s = {c.x_shape[0], c.w_shape[0]};
  for (int64_t o : out_dims(c)) s.push_back(o);
  return s;
}

// Row-major multi-index of flat index i over dims.
std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& dims) {
  std::vector<int64_t> idx(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = i % dims[d];
    i /= dims[d];
  }
  return idx;
}

// The input data of a case, as doubles (rounded through `dtype`, so that
// the reference sees exactly what the kernel gets).
struct DeformData {
  std::vector<double> x, w, offset, bias, mask;
};

std::vector<double> rounded(DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  return testing::to_vector(make_tensor(dtype, shape, v));
}

DeformData deform_data(const DeformCase& c, DType dtype, bool zero_offsets = false) {
  DeformData d;
  d.x = rounded(dtype, c.x_shape, testing::ramp(product(c.x_shape), -2, 2, 11));
  d.w = rounded(dtype, c.w_shape, testing::ramp(product(c.w_shape), -1, 1, 12));
  int64_t offsets = product(offset_shape(c));
  d.offset = zero_offsets ? std::vector<double>(static_cast<size_t>(offsets), 0.0)
                          : rounded(dtype, offset_shape(c),
                                    testing::ramp(offsets, -c.offset_range, c.offset_range, 13));
  if (c.bias) d.bias = rounded(dtype, {c.w_shape[0]}, testing::ramp(c.w_shape[0], -3, 3, 14));
  if (c.mask) d.mask = rounded(dtype, mask_shape(c), testing::ramp(product(mask_shape(c)), -0.5, 1.5, 15));
  return d;
}

// X[n, c] of spatial dims `dims` sampled at `pos` the way the ONNX reference
// (GridSample, linear, zeros padding, align_corners) does: linear
// interpolation along the last dim first, between the pixels at floor(pos)
// and floor(pos) + 1, a pixel outside the image reading as 0.
double reference_sample(const double* image, const std::vector<int64_t>& dims, const std::vector<double>& pos,
                        size_t d = 0) {
  if (d == dims.size()) return *image;
  double low = std::floor(pos[d]), frac = pos[d] - low;
  int64_t i0 = static_cast<int64_t>(low), inner = product(dims, d + 1);
  auto at = [&](int64_t i) {
    return i < 0 || i >= dims[d] ? 0.0 : reference_sample(image + i * inner, dims, pos, d + 1);
  };
  return (1 - frac) * at(i0) + frac * at(i0 + 1);
}

// DeformConv computed directly, one output element at a time, in double.
std::vector<double> deform_reference(const DeformCase& c, const DeformData& data) {
  size_t s = spatial_of(c);
  std::vector<int64_t> in(c.x_shape.begin() + 2, c.x_shape.end()), kdims(c.w_shape.begin() + 2, c.w_shape.end());
  std::vector<int64_t> out = out_dims(c), stride = strides_of(c), dilation = dilations_of(c), pad = pads_of(c);
  int64_t batch = c.x_shape[0], channels = c.x_shape[1], out_channels = c.w_shape[0];
  int64_t cg = channels / c.group, ocg = out_channels / c.group, cog = channels / c.offset_group;
  int64_t plane = product(in), k_size = product(kdims), positions = product(out);
  std::vector<double> y;
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t oc = 0; oc < out_channels; ++oc) {
      for (int64_t p = 0; p < positions; ++p) {
        std::vector<int64_t> o = unravel(p, out);
        double acc = 0;
        for (int64_t ci = 0; ci < cg; ++ci) {
          int64_t ch = oc / ocg * cg + ci, og = ch / cog;
          for (int64_t k = 0; k < k_size; ++k) {
            std::vector<int64_t> kk = unravel(k, kdims);
            std::vector<double> pos(s);
            for (size_t d = 0; d < s; ++d) {
              int64_t off_channel = (og * k_size + k) * static_cast<int64_t>(s) + static_cast<int64_t>(d);
              double off = data.offset[static_cast<size_t>(
                  (n * c.offset_group * k_size * static_cast<int64_t>(s) + off_channel) * positions + p)];
              pos[d] = static_cast<double>(o[d] * stride[d] - pad[d] + kk[d] * dilation[d]) + off;
            }
            double v = reference_sample(&data.x[static_cast<size_t>((n * channels + ch) * plane)], in, pos);
            if (c.mask)
              v *= data.mask[static_cast<size_t>(((n * c.offset_group + og) * k_size + k) * positions + p)];
            acc += v * data.w[static_cast<size_t>((oc * cg + ci) * k_size + k)];
          }
        }
        y.push_back(acc + (c.bias ? data.bias[static_cast<size_t>(oc)] : 0.0));
      }
    }
  }
  return y;
}

// An ordinary (grouped, strided, padded, dilated) convolution, directly.
std::vector<double> conv_reference(const DeformCase& c, const DeformData& data) {
  size_t s = spatial_of(c);
  std::vector<int64_t> in(c.x_shape.begin() + 2, c.x_shape.end()), kdims(c.w_shape.begin() + 2, c.w_shape.end());
  std::vector<int64_t> out = out_dims(c), stride = strides_of(c), dilation = dilations_of(c), pad = pads_of(c);
  int64_t batch = c.x_shape[0], channels = c.x_shape[1], out_channels = c.w_shape[0];
  int64_t cg = channels / c.group, ocg = out_channels / c.group;
  std::vector<double> y;
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t oc = 0; oc < out_channels; ++oc) {
      for (int64_t p = 0; p < product(out); ++p) {
        std::vector<int64_t> o = unravel(p, out);
        double acc = c.bias ? data.bias[static_cast<size_t>(oc)] : 0.0;
        for (int64_t ci = 0; ci < cg; ++ci) {
          int64_t ch = oc / ocg * cg + ci;
          for (int64_t k = 0; k < product(kdims); ++k) {
            std::vector<int64_t> kk = unravel(k, kdims);
            int64_t flat = n * channels + ch;
            bool inside = true;
            for (size_t d = 0; d < s; ++d) {
              int64_t i = o[d] * stride[d] - pad[d] + kk[d] * dilation[d];
              inside = inside && i >= 0 && i < in[d];
              flat = flat * in[d] + i;
            }
            if (inside) acc += data.x[static_cast<size_t>(flat)] * data.w[static_cast<size_t>((oc * cg + ci) * product(kdims) + k)];
          }
        }
        y.push_back(acc);
      }
    }
  }
  return y;
}

// A graph of one DeformConv node (opset 19); B and mask are left out when
// their types are nullopt.
struct DeformConvGraph {
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  Node* node = nullptr;

  DeformConvGraph(TensorType x, TensorType w, TensorType offset, std::optional<TensorType> bias = std::nullopt,
                  std::optional<TensorType> mask = std::nullopt) {
    g->opsets[""] = 19;
    std::vector<Value*> inputs = {g->add_input("X", std::move(x)), g->add_input("W", std::move(w)),
                                  g->add_input("offset", std::move(offset))};
    if (bias || mask) inputs.push_back(bias ? g->add_input("B", std::move(*bias)) : nullptr);
    if (mask) inputs.push_back(g->add_input("mask", std::move(*mask)));
    node = g->add_node("DeformConv", inputs, {"Y"}, "", "deform");
  }
  explicit DeformConvGraph(const DeformCase& c, DType dtype)
      : DeformConvGraph(tt(dtype, to_shape(c.x_shape)), tt(dtype, to_shape(c.w_shape)),
                        tt(dtype, to_shape(offset_shape(c))),
                        c.bias ? std::optional<TensorType>(tt(dtype, {c.w_shape[0]})) : std::nullopt,
                        c.mask ? std::optional<TensorType>(tt(dtype, to_shape(mask_shape(c)))) : std::nullopt) {
    if (c.group != 1) set("group", c.group);
    if (c.offset_group != 1) set("offset_group", c.offset_group);
    if (!c.strides.empty()) set("strides", c.strides);
    if (!c.dilations.empty()) set("dilations", c.dilations);
    if (!c.pads.empty()) set("pads", c.pads);
  }
  static Shape to_shape(const std::vector<int64_t>& v) {
    Shape s;
    for (int64_t d : v) s.push_back(Expr(d));
    return s;
  }
  void set(const std::string& k, int64_t v) { node->set_attr(k, Attribute::of_int(v)); }
  void set(const std::string& k, std::vector<int64_t> v) { node->set_attr(k, Attribute::of_ints(std::move(v))); }
  Status infer() { return testing::infer(*g); }
  const TensorType& y_type() const { return node->output(0)->type(); }
  Result<std::vector<Tensor>> run(const std::vector<Tensor>& inputs) const { return testing::try_kernel(*node, inputs); }
};

std::vector<Tensor> deform_inputs(const DeformCase& c, DType dtype, const DeformData& data) {
  std::vector<Tensor> in = {make_tensor(dtype, c.x_shape, data.x), make_tensor(dtype, c.w_shape, data.w),
                            make_tensor(dtype, offset_shape(c), data.offset)};
  if (c.bias || c.mask) in.push_back(c.bias ? make_tensor(dtype, {c.w_shape[0]}, data.bias) : Tensor());
  if (c.mask) in.push_back(make_tensor(dtype, mask_shape(c), data.mask));
  return in;
}

// Infers and runs case c on `data`; Y, or an undefined tensor after a test failure.
Tensor run_deform(const DeformCase& c, DType dtype, const DeformData& data) {
  DeformConvGraph dc(c, dtype);
  Status s = dc.infer();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  if (!s.is_ok()) return Tensor();
  EXPECT_EQ(dc.y_type().to_string(), testing::tt(dtype, DeformConvGraph::to_shape(y_shape(c))).to_string());
  auto out = dc.run(deform_inputs(c, dtype, data));
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  if (!out.is_ok() || out->size() != 1) return Tensor();
  EXPECT_EQ((*out)[0].dtype(), dtype);
  EXPECT_EQ((*out)[0].shape(), y_shape(c));
  return (*out)[0];
}

const std::vector<DeformCase>& deform_cases() {
  static const std::vector<DeformCase> cases = {
      {"plain 3x3", {1, 2, 5, 6}, {3, 2, 3, 3}, 1, 1, {}, {}, {}, false, false, 1.5},
      {"offsets far outside", {2, 1, 4, 5}, {2, 1, 2, 3}, 1, 1, {}, {}, {1, 0, 1, 2}, false, false, 4},
      {"mask and bias", {2, 3, 5, 5}, {4, 3, 3, 2}, 1, 1, {}, {}, {1, 1, 1, 1}, true, true, 1.2},
      {"group 2", {1, 4, 6, 5}, {6, 2, 3, 3}, 2, 1, {}, {}, {1, 1, 1, 1}, true, false, 2},
      {"offset_group 2", {1, 4, 5, 6}, {5, 4, 2, 2}, 1, 2, {}, {}, {}, false, true, 1.7},
      {"groups across offset groups", {2, 6, 5, 4}, {9, 2, 2, 3}, 3, 2, {}, {}, {0, 1, 1, 0}, true, true, 1.3},
      {"strides, pads, dilations", {1, 2, 9, 8}, {4, 2, 3, 2}, 1, 1, {2, 3}, {2, 1}, {2, 1, 0, 3}, true, true, 2.5},
      {"all of them", {2, 4, 7, 9}, {4, 2, 2, 3}, 2, 2, {1, 2}, {3, 2}, {1, 2, 2, 0}, true, true, 3},
      {"1-D", {2, 4, 11}, {6, 2, 3}, 2, 2, {2}, {2}, {1, 3}, true, true, 2},
      {"3-D", {1, 4, 4, 5, 4}, {4, 2, 2, 3, 2}, 2, 4, {1, 2, 1}, {2, 1, 1}, {1, 1, 0, 0, 2, 1}, true, true, 1.5},
  };
  return cases;
}

void check_deform_cases(DType dtype, double tol) {
  for (const DeformCase& c : deform_cases()) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + c.what);
    DeformData data = deform_data(c, dtype);
    Tensor y = run_deform(c, dtype, data);
    expect_close(y, deform_reference(c, data), tol, c.what);
  }
}

TEST(DeformConv, MatchesDirectReferenceF64) { check_deform_cases(DType::kFloat64, 1e-12); }
TEST(DeformConv, MatchesDirectReferenceF32) { check_deform_cases(DType::kFloat32, 2e-5); }
// Exact f16 / bf16 inputs, computed in f32, the outputs rounded to 11 / 8 significant bits.
TEST(DeformConv, MatchesDirectReferenceF16) { check_deform_cases(DType::kFloat16, 2e-3); }
TEST(DeformConv, MatchesDirectReferenceBF16) { check_deform_cases(DType::kBFloat16, 1e-2); }

// With zero offsets (and no mask) every tap samples a whole pixel: an
// ordinary convolution, here computed independently.
TEST(DeformConv, ZeroOffsetsGiveConvolution) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (DeformCase c : deform_cases()) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + c.what);
      c.mask = false;
      DeformData data = deform_data(c, dtype, /*zero_offsets=*/true);
      Tensor y = run_deform(c, dtype, data);
      expect_close(y, conv_reference(c, data), dtype == DType::kFloat64 ? 1e-12 : 2e-5, c.what);
    }
  }
}

// The sampling rule at and beyond the image's edges, one sample per output
// element: a 1x1 kernel of weight 1 over a 3 x 4 image, each output (i, j)
// sampling at (i, j) + offset.
TEST(DeformConv, SamplesOutsideTheImageReadZero) {
  DeformCase c{"edges", {1, 1, 3, 4}, {1, 1, 1, 1}};
  std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // X[i, j] = 4 i + j + 1
  struct Sample {
    double h, w;  // where output element (i, j) = (k / 4, k % 4) samples
    double want;
  };
  const std::vector<Sample> samples = {
      {-1, 0, 0},                           // a whole pixel above: 0
      {-0.5, 0, 0.5},                       // half-way to the row above (zeros): half of X[0, 0]
      {0, -0.25, 0.75},                     // a quarter pixel left of X[0, 0]
      {0.5, 0.5, (1 + 2 + 5 + 6) / 4.0},    // the middle of four pixels
      {1.25, 1, 0.75 * 6 + 0.25 * 10},      // between rows
      {2, 3, 12},                           // the last pixel exactly
      {2.5, 3, 6},                          // half below the last pixel
      {2, 3.75, 0.25 * 12},                 // three quarters right of the last pixel
      {3, 0, 0},                            // one full pixel below the last row
      {-2.5, 1.5, 0},                       // far above
      {1, -1.0001, 0},                      // just over one pixel left
      {NAN, 1, 0},                          // a NaN position samples nothing
  };
  std::vector<double> offset(24);
  std::vector<double> want;
  for (size_t k = 0; k < samples.size(); ++k) {
    double i = static_cast<double>(k / 4), j = static_cast<double>(k % 4);
    offset[k] = samples[k].h - i;
    offset[12 + k] = samples[k].w - j;
    want.push_back(samples[k].want);
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    DeformConvGraph dc(c, dtype);
    ASSERT_TRUE(dc.infer().is_ok());
    auto out = dc.run({make_tensor(dtype, {1, 1, 3, 4}, x), make_tensor(dtype, {1, 1, 1, 1}, {1}),
                       make_tensor(dtype, {1, 2, 3, 4}, offset)});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    expect_close(out->at(0), want, 1e-6, "edge samples");
  }
}

// A mask of ones is the same as no mask, bit for bit; a zero mask leaves B.
TEST(DeformConv, MaskOfOnesIsNoMask) {
  DeformCase c = deform_cases()[7];
  DeformData data = deform_data(c, DType::kFloat32);
  DeformCase no_mask = c;
  no_mask.mask = false;
  Tensor plain = run_deform(no_mask, DType::kFloat32, data);
  data.mask.assign(data.mask.size(), 1.0);
  Tensor ones = run_deform(c, DType::kFloat32, data);
  EXPECT_TRUE(same_contents(plain, ones));
  data.mask.assign(data.mask.size(), 0.0);
  Tensor zeros = run_deform(c, DType::kFloat32, data);
  std::vector<double> want;
  for (int64_t n = 0; n < c.x_shape[0]; ++n)
    for (int64_t oc = 0; oc < c.w_shape[0]; ++oc)
      for (int64_t p = 0; p < product(out_dims(c)); ++p) want.push_back(data.bias[static_cast<size_t>(oc)]);
  expect_close(zeros, want, 0, "zero mask");
}

// Work items (image, group, tile of output positions) are split among the
// threads of the model's pool; every output element is summed in the same
// order, so the output equals the serial one bit for bit.
TEST(DeformConv, ThreadPoolGivesSerialResult) {
  DeformCase c{"big", {2, 8, 37, 41}, {6, 4, 3, 3}, 2, 4, {}, {}, {1, 1, 1, 1}, true, true, 2.5};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dtype));
    DeformConvGraph dc(c, dtype);
    ASSERT_TRUE(dc.infer().is_ok());
    DeformData data = deform_data(c, dtype);
    std::vector<Tensor> inputs = deform_inputs(c, dtype, data);
    auto serial = dc.run(inputs);
    ASSERT_TRUE(serial.is_ok()) << serial.status().to_string();
    set_current_thread_pool(shared_thread_pool(4));
    auto parallel = dc.run(inputs);
    set_current_thread_pool(nullptr);
    ASSERT_TRUE(parallel.is_ok()) << parallel.status().to_string();
    EXPECT_TRUE(same_contents(serial->at(0), parallel->at(0)));
    expect_close(serial->at(0), deform_reference(c, data), dtype == DType::kFloat64 ? 1e-12 : 2e-5, "big");
  }
}

// Empty batches and channel-less inputs: no samples, Y is B (or empty).
TEST(DeformConv, EmptyInputs) {
  DeformCase none{"no images", {0, 2, 4, 4}, {3, 2, 3, 3}};
  DeformData data = deform_data(none, DType::kFloat32);
  Tensor y = run_deform(none, DType::kFloat32, data);
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{0, 3, 2, 2}));
  DeformCase no_channels{"no channels", {1, 0, 4, 4}, {3, 0, 3, 3}, 1, 1, {}, {}, {}, true};
  data = deform_data(no_channels, DType::kFloat32);
  y = run_deform(no_channels, DType::kFloat32, data);
  std::vector<double> want;
  for (double b : data.bias) want.insert(want.end(), 4, b);
  expect_close(y, want, 0, "B only");
}

TEST(DeformConv, ShapeInference) {
  // Static shapes and kernel_shape agreeing with W.
  DeformConvGraph dc(tt(DType::kFloat32, {2, 4, 10, 12}), tt(DType::kFloat32, {8, 2, 3, 3}),
                     tt(DType::kFloat32, {2, 36, 5, 6}), tt(DType::kFloat32, {8}),
                     tt(DType::kFloat32, {2, 18, 5, 6}));
  dc.set("group", 2);
  dc.set("offset_group", 2);
  dc.set("kernel_shape", {3, 3});
  dc.set("strides", {2, 2});
  dc.set("pads", {1, 1, 0, 1});
  Status s = dc.infer();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(dc.y_type().to_string(), "f32[2, 8, 5, 6]");

  // Symbolic image: the output dims follow X; the batch follows X too.
  DeformConvGraph sym(tt(DType::kFloat64, {var("n"), 3, var("h"), var("w")}), tt(DType::kFloat64, {5, 3, 3, 3}),
                      tt(DType::kFloat64, {var("n"), 18, var("a"), var("b")}));
  s = sym.infer();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(sym.y_type().rank(), 4);
  EXPECT_EQ(print_expr((*sym.y_type().shape)[0]), "n");
  EXPECT_EQ((*sym.y_type().shape)[1].as_const(), 5);
  EXPECT_TRUE(prove_equal((*sym.y_type().shape)[2], var("h") - Expr(2)))
      << print_expr((*sym.y_type().shape)[2]);

  // Symbolic X, static offset: the output dims are the offset's.
  DeformConvGraph from_offset(tt(DType::kFloat32, {1, 3, var("h"), var("w")}), tt(DType::kFloat32, {5, 3, 3, 3}),
                              tt(DType::kFloat32, {1, 18, 7, 9}));
  ASSERT_TRUE(from_offset.infer().is_ok());
  EXPECT_EQ(from_offset.y_type().to_string(), "f32[1, 5, 7, 9]");

  // Nothing ranked: Y of unknown rank.
  DeformConvGraph unranked(TensorType{DType::kFloat32, std::nullopt}, TensorType{DType::kFloat32, std::nullopt},
                           TensorType{DType::kFloat32, std::nullopt});
  ASSERT_TRUE(unranked.infer().is_ok());
  EXPECT_EQ(unranked.y_type().rank(), -1);
}

// Bad models: each an error naming the node, from inference.
TEST(DeformConv, InferenceRejectsBadModels) {
  const TensorType x = tt(DType::kFloat32, {2, 4, 6, 6});
  const TensorType w = tt(DType::kFloat32, {6, 4, 3, 3});
  const TensorType off = tt(DType::kFloat32, {2, 18, 4, 4});
  struct BadModel {
    const char* what;
    TensorType x, w, offset;
    std::optional<TensorType> bias, mask;
    std::function<void(DeformConvGraph&)> attrs;
    const char* message;
  };
  auto attr = [](const char* k, int64_t v) { return [=](DeformConvGraph& g) { g.set(k, v); }; };
  auto attrs = [](const char* k, std::vector<int64_t> v) { return [=](DeformConvGraph& g) { g.set(k, v); }; };
  const std::vector<BadModel> cases = {
      {"X of rank 2", tt(DType::kFloat32, {2, 4}), tt(DType::kFloat32, {6, 4}), tt(DType::kFloat32, {2, 18}), {}, {},
       nullptr, "at least one spatial dim"},
      {"W of rank 3", x, tt(DType::kFloat32, {6, 4, 3}), off, {}, {}, nullptr, "one rank"},
      {"offset of rank 3", x, w, tt(DType::kFloat32, {2, 18, 16}), {}, {}, nullptr, "one rank"},
      {"4 spatial dims", tt(DType::kFloat32, {1, 1, 3, 3, 3, 3}), tt(DType::kFloat32, {1, 1, 1, 1, 1, 1}),
       tt(DType::kFloat32, {1, 4, 3, 3, 3, 3}), {}, {}, nullptr, "spatial dims"},
      {"integer X", tt(DType::kInt32, {2, 4, 6, 6}), tt(DType::kInt32, {6, 4, 3, 3}),
       tt(DType::kInt32, {2, 18, 4, 4}), {}, {}, nullptr, "float"},
      {"offset of another dtype", x, w, tt(DType::kFloat64, {2, 18, 4, 4}), {}, {}, nullptr, "X's dtype"},
      {"C not divisible by group", x, tt(DType::kFloat32, {6, 1, 3, 3}), off, {}, {}, attr("group", 3),
       "not divisible by group"},
      {"W channels times group != C", x, tt(DType::kFloat32, {6, 1, 3, 3}), off, {}, {}, attr("group", 2),
       "input channels"},
      {"oC not divisible by group", x, tt(DType::kFloat32, {5, 2, 3, 3}), off, {}, {}, attr("group", 2),
       "output channels"},
      {"C not divisible by offset_group", x, w, tt(DType::kFloat32, {2, 54, 4, 4}), {}, {}, attr("offset_group", 3),
       "offset_group 3"},
      {"group 0", x, w, off, {}, {}, attr("group", 0), "group must be >= 1"},
      {"offset_group -1", x, w, off, {}, {}, attr("offset_group", -1), "offset_group must be >= 1"},
      {"stride 0", x, w, off, {}, {}, attrs("strides", {1, 0}), "strides"},
      {"dilation -1", x, w, off, {}, {}, attrs("dilations", {-1, 1}), "dilations"},
      {"negative pad", x, w, off, {}, {}, attrs("pads", {0, 0, -1, 0}), "pads"},
      {"three strides", x, w, off, {}, {}, attrs("strides", {1, 1, 1}), "strides has 3 values"},
      {"kernel_shape against W", x, w, off, {}, {}, attrs("kernel_shape", {3, 2}), "kernel_shape"},
      {"empty output", tt(DType::kFloat32, {2, 4, 2, 6}), w, tt(DType::kFloat32, {2, 18, 1, 4}), {}, {}, nullptr,
       "empty"},
      {"offset channels", x, w, tt(DType::kFloat32, {2, 9, 4, 4}), {}, {}, nullptr, "offset must be"},
      {"offset batch", x, w, tt(DType::kFloat32, {3, 18, 4, 4}), {}, {}, nullptr, "offset must be"},
      {"offset height", x, w, tt(DType::kFloat32, {2, 18, 5, 4}), {}, {}, nullptr, "offset must be"},
      {"mask channels", x, w, off, {}, tt(DType::kFloat32, {2, 18, 4, 4}), nullptr, "mask must be"},
      {"mask width", x, w, off, {}, tt(DType::kFloat32, {2, 9, 4, 3}), nullptr, "mask must be"},
      {"B of 5", x, w, off, tt(DType::kFloat32, {5}), {}, nullptr, "B must be"},
      {"B of rank 2", x, w, off, tt(DType::kFloat32, {6, 1}), {}, nullptr, "B must be"},
  };
  for (const BadModel& c : cases) {
    SCOPED_TRACE(c.what);
    DeformConvGraph dc(c.x, c.w, c.offset, c.bias, c.mask);
    if (c.attrs) c.attrs(dc);
    Status s = dc.infer();
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("DeformConv 'deform'"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s.to_string();
  }
}

// Bad inputs at run time (shapes unknown to inference): a Status error from
// the kernel, never a crash.
TEST(DeformConv, KernelRejectsBadInputs) {
  auto ones = [](std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
    return make_tensor(dtype, shape, std::vector<double>(static_cast<size_t>(product(shape)), 1.0));
  };
  Tensor x = ones({2, 4, 6, 6}), w = ones({6, 4, 3, 3}), off = ones({2, 18, 4, 4});
  struct BadInput {
    const char* what;
    std::vector<Tensor> inputs;
    std::vector<std::pair<const char*, std::vector<int64_t>>> attrs;
    const char* message;
  };
  const std::vector<BadInput> cases = {
      {"missing offset", {x, w}, {}, "required"},
      {"X of rank 2", {ones({2, 4}), ones({6, 4}), ones({2, 18})}, {}, "at least one spatial dim"},
      {"4 spatial dims", {ones({1, 1, 2, 2, 2, 2}), ones({1, 1, 1, 1, 1, 1}), ones({1, 4, 2, 2, 2, 2})}, {},
       "spatial dims"},
      {"W of rank 3", {x, ones({6, 4, 3}), off}, {}, "W"},
      {"integer X", {ones({2, 4, 6, 6}, DType::kInt32), w, off}, {}, "X must be"},
      {"W of another dtype", {x, ones({6, 4, 3, 3}, DType::kFloat64), off}, {}, "X's dtype"},
      {"W channels", {x, ones({6, 3, 3, 3}), off}, {}, "C must be group * W[1]"},
      {"oC not divisible by group", {x, ones({5, 2, 3, 3}), off}, {{"group", {2}}}, "not divisible by group"},
      {"C not divisible by offset_group", {x, w, ones({2, 54, 4, 4})}, {{"offset_group", {3}}},
       "not divisible by offset_group"},
      {"kernel_shape against W", {x, w, off}, {{"kernel_shape", {3, 2}}}, "kernel_shape"},
      {"one stride for 2 dims", {x, w, off}, {{"strides", {2}}}, "strides has 1 values"},
      {"empty output", {ones({2, 4, 2, 6}), w, ones({2, 18, 1, 4})}, {}, "empty"},
      {"huge dilation", {x, w, off}, {{"dilations", {int64_t{1} << 62, 1}}}, "empty"},
      {"offset channels", {x, w, ones({2, 9, 4, 4})}, {}, "offset must be [2,18,4,4]"},
      {"offset dims", {x, w, ones({2, 18, 4, 5})}, {}, "offset must be"},
      {"offset batch", {x, w, ones({1, 18, 4, 4})}, {}, "offset must be"},
      {"mask dims", {x, w, off, Tensor(), ones({2, 9, 3, 4})}, {}, "mask must be [2,9,4,4]"},
      {"B of 4", {x, w, off, ones({4})}, {}, "B must be [oC] = [6]"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.what);
    // Inputs of unknown shape: inference checks nothing, the kernel must.
    DeformConvGraph dc(TensorType{DType::kFloat32, std::nullopt}, TensorType{DType::kFloat32, std::nullopt},
                       TensorType{DType::kFloat32, std::nullopt});
    for (const auto& [k, v] : c.attrs) {
      if (std::string(k) == "group" || std::string(k) == "offset_group") dc.set(k, v[0]);
      else dc.set(k, v);
    }
    auto out = dc.run(c.inputs);
    ASSERT_FALSE(out.is_ok());
    EXPECT_TRUE(out.status().code() == StatusCode::kInvalidArgument ||
                out.status().code() == StatusCode::kUnsupported)
        << out.status().to_string();
    EXPECT_NE(out.status().message().find(c.message), std::string::npos) << out.status().to_string();
  }
}

}  // namespace
}  // namespace kiln::ops
