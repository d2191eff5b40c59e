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
// validate() without reading cu_seqlens' values (read_cu_seqlens = false: they may be in device
// memory), only its rank, dtype and length.
DeltaRuleShape validate_shapes(const DeltaRuleInputs& in, bool read_cu_seqlens);
// The outputs' shapes, and their memory apart from the inputs' and from each other's.
void validate_outputs(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                      const DeltaRuleOutputs& out);
// The backward's inputs: d_o [B, T, HV, V], d_final_state [N, HV, K, V] (optional).
void validate_grad_inputs(const DeltaRuleShape& shape, const TensorRef& d_o,
                          const TensorRef& d_final_state);
// The gradients' shapes, and their memory apart from every input's and from each other's.
void validate_grads(const DeltaRuleInputs& in, const DeltaRuleShape& shape,
                    const DeltaRuleGrads& grads);

}  // namespace gdn
