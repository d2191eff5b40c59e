#pragma once
// Launchers of the delta-rule kernels, in the order the forward and backward run them.
// In = bf16 or __half is the dtype of q, k, v, o and their gradients.
//
// forward:  chunk_table, chunk_prep, [state_forward<summary>, combine],
//           state_forward<output or save>
// backward: {chunk_table, chunk_prep, [state_forward<summary>, combine]},
//           (state_forward<recompute>),
//           [state_backward<summary>, combine<reverse>], state_backward, grad_chunk
// (the bracketed launches only when sequences are cut into segments, seg_count > 1; the braced
// ones not when the backward reads the forward's workspace, the parenthesized one not when that
// forward ran Pass::save).

#include <cuda_runtime.h>

#include "cuda/params.cuh"

namespace gdn::cuda {

// The chunk table.
void launch_chunk_table(const Params& p, cudaStream_t stream);
// Per (chunk, key head): q, k in bf16 (l2-normalized when asked) with their rsqrt factors; then,
// looping over its value heads, G, beta, the gates, A and P per value head.
template <typename In>
void launch_chunk_prep(const Params& p, cudaStream_t stream);
enum class Pass {
  output,     // o and the final state
  save,       // o, the final state, and h and Vn for the backward (a training forward)
  recompute,  // h and Vn for the backward
  summary,    // per segment: the state from zero and the transfer matrix, nothing per chunk
};
// Serial over the chunks of each segment, a warpgroup per 64 columns of V (state_pass.cuh).
template <typename In, Pass kPass>
void launch_state_forward(const Params& p, cudaStream_t stream);
// Serial in reverse over the chunks of each segment: dh, dVn, dh0; or, as a summary, the state
// gradient entering each segment from a zero gradient at its end.
template <typename In, bool kSummary>
void launch_state_backward(const Params& p, cudaStream_t stream);
// Composes the segment summaries: the state entering each segment (forward), or the state
// gradient leaving each segment (reverse).
void launch_combine(const Params& p, bool reverse, cudaStream_t stream);
// Per (chunk, key head), looping over its value heads: dv, dg, dbeta per value head; dq, dk
// summed over the group and back through the l2norm.
template <typename In>
void launch_grad_chunk(const Params& p, cudaStream_t stream);

}  // namespace gdn::cuda
