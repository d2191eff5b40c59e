// The chunk-serial forward (spec 3) with the state in registers (state_pass.cuh), per chunk:
//   Vn = A X,  X = diag(beta) (V - diag(e) K S),  e = exp(G), f = exp(G_C - G), gamma = exp(G_C),
//   O  = diag(scale e) Q S + P Vn,          (P from chunk_prep, scale folded in)
//   S' = gamma S + K^T diag(f) Vn,
// each computed transposed (S^T is what a warp holds): (K S)^T = S^T K^T, Vn^T = X^T A^T, ...
// K and Q are the unit rows diag(rk) K, diag(rq) Q of rows K, Q as they come (params.cuh): the
// factors ride on the gates, diag(e) K S = diag(e rk) (K S), K^T diag(f) = K^T diag(f rk), ...
// Pass::output writes o, Pass::recompute (for the backward) h = S^T and Vn of one round's chunks
// (params.cuh: rounds) at their places in the round, Pass::save all three at the chunks' slots.
// With several backward rounds Pass::output of a training forward, and Pass::states of a
// backward whose forward did not save, keep the f32 state entering each round but the first
// (round_state), from which Pass::recompute starts the round: the same state in registers, so
// the same h and Vn as a pass over the whole segment. Pass::summary runs
// the segments of state_pass::has_offset / has_transfer and stores only their end state: in
// blocks with blockIdx.z = 0, from h0 for k = 0 (that is the state entering segment 1, unless k = 0
// is also the last) and from zero for k >= 1 (N_k, in seg_local); in blocks with blockIdx.z = 1 + j
// part j of the transfer matrix M_k (started from the identity with V = 0, column i of M being the
// image of e_i), over the part's chunks only (segments.h). The offsets come first in the grid, so
// that they start first and the shorter parts fill in around them. fold.cu composes them.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/state_backward.cuh"
#include "cuda/state_pass.cuh"

