// The segment plan's cost model: the time of the passes that follow one another (the forward's
// summary and its output or save pass; for training also the backward's summary, P - 1 offsets a
// value head, and gradient pass), each as long as its busiest multiprocessor's chunk steps times
// the pass's step time, plus the folds, whose serial chains take a step a segment or transfer
// part in each wave of fold blocks. The step times are ncu's pass times over the chunks a block
// runs (T = 65536, 32 value heads, bench/RESULTS.md sixteenth session); a fold step, 1.5 us at 2
// heads (one wave of fold blocks) and 3.5 us at 32 (four waves), is taken as 0.6 + 0.9 us a wave.
// At 2 heads the model keeps the 64 segments of the training sweep (32, 48, 64, 96 segments: 0.914,
// 0.893, 0.879, 1.068 ms).
//
// The forward's summary runs, per value head, the offsets N_k of P - 1 segments (all P under
// context parallelism) and the transfers M_k of the P - 2 middle ones (all P): 2P - 3 blocks of
// a segment each, two waves at P = 4 with 32 heads on 132 SMs. Cutting the transfers into parts
// lets them fill what the offsets leave: the pass takes the longer of a wave of offsets and the
// whole work spread over every multiprocessor, rounded up to a part. The parts cost fold steps,
// so they pay where segments are long and the folds' waves few (T = 64k at 32 heads: 4 segments,
// transfers in 4 parts; at 2 heads the summary already spreads evenly and parts only cost).
// Under context parallelism the transfers stay whole: the model picks parts there only on other
// multiprocessor counts than the H200's (64 heads on 114 SMs), where the rank maps' folds with
// parts have not run.
#include "cuda/segments.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace gdn::cuda {
namespace {

constexpr std::int64_t kMinSegment = 4;  // chunks
// Microseconds a chunk step, in tenths: the forward summary, output and save passes, the
// backward summary and state_backward; a fold step, and its part in each wave of fold blocks.
constexpr std::int64_t kSummaryStep = 19, kOutputStep = 33, kSaveStep = 46;
constexpr std::int64_t kGradSummaryStep = 26, kGradStep = 37, kFoldStep = 6, kFoldWave = 9;
// The fold's step is counted as it was for blocks of 8 columns (16 a value head), though with
// many heads a block now takes 32 (fold_tiles): counted at its own cost (1.7 us a step, one
// wave), the model would cut T = 4096 at 32 heads into 4 segments in 2 parts for inference,
// measured no faster than 3 (0.181-0.186 against 0.183-0.187 ms; bench/RESULTS.md,
// twenty-seventh session) and with more workspace.
constexpr int kFoldBlocks = 16;
// Chains beside grad_chunk (chains_beside), in tenths of a microsecond: a step of state_backward's
// chain with grad_chunk running beside it, and grad_chunk's work a chunk and value head, of one
// SM's time (an H100, fiftieth session: state_backward alone 832 us for 256 steps, 3.25 us a
// step, beside grad_chunk about 3.6; grad_chunk 717 us for 256 chunks of 32 value heads on 132
// SMs). With the block that waits for the chain's last step the model keeps the segments for
// T = 1024 at 16 value heads (beside took it 0.137 -> 0.151 ms) and T = 4096 at 24 (0.456 ->
// 0.435: a small win it gives up).
constexpr std::int64_t kBesideStep = 36, kGradChunkStep = 116;
// A block's start and end (its state loaded and stored, its copies' prologue), per round of
// blocks on a multiprocessor: fitted so that short segments do not pay for their extra blocks
// (T = 4096 at 32 heads keeps 3 segments, T = 65536 at 2 heads 34 for inference).
constexpr std::int64_t kBlockStart = 40;
constexpr std::int64_t kMaxParts = 8;
// Bytes of a chunk's h, Vn, dh and dVn (bf16 128 x 128 and 64 x 128 each), and of a state or
// state gradient carried between rounds (f32 128 x 128), a value head; a round's h, Vn, dh and
// dVn at most. Each round costs 50-70 us (its launches start with every block in step, and
// grad_chunk's last wave runs part empty; bench/RESULTS.md, seventeenth session), plus, where
// the forward kept only the states entering the rounds, a recompute pass over the round's chunks.
// At most kMaxRounds: with the offsets on the device only, every segment may be as long as the
// longest possible, so many sequences asked for rounds of a few chunks each (64 sequences at
// T = 65536 with 32 value heads: 128 rounds of 8), nearly all of them empty launches.
constexpr std::int64_t kSlotBytes = 96 << 10, kCarryBytes = 64 << 10;
constexpr std::int64_t kRoundBytes = std::int64_t{768} << 20;
constexpr std::int64_t kMaxRounds = 8;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

SegmentPlan search(std::int64_t heads, std::int64_t longest, bool carried, bool training,
                   std::int64_t sms) {
  const auto length = [&](std::int64_t count) {
    return std::max(kMinSegment, ceil_div(longest, count));
  };
  const auto waves = [&](std::int64_t per_head) {
    return ceil_div(std::max<std::int64_t>(per_head, 0) * heads, sms);
  };
  const auto transfers = [&](std::int64_t count) {
    return carried ? count : std::max<std::int64_t>(count - 2, 0);
  };
  // Folds run: the states' (inference), and the gradients' (training), and under context
  // parallelism the rank map's two.
  const std::int64_t folds = carried ? 3 : training ? 2 : 1;
  const auto cost = [&](std::int64_t count, std::int64_t parts) {
    const std::int64_t seg = length(count);
    const std::int64_t part = ceil_div(seg, parts);
    const std::int64_t offsets = carried ? count : count - 1;
    const std::int64_t summary =
        std::max(waves(offsets) * seg,
                 ceil_div(heads * (offsets + transfers(count)) * seg, sms * part) * part);
    std::int64_t time =
        kSummaryStep * summary + (training ? kSaveStep : kOutputStep) * waves(count) * seg;
    std::int64_t rounds = waves(offsets + transfers(count) * parts) + waves(count);
    if (training && !carried) {
      time += (kGradSummaryStep * waves(count - 1) + kGradStep * waves(count)) * seg;
      rounds += waves(count - 1) + waves(count);
    }
    time += kBlockStart * rounds;
    const std::int64_t fold_steps =
        count == 1 && !carried ? 0 : count + transfers(count) * (parts - 1);
    return time + folds * (kFoldStep + kFoldWave * waves(kFoldBlocks)) * fold_steps;
  };
  std::int64_t best_count = 1, best_parts = 1, best = cost(1, 1);
  const std::int64_t most = 4 * std::max<std::int64_t>(sms / heads, 1);
  for (std::int64_t count = 1; count <= most; ++count)
    for (std::int64_t parts = 1; parts <= (!carried && count > 2 ? kMaxParts : 1); parts *= 2)
      if (const std::int64_t c = cost(count, parts); c < best)
        best = c, best_count = count, best_parts = parts;
  SegmentPlan plan;
  const std::int64_t seg = length(best_count);
  plan.length = static_cast<int>(seg);
  plan.count = static_cast<int>(std::max<std::int64_t>(1, ceil_div(longest, seg)));
  plan.parts = static_cast<int>(best_parts);
  plan.part_length = static_cast<int>(ceil_div(seg, best_parts));
  return plan;
}

}  // namespace

