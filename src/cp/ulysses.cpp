#include "cp/ulysses.h"

#include <fmt/format.h>

#include <cstring>

#include "core/layout.h"
#include "gdn/error.h"

namespace gdn::cp {
namespace {

std::size_t to_size(std::int64_t n) {
  return static_cast<std::size_t>(n);
}

// Moves [B, T_local, H, D] token shards to [B, T, H / P, D] head shards (forward = true), or
// back. Rank r's tokens are [r T_local, (r+1) T_local); rank j's heads [j H / P, (j+1) H / P).
void transpose_shards(Communicator& comm, const ShardPlan& plan, const TensorRef& from,
                      const TensorRef& to, bool to_heads) {
  const TensorRef& tokens = to_heads ? from : to;
  const std::int64_t P = plan.ranks, B = tokens.shape[0], Tl = tokens.shape[1];
  const std::int64_t H = tokens.shape[2];
  const std::int64_t D = tokens.shape.size() > 3 ? tokens.shape[3] : 1;
  const std::int64_t Hp = H / P, e = static_cast<std::int64_t>(dtype_size(tokens.dtype));
  const std::int64_t piece = Hp * D * e, block = B * Tl * piece;  // bytes per (b, t), per rank
  std::vector<std::byte> send(to_size(block * P)), recv(send.size());
  const auto* src = static_cast<const std::byte*>(from.data);
  auto* dst = static_cast<std::byte*>(to.data);
  // Block j of the send buffer goes to rank j, packed as [B, T_local, H / P, D].
  for (std::int64_t j = 0; j < P; ++j)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < Tl; ++t) {
        const std::int64_t at = to_heads ? ((b * Tl + t) * H + j * Hp) * D * e
                                         : ((b * Tl * P + j * Tl + t) * Hp) * D * e;
        std::memcpy(send.data() + j * block + (b * Tl + t) * piece, src + at, to_size(piece));
      }
  const std::vector<std::size_t> counts(to_size(P), to_size(block));
  comm.all_to_all(send.data(), counts, recv.data(), counts);
  for (std::int64_t i = 0; i < P; ++i)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < Tl; ++t) {
        const std::int64_t at = to_heads ? ((b * Tl * P + i * Tl + t) * Hp) * D * e
                                         : ((b * Tl + t) * H + i * Hp) * D * e;
        std::memcpy(dst + at, recv.data() + i * block + (b * Tl + t) * piece, to_size(piece));
      }
}

HostTensor heads_of(const TensorRef& tokens, const ShardPlan& plan) {
  std::vector<std::int64_t> shape = tokens.shape;
  shape[1] *= plan.ranks;
  shape[2] /= plan.ranks;
  return HostTensor::zeros(tokens.dtype, shape);
}

// The rank that holds a sequence's first (start = true) or last token.
std::vector<int> owners(const ShardPlan& plan, const DeltaRuleInputs& shard, bool start) {
  std::vector<int> owner(to_size(plan.global_sequences), start ? 0 : plan.ranks - 1);
  if (shard.cu_seqlens.given())
    for (std::int64_t n = 0; n < plan.global_sequences; ++n) {
      const auto t = start ? core::load<std::int64_t>(shard.cu_seqlens, n)
                           : core::load<std::int64_t>(shard.cu_seqlens, n + 1) - 1;
      owner[to_size(n)] = static_cast<int>(t / plan.shape.T);
    }
  return owner;
}

