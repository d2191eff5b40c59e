// What context parallelism costs a rank on the GPU (B=1 HK=16 HV=32 K=V=128 bf16, l2norm), for
// a middle rank's shard of n tokens (its sequence enters from the previous rank and leaves to
// the next), by the stages of cuda/stages.h, against the single-GPU op on the same n tokens:
//
//   before  the work that needs no entering state: chunk prep, the segment summaries (with the
//           first segment's transfer and the last segment's), the rank's map (M, N)
//   after   from the entering state's arrival to the rank's last output: the fold of the segment
//           states and the output pass (forward); the fold and the gradient passes (backward)
//
// and the map algebra that the exchanges run (apply, compose: HV = 32 maps of 128 x 128). Each
// figure is the median of 10 runs (CUDA events, 3 warm-ups). The cost model (cp/cost_model.h)
// takes its GPU constants from this table (bench/RESULTS.md).
#include <cstdint>
#include <cstdio>

#include "cuda/kernels.h"
#include "cuda/stages.h"
#include "cuda_bench.cuh"
#include "gdn/cuda.h"

namespace {

using namespace bench;

constexpr std::int64_t HK = 16, HV = 32, K = 128, V = 128;

struct Stages {
  double single_fwd, single_train;                 // the single-GPU op: fwd, and fwd + bwd
  double before_fwd, after_fwd, after_fwd_saving;  // after: inference; saving: training
  double before_bwd, after_bwd;
};

Stages measure(std::int64_t n, cudaStream_t stream) {
  const long long qk = n * HK * K, vv = n * HV * V, gate = n * HV;
  Buffer q(qk * 2), k(qk * 2), v(vv * 2), g(gate * 4), beta(gate * 2), d_o(vv * 2);
  fill(q, qk, 0, 1), fill(k, qk, 0, 2), fill(v, vv, 0, 3), fill(g, gate, 2, 4);
  fill(beta, gate, 1, 5), fill(d_o, vv, 0, 6);
  Buffer o(vv * 2), dq(qk * 2), dk(qk * 2), dv(vv * 2), dg(gate * 4), dbeta(gate * 2);
  Buffer h0(HV * K * V * 4), ht(HV * K * V * 4), dht(HV * K * V * 4), dh0(HV * K * V * 4);
  Buffer maps(HV * (K * K + K * V) * 4), back_maps(HV * (K * K + K * V) * 4);
  GDN_CUDA_CHECK(cudaMemset(h0.data, 0, h0.bytes));
  GDN_CUDA_CHECK(cudaMemset(dht.data, 0, dht.bytes));
  gdn::DeltaRuleInputs in;
  in.q = ref(q, DType::bf16, {1, n, HK, K});
  in.k = ref(k, DType::bf16, {1, n, HK, K});
  in.v = ref(v, DType::bf16, {1, n, HV, V});
  in.g = ref(g, DType::f32, {1, n, HV});
  in.beta = ref(beta, DType::bf16, {1, n, HV});
  in.initial_state = ref(h0, DType::f32, {1, HV, K, V});
  in.use_qk_l2norm = true;
  const gdn::DeltaRuleOutputs out{ref(o, DType::bf16, {1, n, HV, V}),
                                  ref(ht, DType::f32, {1, HV, K, V})};
  const gdn::DeltaRuleGrads gr{
      ref(d_o, DType::bf16, {1, n, HV, V}), ref(dht, DType::f32, {1, HV, K, V}),
      ref(dq, DType::bf16, {1, n, HK, K}),  ref(dk, DType::bf16, {1, n, HK, K}),
      ref(dv, DType::bf16, {1, n, HV, V}),  ref(dg, DType::f32, {1, n, HV}),
      ref(dbeta, DType::bf16, {1, n, HV}),  ref(dh0, DType::f32, {1, HV, K, V})};
  Stages s{};

  // The single-GPU op.
  {
    const std::size_t fwd_bytes = gdn::delta_rule_forward_cuda_workspace(in, {}, true);
    const std::size_t bwd_bytes = gdn::delta_rule_backward_cuda_workspace(in, {}, true, true);
    Buffer ws(fwd_bytes), ws_back(bwd_bytes);
    gdn::CudaContext inference{stream, ws.data, ws.bytes, {}};
    gdn::CudaContext train{stream, ws.data, ws.bytes, {}, nullptr, 0, true};
    gdn::CudaContext back{stream, ws_back.data, ws_back.bytes, {}, ws.data, ws.bytes, true};
    s.single_fwd =
        median_ms([&](int) { gdn::delta_rule_forward_cuda(in, out, inference); }, stream);
    s.single_train = median_ms(
        [&](int) {
          gdn::delta_rule_forward_cuda(in, out, train);
          gdn::delta_rule_backward_cuda(in, gr, back);
        },
        stream);
  }

  // The rank's stages (training: the forward saves its states), and the inference output pass.
  const gdn::cuda::Carried carried{true, true, maps.floats(), maps.floats() + HV * K * K};
  const gdn::cuda::Carried back_carried{true, true, back_maps.floats(),
                                        back_maps.floats() + HV * K * K};
  const std::size_t fwd_bytes = gdn::cuda::forward_workspace_bytes(in, {}, true, carried);
  const std::size_t bwd_bytes = gdn::cuda::backward_workspace_bytes(in, {}, true, true, carried);
  Buffer ws(fwd_bytes), ws_back(bwd_bytes);
  gdn::CudaContext train{stream, ws.data, ws.bytes, {}, nullptr, 0, true};
  gdn::CudaContext inference{stream, ws.data, ws.bytes, {}};
  gdn::CudaContext back{stream, ws_back.data, ws_back.bytes, {}, ws.data, ws.bytes, true};
  s.before_fwd = median_ms(
      [&](int) {
        gdn::cuda::forward_summaries(in, train, carried);
        gdn::cuda::forward_maps(in, train, carried);
      },
      stream);
  s.after_fwd =
      median_ms([&](int) { gdn::cuda::forward_output(in, out, inference, carried); }, stream);
  s.after_fwd_saving =
      median_ms([&](int) { gdn::cuda::forward_output(in, out, train, carried); }, stream);
  s.before_bwd = median_ms(
      [&](int) {
        gdn::cuda::backward_summaries(in, gr, back, back_carried);
        gdn::cuda::backward_map(in, gr, back, back_carried);
      },
      stream);
  s.after_bwd =
      median_ms([&](int) { gdn::cuda::backward_output(in, gr, back, back_carried); }, stream);
  return s;
}

}  // namespace

