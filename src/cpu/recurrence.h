#pragma once
// The float64 token-by-token gated delta rule (spec 1) and its hand-derived backward: the oracle.

#include "gdn/delta_rule.h"

namespace gdn::cpu {

void recurrent_forward(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                       const DeltaRuleOutputs& out);
void recurrent_backward(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                        const DeltaRuleGrads& grads);

}  // namespace gdn::cpu
