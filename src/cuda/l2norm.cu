#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/l2norm.h"

namespace gdn::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// One warp per row: the sum of squares in float32, reduced by shuffles.
template <typename T>
__global__ void l2norm_forward_kernel(const T* __restrict__ x, T* __restrict__ x_hat,
                                      float* __restrict__ rstd, std::int64_t rows, int dim) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (row >= rows) return;
  const T* in = x + row * dim;
  float sum = 0.f;
  for (int i = threadIdx.x; i < dim; i += 32) {
    const float value = to_float(in[i]);
    sum += value * value;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float r = rsqrtf(sum + 1e-6f);
  T* out = x_hat + row * dim;
  for (int i = threadIdx.x; i < dim; i += 32) out[i] = from_float<T>(to_float(in[i]) * r);
  if (threadIdx.x == 0) rstd[row] = r;
}

template <typename T>
void launch(const void* x, void* x_hat, float* rstd, std::int64_t rows, int dim,
            cudaStream_t stream) {
  if (rows == 0) return;
  const dim3 block(32, kWarpsPerBlock);
  const auto grid = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  l2norm_forward_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(x),
                                                       static_cast<T*>(x_hat), rstd, rows, dim);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace

void l2norm_forward(const void* x, void* x_hat, float* rstd, std::int64_t rows, int dim,
                    DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32:
      return launch<float>(x, x_hat, rstd, rows, dim, stream);
    case DType::bf16:
      return launch<__nv_bfloat16>(x, x_hat, rstd, rows, dim, stream);
    case DType::f16:
      return launch<__half>(x, x_hat, rstd, rows, dim, stream);
    default:
      break;
  }
  throw Error("l2norm_forward: dtype must be f32, bf16 or f16, got " +
              std::string(dtype_name(dtype)));
}

}  // namespace gdn::cuda
