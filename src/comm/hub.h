#pragma once
// The in-process communicators' common part: one thread per rank, all sharing a hub of mailboxes.
// send puts the message into the (from, to) mailbox and returns; recv waits for the mailbox's
// oldest message. A rank that throws marks the hub failed, which wakes every waiting rank with an
// error instead of leaving it to hang until its timeout. A Transport moves the bytes: host
// copies (in_process.cpp) or device copies ordered by events (one_gpu.cu).

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/message_of.h"
#include "gdn/communicator.h"
#include "gdn/error.h"

namespace gdn::comm {

// A message in flight: its bytes live at data, owned by whatever the transport put in keep.
struct Message {
  void* data = nullptr;
  std::size_t bytes = 0;
  std::shared_ptr<void> keep;
};

using Clock = std::chrono::steady_clock;

struct Hub {
  Hub(int ranks, Timeout t) : size(ranks), timeout(t), mailboxes(ranks * ranks), returned(ranks) {}

  std::deque<Message>& mailbox(int from, int to) { return mailboxes[from * size + to]; }

  // Waits until ready() under `lock`; throws if a rank failed first or the timeout passes.
  template <class Ready>
  void wait(std::unique_lock<std::mutex>& lock, int rank, const std::string& what, Ready ready) {
    const bool woken = cv.wait_until(lock, Clock::now() + timeout,
                                     [&] { return ready() || first_error != nullptr; });
    if (ready()) return;
    if (woken)
      throw Error(fmt::format("rank {}: {} aborted: peer rank {} failed: {}", rank, what,
                              failed_rank, failure));
    throw Error(fmt::format("rank {}: {} timed out after {} ms", rank, what, timeout.count()));
  }

  // Records how rank r's fn ended; only the first error counts, later ones are its consequences.
  void finish(int r, const std::exception_ptr& error) {
    std::lock_guard lock(mutex);
    if (!error) returned[r] = true;
    if (error && !first_error) {
      first_error = error;
      failed_rank = r;
      failure = message_of(error);
    }
    cv.notify_all();
  }

  const int size;
  const Timeout timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::deque<Message>> mailboxes;  // [from * size + to], oldest first
  std::vector<bool> returned;                  // [rank]: its fn returned; it will send no more
  std::size_t barrier_arrived = 0;
  std::size_t barrier_generation = 0;
  std::exception_ptr first_error;
  int failed_rank = -1;
  std::string failure;
};

// How a message's bytes travel: put on the sender's side into a Message, taken on the receiver's
// (put(nullptr, bytes) makes an uninitialized buffer).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual Message put(const void* data, std::size_t bytes) = 0;
  virtual void take(Message& message, void* data) = 0;
  // out[i] = sum over r of blocks[r count + i], in rank order (all_reduce_sum).
  virtual void sum_blocks(const float* blocks, int ranks, std::size_t count, float* out) = 0;
  virtual Memory memory() const = 0;
  virtual CUstream_st* stream() const = 0;
  virtual void synchronize() = 0;
};

class InProcess final : public Communicator {
 public:
  InProcess(Hub& hub, int rank, Transport& transport)
      : hub_(hub), rank_(rank), transport_(transport) {}

  Memory memory() const override { return transport_.memory(); }
  CUstream_st* stream() const override { return transport_.stream(); }
  void synchronize() override { transport_.synchronize(); }

  int rank() const override { return rank_; }
  int size() const override { return hub_.size; }
  int ranks_on_host() const override { return hub_.size; }

  void send(const void* data, std::size_t bytes, int peer) override {
    check_peer(peer);
    Message message = transport_.put(data, bytes);
    if (peer != rank_) bytes_sent_ += bytes;
    std::lock_guard lock(hub_.mutex);
    hub_.mailbox(rank_, peer).push_back(std::move(message));
    hub_.cv.notify_all();
  }

