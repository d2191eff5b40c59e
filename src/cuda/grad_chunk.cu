// The per-chunk gradients, parallel over (chunk, value head), from the recomputed S = h[c] and
// Vn, and dS = dh[c], dVn from the reverse pass (h and dh stored transposed). The math is
// chunked_backward.cpp's (spec 3):
//   dR = A^T dVn,  dV = diag(beta) dR,  D = [-dR; scale dO],
//   [dKb; dQe] = D S^T,  [dL; dP] = D Vn^T,  dKf = Vn dS^T,
//   Kb = diag(beta e) K, Qe = diag(e) Q, Kf = diag(f) K, P = (Q K^T) * decay,
//   L = strictly_lower(diag(beta) K K^T * decay),
// and every factor exp(G_a - G_b) gives t to dG_a and -t to dG_b (t = gradient * value);
// dg is the reverse cumulative sum of dG. dq and dk are this value head's share.
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/tile_io.cuh"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct GradSmem {
  static constexpr int qs = 0;                   // bf16 [64][136]  Q
  static constexpr int ks = qs + kC * kLdH * 2;  // bf16 [64][136]  K
  static constexpr int ss = ks + kC * kLdH * 2;  // bf16 [128][136] S^T
  static constexpr int r2 = ss + kD * kLdH * 2;  // bf16 [128][136] dS^T, then dVn, then D
  static constexpr int vs = r2 + kD * kLdH * 2;  // bf16 [64][136] Vn, then dpd, dl_sym [64][72]
  static constexpr int f = vs + 2 * kC * kLdH64 * 2 + 0;  // f32 scratch: [64][132] or [128][68]
  static constexpr int dk = f + 2 * kC * kLdF64 * 4;      // f32 [64][132]  dk
  static constexpr int x = dk + kC * kLdF * 4;  // A bf16 [64][72]; [QK; KK] f32; dq [64][132]
  static constexpr int vec = x + 2 * kC * kLdF64 * 4;  // f32 G, beta, e, f, dG, db, kdkf [64]; sum
  static constexpr int bytes = vec + (7 * kC + 32) * 4;
};
static_assert(2 * kC * kLdH64 * 2 >= kC * kLdH * 2, "the Vn region holds Vn");

