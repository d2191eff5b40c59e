#pragma once
// Shared by the layer's tests: a tiny config, random parameters in model-like ranges, random
// tensors, relative errors, and the message of an expected error.

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "core/convert.h"
#include "gdn/error.h"
#include "gdn/layer.h"

namespace gdn::testing {

// HV = 2 HK (grouped heads), K != V, so that a swapped dim or head map shows.
inline LayerConfig tiny_config() {
  return {.hidden_size = 6,
          .linear_num_key_heads = 2,
          .linear_num_value_heads = 4,
          .linear_key_head_dim = 4,
          .linear_value_head_dim = 3,
          .linear_conv_kernel_dim = 4,
          .rms_norm_eps = 1e-6};
}

inline HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                                double mean = 0, double stddev = 1) {
  HostTensor t = HostTensor::zeros(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(mean, stddev);
  for (std::int64_t i = 0; i < t.numel(); ++i) core::store(t.ref(), i, normal(rng));
  return t;
}

inline LayerWeights random_weights(const LayerConfig& c, DType dtype, std::uint64_t seed) {
  return random_parameters(c, dtype, seed);
}

using gdn::convert;  // one tensor (tensor.h); the overload below converts all parameters

inline LayerWeights convert(const LayerWeights& w, DType dtype) {
  LayerWeights out = w;
  for_each_parameter(out, [&](const char*, HostTensor& t) { t = convert(t, dtype); });
  return out;
}

inline double relative(const HostTensor& x, const HostTensor& ref) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = core::load<double>(x.ref(), i), b = core::load<double>(ref.ref(), i);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// A 2-D padding mask [B, T]: batch row b drops its first b + 1 tokens (left padding).
inline HostTensor left_padding_mask(DType dtype, std::int64_t B, std::int64_t T) {
  HostTensor m = HostTensor::zeros(dtype, {B, T});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) core::store(m.ref(), b * T + t, t > b ? 1.0 : 0.0);
  return m;
}

// What fn throws as gdn::Error, or "" when it returns.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace gdn::testing
