#pragma once
// Shared test helpers: run a problem through a method, compare every output and gradient.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/convert.h"
#include "gdn/delta_rule.h"
#include "gdn/problem.h"

namespace gdn::testing {

inline ProblemResults run(const Problem& p, ProblemData& data, Method method, DType dtype) {
  ProblemResults r = allocate_results(p, dtype);
  delta_rule_forward(data.inputs(), r.outputs(), method);
  delta_rule_backward(data.inputs(), r.grads(data), method);
  return r;
}

inline std::vector<std::pair<std::string, HostTensor*>> named(ProblemResults& r) {
  std::vector<std::pair<std::string, HostTensor*>> out = {
      {"o", &r.o},        {"final_state", &r.final_state},
      {"dq", &r.dq},      {"dk", &r.dk},
      {"dv", &r.dv},      {"dg", &r.dg},
      {"dbeta", &r.dbeta}};
  if (!r.dh0.bytes.empty()) out.emplace_back("dh0", &r.dh0);
  return out;
}

// The per-token input named q, k, v, g or beta.
inline HostTensor& input_named(ProblemData& data, const std::string& name) {
  return name == "q"   ? data.q
         : name == "k" ? data.k
         : name == "v" ? data.v
         : name == "g" ? data.g
                       : data.beta;
}

// Relative Frobenius error of every tensor <= tol; on failure, where the largest gap is.
inline void expect_close(ProblemResults& x, ProblemResults& ref, double tol,
                         const std::string& what = "") {
  auto xs = named(x), refs = named(ref);
  ASSERT_EQ(xs.size(), refs.size());
  for (std::size_t n = 0; n < xs.size(); ++n) {
    const TensorRef a = xs[n].second->ref(), b = refs[n].second->ref();
    const double err = relative_error(a, b);
    std::int64_t worst = 0;
    double gap = -1;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      const double d = std::abs(core::load<double>(a, i) - core::load<double>(b, i));
      if (d > gap) gap = d, worst = i;
    }
    EXPECT_LE(err, tol) << what << " " << xs[n].first << ": relative error " << err
                        << "; largest gap at flat index " << worst << ": "
                        << core::load<double>(a, worst) << " vs " << core::load<double>(b, worst);
  }
}

// Full resets (issue 11; src/core/reset.h) written over a problem's g: g = -inf, -1e38, -1e37 or
// -200 in turn. At each of `tokens` (indices into the T axis) of every batch row, for two value
// heads of three (which two, and which value, rotates with the head and the row), and at every
// other token of every head with probability `rate` (fresh, from `seed`). The other gates stay as
// generated. Returns how many gates became resets.
inline std::int64_t add_resets(ProblemData& d, const std::vector<std::int64_t>& tokens, double rate,
                               std::uint64_t seed) {
  constexpr double kValues[] = {-std::numeric_limits<double>::infinity(), -1e38, -1e37, -200.0};
  const TensorRef g = d.g.ref();
  const std::int64_t B = g.shape[0], T = g.shape[1], HV = g.shape[2];
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::int64_t count = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t hv = 0; hv < HV; ++hv) {
        const bool listed = std::find(tokens.begin(), tokens.end(), t) != tokens.end();
        const auto turn = static_cast<std::size_t>(t + hv + b);
        if ((listed && turn % 3 != 0) || unit(rng) < rate) {
          core::store(g, (b * T + t) * HV + hv, kValues[turn % 4]);
          ++count;
        }
      }
  return count;
}

}  // namespace gdn::testing
