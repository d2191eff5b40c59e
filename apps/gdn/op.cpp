// gdn op: the op on tensors from a safetensors file (any floating storage), results in f32.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "gdn/error.h"
#include "gdn/safetensors.h"

namespace gdn::app {
namespace {

constexpr std::array<std::string_view, 5> kRequired = {"q", "k", "v", "g", "beta"};
constexpr std::array<std::string_view, 4> kOptional = {"initial_state", "cu_seqlens", "do", "dht"};
constexpr std::string_view kExpected =
    "expected q, k, v, g, beta and optionally initial_state, cu_seqlens, do, dht";

bool one_of(std::string_view name, auto names) {
  for (std::string_view n : names)
    if (n == name) return true;
  return false;
}

}  // namespace

void add_op_options(CLI::App& command, OpOptions& options) {
  command
      .add_option("IN", options.input,
                  "Input safetensors: q, k, v, g, beta; optionally initial_state, cu_seqlens, "
                  "do (dO: adds the backward pass), dht (gradient of the final state)")
      ->required();
  command
      .add_option("OUT", options.output,
                  "Output safetensors (f32): o, final_state; with do also dq, dk, dv, dg, dbeta, "
                  "and dh0 when initial_state is given")
      ->required();
  command.add_option("--scale", options.scale, "Output scale; 0 means K^-1/2");
  command.add_flag("--l2norm", options.use_qk_l2norm,
                   "L2-normalize q and k in the op (use_qk_l2norm_in_kernel)");
  command.add_option("--chunk", options.chunk_size, "Chunk size C of the chunked method")
      ->check(CLI::PositiveNumber);
  add_choice(command, "--method", options.method,
             {{"chunked", Method::chunked}, {"recurrent", Method::recurrent}},
             "chunked (float32) or recurrent (float64, the oracle); default chunked");
}

int op(const OpOptions& options) {
  TensorMap in = read_safetensors(options.input);
  for (const auto& [name, t] : in)
    if (!one_of(name, kRequired) && !one_of(name, kOptional))
      throw Error(fmt::format("{}: unexpected tensor \"{}\" ({})", options.input, name, kExpected));
  for (std::string_view name : kRequired)
    if (!in.contains(std::string(name)))
      throw Error(fmt::format("{}: missing tensor \"{}\" ({})", options.input, name, kExpected));
  if (in.contains("dht") && !in.contains("do"))
    throw Error(
        fmt::format("{}: dht is given without do: the backward pass needs do", options.input));
  const auto given = [&](const char* name) {
    const auto it = in.find(name);
    return it == in.end() ? TensorRef{} : it->second.ref();
  };

  DeltaRuleInputs inputs;
  inputs.q = given("q");
  inputs.k = given("k");
  inputs.v = given("v");
  inputs.g = given("g");
  inputs.beta = given("beta");
  inputs.initial_state = given("initial_state");
  inputs.cu_seqlens = given("cu_seqlens");
  inputs.scale = options.scale;
  inputs.use_qk_l2norm = options.use_qk_l2norm;
  inputs.chunk_size = options.chunk_size;
  const DeltaRuleShape s = validate(inputs);

  TensorMap out;
  const auto result = [&](const char* name, std::vector<std::int64_t> shape) {
    return (out[name] = HostTensor::zeros(DType::f32, std::move(shape))).ref();
  };
  delta_rule_forward(
      inputs, {result("o", {s.B, s.T, s.HV, s.V}), result("final_state", {s.N, s.HV, s.K, s.V})},
      options.method);
  if (in.contains("do")) {
    DeltaRuleGrads grads;
    grads.d_o = given("do");
    grads.d_final_state = given("dht");
    grads.dq = result("dq", {s.B, s.T, s.HK, s.K});
    grads.dk = result("dk", {s.B, s.T, s.HK, s.K});
    grads.dv = result("dv", {s.B, s.T, s.HV, s.V});
    grads.dg = result("dg", {s.B, s.T, s.HV});
    grads.dbeta = result("dbeta", {s.B, s.T, s.HV});
    if (inputs.initial_state.given()) grads.dh0 = result("dh0", {s.N, s.HV, s.K, s.V});
    delta_rule_backward(inputs, grads, options.method);
  }
  write_safetensors(options.output, out);
  return 0;
}

}  // namespace gdn::app
