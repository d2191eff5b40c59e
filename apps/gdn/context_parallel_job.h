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

// True when this process was started by mpirun with more than one process.
bool launched_by_mpirun();

}  // namespace gdn::app
