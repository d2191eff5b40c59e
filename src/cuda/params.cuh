#pragma once
// The one params struct of the CUDA delta rule: inputs, outputs, gradients and the workspace's
// intermediates, filled by the launcher (delta_rule.cu) and read by every kernel.
//
// A chunk slot `cid` indexes the chunks of all sequences (sequence n's chunks are
// chunk_begin[n] .. chunk_begin[n + 1] - 1); per-(chunk, value head) intermediates are stored at
// slot (cid * HV + hv), padded to 64 rows with zeros.

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/workspace_header.h"

namespace gdn::cuda {

// The per-row gate arrays of a chunk slot (Params::gates), in this order.
enum Gate { kGateE, kGateEK, kGateEQ, kGateFK, kGateBEK, kGates };

struct ChunkInfo {
  int n;      // sequence
  int b;      // batch row
  int t0;     // first token, within the batch row
  int len;    // tokens in the chunk (1..64); 0 marks an unused slot
  int index;  // chunk index within its sequence
};

// The chunk at a place of a round's dh and dVn (Params: rounds); len 0 past the round's chunks.
struct RoundChunk {
  int cid;
  ChunkInfo info;
};

struct Params {
  // Shapes. N sequences; NC chunk slots (an upper bound on the chunk count); each sequence cut
  // into at most seg_count segments of seg_len chunks, the transfer summary of a segment into
  // seg_parts parts of part_len chunks (segments.h).
  // seg_group, round_group: the segments a block of a pass over whole segments, or of a round
  // by slots, runs one after another (state_pass.cuh: walk). fold_tiles: the n8 tiles of a fold
  // block's slice of the state (segments.h).
  int B, T, HK, HV, N, NC, seg_count, seg_len, seg_parts, part_len, seg_group, round_group,
      fold_tiles;
  // Three segments a sequence, transfers whole, a block a segment, no carried states: the output
  // (or save) pass composes the state entering each third segment itself and the forward runs
  // no fold (state_forward.cu: compose_entering).
  bool compose;
  float scale;
  bool l2norm;
  int beta_code;  // 0 f32, 1 bf16, 2 f16 (the dtype of beta; dbeta has the same code)

  // Inputs (device).
  const void* q;           // [B, T, HK, K]  In
  const void* k;           // [B, T, HK, K]  In
  const void* v;           // [B, T, HV, V]  In
  const float* g;          // [B, T, HV]
  const void* beta;        // [B, T, HV]     beta_code
  const float* h0;         // [N, HV, K, V]  optional
  const void* cu_seqlens;  // [N + 1]        optional
  bool cu_seqlens_i64;

  // Workspace.
  ChunkInfo* chunks;  // [NC]
  int* chunk_begin;   // [N + 1]
  int* seq_begin;     // [N]  first token of each sequence (batch row from chunks)
  int* seq_len;       // [N]
  // The kernels multiply q and k as they come (bf16; f16 rounded to bf16), never rounded after
  // the l2norm: its row factors rq, rk are applied in f32 (folded into the gates, or to a
  // product's rows), so that the unit rows are exact.
  const bf16* qn;  // [B, T, HK, K]  q as bf16: q itself when bf16, else qn_copy
  const bf16* kn;  // [B, T, HK, K]
  bf16* qn_copy;   // [B, T, HK, K]  f16 q, k rounded to bf16 (chunk_prep; null for bf16 inputs)
  bf16* kn_copy;   // [B, T, HK, K]
  float* rq;       // [B, T, HK]     rsqrt(sum q^2 + 1e-6) (1 without l2norm)
  float* rk;       // [B, T, HK]
  float* G;        // [NC, HV, 64]   chunk-local cumsum of g (padded rows: the last value)
  float* bt;       // [NC, HV, 64]   beta as f32 (padded rows: 0)
  float* gates;    // [NC, HV, kGates, 64] e = exp(G), e rk, e rq, f rk = exp(G_last - G) rk,
                   // beta e rk (rk, rq of the chunk's rows; 0 on padded rows)
  bf16* A;         // [NC, HV, 64, 64] (I + L)^-1
  bf16* P;         // [NC, HV, 64, 64] scale (Q K^T) * exp(G_i - G_j), i >= j (unit q, k)
  // The state entering each chunk, transposed, and Vn = A diag(beta) (V - diag(e) K S): a saving
  // forward's at the chunk's slot (one round), or a backward round's at the chunk's place.
  bf16* h;   // [NC or round_slots, HV, V, K]
  bf16* vn;  // [NC or round_slots, HV, 64, V]

