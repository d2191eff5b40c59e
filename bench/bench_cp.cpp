// Context parallelism on the CPU, in-process ranks (each rank gets cores / P OpenMP threads):
// the cost of an affine summary relative to a local pass (spec 4), Ulysses' re-layout, and every
// strategy's time (the table `auto` is judged by; its rows name the strategy auto picked).
// Qwen3.5-like heads (HK=16, HV=32, K=V=128), f32. The constants of src/cp/cost_model.cpp come
// from here (bench/RESULTS.md, "CP cost model").
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>

#include "cp/backend.h"
#include "cp/shard.h"
#include "cp/ulysses.h"
#include "cpu/summary.h"
#include "gdn/context_parallel.h"
#include "gdn/delta_rule.h"
#include "gdn/problem.h"

namespace {

gdn::Problem problem(std::int64_t T) {
  gdn::Problem p;
  p.T = T;
  p.initial_state = true;
  return p;
}

// One shard's local forward, its summary (M and N: a middle rank's), the local backward and its G
// pass, and the summary N alone (the first rank's: it enters nothing, so it has no M).
void local_pass(benchmark::State& state) {
  const gdn::Problem p = problem(state.range(0));
  gdn::ProblemData data = gdn::generate(p);
  gdn::ProblemResults r = gdn::allocate_results(p, gdn::DType::f32);
  const gdn::DeltaRuleInputs in = data.inputs();
  const gdn::DeltaRuleShape s = gdn::validate(in);
  std::vector<float> M(static_cast<std::size_t>(p.HV * p.K * p.K)), N(p.HV * p.K * p.V);
  for (auto _ : state) {
    switch (state.range(1)) {
      case 0:
        gdn::delta_rule_forward(in, r.outputs());
        break;
      case 1:
        gdn::cpu::chunked_summary(in, s, 0, M.data(), N.data());
        break;
      case 2:
        gdn::delta_rule_backward(in, r.grads(data));
        break;
      case 3:
        gdn::cpu::chunked_initial_state_grad(in, s, 0, data.d_o.ref(), nullptr, N.data());
        break;
      case 4:
        gdn::cpu::chunked_summary(in, s, 0, nullptr, N.data());
    }
  }
  state.SetLabel(state.range(1) == 0   ? "forward"
                 : state.range(1) == 1 ? "summary (M, N)"
                 : state.range(1) == 2 ? "backward"
                 : state.range(1) == 3 ? "G pass"
                                       : "summary N alone");
}

// The CPU backend with a local op that only writes its outputs' pages: Ulysses' exchanges alone.
class ExchangeOnly final : public gdn::cp::Backend {
 public:
  gdn::Memory memory() const override { return gdn::Memory::host; }
  gdn::cp::Buffer allocate(std::size_t bytes) override { return cpu_->allocate(bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override { cpu_->copy(dst, src, bytes); }
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t height) override {
    cpu_->copy_2d(dst, dst_pitch, src, src_pitch, width, height);
  }
  gdn::HostTensor to_host(const gdn::TensorRef& t) override { return cpu_->to_host(t); }
  gdn::cp::Buffer load_states(const gdn::TensorRef& user) override {
    return cpu_->load_states(user);
  }
  void store_states(const gdn::cp::Buffer& states, const gdn::TensorRef& user) override {
    cpu_->store_states(states, user);
  }
  void apply(const float* maps, std::int64_t count, std::int64_t K, std::int64_t V, const float* x,
             float* y) override {
    cpu_->apply(maps, count, K, V, x, y);
  }
  void compose(const float* second, const float* first, std::int64_t count, std::int64_t K,
               std::int64_t V, float* out) override {
    cpu_->compose(second, first, count, K, V, out);
  }
  void transpose_matrices(float* maps, std::int64_t count, std::int64_t K) override {
    cpu_->transpose_matrices(maps, count, K);
  }
  std::unique_ptr<gdn::cp::LocalOp> local_op(const gdn::DeltaRuleInputs& local,
                                             const gdn::TensorRef& cu_seqlens,
                                             gdn::cp::Carried carried, bool save) override {
    return cpu_->local_op(local, cu_seqlens, carried, save);
  }
  void forward(const gdn::DeltaRuleInputs&, const gdn::TensorRef&,
               const gdn::DeltaRuleOutputs& out) override {
    for (const gdn::TensorRef* t : {&out.o, &out.final_state})
      if (t->given())
        std::fill_n(static_cast<char*>(t->data), t->numel() * gdn::dtype_size(t->dtype), 0);
  }
  void backward(const gdn::DeltaRuleInputs&, const gdn::TensorRef&,
                const gdn::DeltaRuleGrads&) override {}

 private:
  std::unique_ptr<gdn::cp::Backend> cpu_ = gdn::cp::cpu_backend();
};

// Ulysses' forward without its local op: q, k, v, g, beta to head shards and o back, through
// fresh buffers (the re-layout term of the model). Bytes: one rank's shard of those tensors.
void ulysses_relayout(benchmark::State& state) {
  const gdn::Problem p = problem(state.range(0));
  const int ranks = static_cast<int>(state.range(1));
  const gdn::ProblemData data = gdn::generate(p);
  std::vector<gdn::ProblemData> shards;
  std::vector<gdn::ProblemResults> results;
  for (int r = 0; r < ranks; ++r) {
    shards.push_back(gdn::shard_of(data, r, ranks));
    results.push_back(gdn::allocate_results(shards.back(), gdn::DType::f32));
  }
  for (auto _ : state)
    gdn::run_in_process(ranks, [&](gdn::Communicator& comm) {
      ExchangeOnly backend;
      const auto r = static_cast<std::size_t>(comm.rank());
      const gdn::DeltaRuleInputs in = shards[r].inputs();
      std::int64_t checked_T = -1;
      const gdn::cp::ShardPlan plan = gdn::cp::plan_shard(comm, backend, in, checked_T);
      gdn::cp::ulysses_forward(comm, backend, plan, in, results[r].outputs());
    });
  const gdn::ProblemData& s = shards[0];
  std::size_t bytes = results[0].o.bytes.size();
  for (const gdn::HostTensor* t : {&s.q, &s.k, &s.v, &s.g, &s.beta}) bytes += t->bytes.size();
  state.counters["shard MB"] = static_cast<double>(bytes) * 1e-6;
  state.counters["ns/byte"] = benchmark::Counter(
      static_cast<double>(bytes) * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// One composition (M2 M1, M2 N1 + N2) of HV = 32 heads' maps, K = V = 128 (the c of the model).
void compose(benchmark::State& state) {
  const std::unique_ptr<gdn::cp::Backend> backend = gdn::cp::cpu_backend();
  const std::int64_t count = 32, K = 128;
  std::vector<float> a(static_cast<std::size_t>(count * 2 * K * K)), out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 1e-3f * float(i % 7);
  for (auto _ : state) {
    backend->compose(a.data(), a.data(), count, K, K, out.data());
    benchmark::DoNotOptimize(out.data());
  }
}

// A message between two in-process ranks and back (the a and b of the model): 8 B and 8 MiB.
void ping_pong(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> a(bytes), b(bytes);
  const int rounds = 20;
  for (auto _ : state)
    gdn::run_in_process(2, [&](gdn::Communicator& comm) {
      for (int i = 0; i < rounds; ++i)
        if (comm.rank() == 0) {
          comm.send(a.data(), bytes, 1);
          comm.recv(a.data(), bytes, 1);
        } else {
          comm.recv(b.data(), bytes, 0);
          comm.send(b.data(), bytes, 0);
        }
    });
  state.counters["one way (s)"] =
      benchmark::Counter(double(state.iterations()) * 2 * rounds,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void strategy(benchmark::State& state) {
  const gdn::Problem p = problem(state.range(0));
  const int ranks = static_cast<int>(state.range(1));
  const auto strategy = static_cast<gdn::Strategy>(state.range(2));
  const bool backward = state.range(3) != 0;
  gdn::ProblemData data = gdn::generate(p);
  const int cores = omp_get_max_threads();
  std::size_t bytes = 0;
  gdn::Strategy used = strategy;
  for (auto _ : state) {
    gdn::run_in_process(ranks, [&](gdn::Communicator& comm) {
      omp_set_num_threads(std::max(1, cores / ranks));
      gdn::ProblemData shard = gdn::shard_of(data, comm.rank(), ranks);
      gdn::ProblemResults r = gdn::allocate_results(shard, gdn::DType::f32);
      gdn::CpDeltaRule op(comm, {strategy, false, backward});
      op.forward(shard.inputs(), r.outputs());
      if (backward) op.backward(shard.inputs(), r.grads(shard));
      if (comm.rank() == 0) bytes = comm.bytes_sent(), used = op.strategy();
    });
  }
  state.counters["sent/rank0 MB"] = static_cast<double>(bytes) * 1e-6;
  const std::string name = used == strategy ? std::string(gdn::strategy_name(strategy))
                                            : "auto: " + std::string(gdn::strategy_name(used));
  state.SetLabel(name + (backward ? " fwd+bwd" : " fwd"));
}

BENCHMARK(local_pass)
    ->ArgsProduct({{1024}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(compose)->Unit(benchmark::kMillisecond);
BENCHMARK(ping_pong)->Arg(8)->Arg(8 << 20)->UseRealTime();
BENCHMARK(ulysses_relayout)
    ->ArgsProduct({{4096, 8192}, {2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(strategy)
    ->ArgsProduct({{2048, 4096, 8192}, {2, 4}, {0, 1, 2, 3, 4, 5}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
