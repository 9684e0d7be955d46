// Conv, ConvTranspose, pools, MatMul and Gemm: symbolic shape inference, and
// numerics of the lowered compute definitions (naive and default schedules,
// run by the loop-IR interpreter) against direct C++ references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops_test_harness.h"

namespace kiln::ops::testing {
namespace {

Shape static_shape(const std::vector<int64_t>& s) {
  Shape out;
  for (int64_t d : s) out.push_back(Expr(d));
  return out;
}

// ---- Symbolic shapes --------------------------------------------------------------------------

TEST(ConvShape, SymbolicStride2Pad1) {
  Graph g;
  g.opsets[""] = 17;
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("n"), 3, var("h"), var("w")}));
  Value* w = g.add_input("w", tt(DType::kFloat32, {8, 3, 3, 3}));
  Node* c = g.add_node("Conv", {x, w}, {"y"});
  c->set_attr("strides", Attribute::of_ints({2, 2}));
  c->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  ASSERT_TRUE(infer(g).is_ok());
  const Shape& y = *c->output(0)->type().shape;
  ASSERT_EQ(y.size(), 4u);
  EXPECT_EQ(y[0].to_string(), "n");
  EXPECT_EQ(y[1].to_string(), "8");
  EXPECT_EQ(y[2].to_string(), "(h - 1) floordiv 2 + 1");
  EXPECT_EQ(y[3].to_string(), "(w - 1) floordiv 2 + 1");
}

TEST(ConvShape, SameUpperKeepsCeilOfInputOverStride) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 4, 17, var("w")}));
  Value* w = g.add_input("w", tt(DType::kFloat32, {4, 1, 3, 3}));
  Node* c = g.add_node("Conv", {x, w}, {"y"});
  c->set_attr("strides", Attribute::of_ints({2, 1}));
  c->set_attr("group", Attribute::of_int(4));
  c->set_attr("auto_pad", Attribute::of_string("SAME_UPPER"));
  ASSERT_TRUE(infer(g).is_ok());
  const Shape& y = *c->output(0)->type().shape;
  EXPECT_EQ(y[2].to_string(), "9");
  EXPECT_EQ(y[3].to_string(), "w");
}

TEST(ConvShape, ChannelMismatchIsAnError) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 4, 8, 8}));
  Value* w = g.add_input("w", tt(DType::kFloat32, {4, 3, 3, 3}));
  g.add_node("Conv", {x, w}, {"y"}, "", "conv1");
  Status st = infer(g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("conv1"), std::string::npos) << st.message();
}

// Kiln's blocked-layout ops in a user's file: shapes the kernels would read
// past are errors naming the node. FromBlocked reads block c / b of every
// channel c, so its input's blocks must be a constant that holds the channels
// (a symbolic count was accepted and read out of bounds at n = 1).
TEST(BlockedLayoutShape, FromBlockedNeedsKnownBlocksHoldingTheChannels) {
  auto from_blocked = [](Shape x, int64_t channels) {
    Graph g;
    g.bounds["n"] = Interval{1, std::nullopt};
    Value* in = g.add_input("x", tt(DType::kFloat32, std::move(x)));
    Node* n = g.add_node("FromBlocked", {in}, {"y"}, "kiln", "back");
    n->set_attr("block", Attribute::of_int(16));
    n->set_attr("channels", Attribute::of_int(channels));
    return infer(g);
  };
  EXPECT_TRUE(from_blocked({1, 4, 3, 3, 16}, 60).is_ok());
  for (auto [shape, channels] : std::vector<std::pair<Shape, int64_t>>{
           {{1, var("n"), 3, 3, 16}, 64}, {{1, 4, 3, 3, 16}, 65}, {{1, 4, 3, 3, 16}, 48}, {{1, 4, 3, 3, 8}, 64}}) {
    Status st = from_blocked(shape, channels);
    ASSERT_FALSE(st.is_ok()) << shape_to_string(shape) << " " << channels;
    EXPECT_NE(st.message().find("back"), std::string::npos) << st.message();
  }
}

