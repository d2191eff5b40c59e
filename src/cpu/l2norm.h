#pragma once
// The q/k l2 norm of spec 1 on one row, forward and backward.

#include <cmath>
#include <cstdint>

namespace gdn::cpu {

// x <- x * rsqrt(sum(x^2) + 1e-6); returns the factor r (spec 1).
template <typename Compute>
Compute l2_normalize(Compute* x, std::int64_t n) {
  Compute sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const Compute r = Compute{1} / std::sqrt(sum + static_cast<Compute>(1e-6));
  for (std::int64_t i = 0; i < n; ++i) x[i] *= r;
  return r;
}

// Gradient through x_hat = x r, r = (|x|^2 + eps)^-1/2: dx = r (dx_hat - x_hat (x_hat . dx_hat)).
template <typename Compute>
void l2_normalize_backward(const Compute* x_hat, Compute r, Compute* dx, std::int64_t n) {
  Compute dot = 0;
  for (std::int64_t i = 0; i < n; ++i) dot += x_hat[i] * dx[i];
  for (std::int64_t i = 0; i < n; ++i) dx[i] = r * (dx[i] - x_hat[i] * dot);
}

}  // namespace gdn::cpu
