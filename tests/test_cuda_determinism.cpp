// The CUDA backward is deterministic: the same inputs give the same bytes of every gradient (and
// output), run to run, on the single-GPU op (recomputing the forward's intermediates, reading
// the forward's workspace, reading its saved states) and under context parallelism (every
// strategy on virtual ranks of one GPU). Skips without a GPU.
//
// Each problem runs three times on fresh buffers: runs 0 and 1 with the workspaces filled with
// the same bytes (determinism), run 2 with other (finite) bytes in them, which catches a kernel
// that reads workspace memory that no kernel of the call wrote. A backward that reads the
// forward's workspace must leave it as it was (gdn/cuda.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "gdn/context_parallel.h"
#include "gdn/cuda.h"
#include "gdn/delta_rule.h"
#include "gdn/error.h"
#include "gdn/gpu_communicator.h"
#include "gdn/problem.h"

namespace gdn {
namespace {

// The outputs and gradients of one run, by name, in host memory.
struct Bytes {
  std::vector<std::string> names;
  std::vector<HostTensor> tensors;
};

// A device buffer of `bytes` filled with `fill`, freed with the object.
struct Workspace {
  void* data = nullptr;
  explicit Workspace(std::size_t bytes, int fill) {
    GDN_CUDA_CHECK(cudaMalloc(&data, bytes > 0 ? bytes : 1));
    GDN_CUDA_CHECK(cudaMemset(data, fill, bytes > 0 ? bytes : 1));
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { cudaFree(data); }
};

// A device buffer's bytes, in host memory (a synchronous copy).
std::vector<unsigned char> download_bytes(const void* data, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  GDN_CUDA_CHECK(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost));
  return host;
}

enum class Mode { recompute, reuse, saved };

const char* mode_name(Mode m) {
  return m == Mode::recompute ? "recompute" : m == Mode::reuse ? "reuse" : "saved";
}

// One forward and backward of `data` on fresh device buffers (outputs zeroed, workspaces filled
// with `fill`); host_offsets: give cu_seqlens_host.
Bytes run_once(ProblemData& data, Mode mode, bool host_offsets, int fill) {
  DeviceTensor q(data.q), k(data.k), v(data.v), g(data.g), beta(data.beta), h0(data.initial_state),
      cu(data.cu_seqlens), d_o(data.d_o), dht(data.d_final_state);
  DeltaRuleInputs in = data.inputs();
  in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
  in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
  const DType dt = data.q.dtype;
  std::vector<std::int64_t> states = {data.q.shape[0], data.v.shape[2], 128, 128};
  if (!data.cu_seqlens.bytes.empty()) states[0] = data.cu_seqlens.shape[0] - 1;
  DeviceTensor o(dt, data.v.shape), ht(DType::f32, states);
  DeviceTensor dq(dt, data.q.shape), dk(dt, data.k.shape), dv(dt, data.v.shape),
      dg(DType::f32, data.g.shape), dbeta(data.beta.dtype, data.beta.shape);
  DeviceTensor dh0;
  if (!data.initial_state.bytes.empty()) dh0.make(DType::f32, states, nullptr);

  const bool reuse = mode != Mode::recompute, save = mode == Mode::saved;
  CudaContext ctx;
  if (host_offsets && !data.cu_seqlens.bytes.empty()) ctx.cu_seqlens_host = data.cu_seqlens.ref();
  const std::size_t forward_bytes =
      delta_rule_forward_cuda_workspace(in, ctx.cu_seqlens_host, save);
  const std::size_t backward_bytes =
      delta_rule_backward_cuda_workspace(in, ctx.cu_seqlens_host, reuse, save);
  Workspace forward(forward_bytes, fill), backward(backward_bytes, fill);
  ctx.workspace = forward.data;
  ctx.workspace_bytes = forward_bytes;
  ctx.save_for_backward = save;
  delta_rule_forward_cuda(in, {o.ref, ht.ref}, ctx);
  ctx.workspace = backward.data;
  ctx.workspace_bytes = backward_bytes;
  if (reuse) {
    ctx.forward_workspace = forward.data;
    ctx.forward_workspace_bytes = forward_bytes;
  }
  // gdn/cuda.h: a backward reads forward_workspace and never writes there.
  std::vector<unsigned char> forward_before;
  if (reuse) forward_before = download_bytes(forward.data, forward_bytes);
  delta_rule_backward_cuda(
      in, {d_o.ref, dht.ref, dq.ref, dk.ref, dv.ref, dg.ref, dbeta.ref, dh0.ref}, ctx);
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  cuda_check_deferred_errors();  // the header check passed
  if (reuse) {
    EXPECT_TRUE(download_bytes(forward.data, forward_bytes) == forward_before)
        << mode_name(mode) << ": the backward changed forward_workspace";
  }

  Bytes out;
  out.names = {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta"};
  for (const DeviceTensor* t : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta})
    out.tensors.push_back(t->download());
  if (dh0.data) {
    out.names.push_back("dh0");
    out.tensors.push_back(dh0.download());
  }
  return out;
}

// The first byte where two runs differ, per tensor, as test failures.
void expect_same_bytes(const Bytes& a, const Bytes& b, const std::string& what) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i].bytes;
    const auto& y = b.tensors[i].bytes;
    ASSERT_EQ(x.size(), y.size()) << what << ": " << a.names[i];
    if (x.empty()) continue;
    if (std::memcmp(x.data(), y.data(), x.size()) == 0) continue;
    std::size_t at = 0;
    while (x[at] == y[at]) ++at;
    std::size_t differing = 0;
    for (std::size_t j = 0; j < x.size(); ++j) differing += x[j] != y[j];
    ADD_FAILURE() << what << ": " << a.names[i] << " differs from byte " << at << " on ("
                  << differing << " of " << x.size() << " bytes differ)";
  }
}