// channels_last: the NCHW side of ToBlocked and FromBlocked is [N, H, W, C];
// any value but 0 and 1 is an error naming the node.
TEST(BlockedLayoutShape, ChannelsLastSide) {
  auto convert = [](const char* op, Shape x, int64_t cl, std::string* out) {
    Graph g;
    Value* in = g.add_input("x", tt(DType::kFloat32, std::move(x)));
    Node* n = g.add_node(op, {in}, {"y"}, "kiln", "conv_layout");
    n->set_attr("block", Attribute::of_int(16));
    n->set_attr("channels_last", Attribute::of_int(cl));
    if (std::string(op) == "FromBlocked") n->set_attr("channels", Attribute::of_int(24));
    Status st = infer(g);
    if (st.is_ok()) *out = shape_to_string(*n->output(0)->type().shape);
    return st;
  };
  std::string y;
  ASSERT_TRUE(convert("ToBlocked", {1, var("h"), 7, 24}, 1, &y).is_ok());
  EXPECT_EQ(y, "[1, 2, h, 7, 16]");
  ASSERT_TRUE(convert("FromBlocked", {1, 2, 5, 7, 16}, 1, &y).is_ok());
  EXPECT_EQ(y, "[1, 5, 7, 24]");
  for (const char* op : {"ToBlocked", "FromBlocked"}) {
    Status st = convert(op, op[0] == 'T' ? Shape{1, 5, 7, 24} : Shape{1, 2, 5, 7, 16}, 2, &y);
    ASSERT_FALSE(st.is_ok()) << op;
    EXPECT_NE(st.message().find("conv_layout"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("channels_last"), std::string::npos) << st.message();
  }
}

TEST(MatMulShape, BatchBroadcastAndVectors) {
  Graph g;
  Value* a = g.add_input("a", tt(DType::kFloat32, {var("b"), 1, var("m"), 5}));
  Value* b = g.add_input("b2", tt(DType::kFloat32, {3, 5, 7}));
  Value* v = g.add_input("v", tt(DType::kFloat32, {5}));
  Node* mm = g.add_node("MatMul", {a, b}, {"y"});
  Node* mv = g.add_node("MatMul", {a, v}, {"z"});
  Node* vm = g.add_node("MatMul", {v, b}, {"u"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_to_string(*mm->output(0)->type().shape), "[b, 3, m, 7]");
  EXPECT_EQ(shape_to_string(*mv->output(0)->type().shape), "[b, 1, m]");
  EXPECT_EQ(shape_to_string(*vm->output(0)->type().shape), "[3, 7]");
}

TEST(PoolShape, CeilModeDropsWindowStartingInPadding) {
  // PyTorch: MaxPool2d(k=2, s=2, p=1, ceil_mode=True) on 4 gives 3, on 5 gives 3.
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 1, 4, 5}));
  Node* p = g.add_node("MaxPool", {x}, {"y"});
  p->set_attr("kernel_shape", Attribute::of_ints({2, 2}));
  p->set_attr("strides", Attribute::of_ints({2, 2}));
  p->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  p->set_attr("ceil_mode", Attribute::of_int(1));
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_to_string(*p->output(0)->type().shape), "[1, 1, 3, 3]");
}

// ---- References -------------------------------------------------------------------------------

struct ConvCase {
  int64_t n, c, h, w, m, kh, kw, group;
  std::vector<int64_t> strides, pads, dilations;
  bool bias;
};

// Direct 2-D convolution (NCHW, OIHW weights).
std::vector<double> ref_conv2d(const ConvCase& p, const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, int64_t oh, int64_t ow) {
  std::vector<double> y(static_cast<size_t>(p.n * p.m * oh * ow), 0.0);
  int64_t cg = p.c / p.group, mg = p.m / p.group;
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t m = 0; m < p.m; ++m)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = p.bias ? b[m] : 0.0;
          int64_t g = m / mg;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < p.kh; ++r)
              for (int64_t s = 0; s < p.kw; ++s) {
                int64_t ih = i * p.strides[0] - p.pads[0] + r * p.dilations[0];
                int64_t iw = j * p.strides[1] - p.pads[1] + s * p.dilations[1];
                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
                acc += x[((n * p.c + g * cg + c) * p.h + ih) * p.w + iw] * w[((m * cg + c) * p.kh + r) * p.kw + s];
              }
          y[((n * p.m + m) * oh + i) * ow + j] = acc;
        }
  return y;
}

void run_conv_case(const ConvCase& p) {
  SCOPED_TRACE(::testing::Message() << "conv n" << p.n << " c" << p.c << " " << p.h << "x" << p.w << " m" << p.m
                                    << " k" << p.kh << "x" << p.kw << " g" << p.group << " s" << p.strides[0] << ","
                                    << p.strides[1] << " p" << p.pads[0] << "," << p.pads[1] << "," << p.pads[2]
                                    << "," << p.pads[3] << " d" << p.dilations[0] << "," << p.dilations[1]);
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, static_shape({p.n, p.c, p.h, p.w})));
  Value* w = g.add_input("w", tt(DType::kFloat32, static_shape({p.m, p.c / p.group, p.kh, p.kw})));
  Value* b = p.bias ? g.add_input("b", tt(DType::kFloat32, static_shape({p.m}))) : nullptr;
  std::vector<Value*> ins = {x, w};
  if (b != nullptr) ins.push_back(b);
  Node* c = g.add_node("Conv", ins, {"y"});
  c->set_attr("strides", Attribute::of_ints(p.strides));
  c->set_attr("pads", Attribute::of_ints(p.pads));
  c->set_attr("dilations", Attribute::of_ints(p.dilations));
  c->set_attr("group", Attribute::of_int(p.group));
  ASSERT_TRUE(infer(g).is_ok());
  auto ys = c->output(0)->type().static_shape();
  int64_t oh = (p.h + p.pads[0] + p.pads[2] - p.dilations[0] * (p.kh - 1) - 1) / p.strides[0] + 1;
  int64_t ow = (p.w + p.pads[1] + p.pads[3] - p.dilations[1] * (p.kw - 1) - 1) / p.strides[1] + 1;
  ASSERT_EQ(ys, (std::vector<int64_t>{p.n, p.m, oh, ow}));
  std::vector<double> xv = ramp(p.n * p.c * p.h * p.w, -1, 1, 1);
  std::vector<double> wv = ramp(p.m * (p.c / p.group) * p.kh * p.kw, -1, 1, 2);
  std::vector<double> bv = ramp(p.m, -1, 1, 3);
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat32, {p.n, p.c, p.h, p.w}, xv),
                                make_tensor(DType::kFloat32, {p.m, p.c / p.group, p.kh, p.kw}, wv)};
  if (p.bias) inputs.push_back(make_tensor(DType::kFloat32, {p.m}, bv));
  auto out = run_node(g, *c, inputs);
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0], ref_conv2d(p, xv, wv, bv, oh, ow), 1e-5, "conv");
}

