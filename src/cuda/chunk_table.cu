// The chunk table, from cu_seqlens or the batch rows.
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

// One block: sequence n has ceil(len / 64) chunks starting at slot chunk_begin[n]. Offsets the
// host did not check (cu_seqlens on the device only) that are not 0, increasing, ending at T, or
// that need more than the NC slots planned, leave every sequence empty: nothing is computed
// (the contract is broken) but nothing is read or written out of bounds either.
__global__ void chunk_table_kernel(Params p) {
  if (threadIdx.x == 0) {
    int total = 0;
    bool valid = true;
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
      valid = valid && len > 0 && begin >= 0 && begin + len <= p.T && (n > 0 || begin == 0) &&
              (n < p.N - 1 || begin + len == p.T);
      p.seq_begin[n] = begin;
      p.seq_len[n] = len;
      p.chunk_begin[n] = total;
      total += (len + kC - 1) / kC;
    }
    p.chunk_begin[p.N] = total;
    if (!valid || total > p.NC) {
      for (int n = 0; n <= p.N; ++n) p.chunk_begin[n] = 0;
      for (int n = 0; n < p.N; ++n) p.seq_len[n] = 0;
    }
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

}  // namespace

void launch_chunk_table(const Params& p, cudaStream_t stream) {
  chunk_table_kernel<<<1, 256, 0, stream>>>(p);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace gdn::cuda
