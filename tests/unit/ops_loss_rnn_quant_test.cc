// Losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), quantization
// (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
// QLinearMatMul, ConvInteger, QLinearConv) and the recurrent layers (RNN,
// GRU, LSTM). The compiled ops run through their lowering, both schedules and
// the loop-IR interpreter; the recurrent layers' runtime kernels are called
// directly. Everything is compared against direct C++ references written from
// the ONNX spec.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::expect_close;
using testing::make_tensor;
using testing::ramp;
using testing::run_node;
using testing::to_vector;
using testing::tt;

Shape static_shape(const std::vector<int64_t>& s) {
  Shape out;
  for (int64_t d : s) out.push_back(Expr(d));
  return out;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---- Losses -------------------------------------------------------------------------------------

struct LossCase {
  const char* op;
  std::string reduction;
  bool weighted;
  bool ignore;
  int64_t ignore_index;
  std::vector<int64_t> x_shape;  // [N, C, d...]
};

// Reference per the spec: log_softmax over dim 1 for SCE; loss = -logp[n, t, d] * w[t],
// 0 for ignored; mean divides by the sum of the selected weights.
void check_loss(const LossCase& lc) {
  Graph g;
  g.opsets[""] = 13;
  const auto& xs = lc.x_shape;
  int64_t N = xs[0], C = xs[1];
  int64_t D = numel(xs) / (N * C);
  std::vector<int64_t> ts = {N};
  ts.insert(ts.end(), xs.begin() + 2, xs.end());
  std::vector<Value*> ins = {g.add_input("x", tt(DType::kFloat32, static_shape(xs))),
                             g.add_input("t", tt(DType::kInt64, static_shape(ts)))};
  if (lc.weighted) ins.push_back(g.add_input("w", tt(DType::kFloat32, {C})));
  bool sce = std::string(lc.op) == "SoftmaxCrossEntropyLoss";
  std::vector<std::string> outs = {"loss"};
  if (sce) outs.push_back("log_prob");
  Node* n = g.add_node(lc.op, ins, outs);
  n->set_attr("reduction", Attribute::of_string(lc.reduction));
  if (lc.ignore) n->set_attr("ignore_index", Attribute::of_int(lc.ignore_index));
  ASSERT_TRUE(testing::infer(g).is_ok());

  std::vector<double> x = ramp(numel(xs), -3, 2, 5);
  std::vector<double> t;
  for (int64_t i = 0; i < numel(ts); ++i) t.push_back(static_cast<double>((i * 7 + 3) % C));
  if (lc.ignore) t[1] = static_cast<double>(lc.ignore_index), t[numel(ts) - 1] = static_cast<double>(lc.ignore_index);
  std::vector<double> w = ramp(C, 0.2, 2.0, 9);
  std::vector<Tensor> inputs = {make_tensor(DType::kFloat32, xs, x), make_tensor(DType::kInt64, ts, t)};
  if (lc.weighted) inputs.push_back(make_tensor(DType::kFloat32, {C}, w));
  std::vector<Tensor> got = run_node(g, *n, inputs);
  ASSERT_EQ(got.size(), outs.size());

  // x index [n, c, d] with d the flattened trailing dims.
  auto xi = [&](int64_t nn, int64_t c, int64_t d) { return (nn * C + c) * D + d; };
  std::vector<double> logp = x;
  if (sce) {
    for (int64_t nn = 0; nn < N; ++nn)
      for (int64_t d = 0; d < D; ++d) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; ++c) m = std::max(m, x[xi(nn, c, d)]);
        for (int64_t c = 0; c < C; ++c) s += std::exp(x[xi(nn, c, d)] - m);
        for (int64_t c = 0; c < C; ++c) logp[xi(nn, c, d)] = x[xi(nn, c, d)] - m - std::log(s);
      }
    expect_close(got[1], logp, 1e-5, "log_prob");
  }
  std::vector<double> loss;
  double sum = 0, wsum = 0;
  for (int64_t nn = 0; nn < N; ++nn)
    for (int64_t d = 0; d < D; ++d) {
      int64_t tv = static_cast<int64_t>(t[nn * D + d]);
      bool ignored = lc.ignore && tv == lc.ignore_index;
      double wv = ignored ? 0 : lc.weighted ? w[tv] : 1;
      double l = ignored ? 0 : -logp[xi(nn, tv, d)] * wv;
      loss.push_back(l);
      sum += l;
      wsum += wv;
    }
  if (lc.reduction == "none") {
    expect_close(got[0], loss, 1e-5, "loss");
  } else if (lc.reduction == "sum") {
    expect_close(got[0], {sum}, 1e-5, "loss");
  } else {
    expect_close(got[0], {sum / wsum}, 1e-5, "loss");
  }
}

TEST(LossNumeric, NllReductionsWeightsIgnoreIndex) {
  for (const char* red : {"none", "sum", "mean"}) {
    for (bool weighted : {false, true}) {
      for (bool ignore : {false, true}) {
        SCOPED_TRACE(std::string(red) + (weighted ? " weighted" : "") + (ignore ? " ignore" : ""));
        check_loss({"NegativeLogLikelihoodLoss", red, weighted, ignore, 1, {3, 4, 2, 3}});
      }
    }
  }
}

TEST(LossNumeric, NllTwoDimsAndOutOfRangeIgnoreIndex) {
  check_loss({"NegativeLogLikelihoodLoss", "mean", true, true, -1, {5, 3}});
  check_loss({"NegativeLogLikelihoodLoss", "mean", false, true, 10, {2, 3, 4}});
}

TEST(LossNumeric, SoftmaxCrossEntropyWithLogProb) {
  for (const char* red : {"none", "sum", "mean"}) {
    for (bool weighted : {false, true}) {
      SCOPED_TRACE(std::string(red) + (weighted ? " weighted" : ""));
      check_loss({"SoftmaxCrossEntropyLoss", red, weighted, true, 2, {2, 5, 3}});
      check_loss({"SoftmaxCrossEntropyLoss", red, weighted, false, 0, {4, 3}});
    }
  }
}

