// The layer over P in-process ranks equals the single-rank layer (spec 5-6): output, input
// gradient and every parameter gradient, for every strategy, P in {1, 2, 4}, with and without the
// padding mask.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "gdn/context_parallel.h"
#include "gdn/error.h"
#include "gdn/layer.h"
#include "layer_testing.h"

namespace gdn {
namespace {

using testing::random_tensor;
using testing::relative;

// HK = 4 so that Ulysses fits P = 4; T = 24 gives every rank of P = 4 at least W - 1 rows.
LayerConfig config() {
  return {.hidden_size = 16,
          .linear_num_key_heads = 4,
          .linear_num_value_heads = 8,
          .linear_key_head_dim = 8,
          .linear_value_head_dim = 4,
          .linear_conv_kernel_dim = 4};
}
constexpr std::int64_t kB = 2, kT = 24;
constexpr LayerOptions kOptions{.chunk_size = 4};
// CP differs from one rank by float32 rounding only (sums in another order).
constexpr double kTolerance = 1e-5;

struct Result {
  HostTensor out, dx;
  LayerWeights grads;
};

// Tokens [t0, t0 + n) of every batch row of a [B, T, ...] tensor.
HostTensor rows(const HostTensor& t, std::int64_t t0, std::int64_t n) {
  std::vector<std::int64_t> shape = t.shape;
  shape[1] = n;
  HostTensor out = HostTensor::zeros(t.dtype, shape);
  const std::size_t row = t.bytes.size() / static_cast<std::size_t>(t.shape[0] * t.shape[1]);
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    std::memcpy(out.bytes.data() + (b * n) * row, t.bytes.data() + (b * t.shape[1] + t0) * row,
                n * row);
  return out;
}

void place_rows(const HostTensor& shard, std::int64_t t0, HostTensor& whole) {
  const std::int64_t n = shard.shape[1];
  const std::size_t row = shard.bytes.size() / static_cast<std::size_t>(shard.shape[0] * n);
  for (std::int64_t b = 0; b < whole.shape[0]; ++b)
    std::memcpy(whole.bytes.data() + (b * whole.shape[1] + t0) * row,
                shard.bytes.data() + (b * n) * row, n * row);
}

Result single(const LayerWeights& w, const HostTensor& x, const HostTensor* mask,
              const HostTensor& d_out) {
  Result r{HostTensor::zeros(DType::f32, x.shape), HostTensor::zeros(DType::f32, x.shape),
           allocate_parameters(config(), DType::f32)};
  GatedDeltaNet layer(config(), view(w), kOptions);
  const TensorRef m = mask ? mask->ref() : TensorRef{};
  layer.forward(x.ref(), m, r.out.ref());
  layer.backward(x.ref(), m, d_out.ref(), r.dx.ref(), view(r.grads));
  return r;
}

// Every rank's parameter gradients (all-reduced) must be the same: rank 0's are returned and the
// others compared to them bit for bit.
Result context_parallel(int ranks, Strategy strategy, const LayerWeights& w, const HostTensor& x,
                        const HostTensor* mask, const HostTensor& d_out) {
  Result whole{HostTensor::zeros(DType::f32, x.shape), HostTensor::zeros(DType::f32, x.shape), {}};
  std::vector<LayerWeights> grads(ranks);
  std::mutex mutex;
  run_in_process(ranks, [&](Communicator& comm) {
    const std::int64_t n = kT / ranks, t0 = comm.rank() * n;
    const HostTensor xs = rows(x, t0, n), ds = rows(d_out, t0, n);
    const HostTensor ms = mask ? rows(*mask, t0, n) : HostTensor{};
    HostTensor out = HostTensor::zeros(DType::f32, xs.shape), dx = out;
    LayerWeights g = allocate_parameters(config(), DType::f32);
    GatedDeltaNet layer(comm, {strategy}, config(), view(w), kOptions);
    const TensorRef m = mask ? ms.ref() : TensorRef{};
    layer.forward(xs.ref(), m, out.ref());
    layer.backward(xs.ref(), m, ds.ref(), dx.ref(), view(g));
    const std::lock_guard lock(mutex);
    place_rows(out, t0, whole.out);
    place_rows(dx, t0, whole.dx);
    grads[comm.rank()] = std::move(g);
  });
  for (int r = 1; r < ranks; ++r) {
    std::vector<const HostTensor*> mine;
    for_each_parameter(grads[r], [&](const char*, const HostTensor& t) { mine.push_back(&t); });
    std::size_t i = 0;
    for_each_parameter(grads[0], [&](const char* name, const HostTensor& t) {
      EXPECT_EQ(t.bytes, mine[i++]->bytes) << name << " differs between rank 0 and rank " << r;
    });
  }
  whole.grads = std::move(grads[0]);
  return whole;
}

class LayerCp : public ::testing::TestWithParam<std::tuple<Strategy, int>> {};

TEST_P(LayerCp, EqualsSingleRank) {
  const auto [strategy, ranks] = GetParam();
  const LayerWeights w = testing::random_weights(config(), DType::f32, 11);
  const HostTensor x = random_tensor(DType::f32, {kB, kT, config().hidden_size}, 12);
  const HostTensor d_out = random_tensor(DType::f32, x.shape, 13);
  const HostTensor mask = testing::left_padding_mask(DType::f32, kB, kT);
  for (const HostTensor* m : {static_cast<const HostTensor*>(nullptr), &mask}) {
    const std::string what =
        fmt::format("{} P={} mask={}", strategy_name(strategy), ranks, m != nullptr);
    const Result ref = single(w, x, m, d_out);
    const Result cp = context_parallel(ranks, strategy, w, x, m, d_out);
    EXPECT_LE(relative(cp.out, ref.out), kTolerance) << what << " out";
    EXPECT_LE(relative(cp.dx, ref.dx), kTolerance) << what << " dx";
    std::vector<const HostTensor*> refs;
    for_each_parameter(ref.grads, [&](const char*, const HostTensor& t) { refs.push_back(&t); });
    std::size_t i = 0;
    for_each_parameter(cp.grads, [&](const char* name, const HostTensor& g) {
      EXPECT_LE(relative(g, *refs[i++]), kTolerance) << what << " " << name;
    });
  }
}

std::vector<Strategy> strategies() {
  std::vector<Strategy> all = all_strategies();
  all.push_back(Strategy::automatic);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerCp,
                         ::testing::Combine(::testing::ValuesIn(strategies()),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& test) {
                           std::string name(strategy_name(std::get<0>(test.param)));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return fmt::format("{}_P{}", name, std::get<1>(test.param));
                         });

TEST(LayerCpErrors, NeedsFloat32AndTheChunkedCore) {
  const LayerWeights w64 = testing::random_weights(config(), DType::f64, 1);
  const LayerWeights w32 = testing::random_weights(config(), DType::f32, 1);
  std::string f64_error, method_error;
  run_in_process(1, [&](Communicator& comm) {
    try {
      GatedDeltaNet(comm, {}, config(), view(w64));
    } catch (const Error& e) {
      f64_error = e.what();
    }
    try {
      GatedDeltaNet(comm, {}, config(), view(w32), {.method = Method::recurrent});
    } catch (const Error& e) {
      method_error = e.what();
    }
  });
  EXPECT_EQ(f64_error, "context-parallel layer parameters must be f32, got f64");
  EXPECT_EQ(method_error, "context-parallel layer runs Method::chunked only");
}

}  // namespace
}  // namespace gdn
