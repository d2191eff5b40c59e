// Per (chunk, value head), independent of the state (spec 3):
//   G = chunk-local cumsum(g),  L = strictly_lower(diag(beta) K K^T * exp(G_i - G_j)),
//   A = (I + L)^-1,  W = A diag(beta exp(G)) K,  U = A diag(beta) V.
// The backward also keeps A and dv_local = scale P^T dO, P = (Q K^T) * exp(G_i - G_j) (i >= j).
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/tile_io.cuh"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;

struct PrepSmem {
  static constexpr int ks = 0;                       // bf16 [64][136]  K
  static constexpr int kb = ks + kC * kLdH * 2;      // bf16 [64][136]  diag(beta e) K
  static constexpr int vb = kb + kC * kLdH * 2;      // bf16 [64][136]  diag(beta) V
  static constexpr int kk = vb + kC * kLdH * 2;      // f32 [64][68]    K K^T, then L
  static constexpr int af = kk + kC * kLdF64 * 4;    // f32 [64][68]    A
  static constexpr int ab = af + kC * kLdF64 * 4;    // bf16 [64][72]   A
  static constexpr int out = ab + kC * kLdH64 * 2;   // f32 [64][132]
  static constexpr int gates = out + kC * kLdF * 4;  // f32 G[64], beta[64]
  static constexpr int forward_bytes = gates + 2 * kC * 4;
  static constexpr int qs = forward_bytes;        // bf16 [64][136]  Q
  static constexpr int dos = qs + kC * kLdH * 2;  // bf16 [64][136]  dO
  static constexpr int pb = dos + kC * kLdH * 2;  // bf16 [64][72]   P
  static constexpr int backward_bytes = pb + kC * kLdH64 * 2;
};

