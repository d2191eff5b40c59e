#pragma once
// The layer's gates (spec 6, step 4), per token and value head:
//   beta = sigmoid(b),   g = -exp(A_log) softplus(a + dt_bias)   (g <= 0)
// softplus as torch's: u above 20 passes through (and its slope is 1 there).

#include <cstdint>

namespace gdn::layer {

// b, a, beta, g: [rows, HV] with rows = B T; A_log, dt_bias: [HV].
struct GateShape {
  std::int64_t rows, HV;
};

template <typename Scalar>
void gates_forward(const GateShape& s, const Scalar* b, const Scalar* a, const Scalar* A_log,
                   const Scalar* dt_bias, Scalar* beta, Scalar* g);

// From dbeta, dg: db, da [rows, HV], and dA_log, ddt_bias [HV] (sums over rows, overwritten).
template <typename Scalar>
void gates_backward(const GateShape& s, const Scalar* a, const Scalar* A_log, const Scalar* dt_bias,
                    const Scalar* beta, const Scalar* g, const Scalar* dbeta, const Scalar* dg,
                    Scalar* db, Scalar* da, Scalar* dA_log, Scalar* ddt_bias);

}  // namespace gdn::layer
