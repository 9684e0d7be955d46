// Signal ops (src/ops/signal.cc): DFT, STFT and MelWeightMatrix runtime
// kernels against a direct O(n^2) transform in double precision, over
// power-of-two and other lengths (the radix-2 and Bluestein paths), plus
// shape inference and the errors bad inputs give.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "ops/registry.h"
#include "ops_test_harness.h"

namespace kiln::ops {
namespace {

using testing::make_tensor;
using testing::try_kernel;
using testing::ramp;
using testing::tt;
using Complex = std::complex<double>;

std::unique_ptr<Graph> new_graph(int64_t opset) {
  auto g = std::make_unique<Graph>();
  g->opsets[""] = opset;
  return g;
}

std::vector<Tensor> run_kernel(const Node& n, const std::vector<Tensor>& inputs) {
  auto r = try_kernel(n, inputs);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::vector<Tensor>{};
}

Tensor i64_scalar(int64_t v) { return make_tensor(DType::kInt64, {}, {static_cast<double>(v)}); }

// sum_j x_j e^(-+2 pi i jk/n), x zero-padded or truncated to n.
std::vector<Complex> direct_dft(const std::vector<Complex>& x, int64_t n, bool inverse) {
  std::vector<Complex> y(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < std::min<int64_t>(n, static_cast<int64_t>(x.size())); ++j)
      y[static_cast<size_t>(k)] += x[static_cast<size_t>(j)] *
                                   std::polar(1.0, (inverse ? 2 : -2) * std::numbers::pi * static_cast<double>(j * k % n) /
                                                       static_cast<double>(n));
  if (inverse)
    for (Complex& v : y) v /= static_cast<double>(n);
  return y;
}

// DFT over axis 1 of [2, len, 3, c] float64 input (c = 1 real, 2 complex):
// every line along the axis against the direct transform.
TEST(SignalOps, DftMatchesDirectTransform) {
  struct Case {
    int64_t len, c, dft_length;  // dft_length 0: omitted
    bool inverse, onesided;
  };
  for (Case k : {Case{8, 2, 0, false, false}, Case{17, 2, 0, false, false}, Case{1, 1, 0, false, false},
                 Case{3, 1, 0, false, true}, Case{12, 1, 16, false, true}, Case{20, 2, 7, false, false},
                 Case{17, 2, 0, true, false}, Case{64, 2, 100, true, false}, Case{1023, 1, 0, false, true}}) {
    SCOPED_TRACE("len " + std::to_string(k.len) + " c " + std::to_string(k.c) + " dft_length " +
                 std::to_string(k.dft_length) + (k.inverse ? " inverse" : "") + (k.onesided ? " onesided" : ""));
    const int64_t B = 2, I = 3;
    auto g = new_graph(17);
    Value* x = g->add_input("x", tt(DType::kFloat64, {B, k.len, I, k.c}));
    std::vector<Value*> ins{x};
    if (k.dft_length) ins.push_back(g->add_constant("n", i64_scalar(k.dft_length)));
    Node* node = g->add_node("DFT", ins, {"y"});
    if (k.inverse) node->set_attr("inverse", Attribute::of_int(1));
    if (k.onesided) node->set_attr("onesided", Attribute::of_int(1));
    ASSERT_TRUE(testing::infer(*g).is_ok());
    const int64_t n = k.dft_length ? k.dft_length : k.len, out_len = k.onesided ? n / 2 + 1 : n;
    EXPECT_EQ(node->output(0)->type().to_string(),
              "f64[2, " + std::to_string(out_len) + ", 3, 2]");  // axis defaults to 1 before opset 20
    std::vector<double> xv = ramp(B * k.len * I * k.c, -1, 1, 5);
    std::vector<Tensor> args{make_tensor(DType::kFloat64, {B, k.len, I, k.c}, xv)};
    if (k.dft_length) args.push_back(i64_scalar(k.dft_length));
    auto out = run_kernel(*node, args);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{B, out_len, I, 2}));
    double err = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < I; ++i) {
        std::vector<Complex> line;
        for (int64_t t = 0; t < k.len; ++t) {
          int64_t e = ((b * k.len + t) * I + i) * k.c;
          line.emplace_back(xv[e], k.c == 2 ? xv[e + 1] : 0.0);
        }
        auto want = direct_dft(line, n, k.inverse);
        for (int64_t f = 0; f < out_len; ++f) {
          int64_t e = ((b * out_len + f) * I + i) * 2;
          err = std::max(err, std::abs(Complex(out[0].get_f64(e), out[0].get_f64(e + 1)) - want[f]));
        }
      }
    EXPECT_LT(err, 1e-9 * static_cast<double>(n));
  }
}