template <typename In>
__global__ void __launch_bounds__(kThreads) grad_chunk_kernel(Params p) {
  const int cid = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const ChunkInfo info = p.chunks[cid];
  if (info.len == 0) return;
  const int hk = hv / (p.HV / p.HK), len = info.len, b = info.b, t0 = info.t0;
  const long long s = slot(p, cid, hv);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem + GradSmem::qs);
  bf16* ks = reinterpret_cast<bf16*>(smem + GradSmem::ks);
  bf16* ss = reinterpret_cast<bf16*>(smem + GradSmem::ss);
  bf16* r2 = reinterpret_cast<bf16*>(smem + GradSmem::r2);
  bf16* vs = reinterpret_cast<bf16*>(smem + GradSmem::vs);
  bf16* dpd = vs;                // [64][72], after Vn is done
  bf16* dls = vs + kC * kLdH64;  // [64][72]
  float* F = reinterpret_cast<float*>(smem + GradSmem::f);
  float* DK = reinterpret_cast<float*>(smem + GradSmem::dk);
  float* X = reinterpret_cast<float*>(smem + GradSmem::x);
  bf16* ab = reinterpret_cast<bf16*>(smem + GradSmem::x);
  float* G = reinterpret_cast<float*>(smem + GradSmem::vec);
  float *beta = G + kC, *e = beta + kC, *f = e + kC, *dG = f + kC, *db = dG + kC;
  float *kdkf = db + kC, *sum = kdkf + kC;

  // Loads.
  if (tid < kC) {
    G[tid] = p.G[s * kC + tid];
    beta[tid] = tid < len ? load_scalar(p.beta, v_row(p, b, t0 + tid, hv), p.beta_code) : 0.0f;
    dG[tid] = 0.0f;
    db[tid] = 0.0f;
  }
  if (tid == 0) sum[0] = 0.0f;
  const long long row = qk_row(p, b, t0, hk);
  load_token_rows_bf16(qs, p.qn + row * kD, p.HK, len);
  load_token_rows_bf16(ks, p.kn + row * kD, p.HK, len);
  load_rows_bf16(ss, p.h + s * kD * kD, kD, kD);
  load_rows_bf16(r2, p.dh + s * kD * kD, kD, kD);
  load_rows_bf16(vs, p.vn + s * kC * kD, kC, kC);
  for (int idx = tid; idx < kC * 8; idx += kThreads) {
    const int r = idx / 8, part = idx % 8;
    *reinterpret_cast<uint4*>(ab + r * kLdH64 + part * 8) =
        *reinterpret_cast<const uint4*>(p.A + s * kC * kC + r * kC + part * 8);
  }
  __syncthreads();
  if (tid < kC) {
    e[tid] = __expf(G[tid]);
    f[tid] = __expf(G[kC - 1] - G[tid]);
  }
  const float gamma = __expf(G[kC - 1]);

  // dKf = Vn dS^T;  sum(S * dS) for the gradient of gamma.
  block_gemm<kC, kD, kD, Row, Row>(vs, kLdH, r2, kLdH, F, kLdF);
  {
    float part = 0;
    for (int idx = tid; idx < kD * kD; idx += kThreads)
      part += to_float(ss[idx / kD * kLdH + idx % kD]) * to_float(r2[idx / kD * kLdH + idx % kD]);
    part = warp_sum(part);
    if (lane == 0) atomicAdd(sum, part);
  }
  __syncthreads();
  for (int i = warp; i < kC; i += kWarps) {  // k_dkf_i = f_i sum_j k_ij dKf_ij;  dk = f dKf
    float acc = 0;
    for (int j = lane; j < kD; j += 32) {
      acc += to_float(ks[i * kLdH + j]) * F[i * kLdF + j];
      DK[i * kLdF + j] = f[i] * F[i * kLdF + j];
    }
    acc = warp_sum(acc) * f[i];
    if (lane == 0) {
      kdkf[i] = acc;
      dG[i] -= acc;
    }
  }
  __syncthreads();

  // dR = A^T dVn;  dV = diag(beta) dR;  D = [-dR; scale dO].
  load_rows_bf16(r2, p.dvn + s * kC * kD, kC, kC);
  __syncthreads();
  block_gemm<kC, kD, kC, Col, Row>(ab, kLdH64, r2, kLdH, F, kLdF);
  __syncthreads();
  {
    const In* v = static_cast<const In*>(p.v) + v_row(p, b, t0, hv) * kD;
    const In* d_o = static_cast<const In*>(p.d_o) + v_row(p, b, t0, hv) * kD;
    In* dv = static_cast<In*>(p.dv) + v_row(p, b, t0, hv) * kD;
    for (int i = warp; i < kC; i += kWarps) {
      const long long off = static_cast<long long>(i) * p.HV * kD;
      float acc = 0, vi[4] = {}, doi[4] = {};  // loads first: all in flight at once
      if (i < len)
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          vi[m] = to_float(v[off + lane + 32 * m]);
          doi[m] = to_float(d_o[off + lane + 32 * m]);
        }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = lane + 32 * m;
        const float dr = F[i * kLdF + j];
        acc += vi[m] * dr;
        if (i < len) dv[off + j] = from_float<In>(beta[i] * dr);
        r2[i * kLdH + j] = from_float<bf16>(-dr);
        r2[(kC + i) * kLdH + j] = from_float<bf16>(p.scale * doi[m]);
      }
      acc = warp_sum(acc);
      if (lane == 0) db[i] += acc;
    }
  }
  __syncthreads();

  // [dL; dP] = D Vn^T;  Q K^T, K K^T.
  block_gemm<2 * kC, kC, kD, Row, Col>(r2, kLdH, vs, kLdH, F, kLdF64);
  block_gemm<kC, kC, kD, Row, Col>(qs, kLdH, ks, kLdH, X, kLdF64);
  block_gemm<kC, kC, kD, Row, Col>(ks, kLdH, ks, kLdH, X + kC * kLdF64, kLdF64);
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int i = idx / kC, j = idx % kC;
    const float decay = j <= i ? __expf(G[i] - G[j]) : 0.0f;  // mask before exp
    const float dP = F[(kC + i) * kLdF64 + j], P = X[i * kLdF64 + j] * decay;
    dpd[i * kLdH64 + j] = from_float<bf16>(dP * decay);
    const float dl = j < i ? F[i * kLdF64 + j] * decay : 0.0f;
    const float m2 = dl * X[(kC + i) * kLdF64 + j];
    F[i * kLdF64 + j] = beta[i] * dl;           // diag(beta) dl
    X[i * kLdF64 + j] = dP * P + beta[i] * m2;  // pair terms t_ij
    X[(kC + i) * kLdF64 + j] = m2;              // dbeta's share
  }
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int i = idx / kC, j = idx % kC;
    dls[i * kLdH64 + j] = from_float<bf16>(F[i * kLdF64 + j] + F[j * kLdF64 + i]);
  }
  if (tid < kC) {
    float row_t = 0, col_t = 0, row_m2 = 0;
    for (int j = 0; j < kC; ++j) {
      row_t += X[tid * kLdF64 + j];
      col_t += X[j * kLdF64 + tid];
      row_m2 += X[(kC + tid) * kLdF64 + j];
    }
    dG[tid] += row_t - col_t;
    db[tid] += row_m2;
  }
  __syncthreads();

  // dk += dpd^T Q + dl_sym K;  [dKb; dQe] = D S^T.
  block_gemm<kC, kD, kC, Col, Row, true>(dpd, kLdH64, qs, kLdH, DK, kLdF);
  block_gemm<kC, kD, kC, Row, Row, true>(dls, kLdH64, ks, kLdH, DK, kLdF);
  block_gemm<kC, kD, kD, Row, Row>(r2, kLdH, ss, kLdH, F, kLdF);
  block_gemm<kC, kD, kD, Row, Row>(r2 + kC * kLdH, kLdH, ss, kLdH, X, kLdF);
  __syncthreads();
  for (int i = warp; i < kC; i += kWarps) {
    float acc_k = 0, acc_q = 0;
    for (int j = lane; j < kD; j += 32) {
      acc_k += to_float(ks[i * kLdH + j]) * F[i * kLdF + j];
      acc_q += to_float(qs[i * kLdH + j]) * X[i * kLdF + j];
      DK[i * kLdF + j] += beta[i] * e[i] * F[i * kLdF + j];
      X[i * kLdF + j] *= e[i];
    }
    acc_k = warp_sum(acc_k);
    acc_q = warp_sum(acc_q);
    if (lane == 0) {
      db[i] += e[i] * acc_k;
      dG[i] += beta[i] * e[i] * acc_k + e[i] * acc_q;
    }
  }
  __syncthreads();
  block_gemm<kC, kD, kC, Row, Row, true>(dpd, kLdH64, ks, kLdH, X, kLdF);  // dq += dpd K
  __syncthreads();

  for (int idx = tid; idx < len * kD; idx += kThreads) {
    const int i = idx / kD, j = idx % kD;
    const long long out = v_row(p, b, t0 + i, hv) * kD + j;
    p.dq_hv[out] = X[i * kLdF + j];
    p.dk_hv[out] = DK[i * kLdF + j];
  }
  if (tid == 0) {  // dG_{len-1} gets the terms of exp(G_last); dg_j = sum_{i >= j} dG_i
    float total = 0;
    for (int i = 0; i < len; ++i) total += kdkf[i];
    dG[len - 1] += total + gamma * sum[0];
    for (int i = len - 2; i >= 0; --i) dG[i] += dG[i + 1];
  }
  __syncthreads();
  if (tid < len) {
    const long long r = v_row(p, b, t0 + tid, hv);
    p.dg[r] = dG[tid];
    store_scalar(p.dbeta, r, p.beta_code, db[tid]);
  }
}

