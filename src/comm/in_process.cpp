// The in-process communicator on host memory (comm/hub.h): a message is a copy of the bytes.

#include <cstring>

#include "comm/hub.h"

namespace gdn {
namespace {

class HostTransport final : public comm::Transport {
 public:
  comm::Message put(const void* data, std::size_t bytes) override {
    auto copy = std::make_shared<std::vector<std::byte>>(bytes);
    if (data && bytes) std::memcpy(copy->data(), data, bytes);
    return {copy->data(), bytes, copy};
  }
  void take(comm::Message& message, void* data) override {
    std::memcpy(data, message.data, message.bytes);
  }
  void sum_blocks(const float* blocks, int ranks, std::size_t count, float* out) override {
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int r = 0; r < ranks; ++r) sum += blocks[static_cast<std::size_t>(r) * count + i];
      out[i] = sum;
    }
  }
  Memory memory() const override { return Memory::host; }
  CUstream_st* stream() const override { return nullptr; }
  void synchronize() override {}
};

}  // namespace

void run_in_process(int ranks, const std::function<void(Communicator&)>& fn, Timeout timeout) {
  if (ranks < 1) throw Error(fmt::format("run_in_process: ranks must be >= 1, got {}", ranks));
  comm::run_ranks(
      ranks, timeout, [](int) { return std::make_unique<HostTransport>(); }, fn);
}

}  // namespace gdn
