#include "tir/winograd.h"

#include <cstddef>
#include <utility>

namespace kiln::tir {

namespace {

// F(m, 3) from the m + 1 finite interpolation points a_j and infinity, with
// M(x) = prod_j (x - a_j) and f_j = prod_{l != j} (a_j - a_l):
//   AT[i][j] = a_j^i,  G[j][k] = a_j^k / f_j,
//   BT[j][k] = coefficient of x^k in M(x) / (x - a_j),
// and for the point at infinity AT[m-1][m+1] = 1, G[m+1][2] = 1, BT[m+1] = M.
WinogradMatrices toom_cook(int64_t m, const std::vector<double>& pts) {
  const int64_t a = m + 2;
  WinogradMatrices t{m, a, std::vector<double>(a * a, 0.0), std::vector<double>(a * 3, 0.0),
                     std::vector<double>(m * a, 0.0)};
  // Coefficients (lowest first) of the product of (x - pts[l]) over l != skip.
  auto poly = [&](int64_t skip) {
    std::vector<double> c{1.0};
    for (int64_t l = 0; l < a - 1; ++l) {
      if (l == skip) continue;
      std::vector<double> next(c.size() + 1, 0.0);
      for (std::size_t k = 0; k < c.size(); ++k) {
        next[k + 1] += c[k];
        next[k] -= c[k] * pts[static_cast<std::size_t>(l)];
      }
      c = std::move(next);
    }
    return c;
  };
  for (int64_t j = 0; j < a - 1; ++j) {
    const double aj = pts[static_cast<std::size_t>(j)];
    double f = 1.0;
    for (int64_t l = 0; l < a - 1; ++l)
      if (l != j) f *= aj - pts[static_cast<std::size_t>(l)];
    double p = 1.0;
    for (int64_t i = 0; i < m; ++i, p *= aj) t.at[i * a + j] = p;
    p = 1.0;
    for (int64_t k = 0; k < 3; ++k, p *= aj) t.g[j * 3 + k] = p / f;
    std::vector<double> c = poly(j);
    for (std::size_t k = 0; k < c.size(); ++k) t.bt[j * a + static_cast<int64_t>(k)] = c[k];
  }
  t.at[(m - 1) * a + (a - 1)] = 1.0;
  t.g[(a - 1) * 3 + 2] = 1.0;
  std::vector<double> c = poly(-1);
  for (std::size_t k = 0; k < c.size(); ++k) t.bt[(a - 1) * a + static_cast<int64_t>(k)] = c[k];
  return t;
}

}  // namespace

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
  static const WinogradMatrices f4 = toom_cook(4, {0.0, 1.5, -1.5, 2.0 / 3.0, -2.0 / 3.0});
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
