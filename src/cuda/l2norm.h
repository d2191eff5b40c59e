#pragma once
// Row-wise l2 normalization of q and k on the GPU (spec 1): x_hat = x * rsqrt(sum(x^2) + 1e-6).

#include <cuda_runtime.h>

#include <cstdint>

#include "gdn/tensor.h"

namespace gdn::cuda {

// x, x_hat: [rows, dim] of `dtype` (f32, bf16 or f16), device memory; rstd: [rows] f32, the
// factor rsqrt(sum(x^2) + 1e-6) that the backward needs. Runs on `stream`; does not synchronize.
void l2norm_forward(const void* x, void* x_hat, float* rstd, std::int64_t rows, int dim,
                    DType dtype, cudaStream_t stream);

}  // namespace gdn::cuda
