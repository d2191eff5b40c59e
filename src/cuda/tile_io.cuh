#pragma once
// Block-wide copies of 64- and 128-row tiles between global memory and padded shared memory.

#include "cuda/common.cuh"

namespace gdn::cuda {

// All loads below are cp.async copies that this thread waits for before returning: every copy
// of a tile is in flight at once (a plain load-then-store loop waits one memory latency per
// iteration). The caller still syncs the block before reading the tile.

// Issues, without waiting, the copies of `rows` rows of kCols 16-bit values (row r from
// src + r * stride elements) into dst (row stride ld elements); rows >= valid are zero-filled.
template <int kCols>
__device__ inline void issue_rows(void* dst, int ld, const void* src, long long stride, int rows,
                                  int valid) {
  using U16 = unsigned short;
  for (int idx = threadIdx.x; idx < rows * (kCols / 8); idx += blockDim.x) {
    const int r = idx / (kCols / 8), part = idx % (kCols / 8);
    const bool ok = r < valid;
    cp_async16(static_cast<U16*>(dst) + r * ld + part * 8,
               static_cast<const U16*>(src) + (ok ? r * stride + part * 8 : 0), ok);
  }
}

// rows x 128 bf16 from `src` (row r at src + r * 128) into dst[rows][kLdH]; rows >= valid are 0.
__device__ inline void load_rows_bf16(bf16* dst, const bf16* src, int rows, int valid) {
  for (int idx = threadIdx.x; idx < rows * 16; idx += blockDim.x) {
    const int r = idx / 16, part = idx % 16;
    cp_async16(dst + r * kLdH + part * 8, r < valid ? src + r * kD + part * 8 : src, r < valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// 64 token rows of a [.., heads, 128] 16-bit tensor: row r at base + r * stride * 128.
template <typename T>
__device__ inline void load_token_rows_raw(T* dst, const T* base, long long stride, int valid) {
  static_assert(sizeof(T) == 2);
  for (int idx = threadIdx.x; idx < kC * 16; idx += blockDim.x) {
    const int r = idx / 16, part = idx % 16;
    cp_async16(dst + r * kLdH + part * 8, r < valid ? base + r * stride * kD + part * 8 : base,
               r < valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

__device__ inline void load_token_rows_bf16(bf16* dst, const bf16* base, long long stride,
                                            int valid) {
  load_token_rows_raw(dst, base, stride, valid);
}

// The same for an In-typed tensor, converted to bf16 times factor[r] (1 when factor is null),
// in place by the thread that copied each 8 elements.
template <typename In>
__device__ inline void load_token_rows(bf16* dst, const In* base, long long stride, int valid,
                                       const float* factor = nullptr) {
  In* raw = reinterpret_cast<In*>(dst);
  load_token_rows_raw(raw, base, stride, valid);
  if (std::is_same_v<In, bf16> && factor == nullptr) return;
  for (int idx = threadIdx.x; idx < kC * 16; idx += blockDim.x) {
    const int r = idx / 16, part = idx % 16;
    const float scale = factor ? factor[r] : 1.0f;
    for (int e = 0; e < 8; ++e) {
      const int at = r * kLdH + part * 8 + e;
      dst[at] = from_float<bf16>(to_float(raw[at]) * scale);
    }
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
