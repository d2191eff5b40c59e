// The Qwen3.5 GatedDeltaNet layer (spec 6): forward against a literal float64 transcription of the
// spec, every gradient against central finite differences in float64, the float32 path against
// the float64 one, and the module validation errors.
#include <gtest/gtest.h>

#include <limits>

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gdn/error.h"
#include "gdn/layer.h"
#include "layer_testing.h"

namespace gdn {
namespace {

using testing::convert;
using testing::error_of;
using testing::random_tensor;
using testing::random_weights;
using testing::relative;
using testing::tiny_config;

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// Spec 6 step by step, token by token, in float64: the oracle for the layer's plumbing.
HostTensor reference_forward(const LayerConfig& c, const LayerWeights& w64, const HostTensor& x64,
                             const HostTensor* mask) {
  const std::int64_t B = x64.shape[0], T = x64.shape[1], D = c.hidden_size;
  const std::int64_t HK = c.linear_num_key_heads, HV = c.linear_num_value_heads;
  const std::int64_t K = c.linear_key_head_dim, V = c.linear_value_head_dim;
  const std::int64_t C = c.conv_dim(), W = c.linear_conv_kernel_dim;
  const auto at = [](const HostTensor& t, std::int64_t i) { return t.as<double>()[i]; };
  std::vector<double> mixed(B * T * C), post(B * T * C), z(B * T * HV * V), bb(B * T * HV),
      aa(B * T * HV), o(B * T * HV * V);
  for (std::int64_t r = 0; r < B * T; ++r) {
    const double m = mask ? core::load<double>(mask->ref(), r) : 1.0;
    const auto proj = [&](const HostTensor& weight, std::int64_t row) {
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += at(x64, r * D + d) * m * at(weight, row * D + d);
      return s;
    };
    for (std::int64_t j = 0; j < C; ++j) mixed[r * C + j] = proj(w64.in_proj_qkv, j);
    for (std::int64_t j = 0; j < HV * V; ++j) z[r * HV * V + j] = proj(w64.in_proj_z, j);
    for (std::int64_t h = 0; h < HV; ++h) {
      bb[r * HV + h] = proj(w64.in_proj_b, h);
      aa[r * HV + h] = proj(w64.in_proj_a, h);
    }
  }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < C; ++j) {
        double s = 0;
        for (std::int64_t i = 0; i < W; ++i) {
          const std::int64_t src = t - (W - 1) + i;
          if (src >= 0) s += at(w64.conv1d, j * W + i) * mixed[(b * T + src) * C + j];
        }
        post[(b * T + t) * C + j] = s * sigmoid(s);
      }
  const auto l2norm = [](std::vector<double> v) {
    double s = 0;
    for (double e : v) s += e * e;
    for (double& e : v) e /= std::sqrt(s + 1e-6);
    return v;
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HV; ++h) {
      const std::int64_t kh = h / (HV / HK);
      std::vector<double> S(K * V, 0.0);
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t r = b * T + t;
        std::vector<double> q(K), k(K);
        for (std::int64_t i = 0; i < K; ++i) {
          q[i] = post[r * C + kh * K + i];
          k[i] = post[r * C + HK * K + kh * K + i];
        }
        q = l2norm(q);
        k = l2norm(k);
        const double beta = sigmoid(bb[r * HV + h]);
        const double u = aa[r * HV + h] + at(w64.dt_bias, h);
        const double g = -std::exp(at(w64.A_log, h)) * (u > 20 ? u : std::log1p(std::exp(u)));
        for (double& s : S) s *= std::exp(g);
        for (std::int64_t j = 0; j < V; ++j) {
          double kS = 0;
          for (std::int64_t i = 0; i < K; ++i) kS += k[i] * S[i * V + j];
          const double delta = beta * (post[r * C + 2 * HK * K + h * V + j] - kS);
          for (std::int64_t i = 0; i < K; ++i) S[i * V + j] += k[i] * delta;
        }
        for (std::int64_t j = 0; j < V; ++j) {
          double qS = 0;
          for (std::int64_t i = 0; i < K; ++i) qS += q[i] * S[i * V + j];
          o[(r * HV + h) * V + j] = qS / std::sqrt(double(K));
        }
      }
    }
  HostTensor out = HostTensor::zeros(DType::f64, {B, T, D});
  for (std::int64_t r = 0; r < B * T; ++r) {
    std::vector<double> y(HV * V);
    for (std::int64_t h = 0; h < HV; ++h) {
      double ms = 0;
      for (std::int64_t j = 0; j < V; ++j) ms += std::pow(o[(r * HV + h) * V + j], 2) / double(V);
      for (std::int64_t j = 0; j < V; ++j) {
        const std::int64_t i = (r * HV + h) * V + j;
        y[h * V + j] =
            at(w64.norm, j) * o[i] / std::sqrt(ms + c.rms_norm_eps) * z[i] * sigmoid(z[i]);
      }
    }
    for (std::int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (std::int64_t j = 0; j < HV * V; ++j) s += y[j] * at(w64.out_proj, d * HV * V + j);
      out.as<double>()[r * D + d] = s;
    }
  }
  return out;
}

