// The causal depthwise conv1d + SiLU: backward against finite differences, the context-parallel
// halo against the single-rank conv, and the 2-D padding mask.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "core/convert.h"
#include "gdn/conv1d.h"
#include "gdn/error.h"
#include "gdn/padding_mask.h"

namespace gdn {
namespace {

HostTensor random(std::vector<std::int64_t> shape, std::uint64_t seed, DType dtype = DType::f64) {
  HostTensor t = HostTensor::zeros(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) core::store(t.ref(), i, normal(rng));
  return t;
}

double sum_product(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.as<double>()[i] * b.as<double>()[i];
  return s;
}

double relative(const HostTensor& x, const HostTensor& ref) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    diff += std::pow(core::load<double>(x.ref(), i) - core::load<double>(ref.ref(), i), 2);
    norm += std::pow(core::load<double>(ref.ref(), i), 2);
  }
  return std::sqrt(diff / norm);
}

TEST(Conv1d, BackwardMatchesFiniteDifferences) {
  const std::int64_t B = 2, T = 5, D = 3, W = 4;
  HostTensor x = random({B, T, D}, 1), w = random({D, 1, W}, 2), halo = random({B, W - 1, D}, 3);
  HostTensor dy = random({B, T, D}, 4), y = HostTensor::zeros(DType::f64, {B, T, D});
  const Conv1dArgs args{x.ref(), w.ref(), halo.ref()};
  const auto loss = [&] {
    conv1d_forward(args, y.ref());
    return sum_product(y, dy);
  };
  HostTensor dx = HostTensor::zeros(DType::f64, {B, T, D}),
             dw = HostTensor::zeros(DType::f64, {D, 1, W});
  HostTensor dhalo = HostTensor::zeros(DType::f64, {B, W - 1, D});
  conv1d_backward(args, dy.ref(), dx.ref(), dw.ref(), dhalo.ref());
  for (auto [input, grad] : {std::pair{&x, &dx}, {&w, &dw}, {&halo, &dhalo}}) {
    HostTensor numeric = HostTensor::zeros(DType::f64, input->shape);
    for (std::int64_t i = 0; i < input->numel(); ++i) {
      double& v = input->as<double>()[i];
      const double saved = v;
      v = saved + 1e-6;
      const double up = loss();
      v = saved - 1e-6;
      const double down = loss();
      v = saved;
      numeric.as<double>()[i] = (up - down) / 2e-6;
    }
    EXPECT_LE(relative(*grad, numeric), 1e-7);
  }
}

// Each rank's shard with the previous rank's halo gives the single-rank conv; dweight sums.
TEST(Conv1d, ContextParallelHaloEqualsSingleRank) {
  const std::int64_t B = 2, T = 24, D = 5, W = 4;
  HostTensor x = random({B, T, D}, 5, DType::f32), w = random({D, 1, W}, 6, DType::f32);
  HostTensor dy = random({B, T, D}, 7, DType::f32);
  HostTensor y = HostTensor::zeros(DType::f64, {B, T, D}), dx = y;
  HostTensor dw = HostTensor::zeros(DType::f64, {D, 1, W});
  conv1d_forward({x.ref(), w.ref(), {}}, y.ref());
  conv1d_backward({x.ref(), w.ref(), {}}, dy.ref(), dx.ref(), dw.ref(), {});
  for (int ranks : {1, 2, 3, 4, 8}) {
    const std::int64_t Tl = T / ranks;
    HostTensor y_cp = HostTensor::zeros(DType::f64, {B, T, D}), dx_cp = y_cp;
    HostTensor dw_cp = HostTensor::zeros(DType::f64, {D, 1, W});
    std::mutex mutex;
    run_in_process(ranks, [&](Communicator& comm) {
      const auto slice = [&](const HostTensor& full, DType dtype) {
        HostTensor part = HostTensor::zeros(dtype, {B, Tl, D});
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < Tl * D; ++i)
            core::store(part.ref(), b * Tl * D + i,
                        core::load<double>(full.ref(), (b * T + comm.rank() * Tl) * D + i));
        return part;
      };
      HostTensor xs = slice(x, DType::f32), dys = slice(dy, DType::f32);
      HostTensor ys = HostTensor::zeros(DType::f64, {B, Tl, D}), dxs = ys;
      HostTensor dws = HostTensor::zeros(DType::f64, {D, 1, W});
      const Conv1dArgs shard{xs.ref(), w.ref(), {}};
      cp_conv1d_forward(comm, shard, ys.ref());
      cp_conv1d_backward(comm, shard, dys.ref(), dxs.ref(), dws.ref());
      const std::lock_guard lock(mutex);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < Tl * D; ++i) {
          y_cp.as<double>()[(b * T + comm.rank() * Tl) * D + i] = ys.as<double>()[b * Tl * D + i];
          dx_cp.as<double>()[(b * T + comm.rank() * Tl) * D + i] = dxs.as<double>()[b * Tl * D + i];
        }
      for (std::int64_t i = 0; i < dw.numel(); ++i) dw_cp.as<double>()[i] += dws.as<double>()[i];
    });
    EXPECT_LE(relative(y_cp, y), 1e-14) << "P=" << ranks;
    EXPECT_LE(relative(dx_cp, dx), 1e-14) << "P=" << ranks;
    EXPECT_LE(relative(dw_cp, dw), 1e-13) << "P=" << ranks;
  }
}

TEST(Conv1d, ShardShorterThanHaloIsRejected) {
  HostTensor x = random({1, 2, 3}, 1, DType::f32), w = random({3, 1, 4}, 2, DType::f32);
  HostTensor y = HostTensor::zeros(DType::f32, {1, 2, 3});
  try {
    run_in_process(2, [&](Communicator& comm) {
      cp_conv1d_forward(comm, {x.ref(), w.ref(), {}}, y.ref());
    });
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("the conv halo needs at least W - 1 = 3 rows per rank, got 2"),
        std::string::npos)
        << e.what();
  }
}

TEST(Conv1d, WeightShapeIsChecked) {
  HostTensor x = random({1, 4, 3}, 1), w = random({3, 4}, 2),
             y = HostTensor::zeros(DType::f64, {1, 4, 3});
  EXPECT_THROW(conv1d_forward({x.ref(), w.ref(), {}}, y.ref()), Error);
}

TEST(PaddingMask, MultipliesRows) {
  HostTensor x = random({2, 3, 4}, 1), mask = HostTensor::zeros(DType::f64, {2, 3});
  const HostTensor before = x;
  mask.as<double>()[1] = 1;  // keep (0, 1) only
  apply_padding_mask(x.ref(), mask.ref());
  for (std::int64_t r = 0; r < 6; ++r)
    for (std::int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(x.as<double>()[r * 4 + d], r == 1 ? before.as<double>()[r * 4 + d] : 0.0);
}

TEST(PaddingMask, RejectsOtherShapes) {
  HostTensor x = random({2, 3, 4}, 1), mask4 = HostTensor::zeros(DType::f64, {2, 1, 3, 3});
  try {
    apply_padding_mask(x.ref(), mask4.ref());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only a 2-D padding mask [B, T] is supported"),
              std::string::npos);
  }
  HostTensor wrong = HostTensor::zeros(DType::f64, {2, 4});
  try {
    apply_padding_mask(x.ref(), wrong.ref());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("attention_mask must have shape [B, T] = [2, 3], got [2, 4]"),
        std::string::npos);
  }
}

}  // namespace
}  // namespace gdn
