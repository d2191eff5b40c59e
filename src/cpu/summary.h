#pragma once
// Affine summaries of one sequence of a problem (spec 4), float32, chunk by chunk, per value head.
// Context parallelism composes them across ranks.

#include "gdn/delta_rule.h"

namespace gdn::cpu {

// The sequence's final state is M S0 + N for an initial state S0. With M given ([HV, K, K]),
// writes M and N for the sequence's own initial state (0 without one); with M null, only N:
// its final state [HV, K, V]. Runs the state recurrence alone on the augmented state [I | S0].
void chunked_summary(const DeltaRuleInputs& in, const DeltaRuleShape& s, std::int64_t sequence,
                     float* M, float* N);

// G: the gradient of the sequence's initial state that its own outputs produce, given dO and the
// final state's gradient dS_T ([HV, K, V], null for zero). The reverse state-gradient pass alone.
void chunked_initial_state_grad(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                                std::int64_t sequence, const TensorRef& d_o, const float* dS_T,
                                float* G);

}  // namespace gdn::cpu