// One forward and backward of the layer.
struct LayerRun {
  HostTensor out, dx;
  LayerWeights grads;
};

LayerRun run(const LayerConfig& c, const LayerWeights& w, const HostTensor& x,
             const HostTensor* mask, const HostTensor& d_out, LayerOptions options) {
  const DType dt = w.in_proj_qkv.dtype;
  LayerRun r{HostTensor::zeros(dt, x.shape), HostTensor::zeros(dt, x.shape),
             allocate_parameters(c, dt)};
  GatedDeltaNet layer(c, view(w), options);
  const TensorRef m = mask ? mask->ref() : TensorRef{};
  layer.forward(x.ref(), m, r.out.ref());
  layer.backward(x.ref(), m, d_out.ref(), r.dx.ref(), view(r.grads));
  return r;
}

constexpr LayerOptions kOracle{.method = Method::recurrent};

TEST(Layer, ForwardMatchesTheSpec) {
  const LayerConfig c = tiny_config();
  const LayerWeights w = random_weights(c, DType::f64, 1);
  const HostTensor x = random_tensor(DType::f64, {2, 9, c.hidden_size}, 2);
  const HostTensor mask = testing::left_padding_mask(DType::f64, 2, 9);
  const HostTensor d_out = random_tensor(DType::f64, x.shape, 3);
  for (const HostTensor* m : {static_cast<const HostTensor*>(nullptr), &mask}) {
    const HostTensor ref = reference_forward(c, w, x, m);
    const LayerRun oracle = run(c, w, x, m, d_out, kOracle);
    EXPECT_LE(relative(oracle.out, ref), 1e-13) << "mask " << (m != nullptr);
    const LayerRun f32 = run(c, convert(w, DType::f32), convert(x, DType::f32), m,
                             convert(d_out, DType::f32), {.chunk_size = 4});
    EXPECT_LE(relative(f32.out, ref), 2e-6) << "mask " << (m != nullptr);
  }
}

// A NaN or inf in a token the mask drops does not reach the others: they equal the run with 0
// there (x * 0 would keep the NaN, and the conv and the recurrence would carry it forward).
TEST(Layer, MaskedNonFiniteTokensDoNotLeak) {
  const LayerConfig c = tiny_config();
  const LayerWeights w = random_weights(c, DType::f32, 1);
  HostTensor x = random_tensor(DType::f32, {2, 9, c.hidden_size}, 2);
  const HostTensor mask = testing::left_padding_mask(DType::f32, 2, 9);  // drops t <= b
  const HostTensor d_out = random_tensor(DType::f32, x.shape, 3);
  HostTensor zeroed = x;
  for (std::int64_t d = 0; d < c.hidden_size; ++d) {
    core::store(x.ref(), d, std::numeric_limits<double>::quiet_NaN());  // b 0, t 0
    core::store(x.ref(), (9 + 1) * c.hidden_size + d, -std::numeric_limits<double>::infinity());
    core::store(zeroed.ref(), d, 0.0);
    core::store(zeroed.ref(), (9 + 1) * c.hidden_size + d, 0.0);
  }
  const LayerRun poisoned = run(c, w, x, &mask, d_out, {});
  const LayerRun clean = run(c, w, zeroed, &mask, d_out, {});
  EXPECT_EQ(poisoned.out.bytes, clean.out.bytes);
  EXPECT_EQ(poisoned.dx.bytes, clean.dx.bytes);
  for_each_parameter(poisoned.grads, [&](const char* name, const HostTensor& g) {
    const HostTensor* other = nullptr;
    for_each_parameter(clean.grads, [&](const char* n, const HostTensor& h) {
      if (std::string(n) == name) other = &h;
    });
    EXPECT_EQ(g.bytes, other->bytes) << name;
  });
}

