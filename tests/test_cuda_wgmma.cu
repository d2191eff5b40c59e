// The warpgroup products of src/cuda/wgmma.cuh (A from registers or, SS, from a swizzled shared
// tile; B a swizzled shared tile, in both majors) against a float64 host product on random bf16
// inputs (skips without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/check.h"
#include "cuda/wgmma.cuh"

namespace gdn::cuda {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// out = 2 a B (issued twice: once overwriting, once accumulating) for a: [64][16 KT] and B a
// window of 8 N columns (its last) of a stored tile x with kTileN columns: x is [kTileN][16 KT]
// (B = x^T, kTrans false) or [16 KT][kTileN] (B = x, kTrans true), row-major. The window starts
// kTileN - 8 N rows (K-major) or 64-column blocks (MN-major) into the swizzled tile. kSmemA: A
// from a swizzled tile (SS) instead of registers, the last 64 of its kARows rows (the rows before
// hold other rows of a); kSmemAT: A from a swizzled tile of a^T ([16 KT][64], read MN-major);
// kFragT: A from registers loaded (ldmatrix .trans) from that tile.
template <int N, int KT, bool kTrans, int kTileN, bool kSmemA, int kARows, bool kSmemAT,
          bool kFragT>
__global__ void product_kernel(const bf16* a, const bf16* x, float* out) {
  constexpr int kK = 16 * KT, kLdA = kK + 8, kRows = kTrans ? kK : kTileN,
                kCols = kTrans ? kTileN : kK, kN0 = kTileN - 8 * N;
  __shared__ __align__(1024) unsigned char xs[kRows * kCols * 2];
  __shared__ __align__(1024) unsigned char as_swizzled[kARows * kK * 2];
  __shared__ __align__(16) bf16 as[64 * kLdA];
  __shared__ __align__(1024) bf16 at_swizzled[kK * 64];
  for (int i = threadIdx.x; i < 64 * kK; i += blockDim.x) {
    as[(i / kK) * kLdA + i % kK] = a[i];
    *swizzled_at(at_swizzled, kK, i % kK, i / kK) = a[i];  // a^T
  }
  for (int i = threadIdx.x; i < kARows * kK / 8; i += blockDim.x) {
    const int r = i / (kK / 8), piece = i % (kK / 8), first = kARows - 64;
    const int from = r >= first ? r - first : (r + 17) % 64;  // a's rows, shifted before them
    *reinterpret_cast<uint4*>(as_swizzled + swizzled_offset(kARows, r, piece)) =
        reinterpret_cast<const uint4*>(a)[from * (kK / 8) + piece];
  }
  for (int i = threadIdx.x; i < kRows * kCols / 8; i += blockDim.x) {
    const int r = i / (kCols / 8), piece = i % (kCols / 8);
    *reinterpret_cast<uint4*>(xs + swizzled_offset(kRows, r, piece)) =
        reinterpret_cast<const uint4*>(x)[i];
  }
  fence_proxy_async();
  __syncthreads();
  std::uint32_t frag[KT][4];
  if constexpr (kFragT)
    for (int kt = 0; kt < KT; ++kt)
      load_a_km_swizzled(frag[kt], at_swizzled, kK, 16 * (threadIdx.x / 32), kt);
  else
    load_a_mk<KT>(frag, as, kLdA, 16 * (threadIdx.x / 32));
  const SmemA<KT> a_tile{reinterpret_cast<const bf16*>(as_swizzled) + (kARows - 64) * 64, kARows};
  const SmemAT<KT> at_tile{at_swizzled, kK};
  const bf16* window = reinterpret_cast<const bf16*>(xs) + (kTrans ? kN0 * kRows : kN0 * 64);
  Acc d[N];
  wgmma_fence();
  for (int twice = 0; twice < 2; ++twice) {
    if constexpr (kTrans && kSmemAT)
      wgmma_kn(d, at_tile, window, kRows, twice == 1);
    else if constexpr (kSmemAT)
      wgmma_nk(d, at_tile, window, twice == 1, kRows);
    else if constexpr (kTrans && kSmemA)
      wgmma_kn(d, a_tile, window, kRows, twice == 1);
    else if constexpr (kTrans)
      wgmma_kn(d, frag, window, kRows, twice == 1);
    else if constexpr (kSmemA)
      wgmma_nk(d, a_tile, window, twice == 1, kRows);
    else
      wgmma_nk(d, frag, window, twice == 1, kRows);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(d);
  const int row = 16 * (threadIdx.x / 32) + threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
  for (int nt = 0; nt < N; ++nt)
    for (int e = 0; e < 4; ++e) out[(row + 8 * (e / 2)) * 8 * N + 8 * nt + c + e % 2] = d[nt][e];
}

template <int N, int KT, bool kTrans, int kTileN = 8 * N, bool kSmemA = false, int kARows = 64,
          bool kSmemAT = false, bool kFragT = false>
void check_product() {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int kK = 16 * KT, kN = 8 * N, kN0 = kTileN - kN;
  std::mt19937_64 rng(kTileN * 10000 + kN * 100 + kK + kTrans);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> a(64 * kK), x(kTileN * kK);
  for (auto& v : a) v = __float2bfloat16(normal(rng));
  for (auto& v : x) v = __float2bfloat16(normal(rng));
  auto b = [&](int k, int n) {  // B[k][n]
    return static_cast<double>(
        __bfloat162float(kTrans ? x[k * kTileN + kN0 + n] : x[(kN0 + n) * kK + k]));
  };
  bf16 *d_a, *d_x;
  float* d_out;
  GDN_CUDA_CHECK(cudaMalloc(&d_a, a.size() * 2));
  GDN_CUDA_CHECK(cudaMalloc(&d_x, x.size() * 2));
  GDN_CUDA_CHECK(cudaMalloc(&d_out, 64 * kN * 4));
  GDN_CUDA_CHECK(cudaMemcpy(d_a, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  GDN_CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  product_kernel<N, KT, kTrans, kTileN, kSmemA, kARows, kSmemAT, kFragT>
      <<<1, 128>>>(d_a, d_x, d_out);
  GDN_CUDA_CHECK(cudaGetLastError());
  std::vector<float> out(64 * kN);
  GDN_CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  GDN_CUDA_CHECK(cudaFree(d_a));
  GDN_CUDA_CHECK(cudaFree(d_x));
  GDN_CUDA_CHECK(cudaFree(d_out));
  double err = 0, norm = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < kN; ++n) {
      double ref = 0;
      for (int k = 0; k < kK; ++k)
        ref += static_cast<double>(__bfloat162float(a[m * kK + k])) * b(k, n);
      err += std::pow(out[m * kN + n] - 2 * ref, 2);
      norm += std::pow(2 * ref, 2);
    }
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << "first value " << out[0];
}
TEST(CudaWgmma, KMajor64x128) {
  check_product<8, 8, false>();
}
TEST(CudaWgmma, KMajor64x64) {
  check_product<8, 4, false>();
}
TEST(CudaWgmma, MNMajor128x64) {
  check_product<16, 4, true>();
}
TEST(CudaWgmma, MNMajor64x64) {
  check_product<8, 4, true>();
}
// Windows of a larger tile, as grad_chunk.cu reads them: 32 of 64 rows, and the second
// 64-column block of a 128-column tile.
TEST(CudaWgmma, KMajor32RowWindow) {
  check_product<4, 8, false, 64>();
}
TEST(CudaWgmma, MNMajorSecondColumnBlock) {
  check_product<8, 8, true, 128>();
}
TEST(CudaWgmma, MNMajorSecondColumnBlockOf64Rows) {
  check_product<8, 4, true, 128>();
}
// A from shared memory (SS), in the shapes grad_chunk.cu uses: Q K^T over a 32-row window, and
// Vn dS^T (64 of 128 columns of an MN-major B).
TEST(CudaWgmma, SmemAKMajor32RowWindow) {
  check_product<4, 8, false, 64, true>();
}
TEST(CudaWgmma, SmemAKMajor64x128) {
  check_product<8, 8, false, 64, true>();
}
TEST(CudaWgmma, SmemAMNMajorSecondColumnBlock) {
  check_product<8, 8, true, 128, true>();
}
// All 128 columns with A from shared memory, B K-major and MN-major (bench/fused_backward_probe.cu:
// K dS, dO S^T).
TEST(CudaWgmma, SmemAKMajor64x128x128) {
  check_product<16, 8, false, 128, true>();
}
TEST(CudaWgmma, SmemAMNMajor64x128x64) {
  check_product<16, 4, true, 128, true>();
}
// A^T from shared memory, read MN-major (bench/fused_backward_probe.cu: X2^T K from X2's tile).
TEST(CudaWgmma, SmemATransposedMNMajor64x128x64) {
  check_product<16, 4, true, 128, false, 64, true>();
}
TEST(CudaWgmma, SmemATransposedKMajor64x64x128) {
  check_product<8, 8, false, 64, false, 64, true>();
}
// A from registers loaded from a swizzled tile of a^T (the probe's chain: dO^T from dO's tile).
TEST(CudaWgmma, FragmentsOfTransposedSwizzledTile) {
  check_product<16, 4, true, 128, false, 64, false, true>();
}
// S^T dS (grad_chunk.cu: the gradient of gamma): A the second 64 rows of a 128-row tile, B the
// second 64-row window of another.
TEST(CudaWgmma, SmemASecondRowBlockOf128) {
  check_product<8, 8, false, 128, true, 128>();
}

}  // namespace
}  // namespace gdn::cuda
