#pragma once
// One rank's shard as a single-rank problem in the backend's memory: the inputs with local
// cu_seqlens and initial states, and the local final states, d_final_state and dh0, all f32
// [segments, HV, K, V]. The rows of segments that cross a rank boundary hold the carried states
// (zero until they arrive); the others hold the user's.

#include "cp/shard.h"

namespace gdn::cp {

struct LocalProblem {
  LocalProblem(Backend& backend, const ShardPlan& plan, const DeltaRuleInputs& shard);

  // Forward: carried [chains, HV, K, V] into the h0 rows of segments from the previous rank;
  // the final states of segments into the next rank out to `carried`; the final states of
  // sequences ending here into the user's tensor (other rows zero).
  void enter(const Buffer& carried);
  void leave(const Buffer& carried) const;
  void write_final_state(const TensorRef& user) const;
  // Backward: the user's d_final_state rows (zero for segments into the next rank), the carried
  // gradient into those rows, the dh0 rows of segments from the previous rank out, and dh0 of
  // sequences starting here into the user's tensor.
  void set_d_final_state(const TensorRef& user);
  void enter_grad(const Buffer& carried);
  void leave_grad(const Buffer& carried) const;
  void write_dh0(const TensorRef& user) const;

  Backend& backend;
  const ShardPlan& plan;
  HostTensor cu_seqlens_host;
  Buffer cu_seqlens, initial_state, final_state, d_final_state, dh0;
  DeltaRuleInputs inputs;

 private:
  // Row i of `local` <-> row `chain` of `carried`, for the segments where flag is set.
  void copy_rows(const Buffer& from, const Buffer& to, bool Segment::*flag, bool to_carried) const;
  void write_owned(const Buffer& local, bool Segment::*crosses, const TensorRef& user) const;
};

}  // namespace gdn::cp
