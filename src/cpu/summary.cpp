#include "cpu/summary.h"

#include <algorithm>

#include "cpu/chunk.h"
#include "cpu/flush_denormals.h"

namespace gdn::cpu {
namespace {

// The problem packed for one sequence only.
struct OneSequence {
  std::vector<Sequence> seqs;
  std::vector<Span> spans;
  Packed packed;

  OneSequence(const DeltaRuleInputs& in, const DeltaRuleShape& s, std::int64_t sequence)
      : seqs{sequences(in, s)[static_cast<std::size_t>(sequence)]},
        spans(chunk_spans(seqs, in.chunk_size)),
        packed(pack(in, s, spans, seqs)) {}  // the gates; each chunk's key rows come below
};

}  // namespace

void chunked_summary(const DeltaRuleInputs& in, const DeltaRuleShape& s, std::int64_t sequence,
                     float* M, float* N) {
  const core::Layout at{s};
  const OneSequence one(in, s, sequence);
  const Sequence& seq = one.seqs[0];
  const std::int64_t K = s.K, V = s.V, width = M ? K + V : V;  // state columns [M | N] or [N]
#pragma omp parallel
  {
    const FlushDenormals flush;
    Chunk x;
    KeyScratch keys(one.packed.C, K);
    Mat S(K, width), R, B;
#pragma omp for schedule(dynamic)
    for (std::int64_t hv = 0; hv < s.HV; ++hv) {
      S.setZero();
      if (M) S.leftCols(K).setIdentity();
      if (in.initial_state.given())
        for (std::int64_t i = 0; i < K; ++i)
          core::load_row(in.initial_state, at.state(sequence, hv) + i * V, V,
                         S.row(i).data() + width - V);
      for (const Span& span : one.spans) {
        const std::int64_t c = span.c, t = seq.begin + span.t0;
        pack_keys(in, at, seq.batch, hv / (s.HV / s.HK), t, c, one.packed.C, keys.rows(),
                  /*with_q=*/false);  // the state needs no q
        x.prepare(keys.chunk(), one.packed, seq.batch, hv, t, c, /*with_q=*/false);
        // Vn = (I + L)^-1 ([0 | diag(beta) V] - diag(beta e) K S): U has no part in M's columns.
        R.noalias() = -x.X.topRows(c) * S;
        B.resize(c, V);
        for (std::int64_t i = 0; i < c; ++i)
          core::load_row(in.v, at.v(seq.batch, t + i, hv), V, B.row(i).data());
        R.rightCols(V) += x.beta.asDiagonal() * B;
        x.L.triangularView<Eigen::UnitLower>().solveInPlace(R);
        S *= x.gamma;  // S' = exp(G_C) S + (diag(f) K)^T Vn
        S.noalias() += x.Kf.transpose() * R;
      }
      for (std::int64_t i = 0; i < K; ++i) {
        if (M) std::copy_n(S.row(i).data(), K, M + (hv * K + i) * K);
        std::copy_n(S.row(i).data() + width - V, V, N + (hv * K + i) * V);
      }
    }
  }
}

void chunked_initial_state_grad(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                                std::int64_t sequence, const TensorRef& d_o, const float* dS_T,
                                float* G) {
  const core::Layout at{s};
  const OneSequence one(in, s, sequence);
  const Sequence& seq = one.seqs[0];
  const std::int64_t K = s.K, V = s.V;
  const auto scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(K)));
#pragma omp parallel
  {
    const FlushDenormals flush;
    Chunk x;
    KeyScratch keys(one.packed.C, K);
    Mat dS(K, V), dO, dVn;
#pragma omp for schedule(dynamic)
    for (std::int64_t hv = 0; hv < s.HV; ++hv) {
      if (dS_T)
        std::copy_n(dS_T + hv * K * V, K * V, dS.data());
      else
        dS.setZero();
      for (auto span = one.spans.rbegin(); span != one.spans.rend(); ++span) {
        const std::int64_t c = span->c, t = seq.begin + span->t0;
        pack_keys(in, at, seq.batch, hv / (s.HV / s.HK), t, c, one.packed.C, keys.rows());
        x.prepare(keys.chunk(), one.packed, seq.batch, hv, t, c);
        dO.resize(c, V);
        for (std::int64_t i = 0; i < c; ++i)
          core::load_row(d_o, at.v(seq.batch, t + i, hv), V, dO.row(i).data());
        // dVn = scale P^T dO + diag(f) K dS; dS_in = scale (diag(e) Q)^T dO + gamma dS - W^T dVn
        // with W^T dVn = (diag(beta e) K)^T (I + L)^-T dVn.
        dVn.noalias() = scale * x.P.transpose() * dO;
        dVn.noalias() += x.Kf * dS;
        x.L.triangularView<Eigen::UnitLower>().transpose().solveInPlace(dVn);
        dS *= x.gamma;
        dS.noalias() += scale * x.X.bottomRows(c).transpose() * dO;
        dS.noalias() -= x.X.topRows(c).transpose() * dVn;
      }
      std::copy_n(dS.data(), K * V, G + hv * K * V);
    }
  }
}

}  // namespace gdn::cpu