// Opset 20: the axis is an input (default -2, the last signal dim); a float32
// round trip through the inverse gives the signal back.
TEST(SignalOps, DftOpset20AxisInputAndRoundTrip) {
  auto g = new_graph(20);
  Value* x = g->add_input("x", tt(DType::kFloat32, {3, 10, 2}));
  Node* fwd = g->add_node("DFT", {x}, {"f"});
  Value* axis = g->add_constant("axis", i64_scalar(-2));
  Node* inv = g->add_node("DFT", {fwd->output(0), nullptr, axis}, {"y"});
  inv->set_attr("inverse", Attribute::of_int(1));
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(inv->output(0)->type().to_string(), "f32[3, 10, 2]");
  std::vector<double> xv = ramp(60, -2, 2, 9);
  Tensor xt = make_tensor(DType::kFloat32, {3, 10, 2}, xv);
  auto f = run_kernel(*fwd, {xt});
  ASSERT_EQ(f.size(), 1u);
  auto y = run_kernel(*inv, {f[0], Tensor(), i64_scalar(-2)});
  ASSERT_EQ(y.size(), 1u);
  for (int64_t e = 0; e < 60; ++e) EXPECT_NEAR(y[0].get_f64(e), xt.get_f64(e), 2e-6) << e;
  // The forward transform of row 0 against the direct one.
  std::vector<Complex> row;
  for (int64_t t = 0; t < 10; ++t) row.emplace_back(xt.get_f64(2 * t), xt.get_f64(2 * t + 1));
  auto want = direct_dft(row, 10, false);
  for (int64_t k = 0; k < 10; ++k) {
    EXPECT_NEAR(f[0].get_f64(2 * k), want[k].real(), 1e-5);
    EXPECT_NEAR(f[0].get_f64(2 * k + 1), want[k].imag(), 1e-5);
  }
}

TEST(SignalOps, DftErrors) {
  auto g = new_graph(17);
  Value* x = g->add_input("x", tt(DType::kFloat32, {4, 3}));
  Node* n = g->add_node("DFT", {x}, {"y"});
  n->set_attr("axis", Attribute::of_int(1));
  Status s = testing::infer(*g);
  EXPECT_FALSE(s.is_ok());  // the last dim (3) is neither 1 nor 2
  auto g2 = new_graph(17);
  Value* x2 = g2->add_input("x", tt(DType::kFloat32, {4, 2}));
  Node* n2 = g2->add_node("DFT", {x2}, {"y"});  // axis 1 is the complex dim
  s = testing::infer(*g2);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("real/imaginary"), std::string::npos) << s.to_string();
  // At run time: a non-positive dft_length.
  auto g3 = new_graph(17);
  Value* x3 = g3->add_input("x", tt(DType::kFloat32, {1, 4, 1}));
  Value* len = g3->add_input("n", tt(DType::kInt64, {}));
  Node* n3 = g3->add_node("DFT", {x3, len}, {"y"});
  ASSERT_TRUE(testing::infer(*g3).is_ok());
  auto r = try_kernel(*n3, {make_tensor(DType::kFloat32, {1, 4, 1}, {1, 2, 3, 4}), i64_scalar(0)});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("dft_length must be positive"), std::string::npos);
  (void)n2;
}

