#pragma once
// What the CUDA benchmarks share: device buffers filled with model-like random inputs, and the
// median of 10 timed runs by CUDA events after 3 warm-ups.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "gdn/tensor.h"

namespace bench {

using gdn::DType;
using gdn::TensorRef;

// Deterministic pseudo-random fill in [lo, hi) (then mapped per tensor kind).
__global__ void fill_kernel(void* out, long long n, int kind, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    unsigned x =
        static_cast<unsigned>(i) * 2654435761u ^ (seed * 97u + static_cast<unsigned>(i >> 32));
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float u = (x & 0xffffff) / 16777216.0f;  // [0, 1)
    switch (kind) {
      case 0:  // q, k, v, dO: bf16 in [-1, 1)
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(2 * u - 1);
        break;
      case 1:  // beta: bf16 in (0, 1)
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(0.02f + 0.96f * u);
        break;
      case 2:  // g: f32 log decay in [-0.5, -0.001)
        static_cast<float*>(out)[i] = -0.001f - 0.5f * u;
        break;
      case 3:  // g, strong gates (short memory): [-2.1, -0.1), as bench/peers.py's
        static_cast<float*>(out)[i] = -0.1f - 2.0f * u;
        break;
      default:  // g, weak gates (long memory): [-0.0101, -0.0001), as bench/peers.py's
        static_cast<float*>(out)[i] = -1e-4f - 0.01f * u;
    }
  }
}

struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) { GDN_CUDA_CHECK(cudaMalloc(&data, n)); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* floats() const { return static_cast<float*>(data); }
  ~Buffer() { cudaFree(data); }
};

inline TensorRef ref(const Buffer& b, DType dtype, std::vector<std::int64_t> shape) {
  return TensorRef{b.data, dtype, std::move(shape)};
}

inline void fill(Buffer& b, long long n, int kind, unsigned seed) {
  fill_kernel<<<1024, 256>>>(b.data, n, kind, seed);
  GDN_CUDA_CHECK_LAUNCH();
}

template <typename F>
double median_ms(F&& body, cudaStream_t stream) {
  cudaEvent_t start, stop;
  GDN_CUDA_CHECK(cudaEventCreate(&start));
  GDN_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) body(i);
  std::vector<float> times;
  for (int i = 0; i < 10; ++i) {
    GDN_CUDA_CHECK(cudaEventRecord(start, stream));
    body(i);
    GDN_CUDA_CHECK(cudaEventRecord(stop, stream));
    GDN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    GDN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  GDN_CUDA_CHECK(cudaEventDestroy(start));
  GDN_CUDA_CHECK(cudaEventDestroy(stop));
  return (times[4] + times[5]) / 2;
}

}  // namespace bench
