#pragma once
// Row stores of the op's outputs (o, dv, dq, dk) that bypass the cache: a float32 row's whole
// 64-byte lines go out as non-temporal stores, so a line is written without first being read
// into the cache (a read for ownership: each row of a head is on its own page of the caller's
// tensor, and those reads waited on memory) and does not push the chunk's working set out. The
// row's partial lines at either end (the caller's tensor need not be 64-byte aligned), other
// dtypes, and machines without AVX-512 take ordinary stores. A thread that streamed rows calls
// stream_fence() before others read its results (at the end of its parallel region).
// The cost moves to a caller that reads the outputs at once: they come from memory, not from a
// cache; at the op's sizes (o: 32 MiB at T = 2048) they would have left the core's 2 MiB L2.

#include <cstdint>

#include "core/layout.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace gdn::cpu {

inline void stream_row(const TensorRef& t, std::int64_t offset, std::int64_t count,
                       const float* src) {
#if defined(__AVX512F__)
  float* dst = static_cast<float*>(t.data) + offset;
  const auto address = reinterpret_cast<std::uintptr_t>(dst);
  if (t.dtype == DType::f32 && address % sizeof(float) == 0) {
    // Elements before the first 64-byte boundary, then whole lines, then the rest.
    const auto head =
        std::min<std::int64_t>(count, std::int64_t((64 - address % 64) % 64 / sizeof(float)));
    const auto head_mask = static_cast<__mmask16>((1u << head) - 1);
    _mm512_mask_storeu_ps(dst, head_mask, _mm512_maskz_loadu_ps(head_mask, src));
    std::int64_t i = head;
    for (; i + 16 <= count; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
    const auto tail_mask = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, tail_mask, _mm512_maskz_loadu_ps(tail_mask, src + i));
    return;
  }
#endif
  core::store_row(t, offset, count, src);
}

inline void stream_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

}  // namespace gdn::cpu