// State rows [N, HV, K, V] held by their owners -> [N, HV / P, K, V] f32 on every head shard.
HostTensor rows_to_heads(Communicator& comm, const ShardPlan& plan, const TensorRef& user,
                         const std::vector<int>& owner) {
  const std::int64_t P = plan.ranks, N = plan.global_sequences, HVp = plan.shape.HV / P;
  const std::int64_t piece = HVp * plan.shape.K * plan.shape.V;  // floats of one row's slice
  std::vector<float> send;
  std::vector<std::size_t> send_bytes(to_size(P)), recv_bytes(to_size(P));
  for (std::int64_t j = 0; j < P; ++j)
    for (std::int64_t n = 0; n < N; ++n) {
      if (owner[to_size(n)] == plan.rank) {
        send.resize(send.size() + to_size(piece));
        core::load_row(user, (n * plan.shape.HV + j * HVp) * plan.shape.K * plan.shape.V, piece,
                      send.data() + send.size() - to_size(piece));
        send_bytes[to_size(j)] += to_size(piece) * sizeof(float);
      }
      recv_bytes[to_size(owner[to_size(n)])] += j == 0 ? to_size(piece) * sizeof(float) : 0;
    }
  HostTensor heads = HostTensor::zeros(DType::f32, {N, HVp, plan.shape.K, plan.shape.V});
  std::vector<float> recv(to_size(N * piece));
  comm.all_to_all(send.data(), send_bytes, recv.data(), recv_bytes);
  // From rank i come the rows it owns, in sequence order.
  std::vector<std::int64_t> offset(to_size(P), 0);
  for (std::int64_t i = 1; i < P; ++i)
    offset[to_size(i)] = offset[to_size(i - 1)] +
                         static_cast<std::int64_t>(recv_bytes[to_size(i - 1)] / sizeof(float));
  for (std::int64_t n = 0; n < N; ++n) {
    std::int64_t& at = offset[to_size(owner[to_size(n)])];
    std::copy_n(recv.data() + at, piece, heads.as<float>() + n * piece);
    at += piece;
  }
  return heads;
}

// The inverse: [N, HV / P, K, V] on every head shard -> rows of the user's tensor on their
// owners (other rows zero).
void heads_to_rows(Communicator& comm, const ShardPlan& plan, const HostTensor& heads,
                   const std::vector<int>& owner, const TensorRef& user) {
  const std::int64_t P = plan.ranks, N = plan.global_sequences, HVp = plan.shape.HV / P;
  const std::int64_t piece = HVp * plan.shape.K * plan.shape.V;
  std::vector<float> send;
  std::vector<std::size_t> send_bytes(to_size(P)), recv_bytes(to_size(P));
  for (std::int64_t i = 0; i < P; ++i)
    for (std::int64_t n = 0; n < N; ++n)
      if (owner[to_size(n)] == i) {
        send.insert(send.end(), heads.as<float>() + n * piece, heads.as<float>() + (n + 1) * piece);
        send_bytes[to_size(i)] += to_size(piece) * sizeof(float);
        if (i == plan.rank)
          for (std::int64_t j = 0; j < P; ++j)
            recv_bytes[to_size(j)] += to_size(piece) * sizeof(float);
      }
  std::vector<float> recv(std::max<std::size_t>(1, [&] {
    std::size_t total = 0;
    for (std::size_t b : recv_bytes) total += b / sizeof(float);
    return total;
  }()));
  comm.all_to_all(send.data(), send_bytes, recv.data(), recv_bytes);
  if (!user.given()) return;
  const std::vector<float> zeros(to_size(plan.shape.HV * plan.shape.K * plan.shape.V), 0.0f);
  for (std::int64_t n = 0; n < N; ++n)
    core::store_row(user, n * plan.shape.HV * plan.shape.K * plan.shape.V,
                   static_cast<std::int64_t>(zeros.size()), zeros.data());
  // From rank j come its head slices of the rows this rank owns, in sequence order.
  const float* from = recv.data();
  for (std::int64_t j = 0; j < P; ++j)
    for (std::int64_t n = 0; n < N; ++n)
      if (owner[to_size(n)] == plan.rank) {
        core::store_row(user, (n * plan.shape.HV + j * HVp) * plan.shape.K * plan.shape.V, piece,
                       from);
        from += piece;
      }
}

void require_divisible_heads(const ShardPlan& plan) {
  if (plan.shape.HK % plan.ranks != 0 || plan.shape.HV % plan.ranks != 0)
    throw Error(fmt::format("ulysses needs HK ({}) and HV ({}) divisible by the ranks ({})",
                            plan.shape.HK, plan.shape.HV, plan.ranks));
}

