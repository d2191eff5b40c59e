// Backward of the chunked form (spec 3), derived by hand. Per chunk, with S the entering state,
// dS the gradient of the leaving state S' and dO the chunk's output gradient:
//   Vn = U - W S,  O = scale (diag(e) Q S + P Vn),  S' = gamma S + (diag(f) K)^T Vn,
//   W = (I + L)^-1 diag(beta e) K,  U = (I + L)^-1 diag(beta) V,
// with e = exp(G), f = exp(G_last - G), gamma = exp(G_last), P = (Q K^T) * decay. Every factor of
// the form exp(a - b) contributes t to dG_a and -t to dG_b, where t = (its gradient) * (its value);
// dg is then the reverse cumulative sum of dG over the chunk.
#include <algorithm>
#include <vector>

#include "cpu/chunk.h"
#include "cpu/chunked.h"

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
  const Layout at{s};
  const std::vector<Sequence> seqs = sequences(in, s);
  const auto scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(s.K)));
  const std::int64_t C = in.chunk_size, KV = s.K * s.V;
  // dq, dk per value head w.r.t. the normalized q, k: [B, T, HV, K]; summed per key head below.
  std::vector<float> dq_heads(static_cast<std::size_t>(s.B * s.T * s.HV * s.K));
  std::vector<float> dk_heads(dq_heads.size());
  const auto head_row = [&](std::int64_t b, std::int64_t t, std::int64_t hv) {
    return ((b * s.T + t) * s.HV + hv) * s.K;
  };
  const auto tasks = static_cast<std::int64_t>(seqs.size()) * s.HV;
