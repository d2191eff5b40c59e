#pragma once
// Each rank's affine maps (spec 4): forward, carried state in -> carried state out; backward,
// carried gradient in (of the leaving state) -> carried gradient out (of the entering state).

#include "cp/affine.h"
#include "cp/shard.h"

namespace gdn::cp {

// Only the segment that leaves to the next rank has a map: M is its transfer matrix when it also
// entered from the previous rank (else 0), N its leaving state when entered with zero.
AffineMaps forward_maps(const ShardPlan& plan, const DeltaRuleInputs& shard);

// Only the segment that entered from the previous rank has a map: M^T of its forward map when it
// also leaves to the next (else 0), and G, its entering-state gradient from this shard alone.
// `forward` holds this rank's forward maps (kept from forward or rebuilt).
AffineMaps backward_maps(const ShardPlan& plan, const LocalProblem& local, const TensorRef& d_o,
                         const TensorRef& d_final_state, AffineMaps forward);

}  // namespace gdn::cp
