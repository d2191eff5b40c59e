// The MPI communicator over a private duplicate of MPI_COMM_WORLD. Every exchange is non-blocking
// MPI polled against a deadline, so a silent peer becomes a gdn::Error instead of a hang.

#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>
#include <thread>

#include "gdn/communicator.h"
#include "gdn/error.h"

namespace gdn {
namespace {

using Clock = std::chrono::steady_clock;

#define GDN_MPI_CHECK(expr) check((expr), #expr, __FILE__, __LINE__)

class Mpi final : public Communicator {
 public:
  Mpi(Timeout timeout, bool owns_mpi) : timeout_(timeout), owns_mpi_(owns_mpi) {
    GDN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    GDN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    // A duplicate keeps our messages apart from the caller's and lets errors return, not abort.
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request));
    wait(request, "MPI_Comm_idup of MPI_COMM_WORLD", deadline());
    GDN_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }

  // After a failure MPI's state is undefined and finalizing could block on the dead peer: leave
  // the cleanup to process exit (mpirun then ends the job).
  ~Mpi() override {
    if (failed_) return;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // mpirun says how many of its processes share this host (OpenMPI, then MPICH and Hydra).
  int ranks_on_host() const override {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
      if (const char* value = std::getenv(name); value && std::atoi(value) > 0)
        return std::atoi(value);
    return 1;
  }

  void send(const void* data, std::size_t bytes, int peer) override {
    const std::string what = fmt::format("send of {} bytes to rank {}", bytes, peer);
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Isend(data, count(bytes, what), MPI_BYTE, peer, 0, comm_, &request));
    wait(request, what, deadline());
    bytes_sent_ += bytes;
  }

  void recv(void* data, std::size_t bytes, int peer) override {
    const std::string what = fmt::format("recv of {} bytes from rank {}", bytes, peer);
    const Clock::time_point end = deadline();
    MPI_Request request = post_recv(data, bytes, peer, what, end);
    wait(request, what, end);
  }

  void send_recv(const void* send_data, std::size_t send_bytes, int to, void* recv_data,
                 std::size_t recv_bytes, int from) override {
    const std::string sending = fmt::format("send of {} bytes to rank {}", send_bytes, to);
    const std::string receiving = fmt::format("recv of {} bytes from rank {}", recv_bytes, from);
    const Clock::time_point end = deadline();
    MPI_Request send_request;
    GDN_MPI_CHECK(
        MPI_Isend(send_data, count(send_bytes, sending), MPI_BYTE, to, 0, comm_, &send_request));
    MPI_Request recv_request = post_recv(recv_data, recv_bytes, from, receiving, end);
    wait(recv_request, receiving, end);
    wait(send_request, sending, end);
    bytes_sent_ += send_bytes;
  }

