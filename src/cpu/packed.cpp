#include "cpu/packed.h"

#include <sys/mman.h>

#include <algorithm>

#include "core/reset.h"
#include "cpu/chunk.h"
#include "cpu/gemm.h"

namespace gdn::cpu {

Buffer::Buffer(std::size_t n) {
  constexpr std::size_t kHuge = std::size_t{2} << 20, kLine = 64;
  const bool huge =
      n * sizeof(float) >= kHuge;  // smaller: the heap's memory, reused call after call
  const std::size_t align = huge ? kHuge : kLine;
  const std::size_t bytes = (n * sizeof(float) + align - 1) / align * align;
  values_.reset(static_cast<float*>(std::aligned_alloc(align, bytes)));
  if (!values_ && bytes > 0) throw std::bad_alloc();
  if (huge) madvise(values_.get(), bytes, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
}

std::vector<Span> chunk_spans(const std::vector<Sequence>& seqs, std::int64_t C) {
  std::vector<Span> spans;
  for (std::size_t n = 0; n < seqs.size(); ++n)
    for (std::int64_t t0 = 0; t0 < seqs[n].length; t0 += C)
      spans.push_back({static_cast<std::int64_t>(n), t0, std::min(C, seqs[n].length - t0)});
  return spans;
}

void pack_keys(const DeltaRuleInputs& in, const core::Layout& at, std::int64_t b, std::int64_t hk,
               std::int64_t t, std::int64_t c, std::int64_t C, const KeyRows& out, bool with_q) {
  const std::int64_t K = at.s.K;
  // The loads first, in a loop of their own: each row is on its own page of the caller's tensor,
  // and a normalization between them held back the next rows' loads.
  if (with_q)
    for (std::int64_t i = 0; i < c; ++i)
      core::load_row(in.q, at.qk(b, t + i, hk), K, out.q + i * K);
  for (std::int64_t i = 0; i < c; ++i) core::load_row(in.k, at.qk(b, t + i, hk), K, out.k + i * K);
  for (std::int64_t i = 0; i < c; ++i) {
    if (with_q) out.rq[i] = in.use_qk_l2norm ? l2_normalize(out.q + i * K, K) : 1.0f;
    out.rk[i] = in.use_qk_l2norm ? l2_normalize(out.k + i * K, K) : 1.0f;
  }
  transpose(c, K, out.k, K, out.kt, c);
  gemm<Op::N, Shape::c_lower>(c, c, K, out.k, K, out.kt, c, out.kk, C, false);
  Block kk(out.kk, c, c, Stride(C));
  kk.triangularView<Eigen::StrictlyUpper>().setZero();
  if (!with_q) return;
  gemm<Op::N, Shape::c_lower>(c, c, K, out.q, K, out.kt, c, out.qk, C, false);
  Block qk(out.qk, c, c, Stride(C));
  qk.triangularView<Eigen::StrictlyUpper>().setZero();
}

Packed pack(const DeltaRuleInputs& in, const DeltaRuleShape& s, const std::vector<Span>& spans,
            const std::vector<Sequence>& seqs) {
  const core::Layout at{s};
  const auto value_rows = static_cast<std::size_t>(s.B * s.HV * s.T);
  // No chunk holds more than T tokens: a larger chunk_size must not grow the chunk scratch.
  Packed p{.s = s,
           .C = std::min<std::int64_t>(in.chunk_size, s.T),
           .H = Buffer(value_rows),
           .beta = Buffer(value_rows),
           .reset = Buffer(value_rows)};
  const auto tasks = static_cast<std::int64_t>(spans.size()) * s.HV;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const Span& span = spans[static_cast<std::size_t>(task / s.HV)];
    const Sequence& seq = seqs[static_cast<std::size_t>(span.n)];
    const std::int64_t hv = task % s.HV, b = seq.batch, t = seq.begin + span.t0;
    const std::int64_t first = p.value_row(b, hv, t);
    float running = 0;  // H_i = sum of g_j, j <= i, over the j that are not resets
    for (std::int64_t i = 0; i < span.c; ++i) {
      const auto g = core::load<float>(in.g, at.gate(b, t + i, hv));
      const bool reset = core::is_reset(g);
      if (!reset) running += g;
      p.H[first + i] = running;
      p.reset[first + i] = reset ? 1.0f : 0.0f;
      p.beta[first + i] = core::load<float>(in.beta, at.gate(b, t + i, hv));
    }
  }
  return p;
}

}  // namespace gdn::cpu
