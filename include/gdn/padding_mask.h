#pragma once
// The layer's 2-D padding mask (spec 5-6): x [B, T, D] <- x * mask[B, T] (1 keeps a token, 0 drops
// it; under context parallelism each rank passes its shard of both), where a dropped token
// becomes 0 even if it held NaN or inf (transformers' product keeps those). Any other mask shape
// is rejected with gdn::Error. The backward is the same applied to the gradient.

#include "gdn/tensor.h"

namespace gdn {

void apply_padding_mask(const TensorRef& x, const TensorRef& mask);

}  // namespace gdn