TEST(ConvNumerics, Plain) { run_conv_case({1, 3, 5, 7, 4, 3, 3, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, false}); }
TEST(ConvNumerics, StridePadBias) { run_conv_case({2, 3, 7, 6, 5, 3, 3, 1, {2, 2}, {1, 1, 1, 1}, {1, 1}, true}); }
TEST(ConvNumerics, AsymmetricPadsOddStride) {
  run_conv_case({1, 2, 9, 5, 3, 3, 2, 1, {3, 1}, {2, 0, 1, 1}, {1, 1}, true});
}
TEST(ConvNumerics, Dilation) { run_conv_case({1, 2, 11, 9, 3, 3, 3, 1, {1, 2}, {2, 1, 2, 1}, {2, 3}, false}); }
TEST(ConvNumerics, Groups) { run_conv_case({1, 6, 5, 5, 4, 3, 3, 2, {1, 1}, {1, 1, 1, 1}, {1, 1}, true}); }
TEST(ConvNumerics, Depthwise) { run_conv_case({2, 4, 6, 5, 8, 3, 3, 4, {2, 1}, {1, 1, 0, 1}, {1, 1}, true}); }
TEST(ConvNumerics, OneByOneOddSizes) { run_conv_case({1, 17, 1, 3, 1, 1, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, true}); }

TEST(ConvNumerics, OneDMatchesTwoDReference) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 2, 10}));
  Value* w = g.add_input("w", tt(DType::kFloat32, {3, 2, 3}));
  Node* c = g.add_node("Conv", {x, w}, {"y"});
  c->set_attr("strides", Attribute::of_ints({2}));
  c->set_attr("pads", Attribute::of_ints({1, 2}));
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(c->output(0)->type().static_shape(), (std::vector<int64_t>{1, 3, 6}));
  std::vector<double> xv = ramp(20, -1, 1, 4), wv = ramp(18, -1, 1, 5);
  auto out = run_node(g, *c, {make_tensor(DType::kFloat32, {1, 2, 10}, xv), make_tensor(DType::kFloat32, {3, 2, 3}, wv)});
  ASSERT_EQ(out.size(), 1u);
  ConvCase p{1, 2, 1, 10, 3, 1, 3, 1, {1, 2}, {0, 1, 0, 2}, {1, 1}, false};
  expect_close(out[0], ref_conv2d(p, xv, wv, {}, 1, 6), 1e-5, "conv1d");
}

TEST(ConvNumerics, SameLowerSymbolicBoundAtRunTime) {
  // Symbolic spatial dims; auto_pad SAME_LOWER with stride 2: pads are symbolic exprs.
  Graph g;
  g.bounds["h"] = Interval{1, std::nullopt};
  Value* x = g.add_input("x", tt(DType::kFloat32, {1, 2, var("h"), 6}));
  Value* w = g.add_input("w", tt(DType::kFloat32, {2, 2, 3, 3}));
  Node* c = g.add_node("Conv", {x, w}, {"y"});
  c->set_attr("strides", Attribute::of_ints({2, 2}));
  c->set_attr("auto_pad", Attribute::of_string("SAME_LOWER"));
  ASSERT_TRUE(infer(g).is_ok());
  int64_t h = 7;
  std::vector<double> xv = ramp(2 * h * 6, -1, 1, 6), wv = ramp(36, -1, 1, 7);
  auto out = run_node(g, *c, {make_tensor(DType::kFloat32, {1, 2, h, 6}, xv), make_tensor(DType::kFloat32, {2, 2, 3, 3}, wv)},
                      {{"h", h}});
  ASSERT_EQ(out.size(), 1u);
  // h = 7, stride 2: out 4, total pad (4-1)*2+3-7 = 2, SAME_LOWER begins with 1.
  // w = 6, stride 2: out 3, total pad (3-1)*2+3-6 = 1, SAME_LOWER begins with 1.
  ConvCase p{1, 2, h, 6, 2, 3, 3, 1, {2, 2}, {1, 1, 1, 0}, {1, 1}, false};
  expect_close(out[0], ref_conv2d(p, xv, wv, {}, 4, 3), 1e-5, "conv same_lower");
}