namespace gdn::cuda {
namespace {

using namespace state_pass;

// The recompute runs in the backward, with its stage count (state_pass.cuh).
constexpr int ring_stages(Pass pass) {
  return pass == Pass::recompute ? kBackwardStages : kForwardStages;
}

// The state entering segment z, the third of its sequence, composed in the output (or save) pass
// instead of by the fold (Params::compose): S(2) = M_1 S(1) + N_1, as this warp's slice of
// S(2)^T = S(1)^T M_1^T + N_1^T, on the tensor cores in bf16 three terms (S(1) and M_1 each split
// hi + lo; hi hi + hi lo + lo hi: about 16 bits, as X in the chunk steps). M_1 is copied as f32
// into stage 2 and split into two swizzled bf16 tiles in stage 1, both free before chunk 1's
// copies (the caller issues those after). Stored to seg_state too, where the backward reads it.
template <int kStages>
__device__ inline void compose_entering(Acc (&S)[16], const Params& p, int z, int hv, int vw,
                                        unsigned char* smem) {
  static_assert(kStages >= 3 && kD * kD * 4 <= Stage::bytes, "M_1 fits a stage, f32 or split");
  float* m = reinterpret_cast<float*>(smem + 2 * Stage::bytes);  // f32 [K][K]
  bf16* mh = reinterpret_cast<bf16*>(smem + Stage::bytes);       // bf16 [K][K] swizzled, hi
  bf16* ml = mh + kD * kD;                                       // ... and the rest
  const float* M = transfer_matrix(p, z - 1, 0, hv);
  for (int idx = threadIdx.x; idx < kD * kD / 4; idx += kThreads)
    cp_async16(m + 4 * idx, M + 4 * idx, true);
  cp_async_commit();
  Acc prev[16];  // S(1)^T
  load_state(S, segment_matrix(p.seg_local, p, z - 1, hv), vw);
  load_state(prev, segment_matrix(p.seg_state, p, z - 1, hv), vw);
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = threadIdx.x; idx < kD * kD / 4; idx += kThreads) {
    const int r = idx / (kD / 4), c = 4 * (idx % (kD / 4));
    const float4 x = *reinterpret_cast<const float4*>(m + 4 * idx);
    std::uint32_t l0, l1;
    const std::uint32_t h0 = pack_bf16_split(x.x, x.y, l0), h1 = pack_bf16_split(x.z, x.w, l1);
    *reinterpret_cast<uint2*>(swizzled_at(mh, kD, r, c)) = make_uint2(h0, h1);
    *reinterpret_cast<uint2*>(swizzled_at(ml, kD, r, c)) = make_uint2(l0, l1);
  }
  fence_proxy_async();  // the tiles, before wgmma reads them
  __syncthreads();
  std::uint32_t ah[8][4], al[8][4];
  state_to_a(ah, prev, al);
  wgmma_fence();
  wgmma_nk(S, ah, mh, true);
  wgmma_nk(S, ah, ml, true);
  wgmma_nk(S, al, mh, true);
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(S);
  store_state(segment_matrix(p.seg_state, p, z, hv), vw, S);
  __syncthreads();  // every warpgroup is done with the tiles: stages 1 and 2 take chunks again
}

// Block (hv, y, kind) of the pass: value head hv; segment y and kind = 0 (offset) or 1 + j
// (transfer part j) of a summary, else walk y (of round p.round for the recompute).
template <typename In, Pass kPass>
__device__ __forceinline__ void state_forward_block(const Params& p, int hv, int y, int kind) {
  constexpr bool kOutput = kPass == Pass::output || kPass == Pass::save;
  constexpr bool kStates = kPass == Pass::save || kPass == Pass::recompute;  // h, Vn
  constexpr bool kRoundStates = kPass == Pass::output || kPass == Pass::states;
  constexpr bool kRound = kPass == Pass::recompute;  // one round's chunks
  constexpr bool kSummary = kPass == Pass::summary;
  constexpr int kStages = ring_stages(kPass);
  const int warp = threadIdx.x / 32;
  const int hk = hv / (p.HV / p.HK), vw = 16 * warp;
  // The chunk slots this block runs: a summary's segment (or a part of its transfer), else its
  // walk (state_pass.cuh).
  const bool transfer = kSummary && kind > 0;
  const int part = kind - 1;
  Walk w;
  if constexpr (kSummary) {
    const Segment seg = segment(p, y);
    if (seg.chunks <= 0 || !(transfer ? has_transfer(p, seg) : has_offset(p, seg))) return;
    const int skip = transfer ? part * p.part_len : 0;
    const int chunks = transfer ? max(0, min(seg.chunks - skip, p.part_len)) : seg.chunks;
    w = {seg.first + skip, seg.first + skip + chunks, 0};
  } else {
    w = walk(p, y, kRound);
    if (w.begin >= w.end) return;
  }
  const int chunks = w.end - w.begin;
  // This block composes the state entering its segment (one segment a block, Params::compose).
  const bool composes = kOutput && p.compose && y % p.seg_count == 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  [[maybe_unused]] bf16* staging =
      reinterpret_cast<bf16*>(smem + Ring<kStages>::staging) + warp * kC * kLdO;
  if (transfer)  // V = 0: its tiles are zeroed once and never loaded
    for (int idx = threadIdx.x; idx < kStages * kC * kLdH / 8; idx += kThreads) {
      const int buf = idx / (kC * kLdH / 8), at = idx % (kC * kLdH / 8);
      reinterpret_cast<uint4*>(smem + buf * Stage::bytes + Stage::v)[at] = uint4{0, 0, 0, 0};
    }
  const auto pipe = pipeline<kStages>(smem);
  __syncthreads();
  // The table entry of the walk's chunk i (none past its end).
  auto info_at = [&](int i) { return i < chunks ? p.chunks[w.begin + i] : ChunkInfo{}; };
  auto prefetch_chunk = [&](int i, const ChunkInfo& info) {
    if (i < chunks)
      fill(pipe, i, [&](int buf) {
        prefetch(p, smem, buf, w.begin + i, info, hv, hk, kOutput, kOutput,
                 transfer ? nullptr : p.v);
      });
  };
  // The state entering a segment's first chunk here (at `local` > 0: a round after its first).
  auto entering = [&](Acc(&S)[16], int z, int local, int cid) {
    const int n = z / p.seg_count;
    if (transfer)
      load_identity(S, vw);
    else if (kSummary && z % p.seg_count > 0)
      load_state(S, nullptr, vw);
    else if (local > 0)
      load_state(S, boundary_matrix(p.round_state, p, boundary(p, cid, local, z), hv), vw);
    else if (z % p.seg_count == 0)
      load_state(S, sequence_matrix(p.h0, p, n, hv), vw);
    else if (composes) {
      if constexpr (kOutput) compose_entering<kStages>(S, p, z, hv, vw, smem);
    } else {
      load_state(S, segment_matrix(p.seg_state, p, z, hv), vw);
    }
  };

  Acc S[16];
  int z = y;  // the segment of the chunks in flight (a summary's: its block's)
  // O of chunk i is stored during chunk i + 1 (after that chunk's K S is issued), and its
  // buffer, whose P the product of O reads, is released then.
  [[maybe_unused]] Acc qs[8];
  [[maybe_unused]] auto store_o = [&](const ChunkInfo& info) {
    In* o = static_cast<In*>(p.o) + v_row(p, info.b, info.t0, hv) * kD + vw;
    store_tokens<In>(qs, staging, o, static_cast<long long>(p.HV) * kD, info.len);
  };
  for (int i = 0; i < kStages - 1; ++i)
    if (!(composes && i == 1)) prefetch_chunk(i, info_at(i));  // chunk 1's after the composition
  std::uint32_t sa[8][4];    // the state entering chunk i, as bf16 A fragments
  if constexpr (kSummary) {  // one segment (a transfer part may have no chunks)
    entering(S, z, 0, w.begin);
    state_to_a(sa, S);
  }
  // A segment at a time, its chunks [i, end) of the walk; the pipeline runs on across them.
  for (int i = 0; i < chunks;) {
    const int start = w.begin + i;
    const Position at = position(p, p.chunks[start]);
    if constexpr (!kSummary) {
      z = at.z;
      entering(S, z, at.local, start);
      if (composes) prefetch_chunk(1, info_at(1));
      state_to_a(sa, S);
    }
    const int end = min(chunks, segment_start(p, z + 1) - w.begin);
    for (; i < end; ++i) {
      const int cid = w.begin + i, local = at.local + (cid - start);
      // The table entries of the chunk whose tiles this step issues and of the one whose O it
      // stores, loaded before the tile wait so that their latency passes during it and K S.
      const ChunkInfo ahead = info_at(i + kStages - 1);
      [[maybe_unused]] const ChunkInfo done = kOutput && i > 0 ? info_at(i - 1) : ChunkInfo{};
      if constexpr (kRoundStates)
        if (p.round_state && round_starts(p, cid, local))
          store_state(boundary_matrix(p.round_state, p, boundary(p, cid, local, z), hv), vw, S);
      wait_tiles(pipe, i);
      const Tiles t = tiles(smem, i % kStages);
      [[maybe_unused]] const long long s = slot(p, w.place + i, hv);

      // (K S)^T and (Q S)^T = S^T K^T, S^T Q^T: B = K^T, Q^T, that is K, Q as K-major tiles.
      Acc ks[8];
      wgmma_fence();
      wgmma_nk(ks, sa, t.k, false);
      wgmma_commit();
      if constexpr (kOutput) {
        wgmma_wait<1>();  // K S may run on: marks qs as not in flight
        if (i > 0) {      // the previous chunk's O, stored while K S runs
          store_o(done);
          release(pipe, i - 1);
        }
        wgmma_fence();
        wgmma_nk(qs, sa, t.q, false);
        wgmma_commit();
      }
      prefetch_chunk(i + kStages - 1, ahead);
      if constexpr (kStates) store_state_t(p.h + s * kD * kD, vw, sa, staging);
      // The chunk's vectors and V, read while K S runs (chain-trim: only the products' own
      // epilogues lie between a wait and the next product).
      std::uint32_t v[4][4];  // V^T's A fragments, 16-bit
      float2 ek[8], beta[8];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) load_slice_t(v[kt], t.v, kt);
      lane_columns(ek, t.ek);
      lane_columns(beta, t.beta);
      wgmma_wait<kOutput ? 1 : 0>();
      fence_acc(ks);

      // X^T diag(beta) = (V^T - (K S)^T diag(e)) diag(beta), as A fragments split in two bf16
      // parts (x = hi + lo), so that Vn = A X sees X to about 16 bits: rounding X to bf16 before
      // the product cost 8% of o's accuracy and 14-21% of the final state's (bench/rounding.py).
      // The summaries round it once: their error reaches o only through the states entering the
      // segments (o +0-4% on the GPU, every output still 21% or more below the peers'), and the
      // shorter chain takes 3-4% off the forward (bench/RESULTS.md, forty-first session).
      std::uint32_t xa[4][4], xl[4][4];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) {
        const float2 e0 = ek[2 * kt], e8 = ek[2 * kt + 1], b0 = beta[2 * kt], b8 = beta[2 * kt + 1];
        const float* lo = ks[2 * kt];
        const float* hi = ks[2 * kt + 1];
        const float2 w[4] = {unpack2<In>(v[kt][0]), unpack2<In>(v[kt][1]), unpack2<In>(v[kt][2]),
                             unpack2<In>(v[kt][3])};
        const float x[4][2] = {{b0.x * (w[0].x - e0.x * lo[0]), b0.y * (w[0].y - e0.y * lo[1])},
                               {b0.x * (w[1].x - e0.x * lo[2]), b0.y * (w[1].y - e0.y * lo[3])},
                               {b8.x * (w[2].x - e8.x * hi[0]), b8.y * (w[2].y - e8.y * hi[1])},
                               {b8.x * (w[3].x - e8.x * hi[2]), b8.y * (w[3].y - e8.y * hi[3])}};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xa[kt][i] =
              kSummary ? pack_bf16(x[i][0], x[i][1]) : pack_bf16_split(x[i][0], x[i][1], xl[kt][i]);
      }

      // Vn^T = X^T diag(beta) A^T; the state decays (S *= gamma) while it runs.
      const float gamma = t.e[kC - 1];
      Acc vn[8];
      wgmma_fence();
      wgmma_nk(vn, xa, t.a, false);
      if constexpr (!kSummary) wgmma_nk(vn, xl, t.a, true);
      wgmma_commit();
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] *= gamma;
      float2 fk[8];
      lane_columns(fk, t.fk);
      wgmma_wait<0>();
      fence_acc(vn);

