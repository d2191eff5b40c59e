#include "gdn/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gdn/error.h"

namespace gdn {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i64:
      return 8;
    case DType::i32:
      return 4;
  }
  throw Error("dtype_size: unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i64:
      return "i64";
    case DType::i32:
      return "i32";
  }
  throw Error("dtype_name: unknown dtype");
}

std::int64_t TensorRef::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string TensorRef::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

HostTensor HostTensor::zeros(DType dtype, std::vector<std::int64_t> shape) {
  HostTensor t{dtype, std::move(shape), {}};
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
  return t;
}

std::int64_t HostTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

TensorRef HostTensor::ref() const {
  return {const_cast<std::byte*>(bytes.data()), dtype, shape};
}

}  // namespace gdn
