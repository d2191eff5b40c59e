#include "layer/gated_rms_norm.h"

#include <cmath>
#include <vector>

namespace gdn::layer {
namespace {

template <typename Scalar>
Scalar sigmoid(Scalar x) {
  return Scalar(1) / (Scalar(1) + std::exp(-x));
}

// rsqrt(mean(o^2) + eps) of one row, accumulated in Scalar (float32 in the f32 layer).
template <typename Scalar>
Scalar inverse_rms(const Scalar* o, std::int64_t V, double eps) {
  Scalar sum = 0;
  for (std::int64_t j = 0; j < V; ++j) sum += o[j] * o[j];
  return Scalar(1) / std::sqrt(sum / Scalar(V) + Scalar(eps));
}

}  // namespace

template <typename Scalar>
void gated_rms_norm_forward(const NormShape& s, const Scalar* o, const Scalar* z,
                            const Scalar* weight, Scalar* y) {
#pragma omp parallel for
  for (std::int64_t r = 0; r < s.rows; ++r) {
    const std::int64_t row = r * s.V;
    const Scalar inv = inverse_rms(o + row, s.V, s.eps);
    for (std::int64_t j = 0; j < s.V; ++j) {
      const Scalar zj = z[row + j];
      y[row + j] = weight[j] * (o[row + j] * inv) * (zj * sigmoid(zj));
    }
  }
}

// With dn = dy weight silu(z): dweight = sum dy n silu(z), dz = dy weight n silu'(z) where
// silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))), and d_o = r (dn - n mean(dn n)).
template <typename Scalar>
void gated_rms_norm_backward(const NormShape& s, const Scalar* o, const Scalar* z,
                             const Scalar* weight, const Scalar* dy, Scalar* d_o, Scalar* dz,
                             Scalar* dweight) {
  std::vector<double> dw(static_cast<std::size_t>(s.V), 0.0);
#pragma omp parallel
  {
    std::vector<double> mine(static_cast<std::size_t>(s.V), 0.0);
    std::vector<Scalar> dn(static_cast<std::size_t>(s.V));
#pragma omp for
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const std::int64_t row = r * s.V;
      const Scalar inv = inverse_rms(o + row, s.V, s.eps);
      Scalar dot = 0;
      for (std::int64_t j = 0; j < s.V; ++j) {
        const Scalar zj = z[row + j], sz = sigmoid(zj), n = o[row + j] * inv;
        const Scalar g = dy[row + j];
        mine[j] += static_cast<double>(g * n * zj * sz);
        dz[row + j] = g * weight[j] * n * sz * (Scalar(1) + zj * (Scalar(1) - sz));
        dn[j] = g * weight[j] * zj * sz;
        dot += dn[j] * n;
      }
      const Scalar mean = dot / Scalar(s.V);
      for (std::int64_t j = 0; j < s.V; ++j) d_o[row + j] = inv * (dn[j] - o[row + j] * inv * mean);
    }
#pragma omp critical
    for (std::int64_t j = 0; j < s.V; ++j) dw[j] += mine[j];
  }
  for (std::int64_t j = 0; j < s.V; ++j) dweight[j] = static_cast<Scalar>(dw[j]);
}

template void gated_rms_norm_forward(const NormShape&, const float*, const float*, const float*,
                                     float*);
template void gated_rms_norm_forward(const NormShape&, const double*, const double*, const double*,
                                     double*);
template void gated_rms_norm_backward(const NormShape&, const float*, const float*, const float*,
                                      const float*, float*, float*, float*);
template void gated_rms_norm_backward(const NormShape&, const double*, const double*, const double*,
                                      const double*, double*, double*, double*);

}  // namespace gdn::layer
