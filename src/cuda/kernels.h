#pragma once
// Launchers of the delta-rule kernels, in the order the forward and backward run them.
// In = bf16 or __half is the dtype of q, k, v, o and their gradients.
//
// forward:  setup, chunk_prep, state_forward<In, true>
// backward: setup, chunk_prep, state_forward<In, false> (h, Vn), state_backward, grad_chunk,
//           grad_qk

#include <cuda_runtime.h>

#include "cuda/params.cuh"

namespace gdn::cuda {

// The chunk table, and q, k in bf16 (l2-normalized when asked) with their rsqrt factors.
template <typename In>
void launch_setup(const Params& p, cudaStream_t stream);
// Per (chunk, value head): G, beta, A, P.
void launch_chunk_prep(const Params& p, cudaStream_t stream);
// Serial over chunks, split over 16-column slices of V (a warp each): o (kOutput) or h and Vn,
// and the final state.
template <typename In, bool kOutput>
void launch_state_forward(const Params& p, cudaStream_t stream);
// Serial in reverse over chunks, split over V: dh, dVn, dh0.
template <typename In>
void launch_state_backward(const Params& p, cudaStream_t stream);
// Per (chunk, value head): dv, dg, dbeta and the value head's share of dq, dk.
template <typename In>
void launch_grad_chunk(const Params& p, cudaStream_t stream);
// dq, dk: the group's sum, back through the l2norm.
template <typename In>
void launch_grad_qk(const Params& p, cudaStream_t stream);

}  // namespace gdn::cuda
