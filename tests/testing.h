#pragma once
// Shared test helpers: run a problem through a method, compare every output and gradient.

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace gdn::testing