      // S^T = gamma S^T + (Vn^T diag(f)) K, K as an MN-major tile: issued first, so that the next
      // chunk waits on it alone.
      std::uint32_t fa[4][4];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) acc_to_a(fa[kt], vn, kt, fk[2 * kt], fk[2 * kt + 1]);
      wgmma_fence();
      wgmma_kn(S, fa, t.k, kC, true);
      wgmma_commit();

      if constexpr (kOutput) {  // O^T = (Q S)^T diag(scale e) + Vn^T P^T, stored next chunk
        float2 eq[8];
        lane_columns(eq, t.eq);
        fence_acc(qs);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          qs[nt][0] *= p.scale * eq[nt].x;
          qs[nt][1] *= p.scale * eq[nt].y;
          qs[nt][2] *= p.scale * eq[nt].x;
          qs[nt][3] *= p.scale * eq[nt].y;
        }
        // Vn rounded once for P: in two parts (as X) it kept o a fifth more accurate, for 3-4% of
        // the forward where the chains bind (T=4096, 2 value heads; bench/RESULTS.md).
        std::uint32_t va[4][4];
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) acc_to_a(va[kt], vn, kt, [](int) { return 1.0f; });
        wgmma_fence();
        wgmma_nk(qs, va, t.pm, true);
        wgmma_commit();
      }
      if constexpr (kStates) store_tokens<bf16>(vn, staging, p.vn + s * kC * kD + vw, kD, kC);
      wgmma_wait<kOutput ? 1 : 0>();
      fence_acc(S);
      state_to_a(sa, S);
      if constexpr (kOutput) {
        wgmma_wait<0>();
        fence_acc(qs);
      } else {
        release(pipe, i);
      }
    }
    if (kOutput && p.ht && ends_sequence(p, p.chunks[w.begin + end - 1]))
      store_state(sequence_matrix(p.ht, p, z / p.seg_count, hv), vw, S);
  }
  if constexpr (kOutput) store_o(info_at(chunks - 1));
  if constexpr (kSummary) {
    const Segment seg = segment(p, z);
    store_state(transfer                       ? transfer_matrix(p, z, part, hv)
                : seg.is_first && !seg.is_last ? segment_matrix(p.seg_state, p, z + 1, hv)
                                               : segment_matrix(p.seg_local, p, z, hv),
                vw, S);
  }
}

