#pragma once
// The reverse chunk-serial pass for the state gradient, the gradient dS of the state leaving the
// chunk held transposed in registers (state_pass.cuh), over this round's chunks of each segment
// (params.cuh: rounds), from and to the state gradient the rounds hand on. Per chunk (spec 3, by
// hand; W = A diag(beta e) K, P from chunk_prep with scale folded in):
//   dh[c] = dS,  dVn = P^T dO + diag(f) K dS,
//   dS_in = gamma dS + Q^T diag(scale e) dO - W^T dVn,
// computed transposed: dVn^T = dO^T P + dS^T K^T diag(f), W^T-term = ((dVn^T A) diag(beta e)) K,
// with K, Q the unit rows of the tiles' K, Q (params.cuh): the gates carry rk, rq.
// As a summary (kSummary) it runs the segments of state_pass::has_grad_offset and stores only
// the gradient entering them: from dS_T for the last segment (that is the gradient leaving
// segment last - 1, unless the last is also the first), from zero for the others (D_k, with
// dS_start = M_k^T dS_end + D_k, in seg_dlocal; fold.cu composes them).
// With the chains beside grad_chunk (Params::beside) block hv runs the one sequence whole (in
// rounds: round p.round's segment), its state gradient carried across the segments, and publishes
// each chunk's dh and dVn to grad_chunk's waiting blocks in `ready`: once every thread has released
// the chunk's stage (an mbarrier: their stores are issued before), one thread fences at GPU scope
// and sets the flag, a step later, in the fill that waits on that release anyway; the last steps'
// after the walk.
#include "cuda/state_pass.cuh"

