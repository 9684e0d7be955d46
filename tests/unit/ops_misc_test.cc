// Misc ops (src/ops/misc.cc), the inverse trigonometric / hyperbolic
// elementwise ops and Cast to narrow float types: compiled lowerings run
// through the tir interpreter, runtime kernels called directly, both against
// C++ references.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::expect_close;
using testing::make_tensor;
using testing::ramp;
using testing::run_node;
using testing::tt;

std::unique_ptr<Graph> new_graph() {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = 21;
  return g;
}

// Runs the runtime kernel of node n.
std::vector<Tensor> run_kernel(const Node& n, const std::vector<Tensor>& inputs) {
  const OpDef* def = find_op(n.domain(), n.op_type());
  EXPECT_TRUE(def != nullptr && def->kernel);
  auto k = def->kernel(n);
  EXPECT_TRUE(k.is_ok());
  std::vector<Tensor> out;
  Status s = (*k)(inputs, out);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

TEST(MiscOps, DepthToSpaceBothModesAndSpaceToDepthInverse) {
  const int64_t N = 1, C = 8, H = 2, W = 3, b = 2, Co = C / (b * b);
  std::vector<double> x = ramp(N * C * H * W, -1, 1);
  for (double& v : x) v = static_cast<float>(v);
  for (const char* mode : {"DCR", "CRD"}) {
    auto g = new_graph();
    Value* in = g->add_input("x", tt(DType::kFloat32, {N, C, H, W}));
    Node* n = g->add_node("DepthToSpace", {in}, {"y"});
    n->set_attr("blocksize", Attribute::of_int(b));
    n->set_attr("mode", Attribute::of_string(mode));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    EXPECT_EQ(n->output(0)->type().to_string(), "f32[1, 2, 4, 6]");
    std::vector<double> want;
    for (int64_t c = 0; c < Co; ++c)
      for (int64_t h = 0; h < H * b; ++h)
        for (int64_t w = 0; w < W * b; ++w) {
          int64_t ci = std::string(mode) == "DCR" ? ((h % b) * b + (w % b)) * Co + c : c * b * b + (h % b) * b + w % b;
          want.push_back(x[(ci * H + h / b) * W + w / b]);
        }
    expect_close(run_node(*g, *n, {make_tensor(DType::kFloat32, {N, C, H, W}, x)}).at(0), want, 0, mode);
  }
  // SpaceToDepth(DepthToSpace_DCR(x)) == x.
  auto g = new_graph();
  Value* in = g->add_input("x", tt(DType::kFloat32, {N, Co, H * b, W * b}));
  Node* n = g->add_node("SpaceToDepth", {in}, {"y"});
  n->set_attr("blocksize", Attribute::of_int(b));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "f32[1, 8, 2, 3]");
  std::vector<double> space;
  for (int64_t c = 0; c < Co; ++c)
    for (int64_t h = 0; h < H * b; ++h)
      for (int64_t w = 0; w < W * b; ++w) space.push_back(x[((((h % b) * b + (w % b)) * Co + c) * H + h / b) * W + w / b]);
  expect_close(run_node(*g, *n, {make_tensor(DType::kFloat32, {N, Co, H * b, W * b}, space)}).at(0), x, 0,
               "space_to_depth");
}

