// Times the CUDA delta rule (forward, forward + backward) at the reference shapes, then at
// T=65536 with strong and with weak gates, with 2 value heads, as 1024 sequences of 64 tokens and
// as 64 sequences of 1024 with their offsets on the device only, with CUDA events: 3 warm-ups,
// the median of 10 runs, two input sets alternated (each larger than L2). With arguments B T HK
// HV [strong|weak|model] [N [device]], only that row; N > 0 (B = 1) cuts T into N sequences of
// about equal length (varlen, the offsets also on the host, or with `device` on the device only,
// as the PyTorch op passes them: the workspace then sized from the shapes alone).
//
// FLOPs (forward, per chunk of C tokens per value head, tensor-core GEMMs at 2 FLOP per MAC,
// FLA's form plus the C^3/3 of the triangular inverse):
//   F_chunk = 2 (3 C^2 K + 2 C^2 V + 3 C K V) + C^3 / 3
// forward + backward is reported against 4 F (the backward counted as 3 forwards, research/
// kernels.md 3.4), so its TFLOP/s is comparable only between runs of this program.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_bench.cuh"
#include "gdn/cuda.h"

namespace {

using namespace bench;

// Gates (cuda_bench.cuh's kinds): the model-like default, strong (short memory), weak (long).
enum Gates { model = 2, strong = 3, weak = 4 };
const char* gates_name(Gates g) {
  return g == model ? "" : g == strong ? " strong gates" : " weak gates";
}

void run(std::int64_t B, std::int64_t T, std::int64_t HK, std::int64_t HV, Gates gates = model,
         std::int64_t sequences = 0, bool device_offsets = false) {
  constexpr std::int64_t K = 128, V = 128, C = 64;
  std::vector<std::int32_t> offsets;  // varlen: sequence n is tokens [n T / N, (n + 1) T / N)
  for (std::int64_t n = 0; sequences > 0 && n <= sequences; ++n)
    offsets.push_back(static_cast<std::int32_t>(n * T / sequences));
  const std::int64_t N = sequences > 0 ? sequences : B;
  Buffer cu(offsets.size() * 4 + 4);
  GDN_CUDA_CHECK(cudaMemcpy(cu.data, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  const gdn::TensorRef cu_host = sequences > 0 && !device_offsets
                                     ? gdn::TensorRef{offsets.data(), DType::i32, {N + 1}}
                                     : gdn::TensorRef{};
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
    fill(set->g, gate, gates, 10 * s + 4);
    fill(set->beta, gate, 1, 10 * s + 5);
    fill(set->d_o, vv, 0, 10 * s + 6);
    sets.push_back(set);
  }
  Buffer o(vv * 2), ht(N * HV * K * V * 4), dq(qk * 2), dk(qk * 2), dv(vv * 2), dg(gate * 4),
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
    if (sequences > 0) in.cu_seqlens = ref(cu, DType::i32, {N + 1});
    return in;
  };
  const gdn::DeltaRuleOutputs out{ref(o, DType::bf16, {B, T, HV, V}),
                                  ref(ht, DType::f32, {N, HV, K, V})};
  // fwd: the inference forward. fwd+bwd: the training path, a forward that saves its states
  // for the backward, which reads the forward's workspace.
  const std::size_t ws_fwd = gdn::delta_rule_forward_cuda_workspace(inputs(0), cu_host);
  const std::size_t ws_train = gdn::delta_rule_forward_cuda_workspace(inputs(0), cu_host, true);
  const std::size_t ws_bwd =
      gdn::delta_rule_backward_cuda_workspace(inputs(0), cu_host, true, true);
  Buffer ws(ws_train), ws_back(ws_bwd);
  cudaStream_t stream;
  GDN_CUDA_CHECK(cudaStreamCreate(&stream));
  gdn::CudaContext ctx{stream, ws.data, ws_fwd, cu_host};
  gdn::CudaContext train{stream, ws.data, ws.bytes, cu_host, nullptr, 0, true};
  gdn::CudaContext back{stream, ws_back.data, ws_back.bytes, cu_host, ws.data, ws.bytes, true};

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
  const std::string varlen = sequences > 0
                                 ? " " + std::to_string(sequences) + " sequences" +
                                       (device_offsets ? " (offsets on the device only)" : "")
                                 : "";
  std::printf(
      "gdn-cuda B=%lld T=%lld HK=%lld HV=%lld%s%s: fwd %.3f ms (%.1f TFLOP/s, workspace %.2f GiB) "
      "| fwd+bwd %.3f ms (%.1f TFLOP/s at 4F, workspaces %.2f + %.2f GiB) | inputs+outputs "
      "%.2f GiB\n",
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(HK),
      static_cast<long long>(HV), gates_name(gates), varlen.c_str(), fwd, flops / fwd / 1e9,
      ws_fwd / 1073741824.0, fwd_bwd, 4 * flops / fwd_bwd / 1e9, ws_train / 1073741824.0,
      ws_bwd / 1073741824.0, io / 1073741824.0);
  std::fflush(stdout);
  GDN_CUDA_CHECK(cudaStreamDestroy(stream));
  for (Set* s : sets) delete s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1) {
      const std::string g = argc > 5 ? argv[5] : "model";
      const long long B = std::atoll(argv[1]), T = argc > 2 ? std::atoll(argv[2]) : 0,
                      HK = argc > 3 ? std::atoll(argv[3]) : 0,
                      HV = argc > 4 ? std::atoll(argv[4]) : 0,
                      N = argc > 6 ? std::atoll(argv[6]) : 0;
      const bool device_offsets = argc > 7 && std::string(argv[7]) == "device";
      if (argc > 8 || (argc > 7 && !device_offsets) || B < 1 || T < 1 || HK < 1 || HV < 1 ||
          HV % HK != 0 || (g != "strong" && g != "weak" && g != "model") || N < 0 || N > T ||
          (N > 0 && B != 1) || (device_offsets && N == 0)) {
        std::fprintf(stderr,
                     "usage: bench_cuda [B T HK HV [strong|weak|model] [N [device]]] (positive "
                     "sizes, HK dividing HV; N sequences, at most T, with B = 1; device: their "
                     "offsets on the device only)\n");
        return 2;
      }
      run(B, T, HK, HV, g == "strong" ? strong : g == "weak" ? weak : model, N, device_offsets);
      return 0;
    }
    run(1, 4096, 16, 32);
    run(1, 16384, 16, 32);
    run(1, 65536, 16, 32);
    run(8, 8192, 16, 32);
    run(1, 65536, 16, 32, strong);
    run(1, 65536, 16, 32, weak);
    run(1, 65536, 1, 2);  // few heads, long T: the case that needs in-GPU parallelism most
    run(1, 65536, 16, 32, model, 1024);      // packed short sequences (varlen)
    run(1, 65536, 16, 32, model, 64, true);  // packed documents as the PyTorch op passes them
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
