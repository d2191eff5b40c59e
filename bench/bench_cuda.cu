// Times the CUDA delta rule (forward, forward + backward) at the reference shapes, with CUDA
// events: 3 warm-ups, the median of 10 runs, two input sets alternated (each larger than L2).
//
// FLOPs (forward, per chunk of C tokens per value head, tensor-core GEMMs at 2 FLOP per MAC,
// FLA's form plus the C^3/3 of the triangular inverse):
//   F_chunk = 2 (3 C^2 K + 2 C^2 V + 3 C K V) + C^3 / 3
// forward + backward is reported against 4 F (the backward counted as 3 forwards, research/
// kernels.md 3.4), so its TFLOP/s is comparable only between runs of this program.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/check.h"
#include "gdn/cuda.h"

namespace {

using gdn::DType;
using gdn::TensorRef;

// Deterministic pseudo-random fill in [lo, hi) (then mapped per tensor kind).
__global__ void fill_kernel(void* out, long long n, int kind, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    unsigned x =
        static_cast<unsigned>(i) * 2654435761u ^ (seed * 97u + static_cast<unsigned>(i >> 32));
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float u = (x & 0xffffff) / 16777216.0f;  // [0, 1)
    switch (kind) {
      case 0:  // q, k, v, dO: bf16 in [-1, 1)
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(2 * u - 1);
        break;
      case 1:  // beta: bf16 in (0, 1)
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(0.02f + 0.96f * u);
        break;
      default:  // g: f32 log decay in [-0.5, -0.001)
        static_cast<float*>(out)[i] = -0.001f - 0.5f * u;
    }
  }
}

struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) { GDN_CUDA_CHECK(cudaMalloc(&data, n)); }
  ~Buffer() { cudaFree(data); }
};

TensorRef ref(const Buffer& b, DType dtype, std::vector<std::int64_t> shape) {
  return TensorRef{b.data, dtype, std::move(shape)};
}

void fill(Buffer& b, long long n, int kind, unsigned seed) {
  fill_kernel<<<1024, 256>>>(b.data, n, kind, seed);
  GDN_CUDA_CHECK_LAUNCH();
}

template <typename F>
double median_ms(F&& body, cudaStream_t stream) {
  cudaEvent_t start, stop;
  GDN_CUDA_CHECK(cudaEventCreate(&start));
  GDN_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) body(i);
  std::vector<float> times;
  for (int i = 0; i < 10; ++i) {
    GDN_CUDA_CHECK(cudaEventRecord(start, stream));
    body(i);
    GDN_CUDA_CHECK(cudaEventRecord(stop, stream));
    GDN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    GDN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  GDN_CUDA_CHECK(cudaEventDestroy(start));
  GDN_CUDA_CHECK(cudaEventDestroy(stop));
  return (times[4] + times[5]) / 2;
}

