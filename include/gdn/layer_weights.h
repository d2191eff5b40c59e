#pragma once
// The layer's config and parameters from a transformers checkpoint (spec 6).
//
// config.json: the LayerConfig keys at the top level or under "text_config" (Qwen3.5's
// multimodal configs); rms_norm_eps defaults to 1e-6 and hidden_act to "silu" as in transformers.
// Parameters: by transformers' names after an optional key prefix, e.g.
// "model.layers.0.linear_attn." (a real checkpoint) or "" (a bare layer). Qwen3-Next's fused,
// per-key-head interleaved in_proj_qkvz [2 HK K + 2 HV V, D] and in_proj_ba [2 HV, D] are split
// on load into Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and in_proj_a.

#include <string>

#include "gdn/layer.h"
#include "gdn/safetensors.h"

namespace gdn {

// `path`: a config.json, or a directory holding one.
LayerConfig load_layer_config(const std::string& path);
// `source` names the text in errors.
LayerConfig parse_layer_config(const std::string& json_text, const std::string& source);

// `path`: a .safetensors file, a sharded checkpoint's model.safetensors.index.json (its
// "weight_map" names each tensor's file, beside the index), or a directory holding either.
// Tensors of any floating dtype are converted to `dtype`. Throws gdn::Error naming the tensor
// (with the prefix) and the expected and found shapes for anything missing or mis-shaped.
LayerWeights load_layer_weights(const std::string& path, const LayerConfig& config,
                                const std::string& prefix = "", DType dtype = DType::f32);
// The same from tensors in memory; `source` names them in errors.
LayerWeights layer_weights_from(const TensorMap& tensors, const LayerConfig& config,
                                const std::string& prefix, DType dtype, const std::string& source);

}  // namespace gdn
