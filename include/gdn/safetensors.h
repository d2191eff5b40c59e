#pragma once
// safetensors files (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data buffer that the offsets index.

#include <map>
#include <string>

#include "gdn/tensor.h"

namespace gdn {

using TensorMap = std::map<std::string, HostTensor>;

// Reads every tensor of dtype F64, F32, F16, BF16, I64 or I32; ignores __metadata__. Throws
// gdn::Error naming the file (and the tensor) for anything the format does not allow.
TensorMap read_safetensors(const std::string& path);

// Writes the tensors contiguously in name order after a header padded with spaces to a multiple
// of 8 bytes, so every tensor's data is 8-byte aligned in the file.
void write_safetensors(const std::string& path, const TensorMap& tensors);

}  // namespace gdn