// d(sum(out * d_out)) / d(every input and parameter element), central differences in float64:
// with h = 1e-6 the truncation error is O(h^2) ~ 1e-12 and the rounding ~ 1e-16 / h = 1e-10, so
// 1e-7 is loose (we measure 2e-10 to 1e-8).
TEST(Layer, GradientsMatchFiniteDifferences) {
  const LayerConfig c = tiny_config();
  LayerWeights w = random_weights(c, DType::f64, 4);
  HostTensor x = random_tensor(DType::f64, {2, 6, c.hidden_size}, 5);
  const HostTensor mask = testing::left_padding_mask(DType::f64, 2, 6);
  const HostTensor d_out = random_tensor(DType::f64, x.shape, 6);
  for (const HostTensor* m : {static_cast<const HostTensor*>(nullptr), &mask}) {
    const LayerRun analytic = run(c, w, x, m, d_out, kOracle);
    GatedDeltaNet layer(c, view(w), kOracle);
    HostTensor out = HostTensor::zeros(DType::f64, x.shape);
    const auto loss = [&] {
      layer.forward(x.ref(), m ? m->ref() : TensorRef{}, out.ref());
      double s = 0;
      for (std::int64_t i = 0; i < out.numel(); ++i)
        s += out.as<double>()[i] * d_out.as<double>()[i];
      return s;
    };
    const auto check = [&](const std::string& name, HostTensor& input, const HostTensor& grad) {
      HostTensor numeric = HostTensor::zeros(DType::f64, input.shape);
      constexpr double h = 1e-6;
      for (std::int64_t i = 0; i < input.numel(); ++i) {
        double& v = input.as<double>()[i];
        const double saved = v;
        v = saved + h;
        const double up = loss();
        v = saved - h;
        const double down = loss();
        v = saved;
        numeric.as<double>()[i] = (up - down) / (2 * h);
      }
      EXPECT_LE(relative(grad, numeric), 1e-7) << name << " mask " << (m != nullptr);
    };
    check("x", x, analytic.dx);
    std::vector<HostTensor*> params, grads;
    for_each_parameter(w, [&](const char*, HostTensor& t) { params.push_back(&t); });
    std::size_t i = 0;
    for_each_parameter(analytic.grads, [&](const char* name, const HostTensor& g) {
      check(name, *params[i++], g);
    });
  }
}

// The float32 layer (chunked core, f32 GEMMs) against the float64 oracle, odd T and chunk. We
// measure ~5e-7 on most tensors and ~8e-6 on in_proj_qkv / conv1d (their gradients pass through
// the l2norm of q and k, whose slope grows as 1 / |q|).
TEST(Layer, Float32MatchesFloat64) {
  LayerConfig c = tiny_config();
  c.hidden_size = 16;
  c.linear_key_head_dim = 8;
  c.linear_value_head_dim = 8;
  const LayerWeights w = random_weights(c, DType::f64, 7);
  const HostTensor x = random_tensor(DType::f64, {2, 37, c.hidden_size}, 8);
  const HostTensor mask = testing::left_padding_mask(DType::f64, 2, 37);
  const HostTensor d_out = random_tensor(DType::f64, x.shape, 9);
  const LayerRun oracle = run(c, w, x, &mask, d_out, kOracle);
  const LayerRun f32 = run(c, convert(w, DType::f32), convert(x, DType::f32), &mask,
                           convert(d_out, DType::f32), {.chunk_size = 8});
  EXPECT_LE(relative(f32.out, oracle.out), 2e-5);
  EXPECT_LE(relative(f32.dx, oracle.dx), 2e-5);
  std::vector<const HostTensor*> refs;
  for_each_parameter(oracle.grads, [&](const char*, const HostTensor& t) { refs.push_back(&t); });
  std::size_t i = 0;
  for_each_parameter(f32.grads, [&](const char* name, const HostTensor& g) {
    EXPECT_LE(relative(g, *refs[i++]), 2e-5) << name;
  });
}

