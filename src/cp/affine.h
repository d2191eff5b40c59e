#pragma once
// Affine maps of carried states (spec 4), one per (chain, value head): x -> M x + N with
// M [K, K] and N [K, V]. Forward maps send the entering state to the leaving one; backward maps
// send the leaving state's gradient to the entering one's (M^T dS + G), so both compose alike.
// The algebra runs on the backend (cp/backend.h).

#include <cstdint>

#include "cp/backend.h"

namespace gdn::cp {

struct AffineMaps {
  std::int64_t count = 0, K = 0, V = 0;  // count = chains * HV
  Buffer data;                           // [count, K, K] matrices M, then [count, K, V] offsets N

  static AffineMaps zeros(Backend& backend, std::int64_t count, std::int64_t K, std::int64_t V) {
    return {count, K, V, backend.allocate(static_cast<std::size_t>(count * (K * K + K * V)) * 4)};
  }
  float* M() const { return data.floats(); }
  float* N() const { return data.floats() + count * K * K; }
  std::size_t bytes() const { return data.bytes(); }
  std::size_t offset_bytes() const { return static_cast<std::size_t>(count * K * V) * 4; }
};

}  // namespace gdn::cp
