#pragma once
// Scalar conversions between the storage dtypes and the compute types (f32 / f64).

#include <bit>
#include <cstdint>
#include <cstring>

#include "gdn/tensor.h"

namespace gdn::core {

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(std::uint32_t{h} << 16);
}

inline std::uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_f16(float f) {  // round to nearest even, overflow to inf
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half, multiples of 2^-24
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;
    const auto rounded = static_cast<std::uint32_t>(__builtin_roundevenf(scaled));
    return static_cast<std::uint16_t>(sign | rounded);
  }
  std::uint32_t rebased = abs - (112u << 23);
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (rebased >> 13));
}

// Reads element i of a floating tensor of any storage dtype.
template <typename Compute>
inline Compute load(const TensorRef& t, std::int64_t i) {
  const void* p = t.data;
  switch (t.dtype) {
    case DType::f64:
      return static_cast<Compute>(static_cast<const double*>(p)[i]);
    case DType::f32:
      return static_cast<Compute>(static_cast<const float*>(p)[i]);
    case DType::bf16:
      return static_cast<Compute>(bf16_to_float(static_cast<const std::uint16_t*>(p)[i]));
    case DType::f16:
      return static_cast<Compute>(f16_to_float(static_cast<const std::uint16_t*>(p)[i]));
    case DType::i64:
      return static_cast<Compute>(static_cast<const std::int64_t*>(p)[i]);
    case DType::i32:
      return static_cast<Compute>(static_cast<const std::int32_t*>(p)[i]);
  }
  return Compute{};
}

// Writes element i of a floating tensor of any storage dtype (rounding to nearest even).
template <typename Compute>
inline void store(const TensorRef& t, std::int64_t i, Compute x) {
  void* p = t.data;
  switch (t.dtype) {
    case DType::f64:
      static_cast<double*>(p)[i] = static_cast<double>(x);
      return;
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(x);
      return;
    case DType::bf16:
      static_cast<std::uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(x));
      return;
    case DType::f16:
      static_cast<std::uint16_t*>(p)[i] = float_to_f16(static_cast<float>(x));
      return;
    case DType::i64:
    case DType::i32:
      return;  // validate() admits only floating outputs
  }
}

}  // namespace gdn::core