#pragma omp parallel
  {
    Chunk x;
    Mat S(s.K, s.V), dS(s.K, s.V), dS_in, vn, d_o, dvn, d_p, dpd, t, dq, dk, dkd, dbw, dbu, dl,
        e_mat, m2;
    Vec dG, dbeta, dg;
    std::vector<float> states;
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t n = task / s.HV, hv = task % s.HV;
      const Sequence& seq = seqs[static_cast<std::size_t>(n)];
      const std::int64_t chunks = (seq.length + C - 1) / C, b = seq.batch;
      states.resize(static_cast<std::size_t>(chunks * KV));

      // Forward once more, keeping the state that enters each chunk.
      if (in.initial_state.given())
        load_row(in.initial_state, at.state(n, hv), KV, S.data());
      else
        S.setZero();
      for (std::int64_t ci = 0; ci < chunks; ++ci) {
        std::copy_n(S.data(), KV, states.data() + ci * KV);
        const std::int64_t t0 = ci * C, c = std::min(C, seq.length - t0);
        x.prepare(in, at, seq, hv, t0, c);
        vn.noalias() = x.u - x.w * S;
        S *= x.gamma;
        S.noalias() += (x.f.asDiagonal() * x.k).transpose() * vn;
      }

      if (gr.d_final_state.given())
        load_row(gr.d_final_state, at.state(n, hv), KV, dS.data());
      else
        dS.setZero();
      for (std::int64_t ci = chunks - 1; ci >= 0; --ci) {
        const std::int64_t t0 = ci * C, c = std::min(C, seq.length - t0);
        std::copy_n(states.data() + ci * KV, KV, S.data());
        x.prepare(in, at, seq, hv, t0, c);
        vn.noalias() = x.u - x.w * S;
        d_o.resize(c, s.V);
        for (std::int64_t i = 0; i < c; ++i)
          load_row(gr.d_o, at.v(b, seq.begin + t0 + i, hv), s.V, d_o.row(i).data());
        dG.setZero(c);

        // O = scale (diag(e) Q S + P Vn)
        dvn.noalias() = scale * x.p.transpose() * d_o;
        d_p.noalias() = scale * d_o * vn.transpose();
        dpd = d_p.cwiseProduct(x.decay);  // masks the upper triangle
        dq.noalias() = scale * x.e.asDiagonal() * (d_o * S.transpose());
        dq.noalias() += dpd * x.k;
        dk.noalias() = dpd.transpose() * x.q;
        t = d_p.cwiseProduct(x.p);
        add_pair_terms(t, dG);
        dG += scale * x.e.cwiseProduct((x.q * S).cwiseProduct(d_o).rowwise().sum());

        // S' = gamma S + (diag(f) K)^T Vn
        dvn.noalias() += x.f.asDiagonal() * (x.k * dS);
        dkd.noalias() = vn * dS.transpose();
        const Vec f_terms = x.f.cwiseProduct(x.k.cwiseProduct(dkd).rowwise().sum());
        dk.noalias() += x.f.asDiagonal() * dkd;
        dG -= f_terms;
        dG[c - 1] += f_terms.sum() + x.gamma * S.cwiseProduct(dS).sum();

        // Gradient of the entering state: O's Q S term, gamma S, and Vn = U - W S.
        dS_in.noalias() = scale * (x.e.asDiagonal() * x.q).transpose() * d_o;
        dS_in += x.gamma * dS;
        dS_in.noalias() -= x.w.transpose() * dvn;

        // W = (I + L)^-1 Bw, U = (I + L)^-1 Bu: dB = (I + L)^-T dW, dL = -(dBw W^T + dBu U^T)
        dbw.noalias() = -dvn * S.transpose();
        x.L.triangularView<Eigen::UnitLower>().transpose().solveInPlace(dbw);
        dbu = dvn;
        x.L.triangularView<Eigen::UnitLower>().transpose().solveInPlace(dbu);
        dl.noalias() = -dbw * x.w.transpose();
        dl.noalias() -= dbu * x.u.transpose();

        // Bw = diag(beta e) K, Bu = diag(beta) V
        const Vec k_dbw = x.k.cwiseProduct(dbw).rowwise().sum();
        dk.noalias() += (x.beta.cwiseProduct(x.e)).asDiagonal() * dbw;
        dbeta = x.e.cwiseProduct(k_dbw) + x.v.cwiseProduct(dbu).rowwise().sum();
        dG += x.beta.cwiseProduct(x.e).cwiseProduct(k_dbw);
        const Mat dv = x.beta.asDiagonal() * dbu;

        // L = strictly_lower(diag(beta) K K^T * decay)
        e_mat = dl.cwiseProduct(x.decay).triangularView<Eigen::StrictlyLower>();
        m2 = e_mat.cwiseProduct(x.kk);
        dbeta += m2.rowwise().sum();
        const Mat d = x.beta.asDiagonal() * e_mat;
        dk.noalias() += d * x.k;
        dk.noalias() += d.transpose() * x.k;
        t = x.beta.asDiagonal() * m2;
        add_pair_terms(t, dG);

        // G = cumsum(g): dg_j = sum_{i >= j} dG_i
        dg = dG;
        for (std::int64_t i = c - 2; i >= 0; --i) dg[i] += dg[i + 1];

        for (std::int64_t i = 0; i < c; ++i) {
          const std::int64_t tt = seq.begin + t0 + i;
          store_row(gr.dv, at.v(b, tt, hv), s.V, dv.row(i).data());
          store(gr.dg, at.gate(b, tt, hv), dg[i]);
          store(gr.dbeta, at.gate(b, tt, hv), dbeta[i]);
          std::copy_n(dq.row(i).data(), s.K, dq_heads.data() + head_row(b, tt, hv));
          std::copy_n(dk.row(i).data(), s.K, dk_heads.data() + head_row(b, tt, hv));
        }
        dS = dS_in;
      }
      if (gr.dh0.given()) store_row(gr.dh0, at.state(n, hv), KV, dS.data());
    }

    // Sum each key head's value heads, then back through the l2norm.
    const std::int64_t group = s.HV / s.HK;
    std::vector<float> x_hat(s.K), dx(s.K);
#pragma omp for collapse(2)
    for (std::int64_t bt = 0; bt < s.B * s.T; ++bt)
      for (std::int64_t hk = 0; hk < s.HK; ++hk) {
        const std::int64_t b = bt / s.T, tt = bt % s.T;
        for (int which = 0; which < 2; ++which) {
          const std::vector<float>& heads = which == 0 ? dq_heads : dk_heads;
          std::fill(dx.begin(), dx.end(), 0.0f);
          for (std::int64_t hv = hk * group; hv < (hk + 1) * group; ++hv)
            for (std::int64_t i = 0; i < s.K; ++i) dx[i] += heads[head_row(b, tt, hv) + i];
          if (in.use_qk_l2norm) {
            load_row(which == 0 ? in.q : in.k, at.qk(b, tt, hk), s.K, x_hat.data());
            const float r = l2_normalize(x_hat.data(), s.K);
            l2_normalize_backward(x_hat.data(), r, dx.data(), s.K);
          }
          store_row(which == 0 ? gr.dq : gr.dk, at.qk(b, tt, hk), s.K, dx.data());
        }
      }
  }
}

}  // namespace gdn::cpu