  // Segment summaries (seg_count > 1), each [N * seg_count, HV, K, K or V] f32, segment k of
  // sequence n at n * seg_count + k; the transfers [N * seg_count, seg_parts, HV, K, K].
  float* seg_local;     // N_k: the state leaving segment k from a zero start
  float* seg_dlocal;    // D_k: the state gradient entering segment k from a zero end
  float* seg_transfer;  // M_k,j: S_end = M_k,parts-1 ... M_k,0 S_start + N_k
  float* seg_state;     // the state entering segment k (k >= 1)
  float* seg_dstate;    // the state gradient leaving segment k (k < last; backward only)

  // Context parallelism (cuda/context_parallel.cu): whether this rank's sequences enter with a
  // state carried from the previous rank (its h0 row) and leave theirs to the next (its ht row,
  // or the dht row of the backward): every sequence without cu_seqlens, else the first (enters)
  // and the last (leaves). The rank's maps, per chain c = (cu_seqlens ? 0 : n):
  //   forward:  S_leaving = M S_entering + N;  backward: dS_entering = M^T dS_leaving + G (in N).
  bool enters, leaves;
  float* map_M;  // [chains, HV, K, K]
  float* map_N;  // [chains, HV, K, V]

  // Forward outputs.
  void* o;    // [B, T, HV, V]  In, optional (the backward's recompute skips it)
  float* ht;  // [N, HV, K, V]  optional

  // Backward.
  const void* d_o;   // [B, T, HV, V]  In
  const float* dht;  // [N, HV, K, V]  optional
  // The gradient pass runs in rounds (segments.h: RoundPlan), the last first: launch `round` of
  // `rounds` runs chunks [round round_len, (round + 1) round_len) of every segment, or with
  // round_by_slots the chunk slots [round round_len, (round + 1) round_len) (walk). h, Vn
  // (unless the forward saved them in one round), dh and dVn hold one round's chunks, each at its
  // place in the round: by segment, segment z's chunks from round_first[round Z + z] on
  // (Z = N seg_count), by slots slot - round round_len; the chunk at each place in round_chunks
  // (chunk_table). Where a round starts inside a segment (a boundary), the state gradient waits
  // for the round before in round_dstate, and the state entering the round is in round_state,
  // which a training forward (Pass::output) or the backward (Pass::states) writes.
  int rounds, round_len, round_slots, round;
  bool round_by_slots;
  int* round_first;          // [rounds, Z] by segment; [rounds] by slots (round_blocks)
  RoundChunk* round_chunks;  // [rounds, round_slots]
  float* round_state;        // [boundaries, HV, K, V]  (rounds > 1; boundary() says which)
  float* round_dstate;       // [boundaries, HV, K, V]  (rounds > 1)
  bf16* dh;   // [round_slots, HV, V, K]  the gradient of the state leaving a chunk, transposed
  bf16* dvn;  // [round_slots, HV, 64, V]  dVn
  // Chains beside (segments.h: chains_beside): one sequence, whose state_backward runs a block a
  // value head over the whole sequence while grad_chunk's blocks run on the other
  // multiprocessors, each once ready[place HV + hv] is set for its value heads (state_backward
  // sets it when that chunk's dh and dVn are stored; the backward zeroes it first). In rounds
  // (rounds > 1, by segment, round_slots = seg_len), round z runs segment z of all the sequences'
  // (N seg_count rounds, the last first): the recompute in `rounds` slices of round_len chunks
  // from the states the forward kept at their starts, state_backward over the segment from the
  // state gradient the round after left in seg_dstate[z] (or the sequence's dht), the places the
  // chunks' indices in the segment.
  bool beside;
  int* ready;   // [round_slots, HV]
  void* dq;     // [B, T, HK, K]  In
  void* dk;     // [B, T, HK, K]  In
  void* dv;     // [B, T, HV, V]  In
  float* dg;    // [B, T, HV]
  void* dbeta;  // [B, T, HV]     beta_code
  float* dh0;   // [N, HV, K, V]  optional

