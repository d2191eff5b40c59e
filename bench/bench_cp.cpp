// Context parallelism on the CPU, in-process ranks (each rank gets cores / P OpenMP threads):
// the cost of an affine summary relative to a local pass (spec 4), and every strategy's time.
// Qwen3.5-like heads (HK=16, HV=32, K=V=128), f32.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>

#include "cp/backend.h"
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

// One shard's local forward, its summary (M and N), the local backward and its G pass.
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
    }
  }
  state.SetLabel(state.range(1) == 0   ? "forward"
                 : state.range(1) == 1 ? "summary (M, N)"
                 : state.range(1) == 2 ? "backward"
                                       : "G pass");
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
  for (auto _ : state) {
    gdn::run_in_process(ranks, [&](gdn::Communicator& comm) {
      omp_set_num_threads(std::max(1, cores / ranks));
      gdn::ProblemData shard = gdn::shard_of(data, comm.rank(), ranks);
      gdn::ProblemResults r = gdn::allocate_results(shard, gdn::DType::f32);
      gdn::CpDeltaRule op(comm, {strategy});
      op.forward(shard.inputs(), r.outputs());
      if (backward) op.backward(shard.inputs(), r.grads(shard));
      if (comm.rank() == 0) bytes = comm.bytes_sent();
    });
  }
  state.counters["sent/rank0 MB"] = static_cast<double>(bytes) * 1e-6;
  state.SetLabel(std::string(gdn::strategy_name(strategy)) + (backward ? " fwd+bwd" : " fwd"));
}

BENCHMARK(local_pass)
    ->ArgsProduct({{1024}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();
BENCHMARK(compose)->Unit(benchmark::kMillisecond);
BENCHMARK(ping_pong)->Arg(8)->Arg(8 << 20)->UseRealTime();
BENCHMARK(strategy)
    ->ArgsProduct({{2048}, {2, 4}, {0, 1, 2, 3, 4}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
