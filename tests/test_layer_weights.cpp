// Loading the layer from transformers checkpoints: config.json (top level or text_config),
// safetensors with a key prefix, a sharded index, Qwen3-Next's fused projections, and the errors
// for missing and mis-shaped tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "gdn/error.h"
#include "gdn/layer_weights.h"
#include "gdn/safetensors.h"
#include "layer_testing.h"

namespace gdn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::tiny_config;

const std::string kPrefix = "model.layers.2.linear_attn.";

class LayerWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("gdn_test_layer_weights_") + info->name() +
                                        "_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
  }

  fs::path dir_;
};

// The tensors of a Qwen3.5 checkpoint's layer: transformers' names after kPrefix, plus a
// neighbour of another module that the loader must ignore.
TensorMap checkpoint(const LayerWeights& w) {
  TensorMap m;
  for_each_parameter(w, [&](const char* name, const HostTensor& t) { m[kPrefix + name] = t; });
  m["model.layers.2.mlp.gate_proj.weight"] = HostTensor::zeros(DType::bf16, {3, 2});
  return m;
}

void expect_equal(const LayerWeights& got, const LayerWeights& expected) {
  std::vector<const HostTensor*> want;
  for_each_parameter(expected, [&](const char*, const HostTensor& t) { want.push_back(&t); });
  std::size_t i = 0;
  for_each_parameter(got, [&](const char* name, const HostTensor& t) {
    EXPECT_EQ(t.dtype, want[i]->dtype) << name;
    EXPECT_EQ(t.shape, want[i]->shape) << name;
    EXPECT_EQ(t.bytes, want[i]->bytes) << name;
    ++i;
  });
}

json config_json(const LayerConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"linear_num_key_heads", c.linear_num_key_heads},
          {"linear_num_value_heads", c.linear_num_value_heads},
          {"linear_key_head_dim", c.linear_key_head_dim},
          {"linear_value_head_dim", c.linear_value_head_dim},
          {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
          {"rms_norm_eps", 1e-5},
          {"hidden_act", "silu"}};
}

TEST_F(LayerWeightsTest, ConfigAtTheTopLevel) {
  json j = config_json(tiny_config());
  j["model_type"] = "qwen3_next";
  write_text("config.json", j.dump());
  const LayerConfig c = load_layer_config(path("config.json"));
  EXPECT_EQ(c.hidden_size, 6);
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.linear_key_head_dim, 4);
  EXPECT_EQ(c.linear_value_head_dim, 3);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "silu");
}

// Qwen3.5's multimodal config.json: the text model's keys under text_config (found from the
// checkpoint directory); rms_norm_eps and hidden_act default as in transformers.
TEST_F(LayerWeightsTest, ConfigUnderTextConfig) {
  json text = config_json(tiny_config());
  text.erase("rms_norm_eps");
  text.erase("hidden_act");
  const json j = {{"model_type", "qwen3_5"},
                  {"hidden_size", 999},  // the vision side's: text_config wins
                  {"text_config", text},
                  {"vision_config", {{"hidden_size", 1152}}}};
  write_text("config.json", j.dump());
  const LayerConfig c = load_layer_config(dir_.string());
  EXPECT_EQ(c.hidden_size, 6);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.hidden_act, "silu");
}

