#pragma once
// The algebra of affine state maps (spec 4) on the GPU, one step at a time:
//   X <- op(M) X + C,   X, C [K][V] and M [K][K] f32 (K = V = 128), op(M) = M or M^T.
// A block of 8 warps owns a slice of X of 8, 16 or 32 columns (kTiles n8 tiles), kept in shared
// memory between steps; warp w computes rows 16 w .. 16 w + 15 of op(M) X on the tensor cores.
// fold.cu chains the steps over a sequence's segments and affine.cu applies one step to a batch of
// maps; both go through chain().
//
// A chain is serial only through X: every M and C is known before it starts. So M comes to
// shared memory by cp.async two steps ahead and C to registers a step ahead, and a step is one
// barrier, the products and the stores (X in two buffers; at 32 columns in one, and a barrier
// more between the products and the stores). The products are f32 to about 20 bits: TF32 mma
// (m16n8k8) in three terms, a b = ah bh + ah bl + al bh with a = ah + al (split_tf32), leaving out
// al bl and the bits of al, bl past TF32's (each under 2^-20 of a b). X is kept split (its two
// parts written once a step, transposed), M swizzled so that a lane's fragments come in 16- or
// 8-byte reads.
//
// A step takes about 1.6 us at HV=2 (ncu, 64 segments): the products alone 1.2 us (the copies
// left out), the copies alone 0.5 us (64 KB a multiprocessor, 4.3 TB/s over 32). The products
// are latency bound: about 300 instructions a warp a step at one per 10 cycles. Tried, slower:
// 16 warps each taking half of k (1.85 us), bulk copies (TMA) a row each (8 us: the TMA unit
// takes 512-byte copies one at a time), a cluster of 8 one-warp blocks sharing X by distributed
// shared memory (2 us). Eight columns a block spread the chain of a few value heads over 16
// multiprocessors a head; with many heads, 32 columns a block run the folds in one wave of blocks
// instead of four (segments.h: fold_tiles): at 32 heads, 54 -> 35 us a fold of 8 steps (T=65536),
// 20 -> 12 us one of a step (T=4096).
#include "cuda/mma.cuh"