  // The forward workspace's header (delta_rule.cu says why). `header` describes this call; the
  // chunk table kernel writes it at header_out (the first bytes of a forward's workspace), or,
  // in a backward reading a forward's workspace, compares the header there (saved_header) and
  // that forward's sequence table with its own, and reports a mismatch in `deferred`.
  WorkspaceHeader header;
  WorkspaceHeader* header_out;          // null in a backward reading a forward's workspace
  const WorkspaceHeader* saved_header;  // that forward's, else null
  const int* saved_chunk_begin;         // [N + 1]  that forward's table
  const int* saved_seq_begin;           // [N]
  const int* saved_seq_len;             // [N]
  DeferredError* deferred;              // mapped host memory (cuda/device.h)
};

// Offsets of a token's rows.
__device__ inline long long qk_row(const Params& p, int b, int t, int hk) {
  return ((static_cast<long long>(b) * p.T + t) * p.HK + hk);
}
__device__ inline long long v_row(const Params& p, int b, int t, int hv) {
  return ((static_cast<long long>(b) * p.T + t) * p.HV + hv);
}
__device__ inline long long slot(const Params& p, int cid, int hv) {
  return static_cast<long long>(cid) * p.HV + hv;
}

// Segment k = z % seg_count of sequence n = z / seg_count: its chunk slots first .. first +
// chunks - 1 (chunks <= 0: past the sequence's end), and whether it is the sequence's first or
// last.
struct Segment {
  int n, k, first, chunks;
  bool is_first, is_last;
};
__device__ inline Segment segment(const Params& p, int z) {
  const int n = z / p.seg_count, k = z % p.seg_count, begin = p.chunk_begin[n] + k * p.seg_len;
  const int end = min(p.chunk_begin[n + 1], begin + p.seg_len);
  return {n, k, begin, end - begin, k == 0, end == p.chunk_begin[n + 1]};
}

// The chains beside grad_chunk in rounds (Params::beside).
__host__ __device__ inline bool beside_in_rounds(const Params& p) {
  return p.beside && p.rounds > 1;
}
// The backward's rounds: a segment each beside in rounds (Params::beside), else `rounds`.
__host__ __device__ inline int backward_rounds(const Params& p) {
  return beside_in_rounds(p) ? p.N * p.seg_count : p.rounds;
}
// A round's launch: by slots, blocks of round_group segments from the one holding the round's first
// slot (round_first[round], Z past the chunks) on, at most round_len seg_count segments (each
// sequence in the round has a chunk there, and at most seg_count - 1 empty segments after it):
// with many short sequences most segments have nothing in a round, and their blocks, one an SM
// at a time, would cost a wave each. By segment, a block a segment.
__host__ __device__ inline int round_blocks(const Params& p) {
  if (beside_in_rounds(p)) return p.rounds;  // the recompute's slices of the round's segment
  const long long all = static_cast<long long>(p.N) * p.seg_count;
  if (!p.round_by_slots) return static_cast<int>(all);
  const long long most = static_cast<long long>(p.round_len) * p.seg_count;
  return static_cast<int>(((all < most ? all : most) + p.round_group - 1) / p.round_group);
}
// Whether a round starts at slot cid, chunk `local` > 0 of segment z (a boundary), and the index
// of that boundary's matrices in round_state and round_dstate.
__device__ inline bool round_starts(const Params& p, int cid, int local) {
  return local > 0 && (p.round_by_slots ? cid : local) % p.round_len == 0;
}
__device__ inline int boundary(const Params& p, int cid, int local, int z) {
  return p.round_by_slots ? cid / p.round_len - 1
                          : (local / p.round_len - 1) * p.N * p.seg_count + z;
}

// Whether sequence n enters with a carried state, or leaves one, and its chain.
__device__ inline bool enters(const Params& p, int n) {
  return p.enters && (p.cu_seqlens == nullptr || n == 0);
}
__device__ inline bool leaves(const Params& p, int n) {
  return p.leaves && (p.cu_seqlens == nullptr || n == p.N - 1);
}
__device__ inline int chain(const Params& p, int n) {
  return p.cu_seqlens ? 0 : n;
}

}  // namespace gdn::cuda
