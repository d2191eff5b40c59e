// The CUDA l2norm against a float64 host reference (skips without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/convert.h"
#include "cuda/check.h"
#include "cuda/l2norm.h"

namespace gdn {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void check_l2norm(DType dtype, std::int64_t rows, int dim, double tolerance) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(rows * 31 + dim);
  std::normal_distribution<double> normal(0.0, 2.0);
  HostTensor x = HostTensor::zeros(dtype, {rows, dim});
  for (std::int64_t i = 0; i < x.numel(); ++i) core::store(x.ref(), i, normal(rng));

  void *d_x, *d_out;
  float* d_rstd;
  GDN_CUDA_CHECK(cudaMalloc(&d_x, x.bytes.size()));
  GDN_CUDA_CHECK(cudaMalloc(&d_out, x.bytes.size()));
  GDN_CUDA_CHECK(cudaMalloc(&d_rstd, rows * sizeof(float)));
  GDN_CUDA_CHECK(cudaMemcpy(d_x, x.bytes.data(), x.bytes.size(), cudaMemcpyHostToDevice));
  cuda::l2norm_forward(d_x, d_out, d_rstd, rows, dim, dtype, nullptr);
  HostTensor out = HostTensor::zeros(dtype, {rows, dim});
  std::vector<float> rstd(rows);
  GDN_CUDA_CHECK(cudaMemcpy(out.bytes.data(), d_out, out.bytes.size(), cudaMemcpyDeviceToHost));
  GDN_CUDA_CHECK(cudaMemcpy(rstd.data(), d_rstd, rows * sizeof(float), cudaMemcpyDeviceToHost));
  GDN_CUDA_CHECK(cudaFree(d_x));
  GDN_CUDA_CHECK(cudaFree(d_out));
  GDN_CUDA_CHECK(cudaFree(d_rstd));

  double diff = 0, norm = 0, rstd_diff = 0, rstd_norm = 0;
  for (std::int64_t row = 0; row < rows; ++row) {
    double sum = 0;
    for (int i = 0; i < dim; ++i) sum += std::pow(core::load<double>(x.ref(), row * dim + i), 2);
    const double r = 1.0 / std::sqrt(sum + 1e-6);
    rstd_diff += std::pow(rstd[row] - r, 2);
    rstd_norm += r * r;
    for (int i = 0; i < dim; ++i) {
      const double expected = core::load<double>(x.ref(), row * dim + i) * r;
      diff += std::pow(core::load<double>(out.ref(), row * dim + i) - expected, 2);
      norm += expected * expected;
    }
  }
  EXPECT_LE(std::sqrt(diff / norm), tolerance);
  EXPECT_LE(std::sqrt(rstd_diff / rstd_norm), 1e-6);
}

// bf16 keeps 8 mantissa bits: rounding alone gives about 2^-9 relative per element.
TEST(CudaL2norm, F32) {
  check_l2norm(DType::f32, 1001, 128, 1e-6);
}
TEST(CudaL2norm, Bf16) {
  check_l2norm(DType::bf16, 1001, 128, 4e-3);
}
TEST(CudaL2norm, F16OddDim) {
  check_l2norm(DType::f16, 77, 50, 1e-3);
}

}  // namespace
}  // namespace gdn
