// The GPU cost model's strong-scaling predictions (cp/cost_model.h): B=1 HK=16 HV=32 K=V=128
// bf16, every strategy at P ranks of one H200 each over NVLink, forward and forward + backward,
// with the efficiency t_1 / (P t_P) against one GPU on the same tokens. Prints markdown for
// bench/RESULTS.md; needs no GPU.
#include <fmt/format.h>

#include "cp/cost_model.h"

int main() {
  using namespace gdn;
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
      fmt::print(" {} |\n", strategy_name(cp::choose_strategy(plan, Memory::device)));
    }
  }
}