  void all_gather(const void* send_data, void* recv_data, std::size_t bytes) override {
    const std::string what = fmt::format("all_gather of {} bytes per rank", bytes);
    const int n = count(bytes, what);
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Iallgather(send_data, n, MPI_BYTE, recv_data, n, MPI_BYTE, comm_, &request));
    wait(request, what, deadline());
    bytes_sent_ += bytes * static_cast<std::size_t>(size_ - 1);
  }

  void all_to_all(const void* send_data, const std::vector<std::size_t>& send_bytes,
                  void* recv_data, const std::vector<std::size_t>& recv_bytes) override {
    std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
    layout(send_bytes, "all_to_all send_bytes", send_counts, send_offsets);
    layout(recv_bytes, "all_to_all recv_bytes", recv_counts, recv_offsets);
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Ialltoallv(send_data, send_counts.data(), send_offsets.data(), MPI_BYTE,
                                 recv_data, recv_counts.data(), recv_offsets.data(), MPI_BYTE,
                                 comm_, &request));
    wait(request, "all_to_all", deadline());
    for (int r = 0; r < size_; ++r)
      if (r != rank_) bytes_sent_ += send_bytes[static_cast<std::size_t>(r)];
  }

  void all_reduce_sum(float* data, std::size_t floats) override {
    const std::string what = fmt::format("all_reduce_sum of {} floats", floats);
    const int n = count(floats * sizeof(float), what) / static_cast<int>(sizeof(float));
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm_, &request));
    wait(request, what, deadline());
    bytes_sent_ += floats * sizeof(float) * static_cast<std::size_t>(size_ - 1);
  }

  void barrier() override {
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    wait(request, "barrier", deadline());
  }

 private:
  // The MPI error-check family: expression, file, line and rank.
  void check(int status, const char* expression, const char* file, int line) {
    if (status == MPI_SUCCESS) return;
    failed_ = true;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    throw Error(fmt::format("rank {}: {} failed at {}:{}: {}", rank_, expression, file, line,
                            std::string(text, length)));
  }

  Clock::time_point deadline() const { return Clock::now() + timeout_; }

  // MPI counts are ints.
  int count(std::size_t bytes, const std::string& what) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw Error(
          fmt::format("rank {}: {}: MPI counts are limited to {} bytes", rank_, what, INT_MAX));
    return static_cast<int>(bytes);
  }

  // Counts and packed offsets of size() blocks, in MPI's ints.
  void layout(const std::vector<std::size_t>& bytes, const char* name, std::vector<int>& counts,
              std::vector<int>& offsets) const {
    if (bytes.size() != static_cast<std::size_t>(size_))
      throw Error(fmt::format("rank {}: {} must hold {} counts (one per rank), got {}", rank_, name,
                              size_, bytes.size()));
    std::size_t offset = 0;
    for (std::size_t b : bytes) {
      counts.push_back(count(b, name));
      offsets.push_back(count(offset, name));
      offset += b;
    }
    count(offset, name);
  }

  // Matches the peer's next message first, so that a size mismatch names both sizes.
  MPI_Request post_recv(void* data, std::size_t bytes, int peer, const std::string& what,
                        Clock::time_point end) {
    MPI_Message message;
    MPI_Status status;
    poll(what, end, [&] {
      int found = 0;
      GDN_MPI_CHECK(MPI_Improbe(peer, 0, comm_, &found, &message, &status));
      return found != 0;
    });
    int arrived = 0;
    GDN_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &arrived));
    if (static_cast<std::size_t>(arrived) != bytes) {
      failed_ = true;
      throw Error(fmt::format("rank {}: recv from rank {} expected {} bytes, got {}", rank_, peer,
                              bytes, arrived));
    }
    MPI_Request request;
    GDN_MPI_CHECK(MPI_Imrecv(data, arrived, MPI_BYTE, &message, &request));
    return request;
  }

  void wait(MPI_Request& request, const std::string& what, Clock::time_point end) {
    poll(what, end, [&] {
      int done = 0;
      GDN_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      return done != 0;
    });
  }

  // Polls done() until it holds or `end` passes; yielding keeps oversubscribed ranks moving.
  template <class Done>
  void poll(const std::string& what, Clock::time_point end, Done done) {
    while (!done()) {
      if (Clock::now() > end) {
        failed_ = true;
        throw Error(
            fmt::format("rank {}: {} timed out after {} ms", rank_, what, timeout_.count()));
      }
      std::this_thread::yield();
    }
  }

  const Timeout timeout_;
  const bool owns_mpi_;
  int rank_ = -1;
  int size_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool failed_ = false;  // an exchange failed: MPI's state is undefined
};

}  // namespace

std::unique_ptr<Communicator> mpi_world(Timeout timeout) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw Error("mpi_world: MPI has already been finalized");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_SERIALIZED)
      throw Error("mpi_world: MPI_Init_thread failed to give MPI_THREAD_SERIALIZED");
  }
  return std::make_unique<Mpi>(timeout, !initialized);
}

}  // namespace gdn
