#pragma once
// The algebra of affine state maps (spec 4) on the GPU, one step at a time:
//   X <- op(M) X + C,   X, C [K][V] and M [K][K] f32 (K = V = 128), op(M) = M or M^T.
// A block of 8 warps owns an 8-column slice of X, kept in shared memory between steps; warp w
// computes rows 16 w .. 16 w + 15 of op(M) X on the tensor cores. fold.cu chains the steps over a
// sequence's segments and affine.cu applies one step to a batch of maps; both go through chain().
//
// A chain is serial only through X: every M and C is known before it starts. So both come to
// shared memory by cp.async two steps ahead, and a step is one barrier, the products and the
// stores. The products are f32 to about 20 bits: TF32 mma (m16n8k8) in three terms,
// a b = ah bh + ah bl + al bh with a = ah + al (split_tf32), leaving out al bl and the bits of al,
// bl past TF32's (each under 2^-20 of a b). X is kept split (its two parts written once a step,
// transposed), M swizzled so that a lane's fragments come in 16- or 8-byte reads.
//
// A step takes about 1.6 us at HV=2 (ncu, 64 segments): the products alone 1.2 us (the copies
// left out), the copies alone 0.5 us (64 KB a multiprocessor, 4.3 TB/s over 32). The products
// are latency bound: about 300 instructions a warp a step at one per 10 cycles. Tried, slower:
// 16 warps each taking half of k (1.85 us), bulk copies (TMA) a row each (8 us: the TMA unit
// takes 512-byte copies one at a time), a cluster of 8 one-warp blocks sharing X by distributed
// shared memory (2 us). Eight columns a block: the chain of a few value heads then spreads over
// 16 multiprocessors a head.
#include "cuda/mma.cuh"

namespace gdn::cuda::affine {

constexpr int kThreads = 256;
constexpr int kSlice = 8;  // columns of X per block: one n8 tile
static_assert(kThreads / 32 * 16 == kD, "a warp a 16-row tile");
// X^T's row stride: rows 2p and 2p + 1 start four 16-byte chunks apart, so the B fragments'
// 16-byte reads (rows g, chunks t) are conflict-free.
constexpr int kLdX = kD + 16;

// M sits in shared memory unpadded, its 16-byte chunks swizzled: chunk c of row q at c ^ sw(q),
// sw(q) = (bit 1 of q) * 4 ^ (bits 2, 3 of q) * 2. A lane reads op(M) at rows r0, r0 + 1 (r0 =
// 16 warp + 2 g) and columns k .. k + 3 (k = k0 + 4 t): 16-byte reads of rows r0 + h of M, or
// 8-byte reads of rows k + i of M (transposed); sw spreads either over all banks.
__device__ inline int swizzled(int q, int col) {
  return q * kD + (col ^ ((((q << 1) & 4) ^ ((q >> 1) & 6)) << 2));
}

struct Smem {
  float m[3][kD * kD];        // 192 KiB  M of this step and of the next two (swizzled)
  float c[3][kD][kSlice];     //  12 KiB  the slice of C, the same steps'
  float xh[2][kSlice][kLdX];  //   9 KiB  X^T's slice before and after a step, TF32 part ...
  float xl[2][kSlice][kLdX];  //   9 KiB  ... and the rest (split_tf32)
};
constexpr int kSmemBytes = sizeof(Smem);

// Column j of the slice, row k <- x (split in two parts).
__device__ inline void put(Smem& s, int b, int j, int k, float x) {
  std::uint32_t hi, lo;
  split_tf32(x, hi, lo);
  s.xh[b][j][k] = __uint_as_float(hi);
  s.xl[b][j][k] = __uint_as_float(lo);
}

// The slice in buffer 0 <- columns [j0, j0 + 8) of x (zeros when x is null).
__device__ inline void load(Smem& s, const float* x, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads)
    put(s, 0, idx % kSlice, idx / kSlice, x ? x[idx / kSlice * kD + j0 + idx % kSlice] : 0.0f);
}

// Issues (one commit group, no wait) the copies of M and of C's slice (when not null) into
// buffer b. Warp w copies rows w + 8 i of M, whose swizzle depends on i only by its parity.
__device__ inline void prefetch(Smem& s, int b, const float* M, const float* C, int j0) {
  const int q0 = threadIdx.x / 32, col = 4 * (threadIdx.x % 32);
  const int to[2] = {swizzled(q0, col) - q0 * kD, swizzled(q0 + 8, col) - (q0 + 8) * kD};
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    const int q = q0 + 8 * i;
    cp_async16(&s.m[b][q * kD + to[i % 2]], M + q * kD + col, true);
  }
  if (C) {
    const int r = threadIdx.x / 2, j = 4 * (threadIdx.x % 2);
    cp_async16(&s.c[b][r][j], C + r * kD + j0 + j, true);
  }
  cp_async_commit();
}

