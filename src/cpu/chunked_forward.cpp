#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/chunk.h"
#include "cpu/chunked.h"
#include "cpu/flush_denormals.h"
#include "cpu/gemm.h"
#include "cpu/stream_rows.h"

namespace gdn::cpu {

// In parallel over (sequence, key head): each chunk's key rows (q, k normalized, Q K^T, K K^T)
// are made once, into the thread's scratch, right before the group's value heads read them, so
// they are read from cache and no T-long copy of q and k is ever written. With fewer (sequence,
// key head) pairs than threads, each pair's value heads are split into `parts` tasks, each making
// the key rows itself.
void chunked_forward(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                     const DeltaRuleOutputs& out) {
  const core::Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const std::vector<Span> spans = chunk_spans(seqs, in.chunk_size);
  const Packed p = pack(in, s, spans, seqs);
  const auto scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(s.K)));
  const std::int64_t C = p.C, group = s.HV / s.HK;
  const auto pairs = std::max<std::int64_t>(static_cast<std::int64_t>(seqs.size()) * s.HK, 1);
  const std::int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const std::int64_t parts = std::min(group, (threads + pairs - 1) / pairs), tasks = pairs * parts;
#pragma omp parallel
  {
    const FlushDenormals flush;
    Chunk x;
    KeyScratch keys(C, s.K);
    Mat Y, R, O;
    std::vector<Mat> states(static_cast<std::size_t>(group), Mat(s.K, s.V));
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t n = task / parts / s.HK, hk = task / parts % s.HK, part = task % parts;
      const std::int64_t j0 = part * group / parts, j1 = (part + 1) * group / parts;
      const Sequence& seq = seqs[static_cast<std::size_t>(n)];
      for (std::int64_t j = j0; j < j1; ++j) {
        Mat& S = states[static_cast<std::size_t>(j)];
        if (in.initial_state.given())
          core::load_row(in.initial_state, at.state(n, hk * group + j), s.K * s.V, S.data());
        else
          S.setZero();
      }
      for (std::int64_t t0 = 0; t0 < seq.length; t0 += C) {
        const std::int64_t c = std::min(C, seq.length - t0), t = seq.begin + t0;
        pack_keys(in, at, seq.batch, hk, t, c, C, keys.rows());
        for (std::int64_t j = j0; j < j1; ++j) {
          const std::int64_t hv = hk * group + j;
          Mat& S = states[static_cast<std::size_t>(j)];
          x.prepare(keys.chunk(), p, seq.batch, hv, t, c);
          Y.resize(2 * c, s.V);  // [diag(beta e) K S; diag(e) Q S]
          gemm<Op::N>(2 * c, s.V, s.K, x.X.data(), s.K, S.data(), s.V, Y.data(), s.V, false);
          R.resize(c, s.V);
          for (std::int64_t i = 0; i < c; ++i)
            core::load_row(in.v, at.v(seq.batch, t + i, hv), s.V, R.row(i).data());
          R = x.beta.asDiagonal() * R - Y.topRows(c);
          // Vn = U - W S = (I + L)^-1 (diag(beta) V - diag(beta e) K S)
          solve_unit_lower<Op::N>(c, s.V, x.L.data(), c, R.data(), s.V);
          // O = scale [Qe S + P Vn], P lower
          gemm<Op::N, Shape::a_lower>(c, s.V, c, x.P.data(), c, R.data(), s.V, Y.data() + c * s.V,
                                      s.V, true);
          O = scale * Y.bottomRows(c);
          // S' = exp(G_C) S + (diag(f) K)^T Vn
          gemm<Op::T>(s.K, s.V, c, x.Kf.data(), s.K, R.data(), s.V, S.data(), s.V, true, x.gamma);
          for (std::int64_t i = 0; i < c; ++i)
            stream_row(out.o, at.v(seq.batch, t + i, hv), s.V, O.row(i).data());
        }
      }
      if (out.final_state.given())
        for (std::int64_t j = j0; j < j1; ++j)
          core::store_row(out.final_state, at.state(n, hk * group + j), s.K * s.V,
                          states[static_cast<std::size_t>(j)].data());
    }
    stream_fence();
  }
}

}  // namespace gdn::cpu
