#pragma once
// The q/k l2 norm of spec 1 on one row, forward and backward.

#include <cmath>
#include <cstdint>

namespace gdn::cpu {

// sum_i a_i b_i in 16 interleaved partial sums, added pairwise at the end: a fixed order (the
// same result every run) that the compiler turns into vector FMAs, where one running sum would
// be a chain of n dependent adds (about 4 cycles each: 30% of the forward at T=2048 once).
template <typename Compute>
Compute dot(const Compute* a, const Compute* b, std::int64_t n) {
  constexpr int kLanes = 16;
  Compute partial[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) partial[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) partial[i % kLanes] += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) partial[j] += partial[j + width];
  return partial[0];
}

// x <- x * rsqrt(sum(x^2) + 1e-6); returns the factor r (spec 1).
template <typename Compute>
Compute l2_normalize(Compute* x, std::int64_t n) {
  const Compute r = Compute{1} / std::sqrt(dot(x, x, n) + static_cast<Compute>(1e-6));
  for (std::int64_t i = 0; i < n; ++i) x[i] *= r;
  return r;
}

// Gradient through x_hat = x r, r = (|x|^2 + eps)^-1/2: dx = r (dx_hat - x_hat (x_hat . dx_hat)).
template <typename Compute>
void l2_normalize_backward(const Compute* x_hat, Compute r, Compute* dx, std::int64_t n) {
  const Compute d = dot(x_hat, dx, n);
  for (std::int64_t i = 0; i < n; ++i) dx[i] = r * (dx[i] - x_hat[i] * d);
}

}  // namespace gdn::cpu
