#pragma once
// The `automatic` strategy: the one with the shortest predicted forward critical path (spec 5),
// from constants measured on the CPU and recorded in bench/RESULTS.md ("CP cost model").
//
//   relay              P t
//   summary-chain      (1 + s) t + (P - 1) (a + S / b)
//   summary-allgather  (1 + s) t + a + (P - 1) (S + M) / b + (P - 1) c
//   scan               (1 + s) t + (ceil(log2 P) + 1) a + ceil(log2 P) ((S + M) / b + c) + S / b
//   ulysses            t + 2 (a + X / b)       (only when HK and HV are divisible by P)
//
// t: the local forward of T/P tokens, s: the summary's cost relative to it, a: one message's
// latency, b: bandwidth, S and M: the bytes of the carried states and of their K x K matrices,
// c: one composition, X: the bytes a rank's shard sends in one all-to-all.

#include "cp/shard.h"
#include "gdn/context_parallel.h"

namespace gdn::cp {

double predicted_seconds(Strategy strategy, const ShardPlan& plan);
Strategy choose_strategy(const ShardPlan& plan);

}  // namespace gdn::cp
