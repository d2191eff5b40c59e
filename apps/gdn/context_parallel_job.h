#pragma once
// The op over the ranks of a communicator on shards of one problem, for `gdn run` and `gdn op`.

#include <cstddef>

#include "gdn/context_parallel.h"
#include "gdn/problem.h"

namespace gdn::app {

struct CpStats {
  double forward_seconds = 0, total_seconds = 0;  // the slowest rank's
  std::size_t bytes_sent = 0;                     // the most any rank sent
  Strategy strategy = Strategy::automatic;        // the one used
};

// Every rank passes the whole problem; each runs its shard (forward, and backward when asked)
// and gets back the whole results, gathered over the ranks.
ProblemResults run_context_parallel(Communicator& comm, const ProblemData& data,
                                    const CpOptions& options, bool backward, CpStats& stats);

// Every rank's shard results (`mine`, of this rank's shard), in place in the whole results.
ProblemResults gather(Communicator& comm, const ProblemData& data, ProblemResults& mine);

// The largest value over the ranks (every rank gets it).
double slowest(Communicator& comm, double value);

// Every rank's [B, T / P, ...] shard, in rank order along T (every rank gets the whole).
HostTensor gather_tokens(Communicator& comm, const HostTensor& part, std::int64_t T);

// The strategy `auto` picks (the cost model, cp/cost_model.h) for `ranks` shards of the problem
// along T, on host or device memory, `ranks_on_host` of them sharing this host's cores, each
// rank's op on `threads` OpenMP threads, for a forward or a training step: what the auto row
// runs, said also with --strategy all.
Strategy automatic_choice(const Problem& problem, int ranks, int ranks_on_host, Memory memory,
                          int threads, bool training);

// True when this process was started by mpirun with more than one process.
bool launched_by_mpirun();

}  // namespace gdn::app
