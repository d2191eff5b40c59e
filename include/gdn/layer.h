#pragma once
// The Qwen3.5 GatedDeltaNet layer (transformers' Qwen3_5GatedDeltaNet, spec 6), forward and
// backward on the CPU, on one rank or over P ranks of a context-parallel group.
//
// Shapes: B batch, T tokens (this rank's shard under context parallelism), D = hidden_size,
// HK / HV key / value heads, K / V their dims, W the conv kernel, C = 2 HK K + HV V the conv
// channels [q | k | v].

#include <cstdint>
#include <memory>
#include <string>

#include "gdn/communicator.h"
#include "gdn/context_parallel.h"
#include "gdn/delta_rule.h"
#include "gdn/tensor.h"

namespace gdn {

// transformers' config keys (Qwen3_5TextConfig).
struct LayerConfig {
  std::int64_t hidden_size = 0;             // D
  std::int64_t linear_num_key_heads = 0;    // HK
  std::int64_t linear_num_value_heads = 0;  // HV, a multiple of HK
  std::int64_t linear_key_head_dim = 0;     // K
  std::int64_t linear_value_head_dim = 0;   // V
  std::int64_t linear_conv_kernel_dim = 0;  // W
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";  // the conv's activation: only silu (= swish) is supported

  std::int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  std::int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  std::int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // C
};

// The layer's parameters by transformers' names (parameter_name gives the full one). Tensor is
// TensorRef (views: the layer's parameters, or its gradients as outputs) or HostTensor (owned).
template <typename Tensor>
struct LayerParamsOf {
  Tensor in_proj_qkv;  // [C, D]          in_proj_qkv.weight, rows [q | k | v], head-major
  Tensor in_proj_z;    // [HV V, D]       in_proj_z.weight
  Tensor in_proj_b;    // [HV, D]         in_proj_b.weight
  Tensor in_proj_a;    // [HV, D]         in_proj_a.weight
  Tensor conv1d;       // [C, 1, W]       conv1d.weight (depthwise, no bias)
  Tensor A_log;        // [HV]            A_log
  Tensor dt_bias;      // [HV]            dt_bias
  Tensor norm;         // [V]             norm.weight
  Tensor out_proj;     // [D, HV V]       out_proj.weight
};
using LayerParams = LayerParamsOf<TensorRef>;
using LayerWeights = LayerParamsOf<HostTensor>;

// Calls fn(name, tensor) for every parameter in the order above, with transformers' names.
template <typename Params, typename Fn>
void for_each_parameter(Params& p, Fn&& fn) {
  fn("in_proj_qkv.weight", p.in_proj_qkv);
  fn("in_proj_z.weight", p.in_proj_z);
  fn("in_proj_b.weight", p.in_proj_b);
  fn("in_proj_a.weight", p.in_proj_a);
  fn("conv1d.weight", p.conv1d);
  fn("A_log", p.A_log);
  fn("dt_bias", p.dt_bias);
  fn("norm.weight", p.norm);
  fn("out_proj.weight", p.out_proj);
}

LayerParams view(const LayerWeights& weights);
// Zero-filled parameters (or gradient buffers) of the config's shapes.
LayerWeights allocate_parameters(const LayerConfig& config, DType dtype);
// Random parameters in model-like ranges, from a seed: projections ~ N(0, 1/fan_in),
// A_log, dt_bias and conv ~ N(0, 0.5), norm.weight ~ N(1, 0.1).
LayerWeights random_parameters(const LayerConfig& config, DType dtype, std::uint64_t seed);

// Positive sizes, HV divisible by HK, hidden_act silu or swish; throws gdn::Error otherwise.
void validate(const LayerConfig& config);
// Every parameter given, of the config's shape and of one dtype, f32 or f64.
void validate(const LayerConfig& config, const LayerParams& params);

struct LayerOptions {
  Method method = Method::chunked;  // recurrent: the float64 oracle, for f64 parameters
  int chunk_size = 64;
};

// One layer bound to its parameters (not copied: they must outlive it). forward keeps the
// activations backward needs, so call backward with the same x and mask after forward.
// Tensors: x, out, d_out, dx [B, T, D] in the parameters' dtype; mask [B, T] optional (1 keeps a
// token, 0 drops it); grads: buffers shaped like the parameters, overwritten (not accumulated).
class GatedDeltaNet {
 public:
  GatedDeltaNet(const LayerConfig& config, const LayerParams& params, LayerOptions options = {});
  // One rank of a context-parallel group: x is its contiguous shard of T (the global T divisible
  // by P); the conv takes the previous rank's halo and the core runs CpDeltaRule. backward
  // leaves every rank with the whole parameter gradients (summed over ranks).
  GatedDeltaNet(Communicator& comm, CpOptions cp, const LayerConfig& config,
                const LayerParams& params, LayerOptions options = {});
  ~GatedDeltaNet();

  void forward(const TensorRef& x, const TensorRef& mask, const TensorRef& out);
  void backward(const TensorRef& x, const TensorRef& mask, const TensorRef& d_out,
                const TensorRef& dx, const LayerParams& grads);

  struct Saved;

 private:
  LayerConfig config_;
  LayerParams params_;
  LayerOptions options_;
  Communicator* comm_ = nullptr;  // null: one rank
  std::unique_ptr<CpDeltaRule> cp_core_;
  std::unique_ptr<Saved> saved_;
};

}  // namespace gdn
