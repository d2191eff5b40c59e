// Context parallelism on one GPU: every strategy over P virtual ranks (run_on_one_gpu), forward
// and backward with device memory end to end, against the float64 recurrence (the single-GPU
// op's tolerances) and against the single-GPU op itself. Skips without a GPU.
//
// Why not within 1e-5 of the single-GPU op: its chunk passes round the state to bf16 as a
// tensor-core operand, so a state that enters a chunk through a composed map (M x + N in f32)
// differs in its last bf16 bits from one carried chunk by chunk, and the difference spreads to
// every output at the size of the op's own error. The single-GPU op does the same where it cuts
// a sequence into segments, so it differs from itself as much when its segments move (Ulysses
// runs it on fewer heads, so with other segments: 2e-3..5e-3 from the whole). So the test holds
// the context-parallel result to the op's tolerance against float64 and to within 30% of the
// single-GPU op's own error there, and prints the difference from the single-GPU result.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_testing.h"
#include "gdn/context_parallel.h"
#include "gdn/cuda.h"
#include "gdn/error.h"
#include "gdn/gpu_communicator.h"
#include "gdn/problem.h"
#include "testing.h"

namespace gdn {
namespace {

constexpr double kOutputTolerance = 8e-3;  // test_cuda_delta_rule's, against float64
constexpr double kGradTolerance = 1.5e-2;
constexpr double kSlack = 1.3;  // against float64: at most this times the single-GPU op's error

// The outputs and gradients of a problem in device memory, and their host copies.
struct DeviceResults {
  DeviceTensor o, ht, dq, dk, dv, dg, dbeta, dh0;
  explicit DeviceResults(const ProblemData& d) {
    const DType dt = d.q.dtype;
    const std::int64_t N = d.initial_state.shape.empty() ? 0 : d.initial_state.shape[0];
    std::vector<std::int64_t> states = {N, d.v.shape[2], d.q.shape[3], d.v.shape[3]};
    if (d.cu_seqlens.bytes.empty()) states[0] = d.q.shape[0];
    o.make(dt, d.v.shape, nullptr);
    ht.make(DType::f32, states, nullptr);
    dq.make(dt, d.q.shape, nullptr);
    dk.make(dt, d.k.shape, nullptr);
    dv.make(dt, d.v.shape, nullptr);
    dg.make(DType::f32, d.g.shape, nullptr);
    dbeta.make(d.beta.dtype, d.beta.shape, nullptr);
    if (!d.initial_state.bytes.empty()) dh0.make(DType::f32, states, nullptr);
  }
  DeltaRuleOutputs outputs() const { return {o.ref, ht.ref}; }
  DeltaRuleGrads grads(const DeviceTensor& d_o, const DeviceTensor& dht) const {
    return {d_o.ref, dht.ref, dq.ref, dk.ref, dv.ref, dg.ref, dbeta.ref, dh0.ref};
  }
  ProblemResults download() const {
    ProblemResults r;
    r.o = o.download(), r.final_state = ht.download(), r.dq = dq.download();
    r.dk = dk.download(), r.dv = dv.download(), r.dg = dg.download();
    r.dbeta = dbeta.download();
    if (dh0.data) r.dh0 = dh0.download();
    return r;
  }
};

// A problem's inputs in device memory.
struct DeviceInputs {
  DeviceTensor q, k, v, g, beta, h0, cu, d_o, dht;
  DeltaRuleInputs in;
  explicit DeviceInputs(ProblemData& d)
      : q(d.q),
        k(d.k),
        v(d.v),
        g(d.g),
        beta(d.beta),
        h0(d.initial_state),
        cu(d.cu_seqlens),
        d_o(d.d_o),
        dht(d.d_final_state) {
    in = d.inputs();
    in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
    in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
  }
};

struct Reference {
  ProblemData data;
  ProblemResults f64, gpu;  // the recurrence, and the single-GPU op
};

Problem problem(std::int64_t T, std::vector<std::int64_t> seqlens = {}, std::int64_t B = 1) {
  Problem p;
  p.B = B, p.T = T, p.HK = 8, p.HV = 8, p.K = 128, p.V = 128;
  p.seqlens = std::move(seqlens);
  p.dtype = DType::bf16;
  p.initial_state = B == 1;
  p.final_state_grad = true;
  p.seed = static_cast<std::uint64_t>(T * 3 + B + p.seqlens.size());
  return p;
}

// The named problems: aligned shards of 8 or 16 chunks, unaligned shards, varlen sequences
// across ranks, two batch rows without an initial state, and full resets (issue 11; reference()
// writes them over g).
Problem named(const std::string& name) {
  if (name == "T4096" || name == "resets") return problem(4096);
  if (name == "T3072") return problem(3072);
  if (name == "T3000") return problem(3000);
  if (name == "varlen") return problem(4096, {700, 63, 1000, 1, 2332});
  return problem(2048, {}, 2);  // "B2"
}

const Reference& reference(const std::string& name) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Reference& r = cache[name];
  const Problem p = named(name);
  r.data = generate(p);
  if (name == "resets") {  // at the shard ends of P = 2, 4, 8, several in a chunk, at random
    const std::vector<std::int64_t> tokens = {0,    1,    511,  512,  1023, 1024, 1030, 1031, 1040,
                                              1087, 2047, 2048, 3071, 3072, 3583, 3584, 4095};
    EXPECT_GT(testing::add_resets(r.data, tokens, 0.003, 41), 0);
  }
  r.f64 = allocate_results(p, DType::f64);
  delta_rule_forward(r.data.inputs(), r.f64.outputs(), Method::recurrent);
  delta_rule_backward(r.data.inputs(), r.f64.grads(r.data), Method::recurrent);
  DeviceInputs d(r.data);
  DeviceResults out(r.data);
  CudaContext ctx;
  ctx.cu_seqlens_host = r.data.cu_seqlens.bytes.empty() ? TensorRef{} : r.data.cu_seqlens.ref();
  const std::size_t fwd = delta_rule_forward_cuda_workspace(d.in, ctx.cu_seqlens_host);
  const std::size_t bwd = delta_rule_backward_cuda_workspace(d.in, ctx.cu_seqlens_host);
  DeviceTensor workspace(DType::i32, {static_cast<std::int64_t>(std::max(fwd, bwd) / 4 + 64)});
  ctx.workspace = workspace.data;
  ctx.workspace_bytes = std::max(fwd, bwd);
  delta_rule_forward_cuda(d.in, out.outputs(), ctx);
  delta_rule_backward_cuda(d.in, out.grads(d.d_o, d.dht), ctx);
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  r.gpu = out.download();
  return r;
}

// Every rank's results, gathered on the host.
ProblemResults run_cp(const Reference& ref, int ranks, CpOptions options) {
  ProblemResults whole = ref.gpu;  // shapes and dtypes; every value is overwritten or summed
  for (HostTensor* t : {&whole.final_state, &whole.dh0})
    std::fill(t->bytes.begin(), t->bytes.end(), std::byte{0});
  std::mutex mutex;
  run_on_one_gpu(ranks, [&](Communicator& comm) {
    ProblemData shard = shard_of(ref.data, comm.rank(), ranks);
    DeviceInputs d(shard);
    DeviceResults out(shard);
    std::unique_ptr<CpDeltaRule> op = cuda_cp_delta_rule(comm, options);
    op->forward(d.in, out.outputs());
    op->backward(d.in, out.grads(d.d_o, d.dht));
    comm.synchronize();
    const ProblemResults mine = out.download();
    const std::lock_guard lock(mutex);
    gather_shard(mine, comm.rank(), whole);
  });
  return whole;
}

std::string fmt_item(const char* name, double err, double single, double diff) {
  char buf[128];
  std::snprintf(buf, sizeof buf, " %s %.2e/%.2e/%.1e", name, err, single, diff);
  return buf;
}

// Compares every output and gradient; returns the largest difference from the single-GPU op.
double check(const Reference& ref, const ProblemResults& got, const std::string& what) {
  struct Item {
    const char* name;
    const HostTensor ProblemResults::*field;
    double tol;
  };
  const Item items[] = {{"o", &ProblemResults::o, kOutputTolerance},
                        {"final_state", &ProblemResults::final_state, kOutputTolerance},
                        {"dq", &ProblemResults::dq, kGradTolerance},
                        {"dk", &ProblemResults::dk, kGradTolerance},
                        {"dv", &ProblemResults::dv, kGradTolerance},
                        {"dg", &ProblemResults::dg, kGradTolerance},
                        {"dbeta", &ProblemResults::dbeta, kGradTolerance},
                        {"dh0", &ProblemResults::dh0, kGradTolerance}};
  std::string line;
  double worst = 0;
  for (const Item& item : items) {
    if ((ref.f64.*item.field).bytes.empty()) continue;
    const double err = relative_error((got.*item.field).ref(), (ref.f64.*item.field).ref());
    const double single = relative_error((ref.gpu.*item.field).ref(), (ref.f64.*item.field).ref());
    const double diff = relative_error((got.*item.field).ref(), (ref.gpu.*item.field).ref());
    worst = std::max(worst, diff);
    line += fmt_item(item.name, err, single, diff);
    EXPECT_LE(err, item.tol) << what << ": " << item.name;
    EXPECT_LE(err, kSlack * single) << what << ": " << item.name;
  }
  std::printf("[ cp       ] %s (error vs f64, 1 GPU's, difference from 1 GPU):%s\n", what.c_str(),
              line.c_str());
  return worst;
}

using Case = std::tuple<std::string, Strategy, int>;

class CudaCp : public ::testing::TestWithParam<Case> {};

TEST_P(CudaCp, EqualsTheSingleGpuOp) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto& [name, strategy, ranks] = GetParam();
  const Reference& ref = reference(name);
  const ProblemResults got = run_cp(ref, ranks, {strategy});
  check(ref, got,
        name + " " + std::string(strategy_name(strategy)) + " P=" + std::to_string(ranks));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Strategy s : all_strategies()) {
    for (int P : {2, 4, 8}) out.emplace_back("T4096", s, P);
    if (s != Strategy::ulysses) out.emplace_back("T3072", s, 3);
    for (int P : {4, 8}) out.emplace_back("T3000", s, P);
    if (s != Strategy::ulysses) out.emplace_back("T3000", s, 3);
    for (int P : {2, 4, 8}) out.emplace_back("varlen", s, P);
    out.emplace_back("B2", s, 4);
    for (int P : {2, 4}) out.emplace_back("resets", s, P);
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s(strategy_name(std::get<1>(info.param)));
  for (char& c : s)
    if (c == '-') c = '_';
  return std::get<0>(info.param) + "_" + s + "_P" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Strategies, CudaCp, ::testing::ValuesIn(cases()), case_name);

// The backward rebuilding M instead of keeping it, and a training forward that keeps the
// per-chunk states for the backward.
TEST(CudaCpOptions, RecomputeSummaryAndSavedStates) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Reference& ref = reference("varlen");
  for (Strategy s : {Strategy::summary_chain, Strategy::summary_allgather, Strategy::scan})
    check(ref, run_cp(ref, 4, {s, true}),
          "varlen " + std::string(strategy_name(s)) + " P=4 recompute_summary");
  for (Strategy s : all_strategies())
    check(ref, run_cp(ref, 4, {s, false, true}),
          "varlen " + std::string(strategy_name(s)) + " P=4 save_for_backward");
}

TEST(CudaCpOptions, RejectsAHostCommunicator) {
  run_in_process(1, [](Communicator& comm) { EXPECT_THROW(cuda_cp_delta_rule(comm), Error); });
}

}  // namespace
}  // namespace gdn
