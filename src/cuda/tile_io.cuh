#pragma once
// Block-wide copies of 64- and 128-row tiles between global memory and padded shared memory.

#include "cuda/common.cuh"

namespace gdn::cuda {

// rows x 128 bf16 from `src` (row r at src + r * 128) into dst[rows][kLdH]; rows >= valid are 0.
__device__ inline void load_rows_bf16(bf16* dst, const bf16* src, int rows, int valid) {
  for (int idx = threadIdx.x; idx < rows * 16; idx += blockDim.x) {
    const int r = idx / 16, part = idx % 16;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < valid) value = *reinterpret_cast<const uint4*>(src + r * kD + part * 8);
    *reinterpret_cast<uint4*>(dst + r * kLdH + part * 8) = value;
  }
}

// 64 token rows of a [.., heads, 128] bf16 tensor: row r at base + r * stride_rows * 128.
__device__ inline void load_token_rows_bf16(bf16* dst, const bf16* base, long long stride, int valid) {
  for (int idx = threadIdx.x; idx < kC * 16; idx += blockDim.x) {
    const int r = idx / 16, part = idx % 16;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < valid) value = *reinterpret_cast<const uint4*>(base + r * stride * kD + part * 8);
    *reinterpret_cast<uint4*>(dst + r * kLdH + part * 8) = value;
  }
}

// The same for an In-typed tensor, converted to bf16 (times `factor`).
template <typename In>
__device__ inline void load_token_rows(bf16* dst, const In* base, long long stride, int valid,
                                       float factor = 1.0f) {
  for (int idx = threadIdx.x; idx < kC * kD; idx += blockDim.x) {
    const int r = idx / kD, j = idx % kD;
    const float x = r < valid ? to_float(base[r * stride * kD + j]) * factor : 0.0f;
    dst[r * kLdH + j] = from_float<bf16>(x);
  }
}

// f32 tile [rows][ld] -> bf16 global rows of 128 (row r at dst + r * 128).
__device__ inline void store_rows_bf16(bf16* dst, const float* src, int ld, int rows) {
  for (int idx = threadIdx.x; idx < rows * kD; idx += blockDim.x) {
    const int r = idx / kD, j = idx % kD;
    dst[r * kD + j] = from_float<bf16>(src[r * ld + j]);
  }
}

}  // namespace gdn::cuda