// Opset 18 optionals over plain tensors: OptionalHasElement is true for a
// tensor and false without an input; OptionalGetElement is the tensor.
TEST(MiscOps, OptionalsOfTensorsAreKnownWhenCompiling) {
  auto g = new_graph();
  Value* in = g->add_input("x", tt(DType::kFloat32, {3}));
  Node* has = g->add_node("OptionalHasElement", {in}, {"h"});
  Node* none = g->add_node("OptionalHasElement", {}, {"n"});
  Node* get = g->add_node("OptionalGetElement", {in}, {"y"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(has->output(0)->type().to_string(), "bool[]");
  EXPECT_EQ(get->output(0)->type().to_string(), "f32[3]");
  Tensor x = make_tensor(DType::kFloat32, {3}, {1.5, -2, 4});
  expect_close(run_node(*g, *has, {x}).at(0), {1}, 0, "has");
  expect_close(run_node(*g, *none, {}).at(0), {0}, 0, "none");
  expect_close(run_node(*g, *get, {x}).at(0), {1.5, -2, 4}, 0, "get");
}

// ai.onnx.preview.training Adam with bias correction (T > 0) against the
// reference formula, and a gradient shaped unlike its X refused.
TEST(MiscOps, AdamWithBiasCorrectionAndShapeErrors) {
  auto g = new_graph();
  std::vector<Value*> in;
  for (const char* name : {"R", "T"}) in.push_back(g->add_input(name, tt(std::string(name) == "R" ? DType::kFloat32 : DType::kInt64, {})));
  for (const char* name : {"X", "G", "V", "H"}) in.push_back(g->add_input(name, tt(DType::kFloat32, {2})));
  Node* n = g->add_node("Adam", in, {"X_new", "V_new", "H_new"}, "ai.onnx.preview.training");
  n->set_attr("alpha", Attribute::of_float(0.9));
  n->set_attr("beta", Attribute::of_float(0.99));
  n->set_attr("epsilon", Attribute::of_float(1e-3));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(2)->type().to_string(), "f32[2]");
  const double r = 0.1, a = 0.9, b = 0.99, eps = 1e-3;
  const int64_t t = 3;
  std::vector<double> x = {1.0, -2.0}, gr = {0.5, 3.0}, v = {0.2, -0.1}, h = {0.4, 1.0};
  auto out = testing::try_kernel(*n, {make_tensor(DType::kFloat32, {}, {r}), make_tensor(DType::kInt64, {}, {double(t)}),
                                      make_tensor(DType::kFloat32, {2}, x), make_tensor(DType::kFloat32, {2}, gr),
                                      make_tensor(DType::kFloat32, {2}, v), make_tensor(DType::kFloat32, {2}, h)});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  std::vector<double> wx, wv, wh;
  for (int i = 0; i < 2; ++i) {
    double vn = a * v[i] + (1 - a) * gr[i], hn = b * h[i] + (1 - b) * gr[i] * gr[i];
    double ra = r * std::sqrt(1 - std::pow(b, t)) / (1 - std::pow(a, t));
    wx.push_back(x[i] - ra * vn / (std::sqrt(hn) + eps));
    wv.push_back(vn);
    wh.push_back(hn);
  }
  expect_close((*out)[0], wx, 1e-6, "X_new");
  expect_close((*out)[1], wv, 1e-6, "V_new");
  expect_close((*out)[2], wh, 1e-6, "H_new");
  auto bad = testing::try_kernel(*n, {make_tensor(DType::kFloat32, {}, {r}), make_tensor(DType::kInt64, {}, {1}),
                                      make_tensor(DType::kFloat32, {2}, x), make_tensor(DType::kFloat32, {3}, {1, 2, 3}),
                                      make_tensor(DType::kFloat32, {2}, v), make_tensor(DType::kFloat32, {2}, h)});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("input 3 has shape [3], X_0 [2]"), std::string::npos) << bad.status().message();
  // Momentum's attributes have no defaults in the spec.
  Node* m = g->add_node("Momentum", {in[0], in[1], in[2], in[3], in[4]}, {"Xm", "Vm"}, "ai.onnx.preview.training");
  m->set_attr("alpha", Attribute::of_float(0.9));
  auto mk = testing::try_kernel(*m, {});
  ASSERT_FALSE(mk.is_ok());
  EXPECT_NE(mk.status().message().find("missing attribute 'beta'"), std::string::npos) << mk.status().message();
}

