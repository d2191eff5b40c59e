// An outside program against the installed gdn: the chunked op on a small GQA problem against the
// float64 recurrence, and an error naming its argument. Prints "consumer: ok" on success.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gdn/delta_rule.h>
#include <gdn/error.h>
#ifdef CONSUMER_CUDA
#include <gdn/gpu_communicator.h>
#endif

int main() {
  const std::int64_t T = 37, HK = 1, HV = 2, K = 8, V = 4;
  std::vector<float> q(T * HK * K), k(q.size()), v(T * HV * V), g(T * HV), beta(T * HV);
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.7f * static_cast<float>(i));
    k[i] = std::cos(0.3f * static_cast<float>(i));
  }
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.11f * static_cast<float>(i));
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = -0.05f * static_cast<float>(i % 5);
    beta[i] = 0.5f;
  }
  gdn::DeltaRuleInputs in;
  in.q = {q.data(), gdn::DType::f32, {1, T, HK, K}};
  in.k = {k.data(), gdn::DType::f32, {1, T, HK, K}};
  in.v = {v.data(), gdn::DType::f32, {1, T, HV, V}};
  in.g = {g.data(), gdn::DType::f32, {1, T, HV}};
  in.beta = {beta.data(), gdn::DType::f32, {1, T, HV}};
  in.use_qk_l2norm = true;
  in.chunk_size = 16;

  std::vector<float> chunked(v.size()), recurrent(v.size());
  gdn::delta_rule_forward(in, {{chunked.data(), gdn::DType::f32, {1, T, HV, V}}, {}});
  gdn::delta_rule_forward(in, {{recurrent.data(), gdn::DType::f32, {1, T, HV, V}}, {}},
                          gdn::Method::recurrent);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    diff += std::pow(chunked[i] - recurrent[i], 2);
    norm += std::pow(recurrent[i], 2);
  }
  const double error = std::sqrt(diff / norm);
  if (!(error < 1e-5)) {
    std::printf("consumer: relative error %.3g against the recurrence\n", error);
    return 1;
  }

  in.q.shape = in.k.shape = {1, T, 2, K / 2};  // 3 value heads over 2 key heads
  in.v.shape = {1, T, 3, V};
  try {
    gdn::validate(in);
    std::printf("consumer: validate accepted HV = 3 with HK = 2\n");
    return 1;
  } catch (const gdn::Error& e) {
    if (std::string(e.what()).find("multiple") == std::string::npos) {
      std::printf("consumer: unexpected message: %s\n", e.what());
      return 1;
    }
  }
#ifdef CONSUMER_CUDA
  std::printf("consumer: %d visible GPUs (gdn::gdn_cuda)\n", gdn::visible_gpus());
#endif
  std::printf("consumer: ok (relative error %.2e)\n", error);
  return 0;
}
