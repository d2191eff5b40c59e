// Strided device-to-device copies (Ulysses' packing, cp/ulysses.cpp): `height` rows of `width`
// bytes, a thread per 16 bytes when every row start is 16-byte aligned, else per byte: rows of a
// few hundred bytes copy far faster so than through cudaMemcpy2DAsync.
#include <algorithm>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/kernels.h"

namespace gdn::cuda {
namespace {

template <typename Unit>
__global__ void copy_2d_kernel(char* dst, std::size_t dst_pitch, const char* src,
                               std::size_t src_pitch, std::size_t units, std::size_t height) {
  const std::size_t total = units * height;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < total;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = i / units, unit = i % units;
    reinterpret_cast<Unit*>(dst + row * dst_pitch)[unit] =
        reinterpret_cast<const Unit*>(src + row * src_pitch)[unit];
  }
}

}  // namespace

void launch_copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                    std::size_t width, std::size_t height, cudaStream_t stream) {
  if (width == 0 || height == 0) return;
  const auto aligned = [](std::uintptr_t x) { return x % 16 == 0; };
  const bool wide = aligned(reinterpret_cast<std::uintptr_t>(dst)) &&
                    aligned(reinterpret_cast<std::uintptr_t>(src)) && aligned(dst_pitch) &&
                    aligned(src_pitch) && aligned(width);
  const std::size_t units = wide ? width / 16 : width;
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((units * height + 255) / 256, 4096));
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (wide)
    copy_2d_kernel<uint4><<<blocks, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, units, height);
  else
    copy_2d_kernel<char><<<blocks, 256, 0, stream>>>(d, dst_pitch, s, src_pitch, units, height);
  GDN_CUDA_CHECK_LAUNCH();
}

}  // namespace gdn::cuda
