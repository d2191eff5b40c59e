// The MPI communicator across the processes of mpirun (ctest runs 3): the exchanges of test_comm,
// checked by construction. With --silent-peer the last rank never sends, and the others must
// report the timeout and end the job.

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gdn/communicator.h"
#include "gdn/error.h"

namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<std::byte>;
using gdn::Communicator;

// The message `from` sends `to`: random bytes seeded by the pair; its size too unless given.
Bytes payload(int from, int to, std::size_t bytes = SIZE_MAX) {
  std::mt19937 rng(static_cast<unsigned>(from * 1000 + to));
  if (bytes == SIZE_MAX) bytes = rng() % 20000;  // across MPI's eager and rendezvous sizes
  Bytes out(bytes);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

std::size_t block_bytes(int from, int to) {
  return (from * 3 + to) % 4 * 17;
}

// Each pair in turn: the lower rank sends first, so blocking sends cannot deadlock.
bool send_recv_between_all_pairs(Communicator& comm) {
  const int r = comm.rank();
  bool ok = true;
  for (int a = 0; a < comm.size(); ++a)
    for (int b = a + 1; b < comm.size(); ++b) {
      if (r != a && r != b) continue;
      const int peer = r == a ? b : a;
      const Bytes m = payload(r, peer), expected = payload(peer, r);
      Bytes got(expected.size());
      if (r == a) comm.send(m.data(), m.size(), peer);
      comm.recv(got.data(), got.size(), peer);
      if (r == b) comm.send(m.data(), m.size(), peer);
      ok = ok && got == expected;
    }
  return ok;
}

// Every shift s at once: to r + s, from r - s; 1 MiB forces MPI's rendezvous protocol.
bool send_recv_shifts(Communicator& comm) {
  const int r = comm.rank(), p = comm.size();
  bool ok = true;
  for (int s = 0; s < p; ++s) {
    const int to = (r + s) % p, from = (r + p - s) % p;
    const Bytes m = payload(r, to, 1 << 20), expected = payload(from, r, 1 << 20);
    Bytes got(expected.size());
    comm.send_recv(m.data(), m.size(), to, got.data(), got.size(), from);
    ok = ok && got == expected;
  }
  return ok;
}

bool all_gather(Communicator& comm) {
  constexpr std::size_t kBytes = 1000;
  Bytes expected;
  for (int from = 0; from < comm.size(); ++from) {
    const Bytes m = payload(from, -1, kBytes);
    expected.insert(expected.end(), m.begin(), m.end());
  }
  Bytes got(expected.size());
  comm.all_gather(payload(comm.rank(), -1, kBytes).data(), got.data(), kBytes);
  return got == expected;
}

bool all_to_all_with_uneven_and_zero_counts(Communicator& comm) {
  const int r = comm.rank();
  Bytes send, expected;
  std::vector<std::size_t> send_bytes, recv_bytes;
  for (int peer = 0; peer < comm.size(); ++peer) {
    const Bytes out = payload(r, peer, block_bytes(r, peer));
    const Bytes in = payload(peer, r, block_bytes(peer, r));
    send.insert(send.end(), out.begin(), out.end());
    expected.insert(expected.end(), in.begin(), in.end());
    send_bytes.push_back(out.size());
    recv_bytes.push_back(in.size());
  }
  Bytes got(expected.size());
  comm.all_to_all(send.data(), send_bytes, got.data(), recv_bytes);
  return got == expected;
}

// Small integers sum exactly in float32, in any order.
bool all_reduce_sum(Communicator& comm) {
  const int r = comm.rank(), p = comm.size();
  std::vector<float> data(1001), expected(1001);
  for (std::size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>(r * 1000 + static_cast<int>(i % 7));
    expected[i] = static_cast<float>(1000 * p * (p - 1) / 2 + p * static_cast<int>(i % 7));
  }
  comm.all_reduce_sum(data.data(), data.size());
  return data == expected;
}

bool barrier(Communicator& comm) {
  for (int i = 0; i < 10; ++i) comm.barrier();
  return true;
}

// Checked before any MPI call, so the communicator stays usable.
bool counts_above_int_max_are_rejected(Communicator& comm) {
  try {
    comm.send(nullptr, std::size_t{INT_MAX} + 1, (comm.rank() + 1) % comm.size());
  } catch (const gdn::Error& e) {
    return std::string(e.what()).find("MPI counts are limited to 2147483647 bytes") !=
           std::string::npos;
  }
  return false;
}

int run_all(Communicator& comm) {
  const std::vector<std::pair<const char*, std::function<bool(Communicator&)>>> tests = {
      {"send_recv_between_all_pairs", send_recv_between_all_pairs},
      {"send_recv_shifts", send_recv_shifts},
      {"all_gather", all_gather},
      {"all_to_all_with_uneven_and_zero_counts", all_to_all_with_uneven_and_zero_counts},
      {"all_reduce_sum", all_reduce_sum},
      {"barrier", barrier},
      {"counts_above_int_max_are_rejected", counts_above_int_max_are_rejected}};
  int passed = 0, failed = 0;
  for (const auto& [name, test] : tests) {
    // A test passes when it passes on every rank.
    const int ok = test(comm);
    std::vector<int> oks(comm.size());
    comm.all_gather(&ok, oks.data(), sizeof ok);
    std::string failing;
    for (int r = 0; r < comm.size(); ++r)
      if (!oks[r]) failing.append(" ").append(std::to_string(r));
    failing.empty() ? ++passed : ++failed;
    if (comm.rank() == 0 && !failing.empty())
      std::printf("%s FAILED on rank(s)%s\n", name, failing.c_str());
  }
  if (comm.rank() == 0) std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// Every rank but the last waits for a message the last never sends.
void silent_peer(Communicator& comm) {
  const int last = comm.size() - 1;
  if (comm.rank() == last) {
    std::this_thread::sleep_for(10s);  // outlives the others' timeout; MPI_Abort ends it sooner
    return;
  }
  int x = 0;
  comm.recv(&x, sizeof x, last);
}

}  // namespace

int main(int argc, char** argv) {
  const bool silent = argc > 1 && std::string(argv[1]) == "--silent-peer";
  try {
    auto comm = gdn::mpi_world(silent ? 500ms : 20s);
    if (silent) {
      silent_peer(*comm);
      return 0;
    }
    return run_all(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
