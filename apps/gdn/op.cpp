// gdn op: the op on tensors from a safetensors file (any floating storage), results in f32.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "context_parallel_job.h"
#include "cuda_job.h"
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
      ->check(kPositive);
  add_ranks_options(command, options, false);
  command
      .add_option("--device", options.device,
                  "cpu, or cuda (bf16 or f16 inputs; with --ranks or mpirun, context parallel "
                  "on GPUs as for gdn run)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_choice(command, "--method", options.method,
             {{"chunked", Method::chunked}, {"recurrent", Method::recurrent}},
             "chunked (float32) or recurrent (float64, the oracle); default chunked");
}

int op(const OpOptions& options) {
  std::unique_ptr<Communicator> world =
      launched_by_mpirun() ? mpi_world(Timeout(options.timeout_ms)) : nullptr;
  check_ranks(options, world.get());
  if (options.device == "cuda") require_cuda_gpu();
  const SafetensorsFile in(options.input);  // names and shapes only: tensors are read below
  for (const auto& [name, entry] : in.entries())
    if (!one_of(name, kRequired) && !one_of(name, kOptional))
      throw Error(fmt::format("{}: unexpected tensor \"{}\" ({})", options.input, name, kExpected));
  for (std::string_view name : kRequired)
    if (!in.contains(std::string(name)))
      throw Error(fmt::format("{}: missing tensor \"{}\" ({})", options.input, name, kExpected));
  if (in.contains("dht") && !in.contains("do"))
    throw Error(
        fmt::format("{}: dht is given without do: the backward pass needs do", options.input));
  const auto take = [&](const char* name) {
    return in.contains(name) ? in.read(name) : HostTensor{};
  };
  ProblemData data;
  data.q = take("q");
  data.k = take("k");
  data.v = take("v");
  data.g = take("g");
  data.beta = take("beta");
  data.initial_state = take("initial_state");
  data.cu_seqlens = take("cu_seqlens");
  data.d_o = take("do");
  data.d_final_state = take("dht");
  data.scale = options.scale;
  data.use_qk_l2norm = options.use_qk_l2norm;
  data.chunk_size = options.chunk_size;
  const bool backward = !data.d_o.bytes.empty();
  validate(data);  // names the tensor before anything slices or runs it

  ProblemResults results;
  if (options.device == "cuda" && !world && options.ranks == 1) {
    CudaTimes times;
    results = run_on_cuda(data, backward, times);
  } else if (options.device == "cuda") {
    CpStats stats;
    results = run_cp_on_cuda(data, options.ranks, world.get(),
                             {parse_strategy(options.strategy), false, backward}, backward, 1,
                             Timeout(options.timeout_ms), stats);
    if (world && world->rank() != 0) return 0;  // rank 0 writes the file
  } else if (!world && options.ranks == 1) {
    results = allocate_results(data, DType::f32);
    delta_rule_forward(data.inputs(), results.outputs(), options.method);
    if (backward) delta_rule_backward(data.inputs(), results.grads(data), options.method);
  } else {
    if (options.method != Method::chunked)
      throw Error("--method recurrent runs on one rank: drop --ranks (or mpirun)");
    const CpOptions cp{parse_strategy(options.strategy), false, backward};
    CpStats stats;
    if (world) {
      results = run_context_parallel(*world, data, cp, backward, stats);
      if (world->rank() != 0) return 0;  // rank 0 writes the file
    } else {
      run_in_process(
          options.ranks,
          [&](Communicator& comm) {
            ProblemResults whole = run_context_parallel(comm, data, cp, backward, stats);
            if (comm.rank() == 0) results = std::move(whole);
          },
          Timeout(options.timeout_ms));
    }
  }

  for (HostTensor* t : {&results.o, &results.final_state, &results.dq, &results.dk, &results.dv,
                        &results.dg, &results.dbeta, &results.dh0})
    if (!t->bytes.empty() && t->dtype != DType::f32) *t = convert(*t, DType::f32);
  TensorMap out;
  out["o"] = std::move(results.o);
  out["final_state"] = std::move(results.final_state);
  if (backward) {
    out["dq"] = std::move(results.dq);
    out["dk"] = std::move(results.dk);
    out["dv"] = std::move(results.dv);
    out["dg"] = std::move(results.dg);
    out["dbeta"] = std::move(results.dbeta);
    if (!data.initial_state.bytes.empty()) out["dh0"] = std::move(results.dh0);
  }
  write_safetensors(options.output, out);
  const int ranks = world ? world->size() : options.ranks;
  fmt::print("gdn op: {} of B={} T={} HK={} HV={} K={} V={} ({} sequences) on {}{} -> {}: {}\n",
             backward ? "forward and backward" : "forward", data.q.shape[0], data.q.shape[1],
             data.q.shape[2], data.v.shape[2], data.q.shape[3], data.v.shape[3],
             data.cu_seqlens.bytes.empty() ? data.q.shape[0] : data.cu_seqlens.shape[0] - 1,
             options.device,
             ranks > 1 ? fmt::format(", {} ranks ({})", ranks, options.strategy) : std::string(),
             options.output, names_of(out));
  return 0;
}

}  // namespace gdn::app
