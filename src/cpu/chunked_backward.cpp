// Backward of the chunked form (spec 3), derived by hand. Per chunk, with S the entering state,
// dS the gradient of the leaving state S' and dO the chunk's output gradient:
//   X = [Kb; Qe] = [diag(beta e) K; diag(e) Q],  Vn = (I + L)^-1 (diag(beta) V - Kb S),
//   O = scale (Qe S + P Vn),  S' = gamma S + Kf^T Vn,  Kf = diag(f) K,
// with e = exp(G), f = exp(G_last - G), gamma = exp(G_last), P = (Q K^T) * decay. Then
//   dVn = scale P^T dO + Kf dS,  dR = (I + L)^-T dVn,  dL = -dR Vn^T,
//   D = [-dR; scale dO]:  [dKb; dQe] = D S^T,  dS_in = gamma dS + X^T D.
// Every factor of the form exp(a - b) contributes t to dG_a and -t to dG_b, where
// t = (its gradient) * (its value); dg is then the reverse cumulative sum of dG over the chunk.
//
// A task is one (sequence, key head): its value heads' dq, dk are summed in the task, so no
// per-value-head copy of them is ever stored.
#include <algorithm>
#include <vector>

#include "cpu/chunk.h"
#include "cpu/chunked.h"
#include "cpu/flush_denormals.h"
#include "cpu/gemm.h"
#include "cpu/stream_rows.h"

namespace gdn::cpu {
namespace {

// Accumulates t_ij into dG_i and -t_ij into dG_j (the factor exp(G_i - G_j)).
void add_pair_terms(const Mat& t, Vec& dG) {
  dG += t.rowwise().sum();
  dG -= t.colwise().sum().transpose();
}

}  // namespace

void chunked_backward(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                      const DeltaRuleGrads& gr) {
  const core::Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const std::vector<Span> spans = chunk_spans(seqs, in.chunk_size);
  const Packed p = pack(in, s, spans, seqs);  // key rows: chunk by chunk below
  const auto scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(s.K)));
  const std::int64_t C = p.C, K = s.K, V = s.V, KV = K * V, group = s.HV / s.HK;
  std::int64_t longest = 0;
  for (const Sequence& seq : seqs) longest = std::max(longest, seq.length);
  const std::int64_t state_stride = ((longest + C - 1) / C + 1) * KV, vn_stride = longest * V;
  const auto tasks = static_cast<std::int64_t>(seqs.size()) * s.HK;