// Sizes within the channels, and windows longer than them (7, 12: the
// lowering walks the channels instead of the window), both parities.
TEST(MiscOps, LrnMatchesReference) {
  for (int64_t size : {3, 4, 7, 12}) {
    SCOPED_TRACE(size);
    const int64_t C = 5, HW = 3;
    const double alpha = 2e-2, beta = 0.75, bias = 1.5;
    std::vector<double> x = ramp(C * HW, -2, 2);
    for (double& v : x) v = static_cast<float>(v);
    auto g = new_graph();
    Value* in = g->add_input("x", tt(DType::kFloat32, {1, C, HW}));
    Node* n = g->add_node("LRN", {in}, {"y"});
    n->set_attr("size", Attribute::of_int(size));
    Attribute a;
    a.kind = Attribute::Kind::kFloat;
    a.f = alpha;
    n->set_attr("alpha", a);
    a.f = bias;
    n->set_attr("bias", a);
    ASSERT_TRUE(testing::infer(*g).is_ok());
    std::vector<double> want;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) {
        double sq = 0;
        for (int64_t k = c - (size - 1) / 2; k <= c + size / 2; ++k)
          if (k >= 0 && k < C) sq += x[k * HW + p] * x[k * HW + p];
        want.push_back(x[c * HW + p] / std::pow(bias + alpha / size * sq, beta));
      }
    expect_close(run_node(*g, *n, {make_tensor(DType::kFloat32, {1, C, HW}, x)}).at(0), want, 1e-6, "lrn");
  }
}

TEST(MiscOps, EyeLikeWithOffsetAndDtype) {
  auto g = new_graph();
  Value* in = g->add_input("x", tt(DType::kFloat32, {3, 4}));
  Node* n = g->add_node("EyeLike", {in}, {"y"});
  n->set_attr("k", Attribute::of_int(1));
  n->set_attr("dtype", Attribute::of_int(static_cast<int64_t>(DType::kInt32)));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "i32[3, 4]");
  expect_close(run_node(*g, *n, {make_tensor(DType::kFloat32, {3, 4}, std::vector<double>(12, 7))}).at(0),
               {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, 0, "eye");
}

TEST(MiscOps, InverseTrigAndHyperbolic) {
  struct Case {
    const char* op;
    double lo, hi;
    double (*ref)(double);
  };
  const Case cases[] = {
      {"Asin", -0.99, 0.99, [](double v) { return std::asin(v); }},
      {"Acos", -0.99, 0.99, [](double v) { return std::acos(v); }},
      {"Atan", -20, 20, [](double v) { return std::atan(v); }},
      {"Asinh", -20, 20, [](double v) { return std::asinh(v); }},
      {"Acosh", 1.01, 30, [](double v) { return std::acosh(v); }},
      {"Atanh", -0.95, 0.95, [](double v) { return std::atanh(v); }},
      {"Sinh", -5, 5, [](double v) { return std::sinh(v); }},
      {"Cosh", -5, 5, [](double v) { return std::cosh(v); }},
  };
  for (const Case& c : cases) {
    auto g = new_graph();
    Value* in = g->add_input("x", tt(DType::kFloat32, {64}));
    Node* n = g->add_node(c.op, {in}, {"y"});
    ASSERT_TRUE(testing::infer(*g).is_ok());
    std::vector<double> x = ramp(64, c.lo, c.hi), want;
    for (double& v : x) v = static_cast<float>(v);
    for (double v : x) want.push_back(c.ref(v));
    Tensor got = run_node(*g, *n, {make_tensor(DType::kFloat32, {64}, x)}).at(0);
    for (int64_t i = 0; i < 64; ++i)
      EXPECT_NEAR(got.get_f64(i), want[i], 2e-6 * std::max(1.0, std::fabs(want[i]))) << c.op << "(" << x[i] << ")";
  }
}