void check_deterministic(const Problem& p, bool host_offsets = true) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ProblemData data = generate(p);
  for (Mode mode : {Mode::recompute, Mode::reuse, Mode::saved}) {
    const std::string what = std::string(mode_name(mode)) + " T=" + std::to_string(p.T) +
                             " B=" + std::to_string(p.B) + " HK=" + std::to_string(p.HK) +
                             " HV=" + std::to_string(p.HV) +
                             " varlen=" + std::to_string(!p.seqlens.empty());
    const Bytes first = run_once(data, mode, host_offsets, 0);
    const Bytes second = run_once(data, mode, host_offsets, 0);
    expect_same_bytes(first, second, what + " (run to run)");
    const Bytes other = run_once(data, mode, host_offsets, 0x3C);  // 0x3C3C: finite bf16, f32
    expect_same_bytes(first, other, what + " (other bytes in the workspaces before the call)");
  }
}

Problem base(std::int64_t T, std::int64_t HK, std::int64_t HV) {
  return hopper_problem(T, HK, HV, 11);
}

// T not a multiple of 64, grouped heads, an initial state.
TEST(CudaDeterminism, UnalignedLengthGroupedHeads) {
  check_deterministic(base(1000, 1, 2));
}
// One sequence cut into several segments (the folds of the summaries).
TEST(CudaDeterminism, LongSequenceInSegments) {
  check_deterministic(base(4096, 2, 4));
}
// 32 value heads at T=4096, one sequence: the backward's chains beside grad_chunk
// (Params::beside), whose blocks wait for the flags the chains set; at T=65536, and for 4
// sequences of T=16384, in rounds.
TEST(CudaDeterminism, ChainsBeside) {
  check_deterministic(base(4096, 16, 32));
  check_deterministic(base(65536, 16, 32));  // in rounds, a segment each
  Problem several = base(16384, 16, 32);     // several sequences in rounds, a segment each
  several.B = 4;
  check_deterministic(several);
}
TEST(CudaDeterminism, TwoBatchRows) {
  Problem p = base(300, 2, 4);
  p.B = 2;
  check_deterministic(p);
}
TEST(CudaDeterminism, BatchRowsWithoutStatesOrL2norm) {
  Problem p = base(200, 2, 2);
  p.B = 2, p.initial_state = false, p.final_state_grad = false, p.use_qk_l2norm = false;
  check_deterministic(p);
}
TEST(CudaDeterminism, Varlen) {
  Problem p = base(0, 2, 4);
  p.seqlens = {1, 63, 64, 65, 700, 130};
  for (auto n : p.seqlens) p.T += n;
  check_deterministic(p);
  check_deterministic(p, false);  // cu_seqlens on the device only
}
TEST(CudaDeterminism, F16) {
  Problem p = base(500, 2, 4);
  p.dtype = DType::f16;
  check_deterministic(p);
}

