#include "cp/cost_model.h"

#include <cmath>
#include <limits>

namespace gdn::cp {
namespace {

// Measured on the 2-core CI machine kind with bench/bench_cp (bench/RESULTS.md, "CP cost model").
constexpr double kForwardSecondsPerTokenHead = 6.3e-6;  // t per token and value head, one core
constexpr double kSummaryRatio = 0.86;                  // s: summary (M, N) / local forward
constexpr double kMessageSeconds = 12e-6;               // a: one in-process message
constexpr double kBytesPerSecond = 1.9e9;               // b: in-process, 8 MiB messages
constexpr double kComposeSecondsPerHead = 0.24e-3;      // c: one (M, N) composition, K = V = 128

double local_forward_seconds(const ShardPlan& plan) {
  const DeltaRuleShape& s = plan.shape;
  const double size = static_cast<double>(s.K * s.V) / (128.0 * 128.0);
  return kForwardSecondsPerTokenHead * size * static_cast<double>(s.B * s.T * s.HV);
}

}  // namespace

double predicted_seconds(Strategy strategy, const ShardPlan& plan) {
  const DeltaRuleShape& s = plan.shape;
  const double P = plan.ranks, t = local_forward_seconds(plan), a = kMessageSeconds;
  const double state = static_cast<double>(plan.carried_size()) * sizeof(float);
  const double matrices = state * static_cast<double>(s.K) / static_cast<double>(s.V);
  const double compose = kComposeSecondsPerHead * static_cast<double>(plan.chains * s.HV) *
                         std::pow(static_cast<double>(s.K) / 128.0, 3);
  const double rounds = std::ceil(std::log2(P));
  const double b = kBytesPerSecond, summary = (1 + kSummaryRatio) * t;
  if (plan.ranks == 1) return t;
  switch (strategy) {
    case Strategy::relay:
      return P * t;
    case Strategy::summary_chain:
      return summary + (P - 1) * (a + state / b);
    case Strategy::summary_allgather:
      return summary + a + (P - 1) * ((state + matrices) / b + compose);
    case Strategy::scan:
      return summary + (rounds + 1) * a + rounds * ((state + matrices) / b + compose) + state / b;
    case Strategy::ulysses: {
      if (s.HK % plan.ranks != 0 || s.HV % plan.ranks != 0)
        return std::numeric_limits<double>::infinity();
      // q, k, v, g, beta in f32 out and o back, (P - 1) / P of the shard each way.
      const double token_bytes =
          4.0 * static_cast<double>(2 * s.HK * s.K + 2 * s.HV * s.V + 2 * s.HV);
      const double exchanged = token_bytes * static_cast<double>(s.B * s.T) * (P - 1) / P;
      return t + 2 * a + exchanged / b;
    }
    case Strategy::automatic:
      break;
  }
  return std::numeric_limits<double>::infinity();
}

Strategy choose_strategy(const ShardPlan& plan) {
  Strategy best = Strategy::relay;
  for (Strategy s : all_strategies())
    if (predicted_seconds(s, plan) < predicted_seconds(best, plan)) best = s;
  return best;
}

}  // namespace gdn::cp