TEST(ConvTransposeNumerics, StridePadOutputPaddingGroups) {
  int64_t n = 1, c = 4, h = 3, w = 4, group = 2, mg = 3, k = 3, s = 2, pad = 1, opad = 1;
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, static_shape({n, c, h, w})));
  Value* wt = g.add_input("w", tt(DType::kFloat32, static_shape({c, mg, k, k})));
  Value* b = g.add_input("b", tt(DType::kFloat32, static_shape({group * mg})));
  Node* node = g.add_node("ConvTranspose", {x, wt, b}, {"y"});
  node->set_attr("strides", Attribute::of_ints({s, s}));
  node->set_attr("pads", Attribute::of_ints({pad, pad, pad, pad}));
  node->set_attr("output_padding", Attribute::of_ints({opad, opad}));
  node->set_attr("group", Attribute::of_int(group));
  ASSERT_TRUE(infer(g).is_ok());
  int64_t oh = s * (h - 1) + opad + k - 2 * pad, ow = s * (w - 1) + opad + k - 2 * pad;
  ASSERT_EQ(node->output(0)->type().static_shape(), (std::vector<int64_t>{n, group * mg, oh, ow}));
  std::vector<double> xv = ramp(n * c * h * w, -1, 1, 8), wv = ramp(c * mg * k * k, -1, 1, 9), bv = ramp(group * mg, -1, 1, 10);
  auto out = run_node(g, *node,
                      {make_tensor(DType::kFloat32, {n, c, h, w}, xv), make_tensor(DType::kFloat32, {c, mg, k, k}, wv),
                       make_tensor(DType::kFloat32, {group * mg}, bv)});
  ASSERT_EQ(out.size(), 1u);
  // Scatter form of the reference.
  int64_t m = group * mg, cg = c / group;
  std::vector<double> ref(static_cast<size_t>(n * m * oh * ow), 0.0);
  for (int64_t om = 0; om < m; ++om)
    for (int64_t e = 0; e < oh * ow; ++e) ref[om * oh * ow + e] = bv[om];
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        for (int64_t mm = 0; mm < mg; ++mm)
          for (int64_t r = 0; r < k; ++r)
            for (int64_t q = 0; q < k; ++q) {
              int64_t yi = i * s - pad + r, yj = j * s - pad + q;
              if (yi < 0 || yi >= oh || yj < 0 || yj >= ow) continue;
              int64_t om = (ci / cg) * mg + mm;
              ref[(om * oh + yi) * ow + yj] += xv[(ci * h + i) * w + j] * wv[((ci * mg + mm) * k + r) * k + q];
            }
  expect_close(out[0], ref, 1e-5, "conv_transpose");
}

// ---- Pools --------------------------------------------------------------------------------------

struct PoolCase {
  std::string op;
  int64_t h, w, kh, kw;
  std::vector<int64_t> strides, pads, dilations;
  bool ceil_mode, count_include_pad;
};

int64_t pool_out(int64_t in, int64_t pb, int64_t pe, int64_t k, int64_t s, int64_t d, bool ceil_mode) {
  int64_t num = in + pb + pe - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + pb) --out;
  return out;
}