// The search takes tens of microseconds at a few heads (hundreds of counts): a call's host time,
// so plans are kept per shape.
SegmentPlan plan_segments(std::int64_t heads, std::int64_t longest, bool carried, bool training,
                          int multiprocessors) {
  using Key = std::tuple<std::int64_t, std::int64_t, bool, bool, int>;
  static std::mutex mutex;
  static std::map<Key, SegmentPlan> plans;
  const Key key{heads, longest, carried, training, multiprocessors};
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = plans.find(key); it != plans.end()) return it->second;
  if (plans.size() >= 4096) plans.clear();
  return plans[key] = search(std::max<std::int64_t>(heads, 1), longest, carried, training,
                             std::max(1, multiprocessors));
}

bool chains_beside(std::int64_t sequences, std::int64_t value_heads, std::int64_t chunks,
                   const SegmentPlan& plan, int multiprocessors) {
  const std::int64_t heads = value_heads, sms = multiprocessors;
  const std::int64_t count = plan.count, seg = plan.length, segments = sequences * count;
  const RoundPlan rounds = plan_rounds(segments, seg, chunks, heads);
  // Several sequences only in rounds, a segment a round; in rounds a segment's chunks must fit a
  // round's places.
  if (heads >= sms || (sequences > 1 && rounds.count == 1) ||
      (rounds.count > 1 && (rounds.by_slots || rounds.slots < seg)))
    return false;
  const auto waves = [&](std::int64_t blocks) { return ceil_div(blocks, sms); };
  const auto grad = [&](std::int64_t steps) { return kGradChunkStep * steps * heads; };  // SM time
  // The segments' way: state_backward over every segment, a round at a time, then grad_chunk;
  // with several segments a sequence the gradient offsets and their fold first.
  std::int64_t apart =
      rounds.count * (kGradStep * rounds.length + kBlockStart) * waves(segments * heads) +
      ceil_div(grad(chunks), sms);
  if (count > 1)
    apart += (kGradSummaryStep * seg + kBlockStart) * waves((segments - sequences) * heads) +
             (kFoldStep + kFoldWave * waves(kFoldBlocks * sequences * heads)) *
                 (count + std::max<std::int64_t>(count - 2, 0) * (plan.parts - 1));
  // Beside, the first chunk's gradients wait for the whole chain: one grad_chunk block (a key
  // head of two value heads) after its last step. In rounds, a round a segment, each recomputed
  // in rounds.count slices, against the segments' way's recompute a round (but the last where
  // the gradient offsets run: beside them).
  const std::int64_t steps = rounds.count > 1 ? seg : chunks;
  std::int64_t beside =
      std::max(kBesideStep * steps + 2 * kGradChunkStep, ceil_div(grad(steps), sms - heads)) +
      kBlockStart;
  if (rounds.count > 1) {
    beside = segments * (beside + kSaveStep * rounds.length * waves(rounds.count * heads));
    apart +=
        (rounds.count - (count > 1 ? 1 : 0)) * kSaveStep * rounds.length * waves(segments * heads);
  }
  return beside < apart;
}