TEST(MiscOps, CastToNarrowFloatsRoundsAndSaturates) {
  std::vector<double> x = {1.0, 1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 70000.0, -1e9, 0.1};
  struct Case {
    DType to;
    int64_t saturate;
    std::vector<double> want;
  };
  const Case cases[] = {
      {DType::kFloat16, 1, {1.0, 1.0, 1.0 + 2.0 / 1024, INFINITY, -INFINITY, 0.0999755859375}},
      {DType::kBFloat16, 1, {1.0, 1.0, 1.0, 70144.0, -998244352.0, 0.10009765625}},
      {DType::kFloat8E4M3FN, 1, {1.0, 1.0, 1.0, 448.0, -448.0, 0.1015625}},
      {DType::kFloat8E4M3FN, 0, {1.0, 1.0, 1.0, NAN, NAN, 0.1015625}},
      {DType::kFloat8E5M2, 0, {1.0, 1.0, 1.0, INFINITY, -INFINITY, 0.09375}},
  };
  for (const Case& c : cases) {
    auto g = new_graph();
    Value* in = g->add_input("x", tt(DType::kFloat32, {6}));
    Node* n = g->add_node("Cast", {in}, {"y"});
    n->set_attr("to", Attribute::of_int(static_cast<int64_t>(c.to)));
    n->set_attr("saturate", Attribute::of_int(c.saturate));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    Tensor got = run_node(*g, *n, {make_tensor(DType::kFloat32, {6}, x)}).at(0);
    ASSERT_EQ(got.dtype(), c.to);
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(c.want[i])) {
        EXPECT_TRUE(std::isnan(got.get_f64(i))) << dtype_name(c.to) << " x=" << x[i];
      } else {
        EXPECT_EQ(got.get_f64(i), c.want[i]) << dtype_name(c.to) << " saturate=" << c.saturate << " x=" << x[i];
      }
    }
  }
}