TEST_F(LayerWeightsTest, ConfigErrors) {
  json j = config_json(tiny_config());
  j.erase("linear_num_key_heads");
  EXPECT_EQ(error_of([&] { parse_layer_config(j.dump(), "c.json"); }),
            "c.json: missing \"linear_num_key_heads\" (looked under \"text_config\" and at the top "
            "level)");
  j = config_json(tiny_config());
  j["hidden_size"] = "6";
  EXPECT_EQ(error_of([&] { parse_layer_config(j.dump(), "c.json"); }),
            "c.json: \"hidden_size\" must be an integer, got \"6\"");
  j = config_json(tiny_config());
  j["hidden_act"] = "gelu";
  EXPECT_EQ(error_of([&] { parse_layer_config(j.dump(), "c.json"); }),
            "c.json: layer config hidden_act must be \"silu\" or \"swish\" (the conv's "
            "activation), got \"gelu\"");
  j = config_json(tiny_config());
  j["linear_num_value_heads"] = 5;
  EXPECT_EQ(error_of([&] { parse_layer_config(j.dump(), "c.json"); }),
            "c.json: layer config linear_num_value_heads (5) must be divisible by "
            "linear_num_key_heads (2)");
  EXPECT_NE(error_of([&] { parse_layer_config("{", "c.json"); }).find("c.json: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { load_layer_config(path("none.json")); }),
            "cannot open config " + path("none.json"));
}

// bf16 in the file, f32 (exactly the bf16 values) in memory; the neighbour is ignored.
TEST_F(LayerWeightsTest, OneFileWithAPrefix) {
  const LayerWeights w = testing::random_weights(tiny_config(), DType::bf16, 1);
  write_safetensors(path("model.safetensors"), checkpoint(w));
  const LayerWeights expected = testing::convert(w, DType::f32);
  expect_equal(load_layer_weights(path("model.safetensors"), tiny_config(), kPrefix), expected);
  expect_equal(load_layer_weights(dir_.string(), tiny_config(), kPrefix), expected);
  expect_equal(load_layer_weights(dir_.string(), tiny_config(), kPrefix, DType::bf16), w);
}

TEST_F(LayerWeightsTest, ShardedIndex) {
  const LayerWeights w = testing::random_weights(tiny_config(), DType::f32, 2);
  const std::string files[] = {"model-00001-of-00002.safetensors",
                               "model-00002-of-00002.safetensors"};
  TensorMap shards[2];
  json weight_map;
  int n = 0;
  for (auto& [name, t] : checkpoint(w)) {
    shards[n % 2][name] = t;
    weight_map[name] = files[n++ % 2];
  }
  for (int i : {0, 1}) write_safetensors(path(files[i]), shards[i]);
  write_text("model.safetensors.index.json",
             json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  expect_equal(load_layer_weights(dir_.string(), tiny_config(), kPrefix), w);
  expect_equal(load_layer_weights(path("model.safetensors.index.json"), tiny_config(), kPrefix), w);

  // An index that leaves a tensor out, and one that points a tensor at a file without it.
  json short_map = weight_map;
  short_map.erase(kPrefix + "norm.weight");
  write_text("short.index.json", json{{"weight_map", short_map}}.dump());
  EXPECT_EQ(error_of([&] { load_layer_weights(path("short.index.json"), tiny_config(), kPrefix); }),
            path("short.index.json") +
                ": missing tensor \"model.layers.2.linear_attn.norm.weight\" (expected shape [3])");
  const std::string holder = weight_map[kPrefix + "A_log"];
  weight_map[kPrefix + "A_log"] = holder == files[0] ? files[1] : files[0];
  write_text("bad.index.json", json{{"weight_map", weight_map}}.dump());
  EXPECT_EQ(error_of([&] { load_layer_weights(path("bad.index.json"), tiny_config(), kPrefix); }),
            path("bad.index.json") + ": weight_map puts \"model.layers.2.linear_attn.A_log\" in " +
                std::string(weight_map[kPrefix + "A_log"]) + ", which does not hold it");
}

TEST_F(LayerWeightsTest, MissingAndMisShapedTensors) {
  const LayerConfig c = tiny_config();
  const LayerWeights w = testing::random_weights(c, DType::f32, 3);
  TensorMap m = checkpoint(w);
  m.erase(kPrefix + "A_log");
  EXPECT_EQ(error_of([&] { layer_weights_from(m, c, kPrefix, DType::f32, "ckpt"); }),
            "ckpt: missing tensor \"model.layers.2.linear_attn.A_log\" (expected shape [4])");
  EXPECT_EQ(error_of([&] {
              layer_weights_from(m, c, "model.layers.7.linear_attn.", DType::f32, "ckpt");
            }),
            "ckpt: missing tensor \"model.layers.7.linear_attn.in_proj_qkv.weight\" (expected "
            "shape [28, 6]); no tensor name starts with \"model.layers.7.linear_attn.\"");
  m = checkpoint(w);
  m[kPrefix + "norm.weight"] = HostTensor::zeros(DType::f32, {4});
  EXPECT_EQ(error_of([&] { layer_weights_from(m, c, kPrefix, DType::f32, "ckpt"); }),
            "ckpt: tensor \"model.layers.2.linear_attn.norm.weight\" has shape [4], expected [3]");
  m = checkpoint(w);
  m[kPrefix + "out_proj.weight"] = HostTensor::zeros(DType::i32, {6, 12});
  EXPECT_EQ(error_of([&] { layer_weights_from(m, c, kPrefix, DType::f32, "ckpt"); }),
            "ckpt: tensor \"model.layers.2.linear_attn.out_proj.weight\" must be floating (F64, "
            "F32, F16, BF16), got i32");
  write_safetensors(path("model.safetensors"), checkpoint(w));
  LayerConfig wide = c;
  wide.hidden_size = 8;
  EXPECT_EQ(error_of([&] { load_layer_weights(path("model.safetensors"), wide, kPrefix); }),
            path("model.safetensors") +
                ": tensor \"model.layers.2.linear_attn.in_proj_qkv.weight\" has shape [28, 6], "
                "expected [28, 8]");
  fs::remove(path("model.safetensors"));
  EXPECT_EQ(error_of([&] { load_layer_weights(dir_.string(), c, kPrefix); }),
            dir_.string() + ": holds neither model.safetensors.index.json nor model.safetensors");
}

// Qwen3-Next's fused projections, built from separate weights the way transformers' view reads
// them: fused row i G + j (G = 2K + 2rV) of key head i is q_i[j], k_i[j - K], v_i[j - 2K] or
// z_i[j - 2K - rV]; in_proj_ba row i 2r + j is b_i[j] or a_i[j - r].
TEST_F(LayerWeightsTest, Qwen3NextFusedProjectionsRoundTrip) {
  LayerConfig c = tiny_config();
  c.linear_num_value_heads = 6;  // r = 3
  const std::int64_t D = c.hidden_size, HK = c.linear_num_key_heads, HV = 6;
  const std::int64_t K = c.linear_key_head_dim, V = c.linear_value_head_dim, r = HV / HK;
  const std::int64_t G = 2 * K + 2 * r * V;
  const LayerWeights w = testing::random_weights(c, DType::f32, 4);
  HostTensor qkvz = HostTensor::zeros(DType::f32, {HK * G, D});
  HostTensor ba = HostTensor::zeros(DType::f32, {2 * HV, D});
  const auto copy_row = [&](const HostTensor& from, std::int64_t row, HostTensor& to,
                            std::int64_t to_row) {
    std::copy_n(from.as<float>() + row * D, D, to.as<float>() + to_row * D);
  };
  for (std::int64_t i = 0; i < HK; ++i) {
    for (std::int64_t j = 0; j < G; ++j) {
      if (j < K)
        copy_row(w.in_proj_qkv, i * K + j, qkvz, i * G + j);
      else if (j < 2 * K)
        copy_row(w.in_proj_qkv, HK * K + i * K + (j - K), qkvz, i * G + j);
      else if (j < 2 * K + r * V)
        copy_row(w.in_proj_qkv, 2 * HK * K + i * r * V + (j - 2 * K), qkvz, i * G + j);
      else
        copy_row(w.in_proj_z, i * r * V + (j - 2 * K - r * V), qkvz, i * G + j);
    }
    for (std::int64_t j = 0; j < 2 * r; ++j)
      copy_row(j < r ? w.in_proj_b : w.in_proj_a, i * r + j % r, ba, i * 2 * r + j);
  }
  TensorMap m = checkpoint(w);
  for (const char* name :
       {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"})
    m.erase(kPrefix + name);
  m[kPrefix + "in_proj_qkvz.weight"] = qkvz;
  m[kPrefix + "in_proj_ba.weight"] = testing::convert(ba, DType::bf16);
  write_safetensors(path("model.safetensors"), m);
  LayerWeights expected = w;
  expected.in_proj_b = testing::convert(testing::convert(w.in_proj_b, DType::bf16), DType::f32);
  expected.in_proj_a = testing::convert(testing::convert(w.in_proj_a, DType::bf16), DType::f32);
  expect_equal(load_layer_weights(path("model.safetensors"), c, kPrefix), expected);

  m[kPrefix + "in_proj_ba.weight"] = HostTensor::zeros(DType::f32, {HV, D});
  EXPECT_EQ(error_of([&] { layer_weights_from(m, c, kPrefix, DType::f32, "next"); }),
            "next: tensor \"model.layers.2.linear_attn.in_proj_ba.weight\" has shape [6, 6], "
            "expected [12, 6]");
  m.erase(kPrefix + "in_proj_ba.weight");
  EXPECT_EQ(error_of([&] { layer_weights_from(m, c, kPrefix, DType::f32, "next"); }),
            "next: missing tensor \"model.layers.2.linear_attn.in_proj_ba.weight\" (expected "
            "shape [12, 6])");
}

}  // namespace
}  // namespace gdn
