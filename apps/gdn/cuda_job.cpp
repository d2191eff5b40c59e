#include "cuda_job.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdn/cuda.h"
#include "gdn/error.h"
#include "gdn/gpu_communicator.h"

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

// Milliseconds of `call` on `stream` (the default one unless given), by CUDA events.
template <typename F>
double elapsed_ms(F&& call, cudaStream_t stream = nullptr) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  call();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// A problem's inputs and results on the device, results allocated in the CUDA path's dtypes.
struct DeviceProblem {
  const ProblemData& data;
  ProblemResults results;
  DeviceTensor q, k, v, g, beta, h0, cu, d_o, dht;
  DeviceTensor o, ht, dq, dk, dv, dg, dbeta, dh0;
  DeltaRuleInputs in;

  explicit DeviceProblem(const ProblemData& d)
      : data(d),
        results(cuda_results(d)),
        q(d.q),
        k(d.k),
        v(d.v),
        g(d.g),
        beta(d.beta),
        h0(d.initial_state),
        cu(d.cu_seqlens),
        d_o(d.d_o),
        dht(d.d_final_state),
        o(results.o),
        ht(results.final_state),
        dq(results.dq),
        dk(results.dk),
        dv(results.dv),
        dg(results.dg),
        dbeta(results.dbeta),
        dh0(results.dh0) {
    in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
    in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
    in.scale = d.scale, in.use_qk_l2norm = d.use_qk_l2norm, in.chunk_size = d.chunk_size;
  }
  static ProblemResults cuda_results(const ProblemData& d) {
    ProblemResults r = allocate_results(d, d.q.dtype);
    r.final_state = HostTensor::zeros(DType::f32, r.final_state.shape);
    r.dg = HostTensor::zeros(DType::f32, r.dg.shape);
    r.dbeta = HostTensor::zeros(d.beta.dtype, r.dbeta.shape);
    if (!r.dh0.bytes.empty()) r.dh0 = HostTensor::zeros(DType::f32, r.dh0.shape);
    return r;
  }
  DeltaRuleOutputs outputs() const { return {o.ref, ht.ref}; }
  DeltaRuleGrads grads() const {
    DeltaRuleGrads gr;
    gr.d_o = d_o.ref, gr.d_final_state = dht.ref, gr.dq = dq.ref, gr.dk = dk.ref;
    gr.dv = dv.ref, gr.dg = dg.ref, gr.dbeta = dbeta.ref, gr.dh0 = dh0.ref;
    return gr;
  }
  ProblemResults download(bool backward) {
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
};

}  // namespace

void require_cuda_gpu() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count < 1)
    throw Error(std::string("--device cuda: no CUDA GPU is visible (cudaGetDeviceCount: ") +
                (status == cudaSuccess ? "0 devices" : cudaGetErrorString(status)) + ")");
}

ProblemResults run_on_cuda(const ProblemData& data, bool backward, CudaTimes& times) {
  require_cuda_gpu();
  DeviceProblem d(data);
  const DeltaRuleInputs& in = d.in;

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

  const DeltaRuleOutputs out = d.outputs();
  const DeltaRuleGrads grads = d.grads();
  for (int timed = 0; timed < 2; ++timed) {  // the first call of each warms up
    times.forward_ms = elapsed_ms([&] { delta_rule_forward_cuda(in, out, ctx); });
    if (backward)
      times.backward_ms = elapsed_ms([&] { delta_rule_backward_cuda(in, grads, back); });
  }
  check(cudaDeviceSynchronize(), "the CUDA op");
  return d.download(backward);
}

bool one_gpu_per_rank(int ranks) {
  return ranks > 1 && visible_gpus() >= ranks;
}

namespace {

// One rank: its shard's results on the host (state rows it does not own are zero).
ProblemResults run_cp_rank(Communicator& comm, const ProblemData& data, const CpOptions& options,
                           bool backward, int runs, CudaTimes& times, Strategy& strategy) {
  const ProblemData shard = shard_of(data, comm.rank(), comm.size());
  DeviceProblem d(shard);
  const std::unique_ptr<CpDeltaRule> op = cuda_cp_delta_rule(comm, options);
  const auto stream = reinterpret_cast<cudaStream_t>(comm.stream());
  for (int run = 0; run < runs; ++run) {  // warm-ups first (the allocator's pool fills)
    comm.synchronize();
    const std::size_t sent = comm.bytes_sent();
    times.forward_ms = elapsed_ms([&] { op->forward(d.in, d.outputs()); }, stream);
    if (backward) times.backward_ms = elapsed_ms([&] { op->backward(d.in, d.grads()); }, stream);
    times.bytes_sent = comm.bytes_sent() - sent;
  }
  comm.synchronize();
  strategy = op->strategy();
  return d.download(backward);
}

}  // namespace

ProblemResults run_cp_on_cuda(const ProblemData& data, int ranks, Communicator* world,
                              const CpOptions& options, bool backward, int runs, Timeout timeout,
                              CpStats& stats) {
  require_cuda_gpu();
  stats = {};
  if (world) {
    const std::unique_ptr<Communicator> nccl = nccl_world(timeout);
    CudaTimes times;
    ProblemResults mine = run_cp_rank(*nccl, data, options, backward, runs, times, stats.strategy);
    stats.forward_seconds = slowest(*world, times.forward_ms * 1e-3);
    stats.total_seconds = slowest(*world, (times.forward_ms + times.backward_ms) * 1e-3);
    stats.bytes_sent =
        static_cast<std::size_t>(slowest(*world, static_cast<double>(times.bytes_sent)));
    return gather(*world, data, mine);
  }
  ProblemResults whole;
  std::mutex mutex;
  const auto rank = [&](Communicator& comm) {
    CudaTimes times;
    Strategy used;
    ProblemResults mine = run_cp_rank(comm, data, options, backward, runs, times, used);
    const std::lock_guard lock(mutex);
    if (whole.o.bytes.empty()) {
      whole = mine;  // the shapes and dtypes: tokens times the ranks, states summed over them
      for (HostTensor* t : {&whole.o, &whole.dq, &whole.dk, &whole.dv, &whole.dg, &whole.dbeta}) {
        if (t->bytes.empty()) continue;
        t->shape[1] *= ranks;
        t->bytes.resize(t->bytes.size() * static_cast<std::size_t>(ranks));
      }
      for (HostTensor* t : {&whole.final_state, &whole.dh0})
        std::fill(t->bytes.begin(), t->bytes.end(), std::byte{0});
    }
    gather_shard(mine, comm.rank(), whole);
    stats.strategy = used;
    stats.forward_seconds = std::max(stats.forward_seconds, times.forward_ms * 1e-3);
    stats.total_seconds =
        std::max(stats.total_seconds, (times.forward_ms + times.backward_ms) * 1e-3);
    stats.bytes_sent = std::max(stats.bytes_sent, times.bytes_sent);
  };
  if (one_gpu_per_rank(ranks))
    run_nccl_local(ranks, rank, timeout);
  else
    run_on_one_gpu(ranks, rank, timeout);
  return whole;
}

}  // namespace gdn::app
