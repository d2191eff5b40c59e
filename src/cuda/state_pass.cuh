#pragma once
// What the two chunk-serial state passes (state_forward.cu, state_backward.cu) share.
//
// A block owns one (segment of a sequence, value head); each of its 8 warps owns 16 columns of
// V and keeps its 16 x 128 slice of the state transposed (S^T, or dS^T) as f32 mma accumulators:
// every product of a chunk then takes the state from registers (research/kernels.md 6.1), and a
// warp never waits for another. The block streams the chunk's tiles (K, Q, A, P, V or dO, G,
// beta) through kStages cp.async buffers.
//
// A sequence's chunks are cut into p.seg_count segments of p.seg_len chunks (delta_rule.cu picks
// the count so that the blocks fill the GPU). The segments run in parallel from states that the
// affine summaries of spec 4 provide: per segment, the local state from zero and the K x K transfer
// matrix (state_forward's summary mode), composed serially by combine.cu.
#include "cuda/mma.cuh"
#include "cuda/params.cuh"

namespace gdn::cuda::state_pass {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLdO = 24;  // 16-bit row stride of a warp's 64 x 16 staging tile
constexpr int kStages = 2;

// One stage's tiles, in bytes from the stage's start.
struct Stage {
  static constexpr int k = 0;                     // bf16 [64][136]
  static constexpr int q = k + kC * kLdH * 2;     // bf16 [64][136]
  static constexpr int a = q + kC * kLdH * 2;     // bf16 [64][72]
  static constexpr int pm = a + kC * kLdH64 * 2;  // bf16 [64][72]
  static constexpr int v = pm + kC * kLdH64 * 2;  // 16-bit [64][136]  V or dO
  static constexpr int g = v + kC * kLdH * 2;     // f32 [64]
  static constexpr int beta = g + kC * 4;         // f32 [64]
  static constexpr int bytes = beta + kC * 4;
  static constexpr int staging = kStages * bytes;  // 16-bit [kWarps][64][kLdO]
  static constexpr int smem_bytes = staging + kWarps * kC * kLdO * 2;
};
static_assert(Stage::bytes % 128 == 0);

// Segment k = z % seg_count of sequence n = z / seg_count (blockIdx.z = z): its chunk slots first
// .. first + chunks - 1 (chunks <= 0: past the sequence's end), and whether it is the sequence's
// first or last.
struct Segment {
  int n, k, first, chunks;
  bool is_first, is_last;
};
__device__ inline Segment segment(const Params& p, int z) {
  const int n = z / p.seg_count, k = z % p.seg_count, begin = p.chunk_begin[n] + k * p.seg_len;
  const int end = min(p.chunk_begin[n + 1], begin + p.seg_len);
  return {n, k, begin, end - begin, k == 0, end == p.chunk_begin[n + 1]};
}
// The [K][V] f32 matrix of (sequence n, value head hv) in an optional per-sequence tensor
// (h0, the final state and their gradients), null when the tensor is not given.
template <typename T>
__device__ inline T* sequence_matrix(T* base, const Params& p, int n, int hv) {
  return base ? base + (static_cast<long long>(n) * p.HV + hv) * kD * kD : nullptr;
}
// The [K][V] f32 matrix of (segment z, value head hv) in a per-segment buffer.
__device__ inline float* segment_matrix(float* base, const Params& p, int z, int hv) {
  return base + (static_cast<long long>(z) * p.HV + hv) * kD * kD;
}

struct Tiles {
  const bf16 *k, *q, *a, *pm;
  const void* v;
  const float *g, *beta;
};

__device__ inline Tiles tiles(const unsigned char* smem, int buf) {
  const unsigned char* s = smem + buf * Stage::bytes;
  return {reinterpret_cast<const bf16*>(s + Stage::k),
          reinterpret_cast<const bf16*>(s + Stage::q),
          reinterpret_cast<const bf16*>(s + Stage::a),
          reinterpret_cast<const bf16*>(s + Stage::pm),
          s + Stage::v,
          reinterpret_cast<const float*>(s + Stage::g),
          reinterpret_cast<const float*>(s + Stage::beta)};
}

// Issues the copies of chunk slot `cid`'s tiles into buffer `buf` (no commit): K always, Q, P
// and the rows of `slice` ([B, T, HV, 128] 16-bit: V or dO) when given.
__device__ inline void prefetch(const Params& p, unsigned char* smem, int buf, int cid, int hv,
                                bool with_q, bool with_p, const void* slice) {
  const ChunkInfo info = p.chunks[cid];
  const long long s = slot(p, cid, hv);
  unsigned char* base = smem + buf * Stage::bytes;
  const int hk = hv / (p.HV / p.HK), tid = threadIdx.x;
  const long long row = qk_row(p, info.b, info.t0, hk);
  for (int idx = tid; idx < kC * 16; idx += kThreads) {
    const int r = idx / 16, part = idx % 16;
    const bool valid = r < info.len;
    const long long off = valid ? (row + static_cast<long long>(r) * p.HK) * kD + part * 8 : 0;
    cp_async16(base + Stage::k + (r * kLdH + part * 8) * 2, p.kn + off, valid);
    if (with_q) cp_async16(base + Stage::q + (r * kLdH + part * 8) * 2, p.qn + off, valid);
  }
  for (int idx = tid; idx < kC * 8; idx += kThreads) {
    const int r = idx / 8, part = idx % 8;
    const long long off = s * kC * kC + r * kC + part * 8;
    cp_async16(base + Stage::a + (r * kLdH64 + part * 8) * 2, p.A + off, true);
    if (with_p) cp_async16(base + Stage::pm + (r * kLdH64 + part * 8) * 2, p.P + off, true);
  }
  if (slice) {
    const unsigned short* src = static_cast<const unsigned short*>(slice);
    const long long vrow = v_row(p, info.b, info.t0, hv);
    for (int idx = tid; idx < kC * 16; idx += kThreads) {
      const int r = idx / 16, part = idx % 16;
      const bool valid = r < info.len;
      const long long off = valid ? (vrow + static_cast<long long>(r) * p.HV) * kD + part * 8 : 0;
      cp_async16(base + Stage::v + (r * kLdH + part * 8) * 2, src + off, valid);
    }
  }
  if (tid < 16)
    cp_async16(base + Stage::g + tid * 16, p.G + s * kC + tid * 4, true);
  else if (tid < 32)
    cp_async16(base + Stage::beta + (tid - 16) * 16, p.bt + s * kC + (tid - 16) * 4, true);
}

// The A fragments of this warp's 16 x 128 state slice (acc) rounded to bf16.
__device__ inline void state_to_a(std::uint32_t (&sa)[8][4], const Acc (&acc)[16]) {
#pragma unroll
  for (int kt = 0; kt < 8; ++kt) acc_to_a(sa[kt], acc, kt, [](int) { return 1.0f; });
}

// Stores the bf16 state slice transposed, as rows v (this warp's 16) of a [V][K] tile.
__device__ inline void store_state_t(bf16* dst, int vw, const std::uint32_t (&sa)[8][4]) {
  const int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int kt = 0; kt < 8; ++kt) {
    bf16* lo = dst + (vw + g) * kD + 16 * kt + c;
    bf16* hi = lo + 8 * kD;
    *reinterpret_cast<std::uint32_t*>(lo) = sa[kt][0];
    *reinterpret_cast<std::uint32_t*>(hi) = sa[kt][1];
    *reinterpret_cast<std::uint32_t*>(lo + 8) = sa[kt][2];
    *reinterpret_cast<std::uint32_t*>(hi + 8) = sa[kt][3];
  }
}

