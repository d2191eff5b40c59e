#pragma once
// The layer's causal depthwise conv1d with SiLU (spec 6, step 2), over x [B, T, D]:
//   y[b, t, d] = silu( sum_j w[d, j] x[b, t - (W - 1) + j, d] ),
// where rows before the start come from `halo` (the previous rank's last W - 1 rows under
// context parallelism) or are zero. Computed in float64.

#include "gdn/communicator.h"
#include "gdn/tensor.h"

namespace gdn {

struct Conv1dArgs {
  TensorRef x;       // [B, T, D]
  TensorRef weight;  // [D, 1, W]  transformers' conv1d.weight (depthwise, no bias)
  TensorRef halo;    // [B, W - 1, D]  the rows before x; optional: zeros
};

void conv1d_forward(const Conv1dArgs& args, const TensorRef& y);
// From dy [B, T, D]: dx [B, T, D], dweight [D, 1, W] and, when given, dhalo [B, W - 1, D].
void conv1d_backward(const Conv1dArgs& args, const TensorRef& dy, const TensorRef& dx,
                     const TensorRef& dweight, const TensorRef& dhalo);

// Context parallel (args.halo unused): each rank holds a shard of T (at least W - 1 rows); the
// halo comes from the previous rank (zeros on rank 0), and backward returns its gradient there.
// dweight is this rank's share: the whole gradient is the sum over ranks.
void cp_conv1d_forward(Communicator& comm, const Conv1dArgs& shard, const TensorRef& y);
void cp_conv1d_backward(Communicator& comm, const Conv1dArgs& shard, const TensorRef& dy,
                        const TensorRef& dx, const TensorRef& dweight);

}  // namespace gdn
