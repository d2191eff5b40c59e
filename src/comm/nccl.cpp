// The NCCL communicator (gdn/gpu_communicator.h): one rank per GPU, a device communicator as
// gdn/communicator.h describes, every call enqueued on the communicator's own stream.
//
// NCCL itself waits for a missing peer forever, so nothing here blocks inside NCCL. The
// communicator is non-blocking (ncclConfig_t::blocking = 0): its init and every group of calls
// finish in NCCL's background threads while we poll ncclCommGetAsyncError against a deadline.
// Each call then records a CUDA event after its work on the stream. A watchdog thread polls the
// oldest pending event and NCCL's asynchronous error: an operation still pending `timeout` after
// it became the oldest, or an NCCL error, makes it abort the communicator (ncclCommAbort stops its
// kernels) and record why. Every later call, and synchronize(), throws that message. One mutex
// orders the rank's thread, the watchdog and (in run_nccl_local) the other ranks around the
// ncclComm_t, which NCCL does not make thread-safe; polls let go of it between tries.
//
// A rank's messages to itself never reach NCCL (a lone self-send would wait for its receive):
// send copies the bytes into a fresh device buffer, recv copies them out, like a host mailbox.

#include <cuda_runtime.h>
#include <nccl.h>
#ifdef GDN_NCCL_MPI
#include <mpi.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/message_of.h"
#include "comm/nccl.h"
#include "cuda/check.h"
#include "gdn/error.h"
#include "gdn/gpu_communicator.h"

namespace gdn {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kWatchInterval{1};  // how often the watchdog looks

// NCCL's name for a status, with its last error message when it has one.
std::string nccl_error(ncclResult_t status) {
  const std::string last = ncclGetLastError(nullptr);
  if (last.empty()) return ncclGetErrorString(status);
  return fmt::format("{}: {}", ncclGetErrorString(status), last);
}

// The NCCL error-check family, for calls outside a communicator: expression, file and line.
void check_nccl(ncclResult_t status, const char* expression, const char* file, int line) {
  if (status != ncclSuccess)
    throw Error(fmt::format("{} failed at {}:{}: {}", expression, file, line, nccl_error(status)));
}
#define GDN_NCCL_CHECK(expr) check_nccl((expr), #expr, __FILE__, __LINE__)

// " with rank 1", " with ranks 0, 2": the peers an operation waits for, for its errors.
std::string with_peers(const std::vector<int>& peers) {
  if (peers.empty()) return "";
  if (peers.size() == 1) return fmt::format(" with rank {}", peers[0]);
  return fmt::format(" with ranks {}", fmt::join(peers, ", "));
}

// As with mpi_world, MPI ends with the communicator if nccl_world started it, unless a failure may
// have left a peer that MPI_Finalize would wait for.
void end_mpi([[maybe_unused]] bool failed) {
#ifdef GDN_NCCL_MPI
  if (!failed) MPI_Finalize();
#endif
}

class Nccl final : public Communicator {
 public:
  Nccl(const ncclUniqueId& id, int rank, int ranks, int device, Timeout timeout)
      : rank_(rank), size_(ranks), timeout_(timeout) {
    try {
      GDN_CUDA_CHECK(cudaSetDevice(device));
      GDN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      GDN_CUDA_CHECK(cudaMallocAsync(&token_, sizeof(float), stream_));
      GDN_CUDA_CHECK(cudaMemsetAsync(token_, 0, sizeof(float), stream_));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const std::string what = fmt::format("init of {} ranks", ranks);
      std::unique_lock lock(mutex_);
      check(ncclCommInitRankConfig(&comm_, ranks, id, rank, &config), what);
      wait_ready(lock, what);
      watchdog_ = std::thread([this, device] { watch(device); });
    } catch (...) {
      release();  // a failed init has aborted the communicator already
      throw;
    }
  }