TEST(LossInfer, ShapesAndErrors) {
  Graph g;
  Value* x = g.add_input("x", tt(DType::kFloat32, {var("n"), 4, 7}));
  Value* t = g.add_input("t", tt(DType::kInt64, {var("n"), 7}));
  Node* a = g.add_node("SoftmaxCrossEntropyLoss", {x, t}, {"l", "lp"});
  a->set_attr("reduction", Attribute::of_string("none"));
  Node* b = g.add_node("NegativeLogLikelihoodLoss", {x, t}, {"m"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(shape_to_string(*a->output(0)->type().shape), "[n, 7]");
  EXPECT_EQ(shape_to_string(*a->output(1)->type().shape), "[n, 4, 7]");
  EXPECT_TRUE(b->output(0)->type().shape->empty());

  Graph bad;
  Value* bx = bad.add_input("x", tt(DType::kFloat32, {2, 3}));
  Value* bt = bad.add_input("t", tt(DType::kInt64, {2, 3}));
  bad.add_node("NegativeLogLikelihoodLoss", {bx, bt}, {"l"});
  EXPECT_FALSE(testing::infer(bad).is_ok());
}

// ---- Quantization ---------------------------------------------------------------------------------

double ref_quantize(double x, double scale, double zp, double lo, double hi) {
  double q = std::nearbyint(static_cast<float>(x) / static_cast<float>(scale)) + zp;
  return std::min(hi, std::max(lo, q));
}

TEST(QuantNumeric, QuantizeLinearPerTensorTiesAndSaturation) {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", tt(DType::kFloat32, {8}));
  Value* s = g.add_input("s", tt(DType::kFloat32, {}));
  Value* z = g.add_input("z", tt(DType::kUInt8, {}));
  Node* n = g.add_node("QuantizeLinear", {x, s, z}, {"y"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(n->output(0)->dtype(), DType::kUInt8);
  // x / 2: 2.5 -> 2, 3.5 -> 4, -0.5 -> -0 (ties to even), then + 10, saturated to [0, 255].
  std::vector<double> xv = {5, 7, -1, 1000, -100, 3, 0, 254};
  auto got = run_node(g, *n, {make_tensor(DType::kFloat32, {8}, xv), make_tensor(DType::kFloat32, {}, {2}),
                              make_tensor(DType::kUInt8, {}, {10})});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(to_vector(got[0]), (std::vector<double>{12, 14, 10, 255, 0, 12, 10, 137}));
}

// 4-bit and float8 targets: int4 saturates to [-8, 7] after rounding; float8
// e4m3fn keeps the scaled value to 3 mantissa bits and saturates at 448 (or
// becomes NaN with saturate=0); DequantizeLinear widens both back.
TEST(QuantNumeric, FourBitAndFloat8QuantizeAndDequantize) {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", tt(DType::kFloat32, {6}));
  Value* s = g.add_input("s", tt(DType::kFloat32, {}));
  Value* z4 = g.add_input("z4", tt(DType::kInt4, {}));
  Value* z8 = g.add_input("z8", tt(DType::kFloat8E4M3FN, {}));
  Node* q4 = g.add_node("QuantizeLinear", {x, s, z4}, {"q4"});
  Node* d4 = g.add_node("DequantizeLinear", {q4->output(0), s, z4}, {"d4"});
  Node* q8 = g.add_node("QuantizeLinear", {x, s, z8}, {"q8"});
  Node* q8n = g.add_node("QuantizeLinear", {x, s, z8}, {"q8n"});
  q8n->set_attr("saturate", Attribute::of_int(0));
  Node* d8 = g.add_node("DequantizeLinear", {q8->output(0), s, z8}, {"d8"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(q4->output(0)->dtype(), DType::kInt4);
  std::vector<double> xv = {1, 5, -7, 30, -40, 2000};
  Tensor xt = make_tensor(DType::kFloat32, {6}, xv), st = make_tensor(DType::kFloat32, {}, {2});
  Tensor z4t = make_tensor(DType::kInt4, {}, {1}), z8t = make_tensor(DType::kFloat8E4M3FN, {}, {0});
  // x / 2 = 0.5, 2.5, -3.5, 15, -20, 1000 -> round half even 0, 2, -4, 15, -20, 1000 -> + 1, saturate.
  Tensor q4v = run_node(g, *q4, {xt, st, z4t}).at(0);
  EXPECT_EQ(to_vector(q4v), (std::vector<double>{1, 3, -3, 7, -8, 7}));
  EXPECT_EQ(to_vector(run_node(g, *d4, {q4v, st, z4t}).at(0)), (std::vector<double>{0, 4, -8, 12, -18, 12}));
  // e4m3fn: 0.5, 2.5, -3.5, 15, -20 are exact; 1000 saturates to 448.
  Tensor q8v = run_node(g, *q8, {xt, st, z8t}).at(0);
  EXPECT_EQ(to_vector(q8v), (std::vector<double>{0.5, 2.5, -3.5, 15, -20, 448}));
  auto nosat = to_vector(run_node(g, *q8n, {xt, st, z8t}).at(0));
  EXPECT_TRUE(std::isnan(nosat[5])) << nosat[5];
  EXPECT_EQ(to_vector(run_node(g, *d8, {q8v, st, z8t}).at(0)), (std::vector<double>{1, 5, -7, 30, -40, 896}));
}

TEST(QuantNumeric, QuantizeLinearPerAxisAndBlocked) {
  for (DType out : {DType::kInt8, DType::kUInt16, DType::kInt16}) {
    SCOPED_TRACE(dtype_name(out));
    auto [lo, hi] = out == DType::kInt8 ? std::pair{-128.0, 127.0}
                    : out == DType::kUInt16 ? std::pair{0.0, 65535.0} : std::pair{-32768.0, 32767.0};
    // Per axis 1 of [2, 3, 4].
    Graph g;
    g.opsets[""] = 21;
    Value* x = g.add_input("x", tt(DType::kFloat32, {2, 3, 4}));
    Value* s = g.add_input("s", tt(DType::kFloat32, {3}));
    Value* z = g.add_input("z", tt(out, {3}));
    Node* n = g.add_node("QuantizeLinear", {x, s, z}, {"y"});
    ASSERT_TRUE(testing::infer(g).is_ok());
    std::vector<double> xv = ramp(24, -300, 300, 3), sv = {0.5, 2.0, 1.5}, zv = {-3, 5, 0};
    if (out == DType::kUInt16) zv = {3, 5, 0};
    auto got = run_node(g, *n, {make_tensor(DType::kFloat32, {2, 3, 4}, xv), make_tensor(DType::kFloat32, {3}, sv),
                                make_tensor(out, {3}, zv)});
    std::vector<double> want;
    for (int64_t i = 0; i < 24; ++i) want.push_back(ref_quantize(xv[i], sv[(i / 4) % 3], zv[(i / 4) % 3], lo, hi));
    expect_close(got[0], want, 0, "per axis");

    // Blocked along axis 1 of [3, 5] with block 2 (the last block is partial); no zero point.
    Graph b;
    b.opsets[""] = 21;
    Value* bx = b.add_input("x", tt(DType::kFloat32, {3, 5}));
    Value* bs = b.add_input("s", tt(DType::kFloat32, {3, 3}));
    Node* bn = b.add_node("QuantizeLinear", {bx, bs}, {"y"});
    bn->set_attr("axis", Attribute::of_int(1));
    bn->set_attr("block_size", Attribute::of_int(2));
    bn->set_attr("output_dtype", Attribute::of_int(static_cast<int64_t>(out)));
    ASSERT_TRUE(testing::infer(b).is_ok());
    ASSERT_EQ(bn->output(0)->dtype(), out);
    std::vector<double> bxv = ramp(15, -40, 40, 4), bsv = ramp(9, 0.1, 2, 6);
    auto bgot = run_node(b, *bn, {make_tensor(DType::kFloat32, {3, 5}, bxv), make_tensor(DType::kFloat32, {3, 3}, bsv)});
    std::vector<double> bwant;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) bwant.push_back(ref_quantize(bxv[i * 5 + j], bsv[i * 3 + j / 2], 0, lo, hi));
    expect_close(bgot[0], bwant, 0, "blocked");
  }
}

TEST(QuantNumeric, DequantizeLinearPerAxisBlockedAndI32) {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", tt(DType::kInt8, {2, 4}));
  Value* s = g.add_input("s", tt(DType::kFloat32, {2}));
  Value* z = g.add_input("z", tt(DType::kInt8, {2}));
  Node* n = g.add_node("DequantizeLinear", {x, s, z}, {"y"});
  n->set_attr("axis", Attribute::of_int(0));
  ASSERT_TRUE(testing::infer(g).is_ok());
  std::vector<double> xv = {-128, -1, 0, 127, 5, 6, -7, 100};
  auto got = run_node(g, *n, {make_tensor(DType::kInt8, {2, 4}, xv), make_tensor(DType::kFloat32, {2}, {0.5, 0.25}),
                              make_tensor(DType::kInt8, {2}, {-128, 3})});
  expect_close(got[0], {0, 63.5, 64, 127.5, 0.5, 0.75, -2.5, 24.25}, 0, "per axis");

  Graph b;
  b.opsets[""] = 21;
  Value* bx = b.add_input("x", tt(DType::kUInt8, {4, 2}));
  Value* bs = b.add_input("s", tt(DType::kFloat32, {2, 2}));
  Value* bz = b.add_input("z", tt(DType::kUInt8, {2, 2}));
  Node* bn = b.add_node("DequantizeLinear", {bx, bs, bz}, {"y"});
  bn->set_attr("axis", Attribute::of_int(0));
  bn->set_attr("block_size", Attribute::of_int(2));
  ASSERT_TRUE(testing::infer(b).is_ok());
  std::vector<double> bxv = {10, 20, 30, 40, 50, 60, 255, 0}, bsv = {1, 2, 3, 4}, bzv = {10, 0, 5, 1};
  auto bgot = run_node(b, *bn, {make_tensor(DType::kUInt8, {4, 2}, bxv), make_tensor(DType::kFloat32, {2, 2}, bsv),
                                make_tensor(DType::kUInt8, {2, 2}, bzv)});
  std::vector<double> bwant;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j) bwant.push_back((bxv[i * 2 + j] - bzv[(i / 2) * 2 + j]) * bsv[(i / 2) * 2 + j]);
  expect_close(bgot[0], bwant, 0, "blocked");

  Graph c;
  c.opsets[""] = 13;
  Value* cx = c.add_input("x", tt(DType::kInt32, {3}));
  Value* cs = c.add_input("s", tt(DType::kFloat32, {}));
  Node* cn = c.add_node("DequantizeLinear", {cx, cs}, {"y"});
  ASSERT_TRUE(testing::infer(c).is_ok());
  auto cgot = run_node(c, *cn, {make_tensor(DType::kInt32, {3}, {-100000, 0, 77}), make_tensor(DType::kFloat32, {}, {0.5})});
  expect_close(cgot[0], {-50000, 0, 38.5}, 0, "i32");
}

TEST(QuantNumeric, DynamicQuantizeLinear) {
  Graph g;
  g.opsets[""] = 11;
  Value* x = g.add_input("x", tt(DType::kFloat32, {2, 5}));
  Node* n = g.add_node("DynamicQuantizeLinear", {x}, {"y", "s", "z"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  for (auto [lo, hi] : {std::pair{-2.0, 5.0}, std::pair{1.0, 3.0}, std::pair{-4.0, -1.0}}) {
    std::vector<double> xv = ramp(10, lo, hi, 8);
    auto got = run_node(g, *n, {make_tensor(DType::kFloat32, {2, 5}, xv)});
    ASSERT_EQ(got.size(), 3u);
    float mn = 0, mx = 0;
    for (double v : xv) mn = std::min(mn, static_cast<float>(v)), mx = std::max(mx, static_cast<float>(v));
    float scale = (mx - mn) / 255.0f;
    double zp = std::min(255.0, std::max(0.0, static_cast<double>(std::nearbyint(0.0f - mn / scale))));
    expect_close(got[1], {scale}, 0, "scale");
    expect_close(got[2], {zp}, 0, "zero point");
    std::vector<double> want;
    for (double v : xv) want.push_back(ref_quantize(v, scale, zp, 0, 255));
    expect_close(got[0], want, 0, "y");
  }
}

// sum_k (a[m, k] - azp[m]) * (b[k, n] - bzp[n]) for row-major a [M, K], b [K, N].
std::vector<double> ref_int_matmul(int64_t M, int64_t K, int64_t N, const std::vector<double>& a,
                                   const std::vector<double>& b, const std::vector<double>& azp,
                                   const std::vector<double>& bzp) {
  std::vector<double> y;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += (a[m * K + k] - azp[azp.size() == 1 ? 0 : m]) * (b[k * N + n] - bzp[bzp.size() == 1 ? 0 : n]);
      y.push_back(acc);
    }
  return y;
}

TEST(QuantNumeric, MatMulIntegerPerRowAndColumnZeroPoints) {
  Graph g;
  g.opsets[""] = 10;
  Value* a = g.add_input("a", tt(DType::kUInt8, {3, 4}));
  Value* b = g.add_input("b", tt(DType::kInt8, {4, 5}));
  Value* az = g.add_input("az", tt(DType::kUInt8, {3}));
  Value* bz = g.add_input("bz", tt(DType::kInt8, {5}));
  Node* n = g.add_node("MatMulInteger", {a, b, az, bz}, {"y"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(n->output(0)->dtype(), DType::kInt32);
  std::vector<double> av, bv, azv = {0, 128, 255}, bzv = {-128, 0, 127, 3, -3};
  for (double v : ramp(12, 0, 256, 1)) av.push_back(std::floor(v));
  for (double v : ramp(20, -128, 128, 2)) bv.push_back(std::floor(v));
  auto got = run_node(g, *n, {make_tensor(DType::kUInt8, {3, 4}, av), make_tensor(DType::kInt8, {4, 5}, bv),
                              make_tensor(DType::kUInt8, {3}, azv), make_tensor(DType::kInt8, {5}, bzv)});
  expect_close(got[0], ref_int_matmul(3, 4, 5, av, bv, azv, bzv), 0, "y");
}

// The spec's definition, in real numbers: y = saturate(round_half_even(
// sum_k (a_scale (a - a_zp)) (b_scale (b - b_zp)) / y_scale) + y_zp), computed
// in double from the dequantized operands (not the kernel's integer
// accumulator and combined multiplier). Scales are powers of two, so the
// double arithmetic is exact and ties are real ties.
std::vector<double> ref_qlinear_matmul(int64_t batch, int64_t M, int64_t K, int64_t N, const std::vector<double>& a,
                                       double as, double az, const std::vector<double>& b, double bs, double bz,
                                       double ys, double yz) {
  std::vector<double> y;
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double real = 0;
        for (int64_t k = 0; k < K; ++k) real += (as * (a[(p * M + i) * K + k] - az)) * (bs * (b[k * N + j] - bz));
        y.push_back(std::min(127.0, std::max(-128.0, std::nearbyint(real / ys) + yz)));
      }
  return y;
}

TEST(QuantNumeric, QLinearMatMulBatched) {
  Graph g;
  g.opsets[""] = 21;
  Value* a = g.add_input("a", tt(DType::kInt8, {2, 2, 3}));
  Value* as = g.add_input("as", tt(DType::kFloat32, {1}));
  Value* az = g.add_input("az", tt(DType::kInt8, {1}));
  Value* b = g.add_input("b", tt(DType::kInt8, {3, 4}));
  Value* bs = g.add_input("bs", tt(DType::kFloat32, {1}));
  Value* bz = g.add_input("bz", tt(DType::kInt8, {1}));
  Value* ys = g.add_input("ys", tt(DType::kFloat32, {1}));
  Value* yz = g.add_input("yz", tt(DType::kInt8, {1}));
  Node* n = g.add_node("QLinearMatMul", {a, as, az, b, bs, bz, ys, yz}, {"y"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  EXPECT_EQ(shape_to_string(*n->output(0)->type().shape), "[2, 2, 4]");
  std::vector<double> av, bv;
  for (double v : ramp(12, -128, 128, 1)) av.push_back(std::floor(v));
  for (double v : ramp(12, -128, 128, 2)) bv.push_back(std::floor(v));
  auto got = run_node(g, *n, {make_tensor(DType::kInt8, {2, 2, 3}, av), make_tensor(DType::kFloat32, {1}, {0.0625}),
                              make_tensor(DType::kInt8, {1}, {3}), make_tensor(DType::kInt8, {3, 4}, bv),
                              make_tensor(DType::kFloat32, {1}, {0.125}), make_tensor(DType::kInt8, {1}, {-2}),
                              make_tensor(DType::kFloat32, {1}, {0.5}), make_tensor(DType::kInt8, {1}, {-60})});
  std::vector<double> want = ref_qlinear_matmul(2, 2, 3, 4, av, 0.0625, 3, bv, 0.125, -2, 0.5, -60);
  // The case must exercise rounding and saturation at both ends, or it proves little.
  EXPECT_NE(std::count(want.begin(), want.end(), 127.0), 0);
  EXPECT_NE(std::count(want.begin(), want.end(), -128.0), 0);
  EXPECT_NE(std::count_if(want.begin(), want.end(), [](double v) { return v > -128 && v < 127; }), 0);
  expect_close(got[0], want, 0, "y");
}

// The onnx package's test_qlinearmatmul_2D_int8_float32 inputs. Its expected
// output wraps y[1][2] = -235.7 to 20 (the reference casts with numpy's
// astype); the spec saturates, and so does ONNX Runtime 1.31.1, whose output
// is this one.
TEST(QuantNumeric, QLinearMatMulSaturatesLikeOnnxRuntime) {
  Graph g;
  g.opsets[""] = 21;
  std::vector<Value*> ins = {g.add_input("a", tt(DType::kInt8, {2, 4})),  g.add_input("as", tt(DType::kFloat32, {1})),
                             g.add_input("az", tt(DType::kInt8, {1})),     g.add_input("b", tt(DType::kInt8, {4, 3})),
                             g.add_input("bs", tt(DType::kFloat32, {1})), g.add_input("bz", tt(DType::kInt8, {1})),
                             g.add_input("ys", tt(DType::kFloat32, {1})), g.add_input("yz", tt(DType::kInt8, {1}))};
  Node* n = g.add_node("QLinearMatMul", ins, {"y"});
  ASSERT_TRUE(testing::infer(g).is_ok());
  auto got = run_node(g, *n,
                      {make_tensor(DType::kInt8, {2, 4}, {81, 109, -127, 111, -124, 87, -128, -98}),
                       make_tensor(DType::kFloat32, {1}, {0.0066}), make_tensor(DType::kInt8, {1}, {-14}),
                       make_tensor(DType::kInt8, {4, 3}, {25, -76, 117, -67, -101, -128, -127, 0, 119, 0, 127, 120}),
                       make_tensor(DType::kFloat32, {1}, {0.00705}), make_tensor(DType::kInt8, {1}, {-13}),
                       make_tensor(DType::kFloat32, {1}, {0.0107}), make_tensor(DType::kInt8, {1}, {-9})});
  expect_close(got[0], {41, -12, -9, 1, -75, -128}, 0, "y");
}

// Direct 2-D convolution of (x - xzp) and (w - wzp[m]) with zero padding after the shift.
std::vector<double> ref_int_conv(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                                 const std::vector<double>& x, const std::vector<double>& w, double xzp,
                                 const std::vector<double>& wzp, int64_t pad, int64_t stride) {
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], M = ws[0], KH = ws[2], KW = ws[3];
  int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t ih = oh * stride + kh - pad, iw = ow * stride + kw - pad;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += (x[((n * C + c) * H + ih) * W + iw] - xzp) *
                       (w[((m * C + c) * KH + kh) * KW + kw] - wzp[wzp.size() == 1 ? 0 : m]);
              }
          y.push_back(acc);
        }
  return y;
}

TEST(QuantNumeric, ConvIntegerAndQLinearConvWithPadding) {
  std::vector<int64_t> xs = {1, 2, 5, 4}, ws = {3, 2, 3, 3};
  std::vector<double> xv, wv, wzp = {1, -2, 0};
  for (double v : ramp(numel(xs), 0, 256, 1)) xv.push_back(std::floor(v));
  for (double v : ramp(numel(ws), -128, 128, 2)) wv.push_back(std::floor(v));
  {
    Graph g;
    g.opsets[""] = 10;
    Value* x = g.add_input("x", tt(DType::kUInt8, static_shape(xs)));
    Value* w = g.add_input("w", tt(DType::kInt8, static_shape(ws)));
    Value* xz = g.add_input("xz", tt(DType::kUInt8, {}));
    Value* wz = g.add_input("wz", tt(DType::kInt8, {3}));
    Node* n = g.add_node("ConvInteger", {x, w, xz, wz}, {"y"});
    n->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
    n->set_attr("strides", Attribute::of_ints({2, 1}));
    ASSERT_TRUE(testing::infer(g).is_ok());
    EXPECT_EQ(shape_to_string(*n->output(0)->type().shape), "[1, 3, 3, 4]");  // per-dim strides
  }
  Graph g;
  g.opsets[""] = 10;
  Value* x = g.add_input("x", tt(DType::kUInt8, static_shape(xs)));
  Value* w = g.add_input("w", tt(DType::kInt8, static_shape(ws)));
  Value* xz = g.add_input("xz", tt(DType::kUInt8, {}));
  Value* wz = g.add_input("wz", tt(DType::kInt8, {3}));
  Node* n = g.add_node("ConvInteger", {x, w, xz, wz}, {"y"});
  n->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  n->set_attr("strides", Attribute::of_ints({2, 2}));
  ASSERT_TRUE(testing::infer(g).is_ok());
  auto got = run_node(g, *n, {make_tensor(DType::kUInt8, xs, xv), make_tensor(DType::kInt8, ws, wv),
                              make_tensor(DType::kUInt8, {}, {100}), make_tensor(DType::kInt8, {3}, wzp)});
  std::vector<double> acc = ref_int_conv(xs, ws, xv, wv, 100, wzp, 1, 2);
  expect_close(got[0], acc, 0, "ConvInteger");

  Graph q;
  q.opsets[""] = 10;
  std::vector<Value*> ins = {q.add_input("x", tt(DType::kUInt8, static_shape(xs))),
                             q.add_input("xs", tt(DType::kFloat32, {})),
                             q.add_input("xz", tt(DType::kUInt8, {})),
                             q.add_input("w", tt(DType::kInt8, static_shape(ws))),
                             q.add_input("ws", tt(DType::kFloat32, {3})),
                             q.add_input("wz", tt(DType::kInt8, {3})),
                             q.add_input("ys", tt(DType::kFloat32, {})),
                             q.add_input("yz", tt(DType::kUInt8, {})),
                             q.add_input("bias", tt(DType::kInt32, {3}))};
  Node* qn = q.add_node("QLinearConv", ins, {"y"});
  qn->set_attr("pads", Attribute::of_ints({1, 1, 1, 1}));
  qn->set_attr("strides", Attribute::of_ints({2, 2}));
  ASSERT_TRUE(testing::infer(q).is_ok());
  std::vector<double> wsv = {0.01, 0.02, 0.005}, bias = {-500, 0, 1200};
  auto qgot = run_node(q, *qn, {make_tensor(DType::kUInt8, xs, xv), make_tensor(DType::kFloat32, {}, {0.1}),
                                make_tensor(DType::kUInt8, {}, {100}), make_tensor(DType::kInt8, ws, wv),
                                make_tensor(DType::kFloat32, {3}, wsv), make_tensor(DType::kInt8, {3}, wzp),
                                make_tensor(DType::kFloat32, {}, {0.7}), make_tensor(DType::kUInt8, {}, {128}),
                                make_tensor(DType::kInt32, {3}, bias)});
  std::vector<double> want;
  int64_t per_m = static_cast<int64_t>(acc.size()) / 3;
  for (size_t i = 0; i < acc.size(); ++i) {
    int64_t m = static_cast<int64_t>(i) / per_m;
    float mult = 0.1f * static_cast<float>(wsv[m]) / 0.7f;
    double v = std::nearbyint((acc[i] + bias[m]) * static_cast<double>(mult)) + 128;
    want.push_back(std::min(255.0, std::max(0.0, v)));
  }
  expect_close(qgot[0], want, 0, "QLinearConv");
}

TEST(QuantLower, UnsupportedDtypesAreErrors) {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", tt(DType::kFloat32, {4}));
  Value* s = g.add_input("s", tt(DType::kFloat32, {}));
  Node* n = g.add_node("QuantizeLinear", {x, s}, {"y"});
  n->set_attr("output_dtype", Attribute::of_int(static_cast<int64_t>(DType::kInt32)));
  ASSERT_TRUE(testing::infer(g).is_ok());
  const OpDef* def = find_op("", "QuantizeLinear");
  LowerContext ctx;
  int counter = 0;
  ctx.name_counter = &counter;
  ctx.inputs = {tir::Buffer{"x", DType::kFloat32, {4}}, tir::Buffer{"s", DType::kFloat32, {}}};
  ctx.input_index = {0, 1};
  ctx.constants = {nullptr, nullptr};
  ctx.sym_values = {std::nullopt, std::nullopt};
  ctx.outputs = {tir::Buffer{"y", DType::kInt32, {4}}};
  auto r = def->lower(*n, ctx);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
}

// ---- Recurrent layers ----------------------------------------------------------------------------

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

std::vector<Tensor> run_kernel(const Node& n, const std::vector<Tensor>& inputs) {
  const OpDef* def = find_op(n.domain(), n.op_type());
  EXPECT_TRUE(def != nullptr && def->kernel);
  auto k = def->kernel(n);
  EXPECT_TRUE(k.is_ok()) << k.status().to_string();
  if (!k.is_ok()) return {};
  std::vector<Tensor> outs(n.num_outputs());
  Status st = (*k)(inputs, outs);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return outs;
}

// One recurrent node with graph inputs of the given shapes (empty shape: omitted input).
struct RnnGraph {
  Graph g;
  Node* n = nullptr;
};

std::unique_ptr<RnnGraph> rnn_graph(const std::string& op, const std::vector<std::vector<int64_t>>& shapes,
                                    int num_outputs) {
  auto r = std::make_unique<RnnGraph>();
  r->g.opsets[""] = 22;
  std::vector<Value*> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i].empty()) {
      ins.push_back(nullptr);
      continue;
    }
    DType dt = i == 4 ? DType::kInt32 : DType::kFloat32;
    ins.push_back(r->g.add_input("in" + std::to_string(i), tt(dt, static_shape(shapes[i]))));
  }
  std::vector<std::string> outs;
  for (int i = 0; i < num_outputs; ++i) outs.push_back("out" + std::to_string(i));
  r->n = r->g.add_node(op, ins, outs);
  return r;
}

// The spec's LSTM for one direction, forward in time, batch 1, layout 0.
void ref_lstm(int64_t S, int64_t I, int64_t H, const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& r, const std::vector<double>& b, const std::vector<double>& p,
              std::vector<double>& ys, std::vector<double>& h, std::vector<double>& c) {
  h.assign(H, 0);
  c.assign(H, 0);
  for (int64_t t = 0; t < S; ++t) {
    auto gate = [&](int64_t g, int64_t j) {
      double v = b[g * H + j] + b[4 * H + g * H + j];
      for (int64_t i = 0; i < I; ++i) v += x[t * I + i] * w[(g * H + j) * I + i];
      for (int64_t k = 0; k < H; ++k) v += h[k] * r[(g * H + j) * H + k];
      return v;
    };
    std::vector<double> nh(H), nc(H);
    for (int64_t j = 0; j < H; ++j) {
      double it = sigmoid(gate(0, j) + p[j] * c[j]);
      double ft = sigmoid(gate(2, j) + p[2 * H + j] * c[j]);
      double ct = std::tanh(gate(3, j));
      nc[j] = ft * c[j] + it * ct;
      double ot = sigmoid(gate(1, j) + p[H + j] * nc[j]);
      nh[j] = ot * std::tanh(nc[j]);
    }
    h = nh;
    c = nc;
    ys.insert(ys.end(), h.begin(), h.end());
  }
}

TEST(RnnKernel, LstmWithPeepholesMatchesReference) {
  int64_t S = 3, I = 2, H = 3;
  auto r = rnn_graph("LSTM", {{S, 1, I}, {1, 4 * H, I}, {1, 4 * H, H}, {1, 8 * H}, {}, {}, {}, {1, 3 * H}}, 3);
  r->n->set_attr("hidden_size", Attribute::of_int(H));
  ASSERT_TRUE(testing::infer(r->g).is_ok());
  EXPECT_EQ(shape_to_string(*r->n->output(0)->type().shape), "[3, 1, 1, 3]");
  std::vector<double> x = ramp(S * I, -1, 1, 1), w = ramp(4 * H * I, -0.5, 0.5, 2), rr = ramp(4 * H * H, -0.5, 0.5, 3),
                      b = ramp(8 * H, -0.2, 0.2, 4), p = ramp(3 * H, -0.3, 0.3, 5);
  auto outs = run_kernel(*r->n, {make_tensor(DType::kFloat32, {S, 1, I}, x), make_tensor(DType::kFloat32, {1, 4 * H, I}, w),
                                 make_tensor(DType::kFloat32, {1, 4 * H, H}, rr), make_tensor(DType::kFloat32, {1, 8 * H}, b),
                                 Tensor(), Tensor(), Tensor(), make_tensor(DType::kFloat32, {1, 3 * H}, p)});
  ASSERT_EQ(outs.size(), 3u);
  std::vector<double> ys, h, c;
  ref_lstm(S, I, H, x, w, rr, b, p, ys, h, c);
  expect_close(outs[0], ys, 1e-5, "Y");
  expect_close(outs[1], h, 1e-5, "Y_h");
  expect_close(outs[2], c, 1e-5, "Y_c");
}

TEST(RnnKernel, GruBothResetVariantsMatchReference) {
  int64_t S = 2, I = 3, H = 2, NB = 2;
  std::vector<double> x = ramp(S * NB * I, -1, 1, 6), w = ramp(3 * H * I, -0.7, 0.7, 7),
                      rr = ramp(3 * H * H, -0.7, 0.7, 8), b = ramp(6 * H, -0.3, 0.3, 9), h0 = ramp(NB * H, -0.5, 0.5, 10);
  for (int lbr = 0; lbr < 2; ++lbr) {
    SCOPED_TRACE(lbr);
    auto r = rnn_graph("GRU", {{S, NB, I}, {1, 3 * H, I}, {1, 3 * H, H}, {1, 6 * H}, {}, {1, NB, H}}, 2);
    r->n->set_attr("hidden_size", Attribute::of_int(H));
    r->n->set_attr("linear_before_reset", Attribute::of_int(lbr));
    ASSERT_TRUE(testing::infer(r->g).is_ok());
    auto outs = run_kernel(*r->n, {make_tensor(DType::kFloat32, {S, NB, I}, x), make_tensor(DType::kFloat32, {1, 3 * H, I}, w),
                                   make_tensor(DType::kFloat32, {1, 3 * H, H}, rr), make_tensor(DType::kFloat32, {1, 6 * H}, b),
                                   Tensor(), make_tensor(DType::kFloat32, {1, NB, H}, h0)});
    std::vector<double> ys(S * NB * H), hs = h0;
    for (int64_t t = 0; t < S; ++t) {
      std::vector<double> nh(NB * H);
      for (int64_t bb = 0; bb < NB; ++bb) {
        const double* hp = &hs[bb * H];
        auto xw = [&](int64_t g, int64_t j) {
          double v = b[g * H + j];
          for (int64_t i = 0; i < I; ++i) v += x[(t * NB + bb) * I + i] * w[(g * H + j) * I + i];
          return v;
        };
        auto hr = [&](int64_t g, int64_t j, const std::vector<double>& hv) {
          double v = b[3 * H + g * H + j];
          for (int64_t k = 0; k < H; ++k) v += hv[k] * rr[(g * H + j) * H + k];
          return v;
        };
        std::vector<double> hv(hp, hp + H), z(H), rg(H), rh(H);
        for (int64_t j = 0; j < H; ++j) {
          z[j] = sigmoid(xw(0, j) + hr(0, j, hv));
          rg[j] = sigmoid(xw(1, j) + hr(1, j, hv));
          rh[j] = rg[j] * hv[j];
        }
        for (int64_t j = 0; j < H; ++j) {
          double ht = lbr ? std::tanh(xw(2, j) + rg[j] * hr(2, j, hv)) : std::tanh(xw(2, j) + hr(2, j, rh));
          nh[bb * H + j] = (1 - z[j]) * ht + z[j] * hv[j];
        }
      }
      hs = nh;
      std::copy(hs.begin(), hs.end(), ys.begin() + t * NB * H);
    }
    expect_close(outs[0], ys, 1e-5, "Y");
    expect_close(outs[1], hs, 1e-5, "Y_h");
  }
}

// Bidirectional = forward and reverse run separately; layout 1 is the
// transpose of layout 0; sequence_lens zero the tail of Y and stop the state.
TEST(RnnKernel, BidirectionalLayoutAndSequenceLens) {
  int64_t S = 4, NB = 2, I = 2, H = 3;
  std::vector<double> x = ramp(S * NB * I, -1, 1, 11), w = ramp(2 * H * I, -0.8, 0.8, 12),
                      rr = ramp(2 * H * H, -0.8, 0.8, 13), b = ramp(4 * H, -0.2, 0.2, 14);
  std::vector<double> lens = {4, 2};
  auto run = [&](const std::string& dir, int64_t layout, int64_t d0) {
    auto r = rnn_graph("RNN", {{S, NB, I}, {dir == "bidirectional" ? 2 : 1, H, I}, {dir == "bidirectional" ? 2 : 1, H, H},
                               {dir == "bidirectional" ? 2 : 1, 2 * H}, {NB}}, 2);
    r->n->set_attr("hidden_size", Attribute::of_int(H));
    r->n->set_attr("direction", Attribute::of_string(dir));
    r->n->set_attr("activations", Attribute::of_strings(dir == "bidirectional" ? std::vector<std::string>{"Tanh", "Relu"}
                                                                   : std::vector<std::string>{d0 ? "Relu" : "Tanh"}));
    int64_t nd = dir == "bidirectional" ? 2 : 1;
    auto slice = [&](const std::vector<double>& v, int64_t per) {
      return nd == 2 ? v : std::vector<double>(v.begin() + d0 * per, v.begin() + (d0 + 1) * per);
    };
    Tensor xt = make_tensor(DType::kFloat32, {S, NB, I}, x);
    if (layout == 1) {
      r->n->set_attr("layout", Attribute::of_int(1));
      std::vector<double> xl;
      for (int64_t bb = 0; bb < NB; ++bb)
        for (int64_t t = 0; t < S; ++t)
          for (int64_t i = 0; i < I; ++i) xl.push_back(x[(t * NB + bb) * I + i]);
      xt = make_tensor(DType::kFloat32, {NB, S, I}, xl);
    }
    EXPECT_TRUE(testing::infer(r->g).is_ok());
    return run_kernel(*r->n, {xt, make_tensor(DType::kFloat32, {nd, H, I}, slice(w, H * I)),
                              make_tensor(DType::kFloat32, {nd, H, H}, slice(rr, H * H)),
                              make_tensor(DType::kFloat32, {nd, 2 * H}, slice(b, 2 * H)),
                              make_tensor(DType::kInt32, {NB}, lens)});
  };
  auto bi = run("bidirectional", 0, 0);
  auto fw = run("forward", 0, 0);
  auto rv = run("reverse", 0, 1);
  auto bl = run("bidirectional", 1, 0);
  ASSERT_EQ(bi.size(), 2u);
  std::vector<double> ybi = to_vector(bi[0]), yfw = to_vector(fw[0]), yrv = to_vector(rv[0]), ybl = to_vector(bl[0]);
  std::vector<double> hbi = to_vector(bi[1]), hbl = to_vector(bl[1]);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t bb = 0; bb < NB; ++bb)
      for (int64_t j = 0; j < H; ++j) {
        double f = ybi[((t * 2 + 0) * NB + bb) * H + j], r = ybi[((t * 2 + 1) * NB + bb) * H + j];
        EXPECT_EQ(f, yfw[(t * NB + bb) * H + j]);
        EXPECT_EQ(r, yrv[(t * NB + bb) * H + j]);
        EXPECT_EQ(f, ybl[((bb * S + t) * 2 + 0) * H + j]);
        EXPECT_EQ(r, ybl[((bb * S + t) * 2 + 1) * H + j]);
        if (t >= lens[bb]) {
          EXPECT_EQ(f, 0);
          EXPECT_EQ(r, 0);
        }
        EXPECT_GE(r, 0);  // Relu for the reverse direction
      }
  for (int64_t bb = 0; bb < NB; ++bb)
    for (int64_t j = 0; j < H; ++j) {
      int64_t last = static_cast<int64_t>(lens[bb]) - 1;
      // Forward state: the last step run; reverse state: step 0 (run last).
      EXPECT_EQ(hbi[(0 * NB + bb) * H + j], ybi[((last * 2 + 0) * NB + bb) * H + j]);
      EXPECT_EQ(hbi[(1 * NB + bb) * H + j], ybi[((0 * 2 + 1) * NB + bb) * H + j]);
      EXPECT_EQ(hbl[(bb * 2 + 0) * H + j], hbi[(0 * NB + bb) * H + j]);
      EXPECT_EQ(hbl[(bb * 2 + 1) * H + j], hbi[(1 * NB + bb) * H + j]);
    }
  // Step 0 of the forward direction by hand: tanh(x W^T + Wb + Rb).
  for (int64_t j = 0; j < H; ++j) {
    double v = b[j] + b[H + j];
    for (int64_t i = 0; i < I; ++i) v += x[i] * w[j * I + i];
    EXPECT_NEAR(yfw[j], std::tanh(v), 1e-6);
  }
}

TEST(RnnKernel, ClipAndActivationParameters) {
  int64_t S = 2, I = 1, H = 1;
  auto r = rnn_graph("RNN", {{S, 1, I}, {1, H, I}, {1, H, H}}, 2);
  r->n->set_attr("hidden_size", Attribute::of_int(H));
  r->n->set_attr("clip", Attribute::of_float(0.5));
  r->n->set_attr("activations", Attribute::of_strings({"Affine"}));
  Attribute alpha;
  alpha.kind = Attribute::Kind::kFloats;
  alpha.floats = {2.0};
  Attribute beta = alpha;
  beta.floats = {0.25};
  r->n->set_attr("activation_alpha", alpha);
  r->n->set_attr("activation_beta", beta);
  ASSERT_TRUE(testing::infer(r->g).is_ok());
  auto outs = run_kernel(*r->n, {make_tensor(DType::kFloat32, {S, 1, I}, {3, -0.1}),
                                 make_tensor(DType::kFloat32, {1, H, I}, {1}), make_tensor(DType::kFloat32, {1, H, H}, {1})});
  // h1 = 2 * clip(3) + 0.25 = 1.25; h2 = 2 * clip(-0.1 + 1.25) + 0.25 = 1.25.
  expect_close(outs[0], {1.25, 1.25}, 1e-6, "Y");
  expect_close(outs[1], {1.25}, 1e-6, "Y_h");
}

}  // namespace
}  // namespace kiln::ops