void run_pool_case(const PoolCase& p) {
  SCOPED_TRACE(::testing::Message() << p.op << " " << p.h << "x" << p.w << " k" << p.kh << "x" << p.kw << " s"
                                    << p.strides[0] << "," << p.strides[1] << " p" << p.pads[0] << "," << p.pads[1]
                                    << "," << p.pads[2] << "," << p.pads[3] << " d" << p.dilations[0] << ","
                                    << p.dilations[1] << " ceil" << p.ceil_mode << " incl" << p.count_include_pad);
  int64_t n = 2, c = 3;
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, static_shape({n, c, p.h, p.w})));
  Node* node = g.add_node(p.op, {x}, {"y"});
  node->set_attr("kernel_shape", Attribute::of_ints({p.kh, p.kw}));
  node->set_attr("strides", Attribute::of_ints(p.strides));
  node->set_attr("pads", Attribute::of_ints(p.pads));
  node->set_attr("dilations", Attribute::of_ints(p.dilations));
  node->set_attr("ceil_mode", Attribute::of_int(p.ceil_mode));
  node->set_attr("count_include_pad", Attribute::of_int(p.count_include_pad));
  ASSERT_TRUE(infer(g).is_ok());
  int64_t oh = pool_out(p.h, p.pads[0], p.pads[2], p.kh, p.strides[0], p.dilations[0], p.ceil_mode);
  int64_t ow = pool_out(p.w, p.pads[1], p.pads[3], p.kw, p.strides[1], p.dilations[1], p.ceil_mode);
  ASSERT_EQ(node->output(0)->type().static_shape(), (std::vector<int64_t>{n, c, oh, ow}));
  std::vector<double> xv = ramp(n * c * p.h * p.w, -2, 2, 11);
  auto out = run_node(g, *node, {make_tensor(DType::kFloat32, {n, c, p.h, p.w}, xv)});
  ASSERT_EQ(out.size(), 1u);
  // The separable lowering (strategy candidate *.separable) where it applies.
  std::vector<Tensor> sep;
  if (p.kh >= 2 && p.kw >= 2) {
    node->set_attr("kiln_separable", Attribute::of_int(1));
    sep = run_node(g, *node, {make_tensor(DType::kFloat32, {n, c, p.h, p.w}, xv)});
    ASSERT_EQ(sep.size(), 1u);
  }
  std::vector<double> ref;
  for (int64_t pc = 0; pc < n * c; ++pc)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double mx = -INFINITY, sum = 0;
        int64_t valid = 0;
        for (int64_t r = 0; r < p.kh; ++r)
          for (int64_t q = 0; q < p.kw; ++q) {
            int64_t ih = i * p.strides[0] - p.pads[0] + r * p.dilations[0];
            int64_t iw = j * p.strides[1] - p.pads[1] + q * p.dilations[1];
            if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) continue;
            double v = xv[(pc * p.h + ih) * p.w + iw];
            mx = std::max(mx, v);
            sum += v;
            ++valid;
          }
        if (p.op == "MaxPool") {
          ref.push_back(mx);
        } else {
          // count_include_pad divides by the whole window, even taps that
          // ceil_mode pushes past the end padding (the ONNX reference).
          ref.push_back(sum / static_cast<double>(p.count_include_pad ? p.kh * p.kw : valid));
        }
      }
  expect_close(out[0], ref, 1e-5, p.op);
  if (!sep.empty()) expect_close(sep[0], ref, 1e-5, p.op + " separable");
}

TEST(PoolNumerics, MaxPlain) { run_pool_case({"MaxPool", 6, 7, 2, 2, {2, 2}, {0, 0, 0, 0}, {1, 1}, false, false}); }
TEST(PoolNumerics, MaxPadStride) { run_pool_case({"MaxPool", 7, 5, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false}); }
TEST(PoolNumerics, MaxCeilDilation) {
  run_pool_case({"MaxPool", 9, 8, 3, 2, {2, 3}, {1, 0, 1, 1}, {2, 1}, true, false});
}
// Planes wider than a vector (full vectors, ragged tails, strided column
// taps across vector boundaries). run_pool_case checks the window lowering
// and, where the window is at least 2x2, the separable one (rows stage, then
// columns) against the same reference.
TEST(PoolNumerics, MaxSeparableWidePlanes) {
  run_pool_case({"MaxPool", 37, 41, 3, 3, {2, 2}, {0, 0, 0, 0}, {1, 1}, true, false});
  run_pool_case({"MaxPool", 20, 33, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, false, false});
  run_pool_case({"MaxPool", 23, 50, 2, 4, {3, 2}, {1, 2, 0, 1}, {2, 1}, true, false});
  run_pool_case({"AveragePool", 37, 41, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, false});
  run_pool_case({"AveragePool", 20, 35, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, false, true});
  run_pool_case({"AveragePool", 23, 50, 2, 4, {3, 2}, {1, 2, 0, 1}, {2, 1}, true, false});
}
// A NaN reaches exactly the outputs whose window covers it, in both lowerings.
TEST(PoolNumerics, MaxPropagatesNaN) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, static_shape({1, 1, 9, 37})));
  Node* node = g.add_node("MaxPool", {x}, {"y"});
  node->set_attr("kernel_shape", Attribute::of_ints({3, 3}));
  node->set_attr("strides", Attribute::of_ints({2, 2}));
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<double> xv = ramp(9 * 37, -2, 2, 5);
  xv[4 * 37 + 20] = NAN;
  for (int separable : {0, 1}) {
    node->set_attr("kiln_separable", Attribute::of_int(separable));
    auto out = run_node(g, *node, {make_tensor(DType::kFloat32, {1, 1, 9, 37}, xv)});
    ASSERT_EQ(out.size(), 1u);
    const float* y = out[0].data_as<float>();
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 18; ++j) {
        bool covers = 2 * i <= 4 && 4 <= 2 * i + 2 && 2 * j <= 20 && 20 <= 2 * j + 2;
        EXPECT_EQ(std::isnan(y[i * 18 + j]), covers) << separable << " " << i << "," << j;
      }
  }
}
TEST(PoolNumerics, AverageExcludePad) {
  run_pool_case({"AveragePool", 7, 6, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false});
}
TEST(PoolNumerics, AverageIncludePadCeil) {
  run_pool_case({"AveragePool", 7, 6, 3, 2, {2, 2}, {1, 1, 1, 0}, {1, 1}, true, true});
}
TEST(PoolNumerics, AverageNoPad) { run_pool_case({"AveragePool", 5, 5, 2, 3, {1, 2}, {0, 0, 0, 0}, {1, 1}, false, true}); }