  // Lets the operations in flight finish (or time out and abort), so that destroying neither
  // hangs on a lost peer nor pulls the buffers from under a healthy one.
  ~Nccl() override {
    {
      std::unique_lock lock(mutex_);
      settle(lock);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    release();
    if (owns_mpi) end_mpi(!failure_.empty());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Memory memory() const override { return Memory::device; }
  CUstream_st* stream() const override { return stream_; }

  void send(const void* data, std::size_t bytes, int peer) override {
    check_peer(peer);
    if (peer == rank_) return send_to_self(data, bytes);
    group(fmt::format("send of {} bytes to rank {}", bytes, peer),
          [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
    bytes_sent_ += bytes;
  }

  void recv(void* data, std::size_t bytes, int peer) override {
    check_peer(peer);
    if (peer == rank_) return recv_from_self(data, bytes);
    group(fmt::format("recv of {} bytes from rank {}", bytes, peer),
          [&] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }

  // One group, so that NCCL progresses both at once: every rank may shift without deadlock.
  void send_recv(const void* send_data, std::size_t send_bytes, int to, void* recv_data,
                 std::size_t recv_bytes, int from) override {
    check_peer(to);
    check_peer(from);
    if (to == rank_ || from == rank_) {  // the part with itself is a local copy: no wait
      send(send_data, send_bytes, to);
      recv(recv_data, recv_bytes, from);
      return;
    }
    group(fmt::format("send_recv of {} bytes to rank {} and {} bytes from rank {}", send_bytes, to,
                      recv_bytes, from),
          [&] {
            ncclResult_t status = ncclSend(send_data, send_bytes, ncclUint8, to, comm_, stream_);
            if (status == ncclSuccess)
              status = ncclRecv(recv_data, recv_bytes, ncclUint8, from, comm_, stream_);
            return status;
          });
    bytes_sent_ += send_bytes;
  }

  void all_gather(const void* send_data, void* recv_data, std::size_t bytes) override {
    group(fmt::format("all_gather of {} bytes per rank{}", bytes, with_peers(others())),
          [&] { return ncclAllGather(send_data, recv_data, bytes, ncclUint8, comm_, stream_); });
    bytes_sent_ += bytes * static_cast<std::size_t>(size_ - 1);
  }

  // Grouped sends and receives with every peer whose block is not empty; the block to itself is
  // a device copy.
  void all_to_all(const void* send_data, const std::vector<std::size_t>& send_bytes,
                  void* recv_data, const std::vector<std::size_t>& recv_bytes) override {
    check_counts(send_bytes, "send_bytes");
    check_counts(recv_bytes, "recv_bytes");
    const auto* in = static_cast<const std::byte*>(send_data);
    auto* out = static_cast<std::byte*>(recv_data);
    std::vector<std::size_t> send_at(size_ + 1, 0), recv_at(size_ + 1, 0);  // block offsets
    std::vector<int> peers;
    for (int r = 0; r < size_; ++r) {
      send_at[r + 1] = send_at[r] + send_bytes[r];
      recv_at[r + 1] = recv_at[r] + recv_bytes[r];
      if (r != rank_ && (send_bytes[r] || recv_bytes[r])) peers.push_back(r);
    }
    if (send_bytes[rank_] != recv_bytes[rank_])
      throw Error(fmt::format("rank {}: recv from rank {} expected {} bytes, got {}", rank_, rank_,
                              recv_bytes[rank_], send_bytes[rank_]));
    if (send_bytes[rank_])
      local("all_to_all copy to itself", [&] {
        GDN_CUDA_CHECK(cudaMemcpyAsync(out + recv_at[rank_], in + send_at[rank_], send_bytes[rank_],
                                       cudaMemcpyDeviceToDevice, stream_));
      });
    if (!peers.empty())
      group(fmt::format("all_to_all{}", with_peers(peers)), [&] {
        ncclResult_t status = ncclSuccess;
        for (int r : peers) {
          if (status == ncclSuccess && send_bytes[r])
            status = ncclSend(in + send_at[r], send_bytes[r], ncclUint8, r, comm_, stream_);
          if (status == ncclSuccess && recv_bytes[r])
            status = ncclRecv(out + recv_at[r], recv_bytes[r], ncclUint8, r, comm_, stream_);
        }
        return status;
      });
    for (int r : peers) bytes_sent_ += send_bytes[r];
  }

  void all_reduce_sum(float* data, std::size_t count) override {
    group(fmt::format("all_reduce_sum of {} floats{}", count, with_peers(others())),
          [&] { return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_); });
    bytes_sent_ += count * sizeof(float) * static_cast<std::size_t>(size_ - 1);
  }

  // A one-float all-reduce that every rank must join, then waiting for it.
  void barrier() override {
    group(fmt::format("barrier{}", with_peers(others())),
          [&] { return ncclAllReduce(token_, token_, 1, ncclFloat, ncclSum, comm_, stream_); });
    synchronize();
  }

  void synchronize() override {
    std::unique_lock lock(mutex_);
    settle(lock);
    throw_if_failed();
  }

  // Aborts the communicator from any thread (run_nccl_local, when another rank failed): `why`
  // becomes every later call's error.
  void abort(std::string why) {
    std::lock_guard lock(mutex_);
    abort_locked(std::move(why));
  }

  bool owns_mpi = false;  // nccl_world initialized MPI: it ends with the communicator

 private:
  struct Pending {
    cudaEvent_t done;
    std::string what;
    Clock::time_point since;  // enqueued, or when the one before it completed if later
  };

  struct Staged {  // a message to itself
    void* data;
    std::size_t bytes;
  };

  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_)
      throw Error(fmt::format("rank {}: peer {} is out of range [0, {})", rank_, peer, size_));
  }

  void check_counts(const std::vector<std::size_t>& counts, const char* name) const {
    if (counts.size() != static_cast<std::size_t>(size_))
      throw Error(fmt::format("rank {}: all_to_all {} must hold {} counts (one per rank), got {}",
                              rank_, name, size_, counts.size()));
  }

  std::vector<int> others() const {
    std::vector<int> peers;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) peers.push_back(r);
    return peers;
  }

  void send_to_self(const void* data, std::size_t bytes) {
    local(fmt::format("send of {} bytes to itself", bytes), [&] {
      Staged message{nullptr, bytes};
      GDN_CUDA_CHECK(cudaMallocAsync(&message.data, std::max<std::size_t>(bytes, 1), stream_));
      to_self_.push_back(message);
      GDN_CUDA_CHECK(cudaMemcpyAsync(message.data, data, bytes, cudaMemcpyDeviceToDevice, stream_));
    });
  }

  void recv_from_self(void* data, std::size_t bytes) {
    local(fmt::format("recv of {} bytes from itself", bytes), [&] {
      if (to_self_.empty())
        throw Error(
            fmt::format("rank {}: recv of {} bytes from rank {} failed: it has sent itself "
                        "nothing",
                        rank_, bytes, rank_));
      const Staged message = to_self_.front();
      to_self_.pop_front();
      if (message.bytes == bytes)
        GDN_CUDA_CHECK(
            cudaMemcpyAsync(data, message.data, bytes, cudaMemcpyDeviceToDevice, stream_));
      GDN_CUDA_CHECK(cudaFreeAsync(message.data, stream_));
      if (message.bytes != bytes)
        throw Error(fmt::format("rank {}: recv from rank {} expected {} bytes, got {}", rank_,
                                rank_, bytes, message.bytes));
    });
  }

  // Enqueues work() that needs no peer, and its event.
  template <class Work>
  void local(std::string what, Work work) {
    std::lock_guard lock(mutex_);
    throw_if_failed();
    work();
    record(std::move(what));
  }

  // Enqueues calls() (NCCL calls returning the first failure) as one NCCL group, waits until
  // NCCL has put it on the stream, and records its event; `what` names it and its peers.
  template <class Calls>
  void group(std::string what, Calls calls) {
    std::unique_lock lock(mutex_);
    throw_if_failed();
    check(ncclGroupStart(), what);
    const ncclResult_t issued = calls();
    const ncclResult_t ended = ncclGroupEnd();
    check(issued, what);
    check(ended, what);
    wait_ready(lock, what);
    record(std::move(what));
  }

  // ncclInProgress is no failure: a non-blocking call goes on in the background (wait_ready).
  void check(ncclResult_t status, const std::string& what) {
    if (status != ncclSuccess && status != ncclInProgress)
      fail(fmt::format("rank {}: NCCL {} failed: {}; communicator aborted", rank_, what,
                       nccl_error(status)));
  }

  // Polls until NCCL has finished the last call in the background (the communicator answers
  // ncclInProgress until then), letting go of the lock between polls so that the watchdog or a
  // failed rank can abort meanwhile.
  void wait_ready(std::unique_lock<std::mutex>& lock, const std::string& what) {
    const Clock::time_point end = Clock::now() + timeout_;
    for (;;) {
      throw_if_failed();
      ncclResult_t state = ncclSuccess;
      const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
      check(status, what);
      if (state == ncclSuccess) return;
      check(state, what);
      if (Clock::now() > end)
        fail(fmt::format("rank {}: NCCL {} timed out after {} ms; communicator aborted", rank_,
                         what, timeout_.count()));
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }

  // Records an event after the work just enqueued, from the pool when one is free.
  void record(std::string what) {
    cudaEvent_t done = nullptr;
    if (free_events_.empty()) {
      GDN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = free_events_.back();
      free_events_.pop_back();
    }
    pending_.push_back({done, std::move(what), Clock::now()});
    GDN_CUDA_CHECK(cudaEventRecord(done, stream_));
  }

  // Retires the completed operations, oldest first; aborts the communicator when NCCL reports an
  // error or the oldest has been pending for the timeout. Under the lock.
  void poll() {
    if (!failure_.empty()) return;
    while (!pending_.empty()) {
      const cudaError_t done = cudaEventQuery(pending_.front().done);
      if (done == cudaErrorNotReady) break;
      if (done != cudaSuccess)
        return abort_locked(fmt::format("rank {}: NCCL {} failed: {}; communicator aborted", rank_,
                                        pending_.front().what, cudaGetErrorString(done)));
      free_events_.push_back(pending_.front().done);
      pending_.pop_front();
      if (!pending_.empty())
        pending_.front().since = std::max(pending_.front().since, Clock::now());
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
    if (status != ncclSuccess) state = status;
    if (state != ncclSuccess && state != ncclInProgress)
      return abort_locked(fmt::format("rank {}: NCCL {} failed: {}; communicator aborted", rank_,
                                      pending_.empty() ? "communicator" : pending_.front().what,
                                      nccl_error(state)));
    if (!pending_.empty() && Clock::now() - pending_.front().since > timeout_)
      abort_locked(
          fmt::format("rank {}: NCCL {} did not complete within {} ms; communicator aborted", rank_,
                      pending_.front().what, timeout_.count()));
  }

  // Polls until every pending operation has completed or the communicator has failed.
  void settle(std::unique_lock<std::mutex>& lock) {
    for (poll(); failure_.empty() && !pending_.empty(); poll()) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }

  void watch(int device) {
    cudaSetDevice(device);  // the constructor's device, which it set successfully
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, kWatchInterval, [this] { return stopping_; })) poll();
  }

  // The first failure wins; ncclCommAbort makes NCCL's kernels quit and frees the communicator.
  void abort_locked(std::string why) {
    if (!failure_.empty()) return;
    failure_ = std::move(why);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  [[noreturn]] void fail(std::string why) {
    abort_locked(std::move(why));
    throw Error(failure_);
  }

  void throw_if_failed() const {
    if (!failure_.empty()) throw Error(failure_);
  }

  // Frees what the constructor made; a healthy communicator is destroyed, an aborted one is gone.
  void release() {
    if (comm_) ncclCommDestroy(comm_);
    for (const Staged& message : to_self_) cudaFreeAsync(message.data, stream_);
    for (const Pending& p : pending_) cudaEventDestroy(p.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (token_) cudaFreeAsync(token_, stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const int rank_;
  const int size_;
  const Timeout timeout_;
  cudaStream_t stream_ = nullptr;
  float* token_ = nullptr;  // the barrier's all-reduce
  std::deque<Staged> to_self_;
  std::thread watchdog_;

  std::mutex mutex_;  // guards the rest
  std::condition_variable wake_;
  ncclComm_t comm_ = nullptr;    // null once aborted
  std::deque<Pending> pending_;  // oldest first
  std::vector<cudaEvent_t> free_events_;
  std::string failure_;  // empty while healthy
  bool stopping_ = false;
};

// run_nccl_local's ranks: the first error, and each rank's live communicator, so that a rank that
// throws aborts the others at once (as the in-process hub wakes its waiting ranks) rather than
// leaving them to their timeouts.
struct Local {
  explicit Local(int ranks) : live(ranks, nullptr) {}

  void enter(int r, Nccl& comm) {
    std::lock_guard lock(mutex);
    live[r] = &comm;
    if (first_error) abort(comm);
  }

  // Records how rank r's fn ended (only the first error counts, later ones are its consequences)
  // and takes its communicator off the list.
  void leave(int r, const std::exception_ptr& error) {
    std::lock_guard lock(mutex);
    if (error && !first_error) {
      first_error = error;
      failed_rank = r;
      failure = comm::message_of(error);
      for (Nccl* comm : live)
        if (comm) abort(*comm);
    }
    live[r] = nullptr;
  }

  void abort(Nccl& comm) const {
    comm.abort(fmt::format("rank {}: NCCL communicator aborted: rank {} failed: {}", comm.rank(),
                           failed_rank, failure));
  }

  std::mutex mutex;
  std::vector<Nccl*> live;  // [rank], null before its init and after its fn
  std::exception_ptr first_error;
  int failed_rank = -1;
  std::string failure;
};

}  // namespace

void run_nccl_local(int ranks, const std::function<void(Communicator&)>& fn, Timeout timeout) {
  const int devices = visible_gpus();
  if (ranks < 1 || ranks > devices)
    throw Error(fmt::format(
        "run_nccl_local: ranks must be in [1, {}] (one per visible GPU), got {}", devices, ranks));
  ncclUniqueId id;
  GDN_NCCL_CHECK(ncclGetUniqueId(&id));
  Local local(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Nccl> comm;
      std::exception_ptr error;
      try {
        comm = std::make_unique<Nccl>(id, r, ranks, r, timeout);
        local.enter(r, *comm);
        fn(*comm);
        comm->synchronize();
      } catch (...) {
        error = std::current_exception();
      }
      local.leave(r, error);  // before the communicator goes: an error aborts every rank's now
    });
  }
  for (auto& t : threads) t.join();
  if (local.first_error) std::rethrow_exception(local.first_error);
}

std::unique_ptr<Communicator> nccl_world([[maybe_unused]] Timeout timeout) {
#ifdef GDN_NCCL_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw Error("nccl_world: MPI has already been finalized");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_SERIALIZED)
      throw Error("nccl_world: MPI_Init_thread failed to give MPI_THREAD_SERIALIZED");
  }
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Rank 0's id reaches the others by a broadcast polled against the timeout: a rank that never
  // comes (or rank 0 failing first) is an error, not a hang.
  ncclUniqueId id;
  if (rank == 0) GDN_NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Request request;
  MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
  const Clock::time_point end = Clock::now() + timeout;
  int done = 0;
  MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  while (!done) {
    if (Clock::now() > end)
      throw Error(
          fmt::format("rank {}: nccl_world: the broadcast of the NCCL id from rank 0 timed "
                      "out after {} ms",
                      rank, timeout.count()));
    std::this_thread::yield();
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  }
  // Every rank is here now, so the split cannot hang: the local rank picks the GPU.
  MPI_Comm node;
  int local_rank = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  const int devices = visible_gpus();
  if (devices == 0)
    throw Error(fmt::format("rank {}: nccl_world: no CUDA device is visible", rank));
  auto comm = std::make_unique<Nccl>(id, rank, ranks, local_rank % devices, timeout);
  comm->owns_mpi = !initialized;
  return comm;
#else
  throw Error(
      "nccl_world: gdn was built without MPI, which starts its ranks: reconfigure with "
      "-DGDN_MPI=ON (needs an MPI library)");
#endif
}

std::string nccl_unique_id() {
  ncclUniqueId id;
  GDN_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> nccl_communicator(const std::string& unique_id, int rank, int ranks,
                                                int device, Timeout timeout) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal)
    throw Error(
        fmt::format("nccl_communicator: unique_id must be the {} bytes of nccl_unique_id(), "
                    "got {} bytes",
                    sizeof id.internal, unique_id.size()));
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error(fmt::format("nccl_communicator: rank must be in [0, ranks), got rank {} of {}",
                            rank, ranks));
  const int devices = visible_gpus();
  if (device < 0 || device >= devices)
    throw Error(
        fmt::format("nccl_communicator: device must be in [0, {}), got {}", devices, device));
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  return std::make_unique<Nccl>(id, rank, ranks, device, timeout);
}

std::unique_ptr<Communicator> nccl_rank_without_peers(int ranks, int device, Timeout timeout) {
  ncclUniqueId id;
  GDN_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::make_unique<Nccl>(id, 0, ranks, device, timeout);
}

}  // namespace gdn
