// The serial composition of the segment summaries (spec 4; state_pass.cuh), one block per
// (value head, sequence, 16 columns of the state), the running slice in shared memory:
//   forward:  S_start(k + 1) = M_k S_start(k) + N_k        for k = 1 .. last - 1,
//   reverse:  dS_end(k - 1) = M_k^T dS_end(k) + D_k        for k = last - 1 .. 1,
// from S_start(1) and dS_end(last - 1), which the summary passes store directly.
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/state_pass.cuh"

namespace gdn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSlice = 16;                     // state columns per block
constexpr int kCols = kD * kSlice / kThreads;  // per thread, in one row

template <bool kReverse>
__global__ void __launch_bounds__(kThreads) combine_kernel(Params p) {
  using state_pass::segment_matrix;
  const int hv = blockIdx.x, n = blockIdx.y, j0 = blockIdx.z * kSlice, tid = threadIdx.x;
  const int i = tid / (kSlice / kCols), jt = tid % (kSlice / kCols) * kCols;
  const int chunks = p.chunk_begin[n + 1] - p.chunk_begin[n];
  const int last = (chunks + p.seg_len - 1) / p.seg_len - 1, z0 = n * p.seg_count;
  if (last < 2) return;
  __shared__ float S[kD][kSlice];
  float* buf = kReverse ? p.seg_dstate : p.seg_state;
  const float* first = segment_matrix(buf, p, kReverse ? z0 + last - 1 : z0 + 1, hv);
  for (int idx = tid; idx < kD * kSlice; idx += kThreads)
    S[idx / kSlice][idx % kSlice] = first[idx / kSlice * kD + j0 + idx % kSlice];
  __syncthreads();
  for (int step = 1; step < last; ++step) {
    const int k = kReverse ? last - step : step, z = z0 + k;
    const float* M = segment_matrix(p.seg_transfer, p, z, hv);
    const float* local = segment_matrix(kReverse ? p.seg_dlocal : p.seg_local, p, z, hv);
    float acc[kCols];
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) acc[jj] = local[i * kD + j0 + jt + jj];
    for (int l = 0; l < kD; ++l) {
      const float m = kReverse ? M[l * kD + i] : M[i * kD + l];
#pragma unroll
      for (int jj = 0; jj < kCols; ++jj) acc[jj] += m * S[l][jt + jj];
    }
    __syncthreads();
    float* out = segment_matrix(buf, p, kReverse ? z - 1 : z + 1, hv);
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) S[i][jt + jj] = out[i * kD + j0 + jt + jj] = acc[jj];
    __syncthreads();
  }
}

}  // namespace

void launch_combine(const Params& p, bool reverse, cudaStream_t stream) {
  auto kernel = reverse ? combine_kernel<true> : combine_kernel<false>;
  kernel<<<dim3(p.HV, p.N, kD / kSlice), kThreads, 0, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace gdn::cuda
