#pragma once
// Ulysses context parallelism (spec 5): one all-to-all turns sequence shards into head shards
// (every rank then holds the whole sequence for HK / P key and HV / P value heads), the
// single-rank op runs, and another all-to-all turns the results back.

#include "cp/shard.h"

namespace gdn::cp {

void ulysses_forward(Communicator& comm, Backend& backend, const ShardPlan& plan,
                     const DeltaRuleInputs& shard, const DeltaRuleOutputs& out);
void ulysses_backward(Communicator& comm, Backend& backend, const ShardPlan& plan,
                      const DeltaRuleInputs& shard, const DeltaRuleGrads& grads);

}  // namespace gdn::cp