template <typename In, Pass kPass>
__global__ void __launch_bounds__(kThreads, 1) state_forward_kernel(Params p) {
  begin_dependent();  // launch.cuh
  state_forward_block<In, kPass>(p, blockIdx.x, blockIdx.y, blockIdx.z);
}

// The backward's summary (blockIdx.z = 0: state_backward.cuh, a block a segment) with the
// recompute of round p.round (the last) beside it (z = 1): the summary runs the segments with a
// gradient offset, at four segments a sequence three in four, each a block on an SM for its
// whole length, and the recompute, which needs only the states entering the rounds, takes the
// SMs they leave idle.
template <typename In>
__global__ void __launch_bounds__(kThreads, 1) backward_summary_kernel(Params p) {
  begin_dependent();  // launch.cuh
  if (blockIdx.z == 0) {
    if (blockIdx.y < p.N * p.seg_count) state_backward_block<In, true>(p, blockIdx.x, blockIdx.y);
  } else if (blockIdx.y < round_blocks(p)) {
    state_forward_block<In, Pass::recompute>(p, blockIdx.x, blockIdx.y, 0);
  }
}

}  // namespace

template <typename In, Pass kPass>
void launch_state_forward(const Params& p, cudaStream_t stream) {
  auto kernel = state_forward_kernel<In, kPass>;
  constexpr int smem = Ring<ring_stages(kPass)>::smem_bytes;
  GDN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int kinds = kPass == Pass::summary ? 1 + p.seg_parts : 1;
  const int segments = p.N * p.seg_count;
  const int blocks = kPass == Pass::recompute ? round_blocks(p)
                     : kPass == Pass::summary ? segments
                                              : (segments + p.seg_group - 1) / p.seg_group;
  launch_dependent(kernel, dim3(p.HV, blocks, kinds), kThreads, smem, stream, p);
}

