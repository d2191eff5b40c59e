// The chunk-serial state pass (spec 3), one block per (32-column slice of V, value head, sequence),
// the slice of S in f32 shared memory, the next chunk's W, K, U, G prefetched with cp.async:
//   h[c] = S,  Vn = U - W S,  S' = exp(G_C) S + K^T (diag(exp(G_C - G)) Vn).
// W S and K^T Vn take bf16 operands (S rounded to bf16 as an operand only; S stays f32).
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBV = 32;    // V slice
constexpr int kLdS = 36;   // f32 row stride of a 32-wide slice
constexpr int kLdSb = 40;  // bf16 row stride of a 32-wide slice

struct StateSmem {
  static constexpr int w = 0;                       // bf16 [2][64][136]
  static constexpr int k = w + 2 * kC * kLdH * 2;   // bf16 [2][64][136]
  static constexpr int u = k + 2 * kC * kLdH * 2;   // bf16 [2][64][40]
  static constexpr int g = u + 2 * kC * kLdSb * 2;  // f32 [2][64]
  static constexpr int s = g + 2 * kC * 4;          // f32 [128][36]  S slice
  static constexpr int sb = s + kD * kLdS * 4;      // bf16 [128][40]
  static constexpr int vf = sb + kD * kLdSb * 2;    // f32 [64][36]
  static constexpr int vb = vf + kC * kLdS * 4;     // bf16 [64][40]
  static constexpr int bytes = vb + kC * kLdSb * 2;
};

__global__ void __launch_bounds__(kThreads) state_forward_kernel(Params p) {
  const int v0 = blockIdx.x * kBV, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  const int hk = hv / (p.HV / p.HK), first = p.chunk_begin[n];
  const int chunks = p.chunk_begin[n + 1] - first;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* w_buf = reinterpret_cast<bf16*>(smem + StateSmem::w);
  bf16* k_buf = reinterpret_cast<bf16*>(smem + StateSmem::k);
  bf16* u_buf = reinterpret_cast<bf16*>(smem + StateSmem::u);
  float* g_buf = reinterpret_cast<float*>(smem + StateSmem::g);
  float* S = reinterpret_cast<float*>(smem + StateSmem::s);
  bf16* Sb = reinterpret_cast<bf16*>(smem + StateSmem::sb);
  float* vf = reinterpret_cast<float*>(smem + StateSmem::vf);
  bf16* vb = reinterpret_cast<bf16*>(smem + StateSmem::vb);

  auto prefetch = [&](int i, int buf) {
    const int cid = first + i;
    const ChunkInfo info = p.chunks[cid];
    const long long s = slot(p, cid, hv);
    const bf16* w = p.W + s * kC * kD;
    const bf16* k = p.kn + qk_row(p, info.b, info.t0, hk) * kD;
    for (int idx = tid; idx < kC * 16; idx += kThreads) {
      const int r = idx / 16, part = idx % 16;
      cp_async16(w_buf + (buf * kC + r) * kLdH + part * 8, w + r * kD + part * 8, true);
      const bool valid = r < info.len;
      cp_async16(k_buf + (buf * kC + r) * kLdH + part * 8,
                 valid ? k + static_cast<long long>(r) * p.HK * kD + part * 8 : p.kn, valid);
    }
    for (int idx = tid; idx < kC * 4; idx += kThreads) {
      const int r = idx / 4, part = idx % 4;
      cp_async16(u_buf + (buf * kC + r) * kLdSb + part * 8,
                 p.U + s * kC * kD + r * kD + v0 + part * 8, true);
    }
    if (tid < 16) cp_async16(g_buf + buf * kC + tid * 4, p.G + s * kC + tid * 4, true);
    cp_async_commit();
  };

  for (int idx = tid; idx < kD * kBV; idx += kThreads) {
    const int r = idx / kBV, j = idx % kBV;
    const float x =
        p.h0 ? p.h0[(static_cast<long long>(n) * p.HV + hv) * kD * kD + r * kD + v0 + j] : 0.0f;
    S[r * kLdS + j] = x;
    Sb[r * kLdSb + j] = from_float<bf16>(x);
  }
  if (chunks > 0) prefetch(0, 0);
  for (int i = 0; i < chunks; ++i) {
    const int buf = i & 1, cid = first + i;
    const long long s = slot(p, cid, hv);
    if (i + 1 < chunks)
      prefetch(i + 1, buf ^ 1);
    else
      cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    bf16* h = p.h + s * kD * kD;
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      h[r * kD + v0 + j] = Sb[r * kLdSb + j];
    }
    const bf16* w = w_buf + buf * kC * kLdH;
    const bf16* k = k_buf + buf * kC * kLdH;
    const bf16* u = u_buf + buf * kC * kLdSb;
    const float* G = g_buf + buf * kC;
    block_gemm<kC, kBV, kD, Row, Row>(w, kLdH, Sb, kLdSb, vf, kLdS);  // W S
    __syncthreads();
    const float g_last = G[kC - 1], gamma = __expf(g_last);
    bf16* vn = p.vn + s * kC * kD;
    for (int idx = tid; idx < kC * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      const float x = to_float(u[r * kLdSb + j]) - vf[r * kLdS + j];  // Vn = U - W S
      vn[r * kD + v0 + j] = from_float<bf16>(x);
      vb[r * kLdSb + j] = from_float<bf16>(x * __expf(g_last - G[r]));
    }
    for (int idx = tid; idx < kD * kBV; idx += kThreads) S[idx / kBV * kLdS + idx % kBV] *= gamma;
    __syncthreads();
    block_gemm<kD, kBV, kC, Col, Row, true>(k, kLdH, vb, kLdSb, S, kLdS);  // S += K^T (f Vn)
    __syncthreads();
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      Sb[r * kLdSb + j] = from_float<bf16>(S[r * kLdS + j]);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  if (p.ht)
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      p.ht[(static_cast<long long>(n) * p.HV + hv) * kD * kD + r * kD + v0 + j] = S[r * kLdS + j];
    }
}

}  // namespace

void launch_state_forward(const Params& p, cudaStream_t stream) {
  GDN_CUDA_CHECK(cudaFuncSetAttribute(
      state_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, StateSmem::bytes));
  state_forward_kernel<<<dim3(kD / kBV, p.HV, p.N), kThreads, StateSmem::bytes, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace gdn::cuda
