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

}  // namespace

ShardPlan plan_shard(Communicator& comm, Backend& backend, const DeltaRuleInputs& shard,
                     std::int64_t& checked_T) {
  ShardPlan plan;
  plan.rank = comm.rank();
  plan.ranks = comm.size();
  plan.ranks_on_host = comm.ranks_on_host();
  DeltaRuleInputs local = shard;
  local.cu_seqlens = {};
  local.initial_state = {};
  plan.shape = validate(local);
  const DeltaRuleShape global = validate(global_view(shard, plan.ranks));

  if (checked_T != plan.shape.T) {
    // Through the backend's memory: a device communicator takes device buffers.
    const Buffer mine = backend.allocate(sizeof(std::int64_t));
    const Buffer all =
        backend.allocate(sizeof(std::int64_t) * static_cast<std::size_t>(plan.ranks));
    backend.copy(mine.data(), &plan.shape.T, sizeof(std::int64_t));
    comm.all_gather(mine.data(), all.data(), sizeof(std::int64_t));
    const HostTensor lengths = backend.to_host(all.view(DType::i64, {plan.ranks}));
    for (int r = 0; r < plan.ranks; ++r)
      if (lengths.as<std::int64_t>()[r] != plan.shape.T)
        throw Error(
            fmt::format("rank {}: every rank must hold T / P tokens: this rank has {}, rank "
                        "{} has {}",
                        plan.rank, plan.shape.T, r, lengths.as<std::int64_t>()[r]));
    checked_T = plan.shape.T;
  }

  plan.global_sequences = global.N;
  const std::int64_t t0 = plan.rank * plan.shape.T, t1 = t0 + plan.shape.T;
  if (!shard.cu_seqlens.given()) {
    plan.chains = plan.shape.B;
    for (std::int64_t b = 0; b < plan.shape.B; ++b)
      plan.segments.push_back({b, plan.rank > 0, plan.rank < plan.ranks - 1, b});
  } else {
    plan.chains = 1;
    plan.local_cu_seqlens.push_back(0);
    for (std::int64_t n = 0; n <= global.N; ++n)
      plan.cu_seqlens.push_back(core::load<std::int64_t>(shard.cu_seqlens, n));
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

Carried carried(const ShardPlan& plan) {
  Carried c;
  for (const Segment& seg : plan.segments) {
    c.enters = c.enters || seg.from_previous;
    c.leaves = c.leaves || seg.to_next;
  }
  return c;
}

}  // namespace gdn::cp
