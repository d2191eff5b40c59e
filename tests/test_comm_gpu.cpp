// Virtual ranks on one GPU: the device communicator's exchanges, checked by copying back, and
// its errors. Skipped without a GPU.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "gdn/error.h"
#include "gdn/gpu_communicator.h"

namespace gdn {
namespace {

class OneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (visible_gpus() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// A device copy of host floats, and back.
struct DeviceFloats {
  float* data = nullptr;
  std::size_t count;
  explicit DeviceFloats(const std::vector<float>& host) : count(host.size()) {
    EXPECT_EQ(cudaMalloc(&data, count * sizeof(float) + 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data); }
  std::vector<float> host(CUstream_st* stream) const {
    std::vector<float> out(count);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
};

std::vector<float> payload(int from, int to, std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), static_cast<float>(1000 * from + 100 * to));
  return v;
}

TEST_F(OneGpu, ShiftGatherAllToAllReduce) {
  for (int P : {1, 3, 4}) {
    run_on_one_gpu(P, [P](Communicator& comm) {
      EXPECT_EQ(comm.memory(), Memory::device);
      ASSERT_NE(comm.stream(), nullptr);
      const int r = comm.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
      constexpr std::size_t n = 1000;
      // Every rank shifts to the next at once: must not deadlock.
      DeviceFloats out(payload(r, next, n)), in(std::vector<float>(n, -1));
      comm.send_recv(out.data, n * 4, next, in.data, n * 4, prev);
      EXPECT_EQ(in.host(comm.stream()), payload(prev, r, n));
      // all_gather: block q is rank q's.
      DeviceFloats mine(payload(r, 0, n)), all(std::vector<float>(n * P, -1));
      comm.all_gather(mine.data, all.data, n * 4);
      std::vector<float> expect;
      for (int q = 0; q < P; ++q) {
        const auto b = payload(q, 0, n);
        expect.insert(expect.end(), b.begin(), b.end());
      }
      EXPECT_EQ(all.host(comm.stream()), expect);
      // all_to_all with sizes depending on both ranks: block for q has q + r + 1 floats.
      std::vector<float> send;
      std::vector<std::size_t> send_bytes, recv_bytes;
      for (int q = 0; q < P; ++q) {
        const auto b = payload(r, q, static_cast<std::size_t>(q + r + 1));
        send.insert(send.end(), b.begin(), b.end());
        send_bytes.push_back(b.size() * 4);
        recv_bytes.push_back(static_cast<std::size_t>(r + q + 1) * 4);
      }
      std::vector<float> expect_recv;
      for (int q = 0; q < P; ++q) {
        const auto b = payload(q, r, static_cast<std::size_t>(r + q + 1));
        expect_recv.insert(expect_recv.end(), b.begin(), b.end());
      }
      DeviceFloats s(send), rcv(std::vector<float>(expect_recv.size(), -1));
      comm.all_to_all(s.data, send_bytes, rcv.data, recv_bytes);
      EXPECT_EQ(rcv.host(comm.stream()), expect_recv);
      // all_reduce_sum of rank-dependent values.
      DeviceFloats sum(std::vector<float>(n, static_cast<float>(r + 1)));
      comm.all_reduce_sum(sum.data, n);
      EXPECT_EQ(sum.host(comm.stream()),
                std::vector<float>(n, static_cast<float>(P * (P + 1) / 2)));
      comm.barrier();
    });
  }
}

TEST_F(OneGpu, ErrorsNameTheRanks) {
  try {
    run_on_one_gpu(
        2,
        [](Communicator& comm) {
          DeviceFloats x(std::vector<float>(4, 0));
          if (comm.rank() == 0) comm.recv(x.data, 16, 1);  // rank 1 never sends
        },
        Timeout{300});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_on_one_gpu(0, [](Communicator&) {}), Error);
}

}  // namespace
}  // namespace gdn