template <typename In>
void launch_backward_summary(const Params& p, cudaStream_t stream) {
  auto kernel = backward_summary_kernel<In>;
  static_assert(ring_stages(Pass::recompute) == kBackwardStages, "the two share shared memory");
  constexpr int smem = Ring<kBackwardStages>::smem_bytes;
  GDN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  Params last = p;
  last.round = p.rounds - 1;
  const int blocks = std::max(p.N * p.seg_count, round_blocks(last));
  launch_dependent(kernel, dim3(p.HV, blocks, 2), kThreads, smem, stream, last);
}

template void launch_state_forward<bf16, Pass::output>(const Params&, cudaStream_t);
template void launch_state_forward<bf16, Pass::save>(const Params&, cudaStream_t);
template void launch_state_forward<bf16, Pass::states>(const Params&, cudaStream_t);
template void launch_state_forward<bf16, Pass::recompute>(const Params&, cudaStream_t);
template void launch_state_forward<bf16, Pass::summary>(const Params&, cudaStream_t);
template void launch_state_forward<__half, Pass::output>(const Params&, cudaStream_t);
template void launch_state_forward<__half, Pass::save>(const Params&, cudaStream_t);
template void launch_state_forward<__half, Pass::states>(const Params&, cudaStream_t);
template void launch_state_forward<__half, Pass::recompute>(const Params&, cudaStream_t);
template void launch_state_forward<__half, Pass::summary>(const Params&, cudaStream_t);
template void launch_backward_summary<bf16>(const Params&, cudaStream_t);
template void launch_backward_summary<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
