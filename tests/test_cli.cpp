// The gdn tool end to end: `gdn op` through safetensors files against a direct library call, and
// a clean failure (exit status 1 and a message, no crash) on bad input.

#include <sys/resource.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gdn/delta_rule.h"
#include "gdn/layer.h"
#include "gdn/layer_weights.h"
#include "gdn/problem.h"
#include "gdn/safetensors.h"

namespace gdn {
namespace {

namespace fs = std::filesystem;

struct Exit {
  int status;
  std::string message;  // stderr
  std::string output;   // stdout
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("gdn_test_cli_") + info->name() + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs the built tool (GDN_CLI, from CMake) with `args`, paths in them quoted; `env` is
  // prepended (VAR=value ...).
  Exit gdn(const std::string& args, const std::string& env = "") const {
    const std::string err = path("stderr.txt"), out = path("stdout.txt");
    const int raw = std::system(
        (env + " '" + GDN_CLI + "' " + args + " > '" + out + "' 2> '" + err + "'").c_str());
    const auto text = [](const std::string& file) {
      std::ifstream f(file);
      return std::string{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    };
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, text(err), text(out)};
  }

  fs::path dir_;
};

TensorMap inputs_of(const ProblemData& d) {
  TensorMap m = {{"q", d.q}, {"k", d.k}, {"v", d.v}, {"g", d.g}, {"beta", d.beta}, {"do", d.d_o}};
  if (!d.initial_state.bytes.empty()) m["initial_state"] = d.initial_state;
  if (!d.cu_seqlens.bytes.empty()) m["cu_seqlens"] = d.cu_seqlens;
  if (!d.d_final_state.bytes.empty()) m["dht"] = d.d_final_state;
  return m;
}

void expect_matches(const TensorMap& out, ProblemResults& ref, const std::set<std::string>& names) {
  std::set<std::string> written;
  for (const auto& [name, t] : out) written.insert(name);
  EXPECT_EQ(written, names);
  const std::pair<const char*, HostTensor*> expected[] = {
      {"o", &ref.o},         {"final_state", &ref.final_state},
      {"dq", &ref.dq},       {"dk", &ref.dk},
      {"dv", &ref.dv},       {"dg", &ref.dg},
      {"dbeta", &ref.dbeta}, {"dh0", &ref.dh0}};
  for (const auto& [name, r] : expected) {
    if (!names.contains(name)) continue;
    SCOPED_TRACE(name);
    HostTensor t = out.at(name);
    EXPECT_EQ(t.dtype, DType::f32);
    EXPECT_EQ(t.shape, r->shape);
    EXPECT_LT(relative_error(t.ref(), r->ref()), 1e-6);
  }
}

TEST_F(Cli, OpMatchesTheLibraryOnPackedBf16InputsWithGradients) {
  Problem p;
  p.seqlens = {37, 64, 5};
  p.HK = 2, p.HV = 4, p.K = 16, p.V = 8;
  p.dtype = DType::bf16;
  p.chunk_size = 16;
  p.initial_state = p.final_state_grad = true;
  p.seed = 3;
  ProblemData data = generate(p);
  ProblemResults ref = allocate_results(p, DType::f32);
  delta_rule_forward(data.inputs(), ref.outputs());
  delta_rule_backward(data.inputs(), ref.grads(data));

  write_safetensors(path("in.safetensors"), inputs_of(data));
  const Exit e = gdn(fmt::format("op '{}' '{}' --l2norm --chunk 16", path("in.safetensors"),
                                 path("out.safetensors")));
  ASSERT_EQ(e.status, 0) << e.message;
  expect_matches(read_safetensors(path("out.safetensors")), ref,
                 {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"});
  // One line says what it computed and wrote.
  EXPECT_NE(e.output.find("gdn op: forward and backward of B=1 T=106 HK=2 HV=4 K=16 V=8 (3 "
                          "sequences) on cpu -> "),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find(": dbeta, dg, dh0, dk, dq, dv, final_state, o\n"), std::string::npos)
      << e.output;
}

// Same file in, same results out over 3 in-process ranks, packed sequences straddling them.
TEST_F(Cli, OpOverRanksMatchesTheSingleRankLibrary) {
  Problem p;
  p.seqlens = {37, 64, 25};
  p.HK = 2, p.HV = 4, p.K = 16, p.V = 8;
  p.chunk_size = 16;
  p.initial_state = p.final_state_grad = true;
  p.seed = 4;
  ProblemData data = generate(p);
  ProblemResults ref = allocate_results(p, DType::f32);
  delta_rule_forward(data.inputs(), ref.outputs());
  delta_rule_backward(data.inputs(), ref.grads(data));

  write_safetensors(path("in.safetensors"), inputs_of(data));
  for (const char* strategy : {"relay", "summary-chain", "scan"}) {
    SCOPED_TRACE(strategy);
    const Exit e = gdn(fmt::format("op '{}' '{}' --l2norm --chunk 16 --ranks 3 --strategy {}",
                                   path("in.safetensors"), path("out.safetensors"), strategy));
    ASSERT_EQ(e.status, 0) << e.message;
    expect_matches(read_safetensors(path("out.safetensors")), ref,
                   {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"});
  }
}

// gdn layer round-trips real-format files: config.json with text_config, prefixed weights,
// hidden_states + mask + grad_output in; output and every gradient out, on 1 and 2 ranks.
TEST_F(Cli, LayerMatchesTheLibraryOnCheckpointFiles) {
  const LayerConfig config{.hidden_size = 8,
                           .linear_num_key_heads = 2,
                           .linear_num_value_heads = 4,
                           .linear_key_head_dim = 4,
                           .linear_value_head_dim = 3,
                           .linear_conv_kernel_dim = 4};
  std::ofstream(path("config.json"))
      << R"({"model_type": "qwen3_5", "text_config": {"hidden_size": 8, "linear_num_key_heads": 2,
         "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 3,
         "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "hidden_act": "silu"}})";
  const LayerWeights weights = random_parameters(config, DType::f32, 7);
  TensorMap checkpoint;
  for_each_parameter(weights, [&](const std::string& name, const HostTensor& t) {
    checkpoint["model.layers.3.linear_attn." + name] = convert(t, DType::bf16);
  });
  write_safetensors(path("model.safetensors"), checkpoint);
  const LayerWeights loaded =
      load_layer_weights(path("model.safetensors"), config, "model.layers.3.linear_attn.");
  HostTensor x = HostTensor::zeros(DType::f32, {2, 12, 8}), d_out = x;
  HostTensor mask = HostTensor::zeros(DType::f32, {2, 12});
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < d_out.numel(); ++i) d_out.as<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.as<float>()[i] = i % 12 < 3 ? 0.f : 1.f;
  write_safetensors(path("in.safetensors"),
                    {{"hidden_states", x}, {"attention_mask", mask}, {"grad_output", d_out}});

  GatedDeltaNet layer(config, view(loaded));
  HostTensor out = HostTensor::zeros(DType::f32, x.shape), dx = out;
  LayerWeights grads = allocate_parameters(config, DType::f32);
  layer.forward(x.ref(), mask.ref(), out.ref());
  layer.backward(x.ref(), mask.ref(), d_out.ref(), dx.ref(), view(grads));

  for (int ranks : {1, 2}) {
    SCOPED_TRACE(ranks);
    const Exit e = gdn(fmt::format(
        "layer --config '{}' --weights '{}' --prefix model.layers.3.linear_attn. --input '{}' "
        "--output '{}' --ranks {}{}",
        path("config.json"), path("model.safetensors"), path("in.safetensors"),
        path("out.safetensors"), ranks, ranks > 1 ? " --strategy summary-chain" : ""));
    ASSERT_EQ(e.status, 0) << e.message;
    const TensorMap written = read_safetensors(path("out.safetensors"));
    EXPECT_LT(relative_error(written.at("output").ref(), out.ref()), 1e-5);
    EXPECT_LT(relative_error(written.at("grad.hidden_states").ref(), dx.ref()), 1e-5);
    // Two ranks add in another order (the summaries' composition). A_log's and dt_bias's
    // gradients, one value a head, are sums over every token of the gate gradient, whose terms
    // cancel: f32 rounding of about 1e-7 comes out near 1e-5 there (1.1e-5 and 0.9e-5 without
    // -march=native, against 1e-7 .. 6e-7 for the other weights), so they get 1e-4.
    for_each_parameter(grads, [&](const std::string& name, const HostTensor& g) {
      const double tolerance = name == "A_log" || name == "dt_bias" ? 1e-4 : 1e-5;
      EXPECT_LT(relative_error(written.at("grad." + name).ref(), g.ref()), tolerance) << name;
    });
  }
}

TEST_F(Cli, OpForwardOnlyWithTheRecurrentMethodAndAScale) {
  Problem p;
  p.B = 2, p.T = 20, p.HK = 1, p.HV = 3, p.K = 8, p.V = 4;
  p.use_qk_l2norm = false;
  ProblemData data = generate(p);
  data.scale = 0.5;
  ProblemResults ref = allocate_results(p, DType::f32);
  delta_rule_forward(data.inputs(), ref.outputs(), Method::recurrent);

  TensorMap in = inputs_of(data);
  in.erase("do");
  write_safetensors(path("in.safetensors"), in);
  const Exit e = gdn(fmt::format("op '{}' '{}' --method recurrent --scale 0.5",
                                 path("in.safetensors"), path("out.safetensors")));
  ASSERT_EQ(e.status, 0) << e.message;
  expect_matches(read_safetensors(path("out.safetensors")), ref, {"o", "final_state"});
}

// Exit status 1 and "gdn: error: " followed by every one of `parts`.
void expect_failure(const Exit& e, std::initializer_list<std::string> parts) {
  EXPECT_EQ(e.status, 1) << e.message;
  EXPECT_EQ(e.message.rfind("gdn: error: ", 0), 0u) << e.message;
  for (const std::string& part : parts)
    EXPECT_NE(e.message.find(part), std::string::npos) << e.message << " lacks " << part;
}

TEST_F(Cli, OpFailsCleanlyOnAMalformedFile) {
  const std::string header = R"({"q": nonsense)";  // a valid length, then broken JSON
  std::ofstream(path("bad.safetensors"))
      << std::string(1, static_cast<char>(header.size())) << std::string(7, '\0') << header;
  expect_failure(gdn(fmt::format("op '{}' '{}'", path("bad.safetensors"), path("out.safetensors"))),
                 {path("bad.safetensors")});
  expect_failure(
      gdn(fmt::format("op '{}' '{}'", path("none.safetensors"), path("out.safetensors"))),
      {path("none.safetensors")});
  EXPECT_FALSE(fs::exists(path("out.safetensors")));
}

TEST_F(Cli, OpNamesUnknownAndMissingTensors) {
  Problem p;
  p.T = 4, p.HK = 1, p.HV = 1, p.K = 4, p.V = 4;
  TensorMap in = inputs_of(generate(p));
  in["h0"] = in["q"];
  write_safetensors(path("in.safetensors"), in);
  const std::string args =
      fmt::format("op '{}' '{}'", path("in.safetensors"), path("out.safetensors"));
  expect_failure(gdn(args), {"unexpected tensor \"h0\"", "expected q, k, v, g, beta"});

  in.erase("h0");
  in.erase("beta");
  write_safetensors(path("in.safetensors"), in);
  expect_failure(gdn(args), {"missing tensor \"beta\""});
}

// gdn op checks the names before it reads any tensor: a (sparse) file claiming 4 GB in q
// fails on the missing k without reading q.
TEST_F(Cli, OpNamesAMissingTensorBeforeReadingAny) {
  const std::int64_t big = std::int64_t{1} << 32;
  std::string header =
      fmt::format(R"({{"q": {{"dtype": "F32", "shape": [1, {}, 1, 4], "data_offsets": [0, {}]}}}})",
                  big / 16, big);
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::uint64_t header_size = header.size();
  {
    std::ofstream f(path("in.safetensors"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(&header_size), 8);
    f << header;
  }
  fs::resize_file(path("in.safetensors"), 8 + header_size + static_cast<std::uintmax_t>(big));
  expect_failure(gdn(fmt::format("op '{}' '{}'", path("in.safetensors"), path("out.safetensors"))),
                 {"missing tensor \"k\""});
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  EXPECT_LT(usage.ru_maxrss, 512 * 1024) << "KiB of peak memory in gdn op";
}

TEST_F(Cli, OpPassesOnTheLibrarysShapeErrors) {
  Problem p;
  p.T = 4, p.HK = 1, p.HV = 1, p.K = 4, p.V = 4;
  TensorMap in = inputs_of(generate(p));
  in["k"] = HostTensor::zeros(DType::f32, {1, 4, 1, 3});
  write_safetensors(path("in.safetensors"), in);
  expect_failure(gdn(fmt::format("op '{}' '{}'", path("in.safetensors"), path("out.safetensors"))),
                 {"k must have shape [B, T, HK, K]"});
}

// Every tensor is checked whole before anything cuts it by token: a do, attention_mask or
// grad_output of the wrong rank or length fails cleanly on one rank and over ranks (it crashed,
// or gave garbage with exit 0).
TEST_F(Cli, OpRejectsDoOfTheWrongShapeOnEveryPath) {
  Problem p;
  p.T = 8, p.HK = 1, p.HV = 2, p.K = 4, p.V = 4;
  TensorMap in = inputs_of(generate(p));
  for (const std::vector<std::int64_t>& shape :
       std::vector<std::vector<std::int64_t>>{{}, {8}, {1, 6, 2, 4}, {1, 10, 2, 4}}) {
    in["do"] = HostTensor::zeros(DType::f32, shape);
    write_safetensors(path("in.safetensors"), in);
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(fmt::format("do {} over {} ranks", in["do"].ref().shape_string(), ranks));
      expect_failure(gdn(fmt::format("op '{}' '{}' --ranks {}", path("in.safetensors"),
                                     path("out.safetensors"), ranks)),
                     {"d_o must have shape [B, T, HV, V]"});
    }
  }
  in["do"] = HostTensor::zeros(DType::f32, {1, 8, 2, 4});
  in["dht"] = HostTensor::zeros(DType::f32, {1, 2, 4});
  write_safetensors(path("in.safetensors"), in);
  expect_failure(
      gdn(fmt::format("op '{}' '{}' --ranks 2", path("in.safetensors"), path("out.safetensors"))),
      {"d_final_state must have shape [N, HV, K, V]"});
  EXPECT_FALSE(fs::exists(path("out.safetensors")));
}

TEST_F(Cli, LayerRejectsMasksAndGradOutputsOfTheWrongShape) {
  const LayerConfig config{.hidden_size = 8,
                           .linear_num_key_heads = 1,
                           .linear_num_value_heads = 2,
                           .linear_key_head_dim = 4,
                           .linear_value_head_dim = 4,
                           .linear_conv_kernel_dim = 4};
  std::ofstream(path("config.json"))
      << R"({"hidden_size": 8, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
         "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4})";
  TensorMap checkpoint;
  const LayerWeights weights = random_parameters(config, DType::f32, 1);
  for_each_parameter(weights,
                     [&](const std::string& name, const HostTensor& t) { checkpoint[name] = t; });
  write_safetensors(path("model.safetensors"), checkpoint);
  const HostTensor x = HostTensor::zeros(DType::f32, {2, 8, 8});
  const std::pair<const char*, std::vector<std::int64_t>> bad[] = {
      {"attention_mask", {}},      {"attention_mask", {16}},      {"attention_mask", {2, 6}},
      {"attention_mask", {2, 10}}, {"attention_mask", {2, 8, 1}}, {"grad_output", {128}},
      {"grad_output", {2, 6, 8}},  {"grad_output", {2, 10, 8}},   {"grad_output", {2, 8, 4}}};
  for (const auto& [name, shape] : bad) {
    write_safetensors(path("in.safetensors"),
                      {{"hidden_states", x}, {name, HostTensor::zeros(DType::f32, shape)}});
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(
          fmt::format("{} of shape [{}] over {} ranks", name, fmt::join(shape, ", "), ranks));
      expect_failure(
          gdn(fmt::format("layer --config '{}' --weights '{}' --input '{}' --output '{}' "
                          "--ranks {}",
                          path("config.json"), path("model.safetensors"), path("in.safetensors"),
                          path("out.safetensors"), ranks)),
          {fmt::format("{} must have shape", name)});
    }
  }
  write_safetensors(path("in.safetensors"),
                    {{"hidden_states", HostTensor::zeros(DType::f32, {8, 8})}});
  expect_failure(gdn(fmt::format("layer --config '{}' --weights '{}' --input '{}' --output '{}'",
                                 path("config.json"), path("model.safetensors"),
                                 path("in.safetensors"), path("out.safetensors"))),
                 {"hidden_states must have shape [B, T, hidden]"});
  EXPECT_FALSE(fs::exists(path("out.safetensors")));
}

// Huge sizes end in an error naming the options and the bytes, not std::bad_alloc; a chunk
// larger than T costs no more memory than T.
TEST_F(Cli, RunRejectsSizesBeyondTheMachinesMemory) {
  expect_failure(gdn("run -T 2000000000 --ranks 1"),
                 {"-T 2000000000", "bytes, more than this machine's memory"});
  expect_failure(gdn("run --layer --hidden 1000000000 -T 64 --ranks 1"),
                 {"--hidden 1000000000", "bytes, more than this machine's memory"});
  const Exit e =
      gdn("run --chunk 1000000000 -T 64 --heads-k 1 --heads-v 2 --dim-k 16 --dim-v 8 --ranks 1 > "
          "/dev/null");
  EXPECT_EQ(e.status, 0) << e.message;
}

// CLI errors in words, and --version.
TEST_F(Cli, SaysWhatIsWrongInWords) {
  const auto expect_message = [](const Exit& e, int status, const std::string& part) {
    EXPECT_EQ(e.status, status) << e.message;
    EXPECT_NE(e.message.find(part), std::string::npos) << e.message << " lacks " << part;
  };
  expect_message(gdn("foo"), 2, "gdn: error: unknown command \"foo\": expected run, op or layer");
  expect_message(gdn(""), 2, "gdn: error: a command is required: expected run, op or layer");
  for (const char* option : {"--chunk", "-T", "--ranks", "--threads", "--timeout"}) {
    const Exit e = gdn(fmt::format("run {} 0", option));
    expect_message(e, 105, "must be a positive integer, got 0");
    EXPECT_EQ(e.message.find("not in range"), std::string::npos) << e.message;
  }
  const Exit version = gdn("--version");
  ASSERT_EQ(version.status, 0);
  EXPECT_EQ(version.output.rfind("gdn ", 0), 0u) << version.output;
}

// --strategy on one rank would be ignored: an error naming it, for every command.
TEST_F(Cli, StrategyOnOneRankIsAnError) {
  const std::string files = fmt::format("'{}' '{}'", path("in.st"), path("out.st"));
  for (const std::string& args :
       {std::string("run --ranks 1 --strategy relay"), "op " + files + " --strategy relay",
        std::string("layer --config c.json --weights w.st --input x.st --output o.st "
                    "--strategy relay")}) {
    SCOPED_TRACE(args);
    expect_failure(gdn(args), {"--strategy relay has no effect on one rank"});
  }
}

// --device cuda on a machine without a GPU says so, before reading or generating anything.
TEST_F(Cli, DeviceCudaWithoutAGpuSaysSo) {
  const std::string run = "run --device cuda -T 64 --heads-k 1 --heads-v 1 --ranks 1 > /dev/null";
  if (gdn(run).status == 0) GTEST_SKIP() << "a CUDA GPU is visible";
  const std::string expected =
      GDN_CLI_CUDA ? "--device cuda: no CUDA GPU is visible" : "gdn was built without CUDA";
  expect_failure(gdn(run), {expected});
  expect_failure(gdn(fmt::format("op '{}' '{}' --device cuda", path("none.st"), path("out.st"))),
                 {expected});
}

// gdn run --layer honors -B and --chunk, checks its single rank against the layer's float64
// recurrence, and rejects the options it cannot honor (it ignored them).
TEST_F(Cli, RunLayerChecksItsSingleRankAndRejectsWhatItCannotHonor) {
  const std::string shape =
      "run --layer -T 96 --hidden 64 --heads-k 2 --heads-v 4 --dim-k 16 --dim-v 8 --ranks 1";
  const Exit e = gdn(fmt::format("{} -B 2 --chunk 16", shape));
  ASSERT_EQ(e.status, 0) << e.message;
  const std::string& out = e.output;
  for (const char* part : {"B=2 T=96", "chunk 16", "against the layer's float64 recurrence",
                           "grad.in_proj_qkv.weight", "(tolerance 1e-04: ok)"})
    EXPECT_NE(out.find(part), std::string::npos) << out << " lacks " << part;
  for (const std::string option :
       {"--dtype bf16", "--dtype f16", "--no-l2norm", "--initial-state", "--device cuda"}) {
    SCOPED_TRACE(option);
    expect_failure(gdn(shape + " " + option),
                   {fmt::format("gdn run --layer: {} is not supported", option)});
  }
}

// gdn run --json: stdout is one JSON document (the problem, the single-rank pass, every
// strategy's row with its verdict, auto's pick, the float64 check); progress, asked for every
// step with GDN_PROGRESS_MS=0, goes to stderr only.
TEST_F(Cli, RunJsonIsOneDocumentAndProgressGoesToStderr) {
  const Exit e = gdn(
      "run --json -T 96 --heads-k 2 --heads-v 4 --dim-k 32 --dim-v 16 --initial-state --ranks 3 "
      "--strategy all",
      "GDN_PROGRESS_MS=0");
  ASSERT_EQ(e.status, 0) << e.message;
  nlohmann::json doc;
  ASSERT_NO_THROW(doc = nlohmann::json::parse(e.output)) << e.output;  // the whole of stdout
  EXPECT_EQ(doc.at("command"), "run");
  EXPECT_EQ(doc.at("device"), "cpu");
  EXPECT_EQ(doc.at("ok"), true);
  const nlohmann::json& p = doc.at("problem");
  EXPECT_EQ(p.at("T"), 96);
  EXPECT_EQ(p.at("HK"), 2);
  EXPECT_EQ(p.at("HV"), 4);
  EXPECT_EQ(p.at("K"), 32);
  EXPECT_EQ(p.at("V"), 16);
  EXPECT_EQ(p.at("dtype"), "f32");
  EXPECT_EQ(p.at("initial_state"), true);
  for (const char* pass : {"forward", "backward", "forward_backward"})
    EXPECT_GT(doc.at("single_rank").at(pass).at("ms").get<double>(), 0) << pass;

  const nlohmann::json& cp = doc.at("context_parallel");
  EXPECT_EQ(cp.at("ranks"), 3);
  EXPECT_EQ(cp.at("requested"), "all");
  const double tolerance = cp.at("tolerance");
  EXPECT_EQ(tolerance, 1e-4);
  std::vector<std::string> names;
  for (const nlohmann::json& row : cp.at("rows")) {
    names.push_back(row.at("strategy"));
    SCOPED_TRACE(names.back());
    EXPECT_EQ(row.at("ranks"), 3);
    if (names.back() == "ulysses") {  // HK = 2 does not divide over 3 ranks
      EXPECT_EQ(row.at("skipped"), "needs HK and HV divisible by 3");
      continue;
    }
    EXPECT_GT(row.at("forward_ms").get<double>(), 0);
    EXPECT_GE(row.at("forward_backward_ms").get<double>(), row.at("forward_ms").get<double>());
    EXPECT_GT(row.at("tokens_per_s").get<double>(), 0);
    EXPECT_GT(row.at("sent_per_rank_bytes").get<double>(), 0);
    EXPECT_LT(row.at("error").get<double>(), tolerance);
    EXPECT_EQ(row.at("ok"), true);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"relay", "summary-chain", "summary-allgather", "scan",
                                             "ulysses"}));
  const std::string automatic = cp.at("auto");
  EXPECT_NE(std::find(names.begin(), names.end(), automatic), names.end()) << automatic;

  const nlohmann::json& check = doc.at("check");
  std::set<std::string> checked;
  for (const auto& [name, error] : check.at("errors").items()) {
    checked.insert(name);
    EXPECT_LT(error.get<double>(), 1e-4) << name;
  }
  EXPECT_EQ(checked,
            (std::set<std::string>{"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"}));
  EXPECT_EQ(check.at("ok"), true);

  // Progress on stderr, one line per step, none of it on stdout.
  for (const char* step :
       {"gdn: generating the problem...\n", "gdn: running forward and backward on one rank...\n",
        "gdn: running strategy relay on 3 ranks...\n", "gdn: running strategy scan on 3 ranks...\n",
        "gdn: checking key head 0 against the float64 recurrence...\n"}) {
    EXPECT_NE(e.message.find(step), std::string::npos) << e.message << " lacks " << step;
    EXPECT_EQ(e.output.find(step), std::string::npos) << step;
  }
  EXPECT_EQ(e.message.find("ulysses"), std::string::npos) << e.message;  // skipped, not run
}

// The auto row names the strategy it ran, which is the one the document says auto picks; the
// text says it too. Short steps print no progress by default.
TEST_F(Cli, RunAutoSaysWhichStrategyItRan) {
  const std::string args = "run -T 128 --heads-k 2 --heads-v 4 --dim-k 32 --dim-v 16 --ranks 2";
  const Exit json = gdn(args + " --json");
  ASSERT_EQ(json.status, 0) << json.message;
  EXPECT_EQ(json.message, "");  // every step is far shorter than the default 2 s
  const nlohmann::json doc = nlohmann::json::parse(json.output);
  const nlohmann::json& cp = doc.at("context_parallel");
  ASSERT_EQ(cp.at("rows").size(), 1u);
  const nlohmann::json& row = cp.at("rows")[0];
  EXPECT_EQ(row.at("requested"), "auto");
  EXPECT_EQ(row.at("strategy"), cp.at("auto"));
  EXPECT_EQ(row.at("ok"), true);

  const Exit text = gdn(args, "GDN_PROGRESS_MS=0");
  ASSERT_EQ(text.status, 0) << text.message;
  const std::string chosen = fmt::format("auto: {}", cp.at("auto").get<std::string>());
  EXPECT_NE(text.output.find(chosen), std::string::npos) << text.output << " lacks " << chosen;
  EXPECT_NE(text.message.find("gdn: running strategy auto on 2 ranks...\n"), std::string::npos)
      << text.message;
  EXPECT_EQ(text.output.find("gdn: running"), std::string::npos) << text.output;
}

// gdn run --layer --json: the layer's problem, rows and check; a failed run (here: none) would
// say "ok": false.
TEST_F(Cli, RunLayerJson) {
  const Exit e =
      gdn("run --layer --json -T 64 --hidden 32 --heads-k 2 --heads-v 4 --dim-k 16 --dim-v 8 "
          "--ranks 2 --strategy all");
  ASSERT_EQ(e.status, 0) << e.message;
  const nlohmann::json doc = nlohmann::json::parse(e.output);
  EXPECT_EQ(doc.at("command"), "run --layer");
  EXPECT_EQ(doc.at("problem").at("hidden"), 32);
  EXPECT_GT(doc.at("single_rank").at("forward_backward").at("ms").get<double>(), 0);
  const nlohmann::json& rows = doc.at("context_parallel").at("rows");
  EXPECT_EQ(rows.size(), 5u);
  for (const nlohmann::json& row : rows) {
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row.at("ranks"), 2);
    EXPECT_EQ(row.at("ok"), true);
    EXPECT_LT(row.at("error").get<double>(), 1e-4);
  }
  EXPECT_EQ(doc.at("check").at("against"), "the layer's float64 recurrence");
  EXPECT_TRUE(doc.at("check").at("errors").contains("grad.in_proj_qkv.weight"));
  EXPECT_EQ(doc.at("check").at("ok"), true);
  EXPECT_EQ(doc.at("ok"), true);
}

}  // namespace
}  // namespace gdn
