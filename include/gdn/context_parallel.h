#pragma once
// The gated delta rule over P ranks, each holding a contiguous shard of the sequence (spec 4-5).
//
// Every rank calls cp_forward / cp_backward with its shard: q, k, v, g, beta of tokens
// [r T/P, (r+1) T/P) (the global T must be divisible by P), and the same global tensors
// cu_seqlens [N + 1], initial_state [N, HV, K, V] and d_final_state as a single rank would get.
// Outputs o and the input gradients are the shard's. State rows belong to the rank where their
// sequence starts (dh0) or ends (final_state); the other ranks leave those rows zero, so summing
// over ranks gives the whole. Without cu_seqlens that is rank 0 (dh0) and the last rank
// (final_state). Every strategy gives the single-rank result.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "gdn/communicator.h"
#include "gdn/delta_rule.h"

namespace gdn {

enum class Strategy {
  relay,              // the true state hops rank to rank; no extra FLOPs, serial
  summary_chain,      // each rank's affine summary (M, N); the state hops through M s + N
  summary_allgather,  // one all-gather of every (M, N); each rank composes its prefix
  scan,               // log2 P rounds of recursive doubling over (M, N)
  ulysses,            // all-to-all to head shards and back (HK, HV divisible by P)
  automatic,          // picked by the cost model of cp/cost_model.h (bench/RESULTS.md)
};

std::string_view strategy_name(Strategy strategy);  // "relay", "summary-chain", ...
Strategy parse_strategy(std::string_view name);     // throws gdn::Error listing the names
std::vector<Strategy> all_strategies();             // every concrete strategy (not automatic)

struct CpOptions {
  Strategy strategy = Strategy::automatic;
  bool recompute_summary = false;  // backward rebuilds M instead of keeping it from forward
  // Training: a backward follows the forward. CUDA keeps the per-chunk states for it, and
  // `automatic` picks the strategy by forward + backward time instead of the forward's.
  bool save_for_backward = false;
};

namespace cp {
class Backend;
struct AffineMaps;
struct ShardPlan;
}  // namespace cp

// One rank's side of the op. forward keeps what backward needs (the entering states, M), so call
// backward on the same shard after forward; a later forward replaces it.
class CpDeltaRule {
 public:
  // On the CPU, with host tensors and a host communicator.
  CpDeltaRule(Communicator& comm, CpOptions options = {});
  // On another backend (gdn/cuda.h: cuda_cp_delta_rule), whose memory the communicator's is.
  CpDeltaRule(Communicator& comm, std::unique_ptr<cp::Backend> backend, CpOptions options = {});
  ~CpDeltaRule();

  void forward(const DeltaRuleInputs& shard, const DeltaRuleOutputs& out);
  void backward(const DeltaRuleInputs& shard, const DeltaRuleGrads& grads);
  Strategy strategy() const;  // the one used (automatic resolved at forward)

  struct Saved;

 private:
  cp::AffineMaps new_maps(const cp::ShardPlan& plan);

  Communicator& comm_;
  std::unique_ptr<cp::Backend> backend_;
  CpOptions options_;
  std::int64_t checked_T_ = -1;  // the shard length checked equal on every rank
  std::unique_ptr<Saved> saved_;
};

}  // namespace gdn
