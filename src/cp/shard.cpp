#include "cp/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/layout.h"
#include "gdn/error.h"

namespace gdn::cp {
namespace {

// The whole problem's view of a shard: the same tensors with T multiplied by the ranks, so that
// validate() checks cu_seqlens and the states against the global length.
DeltaRuleInputs global_view(const DeltaRuleInputs& shard, int ranks) {
  DeltaRuleInputs view = shard;
  for (TensorRef* t : {&view.q, &view.k, &view.v, &view.g, &view.beta})
    if (t->shape.size() >= 2) t->shape[1] *= ranks;
  return view;
}

// Rows of `local` (one per segment) into the user's [N, HV, K, V] by sequence, for the segments
// whose `crosses` flag is false (they own the row); every other row of the user's tensor is zero.
void write_owned_rows(const ShardPlan& plan, const HostTensor& local, const TensorRef& user,
                      bool Segment::*crosses) {
  if (!user.given()) return;
  const std::int64_t row = plan.state_size();
  const std::vector<float> zeros(static_cast<std::size_t>(row), 0.0f);
  for (std::int64_t n = 0; n < plan.global_sequences; ++n)
    core::store_row(user, n * row, row, zeros.data());
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    if (!(plan.segments[i].*crosses))
      core::store_row(user, plan.segments[i].sequence * row, row,
                     local.as<float>() + static_cast<std::int64_t>(i) * row);
}

}  // namespace

ShardPlan plan_shard(Communicator& comm, const DeltaRuleInputs& shard) {
  ShardPlan plan;
  plan.rank = comm.rank();
  plan.ranks = comm.size();
  DeltaRuleInputs local = shard;
  local.cu_seqlens = {};
  local.initial_state = {};
  plan.shape = validate(local);
  const DeltaRuleShape global = validate(global_view(shard, plan.ranks));

  std::vector<std::int64_t> lengths(static_cast<std::size_t>(plan.ranks));
  comm.all_gather(&plan.shape.T, lengths.data(), sizeof(std::int64_t));
  for (int r = 0; r < plan.ranks; ++r)
    if (lengths[static_cast<std::size_t>(r)] != plan.shape.T)
      throw Error(
          fmt::format("rank {}: every rank must hold T / P tokens: this rank has {}, rank "
                      "{} has {}",
                      plan.rank, plan.shape.T, r, lengths[static_cast<std::size_t>(r)]));

  plan.global_sequences = global.N;
  const std::int64_t t0 = plan.rank * plan.shape.T, t1 = t0 + plan.shape.T;
  if (!shard.cu_seqlens.given()) {
    plan.chains = plan.shape.B;
    for (std::int64_t b = 0; b < plan.shape.B; ++b)
      plan.segments.push_back({b, plan.rank > 0, plan.rank < plan.ranks - 1, b});
  } else {
    plan.chains = 1;
    plan.local_cu_seqlens.push_back(0);
    for (std::int64_t n = 0; n < global.N; ++n) {
      const auto begin = core::load<std::int64_t>(shard.cu_seqlens, n);
      const auto end = core::load<std::int64_t>(shard.cu_seqlens, n + 1);
      if (end <= t0 || begin >= t1) continue;
      plan.segments.push_back({n, begin<t0, end> t1, 0});
      plan.local_cu_seqlens.push_back(std::min(end, t1) - t0);
    }
  }
  plan.shape.N = static_cast<std::int64_t>(plan.segments.size());
  return plan;
}

LocalProblem::LocalProblem(const ShardPlan& plan, const DeltaRuleInputs& shard,
                           const float* carried_in) {
  const DeltaRuleShape& s = plan.shape;
  const std::int64_t row = plan.state_size();
  initial_state = HostTensor::zeros(DType::f32, {s.N, s.HV, s.K, s.V});
  final_state = HostTensor::zeros(DType::f32, {s.N, s.HV, s.K, s.V});
  d_final_state = HostTensor::zeros(DType::f32, {s.N, s.HV, s.K, s.V});
  dh0 = HostTensor::zeros(DType::f32, {s.N, s.HV, s.K, s.V});
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& seg = plan.segments[i];
    float* dst = initial_state.as<float>() + static_cast<std::int64_t>(i) * row;
    if (seg.from_previous)
      std::copy_n(carried_in + seg.chain * row, row, dst);
    else if (shard.initial_state.given())
      core::load_row(shard.initial_state, seg.sequence * row, row, dst);
  }
  inputs = shard;
  inputs.initial_state = initial_state.ref();
  inputs.cu_seqlens = {};
  if (!plan.local_cu_seqlens.empty()) {
    cu_seqlens = HostTensor::zeros(DType::i64, {s.N + 1});
    std::copy(plan.local_cu_seqlens.begin(), plan.local_cu_seqlens.end(),
              cu_seqlens.as<std::int64_t>());
    inputs.cu_seqlens = cu_seqlens.ref();
  }
}

std::vector<float> LocalProblem::carried_out(const ShardPlan& plan) const {
  const std::int64_t row = plan.state_size();
  std::vector<float> out(static_cast<std::size_t>(plan.carried_size()), 0.0f);
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    if (plan.segments[i].to_next)
      std::copy_n(final_state.as<float>() + static_cast<std::int64_t>(i) * row, row,
                  out.data() + plan.segments[i].chain * row);
  return out;
}

void LocalProblem::write_final_state(const ShardPlan& plan, const TensorRef& user) const {
  write_owned_rows(plan, final_state, user, &Segment::to_next);
}

void LocalProblem::set_d_final_state(const ShardPlan& plan, const TensorRef& user,
                                     const float* carried) {
  const std::int64_t row = plan.state_size();
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& seg = plan.segments[i];
    float* dst = d_final_state.as<float>() + static_cast<std::int64_t>(i) * row;
    if (seg.to_next)
      std::copy_n(carried + seg.chain * row, row, dst);
    else if (user.given())
      core::load_row(user, seg.sequence * row, row, dst);
    else
      std::fill_n(dst, row, 0.0f);
  }
}

std::vector<float> LocalProblem::carried_grad_out(const ShardPlan& plan) const {
  const std::int64_t row = plan.state_size();
  std::vector<float> out(static_cast<std::size_t>(plan.carried_size()), 0.0f);
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    if (plan.segments[i].from_previous)
      std::copy_n(dh0.as<float>() + static_cast<std::int64_t>(i) * row, row,
                  out.data() + plan.segments[i].chain * row);
  return out;
}

void LocalProblem::write_dh0(const ShardPlan& plan, const TensorRef& user) const {
  write_owned_rows(plan, dh0, user, &Segment::from_previous);
}

}  // namespace gdn::cp
