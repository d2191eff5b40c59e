#pragma once
// The float32 chunked gated delta rule (spec 3), forward and backward, OpenMP over
// (sequence, value head).

#include "gdn/delta_rule.h"

namespace gdn::cpu {

void chunked_forward(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                     const DeltaRuleOutputs& out);
void chunked_backward(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                      const DeltaRuleGrads& grads);

}  // namespace gdn::cpu
