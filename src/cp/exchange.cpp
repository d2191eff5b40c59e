#include "cp/exchange.h"

#include "gdn/error.h"

namespace gdn::cp {
namespace {

struct Order {
  int position, ranks;
  bool reversed;
  int rank_at(int p) const { return reversed ? ranks - 1 - p : p; }
};

Buffer chain(Communicator& comm, Backend& backend, const Order& order, const AffineMaps& mine) {
  Buffer x = backend.allocate(mine.offset_bytes());
  const int p = order.position;
  if (p > 0) comm.recv(x.data(), x.bytes(), order.rank_at(p - 1));
  if (p < order.ranks - 1) {
    const Buffer y = backend.allocate(x.bytes());
    backend.apply(mine.M(), mine.count, mine.K, mine.V, x.floats(), y.floats());
    comm.send(y.data(), y.bytes(), order.rank_at(p + 1));
  }
  return x;
}

Buffer all_gather(Communicator& comm, Backend& backend, const Order& order,
                  const AffineMaps& mine) {
  const Buffer all = backend.allocate(mine.bytes() * static_cast<std::size_t>(order.ranks));
  comm.all_gather(mine.data.data(), all.data(), mine.bytes());
  Buffer x = backend.allocate(mine.offset_bytes()), y = backend.allocate(mine.offset_bytes());
  for (int p = 0; p < order.position; ++p) {
    const float* map = all.floats() + mine.bytes() / 4 * static_cast<std::size_t>(order.rank_at(p));
    backend.apply(map, mine.count, mine.K, mine.V, x.floats(), y.floats());
    std::swap(x, y);
  }
  return x;
}

// Hillis-Steele: after the round of distance d, `prefix` composes positions (p - 2d, p]. Then
// each position hands its inclusive result's offset (the state it lets out) to the next.
Buffer scan(Communicator& comm, Backend& backend, const Order& order, const AffineMaps& mine) {
  const int p = order.position, P = order.ranks;
  AffineMaps prefix = AffineMaps::zeros(backend, mine.count, mine.K, mine.V);
  AffineMaps received = AffineMaps::zeros(backend, mine.count, mine.K, mine.V);
  AffineMaps composed = AffineMaps::zeros(backend, mine.count, mine.K, mine.V);
  backend.copy(prefix.data.data(), mine.data.data(), mine.bytes());
  for (int d = 1; d < P; d *= 2) {
    const bool sends = p + d < P, receives = p - d >= 0;
    if (sends && receives)
      comm.send_recv(prefix.data.data(), prefix.bytes(), order.rank_at(p + d), received.data.data(),
                     received.bytes(), order.rank_at(p - d));
    else if (sends)
      comm.send(prefix.data.data(), prefix.bytes(), order.rank_at(p + d));
    else if (receives)
      comm.recv(received.data.data(), received.bytes(), order.rank_at(p - d));
    if (receives) {
      backend.compose(prefix.M(), received.M(), mine.count, mine.K, mine.V, composed.M());
      std::swap(prefix, composed);
    }
  }
  Buffer x = backend.allocate(mine.offset_bytes());
  if (p + 1 < P && p > 0)
    comm.send_recv(prefix.N(), x.bytes(), order.rank_at(p + 1), x.data(), x.bytes(),
                   order.rank_at(p - 1));
  else if (p + 1 < P)
    comm.send(prefix.N(), x.bytes(), order.rank_at(p + 1));
  else if (p > 0)
    comm.recv(x.data(), x.bytes(), order.rank_at(p - 1));
  return x;
}

}  // namespace

Buffer exclusive_prefix(Communicator& comm, Backend& backend, Strategy strategy,
                        const AffineMaps& mine, bool reversed) {
  const Order order{reversed ? comm.size() - 1 - comm.rank() : comm.rank(), comm.size(), reversed};
  switch (strategy) {
    case Strategy::summary_chain:
      return chain(comm, backend, order, mine);
    case Strategy::summary_allgather:
      return all_gather(comm, backend, order, mine);
    case Strategy::scan:
      return scan(comm, backend, order, mine);
    default:
      break;
  }
  throw Error("exclusive_prefix: strategy must be summary-chain, summary-allgather or scan");
}

}  // namespace gdn::cp
