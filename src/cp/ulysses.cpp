#include "cp/ulysses.h"

#include <fmt/format.h>

#include "gdn/error.h"

namespace gdn::cp {
namespace {

std::size_t to_size(std::int64_t n) {
  return static_cast<std::size_t>(n);
}

// Moves [B, T_local, H, D] token shards to [B, T, H / P, D] head shards (to_heads), or back.
// Rank r's tokens are [r T_local, (r+1) T_local); rank j's heads [j H / P, (j+1) H / P). Each
// rank's block is one strided copy each way.
void transpose_shards(Communicator& comm, Backend& backend, const ShardPlan& plan,
                      const TensorRef& from, const TensorRef& to, bool to_heads) {
  const TensorRef& tokens = to_heads ? from : to;
  const std::int64_t P = plan.ranks, B = tokens.shape[0], Tl = tokens.shape[1];
  const std::int64_t H = tokens.shape[2];
  const std::int64_t D = tokens.shape.size() > 3 ? tokens.shape[3] : 1;
  const std::size_t e = dtype_size(tokens.dtype), piece = to_size(H / P * D) * e;
  const std::size_t row = to_size(H * D) * e, block = to_size(B * Tl) * piece;
  const std::size_t run = to_size(Tl) * piece;  // one rank's tokens of one batch row, head shard
  const Buffer send = backend.allocate(block * to_size(P)), recv = backend.allocate(send.bytes());
  auto* src = static_cast<const char*>(from.data);
  auto* dst = static_cast<char*>(to.data);
  auto* out = static_cast<char*>(send.data());
  auto* in = static_cast<const char*>(recv.data());
  // Block j of the send buffer goes to rank j, packed as [B, T_local, H / P, D].
  for (std::int64_t j = 0; j < P; ++j)
    if (to_heads)
      backend.copy_2d(out + to_size(j) * block, piece, src + to_size(j) * piece, row, piece,
                      to_size(B * Tl));
    else
      backend.copy_2d(out + to_size(j) * block, run, src + to_size(j) * run, run * to_size(P), run,
                      to_size(B));
  const std::vector<std::size_t> counts(to_size(P), block);
  comm.all_to_all(send.data(), counts, recv.data(), counts);
  for (std::int64_t i = 0; i < P; ++i)
    if (to_heads)
      backend.copy_2d(dst + to_size(i) * run, run * to_size(P), in + to_size(i) * block, run, run,
                      to_size(B));
    else
      backend.copy_2d(dst + to_size(i) * piece, row, in + to_size(i) * block, piece, piece,
                      to_size(B * Tl));
}

// A head shard's tensor of a token tensor's shape: T times P, heads over P.
TensorRef heads_of(Backend& backend, const TensorRef& tokens, const ShardPlan& plan,
                   std::vector<Buffer>& keep) {
  std::vector<std::int64_t> shape = tokens.shape;
  shape[1] *= plan.ranks;
  shape[2] /= plan.ranks;
  std::int64_t numel = 1;
  for (std::int64_t d : shape) numel *= d;
  keep.push_back(backend.allocate(to_size(numel) * dtype_size(tokens.dtype)));
  return keep.back().view(tokens.dtype, shape);
}

// The rank that holds a sequence's first (start = true) or last token.
std::vector<int> owners(const ShardPlan& plan, bool start) {
  std::vector<int> owner(to_size(plan.global_sequences), start ? 0 : plan.ranks - 1);
  if (!plan.cu_seqlens.empty())
    for (std::int64_t n = 0; n < plan.global_sequences; ++n) {
      const std::int64_t t =
          start ? plan.cu_seqlens[to_size(n)] : plan.cu_seqlens[to_size(n + 1)] - 1;
      owner[to_size(n)] = static_cast<int>(t / plan.shape.T);
    }
  return owner;
}

// State rows [N, HV, K, V] held by their owners -> [N, HV / P, K, V] f32 on every head shard.
Buffer rows_to_heads(Communicator& comm, Backend& backend, const ShardPlan& plan,
                     const TensorRef& user, const std::vector<int>& owner) {
  const std::int64_t P = plan.ranks, N = plan.global_sequences;
  const std::size_t piece = to_size(plan.shape.HV / P * plan.shape.K * plan.shape.V) * 4;
  const Buffer rows = backend.load_states(user);
  std::vector<std::size_t> send_bytes(to_size(P)), recv_bytes(to_size(P));
  std::size_t sent = 0;
  for (std::int64_t n = 0; n < N; ++n)
    if (owner[to_size(n)] == plan.rank) sent += to_size(P) * piece;
  const Buffer send = backend.allocate(sent), recv = backend.allocate(to_size(N) * piece);
  std::size_t at = 0;
  for (std::int64_t j = 0; j < P; ++j)
    for (std::int64_t n = 0; n < N; ++n) {
      if (owner[to_size(n)] == plan.rank) {
        backend.copy(static_cast<char*>(send.data()) + at,
                     static_cast<const char*>(rows.data()) + (to_size(n * P + j)) * piece, piece);
        at += piece;
        send_bytes[to_size(j)] += piece;
      }
      if (j == 0) recv_bytes[to_size(owner[to_size(n)])] += piece;
    }
  comm.all_to_all(send.data(), send_bytes, recv.data(), recv_bytes);
  // From rank i come the rows it owns, in sequence order.
  std::vector<std::size_t> offset(to_size(P), 0);
  for (std::int64_t i = 1; i < P; ++i)
    offset[to_size(i)] = offset[to_size(i - 1)] + recv_bytes[to_size(i - 1)];
  const Buffer heads = backend.allocate(to_size(N) * piece);
  for (std::int64_t n = 0; n < N; ++n) {
    std::size_t& from = offset[to_size(owner[to_size(n)])];
    backend.copy(static_cast<char*>(heads.data()) + to_size(n) * piece,
                 static_cast<const char*>(recv.data()) + from, piece);
    from += piece;
  }
  return heads;
}

// The inverse: [N, HV / P, K, V] on every head shard -> rows of the user's tensor on their
// owners (other rows zero).
void heads_to_rows(Communicator& comm, Backend& backend, const ShardPlan& plan, const Buffer& heads,
                   const std::vector<int>& owner, const TensorRef& user) {
  const std::int64_t P = plan.ranks, N = plan.global_sequences;
  const std::size_t piece = to_size(plan.shape.HV / P * plan.shape.K * plan.shape.V) * 4;
  std::vector<std::size_t> send_bytes(to_size(P)), recv_bytes(to_size(P));
  for (std::int64_t n = 0; n < N; ++n) {
    send_bytes[to_size(owner[to_size(n)])] += piece;
    if (owner[to_size(n)] == plan.rank)
      for (std::int64_t j = 0; j < P; ++j) recv_bytes[to_size(j)] += piece;
  }
  // heads is in sequence order; the send buffer wants it grouped by owner.
  const Buffer send = backend.allocate(to_size(N) * piece);
  std::size_t at = 0;
  for (std::int64_t i = 0; i < P; ++i)
    for (std::int64_t n = 0; n < N; ++n)
      if (owner[to_size(n)] == i) {
        backend.copy(static_cast<char*>(send.data()) + at,
                     static_cast<const char*>(heads.data()) + to_size(n) * piece, piece);
        at += piece;
      }
  std::size_t received = 0;
  for (std::size_t b : recv_bytes) received += b;
  const Buffer recv = backend.allocate(received);
  comm.all_to_all(send.data(), send_bytes, recv.data(), recv_bytes);
  if (!user.given()) return;
  // From rank j come its head slices of the rows this rank owns, in sequence order.
  const Buffer rows = backend.allocate(to_size(N * P) * piece);
  const char* from = static_cast<const char*>(recv.data());
  for (std::int64_t j = 0; j < P; ++j)
    for (std::int64_t n = 0; n < N; ++n)
      if (owner[to_size(n)] == plan.rank) {
        backend.copy(static_cast<char*>(rows.data()) + to_size(n * P + j) * piece, from, piece);
        from += piece;
      }
  backend.store_states(rows, user);
}

void require_divisible_heads(const ShardPlan& plan) {
  if (plan.shape.HK % plan.ranks != 0 || plan.shape.HV % plan.ranks != 0)
    throw Error(fmt::format("ulysses needs HK ({}) and HV ({}) divisible by the ranks ({})",
                            plan.shape.HK, plan.shape.HV, plan.ranks));
}

// The head shard's inputs: q, k, v, g, beta moved to heads; initial_state rows fetched; the
// global cu_seqlens (host and backend copies).
struct HeadProblem {
  std::vector<Buffer> keep;
  HostTensor cu_seqlens_host;
  Buffer initial_state;
  DeltaRuleInputs inputs;