// Slice buffer b ^ 1 <- op(M) X + C with X in slice buffer b, M and C in buffer bm (C when
// has_c), also written to out (when not null). C and out may be the same matrix: C came to
// shared memory before the step.
template <bool kTranspose>
__device__ inline void step(Smem& s, int bm, int b, bool has_c, float* out, int j0) {
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int r0 = 16 * warp + 2 * g;  // fragment rows g and g + 8 are rows r0 and r0 + 1
  const float* m = s.m[bm];
  Acc acc[2][3] = {};  // [mma of the k-quad][term]: six chains of 8 mma
#pragma unroll
  for (int k0 = 0; k0 < kD; k0 += 16) {
    // This lane's k-quad k .. k + 3: k-slots t and t + 4 of the first mma take k, k + 1, of the
    // second k + 2, k + 3 (any assignment works that A and B share).
    const int k = k0 + 4 * t;
    float a[4][2];  // op(M)[r0 + h][k + i] in a[i][h]
    if constexpr (kTranspose) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = *reinterpret_cast<const float2*>(&m[swizzled(k + i, r0)]);
        a[i][0] = v.x, a[i][1] = v.y;
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 v = *reinterpret_cast<const float4*>(&m[swizzled(r0 + h, k)]);
        a[0][h] = v.x, a[1][h] = v.y, a[2][h] = v.z, a[3][h] = v.w;
      }
    }
    const float4 xh = *reinterpret_cast<const float4*>(&s.xh[b][g][k]);
    const float4 xl = *reinterpret_cast<const float4*>(&s.xl[b][g][k]);
    const std::uint32_t bh[2][2] = {{__float_as_uint(xh.x), __float_as_uint(xh.y)},
                                    {__float_as_uint(xh.z), __float_as_uint(xh.w)}};
    const std::uint32_t bl[2][2] = {{__float_as_uint(xl.x), __float_as_uint(xl.y)},
                                    {__float_as_uint(xl.z), __float_as_uint(xl.w)}};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      std::uint32_t ah[4], al[4];  // (g, slot t), (g + 8, slot t), (g, slot t + 4), (g + 8, ...)
      split_tf32(a[2 * q][0], ah[0], al[0]);
      split_tf32(a[2 * q][1], ah[1], al[1]);
      split_tf32(a[2 * q + 1][0], ah[2], al[2]);
      split_tf32(a[2 * q + 1][1], ah[3], al[3]);
      mma_tf32(acc[q][0], ah, bh[q][0], bh[q][1]);
      mma_tf32(acc[q][1], ah, bl[q][0], bl[q][1]);
      mma_tf32(acc[q][2], al, bh[q][0], bh[q][1]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + h;
    float y[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * h + e;
      y[e] = (acc[0][0][i] + acc[1][0][i]) +
             ((acc[0][1][i] + acc[1][1][i]) + (acc[0][2][i] + acc[1][2][i]));
      if (has_c) y[e] += s.c[bm][r][2 * t + e];
      put(s, b ^ 1, 2 * t + e, r, y[e]);
    }
    if (out) *reinterpret_cast<float2*>(&out[r * kD + j0 + 2 * t]) = make_float2(y[0], y[1]);
  }
}

// count steps t = 0 .. count - 1 on the slice loaded before: X <- op(M(t)) X + C(t), each
// result also written to out(t) (C and out may return null). Returns the slice buffer that then
// holds X. M(t) and C(t) are copied two steps ahead.
template <bool kTranspose, typename Matrix, typename Offset, typename Out>
__device__ inline int chain(Smem& s, int count, Matrix M, Offset C, Out out, int j0) {
  if (count > 0) prefetch(s, 0, M(0), C(0), j0);
  if (count > 1) prefetch(s, 1, M(1), C(1), j0);
  for (int t = 0; t < count; ++t) {
    if (t + 1 < count)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();  // M(t), C(t) and X are in place; every thread is done with buffers t - 1
    step<kTranspose>(s, t % 3, t % 2, C(t) != nullptr, out(t), j0);
    if (t + 2 < count) prefetch(s, (t + 2) % 3, M(t + 2), C(t + 2), j0);
  }
  __syncthreads();
  return count % 2;
}

// out <- the slice in buffer b.
__device__ inline void store(const Smem& s, int b, float* out, int j0) {
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads) {
    const int k = idx / kSlice, j = idx % kSlice;
    out[k * kD + j0 + j] = s.xh[b][j][k] + s.xl[b][j][k];
  }
}

}  // namespace gdn::cuda::affine
