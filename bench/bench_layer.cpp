// The Qwen3.5 GatedDeltaNet layer on the CPU at Qwen3.5-9B's GDN shapes (hidden 4096, HK = 16,
// HV = 32, K = V = 128, conv kernel 4), B = 1, f32: forward, forward + backward, and the
// projections alone (the same GEMMs the layer runs), to give their share of the layer's time.
//
// FLOPs of the projections per token: 2 D (C + HV V + 2 HV) in, 2 HV V D out (C = 2 HK K + HV V);
// the backward runs each GEMM twice (dx and dW).
#include <benchmark/benchmark.h>

#include <random>

#include "gdn/layer.h"
#include "layer/linear.h"

namespace {

gdn::LayerConfig qwen35_9b() {
  return {.hidden_size = 4096,
          .linear_num_key_heads = 16,
          .linear_num_value_heads = 32,
          .linear_key_head_dim = 128,
          .linear_value_head_dim = 128,
          .linear_conv_kernel_dim = 4};
}

void fill(gdn::HostTensor& t, double stddev, double mean, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal{static_cast<float>(mean), static_cast<float>(stddev)};
  float* p = t.as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
}

struct Setup {
  gdn::LayerConfig c = qwen35_9b();
  gdn::LayerWeights w = gdn::allocate_parameters(c, gdn::DType::f32);
  gdn::LayerWeights grads = gdn::allocate_parameters(c, gdn::DType::f32);
  gdn::HostTensor x, out, d_out, dx;

  explicit Setup(std::int64_t T) {
    std::uint64_t seed = 0;
    for_each_parameter(w, [&](const std::string& name, gdn::HostTensor& t) {
      const double fan_in = double(t.shape.size() > 1 ? t.shape.back() : 1);
      fill(t, name == "norm.weight" ? 0.0 : 1 / std::sqrt(fan_in),
           name == "norm.weight" ? 1.0 : 0.0, seed++);
    });
    x = gdn::HostTensor::zeros(gdn::DType::f32, {1, T, c.hidden_size});
    fill(x, 1, 0, 100);
    d_out = x;
    fill(d_out, 1, 0, 101);
    out = dx = gdn::HostTensor::zeros(gdn::DType::f32, x.shape);
  }
};

double projection_flops_per_token(const gdn::LayerConfig& c) {
  const double D = double(c.hidden_size), vd = double(c.value_dim());
  return 2 * D * (double(c.conv_dim()) + vd + 2 * double(c.linear_num_value_heads)) + 2 * vd * D;
}

void report(benchmark::State& state, std::int64_t T, double flops_per_token) {
  state.counters["tokens/s"] =
      benchmark::Counter(double(T) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["proj GFLOP/s"] = benchmark::Counter(
      flops_per_token * double(T) * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

void layer_forward(benchmark::State& state) {
  const std::int64_t T = state.range(0);
  Setup s(T);
  gdn::GatedDeltaNet layer(s.c, view(s.w));
  for (auto _ : state) layer.forward(s.x.ref(), {}, s.out.ref());
  report(state, T, projection_flops_per_token(s.c));
}

void layer_forward_backward(benchmark::State& state) {
  const std::int64_t T = state.range(0);
  Setup s(T);
  gdn::GatedDeltaNet layer(s.c, view(s.w));
  for (auto _ : state) {
    layer.forward(s.x.ref(), {}, s.out.ref());
    layer.backward(s.x.ref(), {}, s.d_out.ref(), s.dx.ref(), view(s.grads));
  }
  report(state, T, 3 * projection_flops_per_token(s.c));
}

// The layer's GEMMs alone: range(1) = 0 forward (4 in, 1 out), 1 forward + backward.
void projections(benchmark::State& state) {
  using gdn::layer::LinearShape;
  const std::int64_t T = state.range(0);
  const bool backward = state.range(1) == 1;
  Setup s(T);
  const gdn::LayerConfig& c = s.c;
  const std::int64_t D = c.hidden_size, HV = c.linear_num_value_heads, vd = c.value_dim();
  std::vector<float> mixed(T * c.conv_dim()), z(T * vd), b(T * HV), a(T * HV), y(T * vd);
  const struct {
    LinearShape shape;
    const float *in, *w;
    float *out, *grad;
  } gemms[] = {{{T, D, c.conv_dim()},
                s.x.as<float>(),
                s.w.in_proj_qkv.as<float>(),
                mixed.data(),
                s.grads.in_proj_qkv.as<float>()},
               {{T, D, vd},
                s.x.as<float>(),
                s.w.in_proj_z.as<float>(),
                z.data(),
                s.grads.in_proj_z.as<float>()},
               {{T, D, HV},
                s.x.as<float>(),
                s.w.in_proj_b.as<float>(),
                b.data(),
                s.grads.in_proj_b.as<float>()},
               {{T, D, HV},
                s.x.as<float>(),
                s.w.in_proj_a.as<float>(),
                a.data(),
                s.grads.in_proj_a.as<float>()},
               {{T, vd, D},
                y.data(),
                s.w.out_proj.as<float>(),
                s.out.as<float>(),
                s.grads.out_proj.as<float>()}};
  for (auto _ : state) {
    for (const auto& g : gemms) gdn::layer::linear_forward(g.shape, g.in, g.w, g.out);
    if (!backward) continue;
    for (const auto& g : gemms) {  // dy plays d(out); the dx of the out projection is dy
      gdn::layer::linear_backward_input(g.shape, g.out, g.w, s.dx.as<float>(), false);
      gdn::layer::linear_backward_weight(g.shape, g.out, g.in, g.grad);
    }
  }
  state.SetLabel(backward ? "forward + backward" : "forward");
  report(state, T, (backward ? 3 : 1) * projection_flops_per_token(c));
}

}  // namespace

BENCHMARK(layer_forward)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(layer_forward_backward)
    ->Arg(1024)
    ->Arg(2048)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(projections)
    ->ArgsProduct({{1024, 2048}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
