#pragma once
// Shared device helpers of the delta-rule kernels: dtype conversion and 16-byte async copies.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace gdn::cuda {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;      // chunk
constexpr int kD = 128;     // K = V
constexpr int kLdH = 136;   // shared row stride of a 128-wide bf16 tile (+16 B: no bank conflicts)
constexpr int kLdH64 = 72;  // of a 64-wide bf16 tile

__device__ inline float to_float(float x) {
  return x;
}
__device__ inline float to_float(bf16 x) {
  return __bfloat162float(x);
}
__device__ inline float to_float(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}

// A scalar of a runtime dtype: 0 f32, 1 bf16, 2 f16 (beta and dbeta may be f32 or q's dtype).
__device__ inline float load_scalar(const void* p, long long i, int code) {
  if (code == 0) return static_cast<const float*>(p)[i];
  if (code == 1) return to_float(static_cast<const bf16*>(p)[i]);
  return to_float(static_cast<const __half*>(p)[i]);
}
__device__ inline void store_scalar(void* p, long long i, int code, float x) {
  if (code == 0)
    static_cast<float*>(p)[i] = x;
  else if (code == 1)
    static_cast<bf16*>(p)[i] = from_float<bf16>(x);
  else
    static_cast<__half*>(p)[i] = from_float<__half>(x);
}

// 16-byte global -> shared copy; zero-fills the destination when !valid, and then reads nothing
// (src-size 0 compiles to the same LDGSTS as PTX's ignore-src form, documented as ignoring the
// source), so gmem may point past the tensor: a row past a sequence's end needs no clamped
// address (the select was two instructions a copy; memcheck reports no access).
__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 4-byte global -> shared copy.
__device__ inline void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Asks L2 for `bytes` (a multiple of 16) from gmem (16-byte aligned), and for the 128-byte line
// holding gmem, without waiting: no register and no shared memory hold them. A block so fetches
// the rows of a block that starts later, whose copies then hit L2 instead of waiting on DRAM.
__device__ inline void prefetch_l2(const void* gmem, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
}
__device__ inline void prefetch_line(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem) : "memory");
}

// A flag between blocks running at once (Params::beside): fence_gpu orders what this thread, and
// every thread whose writes it has seen through a barrier, wrote before the flag's store_relaxed
// after it; load_acquire orders the flag's load before this thread's later reads (and, through a
// barrier, other threads').
__device__ inline void fence_gpu() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
__device__ inline void store_relaxed(int* flag, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
__device__ inline int load_acquire(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// Waits for the `count` threads (whole warps) that meet at named barrier `id` (1 .. 15; 0 is
// __syncthreads'), as __syncthreads does for the whole block.
__device__ inline void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Issues, without waiting, the copies of kRows rows of kCols 16-bit values (row r from
// src + r * stride elements) into dst (row stride ld elements); rows >= valid are zero-filled.
// kThreads threads: each keeps one 16-byte piece of every kThreads / (kCols / 8)-th row, so its
// addresses are computed once and each further copy adds constants (the copies' address
// arithmetic was a fifth of grad_chunk's instructions when every copy computed its own).
template <int kCols, int kRows, int kThreads>
__device__ inline void issue_rows(void* dst, int ld, const void* src, long long stride, int valid) {
  constexpr int kPieces = kCols / 8, kStep = kThreads / kPieces;  // kStep rows a pass
  static_assert(kThreads % kPieces == 0 && kRows % kStep == 0, "whole passes");
  const int thread = threadIdx.x % kThreads;  // (within the threads that copy)
  const int r = thread / kPieces, piece = thread % kPieces;
  unsigned short* to = static_cast<unsigned short*>(dst) + r * ld + piece * 8;
  const unsigned short* from = static_cast<const unsigned short*>(src) + r * stride + piece * 8;
#pragma unroll
  for (int i = 0; i < kRows / kStep; ++i, to += kStep * ld, from += kStep * stride) {
    const int row = r + i * kStep;  // (r < kStep: a trip count the compiler sees, no branches)
    cp_async16(to, from, row < valid);
  }
}

// e^x on the special-function unit with results below 2^-126 (x < -87.3) flushed to zero, so
// without the four instructions __expf spends making them denormal: each is a decay that scales
// one term of a sum, which that flush changes by less than 2^-126 of the term's other factors.
__device__ inline float exp_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * 1.44269504088896341f));
  return y;
}

// x, the same in every lane of the warp, as the compiler can see it: what derives from it (a
// warpgroup's tile, its wgmma descriptors) is then computed once a warp in uniform registers, not
// per lane and moved over for each wgmma.
__device__ inline int uniform(int x) {
  return __shfl_sync(0xffffffffu, x, 0);
}

// Sum over the 32 lanes of a warp.
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace gdn::cuda