namespace gdn::cuda::affine {

constexpr int kThreads = 256;
static_assert(kThreads / 32 * 16 == kD, "a warp a 16-row tile");

// M sits in shared memory unpadded, its 16-byte chunks swizzled: chunk c of row q at c ^ sw(q),
// sw(q) = (bit 1 of q) * 4 ^ (bits 2, 3 of q) * 2. A lane reads op(M) at rows r0, r0 + 1 (r0 =
// 16 warp + 2 g) and columns k .. k + 3 (k = k0 + 4 t): 16-byte reads of rows r0 + h of M, or
// 8-byte reads of rows k + i of M (transposed); sw spreads either over all banks.
__device__ inline int swizzled(int q, int col) {
  return q * kD + (col ^ ((((q << 1) & 4) ^ ((q >> 1) & 6)) << 2));
}
// X^T's row j (column j of the slice) holds rows k of X, its odd rows' 16-byte chunks moved by
// four (k ^ 16): the B fragments' 16-byte reads (rows g, chunks t; a quarter warp takes rows g,
// g + 1) fall on all 32 banks.
__device__ inline int x_at(int j, int k) {
  return j * kD + (k ^ ((j & 1) << 4));
}

template <int kTiles>  // n8 tiles: the slice's 8 kTiles columns
struct Smem {
  static constexpr int kSlice = 8 * kTiles;
  // X before and after a step in two buffers where both fit beside M (8 and 16 columns); at 32
  // columns in one, read whole before it is overwritten (a barrier more a step).
  static constexpr int kBuffers = kTiles < 4 ? 2 : 1;
  // The buffer a step writes after reading buffer b.
  static __device__ int after(int b) { return (b + 1) % kBuffers; }
  float m[3][kD * kD];              // 192 KiB  M of this step and of the next two (swizzled)
  float xh[kBuffers][kSlice * kD];  // 8-16 KiB X^T's slice (x_at), TF32 part ...
  float xl[kBuffers][kSlice * kD];  // 8-16 KiB ... and the rest (split_tf32)
};
template <int kTiles>
constexpr int kSmemBytes = sizeof(Smem<kTiles>);
static_assert(kSmemBytes<2> <= 227 * 1024 && kSmemBytes<4> <= 227 * 1024,
              "a block fits in an SM's shared memory");

// Column j of slice buffer b, row k <- x (split in two parts).
template <int kTiles>
__device__ inline void put(Smem<kTiles>& s, int b, int j, int k, float x) {
  std::uint32_t hi, lo;
  split_tf32(x, hi, lo);
  s.xh[b][x_at(j, k)] = __uint_as_float(hi);
  s.xl[b][x_at(j, k)] = __uint_as_float(lo);
}

// Slice buffer 0 <- columns [j0, j0 + kSlice) of x (zeros when x is null), every load issued
// before any is used (x may be a caller's state: 4-byte loads assume no more alignment).
template <int kTiles>
__device__ inline void load(Smem<kTiles>& s, const float* x, int j0) {
  constexpr int kSlice = Smem<kTiles>::kSlice, kLoads = kD * kSlice / kThreads;
  float v[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    v[i] = x ? x[idx / kSlice * kD + j0 + idx % kSlice] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    put(s, 0, idx % kSlice, idx / kSlice, v[i]);
  }
}

// Issues (one commit group, no wait) the copies of M into buffer b. Warp w copies rows w + 8 i,
// whose swizzle depends on i only by its parity.
template <int kTiles>
__device__ inline void prefetch(Smem<kTiles>& s, int b, const float* M) {
  const int q0 = threadIdx.x / 32, col = 4 * (threadIdx.x % 32);
  const int to[2] = {swizzled(q0, col) - q0 * kD, swizzled(q0 + 8, col) - (q0 + 8) * kD};
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    const int q = q0 + 8 * i;
    cp_async16(&s.m[b][q * kD + to[i % 2]], M + q * kD + col, true);
  }
  cp_async_commit();
}

// The first of the two rows of op(M) X this lane holds: 16 warp + 2 g (g = lane / 4; its
// fragment rows g and g + 8 are rows r0 and r0 + 1).
__device__ inline int lane_row0() {
  return threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4 * 2;
}

// This thread's elements of C (rows lane_row0() + h, columns 8 nt + 2 t, + 1 of the slice, t =
// lane % 4), read a step ahead of their use; `given` false when C is null.
template <int kTiles>
struct Offset {
  float2 v[2][kTiles];
  bool given;
  __device__ void load(const float* C, int j0) {
    const int r0 = lane_row0(), t = threadIdx.x % 4;
    given = C != nullptr;
    if (given)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int nt = 0; nt < kTiles; ++nt)
          v[h][nt] = *reinterpret_cast<const float2*>(&C[(r0 + h) * kD + j0 + 8 * nt + 2 * t]);
  }
};