  HeadProblem(Communicator& comm, Backend& backend, const ShardPlan& plan,
              const DeltaRuleInputs& shard) {
    inputs = shard;
    for (auto [from, to] : {std::pair{&shard.q, &inputs.q},
                            {&shard.k, &inputs.k},
                            {&shard.v, &inputs.v},
                            {&shard.g, &inputs.g},
                            {&shard.beta, &inputs.beta}}) {
      *to = heads_of(backend, *from, plan, keep);
      transpose_shards(comm, backend, plan, *from, *to, true);
    }
    if (shard.initial_state.given()) {
      initial_state = rows_to_heads(comm, backend, plan, shard.initial_state, owners(plan, true));
      inputs.initial_state = initial_state.view(DType::f32, state_shape(plan));
    }
    if (!plan.cu_seqlens.empty()) {
      cu_seqlens_host = HostTensor::zeros(DType::i64, {plan.global_sequences + 1});
      std::copy(plan.cu_seqlens.begin(), plan.cu_seqlens.end(), cu_seqlens_host.as<std::int64_t>());
    }
  }

  static std::vector<std::int64_t> state_shape(const ShardPlan& plan) {
    return {plan.global_sequences, plan.shape.HV / plan.ranks, plan.shape.K, plan.shape.V};
  }
};

}  // namespace

void ulysses_forward(Communicator& comm, Backend& backend, const ShardPlan& plan,
                     const DeltaRuleInputs& shard, const DeltaRuleOutputs& out) {
  require_divisible_heads(plan);
  HeadProblem heads(comm, backend, plan, shard);
  const TensorRef o = heads_of(backend, out.o, plan, heads.keep);
  const Buffer final_state = backend.allocate(
      to_size(plan.global_sequences * plan.shape.HV / plan.ranks * plan.shape.K * plan.shape.V) *
      4);
  backend.forward(heads.inputs, heads.cu_seqlens_host.ref(),
                  {o, final_state.view(DType::f32, HeadProblem::state_shape(plan))});
  transpose_shards(comm, backend, plan, o, out.o, false);
  heads_to_rows(comm, backend, plan, final_state, owners(plan, false), out.final_state);
}

void ulysses_backward(Communicator& comm, Backend& backend, const ShardPlan& plan,
                      const DeltaRuleInputs& shard, const DeltaRuleGrads& grads) {
  require_divisible_heads(plan);
  HeadProblem heads(comm, backend, plan, shard);
  DeltaRuleGrads g;
  g.d_o = heads_of(backend, grads.d_o, plan, heads.keep);
  transpose_shards(comm, backend, plan, grads.d_o, g.d_o, true);
  Buffer d_final_state, dh0;
  if (grads.d_final_state.given()) {
    d_final_state = rows_to_heads(comm, backend, plan, grads.d_final_state, owners(plan, false));
    g.d_final_state = d_final_state.view(DType::f32, HeadProblem::state_shape(plan));
  }
  const std::pair<const TensorRef*, TensorRef*> outputs[] = {{&grads.dq, &g.dq},
                                                             {&grads.dk, &g.dk},
                                                             {&grads.dv, &g.dv},
                                                             {&grads.dg, &g.dg},
                                                             {&grads.dbeta, &g.dbeta}};
  for (auto [user, head] : outputs) *head = heads_of(backend, *user, plan, heads.keep);
  if (shard.initial_state.given()) {
    dh0 = backend.allocate(heads.initial_state.bytes());
    g.dh0 = dh0.view(DType::f32, HeadProblem::state_shape(plan));
  }
  backend.backward(heads.inputs, heads.cu_seqlens_host.ref(), g);
  for (auto [user, head] : outputs) transpose_shards(comm, backend, plan, *head, *user, false);
  if (shard.initial_state.given())
    heads_to_rows(comm, backend, plan, dh0, owners(plan, true), grads.dh0);
}

}  // namespace gdn::cp