int fold_tiles(std::int64_t chains, int multiprocessors) {
  for (int tiles = 4; tiles > 1; tiles /= 2)
    if (4 * chains * (kFoldBlocks / tiles) >= 3 * std::int64_t{multiprocessors}) return tiles;
  return 1;
}

int segment_group(std::int64_t segments, std::int64_t value_heads, int multiprocessors) {
  constexpr std::int64_t kWaves = 8;
  return static_cast<int>(
      std::max<std::int64_t>(1, segments * value_heads / (kWaves * std::max(1, multiprocessors))));
}

RoundPlan plan_rounds(std::int64_t segments, std::int64_t segment_length, std::int64_t chunk_slots,
                      std::int64_t value_heads) {
  const RoundPlan whole{1, static_cast<int>(segment_length), chunk_slots};
  // A plan's bytes: a round's chunks, and a state and a state gradient at each boundary.
  const auto bytes = [&](const RoundPlan& r) {
    return (r.slots * kSlotBytes + 2 * r.boundaries(segments) * kCarryBytes) * value_heads;
  };
  const auto cuts = [&](const RoundPlan& r) { return r.count > 1 && bytes(r) < bytes(whole); };
  // By segment: the longest round within the bytes, then as many rounds of equal length as that
  // takes (at most kMaxRounds, longer than the bytes allow if need be).
  const std::int64_t longest =
      std::max<std::int64_t>(1, kRoundBytes / (segments * value_heads * kSlotBytes));
  RoundPlan by_segment;
  by_segment.count = static_cast<int>(std::min(kMaxRounds, ceil_div(segment_length, longest)));
  by_segment.length = static_cast<int>(ceil_div(segment_length, by_segment.count));
  by_segment.slots = std::min(chunk_slots, segments * by_segment.length);
  if (cuts(by_segment)) return by_segment;
  // By slots: as many slots as the bytes allow, in at most kMaxRounds rounds.
  RoundPlan by_slots;
  by_slots.by_slots = true;
  by_slots.slots = std::max(ceil_div(chunk_slots, kMaxRounds),
                            std::max<std::int64_t>(1, kRoundBytes / (value_heads * kSlotBytes)));
  by_slots.count = static_cast<int>(ceil_div(chunk_slots, by_slots.slots));
  by_slots.length = static_cast<int>(by_slots.slots);
  return cuts(by_slots) ? by_slots : whole;
}

}  // namespace gdn::cuda
