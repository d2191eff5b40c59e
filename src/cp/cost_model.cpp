#include "cp/cost_model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

namespace gdn::cp {
namespace {

// Measured on the 2-core CI machine kind with bench/bench_cp (bench/RESULTS.md, "CP cost model"),
// medians of repeated runs: t from the forward's CPU time, the ratios from the passes' CPU times.
constexpr double kForwardSecondsPerTokenHead = 1.58e-6;  // t per token and value head, one core
constexpr double kBackwardRatio = 3.35;                  // t_b / t
constexpr double kSummaryRatio = 1.54;                   // s: summary (M, N) / local forward
constexpr double kFirstSummaryRatio = 0.99;              // s_N: summary N alone / local forward
constexpr double kGPassRatio = 0.38;                     // g: G pass / local backward
constexpr double kMessageSeconds = 8.3e-6;               // a: one in-process message
constexpr double kBytesPerSecond = 4.1e9;                // b: in-process, 8 MiB messages
constexpr double kComposeSecondsPerHead = 0.091e-3;      // c: one (M, N) composition, K = V = 128
constexpr double kRelayoutSecondsPerByte = 3.2e-9;       // u: Ulysses' re-layout, one thread

double local_forward_seconds(const ShardPlan& plan, int threads) {
  const DeltaRuleShape& s = plan.shape;
  const double size = static_cast<double>(s.K * s.V) / (128.0 * 128.0);
  return kForwardSecondsPerTokenHead * size * static_cast<double>(s.B * s.T * s.HV) / threads;
}

}  // namespace

double predicted_seconds(Strategy strategy, const ShardPlan& plan, bool training, int threads,
                         int cores) {
  const DeltaRuleShape& s = plan.shape;
  if (threads <= 0) threads = std::max(1, omp_get_max_threads());
  if (cores <= 0) cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const double P = plan.ranks, t = local_forward_seconds(plan, threads), a = kMessageSeconds;
  const double t_b = kBackwardRatio * t;
  const double crowding = std::max(1.0, static_cast<double>(plan.ranks_on_host) * threads / cores);
  if (plan.ranks == 1) return training ? t + t_b : t;
  const double state = static_cast<double>(plan.carried_size()) * sizeof(float);
  const double matrices = state * static_cast<double>(s.K) / static_cast<double>(s.V);
  const double compose = kComposeSecondsPerHead * static_cast<double>(plan.chains * s.HV) *
                         std::pow(static_cast<double>(s.K) / 128.0, 3);
  const double rounds = std::ceil(std::log2(P)), b = kBytesPerSecond;
  // The state's way through the ranks once every rank has its map.
  double passage = 0;
  switch (strategy) {
    case Strategy::relay:
      return training ? P * (t + t_b) : P * t;
    case Strategy::summary_chain:
      passage = (P - 1) * (a + state / b);
      break;
    case Strategy::summary_allgather:
      passage = a + (P - 1) * ((state + matrices) / b + compose);
      break;
    case Strategy::scan:
      passage = (rounds + 1) * a + rounds * ((state + matrices) / b + compose) + state / b;
      break;
    case Strategy::ulysses: {
      if (s.HK % plan.ranks != 0 || s.HV % plan.ranks != 0)
        return std::numeric_limits<double>::infinity();
      // Bytes per token of q, k, v, g, beta (the inputs) and of o, all in f32.
      const double tokens = static_cast<double>(s.B * s.T);
      const double inputs = 4.0 * static_cast<double>(2 * s.HK * s.K + s.HV * s.V + 2 * s.HV);
      const double o = 4.0 * static_cast<double>(s.HV * s.V);
      const double forward =
          crowding * (t + kRelayoutSecondsPerByte * tokens * (inputs + o)) + 2 * a;
      if (!training) return forward;
      return forward + crowding * (t_b + kRelayoutSecondsPerByte * tokens * (2 * inputs + o)) +
             2 * a;
    }
    case Strategy::automatic:
      return std::numeric_limits<double>::infinity();
  }
  const double summary = plan.ranks == 2 ? kFirstSummaryRatio : kSummaryRatio;
  const double forward = crowding * (1 + summary) * t + passage;
  return training ? forward + crowding * (1 + kGPassRatio) * t_b + passage : forward;
}

namespace {

// Measured on one H200 with bench/bench_cuda_cp (bench/RESULTS.md, "GPU CP cost model"): each
// stage's time as alpha + beta n for a shard of n tokens at B = 1, HV = 32 (beta scales with
// B HV / 32), K = V = 128, bf16, fitted through n = 8192 and 131072 (within 1% at 16384-65536).
struct Stage {
  double alpha_ms, beta_ns;  // fixed, and per token
  double seconds(double tokens) const { return alpha_ms * 1e-3 + beta_ns * 1e-9 * tokens; }
};
constexpr Stage kBeforeForward{0.183, 27.33};
constexpr Stage kAfterForward{0.107, 10.86};
constexpr Stage kAfterForwardSaving{0.101, 16.89};
constexpr Stage kBeforeBackward{0.059, 9.74};
constexpr Stage kAfterBackward{0.117, 97.37};
constexpr Stage kSingleForward{0.082, 37.52};
constexpr Stage kSingleTraining{0.161, 155.75};
constexpr double kApplySeconds = 0.019e-3;    // y: HV = 32 maps applied
constexpr double kComposeSeconds = 0.033e-3;  // c: HV = 32 maps composed
// NCCL on 2 x H200 over NVLink (research/context-parallel.md): a 2 MiB state one way in about
// 36 us, 345 GB/s point to point, 534 GB/s all-to-all.
constexpr double kGpuMessageSeconds = 30e-6;
constexpr double kGpuBytesPerSecond = 345e9;
constexpr double kGpuAllToAllBytesPerSecond = 534e9;

// Tokens of the shard in units of the constants' 32 value heads of one batch row.
double scaled_tokens(const ShardPlan& plan) {
  const DeltaRuleShape& s = plan.shape;
  const double size = static_cast<double>(s.K * s.V) / (128.0 * 128.0);
  return static_cast<double>(s.B * s.T) * static_cast<double>(s.HV) / 32.0 * size;
}

}  // namespace

double predicted_gpu_seconds(Strategy strategy, const ShardPlan& plan, bool training) {
  const DeltaRuleShape& s = plan.shape;
  const double P = plan.ranks, n = scaled_tokens(plan), a = kGpuMessageSeconds;
  const double b = kGpuBytesPerSecond;
  const double state = static_cast<double>(plan.carried_size()) * sizeof(float);
  const double matrices = state * static_cast<double>(s.K) / static_cast<double>(s.V);
  const double heads = static_cast<double>(plan.chains * s.HV) / 32.0;
  const double y = kApplySeconds * heads, c = kComposeSeconds * heads;
  const double hop = a + state / b, rounds = std::ceil(std::log2(P));
  if (plan.ranks == 1) return single_gpu_seconds(plan, training);
  // One direction's critical path from its `before` and `after` stages.
  const auto path = [&](double before, double after) {
    switch (strategy) {
      case Strategy::relay:
        return before + P * after + (P - 1) * hop;
      case Strategy::summary_chain:
        return before + (P - 1) * (hop + y) + after;
      case Strategy::summary_allgather:
        return before + a + (P - 1) * ((state + matrices) / b + y) + after;
      case Strategy::scan:
        return before + rounds * (a + (state + matrices) / b + c) + hop + after;
      default:
        return std::numeric_limits<double>::infinity();
    }
  };
  if (strategy == Strategy::ulysses) {
    if (s.HK % plan.ranks != 0 || s.HV % plan.ranks != 0)
      return std::numeric_limits<double>::infinity();
    // Forward: q, k, v, beta in bf16 and g in f32 to the head shards, o back; backward: those
    // and dO again, dq, dk, dv, dbeta and dg back; (P - 1) / P of the shard's bytes each time.
    const double inputs =
        2.0 * static_cast<double>(2 * s.HK * s.K + s.HV * s.V) + 6.0 * static_cast<double>(s.HV);
    const double o = 2.0 * static_cast<double>(s.HV * s.V);
    const auto exchange = [&](double token_bytes) {
      return 2 * a + token_bytes * static_cast<double>(s.B * s.T) * (P - 1) / P /
                         kGpuAllToAllBytesPerSecond;
    };
    if (!training) return kSingleForward.seconds(n) + exchange(inputs + o);
    return kSingleTraining.seconds(n) + exchange(inputs + o) + exchange(2 * inputs + 2 * o);
  }
  const double forward =
      path(kBeforeForward.seconds(n), (training ? kAfterForwardSaving : kAfterForward).seconds(n));
  if (!training) return forward;
  return forward + path(kBeforeBackward.seconds(n), kAfterBackward.seconds(n));
}

double single_gpu_seconds(const ShardPlan& plan, bool training) {
  const double n = scaled_tokens(plan) * plan.ranks;
  return (training ? kSingleTraining : kSingleForward).seconds(n);
}

Strategy choose_strategy(const ShardPlan& plan, Memory memory, bool training, int threads,
                         int cores) {
  const auto predicted = [&](Strategy s) {
    return memory == Memory::host ? predicted_seconds(s, plan, training, threads, cores)
                                  : predicted_gpu_seconds(s, plan, training);
  };
  Strategy best = Strategy::relay;
  for (Strategy s : all_strategies())
    if (predicted(s) < predicted(best)) best = s;
  return best;
}

}  // namespace gdn::cp