int main() {
  try {
    cudaStream_t stream;
    GDN_CUDA_CHECK(cudaStreamCreate(&stream));
    std::printf(
        "shard n | 1 GPU fwd | rank fwd: before + after = total (extra) | 1 GPU fwd+bwd | rank "
        "fwd+bwd: before + after, before + after = total (extra)   [ms]\n");
    for (std::int64_t n : {4096, 8192, 16384, 32768, 65536, 131072}) {
      const Stages s = measure(n, stream);
      const double fwd = s.before_fwd + s.after_fwd;
      const double train = s.before_fwd + s.after_fwd_saving + s.before_bwd + s.after_bwd;
      std::printf(
          "%7lld | %9.3f | %.3f + %.3f = %.3f (%+.3f) | %13.3f | %.3f + %.3f, %.3f + %.3f = %.3f "
          "(%+.3f)\n",
          static_cast<long long>(n), s.single_fwd, s.before_fwd, s.after_fwd, fwd,
          fwd - s.single_fwd, s.single_train, s.before_fwd, s.after_fwd_saving, s.before_bwd,
          s.after_bwd, train, train - s.single_train);
      std::fflush(stdout);
    }
    // The exchanges' algebra on HV maps: y = M x + N, and one composition.
    Buffer a(HV * (K * K + K * V) * 4), b(HV * (K * K + K * V) * 4), c(HV * (K * K + K * V) * 4);
    fill(a, HV * (K * K + K * V), 2, 7), fill(b, HV * (K * K + K * V), 2, 8);
    const double apply = median_ms(
        [&](int) {
          gdn::cuda::launch_affine(HV, a.floats(), b.floats(), a.floats() + HV * K * K, c.floats(),
                                   stream);
        },
        stream);
    const double compose = median_ms(
        [&](int) {
          gdn::cuda::launch_affine(HV, a.floats(), b.floats(), nullptr, c.floats(), stream);
          gdn::cuda::launch_affine(HV, a.floats(), b.floats() + HV * K * K, a.floats() + HV * K * K,
                                   c.floats() + HV * K * K, stream);
        },
        stream);
    std::printf("maps of HV = %lld heads: apply %.4f ms, compose %.4f ms\n",
                static_cast<long long>(HV), apply, compose);
    GDN_CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_cp: %s\n", e.what());
    return 1;
  }
}
