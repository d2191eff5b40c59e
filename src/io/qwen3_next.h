#pragma once
// Qwen3-Next's fused input projections -> Qwen3.5's separate ones (spec 6; transformers'
// Qwen3NextGatedDeltaNet.fix_query_key_value_ordering). With r = HV / HK value heads per key head,
// the rows of each fused weight come in HK groups, one per key head i:
//   in_proj_qkvz [HK (2K + 2rV), D]: q_i (K rows) | k_i (K) | v_i (r V) | z_i (r V)
//   in_proj_ba   [HK (2r), D]:       b_i (r rows) | a_i (r)
// and Qwen3.5 stacks them head-major: in_proj_qkv = [q_0..q_HK-1 | k_0.. | v_0..],
// in_proj_z = [z_0..], in_proj_b = [b_0..], in_proj_a = [a_0..].

#include "gdn/layer.h"

namespace gdn::io {

// Fills weights.in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (in `dtype`) from the fused tensors,
// whose shapes the caller has checked.
void split_qwen3_next(const LayerConfig& config, const HostTensor& in_proj_qkvz,
                      const HostTensor& in_proj_ba, DType dtype, LayerWeights& weights);

}  // namespace gdn::io
