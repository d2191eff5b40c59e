#include "layer/gating.h"

#include <cmath>

namespace gdn::layer {
namespace {

constexpr double kSoftplusThreshold = 20;  // torch.nn.functional.softplus's default

template <typename Scalar>
Scalar sigmoid(Scalar x) {
  return Scalar(1) / (Scalar(1) + std::exp(-x));
}

template <typename Scalar>
Scalar softplus(Scalar u) {
  return u > Scalar(kSoftplusThreshold) ? u : std::log1p(std::exp(u));
}

template <typename Scalar>
Scalar softplus_slope(Scalar u) {
  return u > Scalar(kSoftplusThreshold) ? Scalar(1) : sigmoid(u);
}

}  // namespace

template <typename Scalar>
void gates_forward(const GateShape& s, const Scalar* b, const Scalar* a, const Scalar* A_log,
                   const Scalar* dt_bias, Scalar* beta, Scalar* g) {
#pragma omp parallel for
  for (std::int64_t r = 0; r < s.rows; ++r)
    for (std::int64_t h = 0; h < s.HV; ++h) {
      const std::int64_t i = r * s.HV + h;
      beta[i] = sigmoid(b[i]);
      g[i] = -std::exp(A_log[h]) * softplus(a[i] + dt_bias[h]);
    }
}

// db = dbeta beta (1 - beta); with u = a + dt_bias: dg/du = -exp(A_log) softplus'(u) (for da and
// ddt_bias) and dg/dA_log = g.
template <typename Scalar>
void gates_backward(const GateShape& s, const Scalar* a, const Scalar* A_log, const Scalar* dt_bias,
                    const Scalar* beta, const Scalar* g, const Scalar* dbeta, const Scalar* dg,
                    Scalar* db, Scalar* da, Scalar* dA_log, Scalar* ddt_bias) {
#pragma omp parallel for
  for (std::int64_t h = 0; h < s.HV; ++h) {
    const Scalar decay = std::exp(A_log[h]);
    double sum_a = 0, sum_dt = 0;
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const std::int64_t i = r * s.HV + h;
      db[i] = dbeta[i] * beta[i] * (Scalar(1) - beta[i]);
      da[i] = -dg[i] * decay * softplus_slope(a[i] + dt_bias[h]);
      sum_dt += da[i];
      sum_a += static_cast<double>(dg[i]) * g[i];
    }
    dA_log[h] = static_cast<Scalar>(sum_a);
    ddt_bias[h] = static_cast<Scalar>(sum_dt);
  }
}

template void gates_forward(const GateShape&, const float*, const float*, const float*,
                            const float*, float*, float*);
template void gates_forward(const GateShape&, const double*, const double*, const double*,
                            const double*, double*, double*);
template void gates_backward(const GateShape&, const float*, const float*, const float*,
                             const float*, const float*, const float*, const float*, float*, float*,
                             float*, float*);
template void gates_backward(const GateShape&, const double*, const double*, const double*,
                             const double*, const double*, const double*, const double*, double*,
                             double*, double*, double*);

}  // namespace gdn::layer