// Values and flat indices against a direct loop (the first position of the
// maximum in row-major window order): a ramp on a small plane, and a plane
// large enough for tiles that read no padding, half of it zeros (ReLU's
// output), so most windows tie.
TEST(PoolNumerics, MaxPoolIndices) {
  struct Case {
    std::vector<int64_t> shape, kernel, strides, pads;
    bool ties;
  };
  for (const Case& c : {Case{{2, 2, 4, 5}, {2, 3}, {2, 2}, {0, 1, 0, 1}, false},
                        Case{{1, 3, 20, 37}, {3, 3}, {2, 2}, {1, 1, 1, 1}, true}}) {
    Graph g;
    Value* x = g.add_input("x", tt(DType::kFloat32, Shape(c.shape.begin(), c.shape.end())));
    Node* node = g.add_node("MaxPool", {x}, {"y", "idx"});
    node->set_attr("kernel_shape", Attribute::of_ints(c.kernel));
    node->set_attr("strides", Attribute::of_ints(c.strides));
    node->set_attr("pads", Attribute::of_ints(c.pads));
    ASSERT_TRUE(infer(g).is_ok());
    const int64_t planes = c.shape[0] * c.shape[1], h = c.shape[2], w = c.shape[3];
    const int64_t oh = (h + c.pads[0] + c.pads[2] - c.kernel[0]) / c.strides[0] + 1;
    const int64_t ow = (w + c.pads[1] + c.pads[3] - c.kernel[1]) / c.strides[1] + 1;
    ASSERT_EQ(node->output(1)->type().static_shape(), (std::vector<int64_t>{c.shape[0], c.shape[1], oh, ow}));
    std::vector<double> xv = ramp(planes * h * w, -1, 1, 12);
    if (c.ties)
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::max(0.0, std::sin(0.7 * static_cast<double>(i)));
    auto out = run_node(g, *node, {make_tensor(DType::kFloat32, c.shape, xv)});
    ASSERT_EQ(out.size(), 2u);
    std::vector<double> want_v, want_i;
    for (int64_t pc = 0; pc < planes; ++pc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double mx = -INFINITY;
          int64_t arg = -1;
          for (int64_t r = 0; r < c.kernel[0]; ++r)
            for (int64_t q = 0; q < c.kernel[1]; ++q) {
              int64_t ih = i * c.strides[0] - c.pads[0] + r, iw = j * c.strides[1] - c.pads[1] + q;
              if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
              int64_t flat = (pc * h + ih) * w + iw;
              double v = static_cast<float>(xv[flat]);
              if (v > mx) {
                mx = v;
                arg = flat;
              }
            }
          want_v.push_back(mx);
          want_i.push_back(static_cast<double>(arg));
        }
    expect_close(out[0], want_v, 1e-6, "values");
    expect_close(out[1], want_i, 0, "indices");
  }
}

TEST(PoolNumerics, GlobalAverageAndMaxAndLp) {
  std::vector<double> xv = ramp(2 * 3 * 5 * 3, -1, 1, 13);
  for (std::string op : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) {
    Graph g;
    Value* x = g.add_input("x", tt(DType::kFloat32, {2, 3, 5, 3}));
    Node* node = g.add_node(op, {x}, {"y"});
    ASSERT_TRUE(infer(g).is_ok());
    ASSERT_EQ(node->output(0)->type().static_shape(), (std::vector<int64_t>{2, 3, 1, 1}));
    auto out = run_node(g, *node, {make_tensor(DType::kFloat32, {2, 3, 5, 3}, xv)});
    ASSERT_EQ(out.size(), 1u);
    std::vector<double> ref;
    for (int64_t pc = 0; pc < 6; ++pc) {
      double s = 0, mx = -INFINITY, sq = 0;
      for (int64_t e = 0; e < 15; ++e) {
        double v = xv[pc * 15 + e];
        s += v;
        mx = std::max(mx, v);
        sq += v * v;
      }
      ref.push_back(op == "GlobalAveragePool" ? s / 15 : op == "GlobalMaxPool" ? mx : std::sqrt(sq));
    }
    expect_close(out[0], ref, 1e-5, op);
  }
}

// ---- MatMul, Gemm -----------------------------------------------------------------------------

