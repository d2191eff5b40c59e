#pragma once
// The algebra of affine state maps (spec 4) on the GPU, one step at a time:
//   X <- op(M) X + C,   X, C [K][V] and M [K][K] f32 (K = V = 128), op(M) = M or M^T.
// A block of 256 threads owns a 16-column slice of X, kept in shared memory between steps; each
// thread computes 8 columns of one row. fold.cu chains the steps over a sequence's segments and
// affine.cu applies one step to a batch of maps; both go through these functions.
#include "cuda/common.cuh"

namespace gdn::cuda::affine {

constexpr int kThreads = 256;
constexpr int kSlice = 16;                     // columns of X per block
constexpr int kCols = kD * kSlice / kThreads;  // per thread, in one row

using Slice = float[kD][kSlice];

// slice <- columns [j0, j0 + 16) of x (zeros when x is null).
__device__ inline void load(Slice& slice, const float* x, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    slice[idx / kSlice][idx % kSlice] = x ? x[idx / kSlice * kD + j0 + idx % kSlice] : 0.0f;
  __syncthreads();
}

// slice <- op(M) slice + C (C may be null), also written to out (when not null). C and out may
// be the same matrix: each thread reads its elements of C before writing them.
__device__ inline void step(Slice& slice, const float* M, bool transpose, const float* C,
                            float* out, int j0) {
  const int i = threadIdx.x / (kSlice / kCols), jt = threadIdx.x % (kSlice / kCols) * kCols;
  float acc[kCols];
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) acc[jj] = C ? C[i * kD + j0 + jt + jj] : 0.0f;
  for (int l = 0; l < kD; ++l) {
    const float m = transpose ? M[l * kD + i] : M[i * kD + l];
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) acc[jj] += m * slice[l][jt + jj];
  }
  __syncthreads();
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) {
    slice[i][jt + jj] = acc[jj];
    if (out) out[i * kD + j0 + jt + jj] = acc[jj];
  }
  __syncthreads();
}

// out <- the slice.
__device__ inline void store(const Slice& slice, float* out, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    out[idx / kSlice * kD + j0 + idx % kSlice] = slice[idx / kSlice][idx % kSlice];
}

}  // namespace gdn::cuda::affine
