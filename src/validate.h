#pragma once
// Checks of the op's arguments, shared by every backend, and the list of sequences they describe.

#include <cstdint>
#include <vector>

#include "gdn/delta_rule.h"

namespace gdn {

// One independent sequence: tokens [begin, begin + length) of batch row `batch`.
struct Sequence {
  std::int64_t batch, begin, length;
};

std::vector<Sequence> sequences(const DeltaRuleInputs& in, const DeltaRuleShape& shape);
void validate_outputs(const DeltaRuleShape& shape, const DeltaRuleOutputs& out);
void validate_grads(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                    const DeltaRuleGrads& grads);

}  // namespace gdn
