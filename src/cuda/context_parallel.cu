// The CUDA side of the context-parallel seam (cp/backend.h): device memory from the
// stream-ordered allocator, copies and the map algebra (affine.cu) on the communicator's stream,
// and the op cut into the stages of cuda/stages.h.
#include <fmt/format.h>

#include "cp/backend.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/stages.h"
#include "gdn/context_parallel.h"
#include "gdn/cuda.h"
#include "gdn/error.h"

namespace gdn {
namespace {

using cp::Buffer;

class CudaBackend;

class CudaLocalOp final : public cp::LocalOp {
 public:
  CudaLocalOp(CudaBackend& backend, const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
              cp::Carried carried, bool save);

  void forward_summaries() override;
  void forward_maps(float* maps) override;
  void forward_output(const DeltaRuleOutputs& out) override;
  void backward_summaries(const DeltaRuleGrads& grads) override;
  void backward_map(const DeltaRuleGrads& grads, float* maps) override;
  void backward_output(const DeltaRuleGrads& grads) override;

 private:
  CudaContext forward_context() const;
  CudaContext backward_context() const;
  cuda::Carried carried(float* maps = nullptr) const;

  CudaBackend& backend_;
  DeltaRuleInputs in_;
  TensorRef cu_seqlens_host_;
  cp::Carried carried_;
  bool save_;
  std::int64_t count_ = 0;  // maps: chains * HV
  Buffer forward_workspace_, backward_workspace_;
};

class CudaBackend final : public cp::Backend {
 public:
  explicit CudaBackend(cudaStream_t stream) : stream_(stream) {}

  cudaStream_t stream() const { return stream_; }

  Memory memory() const override { return Memory::device; }

  // Uninitialized device memory, freed in stream order.
  Buffer raw(std::size_t bytes) {
    void* p = nullptr;
    GDN_CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, stream_));
    const cudaStream_t stream = stream_;
    return {std::shared_ptr<void>(p, [stream](void* q) { cudaFreeAsync(q, stream); }), bytes};
  }
  Buffer allocate(std::size_t bytes) override {
    Buffer b = raw(bytes);
    GDN_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, bytes, stream_));
    return b;
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) GDN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  // Both buffers on the device (Ulysses' packing): a copy kernel.
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t height) override {
    cuda::launch_copy_2d(dst, dst_pitch, src, src_pitch, width, height, stream_);
  }
  HostTensor to_host(const TensorRef& t) override {
    HostTensor h = HostTensor::zeros(t.dtype, t.shape);
    copy(h.bytes.data(), t.data, h.bytes.size());
    GDN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  // The user's f32 states, read in place.
  Buffer load_states(const TensorRef& user) override {
    if (!user.given()) return {};
    require_f32(user, "states");
    return {std::shared_ptr<void>(user.data, [](void*) {}),
            static_cast<std::size_t>(user.numel()) * 4};
  }
  void store_states(const Buffer& states, const TensorRef& user) override {
    if (!user.given()) return;
    require_f32(user, "states");
    copy(user.data, states.data(), static_cast<std::size_t>(user.numel()) * 4);
  }

  void apply(const float* maps, std::int64_t count, std::int64_t K, std::int64_t V, const float* x,
             float* y) override {
    require_128(K, V);
    cuda::launch_affine(static_cast<int>(count), maps, x, maps + count * K * K, y, stream_);
  }
  void compose(const float* second, const float* first, std::int64_t count, std::int64_t K,
               std::int64_t V, float* out) override {
    require_128(K, V);
    const std::int64_t offsets = count * K * K;
    const int n = static_cast<int>(count);
    cuda::launch_affine(n, second, first, nullptr, out, stream_);
    cuda::launch_affine(n, second, first + offsets, second + offsets, out + offsets, stream_);
  }
  void transpose_matrices(float* maps, std::int64_t count, std::int64_t K) override {
    require_128(K, K);
    cuda::launch_transpose(static_cast<int>(count), maps, stream_);
  }

  std::unique_ptr<cp::LocalOp> local_op(const DeltaRuleInputs& local,
                                        const TensorRef& cu_seqlens_host, cp::Carried carried,
                                        bool save_for_backward) override {
    return std::make_unique<CudaLocalOp>(*this, local, cu_seqlens_host, carried, save_for_backward);
  }
  void forward(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
               const DeltaRuleOutputs& out) override {
    const Buffer workspace = raw(delta_rule_forward_cuda_workspace(in, cu_seqlens_host));
    CudaContext ctx{stream_, workspace.data(), workspace.bytes(), cu_seqlens_host};
    delta_rule_forward_cuda(in, out, ctx);
  }
  void backward(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                const DeltaRuleGrads& grads) override {
    const Buffer workspace = raw(delta_rule_backward_cuda_workspace(in, cu_seqlens_host));
    CudaContext ctx{stream_, workspace.data(), workspace.bytes(), cu_seqlens_host};
    delta_rule_backward_cuda(in, grads, ctx);
  }

 private:
  static void require_f32(const TensorRef& t, const char* what) {
    if (t.dtype != DType::f32)
      throw Error(fmt::format("{} must be f32 on CUDA, got {}", what, dtype_name(t.dtype)));
  }
  static void require_128(std::int64_t K, std::int64_t V) {
    if (K != 128 || V != 128)
      throw Error(fmt::format("K and V must be 128 on CUDA, got K = {}, V = {}", K, V));
  }

  cudaStream_t stream_;
};

