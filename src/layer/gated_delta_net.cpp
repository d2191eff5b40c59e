// The Qwen3.5 GatedDeltaNet layer (spec 6): projections, causal conv + SiLU, gates, the gated
// delta rule with in-kernel l2norm, the gated RMSNorm and out_proj; forward and backward, in the
// parameters' dtype (f32, or f64 for the finite-difference oracle). Under context parallelism
// only the conv (its halo) and the core (CpDeltaRule) talk to other ranks; every other step is
// per token, and the parameter gradients are summed over ranks at the end.

#include <fmt/format.h>

#include <cstring>

#include "gdn/conv1d.h"
#include "gdn/error.h"
#include "gdn/layer.h"
#include "gdn/padding_mask.h"
#include "layer/gated_rms_norm.h"
#include "layer/gating.h"
#include "layer/linear.h"

namespace gdn {

// Activations kept from forward for backward, and backward's workspace; reallocated only when
// the shape changes.
struct GatedDeltaNet::Saved {
  std::int64_t B = 0, T = 0;
  bool masked = false;
  HostTensor xm;       // [B, T, D]       x * mask (only with a mask)
  HostTensor mixed;    // [B, T, C]       x W_qkv^T, before the conv
  HostTensor post;     // [B, T, C]       after conv + SiLU (backward: its gradient)
  HostTensor q, k;     // [B, T, HK, K]
  HostTensor v;        // [B, T, HV, V]
  HostTensor z;        // [B, T, HV, V]   the norm's gate
  HostTensor b, a;     // [B, T, HV]      pre-gate projections
  HostTensor beta, g;  // [B, T, HV]
  HostTensor o;        // [B, T, HV, V]   the core's output
  HostTensor y;        // [B, T, HV, V]   the norm's output, out_proj's input
  // backward
  HostTensor dy, d_o, dz, dq, dk, dv, dbeta, dg, db, da, dmixed;
};

namespace {

using layer::LinearShape;

void ensure(HostTensor& t, DType dtype, const std::vector<std::int64_t>& shape) {
  if (t.dtype != dtype || t.shape != shape) t = HostTensor::zeros(dtype, shape);
}

template <typename Scalar>
Scalar* ptr(const TensorRef& t) {
  return static_cast<Scalar*>(t.data);
}
template <typename Scalar>
Scalar* ptr(HostTensor& t) {
  return t.as<Scalar>();
}

void check(const char* name, const TensorRef& t, DType dtype,
           const std::vector<std::int64_t>& shape) {
  if (!t.given())
    throw Error(fmt::format("layer {} must be given ({} {})", name, dtype_name(dtype),
                            TensorRef{nullptr, dtype, shape}.shape_string()));
  if (t.shape != shape || t.dtype != dtype)
    throw Error(fmt::format("layer {} must be {} {}, got {} {}", name, dtype_name(dtype),
                            TensorRef{nullptr, dtype, shape}.shape_string(), dtype_name(t.dtype),
                            t.shape_string()));
}

// Columns [offset, offset + width) of rows x C  <->  a dense rows x width tensor.
template <typename Scalar>
void copy_columns(const Scalar* from, std::int64_t from_cols, std::int64_t offset, Scalar* to,
                  std::int64_t rows, std::int64_t width) {
#pragma omp parallel for
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(to + r * width, from + r * from_cols + offset, sizeof(Scalar) * width);
}
template <typename Scalar>
void place_columns(const Scalar* from, std::int64_t width, Scalar* to, std::int64_t to_cols,
                   std::int64_t offset, std::int64_t rows) {
#pragma omp parallel for
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(to + r * to_cols + offset, from + r * width, sizeof(Scalar) * width);
}

// The shapes every step uses.
struct Dims {
  std::int64_t B, T, rows, D, HK, HV, K, V, C, W;
};

Dims dims(const LayerConfig& c, std::int64_t B, std::int64_t T) {
  return {B,
          T,
          B * T,
          c.hidden_size,
          c.linear_num_key_heads,
          c.linear_num_value_heads,
          c.linear_key_head_dim,
          c.linear_value_head_dim,
          c.conv_dim(),
          c.linear_conv_kernel_dim};
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const LayerConfig& config, const LayerParams& params,
                             LayerOptions options)
    : config_(config), params_(params), options_(options), saved_(std::make_unique<Saved>()) {
  validate(config_, params_);
  if (options_.chunk_size < 1)
    throw Error(fmt::format("layer chunk_size must be positive, got {}", options_.chunk_size));
}

GatedDeltaNet::GatedDeltaNet(Communicator& comm, CpOptions cp, const LayerConfig& config,
                             const LayerParams& params, LayerOptions options)
    : GatedDeltaNet(config, params, options) {
  if (params_.in_proj_qkv.dtype != DType::f32)
    throw Error(fmt::format("context-parallel layer parameters must be f32, got {}",
                            dtype_name(params_.in_proj_qkv.dtype)));
  if (options_.method != Method::chunked)
    throw Error("context-parallel layer runs Method::chunked only");
  comm_ = &comm;
  cp_core_ = std::make_unique<CpDeltaRule>(comm, cp);
}

GatedDeltaNet::~GatedDeltaNet() = default;

namespace {

// The core's inputs (spec 6, step 5): q and k are l2-normalized in the kernel.
DeltaRuleInputs core_inputs(const GatedDeltaNet::Saved& s, const LayerOptions& options) {
  return {.q = s.q.ref(),
          .k = s.k.ref(),
          .v = s.v.ref(),
          .g = s.g.ref(),
          .beta = s.beta.ref(),
          .use_qk_l2norm = true,
          .chunk_size = options.chunk_size};
}

template <typename Scalar>
void forward_impl(const LayerConfig& config, const LayerParams& p, const LayerOptions& options,
                  Communicator* comm, CpDeltaRule* cp_core, GatedDeltaNet::Saved& s,
                  const TensorRef& x, const TensorRef& mask, const TensorRef& out) {
  const DType dt = p.in_proj_qkv.dtype;
  const Dims d = dims(config, s.B, s.T);
  ensure(s.mixed, dt, {d.B, d.T, d.C});
  ensure(s.post, dt, {d.B, d.T, d.C});
  ensure(s.q, dt, {d.B, d.T, d.HK, d.K});
  ensure(s.k, dt, {d.B, d.T, d.HK, d.K});
  ensure(s.v, dt, {d.B, d.T, d.HV, d.V});
  ensure(s.z, dt, {d.B, d.T, d.HV, d.V});
  for (HostTensor* t : {&s.b, &s.a, &s.beta, &s.g}) ensure(*t, dt, {d.B, d.T, d.HV});
  ensure(s.o, dt, {d.B, d.T, d.HV, d.V});
  ensure(s.y, dt, {d.B, d.T, d.HV, d.V});

  // x <- x * mask  (spec 5-6)
  const Scalar* xin = ptr<Scalar>(x);
  if (s.masked) {
    ensure(s.xm, dt, x.shape);
    std::memcpy(s.xm.bytes.data(), x.data, s.xm.bytes.size());
    apply_padding_mask(s.xm.ref(), mask);
    xin = s.xm.as<Scalar>();
  }

  // 1. mixed = x W_qkv^T, z = x W_z^T, b = x W_b^T, a = x W_a^T
  layer::linear_forward<Scalar>({d.rows, d.D, d.C}, xin, ptr<Scalar>(p.in_proj_qkv),
                                s.mixed.as<Scalar>());
  layer::linear_forward<Scalar>({d.rows, d.D, d.HV * d.V}, xin, ptr<Scalar>(p.in_proj_z),
                                s.z.as<Scalar>());
  layer::linear_forward<Scalar>({d.rows, d.D, d.HV}, xin, ptr<Scalar>(p.in_proj_b),
                                s.b.as<Scalar>());
  layer::linear_forward<Scalar>({d.rows, d.D, d.HV}, xin, ptr<Scalar>(p.in_proj_a),
                                s.a.as<Scalar>());

  // 2. mixed <- silu(causal depthwise conv1d of mixed)
  const Conv1dArgs conv{s.mixed.ref(), p.conv1d, {}};
  if (comm)
    cp_conv1d_forward(*comm, conv, s.post.ref());
  else
    conv1d_forward(conv, s.post.ref());

  // 3. q | k | v, head-major
  const std::int64_t kd = d.HK * d.K, vd = d.HV * d.V;
  copy_columns(s.post.as<Scalar>(), d.C, 0, s.q.as<Scalar>(), d.rows, kd);
  copy_columns(s.post.as<Scalar>(), d.C, kd, s.k.as<Scalar>(), d.rows, kd);
  copy_columns(s.post.as<Scalar>(), d.C, 2 * kd, s.v.as<Scalar>(), d.rows, vd);

  // 4. beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
  layer::gates_forward<Scalar>({d.rows, d.HV}, s.b.as<Scalar>(), s.a.as<Scalar>(),
                               ptr<Scalar>(p.A_log), ptr<Scalar>(p.dt_bias), s.beta.as<Scalar>(),
                               s.g.as<Scalar>());

  // 5. o = gated delta rule(q, k, v, g, beta), q and k l2-normalized in the kernel
  const DeltaRuleInputs in = core_inputs(s, options);
  const DeltaRuleOutputs core_out{.o = s.o.ref()};
  if (cp_core)
    cp_core->forward(in, core_out);
  else
    delta_rule_forward(in, core_out, options.method);

  // 6. y = norm.weight * o * rsqrt(mean(o^2) + eps) * silu(z), per value head
  layer::gated_rms_norm_forward<Scalar>({d.rows * d.HV, d.V, config.rms_norm_eps}, s.o.as<Scalar>(),
                                        s.z.as<Scalar>(), ptr<Scalar>(p.norm), s.y.as<Scalar>());
  // 7. out = y W_out^T
  layer::linear_forward<Scalar>({d.rows, vd, d.D}, s.y.as<Scalar>(), ptr<Scalar>(p.out_proj),
                                ptr<Scalar>(out));
}

template <typename Scalar>
void backward_impl(const LayerConfig& config, const LayerParams& p, const LayerOptions& options,
                   Communicator* comm, CpDeltaRule* cp_core, GatedDeltaNet::Saved& s,
                   const TensorRef& x, const TensorRef& mask, const TensorRef& d_out,
                   const TensorRef& dx, const LayerParams& grads) {
  const DType dt = p.in_proj_qkv.dtype;
  const Dims d = dims(config, s.B, s.T);
  const std::int64_t kd = d.HK * d.K, vd = d.HV * d.V;
  for (HostTensor* t : {&s.dy, &s.d_o, &s.dz}) ensure(*t, dt, {d.B, d.T, d.HV, d.V});
  ensure(s.dq, dt, s.q.shape);
  ensure(s.dk, dt, s.k.shape);
  ensure(s.dv, dt, s.v.shape);
  for (HostTensor* t : {&s.dbeta, &s.dg, &s.db, &s.da}) ensure(*t, dt, {d.B, d.T, d.HV});
  ensure(s.dmixed, dt, s.mixed.shape);
  const Scalar* xin = s.masked ? s.xm.as<Scalar>() : ptr<Scalar>(x);

  // 7. dy = d_out W_out; dW_out = d_out^T y
  const LinearShape out_proj{d.rows, vd, d.D};
  layer::linear_backward_input<Scalar>(out_proj, ptr<Scalar>(d_out), ptr<Scalar>(p.out_proj),
                                       s.dy.as<Scalar>(), false);
  layer::linear_backward_weight<Scalar>(out_proj, ptr<Scalar>(d_out), s.y.as<Scalar>(),
                                        ptr<Scalar>(grads.out_proj));
  // 6. the gated RMSNorm
  layer::gated_rms_norm_backward<Scalar>({d.rows * d.HV, d.V, config.rms_norm_eps},
                                         s.o.as<Scalar>(), s.z.as<Scalar>(), ptr<Scalar>(p.norm),
                                         s.dy.as<Scalar>(), s.d_o.as<Scalar>(), s.dz.as<Scalar>(),
                                         ptr<Scalar>(grads.norm));
  // 5. the core
  const DeltaRuleInputs in = core_inputs(s, options);
  const DeltaRuleGrads core_grads{.d_o = s.d_o.ref(),
                                  .dq = s.dq.ref(),
                                  .dk = s.dk.ref(),
                                  .dv = s.dv.ref(),
                                  .dg = s.dg.ref(),
                                  .dbeta = s.dbeta.ref()};
  if (cp_core)
    cp_core->backward(in, core_grads);
  else
    delta_rule_backward(in, core_grads, options.method);
  // 4. the gates
  layer::gates_backward<Scalar>(
      {d.rows, d.HV}, s.a.as<Scalar>(), ptr<Scalar>(p.A_log), ptr<Scalar>(p.dt_bias),
      s.beta.as<Scalar>(), s.g.as<Scalar>(), s.dbeta.as<Scalar>(), s.dg.as<Scalar>(),
      s.db.as<Scalar>(), s.da.as<Scalar>(), ptr<Scalar>(grads.A_log), ptr<Scalar>(grads.dt_bias));
  // 3. dq | dk | dv into the post-conv gradient (post is no longer needed)
  Scalar* dpost = s.post.as<Scalar>();
  place_columns(s.dq.as<Scalar>(), kd, dpost, d.C, 0, d.rows);
  place_columns(s.dk.as<Scalar>(), kd, dpost, d.C, kd, d.rows);
  place_columns(s.dv.as<Scalar>(), vd, dpost, d.C, 2 * kd, d.rows);
  // 2. the conv
  const Conv1dArgs conv{s.mixed.ref(), p.conv1d, {}};
  if (comm)
    cp_conv1d_backward(*comm, conv, s.post.ref(), s.dmixed.ref(), grads.conv1d);
  else
    conv1d_backward(conv, s.post.ref(), s.dmixed.ref(), grads.conv1d, {});
  // 1. dx = dmixed W_qkv + dz W_z + db W_b + da W_a; dW = d(out)^T x for each projection
  const struct {
    const Scalar* dout;
    std::int64_t width;
    const TensorRef& weight;
    const TensorRef& grad;
  } projections[] = {{s.dmixed.as<Scalar>(), d.C, p.in_proj_qkv, grads.in_proj_qkv},
                     {s.dz.as<Scalar>(), vd, p.in_proj_z, grads.in_proj_z},
                     {s.db.as<Scalar>(), d.HV, p.in_proj_b, grads.in_proj_b},
                     {s.da.as<Scalar>(), d.HV, p.in_proj_a, grads.in_proj_a}};
  bool first = true;
  for (const auto& proj : projections) {
    const LinearShape shape{d.rows, d.D, proj.width};
    layer::linear_backward_input<Scalar>(shape, proj.dout, ptr<Scalar>(proj.weight),
                                         ptr<Scalar>(dx), !first);
    layer::linear_backward_weight<Scalar>(shape, proj.dout, xin, ptr<Scalar>(proj.grad));
    first = false;
  }
  if (s.masked) apply_padding_mask(dx, mask);

  // Each rank's parameter gradients cover its tokens only: the whole is their sum.
  if (comm)
    for_each_parameter(grads, [&](const char*, const TensorRef& t) {
      comm->all_reduce_sum(static_cast<float*>(t.data), static_cast<std::size_t>(t.numel()));
    });
}

}  // namespace

void GatedDeltaNet::forward(const TensorRef& x, const TensorRef& mask, const TensorRef& out) {
  const DType dt = params_.in_proj_qkv.dtype;
  if (x.shape.size() != 3 || x.shape[2] != config_.hidden_size)
    throw Error(fmt::format("layer x must have shape [B, T, hidden_size = {}], got {}",
                            config_.hidden_size, x.shape_string()));
  check("x", x, dt, x.shape);
  check("out", out, dt, x.shape);
  Saved& s = *saved_;
  s.B = x.shape[0];
  s.T = x.shape[1];
  s.masked = mask.given();
  if (dt == DType::f64)
    forward_impl<double>(config_, params_, options_, comm_, cp_core_.get(), s, x, mask, out);
  else
    forward_impl<float>(config_, params_, options_, comm_, cp_core_.get(), s, x, mask, out);
}

void GatedDeltaNet::backward(const TensorRef& x, const TensorRef& mask, const TensorRef& d_out,
                             const TensorRef& dx, const LayerParams& grads) {
  const DType dt = params_.in_proj_qkv.dtype;
  Saved& s = *saved_;
  if (s.B == 0) throw Error("layer backward needs a forward first (on the same x and mask)");
  const std::vector<std::int64_t> shape{s.B, s.T, config_.hidden_size};
  check("x (as in forward)", x, dt, shape);
  if (mask.given() != s.masked)
    throw Error(fmt::format("layer backward must get the mask forward got ({})",
                            s.masked ? "one" : "none"));
  check("d_out", d_out, dt, shape);
  check("dx", dx, dt, shape);
  std::vector<std::vector<std::int64_t>> shapes;  // the parameters', in the same order
  for_each_parameter(params_, [&](const char*, const TensorRef& t) { shapes.push_back(t.shape); });
  std::size_t i = 0;
  for_each_parameter(grads, [&](const char* name, const TensorRef& g) {
    check(fmt::format("gradient of {}", name).c_str(), g, dt, shapes[i++]);
  });
  if (dt == DType::f64)
    backward_impl<double>(config_, params_, options_, comm_, cp_core_.get(), s, x, mask, d_out, dx,
                          grads);
  else
    backward_impl<float>(config_, params_, options_, comm_, cp_core_.get(), s, x, mask, d_out, dx,
                         grads);
}

}  // namespace gdn
