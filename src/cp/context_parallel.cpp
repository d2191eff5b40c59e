#include "gdn/context_parallel.h"

#include <fmt/format.h>

#include "cp/affine.h"
#include "cp/cost_model.h"
#include "cp/exchange.h"
#include "cp/local_problem.h"
#include "cp/shard.h"
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
  std::unique_ptr<cp::LocalProblem> local;
  std::unique_ptr<cp::LocalOp> op;
  cp::AffineMaps forward_maps;  // kept for backward unless options.recompute_summary
};

CpDeltaRule::CpDeltaRule(Communicator& comm, CpOptions options)
    : CpDeltaRule(comm, cp::cpu_backend(), options) {}

CpDeltaRule::CpDeltaRule(Communicator& comm, std::unique_ptr<cp::Backend> backend,
                         CpOptions options)
    : comm_(comm), backend_(std::move(backend)), options_(options) {
  if (backend_->memory() != comm.memory())
    throw Error(fmt::format("CpDeltaRule: the op runs on {} memory but the communicator's is {}",
                            backend_->memory() == Memory::host ? "host" : "device",
                            comm.memory() == Memory::host ? "host" : "device"));
}

CpDeltaRule::~CpDeltaRule() = default;

Strategy CpDeltaRule::strategy() const {
  if (!saved_) throw Error("CpDeltaRule::strategy: call forward first");
  return saved_->strategy;
}

void CpDeltaRule::forward(const DeltaRuleInputs& shard, const DeltaRuleOutputs& out) {
  saved_.reset();
  auto saved = std::make_unique<Saved>();
  DeltaRuleInputs host_view = shard;
  HostTensor cu_seqlens;
  if (shard.cu_seqlens.given()) {
    cu_seqlens = backend_->to_host(shard.cu_seqlens);
    host_view.cu_seqlens = cu_seqlens.ref();
  }
  saved->plan = cp::plan_shard(comm_, *backend_, host_view, checked_T_);
  const cp::ShardPlan& plan = saved->plan;
  validate_outputs(shard, user_shape(plan), out);
  saved->strategy = options_.strategy == Strategy::automatic
                        ? cp::choose_strategy(plan, backend_->memory(), options_.save_for_backward)
                        : options_.strategy;
  const int rank = plan.rank, last = plan.ranks - 1;
  if (saved->strategy == Strategy::ulysses) {
    cp::ulysses_forward(comm_, *backend_, plan, shard, out);
    saved_ = std::move(saved);
    return;
  }
  saved->local = std::make_unique<cp::LocalProblem>(*backend_, plan, shard);
  cp::LocalProblem& local = *saved->local;
  saved->op = backend_->local_op(local.inputs, local.cu_seqlens_host.ref(), cp::carried(plan),
                                 options_.save_for_backward);
  cp::LocalOp& op = *saved->op;
  op.forward_summaries();  // before and while the entering state travels
  const std::size_t carried_bytes = static_cast<std::size_t>(plan.carried_size()) * 4;
  cp::Buffer carried_in = backend_->allocate(carried_bytes);
  if (saved->strategy == Strategy::relay) {
    if (rank > 0) comm_.recv(carried_in.data(), carried_bytes, rank - 1);
  } else {
    cp::AffineMaps maps = new_maps(plan);
    op.forward_maps(maps.M());
    carried_in = cp::exclusive_prefix(comm_, *backend_, saved->strategy, maps, false);
    if (!options_.recompute_summary) saved->forward_maps = std::move(maps);
  }
  local.enter(carried_in);
  op.forward_output({out.o, local.final_state.view(DType::f32, {plan.shape.N, plan.shape.HV,
                                                                plan.shape.K, plan.shape.V})});
  if (saved->strategy == Strategy::relay && rank < last) {
    const cp::Buffer carried_out = backend_->allocate(carried_bytes);
    local.leave(carried_out);
    comm_.send(carried_out.data(), carried_bytes, rank + 1);
  }
  local.write_final_state(out.final_state);
  saved_ = std::move(saved);
}

void CpDeltaRule::backward(const DeltaRuleInputs& shard, const DeltaRuleGrads& grads) {
  if (!saved_) throw Error("CpDeltaRule::backward: call forward on this shard first");
  const cp::ShardPlan& plan = saved_->plan;
  validate_grads(shard, user_shape(plan), grads);
  if (saved_->strategy == Strategy::ulysses)
    return cp::ulysses_backward(comm_, *backend_, plan, shard, grads);

  const int rank = plan.rank, last = plan.ranks - 1;
  const DeltaRuleShape& s = plan.shape;
  cp::LocalProblem& local = *saved_->local;
  cp::LocalOp& op = *saved_->op;
  local.set_d_final_state(grads.d_final_state);
  DeltaRuleGrads local_grads = grads;
  local_grads.d_final_state = local.d_final_state.view(DType::f32, {s.N, s.HV, s.K, s.V});
  local_grads.dh0 = local.dh0.view(DType::f32, {s.N, s.HV, s.K, s.V});
  op.backward_summaries(local_grads);
  const std::size_t carried_bytes = static_cast<std::size_t>(plan.carried_size()) * 4;
  cp::Buffer carried_grad = backend_->allocate(carried_bytes);
  if (saved_->strategy == Strategy::relay) {
    if (rank < last) comm_.recv(carried_grad.data(), carried_bytes, rank + 1);
  } else {
    // (M^T, G): M from the forward (kept, or rebuilt: M does not depend on the entering state).
    cp::AffineMaps forward = saved_->forward_maps;
    if (!forward.data.data()) {
      forward = new_maps(plan);
      op.forward_maps(forward.M());
    }
    cp::AffineMaps maps = new_maps(plan);
    backend_->copy(maps.M(), forward.M(), maps.bytes() - maps.offset_bytes());
    backend_->transpose_matrices(maps.M(), maps.count, maps.K);
    op.backward_map(local_grads, maps.M());
    carried_grad = cp::exclusive_prefix(comm_, *backend_, saved_->strategy, maps, true);
  }
  local.enter_grad(carried_grad);
  op.backward_output(local_grads);
  if (saved_->strategy == Strategy::relay && rank > 0) {
    const cp::Buffer carried_out = backend_->allocate(carried_bytes);
    local.leave_grad(carried_out);
    comm_.send(carried_out.data(), carried_bytes, rank - 1);
  }
  local.write_dh0(grads.dh0);
}

cp::AffineMaps CpDeltaRule::new_maps(const cp::ShardPlan& plan) {
  return cp::AffineMaps::zeros(*backend_, plan.chains * plan.shape.HV, plan.shape.K, plan.shape.V);
}

}  // namespace gdn
