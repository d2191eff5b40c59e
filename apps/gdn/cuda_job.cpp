#include "cuda_job.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "gdn/cuda.h"
#include "gdn/error.h"

namespace gdn::app {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A device copy of a host tensor (empty stays empty), freed with it.
struct DeviceTensor {
  std::unique_ptr<void, decltype(&cudaFree)> memory{nullptr, cudaFree};
  TensorRef ref;

  explicit DeviceTensor(const HostTensor& host) {
    if (host.bytes.empty()) return;
    void* p = nullptr;
    check(cudaMalloc(&p, host.bytes.size()), "cudaMalloc");
    memory.reset(p);
    check(cudaMemcpy(p, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
          "cudaMemcpy to the device");
    ref = {p, host.dtype, host.shape};
  }
  void download(HostTensor& host) const {
    if (host.bytes.empty()) return;
    check(cudaMemcpy(host.bytes.data(), ref.data, host.bytes.size(), cudaMemcpyDeviceToHost),
          "cudaMemcpy to the host");
  }
};

// Milliseconds of `call` on the default stream, by CUDA events.
template <typename F>
double elapsed_ms(F&& call) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start), "cudaEventRecord");
  call();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace

ProblemResults run_on_cuda(const ProblemData& data, bool backward, CudaTimes& times) {
  const DeviceTensor q(data.q), k(data.k), v(data.v), g(data.g), beta(data.beta),
      h0(data.initial_state), cu(data.cu_seqlens), d_o(data.d_o), dht(data.d_final_state);
  DeltaRuleInputs in;
  in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
  in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
  in.scale = data.scale, in.use_qk_l2norm = data.use_qk_l2norm, in.chunk_size = data.chunk_size;

  ProblemResults results = allocate_results(data, data.q.dtype);
  results.final_state = HostTensor::zeros(DType::f32, results.final_state.shape);
  results.dg = HostTensor::zeros(DType::f32, results.dg.shape);
  results.dbeta = HostTensor::zeros(data.beta.dtype, results.dbeta.shape);
  if (!results.dh0.bytes.empty()) results.dh0 = HostTensor::zeros(DType::f32, results.dh0.shape);
  const DeviceTensor o(results.o), ht(results.final_state), dq(results.dq), dk(results.dk),
      dv(results.dv), dg(results.dg), dbeta(results.dbeta), dh0(results.dh0);

  // With a backward, the forward saves its states and the backward reads the forward's workspace
  // (the training path: nothing recomputed).
  CudaContext ctx, back;
  ctx.cu_seqlens_host = data.cu_seqlens.bytes.empty() ? TensorRef{} : data.cu_seqlens.ref();
  ctx.save_for_backward = back.save_for_backward = backward;
  ctx.workspace_bytes = delta_rule_forward_cuda_workspace(in, ctx.cu_seqlens_host, backward);
  back.cu_seqlens_host = ctx.cu_seqlens_host;
  back.workspace_bytes =
      backward ? delta_rule_backward_cuda_workspace(in, ctx.cu_seqlens_host, true, true) : 0;
  auto device_bytes = [](std::size_t bytes) {
    return DeviceTensor(HostTensor::zeros(DType::f32, {static_cast<std::int64_t>(bytes / 4 + 1)}));
  };
  const DeviceTensor workspace = device_bytes(ctx.workspace_bytes);
  const DeviceTensor backward_workspace = device_bytes(back.workspace_bytes);
  ctx.workspace = workspace.ref.data;
  back.workspace = backward_workspace.ref.data;
  back.forward_workspace = ctx.workspace;
  back.forward_workspace_bytes = ctx.workspace_bytes;

  const DeltaRuleOutputs out{o.ref, ht.ref};
  DeltaRuleGrads grads;
  grads.d_o = d_o.ref, grads.d_final_state = dht.ref, grads.dq = dq.ref, grads.dk = dk.ref;
  grads.dv = dv.ref, grads.dg = dg.ref, grads.dbeta = dbeta.ref, grads.dh0 = dh0.ref;
  for (int timed = 0; timed < 2; ++timed) {  // the first call of each warms up
    times.forward_ms = elapsed_ms([&] { delta_rule_forward_cuda(in, out, ctx); });
    if (backward)
      times.backward_ms = elapsed_ms([&] { delta_rule_backward_cuda(in, grads, back); });
  }
  check(cudaDeviceSynchronize(), "the CUDA op");
  for (auto [device, host] : {std::pair{&o, &results.o}, {&ht, &results.final_state}})
    device->download(*host);
  if (backward)
    for (auto [device, host] : {std::pair{&dq, &results.dq},
                                {&dk, &results.dk},
                                {&dv, &results.dv},
                                {&dg, &results.dg},
                                {&dbeta, &results.dbeta},
                                {&dh0, &results.dh0}})
      device->download(*host);
  return results;
}

}  // namespace gdn::app