TEST(MatMulNumerics, BatchBroadcast) {
  // [2, 1, 3, 4] x [3, 4, 5] -> [2, 3, 3, 5]
  Graph g;
  Value* a = g.add_input("a", tt(DType::kFloat32, {2, 1, 3, 4}));
  Value* b = g.add_input("b", tt(DType::kFloat32, {3, 4, 5}));
  Node* node = g.add_node("MatMul", {a, b}, {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(node->output(0)->type().static_shape(), (std::vector<int64_t>{2, 3, 3, 5}));
  std::vector<double> av = ramp(24, -1, 1, 14), bv = ramp(60, -1, 1, 15);
  auto out = run_node(g, *node, {make_tensor(DType::kFloat32, {2, 1, 3, 4}, av), make_tensor(DType::kFloat32, {3, 4, 5}, bv)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 3; ++q)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          double s = 0;
          for (int64_t k = 0; k < 4; ++k) s += av[(p * 3 + i) * 4 + k] * bv[(q * 4 + k) * 5 + j];
          ref.push_back(s);
        }
  expect_close(out[0], ref, 1e-5, "matmul");
}

TEST(MatMulNumerics, SymbolicBatchAndVectorOperand) {
  Graph g;
  g.bounds["b"] = Interval{1, std::nullopt};
  Value* a = g.add_input("a", tt(DType::kFloat32, {var("b"), 3, 4}));
  Value* v = g.add_input("v", tt(DType::kFloat32, {4}));
  Node* node = g.add_node("MatMul", {a, v}, {"y"});
  ASSERT_TRUE(infer(g).is_ok());
  EXPECT_EQ(shape_to_string(*node->output(0)->type().shape), "[b, 3]");
  std::vector<double> av = ramp(2 * 12, -1, 1, 16), vv = ramp(4, -1, 1, 17);
  auto out = run_node(g, *node, {make_tensor(DType::kFloat32, {2, 3, 4}, av), make_tensor(DType::kFloat32, {4}, vv)},
                      {{"b", 2}});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t r = 0; r < 6; ++r) {
    double s = 0;
    for (int64_t k = 0; k < 4; ++k) s += av[r * 4 + k] * vv[k];
    ref.push_back(s);
  }
  expect_close(out[0], ref, 1e-5, "matvec");
}

void run_gemm(bool ta, bool tb, double alpha, double beta, std::vector<int64_t> c_shape) {
  SCOPED_TRACE(::testing::Message() << "gemm transA=" << ta << " transB=" << tb << " alpha=" << alpha << " beta=" << beta
                                    << " C" << shape_to_string(c_shape));
  int64_t m = 3, k = 5, n = 4;
  std::vector<int64_t> as = ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k};
  std::vector<int64_t> bs = tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  Graph g;
  Value* a = g.add_input("a", tt(DType::kFloat32, static_shape(as)));
  Value* b = g.add_input("b", tt(DType::kFloat32, static_shape(bs)));
  std::vector<Value*> ins = {a, b};
  int64_t cn = 1;
  for (int64_t d : c_shape) cn *= d;
  if (!c_shape.empty() || cn == 1) ins.push_back(g.add_input("c", tt(DType::kFloat32, static_shape(c_shape))));
  Node* node = g.add_node("Gemm", ins, {"y"});
  node->set_attr("transA", Attribute::of_int(ta));
  node->set_attr("transB", Attribute::of_int(tb));
  node->set_attr("alpha", Attribute::of_float(alpha));
  node->set_attr("beta", Attribute::of_float(beta));
  ASSERT_TRUE(infer(g).is_ok());
  ASSERT_EQ(node->output(0)->type().static_shape(), (std::vector<int64_t>{m, n}));
  std::vector<double> av = ramp(m * k, -1, 1, 18), bv = ramp(k * n, -1, 1, 19), cv = ramp(cn, -1, 1, 20);
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat32, as, av), make_tensor(DType::kFloat32, bs, bv),
                                make_tensor(DType::kFloat32, c_shape, cv)};
  auto out = run_node(g, *node, inputs);
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> ref;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += (ta ? av[q * m + i] : av[i * k + q]) * (tb ? bv[j * k + q] : bv[q * n + j]);
      double cval;
      if (c_shape.size() == 2) {
        cval = cv[(c_shape[0] == 1 ? 0 : i) * c_shape[1] + (c_shape[1] == 1 ? 0 : j)];
      } else if (c_shape.size() == 1) {
        cval = cv[c_shape[0] == 1 ? 0 : j];
      } else {
        cval = cv[0];
      }
      ref.push_back(alpha * s + beta * cval);
    }
  expect_close(out[0], ref, 1e-5, "gemm");
}

TEST(GemmNumerics, Plain) { run_gemm(false, false, 1.0, 1.0, {3, 4}); }
TEST(GemmNumerics, TransAWithRowBias) { run_gemm(true, false, 0.5, 2.0, {4}); }
TEST(GemmNumerics, TransBColumnBias) { run_gemm(false, true, 1.0, 1.0, {3, 1}); }
TEST(GemmNumerics, BothTransScalarBias) { run_gemm(true, true, 1.5, -1.0, {}); }

