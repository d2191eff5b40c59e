#pragma once
// The gated RMSNorm per value head (spec 6, step 6; transformers' Qwen3_5RMSNormGated), over
// rows = B T HV vectors of V:
//   r = rsqrt(mean(o^2) + eps),   n = o r,   y = weight * n * silu(z)

#include <cstdint>

namespace gdn::layer {

// o, z, y: [rows, V]; weight: [V].
struct NormShape {
  std::int64_t rows, V;
  double eps;
};

template <typename Scalar>
void gated_rms_norm_forward(const NormShape& s, const Scalar* o, const Scalar* z,
                            const Scalar* weight, Scalar* y);

// From dy: d_o, dz [rows, V] and dweight [V] (a sum over rows, overwritten).
template <typename Scalar>
void gated_rms_norm_backward(const NormShape& s, const Scalar* o, const Scalar* z,
                             const Scalar* weight, const Scalar* dy, Scalar* d_o, Scalar* dz,
                             Scalar* dweight);

}  // namespace gdn::layer
