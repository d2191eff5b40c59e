#include "gdn/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gdn/error.h"

namespace gdn {
namespace {

using nlohmann::json;

// The header length and the data are little-endian; we copy them byte for byte.
static_assert(std::endian::native == std::endian::little);

constexpr std::array<std::pair<DType, std::string_view>, 6> kFileDTypes{{{DType::f64, "F64"},
                                                                         {DType::f32, "F32"},
                                                                         {DType::f16, "F16"},
                                                                         {DType::bf16, "BF16"},
                                                                         {DType::i64, "I64"},
                                                                         {DType::i32, "I32"}}};

std::optional<DType> dtype_from_file(std::string_view name) {
  for (const auto& [dtype, file_name] : kFileDTypes)
    if (file_name == name) return dtype;
  return std::nullopt;
}

std::string_view file_dtype(DType dtype) {
  for (const auto& [d, file_name] : kFileDTypes)
    if (d == dtype) return file_name;
  throw Error("safetensors: unknown dtype");
}

// Bytes of a tensor of this shape, or nullopt for a negative dimension or a size beyond int64.
std::optional<std::int64_t> byte_size(const std::vector<std::int64_t>& shape, DType dtype) {
  auto bytes = static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  return bytes;
}

// A JSON integer in [0, 2^63), or nullopt. nlohmann stores non-negative literals as unsigned.
std::optional<std::int64_t> non_negative(const json& j) {
  if (j.is_number_unsigned() &&
      j.get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<std::int64_t>::max()})
    return static_cast<std::int64_t>(j.get<std::uint64_t>());
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) return j.get<std::int64_t>();
  return std::nullopt;
}

// A scalar as written, a container by its kind: dumping nested input could recurse without bound.
std::string describe(const json& j) {
  return j.is_primitive() ? j.dump() : j.type_name();
}

// The reference implementation's bound on the header (huggingface/safetensors: 100 MB).
constexpr std::uint64_t kMaxHeaderSize = 100'000'000;

// One tensor's header entry, checked against the format and the size of the data buffer.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& j,
                             std::int64_t data_size) {
  const auto fail = [&](const std::string& what) {
    return Error(fmt::format("{}: tensor \"{}\": {}", path, name, what));
  };
  if (!j.is_object()) throw fail(fmt::format("expected an object, got {}", describe(j)));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) throw fail(fmt::format("missing \"{}\"", key));

  const json& dtype = j["dtype"];
  if (!dtype.is_string())
    throw fail(fmt::format("dtype must be a string, got {}", describe(dtype)));
  const std::optional<DType> parsed = dtype_from_file(dtype.get<std::string>());
  if (!parsed)
    throw fail(fmt::format("dtype {} is not supported (expected F64, F32, F16, BF16, I64 or I32)",
                           dtype.dump()));

  const json& shape_json = j["shape"];
  if (!shape_json.is_array())
    throw fail(fmt::format("shape must be an array, got {}", describe(shape_json)));
  std::vector<std::int64_t> shape;
  for (std::size_t i = 0; i < shape_json.size(); ++i) {
    const std::optional<std::int64_t> d = non_negative(shape_json[i]);
    if (!d)
      throw fail(fmt::format("shape[{}] must be a non-negative integer, got {}", i,
                             describe(shape_json[i])));
    shape.push_back(*d);
  }
  const std::optional<std::int64_t> bytes = byte_size(shape, *parsed);
  if (!bytes)
    throw fail(
        fmt::format("shape {} is too large: its byte size overflows int64", shape_json.dump()));

  const json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    throw fail(fmt::format("data_offsets must be [begin, end], got {}", describe(offsets)));
  const std::optional<std::int64_t> begin = non_negative(offsets[0]),
                                    end = non_negative(offsets[1]);
  if (!begin || !end)
    throw fail(fmt::format("data_offsets must be non-negative integers, got [{}, {}]",
                           describe(offsets[0]), describe(offsets[1])));
  if (*end < *begin)
    throw fail(fmt::format("data_offsets [{}, {}] end before begin", *begin, *end));
  if (*end > data_size)
    throw fail(fmt::format("data_offsets [{}, {}] exceed the data buffer of {} bytes", *begin, *end,
                           data_size));
  if (*end - *begin != *bytes)
    throw fail(fmt::format("data_offsets [{}, {}] span {} bytes, but {} {} needs {}", *begin, *end,
                           *end - *begin, dtype.get<std::string>(), shape_json.dump(), *bytes));
  return {*parsed, std::move(shape), *begin, *end};
}

// The header's JSON; a key given twice in one object (the last would win) is an error, as in
// the reference.
json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  const auto unique = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw Error(fmt::format("{}: header names \"{}\" twice in one object: keys must be unique",
                              path, parsed.get<std::string>()));
    return true;
  };
  try {
    return json::parse(text, unique);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
}

