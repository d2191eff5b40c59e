#pragma once
// The ranks of one context-parallel group and the few exchanges the strategies need. Every
// strategy is written once against this interface; implementations: in-process threads and MPI
// processes on host memory (here), NCCL and virtual ranks on one GPU on device memory
// (gdn/gpu_communicator.h).
//
// A host communicator's calls block until their data has arrived or been handed off. A device
// communicator's calls take device pointers and are ordered on its stream(): work enqueued there
// before a call is what it sends, work enqueued after it sees what it received; the call returns
// once enqueued, with no host synchronization. A peer that does not answer within the
// communicator's timeout makes a call (or synchronize()) throw gdn::Error naming both ranks,
// never hang.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

struct CUstream_st;  // cudaStream_t without the CUDA headers

namespace gdn {

enum class Memory { host, device };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The ranks of the group that run on this host, sharing its cores (the CPU cost model's
  // concern): all of them in-process, mpirun's local ranks for MPI.
  virtual int ranks_on_host() const { return 1; }

  virtual void send(const void* data, std::size_t bytes, int peer) = 0;
  virtual void recv(void* data, std::size_t bytes, int peer) = 0;
  // Sends to one peer and receives from another at once (no deadlock when every rank shifts).
  virtual void send_recv(const void* send_data, std::size_t send_bytes, int to, void* recv_data,
                         std::size_t recv_bytes, int from) = 0;
  // recv holds size() blocks of `bytes`: block r is rank r's send.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  // send holds size() blocks in rank order, block r (send_bytes[r]) going to rank r; recv gets
  // block r (recv_bytes[r]) from rank r, packed in rank order.
  virtual void all_to_all(const void* send, const std::vector<std::size_t>& send_bytes, void* recv,
                          const std::vector<std::size_t>& recv_bytes) = 0;
  // data[0, count) <- its sum over every rank, the same on every rank. Counted in bytes_sent()
  // as its all-gather equivalent: count * 4 bytes to each other rank.
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  virtual void barrier() = 0;

  // Where every call's buffers live, and for device communicators the stream that orders them.
  virtual Memory memory() const { return Memory::host; }
  virtual CUstream_st* stream() const { return nullptr; }
  // Waits until every call made so far has completed; throws gdn::Error if one failed or timed
  // out. Host communicators have nothing to wait for.
  virtual void synchronize() {}

  std::size_t bytes_sent() const { return bytes_sent_; }  // to other ranks, since construction

 protected:
  std::size_t bytes_sent_ = 0;
};

using Timeout = std::chrono::milliseconds;
constexpr Timeout kDefaultTimeout{60'000};

// Runs fn on `ranks` threads of this process, each with its own communicator; rethrows the
// first error any rank threw (after every rank has returned).
void run_in_process(int ranks, const std::function<void(Communicator&)>& fn,
                    Timeout timeout = kDefaultTimeout);

// All processes of MPI_COMM_WORLD. Initializes MPI if nobody has (and then finalizes it with the
// communicator); throws gdn::Error when gdn was built without MPI. After an error MPI's state is
// undefined: end the job (MPI_Abort) rather than go on.
std::unique_ptr<Communicator> mpi_world(Timeout timeout = kDefaultTimeout);

}  // namespace gdn
