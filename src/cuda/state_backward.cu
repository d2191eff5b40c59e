// The reverse chunk-serial pass for the state gradient, one block per (32-column slice of V,
// value head, sequence). With dS the gradient of the state leaving the chunk (spec 3, by hand):
//   dh[c] = dS,  dVn = dv_local + diag(exp(G_C - G)) K dS,
//   dS_in = exp(G_C) dS + [diag(exp(G)) Q; -W]^T [scale dO; dVn]      (Vn = U - W S).
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBV = 32;
constexpr int kLdS = 36;
constexpr int kLdSb = 40;

struct BackSmem {
  static constexpr int k = 0;                           // bf16 [2][64][136]  K
  static constexpr int x = k + 2 * kC * kLdH * 2;       // bf16 [2][128][136] [Q; W]
  static constexpr int d_o = x + 2 * kD * kLdH * 2;     // In [2][64][40]     dO slice
  static constexpr int dvl = d_o + 2 * kC * kLdSb * 2;  // f32 [2][64][32]    dv_local slice
  static constexpr int g = dvl + 2 * kC * kBV * 4;      // f32 [2][64]
  static constexpr int y = g + 2 * kC * 4;              // bf16 [128][40]     [scale dO; dVn]
  static constexpr int ds = y + kD * kLdSb * 2;         // f32 [128][36]
  static constexpr int dsb = ds + kD * kLdS * 4;        // bf16 [128][40]
  static constexpr int f = dsb + kD * kLdSb * 2;        // f32 [64][36]
  static constexpr int bytes = f + kC * kLdS * 4;
};

