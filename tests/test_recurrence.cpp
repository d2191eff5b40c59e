// The float64 recurrence (the oracle): its forward against the matrix form of spec 1, and its
// hand-derived backward against central finite differences.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>

#include "testing.h"

namespace gdn {
namespace {

using testing::run;

// Loss = <o, dO> + <S_T, dS_T>: its gradient is what backward returns for those dO, dS_T.
double loss(const Problem& p, ProblemData& data) {
  ProblemResults r = allocate_results(p, DType::f64);
  delta_rule_forward(data.inputs(), r.outputs(), Method::recurrent);
  double sum = 0;
  for (std::int64_t i = 0; i < r.o.numel(); ++i)
    sum += r.o.as<double>()[i] * data.d_o.as<double>()[i];
  if (!data.d_final_state.bytes.empty())
    for (std::int64_t i = 0; i < r.final_state.numel(); ++i)
      sum += r.final_state.as<double>()[i] * data.d_final_state.as<double>()[i];
  return sum;
}

void check_finite_differences(const Problem& p) {
  ProblemData data = generate(p);
  ProblemResults grads = run(p, data, Method::recurrent, DType::f64);
  const std::vector<std::pair<HostTensor*, HostTensor*>> pairs = {
      {&data.q, &grads.dq}, {&data.k, &grads.dk},       {&data.v, &grads.dv},
      {&data.g, &grads.dg}, {&data.beta, &grads.dbeta}, {&data.initial_state, &grads.dh0}};
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dh0"};
  constexpr double h = 1e-6;
  for (std::size_t n = 0; n < pairs.size(); ++n) {
    HostTensor& x = *pairs[n].first;
    const HostTensor& dx = *pairs[n].second;
    if (x.bytes.empty()) continue;
    double diff = 0, norm = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      double& xi = x.as<double>()[i];
      const double saved = xi;
      xi = saved + h;
      const double up = loss(p, data);
      xi = saved - h;
      const double down = loss(p, data);
      xi = saved;
      const double numeric = (up - down) / (2 * h);
      diff += std::pow(numeric - dx.as<double>()[i], 2);
      norm += numeric * numeric;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-7) << names[n];
  }
}

Problem tiny(bool l2norm) {
  Problem p{.B = 2, .T = 6, .HK = 1, .HV = 2, .K = 3, .V = 2};
  p.dtype = DType::f64;
  p.use_qk_l2norm = l2norm;
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = l2norm ? 1 : 2;
  return p;
}

TEST(Recurrence, GradientsMatchFiniteDifferences) {
  check_finite_differences(tiny(false));
}
TEST(Recurrence, GradientsMatchFiniteDifferencesWithL2norm) {
  check_finite_differences(tiny(true));
}

TEST(Recurrence, GradientsMatchFiniteDifferencesVarlenGqa) {
  Problem p{.HK = 2, .HV = 4, .K = 3, .V = 2};
  p.seqlens = {3, 1, 4};
  p.dtype = DType::f64;
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = 9;
  check_finite_differences(p);
}

// Two tokens by the matrix form S_t = exp(g) (I - beta k k^T) S_{t-1} + beta k v^T (spec 1).
TEST(Recurrence, ForwardMatchesMatrixForm) {
  Problem p{.B = 1, .T = 2, .HK = 1, .HV = 1, .K = 3, .V = 2};
  p.dtype = DType::f64;
  p.use_qk_l2norm = false;
  p.initial_state = true;
  p.seed = 4;
  ProblemData data = generate(p);
  data.scale = 0.7;
  ProblemResults r = allocate_results(p, DType::f64);
  delta_rule_forward(data.inputs(), r.outputs(), Method::recurrent);

  const double* q = data.q.as<double>();
  const double* k = data.k.as<double>();
  const double* v = data.v.as<double>();
  double S[3][2];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) S[i][j] = data.initial_state.as<double>()[i * 2 + j];
  for (int t = 0; t < 2; ++t) {
    const double a = std::exp(data.g.as<double>()[t]);
    const double beta = data.beta.as<double>()[t];
    double next[3][2];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) {
        double m = 0;  // ((I - beta k k^T) S)_ij
        for (int l = 0; l < 3; ++l) m += ((i == l) - beta * k[t * 3 + i] * k[t * 3 + l]) * S[l][j];
        next[i][j] = a * m + beta * k[t * 3 + i] * v[t * 2 + j];
      }
    for (int j = 0; j < 2; ++j) {
      double o = 0;
      for (int i = 0; i < 3; ++i) o += 0.7 * next[i][j] * q[t * 3 + i];
      EXPECT_NEAR(r.o.as<double>()[t * 2 + j], o, 1e-14);
    }
    std::copy(&next[0][0], &next[0][0] + 6, &S[0][0]);
  }
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(r.final_state.as<double>()[i], (&S[0][0])[i], 1e-14);
}

}  // namespace
}  // namespace gdn
