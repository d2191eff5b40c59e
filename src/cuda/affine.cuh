#pragma once
// The algebra of affine state maps (spec 4) on the GPU, one step at a time:
//   X <- op(M) X + C,   X, C [K][V] and M [K][K] f32 (K = V = 128), op(M) = M or M^T.
// A block of 256 threads owns an 8-column slice of X, kept in shared memory between steps; each
// thread computes 4 columns of one row. fold.cu chains the steps over a sequence's segments and
// affine.cu applies one step to a batch of maps; both go through chain().
//
// A chain is serial only through X: every M is known before it starts. So M comes to shared
// memory by cp.async (coalesced 16-byte copies), the next step's while this one computes, and
// the step reads it from there. (Reading M from global memory at its point of use, a row per
// thread, made each step wait on memory: ~13 us a step; now 1.6 us, 3 us transposed, against
// the block's 131k FMAs, 0.5 us at 128 FMAs a cycle.) Eight columns a block, not more: the chain
// of a few value heads then spreads over 16 multiprocessors a head.
#include "cuda/common.cuh"

namespace gdn::cuda::affine {

constexpr int kThreads = 256;
constexpr int kSlice = 8;                      // columns of X per block
constexpr int kCols = kD * kSlice / kThreads;  // per thread, in one row
constexpr int kLdM = kD + 4;  // M's row stride: 16-byte rows, 4 rows a quarter warp conflict-free
static_assert(kCols == 4, "a thread's columns are one float4");

struct Smem {
  float x[kD][kSlice];   // 4 KiB    the slice of X
  float m[2][kD][kLdM];  // 132 KiB  M of this step and of the next
};
constexpr int kSmemBytes = sizeof(Smem);

// The slice <- columns [j0, j0 + 8) of x (zeros when x is null).
__device__ inline void load(Smem& s, const float* x, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    s.x[idx / kSlice][idx % kSlice] = x ? x[idx / kSlice * kD + j0 + idx % kSlice] : 0.0f;
  __syncthreads();
}

// Issues (one commit group, no wait) the copy of M into buffer b.
__device__ inline void prefetch(Smem& s, int b, const float* M) {
  for (int idx = threadIdx.x; idx < kD * kD / 4; idx += kThreads) {
    const int r = idx / (kD / 4), c = idx % (kD / 4) * 4;
    cp_async16(&s.m[b][r][c], M + r * kD + c, true);
  }
  cp_async_commit();
}

// The slice <- op(M) slice + C (C may be null), also written to out (when not null), with M in
// buffer b; `next` (may be null) is the next step's M, whose copy into the other buffer starts
// first. C and out may be the same matrix: each thread reads its elements of C before writing.
template <bool kTranspose>
__device__ inline void step(Smem& s, int b, const float* next, const float* C, float* out, int j0) {
  if (next) {
    prefetch(s, b ^ 1, next);  // every thread is done with that buffer: the last step's barrier
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
  const int i = threadIdx.x / (kSlice / kCols), jt = threadIdx.x % (kSlice / kCols) * kCols;
  float c[kCols];  // read now, added after the products: the loads wait behind them
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) c[jj] = C ? C[i * kD + j0 + jt + jj] : 0.0f;
  float acc[kCols] = {};
  const float(*m)[kLdM] = s.m[b];
#pragma unroll 4
  for (int l = 0; l < kD; l += 4) {
    float ml[4];
    if constexpr (kTranspose) {
#pragma unroll
      for (int q = 0; q < 4; ++q) ml[q] = m[l + q][i];
    } else {
      const float4 row = *reinterpret_cast<const float4*>(&m[i][l]);
      ml[0] = row.x, ml[1] = row.y, ml[2] = row.z, ml[3] = row.w;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 x = *reinterpret_cast<const float4*>(&s.x[l + q][jt]);
      acc[0] += ml[q] * x.x;
      acc[1] += ml[q] * x.y;
      acc[2] += ml[q] * x.z;
      acc[3] += ml[q] * x.w;
    }
  }
  __syncthreads();
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) {
    const float y = acc[jj] + c[jj];
    s.x[i][jt + jj] = y;
    if (out) out[i * kD + j0 + jt + jj] = y;
  }
  __syncthreads();
}

// count steps t = 0 .. count - 1 on the slice loaded before: X <- op(M(t)) X + C(t), each
// result also written to out(t) (C and out may return null).
template <bool kTranspose, typename Matrix, typename Offset, typename Out>
__device__ inline void chain(Smem& s, int count, Matrix M, Offset C, Out out, int j0) {
  if (count <= 0) return;
  prefetch(s, 0, M(0));
  for (int t = 0; t < count; ++t)
    step<kTranspose>(s, t % 2, t + 1 < count ? M(t + 1) : nullptr, C(t), out(t), j0);
}

// out <- the slice.
__device__ inline void store(const Smem& s, float* out, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    out[idx / kSlice * kD + j0 + idx % kSlice] = s.x[idx / kSlice][idx % kSlice];
}

}  // namespace gdn::cuda::affine