template <typename In>
__global__ void __launch_bounds__(kThreads) state_backward_kernel(Params p) {
  const int v0 = blockIdx.x * kBV, hv = blockIdx.y, n = blockIdx.z, tid = threadIdx.x;
  const int hk = hv / (p.HV / p.HK), first = p.chunk_begin[n];
  const int chunks = p.chunk_begin[n + 1] - first;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_buf = reinterpret_cast<bf16*>(smem + BackSmem::k);
  bf16* x_buf = reinterpret_cast<bf16*>(smem + BackSmem::x);
  In* do_buf = reinterpret_cast<In*>(smem + BackSmem::d_o);
  float* dvl_buf = reinterpret_cast<float*>(smem + BackSmem::dvl);
  float* g_buf = reinterpret_cast<float*>(smem + BackSmem::g);
  bf16* y = reinterpret_cast<bf16*>(smem + BackSmem::y);
  float* dS = reinterpret_cast<float*>(smem + BackSmem::ds);
  bf16* dSb = reinterpret_cast<bf16*>(smem + BackSmem::dsb);
  float* F = reinterpret_cast<float*>(smem + BackSmem::f);

  auto prefetch = [&](int i, int buf) {
    const int cid = first + i;
    const ChunkInfo info = p.chunks[cid];
    const long long s = slot(p, cid, hv);
    const bf16* k = p.kn + qk_row(p, info.b, info.t0, hk) * kD;
    const bf16* q = p.qn + qk_row(p, info.b, info.t0, hk) * kD;
    const bf16* w = p.W + s * kC * kD;
    for (int idx = tid; idx < kC * 16; idx += kThreads) {
      const int r = idx / 16, part = idx % 16;
      const bool valid = r < info.len;
      const long long off = static_cast<long long>(r) * p.HK * kD + part * 8;
      cp_async16(k_buf + (buf * kC + r) * kLdH + part * 8, valid ? k + off : p.kn, valid);
      cp_async16(x_buf + (buf * kD + r) * kLdH + part * 8, valid ? q + off : p.qn, valid);
      cp_async16(x_buf + (buf * kD + kC + r) * kLdH + part * 8, w + r * kD + part * 8, true);
    }
    const In* d_o = static_cast<const In*>(p.d_o) + v_row(p, info.b, info.t0, hv) * kD + v0;
    for (int idx = tid; idx < kC * 4; idx += kThreads) {
      const int r = idx / 4, part = idx % 4;
      const bool valid = r < info.len;
      cp_async16(do_buf + (buf * kC + r) * kLdSb + part * 8,
                 valid ? d_o + static_cast<long long>(r) * p.HV * kD + part * 8 : p.d_o, valid);
    }
    for (int idx = tid; idx < kC * 8; idx += kThreads) {
      const int r = idx / 8, part = idx % 8;
      cp_async16(dvl_buf + (buf * kC + r) * kBV + part * 4,
                 p.dv_local + s * kC * kD + r * kD + v0 + part * 4, true);
    }
    if (tid < 16) cp_async16(g_buf + buf * kC + tid * 4, p.G + s * kC + tid * 4, true);
    cp_async_commit();
  };

  for (int idx = tid; idx < kD * kBV; idx += kThreads) {
    const int r = idx / kBV, j = idx % kBV;
    const float x =
        p.dht ? p.dht[(static_cast<long long>(n) * p.HV + hv) * kD * kD + r * kD + v0 + j] : 0.0f;
    dS[r * kLdS + j] = x;
    dSb[r * kLdSb + j] = from_float<bf16>(x);
  }
  if (chunks > 0) prefetch(chunks - 1, 0);
  for (int i = chunks - 1, step = 0; i >= 0; --i, ++step) {
    const int buf = step & 1, cid = first + i;
    const long long s = slot(p, cid, hv);
    if (i > 0)
      prefetch(i - 1, buf ^ 1);
    else
      cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    bf16* dh = p.dh + s * kD * kD;
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      dh[r * kD + v0 + j] = dSb[r * kLdSb + j];
    }
    const bf16* k = k_buf + buf * kC * kLdH;
    bf16* x = x_buf + buf * kD * kLdH;
    const In* d_o = do_buf + buf * kC * kLdSb;
    const float* dvl = dvl_buf + buf * kC * kBV;
    const float* G = g_buf + buf * kC;
    const float g_last = G[kC - 1], gamma = __expf(g_last);
    block_gemm<kC, kBV, kD, Row, Row>(k, kLdH, dSb, kLdSb, F, kLdS);  // K dS
    for (int idx = tid; idx < kC * kD; idx += kThreads) {             // [diag(e) Q; -W]
      const int r = idx / kD, j = idx % kD;
      x[r * kLdH + j] = from_float<bf16>(to_float(x[r * kLdH + j]) * __expf(G[r]));
      x[(kC + r) * kLdH + j] = __hneg(x[(kC + r) * kLdH + j]);
    }
    for (int idx = tid; idx < kC * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      y[r * kLdSb + j] = from_float<bf16>(p.scale * to_float(d_o[r * kLdSb + j]));
    }
    __syncthreads();
    bf16* dvn = p.dvn + s * kC * kD;
    for (int idx = tid; idx < kC * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      const float x_ = dvl[r * kBV + j] + __expf(g_last - G[r]) * F[r * kLdS + j];  // dVn
      y[(kC + r) * kLdSb + j] = from_float<bf16>(x_);
      dvn[r * kD + v0 + j] = y[(kC + r) * kLdSb + j];
    }
    for (int idx = tid; idx < kD * kBV; idx += kThreads) dS[idx / kBV * kLdS + idx % kBV] *= gamma;
    __syncthreads();
    block_gemm<kD, kBV, kD, Col, Row, true>(x, kLdH, y, kLdSb, dS, kLdS);
    __syncthreads();
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      dSb[r * kLdSb + j] = from_float<bf16>(dS[r * kLdS + j]);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  if (p.dh0)
    for (int idx = tid; idx < kD * kBV; idx += kThreads) {
      const int r = idx / kBV, j = idx % kBV;
      p.dh0[(static_cast<long long>(n) * p.HV + hv) * kD * kD + r * kD + v0 + j] = dS[r * kLdS + j];
    }
}

}  // namespace

template <typename In>
void launch_state_backward(const Params& p, cudaStream_t stream) {
  auto kernel = state_backward_kernel<In>;
  GDN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BackSmem::bytes));
  kernel<<<dim3(kD / kBV, p.HV, p.N), kThreads, BackSmem::bytes, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

template void launch_state_backward<bf16>(const Params&, cudaStream_t);
template void launch_state_backward<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
