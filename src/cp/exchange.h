#pragma once
// The carried state entering each rank, from every rank's affine map (spec 4-5). Ranks form a
// chain in rank order (backward: reversed); position p receives x_p = T_{p-1}(... T_0(0)).

#include "cp/affine.h"
#include "gdn/communicator.h"
#include "gdn/context_parallel.h"

namespace gdn::cp {

// strategy: summary_chain (P - 1 hops), summary_allgather (one all-gather, a local fold) or
// scan (ceil(log2 P) rounds of recursive doubling, then one shift). Returns [count, K, V].
Buffer exclusive_prefix(Communicator& comm, Backend& backend, Strategy strategy,
                        const AffineMaps& mine, bool reversed);

}  // namespace gdn::cp