TEST(MiscOps, UniqueSortedWithInverseAndCounts) {
  auto g = new_graph();
  Value* in = g->add_input("x", tt(DType::kFloat32, {6}));
  Node* n = g->add_node("Unique", {in}, {"y", "idx", "inv", "cnt"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  auto out = run_kernel(*n, {make_tensor(DType::kFloat32, {6}, {2, 1, 1, 3, 4, 3})});
  ASSERT_EQ(out.size(), 4u);
  expect_close(out[0], {1, 2, 3, 4}, 0, "values");
  expect_close(out[1], {1, 0, 3, 4}, 0, "first indices");
  expect_close(out[2], {1, 0, 0, 2, 3, 2}, 0, "inverse");
  expect_close(out[3], {2, 1, 2, 1}, 0, "counts");
}

TEST(MiscOps, DetCompressAndNms) {
  auto g = new_graph();
  Value* m = g->add_input("m", tt(DType::kFloat32, {2, 3, 3}));
  Node* det = g->add_node("Det", {m}, {"d"});
  Value* x = g->add_input("x", tt(DType::kFloat32, {2, 3}));
  Value* cond = g->add_input("c", tt(DType::kBool, {3}));
  Node* comp = g->add_node("Compress", {x, cond}, {"z"});
  comp->set_attr("axis", Attribute::of_int(1));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  auto d = run_kernel(*det, {make_tensor(DType::kFloat32, {2, 3, 3}, {2, 0, 0, 0, 3, 0, 0, 0, 4,  //
                                                                      0, 1, 0, 1, 0, 0, 0, 0, 5})});
  expect_close(d.at(0), {24, -5}, 1e-12, "det");
  auto z = run_kernel(*comp, {make_tensor(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6}),
                              make_tensor(DType::kBool, {3}, {1, 0, 1})});
  ASSERT_EQ(z.at(0).shape(), (std::vector<int64_t>{2, 2}));
  expect_close(z.at(0), {1, 3, 4, 6}, 0, "compress");

  Value* boxes = g->add_input("boxes", tt(DType::kFloat32, {1, 3, 4}));
  Value* scores = g->add_input("scores", tt(DType::kFloat32, {1, 1, 3}));
  Value* max_out = g->add_input("max", tt(DType::kInt64, {1}));
  Value* iou = g->add_input("iou", tt(DType::kFloat32, {1}));
  Node* nms = g->add_node("NonMaxSuppression", {boxes, scores, max_out, iou}, {"sel"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  // Boxes 0 and 1 overlap (IoU 0.81); box 2 is apart. Scores order: 1, 2, 0.
  auto sel = run_kernel(*nms, {make_tensor(DType::kFloat32, {1, 3, 4}, {0, 0, 1, 1, 0, 0.1, 1, 1.1, 5, 5, 6, 6}),
                               make_tensor(DType::kFloat32, {1, 1, 3}, {0.5, 0.9, 0.7}),
                               make_tensor(DType::kInt64, {1}, {10}), make_tensor(DType::kFloat32, {1}, {0.5})});
  ASSERT_EQ(sel.at(0).shape(), (std::vector<int64_t>{2, 3}));
  expect_close(sel.at(0), {0, 0, 1, 0, 0, 2}, 0, "nms");
}

// The kernel's grid over x (taken from 65 boxes up) against the plain
// definition (every kept box tested), in float as the kernel computes IoU:
// clustered boxes of two classes offset apart as batched NMS does, boxes wide
// enough to span many cells, ties in score, thresholds 0.5, 0 and -0.1 (a
// negative one suppresses boxes that do not overlap, so the grid is bypassed),
// and a NaN corner (grid off).
TEST(MiscOps, NmsMatchesTheDefinitionOnManyBoxes) {
  auto reference = [](const std::vector<float>& bx, const std::vector<float>& sc, int64_t n, int64_t classes,
                      float th, int64_t max_out) {
    std::vector<int64_t> out;
    for (int64_t c = 0; c < classes; ++c) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sc[c * n + a] > sc[c * n + b]; });
      auto corner = [&](int64_t i, int k) {
        const float* v = &bx[static_cast<size_t>(i * 4)];
        return k == 0 ? std::min(v[0], v[2]) : k == 1 ? std::min(v[1], v[3]) : k == 2 ? std::max(v[0], v[2]) : std::max(v[1], v[3]);
      };
      std::vector<int64_t> kept;
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        float ai = (corner(i, 2) - corner(i, 0)) * (corner(i, 3) - corner(i, 1));
        bool suppressed = false;
        for (int64_t k : kept) {
          float ak = (corner(k, 2) - corner(k, 0)) * (corner(k, 3) - corner(k, 1));
          float ih = std::max(0.0f, std::min(corner(i, 2), corner(k, 2)) - std::max(corner(i, 0), corner(k, 0)));
          float iw = std::max(0.0f, std::min(corner(i, 3), corner(k, 3)) - std::max(corner(i, 1), corner(k, 1)));
          float inter = ih * iw, uni = ai + ak - inter;
          if (ai > 0 && ak > 0 && uni > 0 && inter / uni > th) suppressed = true;
        }
        if (!suppressed) kept.push_back(i);
      }
      for (int64_t k : kept) out.insert(out.end(), {0, c, k});
    }
    return out;
  };
  const int64_t n = 600, classes = 2;
  std::vector<double> bx, sc;
  uint64_t state = 12345;
  auto rnd = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>((state >> 11) % 1000000) / 1000000.0;
  };
  for (int64_t i = 0; i < n; ++i) {
    double off = i < n / 2 ? 0 : 100;  // two clusters, as batched NMS's class offsets
    double y = off + rnd() * 20, x = off + rnd() * 20;
    double h = 0.5 + rnd() * 4, w = i % 50 == 0 ? 60 : 0.5 + rnd() * 4;  // some wide boxes
    if (i % 3 == 0) bx.insert(bx.end(), {y + h, x + w, y, x});            // flipped corners
    else bx.insert(bx.end(), {y, x, y + h, x + w});
  }
  for (int64_t i = 0; i < classes * n; ++i) sc.push_back(std::floor(rnd() * 50) / 50);  // ties
  std::vector<float> bxf(bx.begin(), bx.end()), scf(sc.begin(), sc.end());
  auto g = new_graph();
  Value* boxes = g->add_input("boxes", tt(DType::kFloat32, {1, n, 4}));
  Value* scores = g->add_input("scores", tt(DType::kFloat32, {1, classes, n}));
  Value* max_out = g->add_input("max", tt(DType::kInt64, {1}));
  Value* iou = g->add_input("iou", tt(DType::kFloat32, {1}));
  Node* nms = g->add_node("NonMaxSuppression", {boxes, scores, max_out, iou}, {"sel"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  for (float th : {0.5f, 0.0f, -0.1f}) {
    for (int64_t limit : {int64_t{1000}, int64_t{40}}) {
      SCOPED_TRACE(::testing::Message() << "threshold " << th << ", max " << limit);
      auto sel = run_kernel(*nms, {make_tensor(DType::kFloat32, {1, n, 4}, bx), make_tensor(DType::kFloat32, {1, classes, n}, sc),
                                   make_tensor(DType::kInt64, {1}, {static_cast<double>(limit)}),
                                   make_tensor(DType::kFloat32, {1}, {th})});
      std::vector<int64_t> want = reference(bxf, scf, n, classes, th, limit);
      ASSERT_EQ(sel.at(0).numel(), static_cast<int64_t>(want.size()));
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(sel.at(0).data_as<int64_t>()[i], want[i]) << "row " << i / 3;
      if (th == 0.5f && limit == 1000) {
        EXPECT_GT(want.size() / 3, 100u);  // informative: many kept, many suppressed
        EXPECT_LT(want.size() / 3, static_cast<size_t>(classes * n - 100));
      }
    }
  }
  // Coordinates near the float limit: the x span overflows float (the grid is
  // then off); the result is still the definition's, with no crash.
  {
    std::vector<double> far = bx;
    for (int64_t i = 0; i < n; ++i) {
      double shift = i % 2 ? 3.0e38 : -3.2e38;
      far[static_cast<size_t>(i * 4 + 1)] = far[static_cast<size_t>(i * 4 + 1)] * 1e36 + shift;
      far[static_cast<size_t>(i * 4 + 3)] = far[static_cast<size_t>(i * 4 + 3)] * 1e36 + shift;
    }
    std::vector<float> farf(far.begin(), far.end());
    auto sel = run_kernel(*nms, {make_tensor(DType::kFloat32, {1, n, 4}, far), make_tensor(DType::kFloat32, {1, classes, n}, sc),
                                 make_tensor(DType::kInt64, {1}, {1000}), make_tensor(DType::kFloat32, {1}, {0.5})});
    std::vector<int64_t> want = reference(farf, scf, n, classes, 0.5f, 1000);
    ASSERT_EQ(sel.at(0).numel(), static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(sel.at(0).data_as<int64_t>()[i], want[i]) << "row " << i / 3;
  }
  // A NaN corner: the grid is off and the result is still the definition's.
  bx[5] = std::nan("");
  bxf.assign(bx.begin(), bx.end());
  auto sel = run_kernel(*nms, {make_tensor(DType::kFloat32, {1, n, 4}, bx), make_tensor(DType::kFloat32, {1, classes, n}, sc),
                               make_tensor(DType::kInt64, {1}, {1000}), make_tensor(DType::kFloat32, {1}, {0.5})});
  std::vector<int64_t> want = reference(bxf, scf, n, classes, 0.5f, 1000);
  ASSERT_EQ(sel.at(0).numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(sel.at(0).data_as<int64_t>()[i], want[i]) << "row " << i / 3;
}

}  // namespace
}  // namespace kiln::ops
