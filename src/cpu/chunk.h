#pragma once
// One chunk of one value head in the WY form (spec 3), float32, shared by the chunked forward
// and backward. Matrices are row-major: row i is token i of the chunk.

#include <Eigen/Dense>
#include <cmath>

#include "cpu/layout.h"

namespace gdn::cpu {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

struct Chunk {
  Mat q, k, v;         // [c, K], [c, K], [c, V]   (q, k l2-normalized when asked)
  Vec q_norm, k_norm;  // [c]  the l2norm factors r (backward needs them)
  Vec G;               // [c]  chunk-local cumulative sum of g
  Vec beta;            // [c]
  Vec e;               // [c]  exp(G_i)
  Vec f;               // [c]  exp(G_last - G_i)
  float gamma = 1;     //      exp(G_last)
  Mat decay;           // [c, c]  exp(G_i - G_j) on and below the diagonal, 0 above
  Mat kk;              // [c, c]  K K^T
  Mat L;               // [c, c]  strictly_lower(diag(beta) K K^T * decay)
  Mat w;               // [c, K]  (I + L)^-1 diag(beta e) K
  Mat u;               // [c, V]  (I + L)^-1 diag(beta) V
  Mat p;               // [c, c]  (Q K^T) * decay (lower, diagonal included)

  // Loads tokens [t0, t0 + c) of `seq` for value head hv and builds every matrix above.
  void prepare(const DeltaRuleInputs& in, const Layout& at, const Sequence& seq, std::int64_t hv,
               std::int64_t t0, std::int64_t c) {
    const std::int64_t K = at.s.K, V = at.s.V, b = seq.batch, hk = at.key_head(hv);
    q.resize(c, K);
    k.resize(c, K);
    v.resize(c, V);
    q_norm.setOnes(c);
    k_norm.setOnes(c);
    G.resize(c);
    beta.resize(c);
    float running = 0;
    for (std::int64_t i = 0; i < c; ++i) {
      const std::int64_t t = seq.begin + t0 + i;
      load_row(in.q, at.qk(b, t, hk), K, q.row(i).data());
      load_row(in.k, at.qk(b, t, hk), K, k.row(i).data());
      load_row(in.v, at.v(b, t, hv), V, v.row(i).data());
      if (in.use_qk_l2norm) {
        q_norm[i] = l2_normalize(q.row(i).data(), K);
        k_norm[i] = l2_normalize(k.row(i).data(), K);
      }
      running += load<float>(in.g, at.gate(b, t, hv));
      G[i] = running;
      beta[i] = load<float>(in.beta, at.gate(b, t, hv));
    }
    const float last = G[c - 1];
    e = G.array().exp();
    f = (last - G.array()).exp();
    gamma = std::exp(last);
    decay.setZero(c, c);  // masked before exponentiating: G_i - G_j > 0 above the diagonal
    for (std::int64_t i = 0; i < c; ++i)
      for (std::int64_t j = 0; j <= i; ++j) decay(i, j) = std::exp(G[i] - G[j]);
    kk.noalias() = k * k.transpose();
    L = (beta.asDiagonal() * kk.cwiseProduct(decay)).triangularView<Eigen::StrictlyLower>();
    w.noalias() = (beta.cwiseProduct(e)).asDiagonal() * k;
    L.triangularView<Eigen::UnitLower>().solveInPlace(w);
    u.noalias() = beta.asDiagonal() * v;
    L.triangularView<Eigen::UnitLower>().solveInPlace(u);
    p.noalias() = q * k.transpose();
    p = p.cwiseProduct(decay);
  }
};

}  // namespace gdn::cpu
