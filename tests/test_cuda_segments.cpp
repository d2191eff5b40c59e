// The segment plan of the CUDA state passes (cuda/segments.h): host arithmetic, no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/segments.h"

namespace gdn::cuda {
namespace {

constexpr int kH200 = 132;  // multiprocessors

// The plan of a sequence of `chunks` chunks over `heads` heads (no context parallelism) on an
// H200 has `count` segments, the transfers in `parts` parts; returns it.
SegmentPlan expect_plan(std::int64_t heads, std::int64_t chunks, bool training, int count,
                        int parts) {
  const SegmentPlan plan = plan_segments(heads, chunks, false, training, kH200);
  EXPECT_EQ(plan.count, count) << heads << " heads, " << chunks << " chunks";
  EXPECT_EQ(plan.parts, parts) << heads << " heads, " << chunks << " chunks";
  return plan;
}

// The shapes the cost model was measured on (bench/RESULTS.md): 32 value heads at T = 65536 take
// 4 segments whatever the path, their transfers in 4 parts (the summary's 5 blocks a head in one
// wave of 132 instead of two); 2 heads keep the 64 segments of the training sweep, undivided.
TEST(CudaSegments, MeasuredShapes) {
  for (bool training : {false, true}) {
    const SegmentPlan wide = expect_plan(32, 1024, training, 4, 4);
    EXPECT_EQ(wide.length, 256);
    EXPECT_EQ(wide.part_length, 64);
  }
  expect_plan(2, 1024, true, 64, 1);
  // Inference: T = 16384 at 32 heads gains from 4 segments in parts (0.62 -> 0.59 ms), T = 4096
  // does not (0.193 -> 0.200 ms with 4 in 2 parts): it keeps 3.
  expect_plan(32, 256, false, 4, 4);
  expect_plan(32, 64, false, 3, 1);
  // Enough heads to fill the GPU: one segment, nothing to summarize.
  expect_plan(256, 128, true, 1, 1);
}

// The backward's chains beside grad_chunk (chains_beside), measured on an H100 (bench/RESULTS.md,
// fiftieth session): 32 value heads at T = 4096 and 16384 (backward 0.352 -> 0.27 and 1.21 ->
// 0.96 ms) take it; 2 heads at T = 65536 (a 1024-step chain), 16 at T = 16384 (grad_chunk's
// work no longer than the chain) and at T = 1024 (beside: 0.137 -> 0.151 ms) keep the segments,
// as do heads that fill the GPU.
TEST(CudaSegments, ChainsBeside) {
  // T = 65536 in rounds: 4 of them, a segment each.
  for (const std::int64_t chunks : {64, 256, 1024})
    EXPECT_TRUE(chains_beside(1, 32, chunks, plan_segments(32, chunks, false, true, kH200), kH200))
        << chunks << " chunks";
  EXPECT_FALSE(chains_beside(1, 2, 1024, plan_segments(2, 1024, false, true, kH200), kH200));
  EXPECT_FALSE(chains_beside(1, 16, 256, plan_segments(16, 256, false, true, kH200), kH200));
  EXPECT_FALSE(chains_beside(1, 16, 16, plan_segments(16, 16, false, true, kH200), kH200));
  EXPECT_FALSE(chains_beside(1, kH200, 64, plan_segments(kH200, 64, false, true, kH200), kH200));
  // Several sequences only in rounds, a segment a round, and where the segments are long: B=4
  // at T=16384 (4 rounds of one sequence) and B=2 at T=32768 (4 of half a sequence), not B=8 at
  // T=8192 (8 rounds of 128-chunk chains) nor B=2 at T=4096 (one round).
  const auto several = [](std::int64_t sequences, std::int64_t chunks) {
    const SegmentPlan plan = plan_segments(sequences * 32, chunks, false, true, kH200);
    return chains_beside(sequences, 32, sequences * chunks, plan, kH200);
  };
  EXPECT_TRUE(several(4, 256));
  EXPECT_TRUE(several(2, 512));
  EXPECT_FALSE(several(8, 128));
  EXPECT_FALSE(several(2, 64));
}

// The folds' slice width: 32 columns where the blocks of the chains fill three quarters of an
// H200's 132 SMs, 16 where twice as many blocks do, else 8.
TEST(CudaSegments, FoldTiles) {
  EXPECT_EQ(fold_tiles(32, 132), 4);  // 128 blocks
  EXPECT_EQ(fold_tiles(25, 132), 4);  // 100 blocks
  EXPECT_EQ(fold_tiles(24, 132), 2);  // 192 blocks of 16 columns
  EXPECT_EQ(fold_tiles(13, 132), 2);
  EXPECT_EQ(fold_tiles(12, 132), 1);  // 192 blocks of 8 columns
  EXPECT_EQ(fold_tiles(2, 132), 1);
  EXPECT_EQ(fold_tiles(4096, 132), 4);
}

// Every plan covers the longest sequence with no empty segment, and a segment by its parts (a
// power of two, so that the folds shift and mask; none empty); transfers are split only where there
// are some (3 segments or more) and not under context parallelism.
TEST(CudaSegments, PlansCoverTheSequence) {
  for (std::int64_t heads : {1, 2, 3, 8, 32, 64, 200, 1000})
    for (std::int64_t longest : {1, 2, 5, 64, 100, 1024, 4097})
      for (bool carried : {false, true})
        for (bool training : {false, true})
          for (int sms : {1, 8, 132}) {
            const SegmentPlan p = plan_segments(heads, longest, carried, training, sms);
            SCOPED_TRACE(testing::Message() << heads << " heads, " << longest << " chunks, "
                                            << carried << training << " on " << sms << " SMs");
            ASSERT_GE(p.count, 1);
            EXPECT_GE(std::int64_t{p.count} * p.length, longest);
            EXPECT_LT(std::int64_t{p.count - 1} * p.length, longest);
            ASSERT_GE(p.parts, 1);
            EXPECT_GE(p.parts * p.part_length, p.length);
            EXPECT_LT((p.parts - 1) * p.part_length, p.length);  // no part left empty
            EXPECT_TRUE(p.parts == 1 || p.parts == 2 || p.parts == 4 || p.parts == 8);
            if (carried || p.count < 3) {
              EXPECT_EQ(p.parts, 1);
            }
          }
}

// The backward's rounds (RoundPlan): at T = 65536 with 32 value heads (4 segments of 256
// chunks) h, Vn, dh and dVn take 4 rounds of 64 chunks a segment, 0.75 GiB instead of 3; a call
// whose buffers fit a round's bytes anyway runs in one round over every chunk slot.
TEST(CudaSegments, BackwardRounds) {
  const RoundPlan wide = plan_rounds(4, 256, 1024, 32);
  EXPECT_EQ(wide.count, 4);
  EXPECT_EQ(wide.length, 64);
  EXPECT_EQ(wide.slots, 4 * 64);
  const RoundPlan small = plan_rounds(4, 64, 256, 32);  // T = 16384
  EXPECT_EQ(small.count, 1);
  EXPECT_EQ(small.slots, 256);
  // 64 sequences at T = 65536 with their offsets on the device only: 64 segments that may each
  // be 1024 chunks long, in 1087 slots. Rounds by segment within the bytes would be 4 chunks
  // long (256 of them); 8 rounds of 128 chunks could hold every slot. So rounds by slots: 5 of
  // the 256 slots the bytes allow.
  const RoundPlan packed = plan_rounds(64, 1024, 1087, 32);
  EXPECT_TRUE(packed.by_slots);
  EXPECT_EQ(packed.count, 5);
  EXPECT_EQ(packed.slots, 256);
  EXPECT_FALSE(wide.by_slots);
  // One sequence of 512k tokens in 4 segments: 32 rounds within the bytes, 8 at most.
  const RoundPlan longer = plan_rounds(4, 2048, 8192, 32);
  EXPECT_EQ(longer.count, 8);
  EXPECT_EQ(longer.length, 256);
  EXPECT_EQ(longer.slots, 4 * 256);
}

// Rounds by segment cover a segment, none empty; rounds by slots cover the slots, none empty;
// one round holds every chunk slot; more rounds hold fewer and save bytes even with the states
// and state gradients carried across their boundaries.
TEST(CudaSegments, RoundsCoverTheSegments) {
  for (std::int64_t heads : {1, 2, 32, 64})
    for (std::int64_t segments : {1, 3, 64, 1000})
      for (std::int64_t length : {1, 5, 64, 256, 1024}) {
        const std::int64_t slots = segments * length;
        for (std::int64_t chunk_slots : {slots, slots / 3 + 1}) {
          const RoundPlan r = plan_rounds(segments, length, chunk_slots, heads);
          SCOPED_TRACE(testing::Message() << heads << " heads, " << segments << " segments of "
                                          << length << ", " << chunk_slots << " slots");
          ASSERT_GE(r.count, 1);
          EXPECT_LE(r.count, 8);
          const std::int64_t covered = r.by_slots ? chunk_slots : length;
          EXPECT_GE(std::int64_t{r.count} * r.length, covered);
          EXPECT_LT(std::int64_t{r.count - 1} * r.length, covered);
          if (r.count == 1) {
            EXPECT_EQ(r.slots, chunk_slots);
            EXPECT_FALSE(r.by_slots);
          } else {
            EXPECT_LT(r.slots, chunk_slots);
            EXPECT_EQ(r.slots, r.by_slots ? r.length : std::min(chunk_slots, segments * r.length));
            EXPECT_LT((r.slots * 96 + 2 * r.boundaries(segments) * 64) * heads,  // KiB
                      chunk_slots * heads * 96);
          }
        }
      }
}

}  // namespace
}  // namespace gdn::cuda
