#pragma once
// DType and TensorRef: how tensors cross the library's boundary (a DLPack-like view, no ownership).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gdn {

enum class DType { f64, f32, f16, bf16, i64, i32 };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f64", "f32", "f16", "bf16", "i64", "i32"

// A dense, contiguous, row-major tensor owned by the caller. data == nullptr means "not given".
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;

  bool given() const { return data != nullptr; }
  std::int64_t numel() const;
  std::string shape_string() const;  // "[2, 64, 4, 128]"
};

// A host tensor that owns its bytes (files, tests, the tool); ref() views it.
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  static HostTensor zeros(DType dtype, std::vector<std::int64_t> shape);
  std::int64_t numel() const;
  TensorRef ref() const;  // a view (writable: TensorRef carries no constness)
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

// The same values in another floating dtype (rounded to nearest even).
HostTensor convert(const HostTensor& t, DType dtype);

// Tokens [first, first + count) of a [B, T, ...] tensor (axis 1), and the inverse: `part` written
// into `whole` from token `at` on. Context parallelism shards tensors this way.
HostTensor slice_tokens(const HostTensor& t, std::int64_t first, std::int64_t count);
void place_tokens(const HostTensor& part, HostTensor& whole, std::int64_t at);

}  // namespace gdn
