#include "gdn/context_parallel.h"

#include <fmt/format.h>

#include "cp/cost_model.h"
#include "cp/exchange.h"
#include "cp/shard.h"
#include "cp/summaries.h"
#include "cp/ulysses.h"
#include "gdn/error.h"
#include "validate.h"

namespace gdn {

namespace {

constexpr std::pair<Strategy, std::string_view> kNames[] = {
    {Strategy::relay, "relay"},
    {Strategy::summary_chain, "summary-chain"},
    {Strategy::summary_allgather, "summary-allgather"},
    {Strategy::scan, "scan"},
    {Strategy::ulysses, "ulysses"},
    {Strategy::automatic, "auto"},
};

// The shape that the user's tensors have: the shard's tokens, the whole problem's sequences.
DeltaRuleShape user_shape(const cp::ShardPlan& plan) {
  DeltaRuleShape s = plan.shape;
  s.N = plan.global_sequences;
  return s;
}

}  // namespace

std::string_view strategy_name(Strategy strategy) {
  for (const auto& [s, name] : kNames)
    if (s == strategy) return name;
  throw Error("strategy_name: unknown strategy");
}

Strategy parse_strategy(std::string_view name) {
  std::string names;
  for (const auto& [s, known] : kNames) {
    if (known == name) return s;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", known);
  }
  throw Error(fmt::format("strategy must be one of {}, got \"{}\"", names, name));
}

std::vector<Strategy> all_strategies() {
  return {Strategy::relay, Strategy::summary_chain, Strategy::summary_allgather, Strategy::scan,
          Strategy::ulysses};
}

struct CpDeltaRule::Saved {
  Strategy strategy;
  cp::ShardPlan plan;
  std::vector<float> carried_in;  // the states that entered this rank's segments
  cp::AffineMaps forward_maps;    // kept for backward unless options.recompute_summary
};

CpDeltaRule::CpDeltaRule(Communicator& comm, CpOptions options) : comm_(comm), options_(options) {}
CpDeltaRule::~CpDeltaRule() = default;

Strategy CpDeltaRule::strategy() const {
  if (!saved_) throw Error("CpDeltaRule::strategy: call forward first");
  return saved_->strategy;
}

void CpDeltaRule::forward(const DeltaRuleInputs& shard, const DeltaRuleOutputs& out) {
  auto saved = std::make_unique<Saved>();
  saved->plan = cp::plan_shard(comm_, shard);
  const cp::ShardPlan& plan = saved->plan;
  validate_outputs(user_shape(plan), out);
  saved->strategy =
      options_.strategy == Strategy::automatic ? cp::choose_strategy(plan) : options_.strategy;
  const int rank = plan.rank, last = plan.ranks - 1;
  if (saved->strategy == Strategy::ulysses) {
    cp::ulysses_forward(comm_, plan, shard, out);
    saved_ = std::move(saved);
    return;
  }
  const auto carried_bytes = static_cast<std::size_t>(plan.carried_size()) * sizeof(float);
  saved->carried_in.assign(static_cast<std::size_t>(plan.carried_size()), 0.0f);
  if (saved->strategy == Strategy::relay) {
    if (rank > 0) comm_.recv(saved->carried_in.data(), carried_bytes, rank - 1);
  } else {
    saved->forward_maps = rank < last ? cp::forward_maps(plan, shard)
                                      : cp::AffineMaps::zeros(plan.chains * plan.shape.HV,
                                                              plan.shape.K, plan.shape.V);
    saved->carried_in = cp::exclusive_prefix(comm_, saved->strategy, saved->forward_maps, false);
    if (options_.recompute_summary) saved->forward_maps = {};
  }
  cp::LocalProblem local(plan, shard, saved->carried_in.data());
  delta_rule_forward(local.inputs, {out.o, local.final_state.ref()});
  if (saved->strategy == Strategy::relay && rank < last)
    comm_.send(local.carried_out(plan).data(), carried_bytes, rank + 1);
  local.write_final_state(plan, out.final_state);
  saved_ = std::move(saved);
}

void CpDeltaRule::backward(const DeltaRuleInputs& shard, const DeltaRuleGrads& grads) {
  if (!saved_) throw Error("CpDeltaRule::backward: call forward on this shard first");
  const cp::ShardPlan& plan = saved_->plan;
  validate_grads(shard, user_shape(plan), grads);
  if (saved_->strategy == Strategy::ulysses) return cp::ulysses_backward(comm_, plan, shard, grads);

  const int rank = plan.rank, last = plan.ranks - 1;
  const auto carried_bytes = static_cast<std::size_t>(plan.carried_size()) * sizeof(float);
  cp::LocalProblem local(plan, shard, saved_->carried_in.data());
  std::vector<float> carried_grad(static_cast<std::size_t>(plan.carried_size()), 0.0f);
  if (saved_->strategy == Strategy::relay) {
    if (rank < last) comm_.recv(carried_grad.data(), carried_bytes, rank + 1);
  } else {
    const auto zeros = [&] {
      return cp::AffineMaps::zeros(plan.chains * plan.shape.HV, plan.shape.K, plan.shape.V);
    };
    cp::AffineMaps maps = zeros();
    if (rank > 0) {
      cp::AffineMaps forward = saved_->forward_maps;
      if (forward.data.empty()) forward = rank < last ? cp::forward_maps(plan, shard) : zeros();
      maps = cp::backward_maps(plan, local, grads.d_o, grads.d_final_state, std::move(forward));
    }
    carried_grad = cp::exclusive_prefix(comm_, saved_->strategy, maps, true);
  }
  local.set_d_final_state(plan, grads.d_final_state, carried_grad.data());
  DeltaRuleGrads local_grads = grads;
  local_grads.d_final_state = local.d_final_state.ref();
  local_grads.dh0 = local.dh0.ref();
  delta_rule_backward(local.inputs, local_grads);
  if (saved_->strategy == Strategy::relay && rank > 0)
    comm_.send(local.carried_grad_out(plan).data(), carried_bytes, rank - 1);
  local.write_dh0(plan, grads.dh0);
}

}  // namespace gdn