// Loads (or stores) this warp's f32 state slice from (to) a [K][V] f32 matrix, 0 when null.
__device__ inline void load_state(Acc (&acc)[16], const float* src, int vw) {
  const int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[nt][e] = src ? src[(8 * nt + c + e % 2) * kD + vw + g + 8 * (e / 2)] : 0.0f;
}
// The identity, as this warp's slice of a transposed state.
__device__ inline void load_identity(Acc (&acc)[16], int vw) {
  const int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[nt][e] = 8 * nt + c + e % 2 == vw + g + 8 * (e / 2) ? 1.0f : 0.0f;
}
__device__ inline void store_state(float* dst, int vw, const Acc (&acc)[16]) {
  const int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[(8 * nt + c + e % 2) * kD + vw + g + 8 * (e / 2)] = acc[nt][e];
}

// Writes a 16 x 64 accumulator block X^T (rows: this warp's V columns; cols: tokens) as T to
// rows 0..rows-1 of dst (row r at dst + r * stride, 16 contiguous values), through the warp's
// staging tile so that global stores are 16 bytes.
template <typename T>
__device__ inline void store_tokens(const Acc (&x)[8], bf16* staging, T* dst, long long stride,
                                    int rows) {
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) {
    const std::uint32_t r[4] = {
        pack2<T>(x[2 * kt][0], x[2 * kt][1]), pack2<T>(x[2 * kt][2], x[2 * kt][3]),
        pack2<T>(x[2 * kt + 1][0], x[2 * kt + 1][1]), pack2<T>(x[2 * kt + 1][2], x[2 * kt + 1][3])};
    stmatrix_x4_trans(r, a_rows_km(staging, kLdO, 0, 16 * kt));
  }
  __syncwarp();
  for (int idx = threadIdx.x % 32; idx < 2 * kC; idx += 32) {
    const int r = idx / 2, part = idx % 2;
    if (r < rows)
      *reinterpret_cast<uint4*>(dst + r * stride + part * 8) =
          *reinterpret_cast<const uint4*>(staging + r * kLdO + part * 8);
  }
  __syncwarp();
}

// The A fragments of this warp's V^T (or dO^T) for k-tile kt, as f32 pairs: v[0] (row g,
// cols c, c+1), v[1] (row g + 8), v[2] (row g, cols c + 8, c + 9), v[3] (row g + 8, ...).
template <typename In>
__device__ inline void load_slice_t(float2 (&v)[4], const void* slice, int kt) {
  std::uint32_t r[4];
  ldmatrix_x4_trans(
      r, a_rows_km(static_cast<const bf16*>(slice), kLdH, 16 * (threadIdx.x / 32), 16 * kt));
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = unpack2<In>(r[i]);
}

}  // namespace gdn::cuda::state_pass