TEST(LayerErrors, ModuleValidation) {
  const LayerConfig c = tiny_config();
  const LayerWeights w = random_weights(c, DType::f32, 1);
  LayerParams missing = view(w);
  missing.in_proj_z = {};
  missing.A_log = {};
  EXPECT_EQ(error_of([&] { GatedDeltaNet(c, missing); }),
            "layer is missing required parameters: in_proj_z.weight, A_log");

  LayerConfig heads = c;
  heads.linear_num_value_heads = 3;
  EXPECT_EQ(error_of([&] { validate(heads); }),
            "layer config linear_num_value_heads (3) must be divisible by linear_num_key_heads "
            "(2)");
  LayerConfig act = c;
  act.hidden_act = "gelu";
  EXPECT_EQ(error_of([&] { GatedDeltaNet(act, view(w)); }),
            "layer config hidden_act must be \"silu\" or \"swish\" (the conv's activation), got "
            "\"gelu\"");
  act.hidden_act = "swish";
  EXPECT_EQ(error_of([&] { GatedDeltaNet(act, view(w)); }), "");

  LayerWeights shaped = w;
  shaped.conv1d = HostTensor::zeros(DType::f32, {c.conv_dim(), c.linear_conv_kernel_dim});
  EXPECT_EQ(error_of([&] { GatedDeltaNet(c, view(shaped)); }),
            "layer parameter conv1d.weight must have shape [28, 1, 4], got [28, 4]");
  LayerWeights mixed = w;
  mixed.norm = convert(w.norm, DType::f64);
  EXPECT_EQ(error_of([&] { GatedDeltaNet(c, view(mixed)); }),
            "layer parameter norm.weight must have in_proj_qkv.weight's dtype f32, got f64");
}

TEST(LayerErrors, Tensors) {
  const LayerConfig c = tiny_config();
  const LayerWeights w = random_weights(c, DType::f32, 1);
  GatedDeltaNet layer(c, view(w));
  const HostTensor x = random_tensor(DType::f32, {1, 5, c.hidden_size}, 2);
  HostTensor out = HostTensor::zeros(DType::f32, x.shape);
  EXPECT_EQ(error_of([&] { layer.backward(x.ref(), {}, out.ref(), out.ref(), view(w)); }),
            "layer backward needs a forward first (on the same x and mask)");
  const HostTensor wide = random_tensor(DType::f32, {1, 5, 7}, 2);
  EXPECT_EQ(error_of([&] { layer.forward(wide.ref(), {}, out.ref()); }),
            "layer x must have shape [B, T, hidden_size = 6], got [1, 5, 7]");
  const HostTensor x64 = random_tensor(DType::f64, x.shape, 2);
  EXPECT_EQ(error_of([&] { layer.forward(x64.ref(), {}, out.ref()); }),
            "layer x must be f32 [1, 5, 6], got f64 [1, 5, 6]");
  const HostTensor mask3 = HostTensor::zeros(DType::f32, {1, 5, 1});
  EXPECT_NE(error_of([&] {
              layer.forward(x.ref(), mask3.ref(), out.ref());
            }).find("only a 2-D padding mask [B, T] is supported"),
            std::string::npos);
  const HostTensor mask = HostTensor::zeros(DType::f32, {1, 4});
  EXPECT_EQ(error_of([&] { layer.forward(x.ref(), mask.ref(), out.ref()); }),
            "attention_mask must have shape [B, T] = [1, 5], got [1, 4]");
}

}  // namespace
}  // namespace gdn
