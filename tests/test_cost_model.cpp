// The automatic strategy follows the cost model of cp/cost_model.h.
#include <gtest/gtest.h>

#include "cp/cost_model.h"

namespace gdn {
namespace {

cp::ShardPlan plan(int ranks, std::int64_t HK, std::int64_t T, int ranks_on_host = 1) {
  cp::ShardPlan p;
  p.rank = 0;
  p.ranks = ranks;
  p.ranks_on_host = ranks_on_host;
  p.shape = {1, T / ranks, HK, 32, 128, 128, 1};
  p.global_sequences = 1;
  p.chains = 1;
  return p;
}

// The 2-core CPU, in-process ranks on one thread each (bench/RESULTS.md, "CP cost model"): at
// T = 4096 and 8192 over 2 ranks bench_cp measured the summary chain within 4% of the best
// strategy, forward and forward + backward, and Ulysses (which the old constants picked) 26-46%
// slower: Ulysses re-lays out every shard through fresh buffers, about 3 ns a byte here.
TEST(CostModel, CpuPicksTheSummaryChainOverTwoRanks) {
  for (std::int64_t T : {4096, 8192})
    for (bool training : {false, true}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " training " << training);
      const cp::ShardPlan p = plan(2, 16, T, 2);
      EXPECT_EQ(cp::choose_strategy(p, Memory::host, training, 1, 2), Strategy::summary_chain);
      EXPECT_GT(cp::predicted_seconds(Strategy::ulysses, p, training, 1, 2),
                1.1 * cp::predicted_seconds(Strategy::summary_chain, p, training, 1, 2));
    }
}

// Over 4 ranks on those 2 cores the ranks' summaries no longer run at once: the forward alone is
// the relay's (bench_cp: the relay best, the chain 22% behind), a training step is not (the
// relay 5-29% behind the best, the chain within 5%, Ulysses within 0-20%).
TEST(CostModel, CpuCrowdedHostForwardIsTheRelays) {
  for (std::int64_t T : {4096, 8192}) {
    SCOPED_TRACE(T);
    const cp::ShardPlan p = plan(4, 16, T, 4);
    EXPECT_EQ(cp::choose_strategy(p, Memory::host, false, 1, 2), Strategy::relay);
    const Strategy training = cp::choose_strategy(p, Memory::host, true, 1, 2);
    EXPECT_TRUE(training == Strategy::summary_chain || training == Strategy::ulysses)
        << strategy_name(training);
    // With a core for each rank every rank works at once, and the relay loses the forward too.
    EXPECT_NE(cp::choose_strategy(p, Memory::host, false, 1, 4), Strategy::relay);
    // Crowding stretches what every rank runs at once, not the relay's one-at-a-time passes.
    EXPECT_EQ(cp::predicted_seconds(Strategy::relay, p, true, 1, 2),
              cp::predicted_seconds(Strategy::relay, p, true, 1, 4));
    EXPECT_GT(cp::predicted_seconds(Strategy::summary_chain, p, true, 1, 2),
              1.8 * cp::predicted_seconds(Strategy::summary_chain, p, true, 1, 4));
  }
}

// The model reads the threads a rank's op runs on: more threads shrink the local passes but not
// Ulysses' single-threaded re-layout, nor the messages.
TEST(CostModel, CpuThreadsShrinkTheLocalPassesOnly) {
  const cp::ShardPlan p = plan(2, 16, 8192);
  const double one = cp::predicted_seconds(Strategy::relay, p, true, 1, 16);
  EXPECT_NEAR(cp::predicted_seconds(Strategy::relay, p, true, 8, 16), one / 8, one * 1e-12);
  const double ulysses = cp::predicted_seconds(Strategy::ulysses, p, true, 8, 16);
  EXPECT_GT(ulysses, cp::predicted_seconds(Strategy::ulysses, p, true, 1, 16) / 8);
  EXPECT_EQ(cp::choose_strategy(p, Memory::host, true, 8, 16), Strategy::summary_chain);
}

TEST(CostModel, SummaryChainForFewRanksScanForMany) {
  for (bool training : {false, true}) {
    EXPECT_EQ(cp::choose_strategy(plan(3, 16, 3 * 16384), Memory::host, training, 1, 4),
              Strategy::summary_chain);
    EXPECT_EQ(cp::choose_strategy(plan(128, 1, 65536 * 2), Memory::host, training, 1, 4),
              Strategy::scan);
    EXPECT_EQ(cp::choose_strategy(plan(128, 1, 65536 * 2), Memory::host, training, 2, 4),
              Strategy::scan);
  }
}

TEST(CostModel, OneRankIsTheLocalPass) {
  const cp::ShardPlan p = plan(1, 16, 4096);
  for (bool training : {false, true})
    EXPECT_EQ(cp::predicted_seconds(Strategy::relay, p, training, 1),
              cp::predicted_seconds(Strategy::scan, p, training, 1));
}

// On GPUs (constants of the H200): the state hop is cheap next to the output pass, so a summary
// strategy beats the relay from P = 2 on, and one GPU's prediction is the single-GPU op's.
TEST(CostModel, GpuPrefersSummariesOverTheRelay) {
  for (int P : {2, 4, 8, 64}) {
    const cp::ShardPlan p = plan(P, 1, 131072);
    const Strategy s = cp::choose_strategy(p, Memory::device, false);
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
