// CPU benchmark of the chunked gated delta rule at Qwen3.5-like heads (HK=16, HV=32, K=V=128).
// Reports tokens/s and GFLOP/s; the FLOP count per chunk of C tokens and value head is
//   2 (3 C^2 K + 2 C^2 V + 3 C K V) + C^3 / 3
// (K K^T, W, Q K^T; U, P Vn; W S, Q S, K^T Vn; the unit-triangular solve), forward only;
// forward+backward counts 3x the forward.
#include <benchmark/benchmark.h>

#include "gdn/delta_rule.h"
#include "gdn/problem.h"

namespace {

double forward_flops(const gdn::Problem& p) {
  const double C = p.chunk_size, K = double(p.K), V = double(p.V);
  const double per_chunk = 2 * (3 * C * C * K + 2 * C * C * V + 3 * C * K * V) + C * C * C / 3;
  return per_chunk * double(p.T) / C * double(p.HV) * double(p.B);
}

gdn::Problem problem(const benchmark::State& state) {
  gdn::Problem p;
  p.T = state.range(0);
  p.dtype = state.range(1) ? gdn::DType::bf16 : gdn::DType::f32;
  return p;
}

void report(benchmark::State& state, const gdn::Problem& p, double flops) {
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["tokens/s"] =
      benchmark::Counter(double(p.B * p.T) * iterations, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * iterations * 1e-9, benchmark::Counter::kIsRate);
}

void forward(benchmark::State& state) {
  const gdn::Problem p = problem(state);
  gdn::ProblemData data = gdn::generate(p);
  gdn::ProblemResults r = gdn::allocate_results(p, gdn::DType::f32);
  for (auto _ : state) gdn::delta_rule_forward(data.inputs(), r.outputs());
  report(state, p, forward_flops(p));
}

void forward_backward(benchmark::State& state) {
  const gdn::Problem p = problem(state);
  gdn::ProblemData data = gdn::generate(p);
  gdn::ProblemResults r = gdn::allocate_results(p, gdn::DType::f32);
  for (auto _ : state) {
    gdn::delta_rule_forward(data.inputs(), r.outputs());
    gdn::delta_rule_backward(data.inputs(), r.grads(data));
  }
  report(state, p, 3 * forward_flops(p));
}

// Args: {T, bf16 storage}
BENCHMARK(forward)
    ->Args({1024, 0})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(forward_backward)
    ->Args({1024, 0})
    ->Args({4096, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
