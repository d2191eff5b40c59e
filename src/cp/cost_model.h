#pragma once
// The `automatic` strategy: the one with the shortest predicted forward critical path (spec 5),
// from constants measured on the CPU (bench/bench_cp) and on the H200 (bench/bench_cuda_cp),
// recorded in bench/RESULTS.md ("CP cost model").
//
// CPU, t the local forward of T/P tokens, s the summary's cost relative to it:
//   relay              P t
//   summary-chain      (1 + s) t + (P - 1) (a + S / b)
//   summary-allgather  (1 + s) t + a + (P - 1) (S + M) / b + (P - 1) c
//   scan               (1 + s) t + (ceil(log2 P) + 1) a + ceil(log2 P) ((S + M) / b + c) + S / b
//   ulysses            t + 2 (a + X / b)       (only when HK and HV are divisible by P)
//
// GPU, a rank's work cut where the entering state arrives (cuda/stages.h): `before` (chunk prep,
// summaries, the map) runs on every rank at once, `after` (the output passes) once the state is
// there; h = a + S / b is one hop of the carried state, y one map application:
//   relay              before + P after + (P - 1) h
//   summary-chain      before + (P - 1) (h + y) + after
//   summary-allgather  before + a + (P - 1) ((S + M) / b + y) + after
//   scan               before + ceil(log2 P) (a + (S + M) / b + c) + h + after
//   ulysses            the single-GPU op on T/P tokens' worth + 2 (a + X / b_all_to_all)
// and the same again for the backward (its own before and after) in a training step.
//
// a: one message's latency, b: bandwidth, S and M: the bytes of the carried states and of their
// K x K matrices, c: one composition, X: the bytes a rank's shard sends in one all-to-all.

#include "cp/shard.h"
#include "gdn/context_parallel.h"

namespace gdn::cp {

// CPU, forward.
double predicted_seconds(Strategy strategy, const ShardPlan& plan);
// GPU (H200, NVLink): the forward (inference), or forward + backward (training: the forward
// keeps its states for the backward).
double predicted_gpu_seconds(Strategy strategy, const ShardPlan& plan, bool training);
// The single-GPU op on all P shards' tokens.
double single_gpu_seconds(const ShardPlan& plan, bool training);

// By the forward's prediction on the host's or the device's constants.
Strategy choose_strategy(const ShardPlan& plan, Memory memory = Memory::host);

}  // namespace gdn::cp
