#include "gdn/tensor.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/convert.h"
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

// Bytes of memory of this machine (0 when unknown): no host allocation beyond it can succeed.
static std::uint64_t physical_memory() {
  static const std::uint64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0
               ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
               : std::uint64_t{0};
  }();
  return bytes;
}

HostTensor HostTensor::zeros(DType dtype, std::vector<std::int64_t> shape) {
  HostTensor t{dtype, std::move(shape), {}};
  const auto fail = [&](const std::string& why) {
    return Error(fmt::format("cannot allocate a tensor of {} {}: {}", dtype_name(dtype),
                             t.ref().shape_string(), why));
  };
  std::uint64_t bytes = dtype_size(dtype);
  for (std::int64_t d : t.shape) {
    if (d < 0) throw fail("a dimension is negative");
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes))
      throw fail("its size in bytes overflows 64 bits");
  }
  const std::uint64_t memory = physical_memory();
  if (memory != 0 && bytes > memory)
    throw fail(fmt::format("{} bytes, more than this machine's memory ({} bytes)", bytes, memory));
  try {
    t.bytes.resize(bytes);
  } catch (const std::bad_alloc&) {
    throw fail(fmt::format("out of memory for {} bytes", bytes));
  }
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

HostTensor convert(const HostTensor& t, DType dtype) {
  HostTensor out = HostTensor::zeros(dtype, t.shape);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    core::store(out.ref(), i, core::load<double>(t.ref(), i));
  return out;
}

// Copies tokens [first, first + count) of `from` to token `at` of `to`, for every batch row.
static void copy_tokens(const HostTensor& from, std::int64_t first, std::int64_t count,
                        HostTensor& to, std::int64_t at) {
  const std::size_t row =
      from.bytes.size() / static_cast<std::size_t>(from.shape[0] * from.shape[1]);
  for (std::int64_t b = 0; b < from.shape[0]; ++b)
    std::copy_n(from.bytes.begin() + static_cast<std::ptrdiff_t>((b * from.shape[1] + first) * row),
                static_cast<std::size_t>(count) * row,
                to.bytes.begin() + static_cast<std::ptrdiff_t>((b * to.shape[1] + at) * row));
}

// A [B, T, ...] tensor whose bytes match its shape, B and T positive.
static void require_tokens(const char* what, const HostTensor& t) {
  const TensorRef r = t.ref();
  if (t.shape.size() < 2)
    throw Error(
        fmt::format("{}: expected a tensor of shape [B, T, ...] (rank >= 2), got rank {} {}", what,
                    t.shape.size(), r.shape_string()));
  if (t.shape[0] < 1 || t.shape[1] < 1)
    throw Error(fmt::format("{}: expected positive B and T in [B, T, ...], got {}", what,
                            r.shape_string()));
  if (t.bytes.size() != static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype))
    throw Error(fmt::format(
        "{}: {} {} needs {} bytes, holds {}", what, dtype_name(t.dtype), r.shape_string(),
        static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype), t.bytes.size()));
}

HostTensor slice_tokens(const HostTensor& t, std::int64_t first, std::int64_t count) {
  if (t.bytes.empty()) return {};
  require_tokens("slice_tokens", t);
  if (first < 0 || count < 0 || first > t.shape[1] - count)
    throw Error(fmt::format("slice_tokens: tokens [{}, {} + {}) are not within T = {} of {}", first,
                            first, count, t.shape[1], t.ref().shape_string()));
  std::vector<std::int64_t> shape = t.shape;
  shape[1] = count;
  HostTensor out = HostTensor::zeros(t.dtype, shape);
  copy_tokens(t, first, count, out, 0);
  return out;
}

void place_tokens(const HostTensor& part, HostTensor& whole, std::int64_t at) {
  require_tokens("place_tokens: part", part);
  require_tokens("place_tokens: whole", whole);
  std::vector<std::int64_t> expected = whole.shape;
  expected[1] = part.shape[1];
  if (part.dtype != whole.dtype || part.shape != expected || at < 0 ||
      at > whole.shape[1] - part.shape[1])
    throw Error(fmt::format("place_tokens: part {} {} does not fit whole {} {} at token {}",
                            dtype_name(part.dtype), part.ref().shape_string(),
                            dtype_name(whole.dtype), whole.ref().shape_string(), at));
  copy_tokens(part, 0, part.shape[1], whole, at);
}

}  // namespace gdn
