#pragma once
// What the CUDA tests share: whether a GPU is there, the kernels' problem shape, and device copies
// of host tensors.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "gdn/problem.h"
#include "gdn/tensor.h"

namespace gdn {

inline bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// B=1, T tokens, HK key and HV value heads of K = V = 128, bf16, an initial state, a final-state
// gradient and l2norm: the kernels' case. `salt` keeps each test file's inputs its own.
inline Problem hopper_problem(std::int64_t T, std::int64_t HK, std::int64_t HV, std::int64_t salt) {
  Problem p;
  p.B = 1, p.T = T, p.HK = HK, p.HV = HV, p.K = 128, p.V = 128;
  p.dtype = DType::bf16;
  p.initial_state = true;
  p.final_state_grad = true;
  p.use_qk_l2norm = true;
  p.seed = static_cast<std::uint64_t>(T * salt + HV);
  return p;
}

// A device copy of a host tensor (or an empty one), freed with the object.
struct DeviceTensor {
  void* data = nullptr;
  TensorRef ref;
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& h) { make(h.dtype, h.shape, &h); }
  DeviceTensor(DType dtype, std::vector<std::int64_t> shape) {
    make(dtype, std::move(shape), nullptr);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(data); }
  void make(DType dtype, std::vector<std::int64_t> shape, const HostTensor* h) {
    if (h && h->bytes.empty()) return;  // not given
    ref.dtype = dtype;
    ref.shape = std::move(shape);
    const std::size_t bytes = static_cast<std::size_t>(ref.numel()) * dtype_size(dtype);
    GDN_CUDA_CHECK(cudaMalloc(&data, bytes > 0 ? bytes : 1));
    if (h)
      GDN_CUDA_CHECK(cudaMemcpy(data, h->bytes.data(), bytes, cudaMemcpyHostToDevice));
    else
      GDN_CUDA_CHECK(cudaMemset(data, 0, bytes > 0 ? bytes : 1));
    ref.data = data;
  }
  HostTensor download() const {
    HostTensor h = HostTensor::zeros(ref.dtype, ref.shape);
    GDN_CUDA_CHECK(cudaMemcpy(h.bytes.data(), data, h.bytes.size(), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace gdn