// Integer Gemm with fractional alpha and beta: scaled in f64 and truncated
// once, as the ONNX reference does (casting alpha = 0.25 to int gave zeros).
TEST(GemmNumerics, IntegerWithFractionalScales) {
  Graph g;
  Value* a = g.add_input("a", tt(DType::kInt32, {2, 3}));
  Value* b = g.add_input("b", tt(DType::kInt32, {3, 2}));
  Value* c = g.add_input("c", tt(DType::kInt32, {2}));
  Node* node = g.add_node("Gemm", {a, b, c}, {"y"});
  node->set_attr("alpha", Attribute::of_float(0.25));
  node->set_attr("beta", Attribute::of_float(0.5));
  ASSERT_TRUE(infer(g).is_ok());
  std::vector<double> av = {1, 2, 3, 4, 5, 6}, bv = {7, -8, 9, 10, -11, 12}, cv = {3, -5};
  auto out = run_node(g, *node, {make_tensor(DType::kInt32, {2, 3}, av), make_tensor(DType::kInt32, {3, 2}, bv),
                                 make_tensor(DType::kInt32, {2}, cv)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      double acc = 0;
      for (int q = 0; q < 3; ++q) acc += av[i * 3 + q] * bv[q * 2 + j];
      want.push_back(std::trunc(0.25 * acc + 0.5 * cv[j]));
    }
  expect_close(out[0], want, 0, "integer gemm");
}


// ---- Einsum -------------------------------------------------------------------------------------

Tensor run_einsum(const std::string& eq, const std::vector<std::vector<int64_t>>& shapes,
                  const std::vector<std::vector<double>>& data, std::vector<int64_t> want_shape) {
  Graph g;
  std::vector<Value*> ins;
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string name = "x";
    name += std::to_string(i);
    ins.push_back(g.add_input(name, tt(DType::kFloat32, static_shape(shapes[i]))));
    tensors.push_back(make_tensor(DType::kFloat32, shapes[i], data[i]));
  }
  Node* n = g.add_node("Einsum", ins, {"y"});
  n->set_attr("equation", Attribute::of_string(eq));
  Status st = infer(g);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return Tensor();
  EXPECT_EQ(n->output(0)->type().static_shape(), want_shape) << eq;
  auto out = run_node(g, *n, tensors);
  return out.empty() ? Tensor() : out[0];
}

TEST(EinsumNumerics, BatchMatmulWithEllipsisBroadcast) {
  // "...ij,...jk->...ik" with batch [2, 1] x [3]: output batch [2, 3].
  std::vector<double> a = ramp(2 * 1 * 3 * 4, -1, 1, 30), b = ramp(3 * 4 * 2, -1, 1, 31);
  Tensor y = run_einsum("...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}, {a, b}, {2, 3, 3, 2});
  std::vector<double> ref;
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 3; ++q)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t k = 0; k < 2; ++k) {
          double s = 0;
          for (int64_t j = 0; j < 4; ++j) s += a[(p * 3 + i) * 4 + j] * b[(q * 4 + j) * 2 + k];
          ref.push_back(s);
        }
  expect_close(y, ref, 1e-5, "einsum batch matmul");
}

TEST(EinsumNumerics, DiagonalTransposeSumAndImplicitOutput) {
  std::vector<double> m = ramp(9, -1, 1, 32);
  Tensor diag = run_einsum("ii->i", {{3, 3}}, {m}, {3});
  expect_close(diag, {m[0], m[4], m[8]}, 1e-6, "diagonal");
  std::vector<double> x = ramp(6, -1, 1, 33);
  Tensor tr = run_einsum("ij", {{2, 3}}, {x}, {2, 3});  // implicit: letters sorted, "ij"
  expect_close(tr, x, 1e-6, "implicit identity");
  Tensor t2 = run_einsum("ji", {{2, 3}}, {x}, {3, 2});  // implicit output "ij" transposes
  expect_close(t2, {x[0], x[3], x[1], x[4], x[2], x[5]}, 1e-6, "implicit transpose");
  Tensor total = run_einsum("ij->", {{2, 3}}, {x}, {});
  double s = 0;
  for (double v : x) s += v;
  expect_close(total, {s}, 1e-6, "sum");
  std::vector<double> u = ramp(4, -1, 1, 34), v = ramp(4, -1, 1, 35);
  Tensor outer = run_einsum("i,j->ij", {{4}, {4}}, {u, v}, {4, 4});
  std::vector<double> ref;
  for (double a : u)
    for (double b : v) ref.push_back(a * b);
  expect_close(outer, ref, 1e-6, "outer");
}
}  // namespace
}  // namespace kiln::ops::testing
