// config.json -> LayerConfig: the keys of transformers' Qwen3_5TextConfig (spec 6), at the top
// level or under "text_config".

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gdn/error.h"
#include "gdn/layer_weights.h"

namespace gdn {
namespace {

using nlohmann::json;

// The key under text_config when there is one, else at the top level; null when absent.
const json* find(const json& root, const char* key) {
  if (root.contains("text_config") && root["text_config"].is_object() &&
      root["text_config"].contains(key))
    return &root["text_config"][key];
  if (root.contains(key)) return &root[key];
  return nullptr;
}

std::int64_t integer(const json& root, const char* key, const std::string& source) {
  const json* j = find(root, key);
  if (!j)
    throw Error(fmt::format(
        "{}: missing \"{}\" (looked under \"text_config\" and at the top level)", source, key));
  if (!j->is_number_integer())
    throw Error(fmt::format("{}: \"{}\" must be an integer, got {}", source, key, j->dump()));
  return j->get<std::int64_t>();
}

}  // namespace

LayerConfig parse_layer_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!root.is_object()) throw Error(fmt::format("{}: must hold a JSON object", source));
  if (root.contains("text_config") && !root["text_config"].is_object())
    throw Error(fmt::format("{}: \"text_config\" must be an object, got {}", source,
                            root["text_config"].type_name()));
  LayerConfig c;
  c.hidden_size = integer(root, "hidden_size", source);
  c.linear_num_key_heads = integer(root, "linear_num_key_heads", source);
  c.linear_num_value_heads = integer(root, "linear_num_value_heads", source);
  c.linear_key_head_dim = integer(root, "linear_key_head_dim", source);
  c.linear_value_head_dim = integer(root, "linear_value_head_dim", source);
  c.linear_conv_kernel_dim = integer(root, "linear_conv_kernel_dim", source);
  if (const json* eps = find(root, "rms_norm_eps")) {
    if (!eps->is_number())
      throw Error(
          fmt::format("{}: \"rms_norm_eps\" must be a number, got {}", source, eps->dump()));
    c.rms_norm_eps = eps->get<double>();
  }
  if (const json* act = find(root, "hidden_act")) {
    if (!act->is_string())
      throw Error(fmt::format("{}: \"hidden_act\" must be a string, got {}", source, act->dump()));
    c.hidden_act = act->get<std::string>();
  }
  try {
    validate(c);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", source, e.what()));
  }
  return c;
}

LayerConfig load_layer_config(const std::string& path) {
  std::filesystem::path file(path);
  if (std::filesystem::is_directory(file)) file /= "config.json";
  std::ifstream in(file);
  if (!in) throw Error(fmt::format("cannot open config {}", file.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_layer_config(text.str(), file.string());
}

}  // namespace gdn
