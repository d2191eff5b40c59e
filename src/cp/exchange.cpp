#include "cp/exchange.h"

#include "gdn/error.h"

namespace gdn::cp {
namespace {

struct Order {
  int position, ranks;
  bool reversed;
  int rank_at(int p) const { return reversed ? ranks - 1 - p : p; }
};

std::vector<float> chain(Communicator& comm, const Order& order, const AffineMaps& mine) {
  std::vector<float> x(static_cast<std::size_t>(mine.count * mine.K * mine.V), 0.0f);
  const int p = order.position;
  if (p > 0) comm.recv(x.data(), x.size() * sizeof(float), order.rank_at(p - 1));
  if (p < order.ranks - 1) {
    const std::vector<float> y = mine.apply(x);
    comm.send(y.data(), y.size() * sizeof(float), order.rank_at(p + 1));
  }
  return x;
}

std::vector<float> all_gather(Communicator& comm, const Order& order, const AffineMaps& mine) {
  AffineMaps all = mine;
  all.data.resize(mine.data.size() * static_cast<std::size_t>(order.ranks));
  comm.all_gather(mine.data.data(), all.data.data(), mine.bytes());
  std::vector<float> x(static_cast<std::size_t>(mine.count * mine.K * mine.V), 0.0f);
  for (int p = 0; p < order.position; ++p) {
    AffineMaps map = mine;
    const auto block =
        all.data.begin() +
        static_cast<std::ptrdiff_t>(mine.data.size() * static_cast<std::size_t>(order.rank_at(p)));
    std::copy_n(block, mine.data.size(), map.data.begin());
    x = map.apply(x);
  }
  return x;
}

// Hillis-Steele: after the round of distance d, `prefix` composes positions (p - 2d, p]. Then
// each position hands its inclusive result's offset (the state it lets out) to the next.
std::vector<float> scan(Communicator& comm, const Order& order, const AffineMaps& mine) {
  const int p = order.position, P = order.ranks;
  AffineMaps prefix = mine, received = mine;
  for (int d = 1; d < P; d *= 2) {
    const bool sends = p + d < P, receives = p - d >= 0;
    if (sends && receives)
      comm.send_recv(prefix.data.data(), prefix.bytes(), order.rank_at(p + d), received.data.data(),
                     received.bytes(), order.rank_at(p - d));
    else if (sends)
      comm.send(prefix.data.data(), prefix.bytes(), order.rank_at(p + d));
    else if (receives)
      comm.recv(received.data.data(), received.bytes(), order.rank_at(p - d));
    if (receives) prefix = prefix.after(received);
  }
  std::vector<float> x(static_cast<std::size_t>(mine.count * mine.K * mine.V), 0.0f);
  const std::size_t state_bytes = x.size() * sizeof(float);
  if (p + 1 < P && p > 0)
    comm.send_recv(prefix.N(0), state_bytes, order.rank_at(p + 1), x.data(), state_bytes,
                   order.rank_at(p - 1));
  else if (p + 1 < P)
    comm.send(prefix.N(0), state_bytes, order.rank_at(p + 1));
  else if (p > 0)
    comm.recv(x.data(), state_bytes, order.rank_at(p - 1));
  return x;
}

}  // namespace

std::vector<float> exclusive_prefix(Communicator& comm, Strategy strategy, const AffineMaps& mine,
                                    bool reversed) {
  const Order order{reversed ? comm.size() - 1 - comm.rank() : comm.rank(), comm.size(), reversed};
  switch (strategy) {
    case Strategy::summary_chain:
      return chain(comm, order, mine);
    case Strategy::summary_allgather:
      return all_gather(comm, order, mine);
    case Strategy::scan:
      return scan(comm, order, mine);
    default:
      break;
  }
  throw Error("exclusive_prefix: strategy must be summary-chain, summary-allgather or scan");
}

}  // namespace gdn::cp
