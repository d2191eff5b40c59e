// CPU benchmark of the chunked gated delta rule at Qwen3.5-like heads (HK=16, HV=32, K=V=128).
// Reports tokens/s and GFLOP/s; the FLOP count per chunk of C tokens and value head is
//   2 (3 C^2 K + 2 C^2 V + 3 C K V) + C^3 / 3
// (K K^T, W, Q K^T; U, P Vn; W S, Q S, K^T Vn; the unit-triangular solve), forward only;
// forward+backward counts 3x the forward.
//
// The machine's floors, for the cost of each step: fma_peak (AVX-512 FMAs from registers, no
// memory) and the bandwidths read / copy (buffers touched before), fresh_write (a fresh
// buffer of 2 MiB pages written once, as the op's scratch is: page faults included).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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
  p.use_qk_l2norm = state.range(2) != 0;  // without: the generated q, k are unit-norm
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

// Args: {T, bf16 storage, l2norm}
const std::vector<std::string> kArgs{"T", "bf16", "l2norm"};
BENCHMARK(forward)
    ->ArgNames(kArgs)
    ->Args({1024, 0, 1})
    ->Args({2048, 0, 1})
    ->Args({2048, 0, 0})
    ->Args({4096, 0, 1})
    ->Args({4096, 1, 1})
    ->Args({8192, 0, 1})
    ->Args({8192, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(forward_backward)
    ->ArgNames(kArgs)
    ->Args({1024, 0, 1})
    ->Args({2048, 0, 1})
    ->Args({2048, 0, 0})
    ->Args({4096, 0, 1})
    ->Args({8192, 0, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// 16 independent 16-wide FMA chains: enough in flight to fill two FMA pipes of 4-cycle latency.
void fma_peak(benchmark::State& state) {
#if defined(__AVX512F__)
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  constexpr std::int64_t kSteps = 1 << 16;
  for (auto _ : state) {
    for (std::int64_t s = 0; s < kSteps; ++s)
      for (auto& x : acc) x = _mm512_fmadd_ps(x, a, b);
    for (auto& x : acc) benchmark::DoNotOptimize(x);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      double(state.iterations()) * double(kSteps) * 16 * 32 * 1e-9, benchmark::Counter::kIsRate);
#else
  state.SkipWithError("built without AVX-512");
#endif
}
BENCHMARK(fma_peak)->Threads(1)->Threads(2)->UseRealTime();

constexpr std::size_t kStreamBytes = std::size_t{256} << 20;  // per thread, far beyond L3

struct FreeFloats {
  void operator()(float* p) const { std::free(p); }
};
using Floats = std::unique_ptr<float[], FreeFloats>;

// As the op's Buffer: 2 MiB aligned, huge pages advised.
Floats huge_floats(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  Floats p(static_cast<float*>(std::aligned_alloc(kHuge, bytes)));
  madvise(p.get(), bytes, MADV_HUGEPAGE);
  return p;
}

void read_bandwidth(benchmark::State& state) {
  const std::size_t n = kStreamBytes / sizeof(float);
  Floats x = huge_floats(kStreamBytes);
  std::memset(x.get(), 0, kStreamBytes);
  for (auto _ : state) {
    float sum[16] = {};
    for (std::size_t i = 0; i < n; i += 16)
      for (int j = 0; j < 16; ++j) sum[j] += x[i + std::size_t(j)];
    float total = 0;
    for (const float s : sum) total += s;
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(kStreamBytes));
}
BENCHMARK(read_bandwidth)->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void copy_bandwidth(benchmark::State& state) {  // bytes read + bytes written
  Floats x = huge_floats(kStreamBytes), y = huge_floats(kStreamBytes);
  std::memset(x.get(), 0, kStreamBytes);
  std::memset(y.get(), 0, kStreamBytes);
  for (auto _ : state) {
    std::memcpy(y.get(), x.get(), kStreamBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * 2 * std::int64_t(kStreamBytes));
}
BENCHMARK(copy_bandwidth)->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);

void fresh_write(benchmark::State& state) {
  for (auto _ : state) {
    Floats x = huge_floats(kStreamBytes);
    std::memset(x.get(), 1, kStreamBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(kStreamBytes));
}
BENCHMARK(fresh_write)->Threads(1)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