namespace kiln::ops {
namespace {

// Parameters of the wrong size would be read out of bounds by the kernels: inference rejects them.
TEST(QuantInfer, ParameterShapesAreChecked) {
  Graph g;
  g.opsets[""] = 21;
  Value* x = g.add_input("x", testing::tt(DType::kFloat32, {2, 3}));
  Value* s = g.add_input("s", testing::tt(DType::kFloat32, {2}));
  g.add_node("QuantizeLinear", {x, s}, {"y"});  // axis 1 has 3 elements
  EXPECT_EQ(testing::infer(g).code(), StatusCode::kInvalidModel);

  Graph m;
  Value* a = m.add_input("a", testing::tt(DType::kUInt8, {4, 3}));
  Value* b = m.add_input("b", testing::tt(DType::kUInt8, {3, 2}));
  Value* az = m.add_input("az", testing::tt(DType::kUInt8, {3}));
  m.add_node("MatMulInteger", {a, b, az}, {"y"});  // per-row needs 4
  EXPECT_EQ(testing::infer(m).code(), StatusCode::kInvalidModel);

  Graph l;
  Value* lx = l.add_input("x", testing::tt(DType::kFloat32, {2, 5}));
  Value* lt = l.add_input("t", testing::tt(DType::kInt64, {2}));
  Value* lw = l.add_input("w", testing::tt(DType::kFloat32, {4}));
  l.add_node("NegativeLogLikelihoodLoss", {lx, lt, lw}, {"y"});
  EXPECT_EQ(testing::infer(l).code(), StatusCode::kInvalidModel);
}

}  // namespace
}  // namespace kiln::ops