namespace gdn::cuda {

// Block (hv, y) of the pass: value head hv, segment y (a summary) or walk y of round p.round.
template <typename In, bool kSummary>
__device__ __forceinline__ void state_backward_block(const Params& p, int hv, int y) {
  using namespace state_pass;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hk = hv / (p.HV / p.HK), vw = 16 * warp;
  // The chunk slots this block runs, in reverse: a summary's segment, else its walk in this
  // round (state_pass.cuh), whose dh and dVn go to the round's places from `w.place` on.
  Walk w;
  if constexpr (kSummary) {
    const Segment seg = segment(p, y);
    if (seg.chunks <= 0 || !has_grad_offset(p, seg)) return;
    w = {seg.first, seg.first + seg.chunks, 0};
  } else if (beside_in_rounds(p)) {  // round p.round's segment, places from 0
    w = {segment_start(p, p.round), segment_start(p, p.round + 1), 0};
    if (w.begin >= w.end) return;
  } else if (p.beside) {  // the one sequence, places from 0
    w = {segment_start(p, 0), segment_start(p, p.seg_count), 0};
    if (w.begin >= w.end) return;
  } else {
    w = walk(p, y, true);
    if (w.begin >= w.end) return;
  }
  const int chunks = w.end - w.begin;
  const int c = 2 * (lane % 4);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  [[maybe_unused]] bf16* staging =
      reinterpret_cast<bf16*>(smem + Ring<kBackwardStages>::staging) + warp * kC * kLdO;
  const auto pipe = pipeline<kBackwardStages>(smem);
  __syncthreads();
  // The table entry of the chunk of `step` (step 0 is the last chunk; none past the first).
  auto info_at = [&](int step) { return step < chunks ? p.chunks[w.end - 1 - step] : ChunkInfo{}; };
  auto prefetch_step = [&](int step, const ChunkInfo& info) {
    if (step < chunks)
      fill(pipe, step, [&](int buf) {
        prefetch(p, smem, buf, w.end - 1 - step, info, hv, hk, true, true, p.d_o);
      });
  };
  // The state gradient leaving a segment's last chunk here, slot cid (a summary's from zero but
  // for a sequence's last segment).
  auto leaving = [&](Acc(&dS)[16], int z, const ChunkInfo& info, int local, int cid) {
    const bool last = ends_sequence(p, info);
    if (!kSummary && p.beside) {  // carried from the segment after (in rounds: the round after)
      if (last)
        load_state(dS, sequence_matrix(p.dht, p, info.n, hv), vw);
      else if (beside_in_rounds(p))
        load_state(dS, segment_matrix(p.seg_dstate, p, z, hv), vw);
    } else if (kSummary && !last)
      load_state(dS, nullptr, vw);
    else if (cid + 1 < segment_start(p, z + 1))  // the segment goes on in the round after
      load_state(dS, boundary_matrix(p.round_dstate, p, boundary(p, cid + 1, local + 1, z), hv),
                 vw);
    else if (last)
      load_state(dS, sequence_matrix(p.dht, p, info.n, hv), vw);
    else
      load_state(dS, segment_matrix(p.seg_dstate, p, z, hv), vw);
  };

  // Beside: chunk `step`'s dh and dVn are stored and visible at GPU scope (the caller fenced).
  auto publish = [&](int step) {
    store_relaxed(p.ready + slot(p, w.place + chunks - 1 - step, hv), 1);
  };
  Acc dS[16];
  for (int step = 0; step < kBackwardStages - 1; ++step) prefetch_step(step, info_at(step));
  // A segment at a time, from its last chunk here (top) down to its first here (bottom); the
  // pipeline runs on across them.
  for (int step = 0; step < chunks;) {
    const int top = w.end - 1 - step;
    const ChunkInfo info = p.chunks[top];
    const Position at = position(p, info);
    const int z = at.z, bottom = max(w.begin, segment_start(p, z));
    leaving(dS, z, info, at.local, top);
    for (const int end = step + top - bottom + 1; step < end; ++step) {
      // The table entry of the chunk whose tiles this step issues, loaded before the tile wait
      // (state_pass.cuh: prefetch).
      const ChunkInfo ahead = info_at(step + kBackwardStages - 1);
      wait_tiles(pipe, step);
      const Tiles t = tiles(smem, step % kBackwardStages);
      [[maybe_unused]] const long long s = slot(p, w.place + chunks - 1 - step, hv);  // dh, dVn

      std::uint32_t da[8][4];
      state_to_a(da, dS);

      // dVn^T = (dS^T K^T) diag(f) + dO^T P; dO^T is loaded while dS^T K^T runs, and dO^T P (off
      // the chain: it does not depend on dS) is issued behind it into its own accumulator.
      Acc dvn[8], u[8];
      wgmma_fence();
      wgmma_nk(dvn, da, t.k, false);
      wgmma_commit();
      prefetch_step(step + kBackwardStages - 1, ahead);
      if constexpr (!kSummary) {
        // The fill just past waited until every thread released step - 1 (its stores issued).
        if (p.beside && threadIdx.x == 0 && step >= 1 && step + kBackwardStages - 1 < chunks) {
          fence_gpu();
          publish(step - 1);
        }
        store_state_t(p.dh + s * kD * kD, vw, da, staging);  // meanwhile
      }
      // dO^T, and dO^T diag(scale e) in two bf16 parts (sa + sl, pack_bf16_split): rounding it to
      // bf16 once cost 30% of dh0's accuracy under strong gates (bench/rounding.py).
      std::uint32_t oa[4][4], sa[4][4], sl[4][4];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) {
        float2 d[4];
        load_slice_t<In>(d, t.v, kt);
        const int c0 = 16 * kt + c, c8 = c0 + 8;
        const float e0 = p.scale * t.eq[c0], e1 = p.scale * t.eq[c0 + 1], e8 = p.scale * t.eq[c8],
                    e9 = p.scale * t.eq[c8 + 1];
        oa[kt][0] = pack_bf16(d[0].x, d[0].y);
        oa[kt][1] = pack_bf16(d[1].x, d[1].y);
        oa[kt][2] = pack_bf16(d[2].x, d[2].y);
        oa[kt][3] = pack_bf16(d[3].x, d[3].y);
        sa[kt][0] = pack_bf16_split(e0 * d[0].x, e1 * d[0].y, sl[kt][0]);
        sa[kt][1] = pack_bf16_split(e0 * d[1].x, e1 * d[1].y, sl[kt][1]);
        sa[kt][2] = pack_bf16_split(e8 * d[2].x, e9 * d[2].y, sl[kt][2]);
        sa[kt][3] = pack_bf16_split(e8 * d[3].x, e9 * d[3].y, sl[kt][3]);
      }
      wgmma_fence();
      wgmma_kn(u, oa, t.pm, kC, false);
      wgmma_commit();
      // The vectors of the epilogues ahead, read while the products run (chain-trim: only the
      // products' own epilogues lie between a wait and the next product).
      float2 fk[8];
      lane_columns(fk, t.fk);
      const float gamma = t.e[kC - 1];
      wgmma_wait<0>();
      fence_acc(dvn);
      fence_acc(u);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        dvn[nt][0] = dvn[nt][0] * fk[nt].x + u[nt][0];
        dvn[nt][1] = dvn[nt][1] * fk[nt].y + u[nt][1];
        dvn[nt][2] = dvn[nt][2] * fk[nt].x + u[nt][2];
        dvn[nt][3] = dvn[nt][3] * fk[nt].y + u[nt][3];
      }

      // Y = dVn^T A, then dS^T = gamma dS^T + (dO^T diag(scale e)) Q - (Y diag(beta e)) K (the
      // decay and the Q term, two wgmma for the two parts, run while Y does, dVn is stored).
      std::uint32_t na[4][4];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt) acc_to_a(na[kt], dvn, kt, [](int) { return 1.0f; });
      Acc y[8];
      wgmma_fence();
      wgmma_kn(y, na, t.a, kC, false);
      wgmma_commit();
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dS[nt][e] *= gamma;
      wgmma_fence();
      wgmma_kn(dS, sa, t.q, kC, true);
      wgmma_kn(dS, sl, t.q, kC, true);
      wgmma_commit();
      if constexpr (!kSummary) store_tokens<bf16>(dvn, staging, p.dvn + s * kC * kD + vw, kD, kC);
      float2 bek[8];
      lane_columns(bek, t.bek);
      wgmma_wait<1>();
      fence_acc(y);
      std::uint32_t ya[4][4];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)
        acc_to_a(ya[kt], y, kt, float2{-bek[2 * kt].x, -bek[2 * kt].y},
                 float2{-bek[2 * kt + 1].x, -bek[2 * kt + 1].y});
      wgmma_fence();
      wgmma_kn(dS, ya, t.k, kC, true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dS);
      release(pipe, step);
    }
    const int bottom_local = at.local - (top - bottom);
    if constexpr (kSummary) {
      const Segment seg = segment(p, z);
      store_state(seg.is_last && !seg.is_first ? segment_matrix(p.seg_dstate, p, z - 1, hv)
                                               : segment_matrix(p.seg_dlocal, p, z, hv),
                  vw, dS);
    } else if (bottom_local > 0) {  // for the round before this one
      store_state(boundary_matrix(p.round_dstate, p, boundary(p, bottom, bottom_local, z), hv), vw,
                  dS);
    } else if (p.dh0 && z % p.seg_count == 0) {
      store_state(sequence_matrix(p.dh0, p, z / p.seg_count, hv), vw, dS);
    } else if (beside_in_rounds(p) && z % p.seg_count > 0) {  // for the round before
      store_state(segment_matrix(p.seg_dstate, p, z - 1, hv), vw, dS);
    }
  }
  if (!kSummary && p.beside) {  // the steps not published yet, once the walk's stores are done
    __syncthreads();
    if (threadIdx.x == 0) {
      fence_gpu();
      for (int step = max(0, chunks - kBackwardStages); step < chunks; ++step) publish(step);
    }
  }
}

}  // namespace gdn::cuda
