#pragma once
// The NCCL communicator's test hook (comm/nccl.cpp): a rank whose peers never join, the one fault
// a single GPU can stage.

#include <memory>

#include "gdn/communicator.h"

namespace gdn {

// Rank 0 of a fresh `ranks`-rank NCCL communicator on `device`; no other rank ever joins, so for
// ranks > 1 its creation ends in gdn::Error once `timeout` has passed.
std::unique_ptr<Communicator> nccl_rank_without_peers(int ranks, int device, Timeout timeout);

}  // namespace gdn
