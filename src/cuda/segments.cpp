// The segment plan's cost model. Time is counted in chunk steps of one state pass, run back to
// back: the passes that follow one another (the forward's summary and its output or save pass;
// for training also the backward's summary, P - 1 offsets a value head, and gradient pass),
// each as long as its busiest multiprocessor, plus the folds, whose serial chains take a step a
// segment or transfer part. A fold step costs about kFoldChunks chunk steps in each wave of fold
// blocks: the fold step itself (1.6 us at HV=2, against about 3 us a chunk step) and each
// segment's own work, fitted to sweeps of the segment count at HV=2 T=65536 (bench/RESULTS.md:
// training 32, 48, 64, 96 segments 0.914, 0.893, 0.879, 1.068 ms).
//
// The forward's summary runs, per value head, the offsets N_k of P - 1 segments (all P under
// context parallelism) and the transfers M_k of the P - 2 middle ones (all P): 2P - 3 blocks of
// a segment each, two waves at P = 4 with 32 heads on 132 SMs. Cutting the transfers into parts
// lets them fill what the offsets leave: the pass takes the longer of a wave of offsets and the
// whole work spread over every multiprocessor, rounded up to a part. The parts cost fold steps,
// so they pay where segments are long and the folds' waves few (T = 64k at 32 heads: 4 segments,
// transfers in 4 parts; at 2 heads the summary already spreads evenly and parts only cost).
#include "cuda/segments.h"

#include <algorithm>

namespace gdn::cuda {
namespace {

constexpr std::int64_t kMinSegment = 4;  // chunks
constexpr std::int64_t kFoldChunks = 1, kFoldChunksCarried = 2;
constexpr std::int64_t kMaxParts = 8;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

SegmentPlan plan_segments(std::int64_t heads, std::int64_t longest, bool carried, bool training,
                          int multiprocessors) {
  const std::int64_t sms = std::max(1, multiprocessors);
  const auto waves = [&](std::int64_t per_head) {
    return ceil_div(std::max<std::int64_t>(per_head, 0) * heads, sms);
  };
  const std::int64_t fold_chunks = carried ? kFoldChunksCarried : kFoldChunks;
  const auto cost = [&](std::int64_t count, std::int64_t parts) {
    const std::int64_t seg = std::max(kMinSegment, ceil_div(longest, count));
    const std::int64_t part = ceil_div(seg, parts);
    const std::int64_t offsets = carried ? count : count - 1;
    const std::int64_t transfers = carried ? count : std::max<std::int64_t>(count - 2, 0);
    const std::int64_t summary = std::max(
        waves(offsets) * seg, ceil_div(heads * (offsets + transfers) * seg, sms * part) * part);
    std::int64_t passes = summary + waves(count) * seg;
    if (training && !carried) passes += waves(count - 1) * seg + waves(count) * seg;
    const std::int64_t fold_steps =
        count == 1 && !carried ? 0 : count + transfers * (ceil_div(seg, part) - 1);
    return passes + waves(kFoldSlices) * fold_chunks * fold_steps;
  };
  std::int64_t best_count = 1, best_parts = 1;
  const std::int64_t most = 4 * std::max<std::int64_t>(sms / std::max<std::int64_t>(heads, 1), 1);
  for (std::int64_t count = 1; count <= most; ++count)
    for (std::int64_t parts = 1; parts <= kMaxParts; parts *= 2)
      if (cost(count, parts) < cost(best_count, best_parts)) best_count = count, best_parts = parts;
  SegmentPlan plan;
  const std::int64_t seg = std::max(kMinSegment, ceil_div(longest, best_count));
  plan.length = static_cast<int>(seg);
  plan.count = static_cast<int>(std::max<std::int64_t>(1, ceil_div(longest, seg)));
  plan.part_length = static_cast<int>(ceil_div(seg, best_parts));
  plan.parts = static_cast<int>(ceil_div(seg, plan.part_length));
  return plan;
}

}  // namespace gdn::cuda
