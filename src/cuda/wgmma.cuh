#pragma once
// Warpgroup tensor-core products (wgmma, sm_90a) with A from registers and B from shared memory,
// or both from shared memory ("SS": A the 64 rows of a swizzled tile, K-major).
//
// A warpgroup is 4 consecutive warps; warp w % 4 holds rows 16 (w % 4) .. + 15 of the 64-row A
// and accumulator, in exactly mma.cuh's fragment layouts: an accumulator of 8 N columns is one
// Acc, an A k-tile four registers. So a state kept as accumulators (state_pass.cuh) feeds either
// instruction unchanged.
//
// B lives in a "swizzled tile": R rows x W columns of bf16 (W a multiple of 64) stored as W / 64
// blocks of R rows x 128 bytes, each 16-byte piece p of row r at piece p ^ (r % 8) (the 128-byte
// swizzle; each block 1024-byte aligned). The same tile serves as B = X^T (n = rows, k = columns:
// "K-major") and as B = X (k = rows, n = columns: "MN-major", the instruction's transpose bit).

#include <cstdint>
#include <type_traits>

#include "cuda/mma.cuh"

namespace gdn::cuda {

// Byte offset of 16-byte piece `piece` (8 bf16 columns 8 piece ..) of row r in a swizzled tile
// of `rows` rows.
__device__ inline int swizzled_offset(int rows, int r, int piece) {
  return (piece / 8) * rows * 128 + r * 128 + ((piece % 8) ^ (r % 8)) * 16;
}

// Element (r, col) of a swizzled tile of `rows` rows.
template <typename T>
__device__ inline T* swizzled_at(T* tile, int rows, int r, int col) {
  using Byte = std::conditional_t<std::is_const_v<T>, const unsigned char, unsigned char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(tile) + swizzled_offset(rows, r, col / 8)) +
         col % 8;
}

// The dynamic shared memory aligned up to 1024 bytes, as swizzled tiles need (a kernel reserves
// 1024 bytes more than its tiles take).
__device__ inline unsigned char* align_1024(unsigned char* smem) {
  return smem + ((1024 - smem_address(smem) % 1024) % 1024);
}

// Issues, without waiting, the copies of kRows rows of kCols 16-bit values (row r from
// src + r * stride elements) into a swizzled tile of kRows rows; rows >= valid are zero-filled.
// As issue_rows (common.cuh): a thread's rows are kStep apart, a multiple of 8, so they share
// one swizzle phase and each further copy adds constants.
template <int kCols, int kRows, int kThreads>
__device__ inline void issue_rows_swizzled(void* tile, const void* src, long long stride,
                                           int valid) {
  constexpr int kPieces = kCols / 8, kStep = kThreads / kPieces;
  static_assert(kThreads % kPieces == 0 && kRows % kStep == 0 && kStep % 8 == 0,
                "whole passes of rows that share a swizzle phase");
  const int thread = threadIdx.x % kThreads;  // (within the threads that copy)
  const int r = thread / kPieces, piece = thread % kPieces;
  unsigned char* to = static_cast<unsigned char*>(tile) + swizzled_offset(kRows, r, piece);
  const unsigned short* from = static_cast<const unsigned short*>(src) + r * stride + piece * 8;
#pragma unroll
  for (int i = 0; i < kRows / kStep; ++i, to += kStep * 128, from += kStep * stride) {
    const int row = r + i * kStep;  // (r < kStep: a trip count the compiler sees, no branches)
    cp_async16(to, from, row < valid);
  }
}

// The A fragment (ldmatrix .trans) of X^T rows m0 .. m0 + 15 and k-tile kt, where X is a
// swizzled tile of `rows` rows stored X[k][m] (mma.cuh's a_rows_km, each lane's 16 bytes one
// swizzled piece).
__device__ inline void load_a_km_swizzled(std::uint32_t (&a)[4], const bf16* x, int rows, int m0,
                                          int kt) {
  const int l = threadIdx.x % 32, q = l / 8;
  ldmatrix_x4_trans(a, swizzled_at(x, rows, 16 * kt + (q >> 1) * 8 + l % 8, m0 + (q & 1) * 8));
}

