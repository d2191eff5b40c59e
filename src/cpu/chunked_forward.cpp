#include <algorithm>

#include "cpu/chunk.h"
#include "cpu/chunked.h"

namespace gdn::cpu {

void chunked_forward(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                     const DeltaRuleOutputs& out) {
  const Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const auto scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(s.K)));
  const std::int64_t C = in.chunk_size;
  const auto tasks = static_cast<std::int64_t>(seqs.size()) * s.HV;
#pragma omp parallel
  {
    Chunk x;
    Mat S(s.K, s.V), vn, o;
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t n = task / s.HV, hv = task % s.HV;
      const Sequence& seq = seqs[static_cast<std::size_t>(n)];
      if (in.initial_state.given())
        load_row(in.initial_state, at.state(n, hv), s.K * s.V, S.data());
      else
        S.setZero();
      for (std::int64_t t0 = 0; t0 < seq.length; t0 += C) {
        const std::int64_t c = std::min(C, seq.length - t0);
        x.prepare(in, at, seq, hv, t0, c);
        vn.noalias() = x.u - x.w * S;                              // Vn = U - W S
        o.noalias() = x.e.asDiagonal() * (x.q * S);                // diag(exp G) Q S
        o.noalias() += x.p * vn;                                   //   + (Q K^T * decay) Vn
        S *= x.gamma;                                              // S' = exp(G_C) S
        S.noalias() += (x.f.asDiagonal() * x.k).transpose() * vn;  // + (diag(f) K)^T Vn
        for (std::int64_t i = 0; i < c; ++i) {
          o.row(i) *= scale;
          store_row(out.o, at.v(seq.batch, seq.begin + t0 + i, hv), s.V, o.row(i).data());
        }
      }
      if (out.final_state.given()) store_row(out.final_state, at.state(n, hv), s.K * s.V, S.data());
    }
  }
}

}  // namespace gdn::cpu
