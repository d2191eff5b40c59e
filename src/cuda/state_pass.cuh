#pragma once
// What the two chunk-serial state passes (state_forward.cu, state_backward.cu) share.
//
// A block owns one (segment of a sequence, value head); each of its 8 warps owns 16 columns of
// V and keeps its 16 x 128 slice of the state transposed (S^T, or dS^T) as f32 accumulators, and
// each warpgroup (4 warps, 64 columns of V) runs the chunk's products as wgmma with the state as
// the register A operand (research/kernels.md 6.1): the state never leaves registers. The block
// streams the chunk's tiles (K, Q, A, P, V or dO, G, beta) through 2 or 3 cp.async buffers
// whose mbarriers (Pipeline) let the two warpgroups drift apart by up to a chunk, so that one's
// tensor-core work can overlap the other's element-wise work.
//
// A sequence's chunks are cut into p.seg_count segments of p.seg_len chunks (delta_rule.cu picks
// the count so that the blocks fill the GPU). The segments run in parallel from states that the
// affine summaries of spec 4 provide: per segment, the local state from zero and the K x K transfer
// matrix (state_forward's summary mode), composed serially by fold.cu.
#include "cuda/params.cuh"
#include "cuda/wgmma.cuh"

namespace gdn::cuda::state_pass {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kLdO = 24;  // 16-bit row stride of a warp's 64 x 16 staging tile
// Stages of tiles in flight: the forward's passes keep 3, the backward's 2 (one chunk ahead:
// their chunk steps are 0.4-1.2% faster so, the forward's 0.3-0.5% slower; bench/RESULTS.md).
constexpr int kForwardStages = 3;
constexpr int kBackwardStages = 2;

// One stage's tiles, in bytes from the stage's start. K, Q, A and P are swizzled tiles
// (wgmma.cuh), the B operands of the warpgroup products; V (or dO) is read by ldmatrix.
struct Stage {
  static constexpr int k = 0;                           // bf16 [64][128] swizzled
  static constexpr int q = k + kC * kD * 2;             // bf16 [64][128] swizzled
  static constexpr int a = q + kC * kD * 2;             // bf16 [64][64] swizzled
  static constexpr int pm = a + kC * kC * 2;            // bf16 [64][64] swizzled
  static constexpr int v = pm + kC * kC * 2;            // 16-bit [64][136]  V or dO
  static constexpr int gates = v + kC * kLdH * 2;       // f32 [kGates][64] (params.cuh)
  static constexpr int beta = gates + kGates * kC * 4;  // f32 [64]
  static constexpr int bytes = (beta + kC * 4 + 1023) / 1024 * 1024;
};
// A block's shared memory with kN stages: the stages, each warp's staging tile, the mbarriers.
template <int kN>
struct Ring {
  static constexpr int staging = kN * Stage::bytes;                  // 16-bit [kWarps][64][kLdO]
  static constexpr int barriers = staging + kWarps * kC * kLdO * 2;  // u64 full, empty [kN]
  // + 1024: the dynamic shared memory is aligned up to 1024 bytes (align_1024).
  static constexpr int smem_bytes = barriers + 2 * kN * 8 + 1024;
};
static_assert(Ring<kForwardStages>::smem_bytes <= 227 * 1024,
              "one block fits in a Hopper SM's shared memory");

// Which segments the summary passes run (spec 4). Forward: the offset N_k of every segment but
// the last, and of the last too when its sequence leaves to the next rank; the transfer M_k of
// the middle segments, of the first when its sequence enters from the previous rank, of the last
// when it leaves. Backward: the offset D_k of every segment but the first, and of the first too
// when its sequence enters.
__device__ inline bool has_offset(const Params& p, const Segment& seg) {
  return !seg.is_last || leaves(p, seg.n);
}
__device__ inline bool has_transfer(const Params& p, const Segment& seg) {
  return (!seg.is_first && !seg.is_last) || (seg.is_first && enters(p, seg.n)) ||
         (seg.is_last && leaves(p, seg.n));
}
__device__ inline bool has_grad_offset(const Params& p, const Segment& seg) {
  return !seg.is_first || enters(p, seg.n);
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
// The first chunk slot of segment z (Z: past every chunk); an empty segment's is where the next
// one starts.
__device__ inline int segment_start(const Params& p, int z) {
  if (z >= p.N * p.seg_count) return p.chunk_begin[p.N];
  const int n = z / p.seg_count;
  return min(p.chunk_begin[n] + z % p.seg_count * p.seg_len, p.chunk_begin[n + 1]);
}

// The chunk slots [begin, end) block y of a pass runs (in order, or in reverse), and the place
// of slot `begin` in a round's h, Vn, dh, dVn (begin itself outside rounds). Blocks of the
// passes over whole segments and of rounds by slots run seg_group (round_group) consecutive
// segments, whose
// chunks are consecutive slots, one after another, so that short segments keep the pipeline
// full as one long one does; a round by segment runs a segment's chunks
// [round round_len, (round + 1) round_len) (params.cuh: rounds).
struct Walk {
  int begin, end, place;
};
__device__ inline Walk walk(const Params& p, int y, bool round) {
  if (round && beside_in_rounds(p)) {  // slice y of round p.round's segment (params.cuh)
    const int first = segment_start(p, p.round), end = segment_start(p, p.round + 1);
    const int lo = min(first + y * p.round_len, end);
    return {lo, min(lo + p.round_len, end), lo - first};
  }
  if (round && !p.round_by_slots) {
    const Segment seg = segment(p, y);
    const int lo = p.round * p.round_len, hi = min(seg.chunks, lo + p.round_len);
    const int place = p.round_first[static_cast<long long>(p.round) * p.N * p.seg_count + y];
    return {seg.first + lo, seg.first + max(lo, hi), place};
  }
  const int group = round ? p.round_group : p.seg_group;
  const int z = (round ? p.round_first[p.round] : 0) + y * group;
  const int begin = segment_start(p, z), end = segment_start(p, z + group);
  if (!round) return {begin, end, begin};
  const int first = p.round * p.round_len;  // the round's slots
  return {max(begin, first), min(end, first + p.round_len), max(begin, first) - first};
}

// A chunk slot's segment z and its index there.
struct Position {
  int z, local;
};
__device__ inline Position position(const Params& p, const ChunkInfo& info) {
  return {info.n * p.seg_count + info.index / p.seg_len, info.index % p.seg_len};
}
// Whether a chunk is its sequence's last.
__device__ inline bool ends_sequence(const Params& p, const ChunkInfo& info) {
  return info.t0 + info.len == p.seq_begin[info.n] + p.seq_len[info.n];
}

// The [K][V] f32 matrix of boundary b (params.cuh: boundary), value head hv, in round_state or
// round_dstate.
__device__ inline float* boundary_matrix(float* base, const Params& p, int b, int hv) {
  return base + (static_cast<long long>(b) * p.HV + hv) * kD * kD;
}
// Part j of segment z's transfer M_z,j (value head hv): chunks [j part_len, (j + 1) part_len)
// of the segment, the identity where the segment ends before.
__device__ inline float* transfer_matrix(const Params& p, int z, int j, int hv) {
  return p.seg_transfer + ((static_cast<long long>(z) * p.seg_parts + j) * p.HV + hv) * kD * kD;
}

// K and Q are the rows as they come (params.cuh): their l2norm factors rk, rq are in the gates.
struct Tiles {
  const bf16 *k, *q, *a, *pm;
  const void* v;
  // e = exp(G), e rk, e rq, f rk = exp(G_last - G) rk, beta e rk, beta
  const float *e, *ek, *eq, *fk, *bek, *beta;
};

__device__ inline Tiles tiles(const unsigned char* smem, int buf) {
  const unsigned char* s = smem + buf * Stage::bytes;
  return {reinterpret_cast<const bf16*>(s + Stage::k),
          reinterpret_cast<const bf16*>(s + Stage::q),
          reinterpret_cast<const bf16*>(s + Stage::a),
          reinterpret_cast<const bf16*>(s + Stage::pm),
          s + Stage::v,
          reinterpret_cast<const float*>(s + Stage::gates) + kGateE * kC,
          reinterpret_cast<const float*>(s + Stage::gates) + kGateEK * kC,
          reinterpret_cast<const float*>(s + Stage::gates) + kGateEQ * kC,
          reinterpret_cast<const float*>(s + Stage::gates) + kGateFK * kC,
          reinterpret_cast<const float*>(s + Stage::gates) + kGateBEK * kC,
          reinterpret_cast<const float*>(s + Stage::beta)};
}

// Issues the copies of chunk slot `cid`'s tiles into buffer `buf` (no commit): K always, Q, P
// and the rows of `slice` ([B, T, HV, 128] 16-bit: V or dO) when given. info is p.chunks[cid],
// which the passes load at the top of the step, before its tile wait (info_at): loaded here, its
// latency was a tenth of the save pass's stall samples, in the middle of the chain (the forward
// 2-3% faster so, bench/RESULTS.md thirty-second session). Thread t copies piece t % 16 of rows
// t / 16 + 16 j of the 128-wide tiles and piece t % 8 of rows t / 8 + 32 j of the 64-wide ones:
// rows 8 apart share a swizzle, so only the chunk's base addresses change. hk: hv's key head (the
// block's, computed once: two integer divisions a chunk were ~45 instructions).
__device__ inline void prefetch(const Params& p, unsigned char* smem, int buf, int cid,
                                const ChunkInfo& info, int hv, int hk, bool with_q, bool with_p,
                                const void* slice) {
  const long long s = slot(p, cid, hv);
  unsigned char* base = smem + buf * Stage::bytes;
  const int tid = threadIdx.x;
  const int r = tid / 16, piece = tid % 16, at = swizzled_offset(kC, r, piece);
  const long long qk = (qk_row(p, info.b, info.t0, hk) + r * p.HK) * kD + piece * 8;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool valid = r + 16 * j < info.len;
    const long long off = qk + 16LL * j * p.HK * kD;
    cp_async16(base + Stage::k + at + 2048 * j, p.kn + off, valid);
    if (with_q) cp_async16(base + Stage::q + at + 2048 * j, p.qn + off, valid);
  }
  const int r64 = tid / 8, piece64 = tid % 8, at64 = swizzled_offset(kC, r64, piece64);
  const long long tile = s * kC * kC + r64 * kC + piece64 * 8;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    cp_async16(base + Stage::a + at64 + 4096 * j, p.A + tile + 32 * kC * j, true);
    if (with_p) cp_async16(base + Stage::pm + at64 + 4096 * j, p.P + tile + 32 * kC * j, true);
  }
  if (slice) {
    const unsigned short* src = static_cast<const unsigned short*>(slice);
    const long long v = (v_row(p, info.b, info.t0, hv) + r * p.HV) * kD + piece * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool valid = r + 16 * j < info.len;
      cp_async16(base + Stage::v + ((r + 16 * j) * kLdH + piece * 8) * 2,
                 src + v + 16LL * j * p.HV * kD, valid);
    }
  }
  constexpr int kGatePieces = kGates * kC / 4;  // 16 bytes each
  if (tid < kGatePieces)
    cp_async16(base + Stage::gates + tid * 16, p.gates + s * kGates * kC + tid * 4, true);
  else if (tid < kGatePieces + kC / 4)
    cp_async16(base + Stage::beta + (tid - kGatePieces) * 16,
               p.bt + s * kC + (tid - kGatePieces) * 4, true);
}

