// Detection ops (src/ops/detection.cc): RoiAlign's runtime kernel against
// outputs of the ONNX reference implementation, its shape inference, and its
// errors on bad models and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
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

}  // namespace
}  // namespace kiln::ops
