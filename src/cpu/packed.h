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

// Float32 scratch, left uninitialized (every element that is read was written first). From
// 2 MiB up, backed by 2 MiB pages where the kernel allows: a fresh buffer of a few hundred MB
// then costs a few hundred page faults instead of 10^5. Smaller ones (the per-token gates, below
// 1 MiB at T = 8192) come from the heap as they are: rounded up to a 2 MiB page, each was a
// fresh page for the kernel to zero on every call (3% of a forward + backward at T = 2048).
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

// One chunk's rows of one key head: q, k [c, K] (l2-normalized when asked) and Q K^T, K K^T
// [c, C] (row i: row i of the chunk's product, 0 above the diagonal).
struct KeyChunk {
  const float *q, *k, *qk, *kk;
};

// Where pack_keys writes a chunk's key rows, with the l2norm factors rq, rk [c]; kt [K, c] is
// its scratch for K^T.
struct KeyRows {
  float *q, *k, *rq, *rk, *qk, *kk, *kt;
};

// Tokens [t, t + c) of batch row b, key head hk: q, k loaded (and normalized when asked), then
// Q K^T and K K^T, rows C apart. Without `with_q`, k and K K^T only (q, rq and Q K^T are left
// as they were).
void pack_keys(const DeltaRuleInputs& in, const core::Layout& at, std::int64_t b, std::int64_t hk,
               std::int64_t t, std::int64_t c, std::int64_t C, const KeyRows& out,
               bool with_q = true);

// The gates of every value head, chunk-local (the key rows are made chunk by chunk: pack_keys).
struct Packed {
  DeltaRuleShape s;
  std::int64_t C;  // chunk size, at most T
  Buffer H, beta;  // [B, HV, T]     H: chunk-local cumulative sum of the g that are not resets
  Buffer reset;    // [B, HV, T]     1 for a full reset (core/reset.h), else 0

  std::int64_t value_row(std::int64_t b, std::int64_t hv, std::int64_t t) const {
    return (b * s.HV + hv) * s.T + t;
  }
};

// Fills every field, in parallel over (chunk, key head).
Packed pack(const DeltaRuleInputs& in, const DeltaRuleShape& s, const std::vector<Span>& spans,
            const std::vector<Sequence>& seqs);

}  // namespace gdn::cpu
