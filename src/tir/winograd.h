// Winograd minimal filtering F(m x m, 3 x 3) (Lavin and Gray, 2015): an m x m
// tile of a stride-1 3x3 convolution computed from an (m + 2) x (m + 2) input
// tile d and the 3x3 kernel g as
//   Y = AT [ (G g GT) * (BT d B) ] A      (* elementwise)
// so that the reduction over input channels becomes (m + 2)^2 independent
// matrix products (one per position of the transformed tile) with 9 m^2 /
// (m + 2)^2 fewer multiplications than the direct loop (4 for m = 4, 2.25 for
// m = 2). The matrices are the Toom-Cook construction over interpolation
// points 0, +-1 (m = 2) or 0, +-3/2, +-2/3 (m = 4), and infinity. For m = 4
// those points, not the usual 0, +-1, +-2, were chosen by measuring the f32
// error of every set of four nonzero points from {+-1, +-2, +-3, +-4, +-1/2,
// +-1/3, +-1/4, +-3/2, +-2/3} (transforms rounded to f32, 3x3 kernels over 32
// ReLU channels, against the direct convolution in double): simulated
// normalized error 4.5e-7 against 1.5e-6 for 0, +-1, +-2 (F(2x2): 2.7e-7); in
// the kernel, 6.5e-7 against 1.4e-6 (F(2x2): 2.5e-7). The Conv lowering
// (ops/conv.cc, kiln_weight_layout "W<m>P<mr>") writes the input and output transforms as loop-IR stages with these
// coefficients; the strategy's conv.winograd transforms the weights with G
// at compile time.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::tir {

struct WinogradMatrices {
  int64_t m = 0;      // output tile side
  int64_t alpha = 0;  // input tile side, m + 2
  std::vector<double> bt;  // alpha x alpha, row-major: input transform BT
  std::vector<double> g;   // alpha x 3: kernel transform G
  std::vector<double> at;  // m x alpha: output transform AT
};

// The matrices of F(m x m, 3 x 3) for m = 2 or 4; null for any other m.
const WinogradMatrices* winograd_matrices(int64_t m);

// Transforms a 3x3 kernel w [O, I, 3, 3] (f32, row-major) into U = G w GT per
// (output, input) channel pair, stored in panels of mr output channels as
// [alpha, alpha, ceil(O / mr), I, mr] with zeros past O (out must hold
// alpha^2 * ceil(O / mr) * mr * I floats). Computed in double.
void winograd_weights(const float* w, int64_t o, int64_t i, int64_t m, int64_t mr, float* out);

}  // namespace kiln::tir
