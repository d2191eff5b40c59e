// The cost model's predictions (cp/cost_model.h), markdown for bench/RESULTS.md; needs no GPU.
// CPU: bench_cp's shapes (B=1 HK=16 HV=32 K=V=128 f32, one thread per rank, in-process ranks on
// 2 cores), every strategy's forward and forward + backward and auto's picks for each. GPU: strong
// scaling, B=1 HK=16 HV=32 K=V=128 bf16, every strategy at P ranks of one H200 each over NVLink,
// forward and forward + backward, with the efficiency t_1 / (P t_P) against one GPU on the same
// tokens.
#include <fmt/format.h>

#include "cp/cost_model.h"

int main() {
  using namespace gdn;
  const int cores = 2;  // the CI machine's
  fmt::print(
      "CPU, 2 cores, one thread per rank: predicted ms, forward | forward + backward\n\n| T | P |");
  for (Strategy s : all_strategies()) fmt::print(" {} |", strategy_name(s));
  fmt::print(" auto |\n|---|---|");
  for (std::size_t i = 0; i <= all_strategies().size(); ++i) fmt::print("---|");
  fmt::print("\n");
  for (std::int64_t T : {std::int64_t{2048}, std::int64_t{4096}, std::int64_t{8192}})
    for (int P : {2, 4}) {
      cp::ShardPlan plan;
      plan.ranks = P;
      plan.shape = {1, T / P, 16, 32, 128, 128, 1};
      plan.ranks_on_host = P;
      plan.global_sequences = 1;
      plan.chains = 1;
      fmt::print("| {} | {} |", T, P);
      for (Strategy s : all_strategies())
        fmt::print(" {:.0f} \\| {:.0f} |", cp::predicted_seconds(s, plan, false, 1, cores) * 1e3,
                   cp::predicted_seconds(s, plan, true, 1, cores) * 1e3);
      fmt::print(" {} \\| {} |\n",
                 strategy_name(cp::choose_strategy(plan, Memory::host, false, 1, cores)),
                 strategy_name(cp::choose_strategy(plan, Memory::host, true, 1, cores)));
    }
  for (std::int64_t T : {std::int64_t{131072}, std::int64_t{1} << 20}) {
    fmt::print("\nT = {}: predicted ms (efficiency), forward | forward + backward\n\n", T);
    fmt::print("| P | 1 GPU |");
    for (Strategy s : all_strategies()) fmt::print(" {} |", strategy_name(s));
    fmt::print(" auto |\n|---|---|");
    for (std::size_t i = 0; i <= all_strategies().size(); ++i) fmt::print("---|");
    fmt::print("\n");
    for (int P : {2, 4, 8, 16, 64}) {
      cp::ShardPlan plan;
      plan.ranks = P;
      plan.shape = {1, T / P, 16, 32, 128, 128, 1};
      plan.global_sequences = 1;
      plan.chains = 1;
      const auto cell = [&](bool training, Strategy s) {
        const double t = cp::predicted_gpu_seconds(s, plan, training);
        return fmt::format("{:.2f} ({:.2f})", t * 1e3,
                           cp::single_gpu_seconds(plan, training) / (P * t));
      };
      fmt::print("| {} | {:.2f} \\| {:.2f} |", P, cp::single_gpu_seconds(plan, false) * 1e3,
                 cp::single_gpu_seconds(plan, true) * 1e3);
      for (Strategy s : all_strategies()) fmt::print(" {} \\| {} |", cell(false, s), cell(true, s));
      fmt::print(" {} \\| {} |\n", strategy_name(cp::choose_strategy(plan, Memory::device, false)),
                 strategy_name(cp::choose_strategy(plan, Memory::device, true)));
    }
  }
}
