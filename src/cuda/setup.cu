// The chunk table (from cu_seqlens or the batch rows) and the staging of q, k: bf16 copies,
// l2-normalized when asked (spec 1: x * rsqrt(sum(x^2) + 1e-6)), with the factor kept for the
// backward.
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

// One block: sequence n has ceil(len / 64) chunks starting at slot chunk_begin[n].
__global__ void chunk_table_kernel(Params p) {
  if (threadIdx.x == 0) {
    int total = 0;
    for (int n = 0; n < p.N; ++n) {
      int begin = 0, len = p.T;
      if (p.cu_seqlens) {
        const long long b0 = p.cu_seqlens_i64 ? static_cast<const long long*>(p.cu_seqlens)[n]
                                              : static_cast<const int*>(p.cu_seqlens)[n];
        const long long b1 = p.cu_seqlens_i64 ? static_cast<const long long*>(p.cu_seqlens)[n + 1]
                                              : static_cast<const int*>(p.cu_seqlens)[n + 1];
        begin = static_cast<int>(b0);
        len = static_cast<int>(b1 - b0);
      }
      p.seq_begin[n] = begin;
      p.seq_len[n] = len;
      p.chunk_begin[n] = total;
      total += (len + kC - 1) / kC;
    }
    p.chunk_begin[p.N] = total;
  }
  __syncthreads();
  const int total = p.chunk_begin[p.N];
  for (int cid = threadIdx.x; cid < p.NC; cid += blockDim.x) {
    ChunkInfo info{0, 0, 0, 0, 0};
    if (cid < total) {
      int lo = 0, hi = p.N - 1;  // the last n with chunk_begin[n] <= cid
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.chunk_begin[mid] <= cid)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int index = cid - p.chunk_begin[lo];
      const int t0 = index * kC;
      info = {lo, p.cu_seqlens ? 0 : lo, p.seq_begin[lo] + t0, min(kC, p.seq_len[lo] - t0), index};
    }
    p.chunks[cid] = info;
  }
}

// One warp per row of 128: 4 elements per lane.
template <typename In>
__global__ void stage_qk_kernel(Params p, long long rows) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  for (int which = 0; which < 2; ++which) {
    const In* x = static_cast<const In*>(which ? p.k : p.q) + row * kD;
    bf16* y = (which ? p.kn : p.qn) + row * kD;
    float value[4], sum = 0;
    for (int i = 0; i < 4; ++i) {
      value[i] = to_float(x[lane + 32 * i]);
      sum += value[i] * value[i];
    }
    const float r = p.l2norm ? rsqrtf(warp_sum(sum) + 1e-6f) : 1.0f;
    for (int i = 0; i < 4; ++i) y[lane + 32 * i] = from_float<bf16>(value[i] * r);
    if (lane == 0) (which ? p.rk : p.rq)[row] = r;
  }
}

}  // namespace

template <typename In>
void launch_setup(const Params& p, cudaStream_t stream) {
  chunk_table_kernel<<<1, 256, 0, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
  const long long rows = static_cast<long long>(p.B) * p.T * p.HK;
  constexpr int kWarps = 8;
  stage_qk_kernel<In>
      <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(p, rows);
  GDN_CUDA_CHECK_LAUNCH();
}

template void launch_setup<bf16>(const Params&, cudaStream_t);
template void launch_setup<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
