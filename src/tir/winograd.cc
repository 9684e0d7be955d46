#include "tir/winograd.h"

namespace kiln::tir {

const WinogradMatrices* winograd_matrices(int64_t m) {
  static const WinogradMatrices f2{2,
                                   4,
                                   {1, 0, -1, 0,  //
                                    0, 1, 1, 0,   //
                                    0, -1, 1, 0,  //
                                    0, 1, 0, -1},
                                   {1, 0, 0,          //
                                    0.5, 0.5, 0.5,    //
                                    0.5, -0.5, 0.5,   //
                                    0, 0, 1},
                                   {1, 1, 1, 0,  //
                                    0, 1, -1, -1}};
  static const WinogradMatrices f4{4,
                                   6,
                                   {4, 0, -5, 0, 1, 0,    //
                                    0, -4, -4, 1, 1, 0,   //
                                    0, 4, -4, -1, 1, 0,   //
                                    0, -2, -1, 2, 1, 0,   //
                                    0, 2, -1, -2, 1, 0,   //
                                    0, 4, 0, -5, 0, 1},
                                   {1.0 / 4, 0, 0,                   //
                                    -1.0 / 6, -1.0 / 6, -1.0 / 6,    //
                                    -1.0 / 6, 1.0 / 6, -1.0 / 6,     //
                                    1.0 / 24, 1.0 / 12, 1.0 / 6,     //
                                    1.0 / 24, -1.0 / 12, 1.0 / 6,    //
                                    0, 0, 1},
                                   {1, 1, 1, 1, 1, 0,    //
                                    0, 1, -1, 2, -2, 0,  //
                                    0, 1, 1, 4, 4, 0,    //
                                    0, 1, -1, 8, -8, 1}};
  if (m == 2) return &f2;
  if (m == 4) return &f4;
  return nullptr;
}

void winograd_weights(const float* w, int64_t o, int64_t i, int64_t m, int64_t mr, float* out) {
  const WinogradMatrices& t = *winograd_matrices(m);
  const int64_t a = t.alpha;
  const int64_t panels = (o + mr - 1) / mr;
  const int64_t plane = panels * i * mr;  // one transformed position, all channel pairs
  for (int64_t x = 0; x < a * a * plane; ++x) out[x] = 0.f;
  for (int64_t oc = 0; oc < o; ++oc)
    for (int64_t ic = 0; ic < i; ++ic) {
      const float* k = w + (oc * i + ic) * 9;
      double gk[6 * 3];  // G k: alpha x 3, alpha <= 6
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < 3; ++c) {
          double s = 0;
          for (int64_t j = 0; j < 3; ++j) s += t.g[r * 3 + j] * k[j * 3 + c];
          gk[r * 3 + c] = s;
        }
      for (int64_t r = 0; r < a; ++r)
        for (int64_t c = 0; c < a; ++c) {
          double s = 0;
          for (int64_t j = 0; j < 3; ++j) s += gk[r * 3 + j] * t.g[c * 3 + j];
          out[(r * a + c) * plane + ((oc / mr) * i + ic) * mr + oc % mr] = static_cast<float>(s);
        }
    }
}

}  // namespace kiln::tir