// Sorted by data_offsets, the tensors must tile the data buffer [0, data_size): each begins
// where the previous ends (no gap, no overlap) and the last ends at the buffer's end.
void check_layout(const std::string& path, const std::map<std::string, SafetensorsEntry>& entries,
                  std::int64_t data_size) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (const auto& [name, e] : entries) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  std::int64_t at = 0;
  for (const auto& [name, e] : order) {
    if (e->begin != at)
      throw Error(fmt::format(
          "{}: tensor \"{}\": data_offsets [{}, {}] {} (tensors must tile the data buffer in "
          "offset order, contiguously from 0)",
          path, *name, e->begin, e->end,
          e->begin < at ? fmt::format("overlap the tensor before it, which ends at {}", at)
                        : fmt::format("leave bytes [{}, {}) before them unused", at, e->begin)));
    at = e->end;
  }
  if (at != data_size)
    throw Error(
        fmt::format("{}: bytes [{}, {}) of the {}-byte data buffer are not covered by any tensor",
                    path, at, data_size, data_size));
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const std::string& p = path_;
  std::error_code ec;
  const std::uintmax_t file_size = std::filesystem::file_size(p, ec);
  if (ec) throw Error(fmt::format("cannot read safetensors file {}: {}", p, ec.message()));
  std::ifstream file(p, std::ios::binary);
  if (!file) throw Error(fmt::format("cannot open safetensors file {}", p));
  const auto read = [&](void* dst, std::uintmax_t offset, std::uintmax_t size) {
    file.seekg(static_cast<std::streamoff>(offset));
    file.read(static_cast<char*>(dst), static_cast<std::streamsize>(size));
    if (!file)
      throw Error(fmt::format("{}: read of {} bytes at offset {} failed", p, size, offset));
  };

  if (file_size < 8)
    throw Error(
        fmt::format("{}: {} bytes is too short for the 8-byte header length", p, file_size));
  std::uint64_t header_size = 0;
  read(&header_size, 0, 8);
  if (header_size > file_size - 8)
    throw Error(fmt::format("{}: header length {} exceeds the {} bytes after it", p, header_size,
                            file_size - 8));
  if (header_size > kMaxHeaderSize)
    throw Error(fmt::format("{}: header length {} exceeds the format's limit of {} bytes", p,
                            header_size, kMaxHeaderSize));
  std::string text(header_size, '\0');
  read(text.data(), 8, header_size);
  if (!text.starts_with('{'))
    throw Error(fmt::format("{}: header must start with '{{' (a JSON object)", p));
  const json header = parse_header(p, text);
  if (!header.is_object())
    throw Error(fmt::format("{}: header must be a JSON object, got {}", p, describe(header)));

  data_start_ = static_cast<std::int64_t>(8 + header_size);
  const auto data_size = static_cast<std::int64_t>(file_size) - data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      const bool strings =
          value.is_object() &&
          std::all_of(value.begin(), value.end(), [](const json& v) { return v.is_string(); });
      if (!strings) throw Error(fmt::format("{}: __metadata__ must map strings to strings", p));
      continue;
    }
    entries_[name] = parse_entry(p, name, value, data_size);
  }
  check_layout(p, entries_, data_size);
}

HostTensor SafetensorsFile::read(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw Error(fmt::format("{}: no tensor \"{}\"", path_, name));
  const SafetensorsEntry& e = it->second;
  HostTensor t;
  try {
    t = HostTensor::zeros(e.dtype, e.shape);
  } catch (const Error& error) {
    throw Error(fmt::format("{}: tensor \"{}\": {}", path_, name, error.what()));
  }
  const std::size_t size = t.bytes.size();
  std::ifstream file(path_, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  file.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(size));
  if (!file)
    throw Error(fmt::format("{}: tensor \"{}\": read of {} bytes at offset {} failed", path_, name,
                            size, data_start_ + e.begin));
  return t;
}

TensorMap read_safetensors(const std::string& path) {
  const SafetensorsFile file(path);
  TensorMap tensors;
  for (const auto& [name, entry] : file.entries()) tensors[name] = file.read(name);
  return tensors;
}

void write_safetensors(const std::string& path, const TensorMap& tensors) {
  json header = json::object();
  std::int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw Error(fmt::format("{}: __metadata__ is reserved and cannot name a tensor", path));
    const auto fail = [&](const std::string& what) {
      return Error(fmt::format("{}: tensor \"{}\" of {} [{}]: {}", path, name, dtype_name(t.dtype),
                               fmt::join(t.shape, ", "), what));
    };
    const std::optional<std::int64_t> bytes = byte_size(t.shape, t.dtype);
    if (!bytes) throw fail("a dimension is negative or the size overflows int64");
    if (static_cast<std::size_t>(*bytes) != t.bytes.size())
      throw fail(fmt::format("holds {} bytes, its shape needs {}", t.bytes.size(), *bytes));
    header[name] = {{"dtype", file_dtype(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", json::array({offset, offset + *bytes})}};
    offset += *bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: tensor names must be valid UTF-8: {}", path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw Error(fmt::format("cannot create safetensors file {}", path));
  const std::uint64_t header_size = text.size();
  file.write(reinterpret_cast<const char*>(&header_size), 8);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors)
    file.write(reinterpret_cast<const char*>(t.bytes.data()),
               static_cast<std::streamsize>(t.bytes.size()));
  file.close();
  if (!file) throw Error(fmt::format("{}: write failed", path));
}

}  // namespace gdn
