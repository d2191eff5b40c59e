#pragma once
// Element offsets into the op's tensors (spec section 2), and row loads and stores in a compute
// type: host utilities that every backend, CP and the layer share.

#include <cstdint>
#include <vector>

#include "core/convert.h"
#include "gdn/delta_rule.h"
#include "validate.h"

namespace gdn::core {

struct Layout {
  DeltaRuleShape s;

  std::int64_t key_head(std::int64_t hv) const { return hv / (s.HV / s.HK); }
  std::int64_t qk(std::int64_t b, std::int64_t t, std::int64_t hk) const {
    return ((b * s.T + t) * s.HK + hk) * s.K;
  }
  std::int64_t v(std::int64_t b, std::int64_t t, std::int64_t hv) const {
    return ((b * s.T + t) * s.HV + hv) * s.V;
  }
  std::int64_t gate(std::int64_t b, std::int64_t t, std::int64_t hv) const {
    return (b * s.T + t) * s.HV + hv;
  }
  std::int64_t state(std::int64_t n, std::int64_t hv) const { return (n * s.HV + hv) * s.K * s.V; }
};

// Row copies with the dtype switch outside the loop, so each loop vectorizes.
template <typename Compute>
void load_row(const TensorRef& t, std::int64_t offset, std::int64_t count, Compute* dst) {
  const auto convert = [&](const auto* src, auto to_compute) {
    for (std::int64_t i = 0; i < count; ++i)
      dst[i] = static_cast<Compute>(to_compute(src[offset + i]));
  };
  const auto same = [](auto x) { return x; };
  switch (t.dtype) {
    case DType::f64:
      return convert(static_cast<const double*>(t.data), same);
    case DType::f32:
      return convert(static_cast<const float*>(t.data), same);
    case DType::bf16:
      return convert(static_cast<const std::uint16_t*>(t.data), bf16_to_float);
    case DType::f16:
      return convert(static_cast<const std::uint16_t*>(t.data), f16_to_float);
    default:
      for (std::int64_t i = 0; i < count; ++i) dst[i] = load<Compute>(t, offset + i);
  }
}

template <typename Compute>
void store_row(const TensorRef& t, std::int64_t offset, std::int64_t count, const Compute* src) {
  const auto convert = [&](auto* dst, auto from_compute) {
    for (std::int64_t i = 0; i < count; ++i) dst[offset + i] = from_compute(src[i]);
  };
  switch (t.dtype) {
    case DType::f64:
      return convert(static_cast<double*>(t.data), [](Compute x) { return double(x); });
    case DType::f32:
      return convert(static_cast<float*>(t.data), [](Compute x) { return float(x); });
    case DType::bf16:
      return convert(static_cast<std::uint16_t*>(t.data),
                     [](Compute x) { return float_to_bf16(float(x)); });
    case DType::f16:
      return convert(static_cast<std::uint16_t*>(t.data),
                     [](Compute x) { return float_to_f16(float(x)); });
    default:
      for (std::int64_t i = 0; i < count; ++i) store(t, offset + i, src[i]);
  }
}

}  // namespace gdn::core
