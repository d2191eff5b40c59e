#pragma once
// Launchers of the delta-rule kernels, in the order the forward and backward run them.
// Each is instantiated for In = bf16 and __half (q, k, v, o and their gradients).
//
// forward:  setup, chunk_prep, state_forward, output_forward
// backward: setup, chunk_prep<backward>, state_forward (recompute h, Vn), state_backward,
//           grad_chunk, grad_qk

#include <cuda_runtime.h>

#include "cuda/params.cuh"

namespace gdn::cuda {

// The chunk table, and q, k in bf16 (l2-normalized when asked) with their rsqrt factors.
template <typename In>
void launch_setup(const Params& p, cudaStream_t stream);
// Per (chunk, value head): G, W, U; with kBackward also A and dv_local = scale P^T dO.
template <typename In, bool kBackward>
void launch_chunk_prep(const Params& p, cudaStream_t stream);
// Serial over chunks, split over 32-column slices of V: h, Vn, the final state.
void launch_state_forward(const Params& p, cudaStream_t stream);
// Per (chunk, value head): o = scale (diag(e) Q S + P Vn).
template <typename In>
void launch_output_forward(const Params& p, cudaStream_t stream);
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