// Context parallelism: every strategy over 2 and 4 virtual ranks, twice; every rank's bytes.
Bytes run_cp(const ProblemData& whole, int ranks, CpOptions options) {
  std::vector<Bytes> per_rank(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  run_on_one_gpu(ranks, [&](Communicator& comm) {
    ProblemData shard = shard_of(whole, comm.rank(), ranks);
    DeviceTensor q(shard.q), k(shard.k), v(shard.v), g(shard.g), beta(shard.beta),
        h0(shard.initial_state), cu(shard.cu_seqlens), d_o(shard.d_o), dht(shard.d_final_state);
    DeltaRuleInputs in = shard.inputs();
    in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
    in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
    const DType dt = shard.q.dtype;
    std::vector<std::int64_t> states = {shard.q.shape[0], shard.v.shape[2], 128, 128};
    if (!shard.cu_seqlens.bytes.empty()) states[0] = shard.cu_seqlens.shape[0] - 1;
    DeviceTensor o(dt, shard.v.shape), ht(DType::f32, states);
    DeviceTensor dq(dt, shard.q.shape), dk(dt, shard.k.shape), dv(dt, shard.v.shape),
        dg(DType::f32, shard.g.shape), dbeta(shard.beta.dtype, shard.beta.shape);
    DeviceTensor dh0;
    if (!shard.initial_state.bytes.empty()) dh0.make(DType::f32, states, nullptr);
    std::unique_ptr<CpDeltaRule> op = cuda_cp_delta_rule(comm, options);
    op->forward(in, {o.ref, ht.ref});
    op->backward(in, {d_o.ref, dht.ref, dq.ref, dk.ref, dv.ref, dg.ref, dbeta.ref, dh0.ref});
    comm.synchronize();
    Bytes mine;
    mine.names = {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta"};
    for (const DeviceTensor* t : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta})
      mine.tensors.push_back(t->download());
    if (dh0.data) {
      mine.names.push_back("dh0");
      mine.tensors.push_back(dh0.download());
    }
    const std::lock_guard lock(mutex);
    per_rank[static_cast<std::size_t>(comm.rank())] = std::move(mine);
  });
  Bytes all;
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < per_rank[r].tensors.size(); ++i) {
      all.names.push_back("rank " + std::to_string(r) + " " + per_rank[r].names[i]);
      all.tensors.push_back(std::move(per_rank[r].tensors[i]));
    }
  return all;
}

TEST(CudaDeterminism, ContextParallel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Problem whole = base(2048, 4, 8);
  Problem varlen = base(0, 4, 8);
  varlen.seqlens = {700, 63, 1000, 1, 284};
  for (auto n : varlen.seqlens) varlen.T += n;
  for (const Problem& p : {whole, varlen}) {
    const ProblemData data = generate(p);
    for (Strategy s : all_strategies())
      for (int ranks : {2, 4})
        for (bool save : {false, true}) {
          const CpOptions options{s, false, save};
          const std::string what = std::string(strategy_name(s)) + " P=" + std::to_string(ranks) +
                                   (p.seqlens.empty() ? "" : " varlen") +
                                   (save ? " save_for_backward" : "");
          expect_same_bytes(run_cp(data, ranks, options), run_cp(data, ranks, options), what);
        }
  }
}

}  // namespace
}  // namespace gdn