CudaLocalOp::CudaLocalOp(CudaBackend& backend, const DeltaRuleInputs& in,
                         const TensorRef& cu_seqlens_host, cp::Carried carried, bool save)
    : backend_(backend),
      in_(in),
      cu_seqlens_host_(cu_seqlens_host),
      carried_(carried),
      save_(save),
      count_((in.cu_seqlens.given() ? 1 : in.q.shape.at(0)) * in.v.shape.at(2)) {}

cuda::Carried CudaLocalOp::carried(float* maps) const {
  const std::int64_t K = in_.q.shape.at(3);  // the maps' M block is [count, K, K]
  return {carried_.enters, carried_.leaves, maps, maps ? maps + count_ * K * K : nullptr};
}

CudaContext CudaLocalOp::forward_context() const {
  CudaContext ctx{backend_.stream(), forward_workspace_.data(), forward_workspace_.bytes(),
                  cu_seqlens_host_};
  ctx.save_for_backward = save_;
  return ctx;
}

CudaContext CudaLocalOp::backward_context() const {
  CudaContext ctx{backend_.stream(), backward_workspace_.data(), backward_workspace_.bytes(),
                  cu_seqlens_host_};
  ctx.forward_workspace = forward_workspace_.data();
  ctx.forward_workspace_bytes = forward_workspace_.bytes();
  ctx.save_for_backward = save_;
  return ctx;
}

void CudaLocalOp::forward_summaries() {
  forward_workspace_ =
      backend_.raw(cuda::forward_workspace_bytes(in_, cu_seqlens_host_, save_, carried()));
  cuda::forward_summaries(in_, forward_context(), carried());
}

void CudaLocalOp::forward_maps(float* maps) {
  cuda::forward_maps(in_, forward_context(), carried(maps));
}

void CudaLocalOp::forward_output(const DeltaRuleOutputs& out) {
  cuda::forward_output(in_, out, forward_context(), carried());
}

void CudaLocalOp::backward_summaries(const DeltaRuleGrads& grads) {
  backward_workspace_ =
      backend_.raw(cuda::backward_workspace_bytes(in_, cu_seqlens_host_, true, save_, carried()));
  cuda::backward_summaries(in_, grads, backward_context(), carried());
}

void CudaLocalOp::backward_map(const DeltaRuleGrads& grads, float* maps) {
  cuda::backward_map(in_, grads, backward_context(), carried(maps));
}

void CudaLocalOp::backward_output(const DeltaRuleGrads& grads) {
  cuda::backward_output(in_, grads, backward_context(), carried());
}

}  // namespace

std::unique_ptr<CpDeltaRule> cuda_cp_delta_rule(Communicator& comm, CpOptions options) {
  if (comm.memory() != Memory::device)
    throw Error(
        "cuda_cp_delta_rule: the communicator must be a device one (gdn/gpu_communicator.h: "
        "run_on_one_gpu, run_nccl_local, nccl_world)");
  return std::make_unique<CpDeltaRule>(
      comm, std::make_unique<CudaBackend>(reinterpret_cast<cudaStream_t>(comm.stream())), options);
}

}  // namespace gdn
