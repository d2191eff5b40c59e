#pragma once
// The algebra of affine state maps (spec 4) on the GPU, one step at a time:
//   X <- op(M) X + C,   X, C [K][V] and M [K][K] f32 (K = V = 128), op(M) = M or M^T.
// A block of 8 warps owns an 8-column slice of X, kept in shared memory between steps; warp w
// computes rows 16 w .. 16 w + 15 of op(M) X on the tensor cores. fold.cu chains the steps over a
// sequence's segments and affine.cu applies one step to a batch of maps; both go through chain().
//
// A chain is serial only through X: every M and C is known before it starts. So both come to
// shared memory by cp.async, the next step's while this one computes, and a step is one barrier,
// the products and the stores. The products are f32 to about 20 bits: TF32 mma (m16n8k8) in
// three terms, a b = ah bh + ah bl + al bh with a = ah + al (split_tf32), leaving out al bl and
// the bits of al, bl past TF32's (each under 2^-20 of a b). A step takes about 2 us at HV=2
// (3 us on the CUDA cores, 4 FMAs a thread per shared load of X and a third of the instructions
// the copy's address arithmetic). What sets the 2 us is open; not the copy's size: a cluster of 8
// blocks, each copying 8 KB of M a step and sharing X through distributed shared memory, took
// the same time (and half again as long at HV=32). Eight columns a block: the chain of a few
// value heads then spreads over 16 multiprocessors a head.
#include "cuda/mma.cuh"

namespace gdn::cuda::affine {

constexpr int kThreads = 256;
constexpr int kSlice = 8;  // columns of X per block: one n8 tile
static_assert(kThreads / 32 * 16 == kD, "a warp a 16-row tile");
// M's row stride: the A fragments' reads are conflict-free (rows g, cols t: 4 g + t; transposed,
// rows t, cols g: 8 t + g, mod 32 banks), and rows stay 16-byte aligned for cp.async.
template <bool kTranspose>
constexpr int kLdM = kTranspose ? kD + 8 : kD + 4;

struct Smem {
  float m[2][kD * (kD + 8)];  // 136 KiB  M of this step and of the next (row stride kLdM)
  float c[2][kD][kSlice];     //   8 KiB  the slice of C, this step's and the next
  float x[2][kD][kSlice];     //   8 KiB  the slice of X before and after a step
};
constexpr int kSmemBytes = sizeof(Smem);

// x[0] <- columns [j0, j0 + 8) of x (zeros when x is null).
__device__ inline void load(Smem& s, const float* x, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    s.x[0][idx / kSlice][idx % kSlice] = x ? x[idx / kSlice * kD + j0 + idx % kSlice] : 0.0f;
}

// Issues (one commit group, no wait) the copies of M and of C's slice (when not null) into
// buffer b.
template <bool kTranspose>
__device__ inline void prefetch(Smem& s, int b, const float* M, const float* C, int j0) {
  // f32 rows as 16-bit columns: M 256 a row, C's slice 16
  issue_rows<2 * kD, kD, kThreads>(s.m[b], 2 * kLdM<kTranspose>, M, 2 * kD, kD);
  if (C) issue_rows<2 * kSlice, kD, kThreads>(s.c[b], 2 * kSlice, C + j0, 2 * kD, kD);
  cp_async_commit();
}

// x[b ^ 1] <- op(M) x[b] + C with M, C in buffer b (C when has_c), also written to out (when not
// null). C and out may be the same matrix: C came to shared memory before the step.
template <bool kTranspose>
__device__ inline void step(Smem& s, int b, bool has_c, float* out, int j0) {
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int r0 = 16 * warp + g;
  const float* m = s.m[b];
  auto op_m = [&](int r, int k) {  // op(M)[r][k]
    return kTranspose ? m[k * kLdM<kTranspose> + r] : m[r * kLdM<kTranspose> + k];
  };
  Acc big = {}, small = {};
#pragma unroll
  for (int k0 = 0; k0 < kD; k0 += 8) {
    std::uint32_t ah[4], al[4], bh[2], bl[2];
    split_tf32(op_m(r0, k0 + t), ah[0], al[0]);
    split_tf32(op_m(r0 + 8, k0 + t), ah[1], al[1]);
    split_tf32(op_m(r0, k0 + t + 4), ah[2], al[2]);
    split_tf32(op_m(r0 + 8, k0 + t + 4), ah[3], al[3]);
    split_tf32(s.x[b][k0 + t][g], bh[0], bl[0]);
    split_tf32(s.x[b][k0 + t + 4][g], bh[1], bl[1]);
    mma_tf32(big, ah, bh[0], bh[1]);
    mma_tf32(small, ah, bl[0], bl[1]);
    mma_tf32(small, al, bh[0], bh[1]);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + 8 * half;
    float2 y =
        make_float2(big[2 * half] + small[2 * half], big[2 * half + 1] + small[2 * half + 1]);
    if (has_c) {
      const float2 c = *reinterpret_cast<const float2*>(&s.c[b][r][2 * t]);
      y.x += c.x, y.y += c.y;
    }
    *reinterpret_cast<float2*>(&s.x[b ^ 1][r][2 * t]) = y;
    if (out) *reinterpret_cast<float2*>(&out[r * kD + j0 + 2 * t]) = y;
  }
}

// count steps t = 0 .. count - 1 on the slice loaded before: X <- op(M(t)) X + C(t), each
// result also written to out(t) (C and out may return null). Returns the buffer of s.x that then
// holds X.
template <bool kTranspose, typename Matrix, typename Offset, typename Out>
__device__ inline int chain(Smem& s, int count, Matrix M, Offset C, Out out, int j0) {
  if (count > 0) prefetch<kTranspose>(s, 0, M(0), C(0), j0);
  for (int t = 0; t < count; ++t) {
    cp_async_wait<0>();
    __syncthreads();  // M(t), C(t) and X are in place; every thread is done with buffers t - 1
    if (t + 1 < count) prefetch<kTranspose>(s, (t + 1) % 2, M(t + 1), C(t + 1), j0);
    step<kTranspose>(s, t % 2, C(t) != nullptr, out(t), j0);
  }
  __syncthreads();
  return count % 2;
}

// out <- the slice in x[b].
__device__ inline void store(const Smem& s, int b, float* out, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    out[idx / kSlice * kD + j0 + idx % kSlice] = s.x[b][idx / kSlice][idx % kSlice];
}

}  // namespace gdn::cuda::affine
