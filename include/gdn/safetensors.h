#pragma once
// safetensors files (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data buffer that the offsets index.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gdn/tensor.h"

namespace gdn {

using TensorMap = std::map<std::string, HostTensor>;

// Where one tensor lies in a file: bytes [begin, end) of the data buffer after the header.
struct SafetensorsEntry {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;
};

// A file opened lazily: the header is read and checked whole, as strictly as the format's
// reference implementation (names unique, dtypes F64, F32, F16, BF16, I64 or I32, data_offsets
// contiguous from 0 and covering the data buffer exactly, every size within the file); a
// tensor's bytes are read only when asked for. Throws gdn::Error naming the file (and the
// tensor) for anything the format does not allow.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.contains(name); }
  // The tensor's bytes; gdn::Error when it is absent or its bytes cannot be allocated or read.
  HostTensor read(const std::string& name) const;

 private:
  std::string path_;
  std::int64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

// Every tensor of the file (SafetensorsFile's checks); ignores __metadata__.
TensorMap read_safetensors(const std::string& path);

// Writes the tensors contiguously in name order after a header padded with spaces to a multiple
// of 8 bytes, so every tensor's data is 8-byte aligned in the file.
void write_safetensors(const std::string& path, const TensorMap& tensors);

}  // namespace gdn