// The buffers' mbarriers: full(s) completes when every thread's copies into buffer s have landed
// (cp.async arrivals; no proxy fence is needed before wgmma reads them, as in CUTLASS's cp.async
// wgmma main loops), empty(s) when every thread is done with it. Chunk i uses buffer i % kN, so
// the phase of either barrier that chunk i waits for is i / kN (minus one for empty).
template <int kN>
struct Pipeline {
  unsigned base;  // shared address of full(0 .. kN - 1), then empty(...)
  __device__ unsigned full(int s) const { return base + 8 * s; }
  __device__ unsigned empty(int s) const { return base + 8 * (kN + s); }
};
// Thread 0 initializes the barriers; the caller syncs the block before their first use.
template <int kN>
__device__ inline Pipeline<kN> pipeline(unsigned char* smem) {
  const Pipeline<kN> pipe{smem_address(smem + Ring<kN>::barriers)};
  if (threadIdx.x == 0)
    for (int s = 0; s < kN; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(pipe.full(s)), "r"(kThreads));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(pipe.empty(s)), "r"(kThreads));
    }
  return pipe;
}
__device__ inline void wait_phase(unsigned barrier, int phase) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(barrier),
      "r"(phase & 1)
      : "memory");
}
// Issues chunk i's copies (issue(buffer)) once every thread is done with the chunk that buffer
// held before, and arrives on its full barrier when they land.
template <int kN, typename Issue>
__device__ inline void fill(const Pipeline<kN>& pipe, int i, Issue issue) {
  const int s = i % kN;
  if (i >= kN) wait_phase(pipe.empty(s), i / kN - 1);
  issue(s);
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(pipe.full(s))
               : "memory");
}
// Waits for chunk i's tiles.
template <int kN>
__device__ inline void wait_tiles(const Pipeline<kN>& pipe, int i) {
  wait_phase(pipe.full(i % kN), i / kN);
}
// This thread is done with chunk i's buffer (its wgmma included).
template <int kN>
__device__ inline void release(const Pipeline<kN>& pipe, int i) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(pipe.empty(i % kN)) : "memory");
}

