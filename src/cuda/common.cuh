#pragma once
// Shared device helpers of the delta-rule kernels: dtype conversion, 16-byte async copies, and a
// block-wide tensor-core GEMM on shared memory (WMMA bf16 x bf16 -> f32).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

namespace gdn::cuda {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kC = 64;      // chunk
constexpr int kD = 128;     // K = V
constexpr int kLdH = 136;   // shared row stride of a 128-wide bf16 tile (+16 B: no bank conflicts)
constexpr int kLdH64 = 72;  // of a 64-wide bf16 tile
constexpr int kLdF = 132;   // of a 128-wide f32 tile
constexpr int kLdF64 = 68;  // of a 64-wide f32 tile

__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(bf16 x) {
  return __bfloat162float(x);
}
__device__ inline float to_float(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}

// A scalar of a runtime dtype: 0 f32, 1 bf16, 2 f16 (beta and dbeta may be f32 or q's dtype).
__device__ inline float load_scalar(const void* p, long long i, int code) {
  if (code == 0) return static_cast<const float*>(p)[i];
  if (code == 1) return to_float(static_cast<const bf16*>(p)[i]);
  return to_float(static_cast<const __half*>(p)[i]);
}
__device__ inline void store_scalar(void* p, long long i, int code, float x) {
  if (code == 0)
    static_cast<float*>(p)[i] = x;
  else if (code == 1)
    static_cast<bf16*>(p)[i] = from_float<bf16>(x);
  else
    static_cast<__half*>(p)[i] = from_float<__half>(x);
}

// 16-byte global -> shared copy; zero-fills the destination when !valid.
__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

using Row = wmma::row_major;
using Col = wmma::col_major;

// C[M x N] (f32, row-major, ldc) = (or +=) A[M x Kd] B[Kd x N], both bf16 in shared memory.
// A row-major: A(i, k) = a[i lda + k]; col-major: a[k lda + i] (so a col-major A over a row-major
// buffer is its transpose). Same for B with (k, j). Every warp of the block takes 16x16 tiles.
template <int M, int N, int Kd, typename LayoutA, typename LayoutB, bool kAccumulate = false>
__device__ inline void block_gemm(const bf16* a, int lda, const bf16* b, int ldb, float* c,
                                  int ldc) {
  static_assert(M % 16 == 0 && N % 16 == 0 && Kd % 16 == 0);
  constexpr bool a_row = std::is_same_v<LayoutA, Row>, b_row = std::is_same_v<LayoutB, Row>;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int tile = warp; tile < (M / 16) * (N / 16); tile += warps) {
    const int tm = tile / (N / 16) * 16, tn = tile % (N / 16) * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if constexpr (kAccumulate)
      wmma::load_matrix_sync(acc, c + tm * ldc + tn, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll 4
    for (int k = 0; k < Kd; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LayoutA> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayoutB> fb;
      wmma::load_matrix_sync(fa, a_row ? a + tm * lda + k : a + k * lda + tm, lda);
      wmma::load_matrix_sync(fb, b_row ? b + k * ldb + tn : b + tn * ldb + k, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + tm * ldc + tn, acc, ldc, wmma::mem_row_major);
  }
}

// Sum over the 32 lanes of a warp.
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace gdn::cuda
