// The NCCL communicator: its exchanges on device data (checked by copying back), its errors, and
// the faults it must survive: a stream held past the timeout and a peer that never joins (both on
// one GPU), a rank that throws and a peer that never sends (two GPUs or more). Skipped without a
// GPU.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl.h"
#include "gdn/error.h"
#include "gdn/gpu_communicator.h"

namespace gdn {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<std::uint8_t>;
using Clock = std::chrono::steady_clock;

int gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error
    return 0;
  }
  return count;
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpus() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// The message `from` sends `to`: random bytes seeded by the pair, of a size set by the pair.
Bytes payload(int from, int to, std::size_t bytes) {
  std::mt19937 rng(static_cast<unsigned>(from * 1000 + to));
  Bytes out(bytes);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}
std::size_t pair_bytes(int from, int to) {
  return 1000 + 37 * from + to;
}

// all_to_all's block sizes: uneven, some zero (but not a rank's block to itself on one rank).
std::size_t block_bytes(int from, int to) {
  return (from * 3 + to + 1) % 4 * 17;
}

// Bytes on the current device, put there and read back in the order of the communicator's stream.
class DeviceBytes {
 public:
  DeviceBytes(const Bytes& host, CUstream_st* stream) : size_(host.size()), stream_(stream) {
    EXPECT_EQ(cudaMalloc(&data_, size_ + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(data_, host.data(), size_, cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(data_); }

  void* data() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }

  // Waits for the communicator's calls (rethrowing their failure), then copies back.
  Bytes host(Communicator& comm) const {
    comm.synchronize();
    Bytes out(size_);
    EXPECT_EQ(cudaMemcpyAsync(out.data(), data_, size_, cudaMemcpyDeviceToHost, stream_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return out;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_;
  CUstream_st* stream_;
};

Bytes as_bytes(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return Bytes(p, p + v.size() * sizeof(float));
}

// Every exchange between the ranks, each against what the senders' payloads say it must deliver
// into a buffer filled with something else first.
void exchange_everything(Communicator& comm) {
  const int r = comm.rank(), P = comm.size(), next = (r + 1) % P, prev = (r + P - 1) % P;
  CUstream_st* stream = comm.stream();
  std::size_t sent = 0;
  const auto sending = [&](int to, std::size_t bytes) {
    if (to != r) sent += bytes;
  };

  // Every rank shifts to the next at once (to itself on one rank): must not deadlock.
  const Bytes shift = payload(r, next, pair_bytes(r, next));
  const Bytes shifted = payload(prev, r, pair_bytes(prev, r));
  DeviceBytes shift_out(shift, stream), shift_in(Bytes(shifted.size(), 0xEE), stream);
  comm.send_recv(shift_out.data(), shift.size(), next, shift_in.data(), shifted.size(), prev);
  sending(next, shift.size());
  EXPECT_EQ(shift_in.host(comm), shifted) << "send_recv on rank " << r;

  // Plain sends and receives along the ring, even ranks sending first, odd ones receiving first.
  // The source is overwritten right after the send (before the receive, on one rank), and the
  // message must still be what it held.
  const Bytes ring = payload(r, next, 333);
  DeviceBytes ring_out(ring, stream), ring_in(Bytes(333, 0xEE), stream);
  const auto send_ring = [&] {
    comm.send(ring_out.data(), ring.size(), next);
    ASSERT_EQ(cudaMemsetAsync(ring_out.data(), 0, ring.size(), stream), cudaSuccess);
  };
  const auto recv_ring = [&] { comm.recv(ring_in.data(), 333, prev); };
  if (r % 2 == 0) {
    send_ring();
    recv_ring();
  } else {
    recv_ring();
    send_ring();
  }
  sending(next, ring.size());
  EXPECT_EQ(ring_in.host(comm), payload(prev, r, 333)) << "send/recv on rank " << r;

  // all_gather: block q is rank q's.
  const Bytes mine = payload(r, -1, 777);
  Bytes gathered;
  for (int q = 0; q < P; ++q) {
    const Bytes b = payload(q, -1, 777);
    gathered.insert(gathered.end(), b.begin(), b.end());
  }
  DeviceBytes gather_in(mine, stream), gather_out(Bytes(gathered.size(), 0xEE), stream);
  comm.all_gather(gather_in.data(), gather_out.data(), mine.size());
  sent += mine.size() * static_cast<std::size_t>(P - 1);
  EXPECT_EQ(gather_out.host(comm), gathered) << "all_gather on rank " << r;

  // all_to_all with per-pair block sizes, some zero.
  Bytes send, expect;
  std::vector<std::size_t> send_bytes, recv_bytes;
  for (int q = 0; q < P; ++q) {
    const Bytes out = payload(r, q, block_bytes(r, q)), in = payload(q, r, block_bytes(q, r));
    send.insert(send.end(), out.begin(), out.end());
    expect.insert(expect.end(), in.begin(), in.end());
    send_bytes.push_back(out.size());
    recv_bytes.push_back(in.size());
    sending(q, out.size());
  }
  DeviceBytes a2a_in(send, stream), a2a_out(Bytes(expect.size(), 0xEE), stream);
  comm.all_to_all(a2a_in.data(), send_bytes, a2a_out.data(), recv_bytes);
  EXPECT_EQ(a2a_out.host(comm), expect) << "all_to_all on rank " << r;

  // all_reduce_sum of rank-dependent small integers: exact in floats.
  constexpr std::size_t n = 1000;
  std::vector<float> values(n), sums(n);
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = static_cast<float>(r + 1) + 2.0f * static_cast<float>(i);
    sums[i] = static_cast<float>(P * (P + 1) / 2) + 2.0f * static_cast<float>(P * i);
  }
  DeviceBytes reduced(as_bytes(values), stream);
  comm.all_reduce_sum(reduced.floats(), n);
  sent += n * sizeof(float) * static_cast<std::size_t>(P - 1);
  EXPECT_EQ(reduced.host(comm), as_bytes(sums)) << "all_reduce_sum on rank " << r;

  comm.barrier();
  EXPECT_EQ(comm.bytes_sent(), sent) << "rank " << r;
}

TEST_F(Nccl, OneRankExchangesWithItself) {
  run_nccl_local(1, [](Communicator& comm) {
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.memory(), Memory::device);
    ASSERT_NE(comm.stream(), nullptr);
    exchange_everything(comm);
    EXPECT_EQ(comm.bytes_sent(), 0u);
  });
}

TEST_F(Nccl, EveryGpuExchanges) {
  const int P = gpus();
  if (P < 2) GTEST_SKIP() << "needs two GPUs, " << P << " visible";
  run_nccl_local(P, [P](Communicator& comm) {
    EXPECT_EQ(comm.size(), P);
    int device = -1;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, comm.rank());
    exchange_everything(comm);
    EXPECT_GT(comm.bytes_sent(), 0u);
  });
}

// The error run_nccl_local throws, or "" if none.
std::string error_of(int ranks, const std::function<void(Communicator&)>& fn,
                     Timeout timeout = kDefaultTimeout) {
  try {
    run_nccl_local(ranks, fn, timeout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(Nccl, ArgumentErrorsNameTheRank) {
  EXPECT_EQ(error_of(1, [](Communicator& comm) { comm.send(nullptr, 0, 1); }),
            "rank 0: peer 1 is out of range [0, 1)");
  EXPECT_EQ(error_of(1, [](Communicator& comm) { comm.recv(nullptr, 0, -1); }),
            "rank 0: peer -1 is out of range [0, 1)");
  EXPECT_EQ(error_of(1, [](Communicator& comm) { comm.send_recv(nullptr, 0, 0, nullptr, 0, 2); }),
            "rank 0: peer 2 is out of range [0, 1)");
  EXPECT_EQ(error_of(1,
                     [](Communicator& comm) {
                       comm.all_to_all(nullptr, {0, 0}, nullptr, {0});
                     }),
            "rank 0: all_to_all send_bytes must hold 1 counts (one per rank), got 2");
  EXPECT_EQ(error_of(1, [](Communicator& comm) { comm.recv(nullptr, 4, 0); }),
            "rank 0: recv of 4 bytes from rank 0 failed: it has sent itself nothing");
  EXPECT_EQ(error_of(1,
                     [](Communicator& comm) {
                       DeviceBytes x(Bytes(8, 1), comm.stream());
                       comm.send(x.data(), 4, 0);
                       comm.recv(x.data(), 8, 0);
                     }),
            "rank 0: recv from rank 0 expected 8 bytes, got 4");
  const std::string P = std::to_string(gpus());
  for (int ranks : {0, gpus() + 1})
    EXPECT_EQ(error_of(ranks, [](Communicator&) {}), "run_nccl_local: ranks must be in [1, " + P +
                                                         "] (one per visible GPU), got " +
                                                         std::to_string(ranks));
}

// A stream the host holds up past the timeout: the operation does complete, after 2 s, but the
// watchdog has aborted the communicator by then, and synchronize() and every later call say so.
TEST_F(Nccl, AnOperationPastTheTimeoutAbortsTheCommunicator) {
  const std::string expected =
      "rank 0: NCCL all_reduce_sum of 1 floats did not complete within 500 ms; communicator "
      "aborted";
  std::string synchronized, later;
  const std::string error = error_of(
      1,
      [&](Communicator& comm) {
        DeviceBytes x(Bytes(4, 0), comm.stream());
        ASSERT_EQ(cudaLaunchHostFunc(
                      comm.stream(), [](void*) { std::this_thread::sleep_for(2s); }, nullptr),
                  cudaSuccess);
        const Clock::time_point start = Clock::now();
        comm.all_reduce_sum(x.floats(), 1);
        try {
          comm.synchronize();
        } catch (const Error& e) {
          synchronized = e.what();
        }
        // (ncclCommAbort itself waits for the host function: no upper bound to check here.)
        EXPECT_GE(Clock::now() - start, 500ms);
        try {
          comm.barrier();
        } catch (const Error& e) {
          later = e.what();
        }
      },
      500ms);
  EXPECT_EQ(synchronized, expected);
  EXPECT_EQ(later, expected);
  EXPECT_EQ(error, expected);
}

// Rank 0 of two whose rank 1 never comes: the init times out instead of hanging.
TEST_F(Nccl, APeerThatNeverJoinsTimesOutTheInit) {
  const Clock::time_point start = Clock::now();
  std::string error;
  try {
    nccl_rank_without_peers(2, 0, 1500ms);
  } catch (const Error& e) {
    error = e.what();
  }
  const auto elapsed = Clock::now() - start;
  EXPECT_NE(error.find("rank 0: NCCL init of 2 ranks timed out after 1500 ms"), std::string::npos)
      << error;
  EXPECT_GE(elapsed, 1500ms);
  EXPECT_LT(elapsed, 15s);
}

// A rank that throws aborts its peers at once: rank 1, waiting for a message rank 0 will never
// send, ends long before its timeout, and the error is rank 0's.
TEST_F(Nccl, ARankThatThrowsAbortsItsPeers) {
  if (gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  const Clock::time_point start = Clock::now();
  const std::string error = error_of(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 0) throw Error("rank 0 gives up");
        DeviceBytes x(Bytes(4, 0), comm.stream());
        comm.recv(x.data(), 4, 0);
        comm.synchronize();
      },
      60s);
  EXPECT_EQ(error, "rank 0 gives up");
  EXPECT_LT(Clock::now() - start, 30s);
}

// Rank 0 returns without sending: rank 1's receive times out and names both ranks.
TEST_F(Nccl, APeerThatNeverSendsTimesOut) {
  if (gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string error = error_of(
      2,
      [](Communicator& comm) {
        if (comm.rank() == 0) return;
        DeviceBytes x(Bytes(4, 0), comm.stream());
        comm.recv(x.data(), 4, 0);
        comm.synchronize();
      },
      1000ms);
  EXPECT_NE(error.find("rank 1: NCCL recv of 4 bytes from rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("1000 ms; communicator aborted"), std::string::npos) << error;
}

}  // namespace
}  // namespace gdn
