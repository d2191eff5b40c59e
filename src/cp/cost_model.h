#pragma once
// The `automatic` strategy: the one with the shortest predicted critical path (spec 5), from
// constants measured on the CPU (bench/bench_cp) and on the H200 (bench/bench_cuda_cp), recorded
// in bench/RESULTS.md ("CP cost model").
//
// CPU, the forward or a training step (the strategy the forward picks is the one its backward
// runs): t and t_b the local forward and backward of T/P tokens on the rank's threads; s' the
// summary a rank computes before the state can pass it, relative to t: the first rank's N alone
// (s_N) when P = 2, a middle rank's M and N (s) beyond; g the G pass relative to t_b;
// h = a + S / b one hop; k = max(1, R threads / cores) the crowding of a host whose R ranks ask
// for more threads than it has cores (passes every rank runs at once stretch by k; the relay's
// run one rank at a time):
//   relay              P t                                         + P t_b
//   summary-chain      k (1 + s') t + (P - 1) h                    + k (1 + g) t_b + (P - 1) h
//   summary-allgather  k (1 + s') t + a + (P - 1) ((S + M) / b + c)  + the same with (1 + g) t_b
//   scan               k (1 + s') t + (ceil(log2 P) + 1) a + ceil(log2 P) ((S + M) / b + c) + S / b
//                      + the same with (1 + g) t_b
//   ulysses            k (t + u X_f) + 2 a                         + k (t_b + u X_b) + 2 a
// Ulysses re-lays out the rank's shard through fresh buffers on one thread, u seconds per byte:
// X_f = q, k, v, g, beta and o; X_b = those inputs again, dO, and their five gradients (only
// when HK and HV are divisible by P). A summary costs twice the forward on the CPU and the G pass
// under half the backward, so a forward alone on a crowded host favors the relay, where a
// training step loses 20-30% with it: auto picks by what the call runs
// (CpOptions::save_for_backward).
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
// K x K matrices, c: one composition, X: the bytes a rank's shard sends in one all-to-all (GPU).

#include "cp/shard.h"
#include "gdn/context_parallel.h"

namespace gdn::cp {

// CPU: the forward, or forward + backward (training), each rank running the op on `threads`
// OpenMP threads (0: omp_get_max_threads() of the caller, the threads the op itself will use), its
// host having `cores` (0: std::thread::hardware_concurrency()) shared by plan.ranks_on_host ranks.
double predicted_seconds(Strategy strategy, const ShardPlan& plan, bool training = false,
                         int threads = 0, int cores = 0);
// GPU (H200, NVLink): the forward (inference), or forward + backward (training: the forward
// keeps its states for the backward).
double predicted_gpu_seconds(Strategy strategy, const ShardPlan& plan, bool training);
// The single-GPU op on all P shards' tokens.
double single_gpu_seconds(const ShardPlan& plan, bool training);

// The strategy with the shortest prediction for the forward, or for a training step (`threads`
// and `cores` as for predicted_seconds; the device's model has no use for them).
Strategy choose_strategy(const ShardPlan& plan, Memory memory, bool training, int threads = 0,
                         int cores = 0);

}  // namespace gdn::cp