// Slice buffer b' <- op(M) X + C with X in slice buffer b (b' = b ^ 1, or b itself with one
// buffer), M in buffer bm, C as loaded (when given), also written to out (when not null). C and
// out may be the same matrix: each thread read its elements of C a step before.
template <bool kTranspose, int kTiles>
__device__ inline void step(Smem<kTiles>& s, int bm, int b, const Offset<kTiles>& c, float* out,
                            int j0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4, r0 = lane_row0();
  const float* m = s.m[bm];
  Acc acc[kTiles][2][3] = {};  // [n8 tile][mma of the k-quad][term]: chains of 8 mma
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
    std::uint32_t ah[2][4], al[2][4];  // (g, slot t), (g + 8, slot t), (g, slot t + 4), (g + 8, ..)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      split_tf32(a[2 * q][0], ah[q][0], al[q][0]);
      split_tf32(a[2 * q][1], ah[q][1], al[q][1]);
      split_tf32(a[2 * q + 1][0], ah[q][2], al[q][2]);
      split_tf32(a[2 * q + 1][1], ah[q][3], al[q][3]);
    }
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) {
      const float4 xh = *reinterpret_cast<const float4*>(&s.xh[b][x_at(8 * nt + g, k)]);
      const float4 xl = *reinterpret_cast<const float4*>(&s.xl[b][x_at(8 * nt + g, k)]);
      const std::uint32_t bh[2][2] = {{__float_as_uint(xh.x), __float_as_uint(xh.y)},
                                      {__float_as_uint(xh.z), __float_as_uint(xh.w)}};
      const std::uint32_t bl[2][2] = {{__float_as_uint(xl.x), __float_as_uint(xl.y)},
                                      {__float_as_uint(xl.z), __float_as_uint(xl.w)}};
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        mma_tf32(acc[nt][q][0], ah[q], bh[q][0], bh[q][1]);
        mma_tf32(acc[nt][q][1], ah[q], bl[q][0], bl[q][1]);
        mma_tf32(acc[nt][q][2], al[q], bh[q][0], bh[q][1]);
      }
    }
  }
  if constexpr (Smem<kTiles>::kBuffers == 1) __syncthreads();  // every warp has read X
  const int next = Smem<kTiles>::after(b);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + h;
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * h + e;
        const auto& x = acc[nt];
        y[e] = (x[0][0][i] + x[1][0][i]) + ((x[0][1][i] + x[1][1][i]) + (x[0][2][i] + x[1][2][i]));
        if (c.given) y[e] += e ? c.v[h][nt].y : c.v[h][nt].x;
        put(s, next, 8 * nt + 2 * t + e, r, y[e]);
      }
      if (out)
        *reinterpret_cast<float2*>(&out[r * kD + j0 + 8 * nt + 2 * t]) = make_float2(y[0], y[1]);
    }
}

// count steps t = 0 .. count - 1 on the slice loaded before: X <- op(M(t)) X + C(t), each
// result also written to out(t) (C and out may return null). Returns the slice buffer that then
// holds X. M(t) is copied two steps ahead, C(t) read one step ahead.
template <bool kTranspose, int kTiles, typename Matrix, typename Offsets, typename Out>
__device__ inline int chain(Smem<kTiles>& s, int count, Matrix M, Offsets C, Out out, int j0) {
  if (count > 0) prefetch(s, 0, M(0));
  if (count > 1) prefetch(s, 1, M(1));
  Offset<kTiles> c;
  if (count > 0) c.load(C(0), j0);
  int b = 0;
  for (int t = 0; t < count; ++t) {
    if (t + 1 < count)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    __syncthreads();  // M(t) and X are in place; every thread is done with M(t - 1)'s buffer
    Offset<kTiles> next;
    next.load(t + 1 < count ? C(t + 1) : nullptr, j0);
    step<kTranspose>(s, t % 3, b, c, out(t), j0);
    b = Smem<kTiles>::after(b);
    if (t + 2 < count) prefetch(s, (t + 2) % 3, M(t + 2));
    c = next;
  }
  __syncthreads();
  return b;
}

// out <- slice buffer b.
template <int kTiles>
__device__ inline void store(const Smem<kTiles>& s, int b, float* out, int j0) {
  constexpr int kSlice = Smem<kTiles>::kSlice;
  for (int idx = threadIdx.x; idx < kD * kSlice; idx += kThreads) {
    const int k = idx / kSlice, j = idx % kSlice;
    out[k * kD + j0 + j] = s.xh[b][x_at(j, k)] + s.xl[b][x_at(j, k)];
  }
}

}  // namespace gdn::cuda::affine
