// P virtual ranks on one GPU (gdn/gpu_communicator.h): the in-process hub (comm/hub.h) with a
// device transport. Each rank has its own stream. put copies the bytes into a fresh device buffer
// on the sender's stream and records an event; take makes the receiver's stream wait for that
// event, copies out and frees the buffer there. So send never waits for the receiver (no
// deadlock in shifts) and nothing synchronizes the host.
#include <cuda_runtime.h>

#include "comm/hub.h"
#include "cuda/check.h"
#include "gdn/gpu_communicator.h"

namespace gdn {
namespace {

struct InFlight {
  void* data = nullptr;
  cudaEvent_t ready = nullptr;
  ~InFlight() {
    if (ready) cudaEventDestroy(ready);
  }
};

__global__ void sum_blocks_kernel(const float* blocks, int ranks, std::size_t count, float* out) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float sum = 0;
    for (int r = 0; r < ranks; ++r) sum += blocks[static_cast<std::size_t>(r) * count + i];
    out[i] = sum;
  }
}

class DeviceTransport final : public comm::Transport {
 public:
  DeviceTransport() { GDN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~DeviceTransport() override { cudaStreamDestroy(stream_); }

  comm::Message put(const void* data, std::size_t bytes) override {
    auto flight = std::make_shared<InFlight>();
    GDN_CUDA_CHECK(cudaMallocAsync(&flight->data, bytes ? bytes : 1, stream_));
    if (data && bytes)
      GDN_CUDA_CHECK(cudaMemcpyAsync(flight->data, data, bytes, cudaMemcpyDeviceToDevice, stream_));
    GDN_CUDA_CHECK(cudaEventCreateWithFlags(&flight->ready, cudaEventDisableTiming));
    GDN_CUDA_CHECK(cudaEventRecord(flight->ready, stream_));
    return {flight->data, bytes, flight};
  }

  void take(comm::Message& message, void* data) override {
    const auto* flight = static_cast<const InFlight*>(message.keep.get());
    GDN_CUDA_CHECK(cudaStreamWaitEvent(stream_, flight->ready));
    GDN_CUDA_CHECK(
        cudaMemcpyAsync(data, message.data, message.bytes, cudaMemcpyDeviceToDevice, stream_));
    GDN_CUDA_CHECK(cudaFreeAsync(message.data, stream_));
  }

  // blocks came from put(nullptr, ...) on this stream: freed here once summed.
  void sum_blocks(const float* blocks, int ranks, std::size_t count, float* out) override {
    if (count)
      sum_blocks_kernel<<<static_cast<unsigned>(std::min<std::size_t>((count + 255) / 256, 1024)),
                          256, 0, stream_>>>(blocks, ranks, count, out);
    GDN_CUDA_CHECK_LAUNCH();
    GDN_CUDA_CHECK(cudaFreeAsync(const_cast<float*>(blocks), stream_));
  }

  Memory memory() const override { return Memory::device; }
  CUstream_st* stream() const override { return stream_; }
  void synchronize() override { GDN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

void run_on_one_gpu(int ranks, const std::function<void(Communicator&)>& fn, Timeout timeout) {
  if (ranks < 1) throw Error(fmt::format("run_on_one_gpu: ranks must be >= 1, got {}", ranks));
  if (visible_gpus() == 0) throw Error("run_on_one_gpu: no CUDA device is visible");
  int device = 0;
  GDN_CUDA_CHECK(cudaGetDevice(&device));
  comm::run_ranks(
      ranks, timeout,
      [device](int) {
        GDN_CUDA_CHECK(cudaSetDevice(device));
        return std::make_unique<DeviceTransport>();
      },
      fn);
}

}  // namespace gdn
