#pragma once
// The call's inputs converted once to float32 and laid out head-major, so that a chunk's rows are
// contiguous; what depends only on the key head (q, k normalized, Q K^T, K K^T) is computed once
// per key head, not once per value head that reads it (spec 2, grouped heads).

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/layout.h"
#include "cpu/l2norm.h"

namespace gdn::cpu {

// Tokens [t0, t0 + c) of sequence n: one chunk (spec 3).
struct Span {
  std::int64_t n, t0, c;
};

std::vector<Span> chunk_spans(const std::vector<Sequence>& seqs, std::int64_t C);

// Float32 scratch, left uninitialized (every element that is read was written first) and backed
// by 2 MiB pages where the kernel allows: a fresh buffer of a few hundred MB then costs a few
// hundred page faults instead of 10^5.
class Buffer {
 public:
  explicit Buffer(std::size_t n = 0);
  float* data() { return values_.get(); }
  const float* data() const { return values_.get(); }
  float& operator[](std::size_t i) { return values_[i]; }
  float operator[](std::size_t i) const { return values_[i]; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> values_;
};

struct Packed {
  DeltaRuleShape s;
  std::int64_t C;
  Buffer q, k;     // [B, HK, T, K]  l2-normalized when asked
  Buffer rq, rk;   // [B, HK, T]     the l2norm factors r (1 without l2norm)
  Buffer qk, kk;   // [B, HK, T, C]  row i: row i of its chunk's Q K^T, K K^T (0 above the diagonal)
  Buffer H, beta;  // [B, HV, T]     H: chunk-local cumulative sum of the g that are not resets
  Buffer reset;    // [B, HV, T]     1 for a full reset (core/reset.h), else 0

  std::int64_t key_row(std::int64_t b, std::int64_t hk, std::int64_t t) const {
    return (b * s.HK + hk) * s.T + t;
  }
  std::int64_t value_row(std::int64_t b, std::int64_t hv, std::int64_t t) const {
    return (b * s.HV + hv) * s.T + t;
  }
};

// Fills every field, in parallel over (chunk, key head).
Packed pack(const DeltaRuleInputs& in, const DeltaRuleShape& s, const std::vector<Span>& spans,
            const std::vector<Sequence>& seqs);

}  // namespace gdn::cpu