// Orders this thread's generic-proxy writes of shared memory (stores, cp.async once waited for)
// before later wgmma reads of it (the async proxy); a barrier then publishes them.
__device__ inline void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
__device__ inline std::uint64_t wgmma_desc(const void* start, int leading, int stride) {
  return (static_cast<std::uint64_t>(smem_address(start) >> 4) & 0x3fff) |
         (static_cast<std::uint64_t>(leading >> 4) & 0x3fff) << 16 |
         (static_cast<std::uint64_t>(stride >> 4) & 0x3fff) << 32 | std::uint64_t{1} << 62;
}
// desc with its start `bytes` (a multiple of 16) further on: an add to the start field, which
// holds address / 16 of a shared memory below 2^18 bytes and so never carries out of its 14 bits
// (a descriptor made anew costs a conversion and half a dozen bit operations a wgmma).
__device__ inline std::uint64_t desc_plus(std::uint64_t desc, int bytes) {
  const std::uint32_t low =
      static_cast<std::uint32_t>(desc) + static_cast<std::uint32_t>(bytes >> 4);
  return (desc & 0xffffffff00000000ull) | low;
}

__device__ inline void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ inline void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most `kPending` committed groups are still running.
template <int kPending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of acc across a wgmma issue or wait.
template <int N>
__device__ inline void fence_acc(Acc (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[i][e])::"memory");
}

// acc (= or +=, by `accumulate`) a B for one k-tile, N = 32, 64 or 128 columns; kTrans: B is
// MN-major.
template <bool kTrans>
__device__ inline void wgmma_n32(Acc (&d)[4], const std::uint32_t (&a)[4], std::uint64_t desc,
                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)),
        "n"(static_cast<int>(kTrans)));
}
template <bool kTrans>
__device__ inline void wgmma_n64(Acc (&d)[8], const std::uint32_t (&a)[4], std::uint64_t desc,
                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)),
        "n"(static_cast<int>(kTrans)));
}
template <bool kTrans>
__device__ inline void wgmma_n128(Acc (&d)[16], const std::uint32_t (&a)[4], std::uint64_t desc,
                                  bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)),
        "n"(static_cast<int>(kTrans)));
}

template <int N, bool kTrans>
__device__ inline void wgmma_tile(Acc (&d)[N], const std::uint32_t (&a)[4], std::uint64_t desc,
                                  bool accumulate) {
  static_assert(N == 4 || N == 8 || N == 16, "32, 64 or 128 columns");
  if constexpr (N == 4)
    wgmma_n32<kTrans>(d, a, desc, accumulate);
  else if constexpr (N == 8)
    wgmma_n64<kTrans>(d, a, desc, accumulate);
  else
    wgmma_n128<kTrans>(d, a, desc, accumulate);
}

// As wgmma_n32, wgmma_n64 and wgmma_n128 with A read from shared memory through its descriptor.
template <bool kTrans, bool kTransA = false>
__device__ inline void wgmma_ss_n32(Acc (&d)[4], std::uint64_t a_desc, std::uint64_t desc,
                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, %20, %19;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a_desc), "l"(desc), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTrans)),
        "n"(static_cast<int>(kTransA)));
}
template <bool kTrans, bool kTransA = false>
__device__ inline void wgmma_ss_n64(Acc (&d)[8], std::uint64_t a_desc, std::uint64_t desc,
                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %36, %35;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a_desc), "l"(desc), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTrans)),
        "n"(static_cast<int>(kTransA)));
}
template <bool kTrans, bool kTransA = false>
__device__ inline void wgmma_ss_n128(Acc (&d)[16], std::uint64_t a_desc, std::uint64_t desc,
                                     bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %68, %67;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(a_desc), "l"(desc), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTrans)),
        "n"(static_cast<int>(kTransA)));
}
template <int N, bool kTrans, bool kTransA = false>
__device__ inline void wgmma_tile(Acc (&d)[N], std::uint64_t a_desc, std::uint64_t desc,
                                  bool accumulate) {
  static_assert(N == 4 || N == 8 || N == 16, "32, 64 or 128 columns");
  if constexpr (N == 4)
    wgmma_ss_n32<kTrans, kTransA>(d, a_desc, desc, accumulate);
  else if constexpr (N == 8)
    wgmma_ss_n64<kTrans, kTransA>(d, a_desc, desc, accumulate);
  else
    wgmma_ss_n128<kTrans, kTransA>(d, a_desc, desc, accumulate);
}