// One warp per (token, key head) row: dx = sum over the group, then back through the l2norm:
// dx <- r (dx - x_hat (x_hat . dx)), x_hat = x r.
template <typename In>
__global__ void grad_qk_kernel(Params p, long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32, group = p.HV / p.HK;
  const long long token = row / p.HK, hk = row % p.HK;
  for (int which = 0; which < 2; ++which) {
    const float* src = (which ? p.dk_hv : p.dq_hv) + (token * p.HV + hk * group) * kD;
    const In* x = static_cast<const In*>(which ? p.k : p.q) + row * kD;
    const float r = (which ? p.rk : p.rq)[row];
    float dx[4], xh[4], dot = 0;
    for (int m = 0; m < 4; ++m) {
      const int j = lane + 32 * m;
      dx[m] = 0;
      for (int gi = 0; gi < group; ++gi) dx[m] += src[gi * kD + j];
      xh[m] = to_float(x[j]) * r;
      dot += xh[m] * dx[m];
    }
    dot = warp_sum(dot);
    In* out = static_cast<In*>(which ? p.dk : p.dq) + row * kD;
    for (int m = 0; m < 4; ++m) {
      const float y = p.l2norm ? r * (dx[m] - xh[m] * dot) : dx[m];
      out[lane + 32 * m] = from_float<In>(y);
    }
  }
}

}  // namespace

template <typename In>
void launch_grad_chunk(const Params& p, cudaStream_t stream) {
  auto kernel = grad_chunk_kernel<In>;
  GDN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, GradSmem::bytes));
  kernel<<<dim3(p.NC, p.HV), kThreads, GradSmem::bytes, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

template <typename In>
void launch_grad_qk(const Params& p, cudaStream_t stream) {
  const long long rows = static_cast<long long>(p.B) * p.T * p.HK;
  grad_qk_kernel<In>
      <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(p, rows);
  GDN_CUDA_CHECK_LAUNCH();
}

template void launch_grad_chunk<bf16>(const Params&, cudaStream_t);
template void launch_grad_chunk<__half>(const Params&, cudaStream_t);
template void launch_grad_qk<bf16>(const Params&, cudaStream_t);
template void launch_grad_qk<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