#pragma omp parallel
  {
    const FlushDenormals flush;
    Chunk x;
    // Per value head of the group: the state entering every chunk, every chunk's Vn, dS.
    Buffer states(static_cast<std::size_t>(group * state_stride));
    Buffer vns(static_cast<std::size_t>(group * vn_stride));
    std::vector<Mat> dS(static_cast<std::size_t>(group), Mat(K, V));
    KeyScratch keys(C, K);  // the chunk's key rows, made once per pass for the group
    Mat dS_in, Y, D, dvn, dlp, dx, dkf, v, dq, dk, t_pair, m2, dl, dpd;
    Mat S_t(V, K), dS_t(V, K), vn_t(V, C);  // S^T, dS^T, Vn^T: the B of A B^T products
    Vec dG, dbeta;
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t n = task / s.HK, hk = task % s.HK;
      const Sequence& seq = seqs[static_cast<std::size_t>(n)];
      const std::int64_t chunks = (seq.length + C - 1) / C, b = seq.batch;

      // Forward once more, keeping the state entering each chunk and each chunk's Vn.
      for (std::int64_t j = 0; j < group; ++j) {
        float* state = states.data() + j * state_stride;
        if (in.initial_state.given())
          core::load_row(in.initial_state, at.state(n, hk * group + j), KV, state);
        else
          std::fill_n(state, KV, 0.0f);
      }
      for (std::int64_t ci = 0; ci < chunks; ++ci) {
        const std::int64_t t0 = ci * C, c = std::min(C, seq.length - t0), t = seq.begin + t0;
        pack_keys(in, at, b, hk, t, c, C, keys.rows(), /*with_q=*/false);  // the state needs no q
        for (std::int64_t j = 0; j < group; ++j) {
          const std::int64_t hv = hk * group + j;
          float* state = states.data() + j * state_stride;
          const Rows S(state + ci * KV, K, V);
          MutableRows next(state + (ci + 1) * KV, K, V),
              vn(vns.data() + j * vn_stride + t0 * V, c, V);
          x.prepare(keys.chunk(), p, b, hv, t, c, /*with_q=*/false);
          Y.resize(c, V);
          gemm<Op::N>(c, V, K, x.X.data(), K, S.data(), V, Y.data(), V, false);
          for (std::int64_t i = 0; i < c; ++i)
            core::load_row(in.v, at.v(b, t + i, hv), V, vn.row(i).data());
          vn = x.beta.asDiagonal() * vn - Y;
          solve_unit_lower<Op::N>(c, V, x.L.data(), c, vn.data(), V);
          next = x.gamma * S;
          gemm<Op::T>(K, V, c, x.Kf.data(), K, vn.data(), V, next.data(), V, true);
        }
      }
      for (std::int64_t j = 0; j < group; ++j)
        if (gr.d_final_state.given())
          core::load_row(gr.d_final_state, at.state(n, hk * group + j), KV, dS[j].data());
        else
          dS[j].setZero();

      for (std::int64_t ci = chunks - 1; ci >= 0; --ci) {
        const std::int64_t t0 = ci * C, c = std::min(C, seq.length - t0), t = seq.begin + t0;
        pack_keys(in, at, b, hk, t, c, C, keys.rows());
        dq.setZero(c, K);  // summed over the group's value heads
        dk.setZero(c, K);
        for (std::int64_t j = 0; j < group; ++j) {
          const std::int64_t hv = hk * group + j;
          const Rows S(states.data() + j * state_stride + ci * KV, K, V);
          const Rows vn(vns.data() + j * vn_stride + t0 * V, c, V);
          x.prepare(keys.chunk(), p, b, hv, t, c);
          const Rows q = x.q(), k = x.k();
          D.resize(2 * c, V);
          v.resize(c, V);
          for (std::int64_t i = 0; i < c; ++i) {
            core::load_row(gr.d_o, at.v(b, t + i, hv), V, D.row(c + i).data());
            core::load_row(in.v, at.v(b, t + i, hv), V, v.row(i).data());
          }
          D.bottomRows(c) *= scale;

          // O = scale (Qe S + P Vn), S' = gamma S + Kf^T Vn, Vn = (I + L)^-1 R
          dvn.resize(c, V);  // P^T (scale dO), P^T upper
          gemm<Op::T, Shape::a_upper>(c, V, c, x.P.data(), c, D.data() + c * V, V, dvn.data(), V,
                                      false);
          gemm<Op::N>(c, V, K, x.Kf.data(), K, dS[j].data(), V, dvn.data(), V, true);
          solve_unit_lower<Op::T>(c, V, x.L.data(), c, dvn.data(), V);  // dR
          D.topRows(c) = -dvn;
          transpose(c, V, vn.data(), V, vn_t.data(), c);
          transpose(K, V, S.data(), V, S_t.data(), K);
          transpose(K, V, dS[j].data(), V, dS_t.data(), K);
          // [dL; dP] = [-dR; scale dO] Vn^T, of which only the lower triangles are read below
          dlp.resize(2 * c, c);
          for (std::int64_t half = 0; half < 2; ++half)
            gemm<Op::N, Shape::c_lower>(c, c, V, D.data() + half * c * V, V, vn_t.data(), c,
                                        dlp.data() + half * c * c, c, false);
          dx.resize(2 * c, K);  // [dKb; dQe] = D S^T
          gemm<Op::N>(2 * c, K, V, D.data(), V, S_t.data(), K, dx.data(), K, false);
          dS_in = x.gamma * dS[j];
          gemm<Op::T>(K, V, 2 * c, x.X.data(), K, D.data(), V, dS_in.data(), V, true);
          dkf.resize(c, K);
          gemm<Op::N>(c, K, V, vn.data(), V, dS_t.data(), K, dkf.data(), K, false);

          // R = diag(beta) V - Kb S,  Kb = diag(beta e) K,  Qe = diag(e) Q,  Kf = diag(f) K
          const Vec k_dkb = k.cwiseProduct(dx.topRows(c)).rowwise().sum();
          const Vec q_dqe = q.cwiseProduct(dx.bottomRows(c)).rowwise().sum();
          const Vec k_dkf = x.f.cwiseProduct(k.cwiseProduct(dkf).rowwise().sum());
          dbeta = v.cwiseProduct(dvn).rowwise().sum() + x.e.cwiseProduct(k_dkb);
          dG = x.beta.cwiseProduct(x.e).cwiseProduct(k_dkb) + x.e.cwiseProduct(q_dqe) - k_dkf;
          dG[c - 1] += k_dkf.sum() + x.gamma * S.cwiseProduct(dS[j]).sum();
          v = x.beta.asDiagonal() * dvn;  // dV = diag(beta) dR
          dk.noalias() += x.beta.cwiseProduct(x.e).asDiagonal() * dx.topRows(c);
          dk.noalias() += x.f.asDiagonal() * dkf;
          dq.noalias() += x.e.asDiagonal() * dx.bottomRows(c);

          // P = (Q K^T) * decay
          dpd = dlp.bottomRows(c).cwiseProduct(x.decay);
          gemm<Op::N, Shape::a_lower>(c, K, c, dpd.data(), c, k.data(), K, dq.data(), K, true);
          gemm<Op::T, Shape::a_upper>(c, K, c, dpd.data(), c, q.data(), K, dk.data(), K, true);
          t_pair = dlp.bottomRows(c).cwiseProduct(x.P);
          add_pair_terms(t_pair, dG);

          // L = strictly_lower(diag(beta) K K^T * decay)
          dl = dlp.topRows(c).cwiseProduct(x.decay).triangularView<Eigen::StrictlyLower>();
          m2 = dl.cwiseProduct(x.kk());
          dbeta += m2.rowwise().sum();
          dl = x.beta.asDiagonal() * dl;
          dl += dl.transpose().eval();
          gemm<Op::N>(c, K, c, dl.data(), c, k.data(), K, dk.data(), K, true);
          t_pair = x.beta.asDiagonal() * m2;
          add_pair_terms(t_pair, dG);

          // G = cumsum(g): dg_j = sum_{i >= j} dG_i. The terms from a reset r on sum to 0
          // exactly (the factors that change when all G_i, i >= r, move together are those
          // across r, all 0; core/reset.h), so the sum stops at the next reset, and a reset's
          // own dg is 0 (the derivative of the clamp max(g, -128)).
          for (std::int64_t i = c - 2; i >= 0; --i)
            if (x.first[static_cast<std::size_t>(i + 1)] != i + 1) dG[i] += dG[i + 1];
          for (std::int64_t i = 0; i < c; ++i)
            if (x.first[static_cast<std::size_t>(i)] == i) dG[i] = 0;

          for (std::int64_t i = 0; i < c; ++i) {
            stream_row(gr.dv, at.v(b, t + i, hv), V, v.row(i).data());
            core::store(gr.dg, at.gate(b, t + i, hv), dG[i]);
            core::store(gr.dbeta, at.gate(b, t + i, hv), dbeta[i]);
          }
          dS[j].swap(dS_in);
        }

        // Back through the l2norm of the key head's rows, then out.
        for (std::int64_t i = 0; i < c; ++i) {
          if (in.use_qk_l2norm) {
            l2_normalize_backward(keys.q.row(i).data(), keys.rq[i], dq.row(i).data(), K);
            l2_normalize_backward(keys.k.row(i).data(), keys.rk[i], dk.row(i).data(), K);
          }
          stream_row(gr.dq, at.qk(b, t + i, hk), K, dq.row(i).data());
          stream_row(gr.dk, at.qk(b, t + i, hk), K, dk.row(i).data());
        }
      }
      if (gr.dh0.given())
        for (std::int64_t j = 0; j < group; ++j)
          core::store_row(gr.dh0, at.state(n, hk * group + j), KV, dS[j].data());
    }
    stream_fence();
  }
}

}  // namespace gdn::cpu