// The head shard's inputs: q, k, v, g, beta moved to heads; initial_state rows fetched.
struct HeadProblem {
  HostTensor q, k, v, g, beta, initial_state;
  DeltaRuleInputs inputs;

  HeadProblem(Communicator& comm, const ShardPlan& plan, const DeltaRuleInputs& shard) {
    q = heads_of(shard.q, plan);
    k = heads_of(shard.k, plan);
    v = heads_of(shard.v, plan);
    g = heads_of(shard.g, plan);
    beta = heads_of(shard.beta, plan);
    transpose_shards(comm, plan, shard.q, q.ref(), true);
    transpose_shards(comm, plan, shard.k, k.ref(), true);
    transpose_shards(comm, plan, shard.v, v.ref(), true);
    transpose_shards(comm, plan, shard.g, g.ref(), true);
    transpose_shards(comm, plan, shard.beta, beta.ref(), true);
    inputs = shard;
    inputs.q = q.ref();
    inputs.k = k.ref();
    inputs.v = v.ref();
    inputs.g = g.ref();
    inputs.beta = beta.ref();
    if (shard.initial_state.given()) {
      initial_state = rows_to_heads(comm, plan, shard.initial_state, owners(plan, shard, true));
      inputs.initial_state = initial_state.ref();
    }
  }
};

}  // namespace

void ulysses_forward(Communicator& comm, const ShardPlan& plan, const DeltaRuleInputs& shard,
                     const DeltaRuleOutputs& out) {
  require_divisible_heads(plan);
  HeadProblem heads(comm, plan, shard);
  HostTensor o = heads_of(out.o, plan);
  HostTensor final_state = HostTensor::zeros(
      DType::f32, {plan.global_sequences, plan.shape.HV / plan.ranks, plan.shape.K, plan.shape.V});
  delta_rule_forward(heads.inputs, {o.ref(), final_state.ref()});
  transpose_shards(comm, plan, o.ref(), out.o, false);
  heads_to_rows(comm, plan, final_state, owners(plan, shard, false), out.final_state);
}

void ulysses_backward(Communicator& comm, const ShardPlan& plan, const DeltaRuleInputs& shard,
                      const DeltaRuleGrads& grads) {
  require_divisible_heads(plan);
  HeadProblem heads(comm, plan, shard);
  HostTensor d_o = heads_of(grads.d_o, plan);
  transpose_shards(comm, plan, grads.d_o, d_o.ref(), true);
  DeltaRuleGrads g;
  g.d_o = d_o.ref();
  HostTensor d_final_state;
  if (grads.d_final_state.given()) {
    d_final_state = rows_to_heads(comm, plan, grads.d_final_state, owners(plan, shard, false));
    g.d_final_state = d_final_state.ref();
  }
  HostTensor dq = heads_of(grads.dq, plan), dk = heads_of(grads.dk, plan);
  HostTensor dv = heads_of(grads.dv, plan), dg = heads_of(grads.dg, plan);
  HostTensor dbeta = heads_of(grads.dbeta, plan), dh0;
  g.dq = dq.ref();
  g.dk = dk.ref();
  g.dv = dv.ref();
  g.dg = dg.ref();
  g.dbeta = dbeta.ref();
  if (shard.initial_state.given()) {
    dh0 = HostTensor::zeros(DType::f32, heads.initial_state.shape);
    g.dh0 = dh0.ref();
  }
  delta_rule_backward(heads.inputs, g);
  transpose_shards(comm, plan, dq.ref(), grads.dq, false);
  transpose_shards(comm, plan, dk.ref(), grads.dk, false);
  transpose_shards(comm, plan, dv.ref(), grads.dv, false);
  transpose_shards(comm, plan, dg.ref(), grads.dg, false);
  transpose_shards(comm, plan, dbeta.ref(), grads.dbeta, false);
  if (shard.initial_state.given())
    heads_to_rows(comm, plan, dh0, owners(plan, shard, true), grads.dh0);
}

}  // namespace gdn::cp
