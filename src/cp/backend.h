#pragma once
// The seam between context parallelism and the op's backends: what one rank does locally. The
// strategies (context_parallel.cpp, exchange.cpp, ulysses.cpp) and the local problem are written
// once against it; cpu/context_parallel.cpp and cuda/context_parallel.cu implement it.
//
// Buffers live in the backend's memory (host or device, the communicator's). Every operation is
// ordered like the communicator's calls: done on return on the host, enqueued on the
// communicator's stream on a device (the work of one rank runs on that one stream).

#include <cstddef>
#include <memory>

#include "gdn/communicator.h"
#include "gdn/delta_rule.h"
#include "gdn/tensor.h"

namespace gdn::cp {

// Backend memory, freed (stream-ordered on a device) when the last copy of the handle goes.
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::shared_ptr<void> memory, std::size_t bytes)
      : memory_(std::move(memory)), bytes_(bytes) {}
  void* data() const { return memory_.get(); }
  float* floats() const { return static_cast<float*>(memory_.get()); }
  std::size_t bytes() const { return bytes_; }
  // A [shape] tensor of `dtype` viewing the buffer.
  TensorRef view(DType dtype, std::vector<std::int64_t> shape) const {
    return {data(), dtype, std::move(shape)};
  }

 private:
  std::shared_ptr<void> memory_;
  std::size_t bytes_ = 0;
};

// Which rows of the rank's sequences carry states across its boundaries (cuda/stages.h).
struct Carried {
  bool enters = false;  // some segment continues a sequence from the previous rank
  bool leaves = false;  // some segment continues into the next rank
};

// The op on one rank's local problem (cp/local_problem.h), cut where the carried states enter.
// Inputs and buffers stay alive from the forward to the backward. The maps (AffineMaps' layout,
// one per chain and value head) are those of spec 4: forward, the state leaving the rank's last
// segment is M S + N for the state S entering it (M = 0 unless it also entered); backward, G in N
// is the gradient of the entering state from this rank alone.
class LocalOp {
 public:
  virtual ~LocalOp() = default;
  // Forward: the work that needs no entering state (h0 rows of entering sequences are zero),
  // the rank's map, then, with the entering states in h0, o and the final states.
  virtual void forward_summaries() = 0;
  virtual void forward_maps(float* maps) = 0;
  virtual void forward_output(const DeltaRuleOutputs& out) = 0;
  // Backward: likewise with the dht rows of leaving sequences (zero, then the carried gradients).
  virtual void backward_summaries(const DeltaRuleGrads& grads) = 0;
  virtual void backward_map(const DeltaRuleGrads& grads, float* maps) = 0;
  virtual void backward_output(const DeltaRuleGrads& grads) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Memory memory() const = 0;
  virtual Buffer allocate(std::size_t bytes) = 0;  // zero-filled
  // Copies within the backend's memory or from or to the host (cudaMemcpyDefault on a device).
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // `height` rows of `width` bytes, rows `dst_pitch` and `src_pitch` bytes apart, both in the
  // backend's memory.
  virtual void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                       std::size_t width, std::size_t height) = 0;
  // A host copy of a small tensor (cu_seqlens); a device backend waits for it.
  virtual HostTensor to_host(const TensorRef& t) = 0;
  // An f32 copy of a state tensor [N, HV, K, V] (empty when not given), and back into the user's
  // tensor in its own dtype.
  virtual Buffer load_states(const TensorRef& user) = 0;
  virtual void store_states(const Buffer& states, const TensorRef& user) = 0;

  // The map algebra of affine.h, [count] maps of K x K and K x V: y = M x + N;
  // out = second o first = (M2 M1, M2 N1 + N2); M <- M^T.
  virtual void apply(const float* maps, std::int64_t count, std::int64_t K, std::int64_t V,
                     const float* x, float* y) = 0;
  virtual void compose(const float* second, const float* first, std::int64_t count, std::int64_t K,
                       std::int64_t V, float* out) = 0;
  virtual void transpose_matrices(float* maps, std::int64_t count, std::int64_t K) = 0;

  // The op on `local` (its tensors in this backend's memory; cu_seqlens_host its host copy),
  // kept alive by the caller. save_for_backward: the forward keeps the per-chunk states.
  virtual std::unique_ptr<LocalOp> local_op(const DeltaRuleInputs& local,
                                            const TensorRef& cu_seqlens_host, Carried carried,
                                            bool save_for_backward) = 0;
  // The whole single-rank op (Ulysses' head shards).
  virtual void forward(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                       const DeltaRuleOutputs& out) = 0;
  virtual void backward(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                        const DeltaRuleGrads& grads) = 0;
};

std::unique_ptr<Backend> cpu_backend();

}  // namespace gdn::cp
