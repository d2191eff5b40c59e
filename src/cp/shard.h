#pragma once
// How one rank's shard of tokens splits into segments of the global sequences, and the local
// problem (inputs with local cu_seqlens and states) that the single-rank op runs on it.
//
// A segment may continue a sequence from the previous rank (from_previous) or into the next one
// (to_next). The states that cross a rank boundary are the "carried" states, one per chain:
// B chains without cu_seqlens (every batch row crosses every boundary), one with it.

#include <cstdint>
#include <vector>

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
  DeltaRuleShape shape{};         // of the shard: T is the local length, N the local segments
  std::int64_t global_sequences;  // N of the whole problem
  std::int64_t chains;            // carried states: B, or 1 with cu_seqlens
  std::vector<Segment> segments;  // in local order
  std::vector<std::int64_t> local_cu_seqlens;  // with cu_seqlens: the local segment offsets

  std::int64_t state_size() const { return shape.HV * shape.K * shape.V; }  // one row
  std::int64_t carried_size() const { return chains * state_size(); }
};

// Validates the shard (and that every rank holds the same length) and splits it into segments.
ShardPlan plan_shard(Communicator& comm, const DeltaRuleInputs& shard);

// The shard as a single-rank problem: inputs with local cu_seqlens and initial state, plus the
// local final state, d_final_state and dh0 buffers, all f32 [segments, HV, K, V].
struct LocalProblem {
  HostTensor cu_seqlens, initial_state, final_state, d_final_state, dh0;
  DeltaRuleInputs inputs;

  // Entering states: the carried state where a segment continues, else the user's (or zero).
  LocalProblem(const ShardPlan& plan, const DeltaRuleInputs& shard, const float* carried_in);
  // The carried states leaving this rank (final states of to_next segments); zero elsewhere.
  std::vector<float> carried_out(const ShardPlan& plan) const;
  // Final states of sequences ending here into the user's final_state; other rows zeroed.
  void write_final_state(const ShardPlan& plan, const TensorRef& final_state) const;
  // Local d_final_state: the carried gradient where a segment continues, else the user's.
  void set_d_final_state(const ShardPlan& plan, const TensorRef& user, const float* carried);
  // The carried gradients leaving backward (dh0 of from_previous segments); zero elsewhere.
  std::vector<float> carried_grad_out(const ShardPlan& plan) const;
  // dh0 of sequences starting here into the user's dh0; other rows zeroed.
  void write_dh0(const ShardPlan& plan, const TensorRef& dh0) const;
};

}  // namespace gdn::cp
