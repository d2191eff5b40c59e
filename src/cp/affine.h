#pragma once
// Affine maps of carried states (spec 4), one per (chain, value head): x -> M x + N with
// M [K, K] and N [K, V]. Forward maps send the entering state to the leaving one; backward maps
// send the leaving state's gradient to the entering one's (M^T dS + G), so both compose alike.

#include <cstdint>
#include <vector>

namespace gdn::cp {

struct AffineMaps {
  std::int64_t count = 0, K = 0, V = 0;  // count = chains * HV
  std::vector<float> data;               // [count, K, K] matrices M, then [count, K, V] offsets N

  static AffineMaps zeros(std::int64_t count, std::int64_t K, std::int64_t V);

  float* M(std::int64_t i) { return data.data() + i * K * K; }
  const float* M(std::int64_t i) const { return data.data() + i * K * K; }
  float* N(std::int64_t i) { return data.data() + count * K * K + i * K * V; }
  const float* N(std::int64_t i) const { return data.data() + count * K * K + i * K * V; }
  std::size_t bytes() const { return data.size() * sizeof(float); }

  std::vector<float> apply(const std::vector<float>& x) const;  // M x + N, x: [count, K, V]
  AffineMaps after(const AffineMaps& first) const;  // (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2)
  void transpose_matrices();                        // M <- M^T
};

}  // namespace gdn::cp
