// The layer's parameters from safetensors: one file, a sharded index, or tensors in memory; by
// transformers' names after a prefix, checked against the config's shapes, converted to the
// compute dtype, with Qwen3-Next's fused projections split (io/qwen3_next.h).

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/convert.h"
#include "gdn/error.h"
#include "gdn/layer_weights.h"
#include "io/qwen3_next.h"

namespace gdn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Shape = std::vector<std::int64_t>;

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kFusedQkvz = "in_proj_qkvz.weight";
constexpr const char* kFusedBa = "in_proj_ba.weight";

std::string shape_string(const Shape& shape) {
  return TensorRef{nullptr, DType::f32, shape}.shape_string();
}

bool is_floating(DType d) {
  return d == DType::f64 || d == DType::f32 || d == DType::f16 || d == DType::bf16;
}

// The names (without prefix) a checkpoint of this layout holds.
std::vector<std::string> names(bool fused) {
  std::vector<std::string> out;
  LayerWeights w;
  for_each_parameter(w, [&](const char* name, HostTensor&) { out.emplace_back(name); });
  if (fused) {
    std::erase_if(out, [](const std::string& n) { return n.starts_with("in_proj_"); });
    out.insert(out.begin(), {kFusedQkvz, kFusedBa});
  }
  return out;
}

struct Lookup {
  const TensorMap& tensors;
  const std::string& prefix;
  const std::string& source;

  // The tensor prefix + name, checked against `shape`.
  const HostTensor& get(const std::string& name, const Shape& shape) const {
    const std::string full = prefix + name;
    const auto it = tensors.find(full);
    if (it == tensors.end()) {
      const bool any = std::any_of(tensors.begin(), tensors.end(),
                                   [&](const auto& t) { return t.first.starts_with(prefix); });
      throw Error(fmt::format(
          "{}: missing tensor \"{}\" (expected shape {}){}", source, full, shape_string(shape),
          any ? "" : fmt::format("; no tensor name starts with \"{}\"", prefix)));
    }
    const HostTensor& t = it->second;
    if (t.shape != shape)
      throw Error(fmt::format("{}: tensor \"{}\" has shape {}, expected {}", source, full,
                              shape_string(t.shape), shape_string(shape)));
    if (!is_floating(t.dtype))
      throw Error(fmt::format("{}: tensor \"{}\" must be floating (F64, F32, F16, BF16), got {}",
                              source, full, dtype_name(t.dtype)));
    return t;
  }
};

HostTensor converted(const HostTensor& t, DType dtype) {
  if (t.dtype == dtype) return t;
  HostTensor out = HostTensor::zeros(dtype, t.shape);
  const TensorRef src = t.ref(), dst = out.ref();
  for (std::int64_t i = 0; i < t.numel(); ++i) core::store(dst, i, core::load<double>(src, i));
  return out;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("cannot open {}", path.string()));
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", path.string(), e.what()));
  }
}

// The tensors `wanted` of a sharded checkpoint: each from the file its weight_map names.
TensorMap read_sharded(const fs::path& index_path, const std::string& prefix) {
  const json index = read_json(index_path);
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(fmt::format("{}: missing the \"weight_map\" object", index_path.string()));
  const json& map = index["weight_map"];
  const bool fused = map.contains(prefix + kFusedQkvz);
  std::map<std::string, std::vector<std::string>> by_file;  // file -> full names it holds
  for (const std::string& name : names(fused)) {
    const std::string full = prefix + name;
    if (!map.contains(full)) continue;  // reported as missing, with its shape, by Lookup
    if (!map[full].is_string())
      throw Error(fmt::format("{}: weight_map[\"{}\"] must be a file name, got {}",
                              index_path.string(), full, map[full].dump()));
    by_file[map[full].get<std::string>()].push_back(full);
  }
  TensorMap out;
  for (const auto& [file, wanted] : by_file) {
    const SafetensorsFile shard((index_path.parent_path() / file).string());
    for (const std::string& full : wanted) {
      if (!shard.contains(full))
        throw Error(fmt::format("{}: weight_map puts \"{}\" in {}, which does not hold it",
                                index_path.string(), full, file));
      out[full] = shard.read(full);
    }
  }
  return out;
}

// The tensors of one file whose names start with the prefix (one layer of a whole checkpoint).
TensorMap read_prefixed(const fs::path& path, const std::string& prefix) {
  const SafetensorsFile file(path.string());
  TensorMap out;
  for (const auto& [name, entry] : file.entries())
    if (name.starts_with(prefix)) out[name] = file.read(name);
  return out;
}

}  // namespace

LayerWeights layer_weights_from(const TensorMap& tensors, const LayerConfig& c,
                                const std::string& prefix, DType dtype, const std::string& source) {
  validate(c);
  if (!is_floating(dtype))
    throw Error(fmt::format("layer weights dtype must be floating, got {}", dtype_name(dtype)));
  const Lookup lookup{tensors, prefix, source};
  const std::int64_t D = c.hidden_size, HV = c.linear_num_value_heads, vd = c.value_dim();
  LayerWeights w;
  if (tensors.contains(prefix + kFusedQkvz)) {
    const HostTensor& qkvz = lookup.get(kFusedQkvz, {2 * c.key_dim() + 2 * vd, D});
    const HostTensor& ba = lookup.get(kFusedBa, {2 * HV, D});
    io::split_qwen3_next(c, qkvz, ba, dtype, w);
  } else {
    w.in_proj_qkv = converted(lookup.get("in_proj_qkv.weight", {c.conv_dim(), D}), dtype);
    w.in_proj_z = converted(lookup.get("in_proj_z.weight", {vd, D}), dtype);
    w.in_proj_b = converted(lookup.get("in_proj_b.weight", {HV, D}), dtype);
    w.in_proj_a = converted(lookup.get("in_proj_a.weight", {HV, D}), dtype);
  }
  w.conv1d =
      converted(lookup.get("conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}), dtype);
  w.A_log = converted(lookup.get("A_log", {HV}), dtype);
  w.dt_bias = converted(lookup.get("dt_bias", {HV}), dtype);
  w.norm = converted(lookup.get("norm.weight", {c.linear_value_head_dim}), dtype);
  w.out_proj = converted(lookup.get("out_proj.weight", {D, vd}), dtype);
  return w;
}

LayerWeights load_layer_weights(const std::string& path, const LayerConfig& config,
                                const std::string& prefix, DType dtype) {
  fs::path file(path);
  if (fs::is_directory(file)) {
    if (fs::exists(file / kIndex))
      file /= kIndex;
    else if (fs::exists(file / kSingle))
      file /= kSingle;
    else
      throw Error(fmt::format("{}: holds neither {} nor {}", path, kIndex, kSingle));
  }
  const TensorMap tensors =
      file.extension() == ".json" ? read_sharded(file, prefix) : read_prefixed(file, prefix);
  return layer_weights_from(tensors, config, prefix, dtype, file.string());
}

}  // namespace gdn
