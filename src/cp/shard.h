#pragma once
// How one rank's shard of tokens splits into segments of the global sequences.
//
// A segment may continue a sequence from the previous rank (from_previous) or into the next one
// (to_next). The states that cross a rank boundary are the "carried" states, one per chain:
// B chains without cu_seqlens (every batch row crosses every boundary), one with it.

#include <cstdint>
#include <vector>

#include "cp/backend.h"
#include "gdn/communicator.h"
#include "gdn/delta_rule.h"

namespace gdn::cp {

struct Segment {
  std::int64_t sequence;  // global sequence index (the batch row without cu_seqlens)
  bool from_previous;     // started on an earlier rank: enters with the carried state
  bool to_next;           // ends on a later rank: leaves the carried state
  std::int64_t chain;     // which carried state it uses (row b, or 0 with cu_seqlens)
};

struct ShardPlan {
  int rank = 0, ranks = 1;
  int ranks_on_host = 1;          // of the ranks, those sharing this host's cores
  DeltaRuleShape shape{};         // of the shard: T is the local length, N the local segments
  std::int64_t global_sequences;  // N of the whole problem
  std::int64_t chains;            // carried states: B, or 1 with cu_seqlens
  std::vector<Segment> segments;  // in local order
  std::vector<std::int64_t> local_cu_seqlens;  // with cu_seqlens: the local segment offsets
  std::vector<std::int64_t> cu_seqlens;        // with cu_seqlens: the global offsets (host)

  std::int64_t state_size() const { return shape.HV * shape.K * shape.V; }  // one row
  std::int64_t carried_size() const { return chains * state_size(); }
};

// Validates the shard and splits it into segments. shard.cu_seqlens must be a host copy. Every
// rank must hold the same length: checked across ranks unless `checked_T` already holds this
// rank's T (a check made once per length, so that a device communicator's hot path has no
// host synchronization).
ShardPlan plan_shard(Communicator& comm, Backend& backend, const DeltaRuleInputs& shard,
                     std::int64_t& checked_T);

// Whether any segment continues from the previous rank, or into the next.
Carried carried(const ShardPlan& plan);

}  // namespace gdn::cp
