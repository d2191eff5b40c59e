#pragma once
// The gated delta rule on an NVIDIA Hopper GPU (sm_90a): forward and backward on device pointers.
//
// Same DeltaRuleInputs / DeltaRuleOutputs / DeltaRuleGrads as the CPU path, with every tensor's
// data in device memory. Supported: q, k, v (and beta) in bf16 or f16, beta also f32, g f32,
// states f32, K = V = 128, chunk_size 64, grouped heads, in-kernel l2norm, varlen.
// The library never allocates, never synchronizes and runs everything on `stream`: the caller
// gives a device workspace of at least the queried size (256-byte aligned). Every entry point
// checks that the current device is sm_90 (once per device) and throws gdn::Error otherwise.
// The backward's gradients are deterministic: bitwise the same for the same inputs, run to run.

#include <cstddef>

#include <memory>

#include "gdn/communicator.h"
#include "gdn/context_parallel.h"
#include "gdn/delta_rule.h"

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace gdn {

struct CudaContext {
  CUstream_st* stream = nullptr;  // nullptr: the legacy default stream
  void* workspace = nullptr;      // device memory, >= the queried bytes
  std::size_t workspace_bytes = 0;
  // With varlen, optional: a host copy of inputs.cu_seqlens ([N + 1], i32 or i64). With it the
  // offsets are validated and the workspace sized to the chunks they make; without it the
  // workspace is sized from shapes alone (an upper bound; no host read, graph-safe) and the
  // offsets are trusted to be valid (0, strictly increasing, ending at T).
  TensorRef cu_seqlens_host;
  // Backward only, optional: the workspace of the forward of these same inputs, as that forward
  // left it. The backward then reads the forward's intermediates instead of recomputing them
  // (and never writes there), and needs only the workspace queried with reuse_forward = true.
  // The forward writes a header there (its shapes, options, segments, device, and the offsets
  // it read); the backward compares it with its own on the device, and on a mismatch computes
  // nothing, sets its gradients to NaN and leaves a gdn::Error for the host, thrown by the next
  // forward or backward call, or by cuda_check_deferred_errors (no synchronization in a call).
  const void* forward_workspace = nullptr;
  std::size_t forward_workspace_bytes = 0;
  // Forward: also keep the per-chunk states and Vn in the workspace (a training forward; query
  // its size with save_for_backward = true). Backward: forward_workspace is such a forward's,
  // and the backward reads them there instead of recomputing them (query reuse_forward = true
  // and save_for_backward = true).
  bool save_for_backward = false;
};

// Workspace bytes for a forward or a backward of these inputs on the current device (shapes and
// the device's multiprocessor count only; data is not read, except cu_seqlens_host when given).
std::size_t delta_rule_forward_cuda_workspace(const DeltaRuleInputs& in,
                                              const TensorRef& cu_seqlens_host = {},
                                              bool save_for_backward = false);
std::size_t delta_rule_backward_cuda_workspace(const DeltaRuleInputs& in,
                                               const TensorRef& cu_seqlens_host = {},
                                               bool reuse_forward = false,
                                               bool save_for_backward = false);

// o (and final_state when given) from the inputs. Throws gdn::Error naming a bad argument.
void delta_rule_forward_cuda(const DeltaRuleInputs& in, const DeltaRuleOutputs& out,
                             const CudaContext& ctx);
// Every gradient; recomputes the forward's intermediates in the workspace unless
// ctx.forward_workspace holds them (and the per-chunk states unless it was saved for backward).
void delta_rule_backward_cuda(const DeltaRuleInputs& in, const DeltaRuleGrads& grads,
                              const CudaContext& ctx);

// Throws the gdn::Error that a device-side check of an earlier call left (today: a backward
// handed a forward_workspace that is not its inputs' forward's), once; nothing if none did.
// Reads host memory only, so it sees what the device has done by now: synchronize with the
// stream first to learn about the calls enqueued on it. Every forward and backward calls it
// first.
void cuda_check_deferred_errors();

// Context parallelism on CUDA (gdn/context_parallel.h): every rank's tensors in device memory,
// with the dtypes above, and its work on comm.stream() (a device communicator,
// gdn/gpu_communicator.h), without host synchronization (except to read cu_seqlens, and once
// per shard length to check that every rank holds the same). Buffers come from CUDA's
// stream-ordered allocator.
std::unique_ptr<CpDeltaRule> cuda_cp_delta_rule(Communicator& comm, CpOptions options = {});

}  // namespace gdn
