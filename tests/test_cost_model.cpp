// The automatic strategy follows the cost model of cp/cost_model.h.
#include <gtest/gtest.h>

#include "cp/cost_model.h"

namespace gdn {
namespace {

cp::ShardPlan plan(int ranks, std::int64_t HK, std::int64_t T) {
  cp::ShardPlan p;
  p.rank = 0;
  p.ranks = ranks;
  p.shape = {1, T / ranks, HK, 32, 128, 128, 1};
  p.global_sequences = 1;
  p.chains = 1;
  return p;
}

TEST(CostModel, UlyssesWhenHeadsDivide) {
  EXPECT_EQ(cp::choose_strategy(plan(2, 16, 65536)), Strategy::ulysses);
  EXPECT_EQ(cp::choose_strategy(plan(4, 16, 65536)), Strategy::ulysses);
}

TEST(CostModel, SummaryChainForFewRanksScanForMany) {
  EXPECT_EQ(cp::choose_strategy(plan(3, 16, 3 * 16384)), Strategy::summary_chain);
  EXPECT_EQ(cp::choose_strategy(plan(128, 1, 65536 * 2)), Strategy::scan);
}

TEST(CostModel, OneRankIsTheLocalPass) {
  const cp::ShardPlan p = plan(1, 16, 4096);
  EXPECT_EQ(cp::predicted_seconds(Strategy::relay, p), cp::predicted_seconds(Strategy::scan, p));
}

// On GPUs (constants of the H200): the state hop is cheap next to the output pass, so a summary
// strategy beats the relay from P = 2 on, and one GPU's prediction is the single-GPU op's.
TEST(CostModel, GpuPrefersSummariesOverTheRelay) {
  for (int P : {2, 4, 8, 64}) {
    const cp::ShardPlan p = plan(P, 1, 131072);
    const Strategy s = cp::choose_strategy(p, Memory::device);
    EXPECT_NE(s, Strategy::relay) << P;
    EXPECT_NE(s, Strategy::ulysses) << P;  // HK = 1 does not divide
    EXPECT_LT(cp::predicted_gpu_seconds(s, p, true),
              cp::predicted_gpu_seconds(Strategy::relay, p, true));
  }
  const cp::ShardPlan one = plan(1, 16, 65536);
  EXPECT_EQ(cp::predicted_gpu_seconds(Strategy::scan, one, true),
            cp::single_gpu_seconds(one, true));
}

}  // namespace
}  // namespace gdn
