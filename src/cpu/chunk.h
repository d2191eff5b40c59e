#pragma once
// One chunk of one value head in the WY form (spec 3), float32, shared by the chunked forward
// and backward. Matrices are row-major: row i is token i of the chunk.

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/packed.h"

namespace gdn::cpu {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;
using Rows = Eigen::Map<const Mat>;  // consecutive rows of a row-major field
using MutableRows = Eigen::Map<Mat>;
using Stride = Eigen::OuterStride<>;
using Block = Eigen::Map<Mat, 0, Stride>;  // a c x c block of rows C apart
using ConstBlock = Eigen::Map<const Mat, 0, Stride>;

// A thread's scratch for one chunk's key rows: pack_keys writes rows(), Chunk::prepare reads
// chunk(). Sized for chunks of up to C tokens.
struct KeyScratch {
  Mat q, k, qk, kk, kt;  // [C, K], [C, K], [C, C], [C, C], [K, C]
  Vec rq, rk;            // [C]
  KeyScratch(std::int64_t C, std::int64_t K)
      : q(C, K), k(C, K), qk(C, C), kk(C, C), kt(K, C), rq(C), rk(C) {}
  KeyRows rows() {
    return {q.data(), k.data(), rq.data(), rk.data(), qk.data(), kk.data(), kt.data()};
  }
  KeyChunk chunk() const { return {q.data(), k.data(), qk.data(), kk.data()}; }
};

struct Chunk {
  std::int64_t c = 0, K = 0, C = 0;
  const float *q_rows = nullptr, *k_rows = nullptr, *kk_rows = nullptr;
  Vec H;          // [c]  chunk-local cumulative sum of the g that are not resets
  Vec beta;       // [c]
  Vec e;          // [c]  exp(G_i)
  Vec f;          // [c]  exp(G_last - G_i)
  float gamma{};  //      exp(G_last)
  Mat decay;      // [c, c]  exp(G_i - G_j) on and below the diagonal, 0 above
  Mat P;          // [c, c]  (Q K^T) * decay
  Mat L;          // [c, c]  strictly_lower(diag(beta) K K^T * decay)
  Mat X;          // [2c, K] [diag(beta e) K; diag(e) Q]: the rows that multiply S
  Mat Kf;         // [c, K]  diag(f) K
  // [c]  token i's segment: its last full reset at or before i (core/reset.h), -1 without one.
  // Decays are exp(H_i - H_j) within a segment and exactly 0 across a reset.
  std::vector<std::int64_t> first;

  Rows q() const { return {q_rows, c, K}; }                     // [c, K]  l2-normalized when asked
  Rows k() const { return {k_rows, c, K}; }                     // [c, K]
  ConstBlock kk() const { return {kk_rows, c, c, Stride(C)}; }  // [c, c]  K K^T, lower

  // Builds the chunk of tokens [t, t + c) of batch row b for value head hv from its key head's
  // rows of the chunk (`keys`, from pack_keys) and the packed gates. Without `with_q`, what the
  // state's recurrence needs only (the backward's recompute): P and X's rows diag(e) Q are left as
  // they were, and keys' q and Q K^T are not read.
  void prepare(const KeyChunk& keys, const Packed& p, std::int64_t b, std::int64_t hv,
               std::int64_t t, std::int64_t n, bool with_q = true) {
    c = n;
    K = p.s.K;
    C = p.C;
    const std::int64_t value_row = p.value_row(b, hv, t);
    q_rows = keys.q;
    k_rows = keys.k;
    kk_rows = keys.kk;
    const ConstBlock qk(keys.qk, c, c, Stride(C));
    H = Eigen::Map<const Vec>(p.H.data() + value_row, c);
    beta = Eigen::Map<const Vec>(p.beta.data() + value_row, c);
    first.resize(static_cast<std::size_t>(c));
    std::int64_t last = -1, opening = c;  // the chunk's last reset; its first (c without one)
    for (std::int64_t i = 0; i < c; ++i) {
      if (p.reset[value_row + i] != 0.0f) last = i, opening = std::min(opening, i);
      first[static_cast<std::size_t>(i)] = last;
    }
    // With G = H - (the resets' share, -inf in effect): exp(G_i) is 0 from the first reset on,
    // exp(G_last - G_i) before the last reset, and exp(G_last) after any.
    e.setZero(c);
    e.head(opening) = H.head(opening).array().exp();
    const std::int64_t tail = c - std::max<std::int64_t>(last, 0);
    f.setZero(c);
    f.tail(tail) = (H[c - 1] - H.tail(tail).array()).exp();
    gamma = last < 0 ? std::exp(H[c - 1]) : 0.0f;
    // H is non-increasing, so H_i - H_j <= 0 on and below the diagonal: exp never overflows.
    decay.setZero(c, c);
    if (with_q) P.setZero(c, c);
    L.setZero(c, c);
    for (std::int64_t i = 0; i < c; ++i) {
      const std::int64_t j0 = std::max<std::int64_t>(first[static_cast<std::size_t>(i)], 0);
      decay.row(i).segment(j0, i + 1 - j0) = (H[i] - H.segment(j0, i + 1 - j0).array()).exp();
      if (with_q)
        P.row(i).head(i + 1) = qk.row(i).head(i + 1).cwiseProduct(decay.row(i).head(i + 1));
      L.row(i).head(i) = beta[i] * kk().row(i).head(i).cwiseProduct(decay.row(i).head(i));
    }
    X.resize(2 * c, K);
    X.topRows(c).noalias() = beta.cwiseProduct(e).asDiagonal() * k();
    if (with_q) X.bottomRows(c).noalias() = e.asDiagonal() * q();
    Kf.noalias() = f.asDiagonal() * k();
  }
};

}  // namespace gdn::cpu
