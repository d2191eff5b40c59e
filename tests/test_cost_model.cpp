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

}  // namespace
}  // namespace gdn
