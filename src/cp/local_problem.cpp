#include "cp/local_problem.h"

namespace gdn::cp {
namespace {

std::size_t row_bytes(const ShardPlan& plan) {
  return static_cast<std::size_t>(plan.state_size()) * sizeof(float);
}

}  // namespace

LocalProblem::LocalProblem(Backend& b, const ShardPlan& p, const DeltaRuleInputs& shard)
    : backend(b), plan(p) {
  const DeltaRuleShape& s = plan.shape;
  const std::size_t states = static_cast<std::size_t>(s.N) * row_bytes(plan);
  initial_state = backend.allocate(states);
  final_state = backend.allocate(states);
  d_final_state = backend.allocate(states);
  dh0 = backend.allocate(states);
  if (shard.initial_state.given()) {
    const Buffer user = backend.load_states(shard.initial_state);
    for (std::size_t i = 0; i < plan.segments.size(); ++i)
      if (!plan.segments[i].from_previous)
        backend.copy(static_cast<char*>(initial_state.data()) + i * row_bytes(plan),
                     static_cast<const char*>(user.data()) +
                         static_cast<std::size_t>(plan.segments[i].sequence) * row_bytes(plan),
                     row_bytes(plan));
  }
  inputs = shard;
  inputs.initial_state = initial_state.view(DType::f32, {s.N, s.HV, s.K, s.V});
  inputs.cu_seqlens = {};
  if (!plan.local_cu_seqlens.empty()) {
    cu_seqlens_host = HostTensor::zeros(DType::i64, {s.N + 1});
    std::copy(plan.local_cu_seqlens.begin(), plan.local_cu_seqlens.end(),
              cu_seqlens_host.as<std::int64_t>());
    cu_seqlens = backend.allocate(cu_seqlens_host.bytes.size());
    backend.copy(cu_seqlens.data(), cu_seqlens_host.bytes.data(), cu_seqlens.bytes());
    inputs.cu_seqlens = cu_seqlens.view(DType::i64, {s.N + 1});
  }
}

void LocalProblem::copy_rows(const Buffer& local, const Buffer& carried, bool Segment::*flag,
                             bool to_carried) const {
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    if (!(plan.segments[i].*flag)) continue;
    char* l = static_cast<char*>(local.data()) + i * row_bytes(plan);
    char* c = static_cast<char*>(carried.data()) +
              static_cast<std::size_t>(plan.segments[i].chain) * row_bytes(plan);
    backend.copy(to_carried ? c : l, to_carried ? l : c, row_bytes(plan));
  }
}

void LocalProblem::write_owned(const Buffer& local, bool Segment::*crosses,
                               const TensorRef& user) const {
  if (!user.given()) return;
  const Buffer all =
      backend.allocate(static_cast<std::size_t>(plan.global_sequences) * row_bytes(plan));
  for (std::size_t i = 0; i < plan.segments.size(); ++i)
    if (!(plan.segments[i].*crosses))
      backend.copy(static_cast<char*>(all.data()) +
                       static_cast<std::size_t>(plan.segments[i].sequence) * row_bytes(plan),
                   static_cast<const char*>(local.data()) + i * row_bytes(plan), row_bytes(plan));
  backend.store_states(all, user);
}

void LocalProblem::enter(const Buffer& carried) {
  copy_rows(initial_state, carried, &Segment::from_previous, false);
}

void LocalProblem::leave(const Buffer& carried) const {
  copy_rows(final_state, carried, &Segment::to_next, true);
}

void LocalProblem::write_final_state(const TensorRef& user) const {
  write_owned(final_state, &Segment::to_next, user);
}

void LocalProblem::set_d_final_state(const TensorRef& user) {
  const Buffer zero = backend.allocate(row_bytes(plan));
  const Buffer all = backend.load_states(user);
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& seg = plan.segments[i];
    const bool from_user = !seg.to_next && user.given();
    backend.copy(static_cast<char*>(d_final_state.data()) + i * row_bytes(plan),
                 from_user ? static_cast<const char*>(all.data()) +
                                 static_cast<std::size_t>(seg.sequence) * row_bytes(plan)
                           : zero.data(),
                 row_bytes(plan));
  }
}

void LocalProblem::enter_grad(const Buffer& carried) {
  copy_rows(d_final_state, carried, &Segment::to_next, false);
}

void LocalProblem::leave_grad(const Buffer& carried) const {
  copy_rows(dh0, carried, &Segment::from_previous, true);
}

void LocalProblem::write_dh0(const TensorRef& user) const {
  write_owned(dh0, &Segment::from_previous, user);
}

}  // namespace gdn::cp
