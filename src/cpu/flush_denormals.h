#pragma once
// Float32 denormals (|x| < 2^-126) read and made as zero by the calling thread while a
// FlushDenormals lives; the chunked passes hold one in each OpenMP thread.
//
// Why: the decays exp(G) of fast gates, and states multiplied by them, fall below 2^-126 within
// a few chunks, and an x86 core takes a microcode assist on every operation that reads or makes
// a denormal: the forward ran at half speed on such inputs (bench/RESULTS.md, 2026-12-02).
// What it changes: a value that would have been a denormal is 0 instead, an absolute change below
// 2^-126 = 1.2e-38 per operation. Every output of the op is a sum in which such terms meet the
// normal-sized terms of v and the state, far above them, so the op's float32 tolerance is
// unchanged. The float64 oracle does not flush.
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace gdn::cpu {

#if defined(__SSE__)
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;  // MXCSR bits
  unsigned saved_;
};
#else
struct FlushDenormals {
  FlushDenormals() {}  // other architectures keep their default mode
};
#endif

}  // namespace gdn::cpu
