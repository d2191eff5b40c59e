// The output pass, parallel over (chunk, value head) (spec 3):
//   O = scale [diag(exp(G)) Q S + P Vn],  P = (Q K^T) * exp(G_i - G_j) on and below the diagonal,
// with S = h[c] the state entering the chunk and Vn from the state pass.
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/tile_io.cuh"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;

struct OutputSmem {
  static constexpr int qs = 0;                      // bf16 [64][136]
  static constexpr int ks = qs + kC * kLdH * 2;     // bf16 [64][136]
  static constexpr int sb = ks + kC * kLdH * 2;     // bf16 [128][136]  S
  static constexpr int vs = sb + kD * kLdH * 2;     // bf16 [64][136]   Vn
  static constexpr int pb = vs + kC * kLdH * 2;     // bf16 [64][72]    P
  static constexpr int out = pb + kC * kLdH64 * 2;  // f32 [64][132]
  static constexpr int qk = out + kC * kLdF * 4;    // f32 [64][68]
  static constexpr int g = qk + kC * kLdF64 * 4;    // f32 [64]
  static constexpr int bytes = g + kC * 4;
};

template <typename In>
__global__ void __launch_bounds__(kThreads) output_forward_kernel(Params p) {
  const int cid = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x;
  const ChunkInfo info = p.chunks[cid];
  if (info.len == 0) return;
  const int hk = hv / (p.HV / p.HK), len = info.len;
  const long long s = slot(p, cid, hv);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem + OutputSmem::qs);
  bf16* ks = reinterpret_cast<bf16*>(smem + OutputSmem::ks);
  bf16* sb = reinterpret_cast<bf16*>(smem + OutputSmem::sb);
  bf16* vs = reinterpret_cast<bf16*>(smem + OutputSmem::vs);
  bf16* pb = reinterpret_cast<bf16*>(smem + OutputSmem::pb);
  float* out = reinterpret_cast<float*>(smem + OutputSmem::out);
  float* qk = reinterpret_cast<float*>(smem + OutputSmem::qk);
  float* G = reinterpret_cast<float*>(smem + OutputSmem::g);

  if (tid < kC) G[tid] = p.G[s * kC + tid];
  const long long row = qk_row(p, info.b, info.t0, hk);
  load_token_rows_bf16(qs, p.qn + row * kD, p.HK, len);
  load_token_rows_bf16(ks, p.kn + row * kD, p.HK, len);
  load_rows_bf16(sb, p.h + s * kD * kD, kD, kD);
  load_rows_bf16(vs, p.vn + s * kC * kD, kC, kC);
  __syncthreads();
  block_gemm<kC, kC, kD, Row, Col>(qs, kLdH, ks, kLdH, qk, kLdF64);  // Q K^T
  block_gemm<kC, kD, kD, Row, Row>(qs, kLdH, sb, kLdH, out, kLdF);   // Q S
  __syncthreads();
  for (int idx = tid; idx < kC * kC; idx += kThreads) {
    const int i = idx / kC, j = idx % kC;  // mask before exp
    pb[i * kLdH64 + j] = from_float<bf16>(j <= i ? qk[i * kLdF64 + j] * __expf(G[i] - G[j]) : 0.0f);
  }
  for (int idx = tid; idx < kC * kD; idx += kThreads)
    out[idx / kD * kLdF + idx % kD] *= __expf(G[idx / kD]);
  __syncthreads();
  block_gemm<kC, kD, kC, Row, Row, true>(pb, kLdH64, vs, kLdH, out, kLdF);  // + P Vn
  __syncthreads();
  In* o = static_cast<In*>(p.o) + v_row(p, info.b, info.t0, hv) * kD;
  for (int idx = tid; idx < len * kD; idx += kThreads) {
    const int i = idx / kD, j = idx % kD;
    o[static_cast<long long>(i) * p.HV * kD + j] = from_float<In>(p.scale * out[i * kLdF + j]);
  }
}

}  // namespace

template <typename In>
void launch_output_forward(const Params& p, cudaStream_t stream) {
  auto kernel = output_forward_kernel<In>;
  GDN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, OutputSmem::bytes));
  kernel<<<dim3(p.NC, p.HV), kThreads, OutputSmem::bytes, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

template void launch_output_forward<bf16>(const Params&, cudaStream_t);
template void launch_output_forward<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
