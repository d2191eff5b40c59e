// The layer's config and parameters: shapes from the config (spec 6), and the module validation
// of the seed (missing parameters, heads that do not divide, an activation other than SiLU).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/convert.h"
#include "gdn/error.h"
#include "gdn/layer.h"

namespace gdn {
namespace {

using Shape = std::vector<std::int64_t>;

// Each parameter's shape, in for_each_parameter's order.
LayerParamsOf<Shape> shapes(const LayerConfig& c) {
  const std::int64_t D = c.hidden_size, HV = c.linear_num_value_heads;
  return {.in_proj_qkv = {c.conv_dim(), D},
          .in_proj_z = {c.value_dim(), D},
          .in_proj_b = {HV, D},
          .in_proj_a = {HV, D},
          .conv1d = {c.conv_dim(), 1, c.linear_conv_kernel_dim},
          .A_log = {HV},
          .dt_bias = {HV},
          .norm = {c.linear_value_head_dim},
          .out_proj = {D, c.value_dim()}};
}

// The shapes in for_each_parameter's order.
std::vector<Shape> ordered_shapes(const LayerConfig& c) {
  LayerParamsOf<Shape> s = shapes(c);
  std::vector<Shape> out;
  for_each_parameter(s, [&](const char*, const Shape& shape) { out.push_back(shape); });
  return out;
}

std::string shape_string(const Shape& shape) {
  return TensorRef{nullptr, DType::f32, shape}.shape_string();
}

}  // namespace

LayerParams view(const LayerWeights& w) {
  return {w.in_proj_qkv.ref(), w.in_proj_z.ref(), w.in_proj_b.ref(),
          w.in_proj_a.ref(),   w.conv1d.ref(),    w.A_log.ref(),
          w.dt_bias.ref(),     w.norm.ref(),      w.out_proj.ref()};
}

LayerWeights allocate_parameters(const LayerConfig& config, DType dtype) {
  validate(config);
  const std::vector<Shape> s = ordered_shapes(config);
  LayerWeights w;
  std::size_t i = 0;
  for_each_parameter(w, [&](const char*, HostTensor& t) { t = HostTensor::zeros(dtype, s[i++]); });
  return w;
}

void validate(const LayerConfig& c) {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"hidden_size", c.hidden_size},
      {"linear_num_key_heads", c.linear_num_key_heads},
      {"linear_num_value_heads", c.linear_num_value_heads},
      {"linear_key_head_dim", c.linear_key_head_dim},
      {"linear_value_head_dim", c.linear_value_head_dim},
      {"linear_conv_kernel_dim", c.linear_conv_kernel_dim}};
  for (const auto& [name, value] : sizes)
    if (value <= 0)
      throw Error(fmt::format("layer config {} must be positive, got {}", name, value));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    throw Error(fmt::format(
        "layer config linear_num_value_heads ({}) must be divisible by linear_num_key_heads ({})",
        c.linear_num_value_heads, c.linear_num_key_heads));
  if (!(c.rms_norm_eps > 0))
    throw Error(fmt::format("layer config rms_norm_eps must be positive, got {}", c.rms_norm_eps));
  if (c.hidden_act != "silu" && c.hidden_act != "swish")
    throw Error(fmt::format(
        "layer config hidden_act must be \"silu\" or \"swish\" (the conv's activation), got \"{}\"",
        c.hidden_act));
}

void validate(const LayerConfig& config, const LayerParams& params) {
  validate(config);
  const std::vector<Shape> expected = ordered_shapes(config);
  std::vector<std::string> missing;
  for_each_parameter(params, [&](const char* name, const TensorRef& t) {
    if (!t.given()) missing.emplace_back(name);
  });
  if (!missing.empty())
    throw Error(fmt::format("layer is missing required parameters: {}", fmt::join(missing, ", ")));
  const DType dtype = params.in_proj_qkv.dtype;
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error(fmt::format("layer parameters must be f32 or f64, got in_proj_qkv.weight of {}",
                            dtype_name(dtype)));
  std::size_t i = 0;
  for_each_parameter(params, [&](const char* name, const TensorRef& t) {
    const Shape& shape = expected[i++];
    if (t.shape != shape)
      throw Error(fmt::format("layer parameter {} must have shape {}, got {}", name,
                              shape_string(shape), t.shape_string()));
    if (t.dtype != dtype)
      throw Error(fmt::format("layer parameter {} must have in_proj_qkv.weight's dtype {}, got {}",
                              name, dtype_name(dtype), dtype_name(t.dtype)));
  });
}

LayerWeights random_parameters(const LayerConfig& c, DType dtype, std::uint64_t seed) {
  LayerWeights w = allocate_parameters(c, dtype);
  std::uint64_t n = 0;
  for_each_parameter(w, [&](const std::string& name, HostTensor& t) {
    double mean = 0, stddev = 0.5;
    if (name.starts_with("in_proj")) stddev = 1 / std::sqrt(double(c.hidden_size));
    if (name == "out_proj.weight") stddev = 1 / std::sqrt(double(c.value_dim()));
    if (name == "norm.weight") mean = 1, stddev = 0.1;
    std::mt19937_64 rng(seed * 100 + n++);
    std::normal_distribution<double> normal(mean, stddev);
    for (std::int64_t i = 0; i < t.numel(); ++i) core::store(t.ref(), i, normal(rng));
  });
  return w;
}

}  // namespace gdn