  void recv(void* data, std::size_t bytes, int peer) override {
    check_peer(peer);
    const std::string what = fmt::format("recv of {} bytes from rank {}", bytes, peer);
    std::unique_lock lock(hub_.mutex);
    auto& box = hub_.mailbox(peer, rank_);
    // A peer that has returned will never send: fail now rather than at the timeout.
    hub_.wait(lock, rank_, what, [&] { return !box.empty() || hub_.returned[peer]; });
    if (box.empty())
      throw Error(
          fmt::format("rank {}: {} failed: rank {} returned without sending", rank_, what, peer));
    Message message = std::move(box.front());
    box.pop_front();
    if (message.bytes != bytes)
      throw Error(fmt::format("rank {}: recv from rank {} expected {} bytes, got {}", rank_, peer,
                              bytes, message.bytes));
    lock.unlock();
    if (bytes) transport_.take(message, data);
  }

  // send never blocks here, so sending first cannot deadlock.
  void send_recv(const void* send_data, std::size_t send_bytes, int to, void* recv_data,
                 std::size_t recv_bytes, int from) override {
    send(send_data, send_bytes, to);
    recv(recv_data, recv_bytes, from);
  }

  void all_gather(const void* send_data, void* recv_data, std::size_t bytes) override {
    for (int r = 0; r < size(); ++r) send(send_data, bytes, r);
    auto* out = static_cast<std::byte*>(recv_data);
    for (int r = 0; r < size(); ++r) recv(out + r * bytes, bytes, r);
  }

  void all_to_all(const void* send_data, const std::vector<std::size_t>& send_bytes,
                  void* recv_data, const std::vector<std::size_t>& recv_bytes) override {
    check_counts(send_bytes, "send_bytes");
    check_counts(recv_bytes, "recv_bytes");
    const auto* in = static_cast<const std::byte*>(send_data);
    for (int r = 0; r < size(); ++r) {
      send(in, send_bytes[r], r);
      in += send_bytes[r];
    }
    auto* out = static_cast<std::byte*>(recv_data);
    for (int r = 0; r < size(); ++r) {
      recv(out, recv_bytes[r], r);
      out += recv_bytes[r];
    }
  }

  // An all-gather, then every rank sums the blocks in rank order: the same bits everywhere.
  void all_reduce_sum(float* data, std::size_t count) override {
    Message blocks = transport_.put(nullptr, count * sizeof(float) * size());
    all_gather(data, blocks.data, count * sizeof(float));
    transport_.sum_blocks(static_cast<const float*>(blocks.data), size(), count, data);
  }

  void barrier() override {
    std::unique_lock lock(hub_.mutex);
    const std::size_t generation = hub_.barrier_generation;
    if (++hub_.barrier_arrived == static_cast<std::size_t>(size())) {
      hub_.barrier_arrived = 0;
      ++hub_.barrier_generation;
      hub_.cv.notify_all();
      return;
    }
    const auto& returned = hub_.returned;
    const auto gone = [&] { return std::find(returned.begin(), returned.end(), true); };
    hub_.wait(lock, rank_, "barrier",
              [&] { return hub_.barrier_generation != generation || gone() != returned.end(); });
    if (hub_.barrier_generation == generation)
      throw Error(fmt::format("rank {}: barrier failed: rank {} returned without entering it",
                              rank_, gone() - returned.begin()));
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size())
      throw Error(fmt::format("rank {}: peer {} is out of range [0, {})", rank_, peer, size()));
  }

  void check_counts(const std::vector<std::size_t>& counts, const char* name) const {
    if (counts.size() != static_cast<std::size_t>(size()))
      throw Error(fmt::format("rank {}: all_to_all {} must hold {} counts (one per rank), got {}",
                              rank_, name, size(), counts.size()));
  }

  Hub& hub_;
  const int rank_;
  Transport& transport_;
};

// Runs fn on `ranks` threads, rank r with the communicator InProcess(hub, r, transport(r));
// rethrows the first error any rank threw (after every rank has returned).
template <typename MakeTransport>
void run_ranks(int ranks, Timeout timeout, MakeTransport make_transport,
               const std::function<void(Communicator&)>& fn) {
  Hub hub(ranks, timeout);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&hub, &fn, &make_transport, r] {
      std::exception_ptr error;
      try {
        auto transport = make_transport(r);
        InProcess comm(hub, r, *transport);
        fn(comm);
        comm.synchronize();
      } catch (...) {
        error = std::current_exception();
      }
      hub.finish(r, error);
    });
  }
  for (auto& t : threads) t.join();
  if (hub.first_error) std::rethrow_exception(hub.first_error);
}

}  // namespace gdn::comm