// This lane's entries of a 64-long vector for the 8 column tiles of an accumulator block: f[nt]
// holds columns 8 nt + c, + 1 (c = 2 (lane % 4)). Read ahead of the wgmma wait whose product they
// scale: the wait is a memory barrier to the compiler, which would otherwise load them after it,
// on the chain.
__device__ inline void lane_columns(float2 (&f)[8], const float* v) {
  const int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) f[nt] = *reinterpret_cast<const float2*>(v + 8 * nt + c);
}

// The A fragments of this warp's 16 x 128 state slice (acc) rounded to bf16; with `rest`, in two
// bf16 parts (sa the rounded values, rest what rounding left).
__device__ inline void state_to_a(std::uint32_t (&sa)[8][4], const Acc (&acc)[16],
                                  std::uint32_t (*rest)[4] = nullptr) {
#pragma unroll
  for (int kt = 0; kt < 8; ++kt)
    acc_to_a(sa[kt], acc, kt, float2{1.0f, 1.0f}, float2{1.0f, 1.0f}, rest ? rest[kt] : nullptr);
}

// Stores the bf16 state slice transposed, as rows v (this warp's 16) of a [V][K] tile, through
// the warp's staging tile (a 64-column half at a time) so that global stores are 16 bytes.
__device__ inline void store_state_t(bf16* dst, int vw, const std::uint32_t (&sa)[8][4],
                                     bf16* staging) {
  constexpr int ld = 72;  // 16 x 64 bf16, rows padded to 144 bytes
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      stmatrix_x4(sa[4 * half + kt], a_rows_mk(staging, ld, 0, 16 * kt));
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = lane / 8 + 4 * i, piece = lane % 8;
      *reinterpret_cast<uint4*>(dst + (vw + r) * kD + 64 * half + piece * 8) =
          *reinterpret_cast<const uint4*>(staging + r * ld + piece * 8);
    }
    __syncwarp();
  }
}
static_assert(16 * 72 <= kC * kLdO, "a state half fits in a warp's staging tile");

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

// The A fragments of this warp's V^T (or dO^T) for k-tile kt, as 16-bit pairs: r[0] (row g,
// cols c, c+1), r[1] (row g + 8), r[2] (row g, cols c + 8, c + 9), r[3] (row g + 8, ...).
__device__ inline void load_slice_t(std::uint32_t (&r)[4], const void* slice, int kt) {
  ldmatrix_x4_trans(
      r, a_rows_km(static_cast<const bf16*>(slice), kLdH, 16 * (threadIdx.x / 32), 16 * kt));
}
// The same as f32 pairs.
template <typename In>
__device__ inline void load_slice_t(float2 (&v)[4], const void* slice, int kt) {
  std::uint32_t r[4];
  load_slice_t(r, slice, kt);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = unpack2<In>(r[i]);
}

}  // namespace gdn::cuda::state_pass