void bench(std::int64_t B, std::int64_t T, std::int64_t HK, std::int64_t HV) {
  constexpr std::int64_t K = 128, V = 128, C = 64;
  const long long qk = B * T * HK * K, vv = B * T * HV * V, gate = B * T * HV;
  struct Set {
    Buffer q, k, v, g, beta, d_o;
  };
  std::vector<Set*> sets;
  for (unsigned s = 0; s < 2; ++s) {
    auto* set = new Set{Buffer(qk * 2),   Buffer(qk * 2),   Buffer(vv * 2),
                        Buffer(gate * 4), Buffer(gate * 2), Buffer(vv * 2)};
    fill(set->q, qk, 0, 10 * s + 1);
    fill(set->k, qk, 0, 10 * s + 2);
    fill(set->v, vv, 0, 10 * s + 3);
    fill(set->g, gate, 2, 10 * s + 4);
    fill(set->beta, gate, 1, 10 * s + 5);
    fill(set->d_o, vv, 0, 10 * s + 6);
    sets.push_back(set);
  }
  Buffer o(vv * 2), ht(B * HV * K * V * 4), dq(qk * 2), dk(qk * 2), dv(vv * 2), dg(gate * 4),
      dbeta(gate * 2);
  auto inputs = [&](int i) {
    const Set& s = *sets[i % 2];
    gdn::DeltaRuleInputs in;
    in.q = ref(s.q, DType::bf16, {B, T, HK, K});
    in.k = ref(s.k, DType::bf16, {B, T, HK, K});
    in.v = ref(s.v, DType::bf16, {B, T, HV, V});
    in.g = ref(s.g, DType::f32, {B, T, HV});
    in.beta = ref(s.beta, DType::bf16, {B, T, HV});
    in.use_qk_l2norm = true;
    return in;
  };
  const gdn::DeltaRuleOutputs out{ref(o, DType::bf16, {B, T, HV, V}),
                                  ref(ht, DType::f32, {B, HV, K, V})};
  // fwd: the inference forward. fwd+bwd: the training path, a forward that saves its states
  // for the backward, which reads the forward's workspace.
  const std::size_t ws_fwd = gdn::delta_rule_forward_cuda_workspace(inputs(0));
  const std::size_t ws_train = gdn::delta_rule_forward_cuda_workspace(inputs(0), {}, true);
  const std::size_t ws_bwd = gdn::delta_rule_backward_cuda_workspace(inputs(0), {}, true, true);
  Buffer ws(ws_train), ws_back(ws_bwd);
  cudaStream_t stream;
  GDN_CUDA_CHECK(cudaStreamCreate(&stream));
  gdn::CudaContext ctx{stream, ws.data, ws_fwd, {}};
  gdn::CudaContext train{stream, ws.data, ws.bytes, {}, nullptr, 0, true};
  gdn::CudaContext back{stream, ws_back.data, ws_back.bytes, {}, ws.data, ws.bytes, true};

  const double fwd =
      median_ms([&](int i) { gdn::delta_rule_forward_cuda(inputs(i), out, ctx); }, stream);
  const double fwd_bwd = median_ms(
      [&](int i) {
        const gdn::DeltaRuleInputs in = inputs(i);
        gdn::delta_rule_forward_cuda(in, out, train);
        const gdn::DeltaRuleGrads gr{ref(sets[i % 2]->d_o, DType::bf16, {B, T, HV, V}),
                                     {},
                                     ref(dq, DType::bf16, {B, T, HK, K}),
                                     ref(dk, DType::bf16, {B, T, HK, K}),
                                     ref(dv, DType::bf16, {B, T, HV, V}),
                                     ref(dg, DType::f32, {B, T, HV}),
                                     ref(dbeta, DType::bf16, {B, T, HV}),
                                     {}};
        gdn::delta_rule_backward_cuda(in, gr, back);
      },
      stream);
  const double chunks = static_cast<double>(B * HV * ((T + C - 1) / C));
  const double flops =
      chunks * (2.0 * (3 * C * C * K + 2 * C * C * V + 3 * C * K * V) + C * C * C / 3.0);
  const double io = 2.0 * (2 * qk + vv + gate) * 2 / 2 + gate * 4 + vv * 2;  // in + o bytes
  std::printf(
      "gdn-cuda B=%lld T=%lld HK=%lld HV=%lld: fwd %.3f ms (%.1f TFLOP/s, workspace %.2f GiB) | "
      "fwd+bwd %.3f ms (%.1f TFLOP/s at 4F, workspaces %.2f + %.2f GiB) | inputs+outputs %.2f "
      "GiB\n",
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(HK),
      static_cast<long long>(HV), fwd, flops / fwd / 1e9, ws_fwd / 1073741824.0, fwd_bwd,
      4 * flops / fwd_bwd / 1e9, ws_train / 1073741824.0, ws_bwd / 1073741824.0, io / 1073741824.0);
  std::fflush(stdout);
  GDN_CUDA_CHECK(cudaStreamDestroy(stream));
  for (Set* s : sets) delete s;
}

}  // namespace

int main() {
  try {
    bench(1, 4096, 16, 32);
    bench(1, 16384, 16, 32);
    bench(1, 65536, 16, 32);
    bench(8, 8192, 16, 32);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
