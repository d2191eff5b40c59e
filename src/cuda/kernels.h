#pragma once
// Launchers of the delta-rule kernels, in the order the forward and backward run them.
// In = bf16 or __half is the dtype of q, k, v, o and their gradients.
//
// forward:  chunk_table, chunk_prep, [state_forward<summary>, fold<states>],
//           state_forward<output or save> (a training forward in several rounds: output, keeping
//           the states entering the rounds)
// backward: chunk_table, {chunk_prep, [state_forward<summary>, fold<states>]},
//           (state_forward<states>), [state_backward<summary>, fold<grad_states>],
//           ((state_forward<recompute>), state_backward, grad_chunk) in rounds, the last first
//           (params.cuh: rounds; Params::round says which); with both, the summary and the last
//           round's recompute in one launch (launch_backward_summary); with the chains beside
//           grad_chunk (Params::beside: one sequence; in rounds, a segment a round, of one
//           sequence or several) no summary or fold, and state_backward over the sequence (the
//           round's segment) with grad_chunk running beside it
// (the bracketed launches only when sequences are cut into segments, seg_count > 1, or carry
// states across ranks; the braced ones not when the backward reads the forward's workspace; the
// states pass only with several rounds and no saving forward, the recompute pass not after a
// forward that saved h and Vn (one round); a backward reading the forward's workspace builds its
// own chunk table, checking the forward's header). Under context parallelism
// (cuda/context_parallel.cu) the forward stops after its summaries for the rank's map
// (fold<map_offset, map_transfer>) and goes on once the carried state is in h0; the backward
// likewise with fold<grad_offset> and dht.

#include <cuda_runtime.h>

#include "cuda/params.cuh"

namespace gdn::cuda {

// The chunk table; the workspace header: written (header_out), or checked (saved_header).
void launch_chunk_table(const Params& p, cudaStream_t stream);
// Per (chunk, key head): q, k in bf16 (as they come) with their l2norm factors; then, looping
// over its value heads, G, beta, the gates, A and P per value head.
template <typename In>
void launch_chunk_prep(const Params& p, cudaStream_t stream);
enum class Pass {
  output,     // o and the final state; with round_state, the state entering each round too
  save,       // o, the final state, and h and Vn for the backward (a training forward, 1 round)
  states,     // the state entering each round (a backward whose forward did not save, rounds > 1)
  recompute,  // h and Vn of round p.round's chunks for the backward
  summary,    // per segment: the state from zero and the transfer matrix, nothing per chunk
};
// Serial over the chunks of each segment, a warpgroup per 64 columns of V (state_pass.cuh).
template <typename In, Pass kPass>
void launch_state_forward(const Params& p, cudaStream_t stream);
// Serial in reverse over the chunks of each segment (beside: of the whole sequence, setting each
// chunk's ready flags): dh, dVn, dh0; or, as a summary, the state gradient entering each segment
// from a zero gradient at its end.
template <typename In, bool kSummary>
void launch_state_backward(const Params& p, cudaStream_t stream);
// state_backward's summary and, beside it in the same launch, state_forward's recompute of the
// last round, rounds - 1 (which the rounds then skip); p.round is not read.
template <typename In>
void launch_backward_summary(const Params& p, cudaStream_t stream);
// Composes the segment summaries (fold.cu says what each fold computes).
enum class Fold { states, grad_states, map_offset, map_transfer, grad_offset };
void launch_fold(const Params& p, Fold fold, cudaStream_t stream);
// Y_i = M_i X_i + C_i for i < count (C optional; Y may be X or C); launch_transpose: M_i <-
// M_i^T. 128 x 128 f32 matrices, consecutive.
void launch_affine(int count, const float* M, const float* X, const float* C, float* Y,
                   cudaStream_t stream);
void launch_transpose(int count, float* M, cudaStream_t stream);
// `height` rows of `width` bytes between device buffers, rows the pitches apart.
void launch_copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                    std::size_t width, std::size_t height, cudaStream_t stream);
// Per (chunk, key head), looping over its value heads: dv, dg, dbeta per value head; dq, dk
// summed over the group and back through the l2norm. Beside the chains (Params::beside) its
// blocks run while state_backward does, each once its chunk's flags are set.
template <typename In>
void launch_grad_chunk(const Params& p, cudaStream_t stream);

}  // namespace gdn::cuda
