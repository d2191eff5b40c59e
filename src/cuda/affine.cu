// Batches of affine maps (spec 4) for context parallelism (cp/backend.h): apply and compose are
// one affine.cuh step per map, a block per (map, 8 columns); transpose swaps M in place.
#include "cuda/affine.cuh"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

constexpr long long kMatrix = kD * kD;

__global__ void __launch_bounds__(affine::kThreads)
    affine_kernel(const float* M, const float* X, const float* C, float* Y) {
  const long long i = blockIdx.x;
  const int j0 = blockIdx.y * affine::Smem<1>::kSlice;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& slice = *reinterpret_cast<affine::Smem<1>*>(smem);
  affine::load(slice, X + i * kMatrix, j0);
  affine::chain<false>(
      slice, 1, [&](int) { return M + i * kMatrix; },
      [&](int) { return C ? C + i * kMatrix : nullptr; }, [&](int) { return Y + i * kMatrix; }, j0);
}

__global__ void transpose_kernel(float* M) {
  float* m = M + blockIdx.x * kMatrix;
  for (int idx = threadIdx.x; idx < kD * kD; idx += blockDim.x) {
    const int i = idx / kD, j = idx % kD;
    if (i < j) {
      const float x = m[i * kD + j];
      m[i * kD + j] = m[j * kD + i];
      m[j * kD + i] = x;
    }
  }
}

}  // namespace

void launch_affine(int count, const float* M, const float* X, const float* C, float* Y,
                   cudaStream_t stream) {
  if (count == 0) return;
  constexpr int smem = affine::kSmemBytes<1>;
  GDN_CUDA_CHECK(
      cudaFuncSetAttribute(affine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  affine_kernel<<<dim3(count, kD / affine::Smem<1>::kSlice), affine::kThreads, smem, stream>>>(
      M, X, C, Y);
  GDN_CUDA_CHECK_LAUNCH();
}

void launch_transpose(int count, float* M, cudaStream_t stream) {
  if (count == 0) return;
  transpose_kernel<<<count, 256, 0, stream>>>(M);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace gdn::cuda