// The descriptor of k-tile kt (16 columns) of a K-major swizzled tile of `rows` rows: 64-column
// block kt / 4, 32 (kt % 4) bytes into each of its 128-byte rows.
__device__ inline std::uint64_t k_major_desc(const void* tile, int rows, int kt) {
  return desc_plus(wgmma_desc(tile, 16, 1024), (kt / 4) * rows * 128 + (kt % 4) * 32);
}

// A, the first operand of the products below: registers (A fragments of this warp's 16 rows,
// std::uint32_t[KT][4]) or, for SS, the warpgroup's 64 rows of a swizzled tile (SmemA<KT>: KT
// k-tiles of it used). SS needs no A registers, so several products can be in flight at once.
template <int KT>
struct SmemA {
  const bf16* tile;
  int rows = 64;  // of the tile, whose 64-column blocks are rows x 128 bytes apart
};
// A = X^T read MN-major: A's 16 KT k the first rows of a swizzled tile of `rows` rows, its 64 m
// the 64-column block that `tile` starts (the transpose bit of the A operand).
template <int KT>
struct SmemAT {
  const bf16* tile;
  int rows;
};
template <typename A>
struct KTiles;
template <int KT>
struct KTiles<std::uint32_t[KT][4]> {
  static constexpr int value = KT;
};
template <int KT>
struct KTiles<SmemA<KT>> {
  static constexpr int value = KT;
};
template <int KT>
struct KTiles<SmemAT<KT>> {
  static constexpr int value = KT;
};
// One k-tile kt of A times the B of descriptor desc.
template <int N, bool kTrans, int KT>
__device__ inline void wgmma_ktile(Acc (&d)[N], const std::uint32_t (&a)[KT][4], int kt,
                                   std::uint64_t desc, bool accumulate) {
  wgmma_tile<N, kTrans>(d, a[kt], desc, accumulate);
}
template <int N, bool kTrans, int KT>
__device__ inline void wgmma_ktile(Acc (&d)[N], const SmemA<KT>& a, int kt, std::uint64_t desc,
                                   bool accumulate) {
  wgmma_tile<N, kTrans>(d, k_major_desc(a.tile, a.rows, kt), desc, accumulate);
}
// k-tile kt of an MN-major A: rows 16 kt .., 2048 bytes on (as wgmma_kn's B).
template <int N, bool kTrans, int KT>
__device__ inline void wgmma_ktile(Acc (&d)[N], const SmemAT<KT>& a, int kt, std::uint64_t desc,
                                   bool accumulate) {
  wgmma_tile<N, kTrans, true>(d, desc_plus(wgmma_desc(a.tile, a.rows * 128, 1024), kt * 2048), desc,
                              accumulate);
}

// d (+)= a X^T, X 8 N rows (B's n) and 16 KT columns (B's k) of a swizzled tile of `rows` rows
// (x: the first of those rows, a multiple of 8 into the tile). Issues only; the caller commits
// and waits.
template <int N, typename A>
__device__ inline void wgmma_nk(Acc (&d)[N], const A& a, const bf16* x, bool accumulate,
                                int rows = 8 * N) {
#pragma unroll
  for (int kt = 0; kt < KTiles<A>::value; ++kt)
    wgmma_ktile<N, false>(d, a, kt, k_major_desc(x, rows, kt), accumulate || kt > 0);
}
// d (+)= a X, X a swizzled tile of `rows` rows (B's k, 16 KT of them used) and 8 N columns
// (B's n; x may start at a later 64-column block, x + 64 rows b).
template <int N, typename A>
__device__ inline void wgmma_kn(Acc (&d)[N], const A& a, const bf16* x, int rows, bool accumulate) {
  const auto* base = reinterpret_cast<const unsigned char*>(x);
  // k-tile kt: rows 16 kt .., 2048 bytes on; 64-column blocks rows * 128 bytes apart.
#pragma unroll
  for (int kt = 0; kt < KTiles<A>::value; ++kt)
    wgmma_ktile<N, true>(d, a, kt, desc_plus(wgmma_desc(base, rows * 128, 1024), kt * 2048),
                         accumulate || kt > 0);
}

// wgmma_kn issued and waited for: d holds the product on return.
template <int N, typename A>
__device__ inline void wgmma_kn_wait(Acc (&d)[N], const A& a, const bf16* x, int rows,
                                     bool accumulate) {
  wgmma_fence();
  wgmma_kn(d, a, x, rows, accumulate);
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(d);
}

}  // namespace gdn::cuda
