#pragma once
// The CUDA op cut where carried states enter, for context parallelism (cuda/context_parallel.cu);
// gdn/cuda.h's entry points run the stages back to back with nothing carried. Arguments as in
// gdn/cuda.h; every stage of one call gets the same inputs, context and Carried.
//
// forward:  forward_summaries (chunk prep and the segment summaries, none of which reads h0 rows
//           of entering sequences: those must be zero), [forward_maps], then, with the carried
//           states in those h0 rows, forward_output.
// backward: backward_summaries (the forward's states and the gradient summaries, with the dht
//           rows of leaving sequences zero), [backward_map], then, with the carried gradients in
//           those dht rows, backward_output.

#include <cstddef>

#include "gdn/cuda.h"

namespace gdn::cuda {

struct Carried {
  bool enters = false, leaves = false;  // Params::enters, leaves
  float* map_M = nullptr;               // [chains, HV, K, K]: forward_maps writes M
  float* map_N = nullptr;               // [chains, HV, K, V]: forward_maps writes N, backward_map G
};

std::size_t forward_workspace_bytes(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                                    bool save, const Carried& carried);
std::size_t backward_workspace_bytes(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                                     bool reuse, bool save, const Carried& carried);

void forward_summaries(const DeltaRuleInputs& in, const CudaContext& ctx, const Carried& carried);
void forward_maps(const DeltaRuleInputs& in, const CudaContext& ctx, const Carried& carried);
void forward_output(const DeltaRuleInputs& in, const DeltaRuleOutputs& out, const CudaContext& ctx,
                    const Carried& carried);
void backward_summaries(const DeltaRuleInputs& in, const DeltaRuleGrads& grads,
                        const CudaContext& ctx, const Carried& carried);
void backward_map(const DeltaRuleInputs& in, const DeltaRuleGrads& grads, const CudaContext& ctx,
                  const Carried& carried);
void backward_output(const DeltaRuleInputs& in, const DeltaRuleGrads& grads, const CudaContext& ctx,
                     const Carried& carried);

}  // namespace gdn::cuda