template <typename In, bool kBackward>
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(Params p) {
  const int cid = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x;
  const ChunkInfo info = p.chunks[cid];
  if (info.len == 0) return;
  const int hk = hv / (p.HV / p.HK), len = info.len, b = info.b, t0 = info.t0;
  const long long s = slot(p, cid, hv);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem + PrepSmem::ks);
  bf16* kb = reinterpret_cast<bf16*>(smem + PrepSmem::kb);
  bf16* vb = reinterpret_cast<bf16*>(smem + PrepSmem::vb);
  float* kk = reinterpret_cast<float*>(smem + PrepSmem::kk);
  float* af = reinterpret_cast<float*>(smem + PrepSmem::af);
  bf16* ab = reinterpret_cast<bf16*>(smem + PrepSmem::ab);
  float* out = reinterpret_cast<float*>(smem + PrepSmem::out);
  float* G = reinterpret_cast<float*>(smem + PrepSmem::gates);
  float* beta = G + kC;

  if (tid < kC) {
    const long long r = v_row(p, b, t0 + tid, hv);
    G[tid] = tid < len ? p.g[r] : 0.0f;
    beta[tid] = tid < len ? load_scalar(p.beta, r, p.beta_code) : 0.0f;  // padded rows: no write
  }
  load_token_rows_bf16(ks, p.kn + qk_row(p, b, t0, hk) * kD, p.HK, len);
  __syncthreads();
  if (tid == 0) {  // G_i = sum_{j <= i} g_j, padded rows keep G_{len-1}
    float running = 0;
    for (int i = 0; i < kC; ++i) G[i] = running += G[i];
  }
  __syncthreads();
  if (tid < kC) p.G[s * kC + tid] = G[tid];

  load_token_rows(vb, static_cast<const In*>(p.v) + v_row(p, b, t0, hv) * kD, p.HV, len, beta);
  for (int idx = tid; idx < kC * kD; idx += kThreads) {
    const int i = idx / kD, j = idx % kD;
    kb[i * kLdH + j] = from_float<bf16>(beta[i] * __expf(G[i]) * to_float(ks[i * kLdH + j]));
  }
  __syncthreads();
  block_gemm<kC, kC, kD, Row, Col>(ks, kLdH, ks, kLdH, kk, kLdF64);  // K K^T
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int i = idx / kC, j = idx % kC;  // mask before exp: G_i - G_j > 0 above the diagonal
    kk[i * kLdF64 + j] = j < i ? beta[i] * kk[i * kLdF64 + j] * __expf(G[i] - G[j]) : 0.0f;
    af[i * kLdF64 + j] = 0.0f;
  }
  __syncthreads();
  // A = (I + L)^-1 by forward substitution, one column per thread, in f32:
  //   A_ic = delta_ic - sum_{c <= j < i} L_ij A_jc.
  // The same trip counts in every lane (A_jc = 0 for j < c): L_ij is a broadcast read.
  if (tid < kC) {
    const int c = tid;
    af[c * kLdF64 + c] = 1.0f;
    for (int i = 1; i < kC; ++i) {
      float sum = 0;
      for (int j = 0; j < i; ++j) sum += kk[i * kLdF64 + j] * af[j * kLdF64 + c];
      if (i > c) af[i * kLdF64 + c] = -sum;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int i = idx / kC, j = idx % kC;
    ab[i * kLdH64 + j] = from_float<bf16>(af[i * kLdF64 + j]);
    if constexpr (kBackward) p.A[s * kC * kC + idx] = ab[i * kLdH64 + j];
  }
  __syncthreads();
  block_gemm<kC, kD, kC, Row, Row>(ab, kLdH64, kb, kLdH, out, kLdF);  // W = A diag(beta e) K
  __syncthreads();
  store_rows_bf16(p.W + s * kC * kD, out, kLdF, kC);
  __syncthreads();
  block_gemm<kC, kD, kC, Row, Row>(ab, kLdH64, vb, kLdH, out, kLdF);  // U = A diag(beta) V
  __syncthreads();
  store_rows_bf16(p.U + s * kC * kD, out, kLdF, kC);

  if constexpr (kBackward) {
    bf16* qs = reinterpret_cast<bf16*>(smem + PrepSmem::qs);
    bf16* dos = reinterpret_cast<bf16*>(smem + PrepSmem::dos);
    bf16* pb = reinterpret_cast<bf16*>(smem + PrepSmem::pb);
    load_token_rows_bf16(qs, p.qn + qk_row(p, b, t0, hk) * kD, p.HK, len);
    load_token_rows(dos, static_cast<const In*>(p.d_o) + v_row(p, b, t0, hv) * kD, p.HV, len);
    __syncthreads();
    block_gemm<kC, kC, kD, Row, Col>(qs, kLdH, ks, kLdH, kk, kLdF64);  // Q K^T
    __syncthreads();
    for (int idx = tid; idx < kC * kC; idx += kThreads) {
      const int i = idx / kC, j = idx % kC;
      pb[i * kLdH64 + j] =
          from_float<bf16>(j <= i ? kk[i * kLdF64 + j] * __expf(G[i] - G[j]) : 0.0f);
    }
    __syncthreads();
    block_gemm<kC, kD, kC, Col, Row>(pb, kLdH64, dos, kLdH, out, kLdF);  // P^T dO
    __syncthreads();
    float* dvl = p.dv_local + s * kC * kD;
    for (int idx = tid; idx < kC * kD; idx += kThreads)
      dvl[idx] = p.scale * out[idx / kD * kLdF + idx % kD];
  }
}

}  // namespace

template <typename In, bool kBackward>
void launch_chunk_prep(const Params& p, cudaStream_t stream) {
  constexpr int bytes = kBackward ? PrepSmem::backward_bytes : PrepSmem::forward_bytes;
  auto kernel = chunk_prep_kernel<In, kBackward>;
  GDN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<dim3(p.NC, p.HV), kThreads, bytes, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

template void launch_chunk_prep<bf16, false>(const Params&, cudaStream_t);
template void launch_chunk_prep<bf16, true>(const Params&, cudaStream_t);
template void launch_chunk_prep<__half, false>(const Params&, cudaStream_t);
template void launch_chunk_prep<__half, true>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
