#pragma once
// Warp-level tensor-core fragments (mma.sync m16n8k16, bf16 x bf16 -> f32; m16n8k8 TF32 for f32
// operands split in two parts) and the ldmatrix / stmatrix moves between them and padded
// shared-memory tiles.
//
// Lane l has group g = l / 4 and thread-in-group t = l % 4. A 16 x 8 f32 accumulator tile holds
// (row g, cols 2t, 2t+1) in c[0], c[1] and (row g + 8, same cols) in c[2], c[3]. A 16 x 16 bf16 A
// fragment holds (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..) in a[0..3], so the
// accumulators of two adjacent 8-column tiles, rounded to bf16, are an A fragment: a state kept
// as accumulators feeds the next product without leaving registers. A 16 x 8 B fragment holds
// (rows 2t, 2t+1; col g) in b[0] and (rows 2t + 8, 2t + 9; col g) in b[1].

#include <cstdint>

#include "cuda/common.cuh"

namespace gdn::cuda {

using Acc = float[4];

__device__ inline std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&x);
}
// The pair rounded to bf16 (returned), and what the rounding left out, rounded too (`rest`): a
// product with the two as A operands sees the pair to about 16 bits.
__device__ inline std::uint32_t pack_bf16_split(float lo, float hi, std::uint32_t& rest) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
  const float2 back = __bfloat1622float2(x);
  rest = pack_bf16(lo - back.x, hi - back.y);
  return *reinterpret_cast<const std::uint32_t*>(&x);
}

// Two values of a 16-bit type in one register, and back.
template <typename T>
__device__ inline std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) return pack_bf16(lo, hi);
  const __half2 x = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&x);
}
template <typename T>
__device__ inline float2 unpack2(std::uint32_t r) {
  if constexpr (std::is_same_v<T, bf16>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&r));
}

__device__ inline unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
// Two matrices (lanes 0..15 give the addresses): one B fragment of b_rows_nk's first k-tile.
__device__ inline void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row)));
}
__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}
__device__ inline void stmatrix_x4(const std::uint32_t (&r)[4], void* row) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(row)),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}
__device__ inline void stmatrix_x4_trans(const std::uint32_t (&r)[4], void* row) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   smem_address(row)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}

// d += a b.
__device__ inline void mma(Acc& d, const std::uint32_t (&a)[4], std::uint32_t b0,
                           std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x = hi + lo: hi its 10 leading mantissa bits (TF32, truncated), lo the rest, exact in f32; the
// mma reads lo's leading 10 bits too. (One AND and one FADD: cvt.rna.tf32 is a dozen
// instructions on sm_90.)
__device__ inline void split_tf32(float x, std::uint32_t& hi, std::uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// d += a b, m16n8k8 TF32 (the fragments above with 32-bit elements: A (g, t), (g + 8, t),
// (g, t + 4), (g + 8, t + 4); B (t, g), (t + 4, g)).
__device__ inline void mma_tf32(Acc& d, const std::uint32_t (&a)[4], std::uint32_t b0,
                                std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of k-tile kt (columns 16 kt .. 16 kt + 15) of a 16-row accumulator block, this
// lane's columns 16 kt + c, + 1 (c = 2 (lane % 4)) scaled by s0, and the two 8 on by s8; with
// `rest`, in two bf16 parts (pack_bf16_split): a the rounded values, rest what rounding left.
__device__ inline void acc_to_a(std::uint32_t (&a)[4], const Acc* acc, int kt, float2 s0, float2 s8,
                                std::uint32_t* rest = nullptr) {
  const float* lo = acc[2 * kt];
  const float* hi = acc[2 * kt + 1];
  const float x[4][2] = {{lo[0] * s0.x, lo[1] * s0.y},
                         {lo[2] * s0.x, lo[3] * s0.y},
                         {hi[0] * s8.x, hi[1] * s8.y},
                         {hi[2] * s8.x, hi[3] * s8.y}};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[i] = rest ? pack_bf16_split(x[i][0], x[i][1], rest[i]) : pack_bf16(x[i][0], x[i][1]);
}
// As above, each column j scaled by col_scale(j).
template <typename Scale>
__device__ inline void acc_to_a(std::uint32_t (&a)[4], const Acc* acc, int kt, Scale col_scale) {
  const int c = 2 * (threadIdx.x % 4) + 16 * kt;
  acc_to_a(a, acc, kt, float2{col_scale(c), col_scale(c + 1)},
           float2{col_scale(c + 8), col_scale(c + 9)});
}

// Lane addresses into a row-major 16-bit tile `base` (row stride ld elements):
// A fragment of X rows m0.. (16) and k-tile k0.., where X is stored as X[m][k].
template <typename T>
__device__ inline T* a_rows_mk(T* base, int ld, int m0, int k0) {
  const int l = threadIdx.x % 32, m = l / 8;
  return base + (m0 + (m & 1) * 8 + l % 8) * ld + k0 + (m >> 1) * 8;
}
// B fragments of X^T for 8 columns n0.. and k-tiles k0/16, k0/16 + 1, where X is stored with the
// B matrix's n as rows (X[n][k]): b[0], b[1] of the first k-tile, then b[0], b[1] of the second.
__device__ inline const bf16* b_rows_nk(const bf16* base, int ld, int n0, int k0) {
  const int l = threadIdx.x % 32;
  return base + (n0 + l % 8) * ld + k0 + 8 * (l / 8);
}
// A fragment (with .trans) of X^T rows m0.. (16) and k-tile k0.., where X is stored as X[k][m];
// the same addresses with stmatrix .trans write an A fragment back as X[k][m].
template <typename T>
__device__ inline T* a_rows_km(T* base, int ld, int m0, int k0) {
  const int l = threadIdx.x % 32, m = l / 8;
  return base + (k0 + (m >> 1) * 8 + l % 8) * ld + m0 + (m & 1) * 8;
}

// The A fragments of rows m0 .. m0 + 15 and KT k-tiles of X (stored X[m][k]), or of X^T
// (X stored X[k][m], with .trans).
template <int KT>
__device__ inline void load_a_mk(std::uint32_t (&a)[KT][4], const bf16* x, int ld, int m0) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) ldmatrix_x4(a[kt], a_rows_mk(x, ld, m0, 16 * kt));
}
template <int KT>
__device__ inline void load_a_km(std::uint32_t (&a)[KT][4], const bf16* x, int ld, int m0) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) ldmatrix_x4_trans(a[kt], a_rows_km(x, ld, m0, 16 * kt));
}

}  // namespace gdn::cuda