// STFT of a real [2, 40, 1] signal with a window, frame step 6, frame length
// 10 (not a power of two), one-sided, against windowed direct transforms.
TEST(SignalOps, StftMatchesWindowedFrames) {
  const int64_t B = 2, L = 40, step = 6, fl = 10;
  auto g = new_graph(17);
  Value* x = g->add_input("x", tt(DType::kFloat32, {B, L, 1}));
  Value* st = g->add_constant("step", i64_scalar(step));
  Value* w = g->add_input("w", tt(DType::kFloat32, {fl}));
  Value* len = g->add_constant("fl", i64_scalar(fl));
  Node* n = g->add_node("STFT", {x, st, w, len}, {"y"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  const int64_t frames = 1 + (L - fl) / step, bins = fl / 2 + 1;
  EXPECT_EQ(n->output(0)->type().to_string(),
            "f32[2, " + std::to_string(frames) + ", " + std::to_string(bins) + ", 2]");
  std::vector<double> xv = ramp(B * L, -1, 1, 3), wv = ramp(fl, 0, 1, 4);
  Tensor xt = make_tensor(DType::kFloat32, {B, L, 1}, xv), wt = make_tensor(DType::kFloat32, {fl}, wv);
  auto out = run_kernel(*n, {xt, i64_scalar(step), wt, i64_scalar(fl)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{B, frames, bins, 2}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      std::vector<Complex> frame;
      for (int64_t t = 0; t < fl; ++t) frame.emplace_back(xt.get_f64(b * L + f * step + t) * wt.get_f64(t), 0.0);
      auto want = direct_dft(frame, fl, false);
      for (int64_t k = 0; k < bins; ++k) {
        int64_t e = ((b * frames + f) * bins + k) * 2;
        EXPECT_NEAR(out[0].get_f64(e), want[k].real(), 1e-5);
        EXPECT_NEAR(out[0].get_f64(e + 1), want[k].imag(), 1e-5);
      }
    }
  // A window whose length differs from frame_length, and a frame longer than the signal.
  auto r = try_kernel(*n, {xt, i64_scalar(step), wt, i64_scalar(8)});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("differs from frame_length"), std::string::npos);
  r = try_kernel(*n, {make_tensor(DType::kFloat32, {1, 5, 1}, {1, 2, 3, 4, 5}), i64_scalar(step), wt, i64_scalar(fl)});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("signal length 5"), std::string::npos) << r.status().to_string();
}

// Mel filters: each column a triangle over spectrogram bins rising 0 -> 1
// and falling back, columns in increasing frequency; an edge beyond the
// spectrum is an error.
TEST(SignalOps, MelWeightMatrixTriangles) {
  auto g = new_graph(17);
  std::vector<Value*> ins{g->add_constant("m", i64_scalar(8)), g->add_constant("d", i64_scalar(256)),
                          g->add_constant("r", i64_scalar(8000)),
                          g->add_constant("lo", make_tensor(DType::kFloat32, {}, {20})),
                          g->add_constant("hi", make_tensor(DType::kFloat32, {}, {3800}))};
  Node* n = g->add_node("MelWeightMatrix", ins, {"y"});
  ASSERT_TRUE(testing::infer(*g).is_ok());
  EXPECT_EQ(n->output(0)->type().to_string(), "f32[129, 8]");
  std::vector<Tensor> args{i64_scalar(8), i64_scalar(256), i64_scalar(8000), make_tensor(DType::kFloat32, {}, {20}),
                           make_tensor(DType::kFloat32, {}, {3800})};
  auto out = run_kernel(*n, args);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (std::vector<int64_t>{129, 8}));
  // Mel points as the ONNX reference spaces them: (high - low) / (bins + 2).
  auto mel = [](double hz) { return 2595 * std::log10(1 + hz / 700); };
  double step = (mel(3800) - mel(20)) / 10;
  std::vector<int64_t> pt;
  for (int i = 0; i < 10; ++i)
    pt.push_back(static_cast<int64_t>(std::floor(257 * 700 * (std::pow(10, (mel(20) + i * step) / 2595) - 1) / 8000)));
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 129; ++j) {
      double want = 0;
      if (j >= pt[i] && j <= pt[i + 1] && pt[i + 1] > pt[i]) want = double(j - pt[i]) / double(pt[i + 1] - pt[i]);
      if (j >= pt[i + 1] && j < pt[i + 2]) want = double(pt[i + 2] - j) / double(pt[i + 2] - pt[i + 1]);
      EXPECT_NEAR(out[0].get_f64(j * 8 + i), want, 1e-6) << "bin " << j << " filter " << i;
    }
  Tensor text(DType::kString, {});  // an edge that is no number is an error, not a crash
  std::vector<Tensor> bad_args = args;
  bad_args[3] = text;
  auto r_text = try_kernel(*n, bad_args);
  ASSERT_FALSE(r_text.is_ok());
  EXPECT_NE(r_text.status().to_string().find("float scalars"), std::string::npos) << r_text.status().to_string();
  args[4] = make_tensor(DType::kFloat32, {}, {9000});  // above sample_rate / 2
  auto r = try_kernel(*n, args);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("maps past the last spectrogram bin"), std::string::npos);
}

}  // namespace
}  // namespace kiln::ops
