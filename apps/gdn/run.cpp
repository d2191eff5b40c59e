// gdn run: time the chunked op on a generated Qwen3.5-like problem, then check it against the
// float64 recurrence on one key head and its value heads.

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "context_parallel_job.h"
#include "cuda_job.h"
#include "gdn/error.h"
#include "report.h"

namespace gdn::app {
namespace {

// Forward FLOPs of the chunked path (spec 3), per chunk of C tokens and value head:
//   2 (C^2 K [K K^T] + C^2 K [W = A (beta e^G K)] + C^2 V [U] + C K V [W S] + C K V [Q S]
//      + C^2 K [Q K^T] + C^2 V [P Vn] + C K V [K^T Vn]) + C^3 / 3 [triangular solve].
// Backward counts as 3x forward: twice the forward's products, plus the forward it recomputes.
double forward_flops(const Problem& p) {
  const double C = static_cast<double>(std::min<std::int64_t>(p.chunk_size, p.T)),
               K = static_cast<double>(p.K), V = static_cast<double>(p.V);
  const double per_chunk = 2 * (3 * C * C * K + 2 * C * C * V + 3 * C * K * V) + C * C * C / 3;
  const std::vector<std::int64_t> lengths =
      p.seqlens.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(p.B), p.T) : p.seqlens;
  std::int64_t chunks = 0;
  for (std::int64_t length : lengths) chunks += (length - 1) / p.chunk_size + 1;
  return per_chunk * static_cast<double>(chunks * p.HV);
}

template <typename F>
double seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The first `count` entries along `axis` of a row-major tensor; "not given" stays not given.
HostTensor first(const HostTensor& t, std::size_t axis, std::int64_t count) {
  if (t.bytes.empty()) return {};
  std::vector<std::int64_t> shape = t.shape;
  shape[axis] = count;
  HostTensor out = HostTensor::zeros(t.dtype, shape);
  std::int64_t outer = 1, inner = static_cast<std::int64_t>(dtype_size(t.dtype));
  for (std::size_t i = 0; i < axis; ++i) outer *= t.shape[i];
  for (std::size_t i = axis + 1; i < t.shape.size(); ++i) inner *= t.shape[i];
  const auto from = static_cast<std::size_t>(t.shape[axis] * inner);
  const auto to = static_cast<std::size_t>(count * inner);
  for (std::size_t o = 0; o < static_cast<std::size_t>(outer); ++o)
    std::memcpy(out.bytes.data() + o * to, t.bytes.data() + o * from, to);
  return out;
}

struct Check {
  const char* name;
  double error;
};

// Relative Frobenius errors against the float64 recurrence on key head 0 and its HV/HK value
// heads: heads are independent (spec 1), so the slice's reference is exact for every output.
std::vector<Check> check_first_head(const Problem& p, const ProblemData& data,
                                    const ProblemResults& results) {
  const std::int64_t G = p.HV / p.HK;
  Problem slice_problem = p;
  slice_problem.HK = 1;
  slice_problem.HV = G;
  ProblemData slice;
  slice.q = first(data.q, 2, 1);
  slice.k = first(data.k, 2, 1);
  slice.v = first(data.v, 2, G);
  slice.g = first(data.g, 2, G);
  slice.beta = first(data.beta, 2, G);
  slice.initial_state = first(data.initial_state, 1, G);
  slice.cu_seqlens = data.cu_seqlens;
  slice.d_o = first(data.d_o, 2, G);
  slice.d_final_state = first(data.d_final_state, 1, G);
  slice.scale = data.scale;
  slice.use_qk_l2norm = data.use_qk_l2norm;
  slice.chunk_size = data.chunk_size;

  ProblemResults ref = allocate_results(slice_problem, DType::f64);
  delta_rule_forward(slice.inputs(), ref.outputs(), Method::recurrent);
  delta_rule_backward(slice.inputs(), ref.grads(slice), Method::recurrent);

  struct Compared {
    const char* name;
    const HostTensor& result;
    const HostTensor& reference;
    std::size_t head_axis;
    std::int64_t heads;
  };
  std::vector<Compared> compared = {{"o", results.o, ref.o, 2, G},
                                    {"final_state", results.final_state, ref.final_state, 1, G},
                                    {"dq", results.dq, ref.dq, 2, 1},
                                    {"dk", results.dk, ref.dk, 2, 1},
                                    {"dv", results.dv, ref.dv, 2, G},
                                    {"dg", results.dg, ref.dg, 2, G},
                                    {"dbeta", results.dbeta, ref.dbeta, 2, G}};
  if (p.initial_state) compared.push_back({"dh0", results.dh0, ref.dh0, 1, G});
  std::vector<Check> checks;
  for (const Compared& c : compared) {
    HostTensor result = first(c.result, c.head_axis, c.heads);
    checks.push_back({c.name, relative_error(result.ref(), c.reference.ref())});
  }
  return checks;
}

}  // namespace

void require_memory(const std::string& what, double bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  if (pages > 0 && page > 0 && bytes > memory)
    throw Error(fmt::format("{} needs {:.3g} bytes, more than this machine's memory ({:.3g} bytes)",
                            what, bytes, memory));
}

void check_ranks(int ranks, bool ranks_given, const std::string& strategy, bool strategy_given,
                 const Communicator* world) {
  if (world && ranks_given && ranks != world->size())
    throw Error(fmt::format(
        "--ranks {} disagrees with mpirun's {} processes: under mpirun each process is a rank "
        "(drop --ranks, or run mpirun -np {})",
        ranks, world->size(), ranks));
  if (!world && ranks == 1 && strategy_given)
    throw Error(fmt::format(
        "--strategy {} has no effect on one rank: give --ranks P with P > 1 (or run under "
        "mpirun), or drop --strategy",
        strategy));
}

void add_run_options(CLI::App& command, RunOptions& options) {
  Problem& p = options.problem;
  p.T = 2048;  // forward + backward in a few seconds on 2 cores
  options.threads = omp_get_max_threads();
  command.add_option("-B,--batch", p.B, "Batch size B")->check(kPositive);
  command.add_option("-T,--seq-len", p.T, "Tokens per sequence T")->check(kPositive);
  command.add_option("--heads-k", p.HK, "Query and key heads HK")->check(kPositive);
  command.add_option("--heads-v", p.HV, "Value heads HV, a multiple of HK")->check(kPositive);
  command.add_option("--dim-k", p.K, "Query and key head dimension K")->check(kPositive);
  command.add_option("--dim-v", p.V, "Value head dimension V")->check(kPositive);
  command.add_option("--chunk", p.chunk_size, "Chunk size C of the chunked path")->check(kPositive);
  add_choice(command, "--dtype", p.dtype,
             {{"f32", DType::f32}, {"bf16", DType::bf16}, {"f16", DType::f16}},
             "Storage dtype of q, k, v, beta, dO and the results (default f32)");
  command.add_option("--seed", p.seed, "Seed of the generated inputs");
  command.add_flag_callback(
      "--no-l2norm", [&p] { p.use_qk_l2norm = false; },
      "Generate unit-norm q, k instead of normalizing them in the op");
  command.add_flag("--initial-state", p.initial_state,
                   "Start from a random initial state (adds dh0 to the check)");
  command.add_option("--threads", options.threads, "OpenMP threads (default: all cores)")
      ->check(kPositive);
  add_ranks_options(command, options, true);
  command
      .add_option("--device", options.device,
                  "cpu, or cuda: the op on the GPU (bf16 inputs unless --dtype f16), then with "
                  "--ranks context parallel on GPUs: one per rank when there are as many, else "
                  "virtual ranks sharing one (under mpirun: a GPU per process)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  command.add_flag("--layer", options.layer,
                   "The whole Qwen3.5 GatedDeltaNet layer (f32 on the CPU, random weights, conv "
                   "kernel 4) instead of the op: -B, -T, --chunk, --seed and the heads and dims "
                   "options shape it; the single rank is checked against the layer's float64 "
                   "recurrence on batch 0's first tokens (the strategies against the single "
                   "rank); --dtype bf16|f16, --no-l2norm, --initial-state and --device cuda are "
                   "errors");
  command.add_option("--hidden", options.hidden, "The layer's hidden size (with --layer)")
      ->check(kPositive);
  command.add_flag("--json", options.json,
                   "Print one JSON document on stdout instead of the text: the problem, the "
                   "single-rank pass, each strategy's row (strategy, ranks, times, bytes, error, "
                   "verdict), the strategy auto picks, the checks against the float64 "
                   "recurrence and \"ok\"");
  command.footer(
      "Times one forward and one backward call of the chunked path, then checks outputs, final "
      "state and gradients of key head 0 against the float64 recurrence. GFLOP/s counts forward "
      "FLOPs x3 for backward. Exits 1 when the largest relative error exceeds 1e-4 (f32) or 2e-2 "
      "(bf16, f16). Then (unless --ranks 1) it runs the context-parallel strategy (or all of them) "
      "on shards of the same problem and prints their times, the bytes each rank sent and the "
      "error against the single-rank result, and which strategy auto picks (the cost model). "
      "Steps still running after 2 s say so on stderr (the environment's GDN_PROGRESS_MS sets the "
      "delay; 0: every step).");
}

namespace {

// One strategy's context-parallel run: stats of the slowest rank and the whole results (on the
// printing rank).
using StrategyRun = std::function<void(Strategy, CpStats&, ProblemResults&)>;

// Each strategy over the ranks, against the single-rank results; true when all are within
// tolerance. Under mpirun only rank 0 prints. With --strategy all, says which one auto picks.
bool run_strategies(const RunOptions& options, Communicator* world, const ProblemResults& single,
                    double tolerance, const std::string& where, Memory memory,
                    const StrategyRun& run_one, Report& report) {
  std::vector<Strategy> strategies;
  if (options.strategy == "all")
    strategies = all_strategies();
  else
    strategies = {parse_strategy(options.strategy)};
  const int ranks = world ? world->size() : options.ranks;
  const double tokens = static_cast<double>(options.problem.B * options.problem.T);
  // In-process ranks share the threads (cpu_strategy_run); mpirun's processes have them each.
  const int threads = world ? options.threads : std::max(1, options.threads / ranks);
  const Strategy automatic = automatic_choice(
      options.problem, ranks, world ? world->ranks_on_host() : ranks, memory, threads, true);
  report.text("\ncontext parallel over {} {}:\n{:<19}{:>10}{:>14}{:>14}{:>14}{:>13}\n", ranks,
              where, "strategy", "fwd (ms)", "fwd+bwd (ms)", "tokens/s", "sent/rank MB", "error");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  bool ok = true;
  for (Strategy strategy : strategies) {
    if (strategy == Strategy::ulysses &&
        (options.problem.HK % ranks != 0 || options.problem.HV % ranks != 0)) {
      report.text("{:<19}(needs HK and HV divisible by {})\n", "ulysses", ranks);
      rows.push_back({{"strategy", "ulysses"},
                      {"ranks", ranks},
                      {"skipped", fmt::format("needs HK and HV divisible by {}", ranks)}});
      continue;
    }
    CpStats stats;
    ProblemResults cp;
    {
      const Progress progress(
          report, fmt::format("running strategy {} on {} ranks", strategy_name(strategy), ranks));
      run_one(strategy, stats, cp);
    }
    if (!report.printer()) continue;
    double error = 0;
    for (auto field : {&ProblemResults::o, &ProblemResults::final_state, &ProblemResults::dq,
                       &ProblemResults::dk, &ProblemResults::dv, &ProblemResults::dg,
                       &ProblemResults::dbeta, &ProblemResults::dh0})
      if (!(single.*field).bytes.empty()) {
        const double e = relative_error((cp.*field).ref(), (single.*field).ref());
        if (std::isnan(e) || e > error) error = e;  // NaN sticks and fails
      }
    const bool row_ok = error <= tolerance;
    ok = ok && row_ok;
    const std::string name = strategy == stats.strategy
                                 ? std::string(strategy_name(strategy))
                                 : fmt::format("auto: {}", strategy_name(stats.strategy));
    report.text("{:<19}{:>10.3f}{:>14.3f}{:>14.0f}{:>14.2f}{:>13.2e}\n", name,
                stats.forward_seconds * 1e3, stats.total_seconds * 1e3,
                tokens / stats.total_seconds, static_cast<double>(stats.bytes_sent) * 1e-6, error);
    nlohmann::ordered_json row = {{"strategy", strategy_name(stats.strategy)},
                                  {"ranks", ranks},
                                  {"forward_ms", stats.forward_seconds * 1e3},
                                  {"forward_backward_ms", stats.total_seconds * 1e3},
                                  {"tokens_per_s", tokens / stats.total_seconds},
                                  {"sent_per_rank_bytes", stats.bytes_sent},
                                  {"error", error},
                                  {"ok", row_ok}};
    if (strategy != stats.strategy) row["requested"] = strategy_name(strategy);
    rows.push_back(std::move(row));
  }
  if (options.strategy == "all")
    report.text("auto (the cost model) picks {} here\n", strategy_name(automatic));
  report.doc()["context_parallel"] = {{"ranks", ranks},
                                      {"on", where},
                                      {"requested", options.strategy},
                                      {"auto", strategy_name(automatic)},
                                      {"reference", "the single-rank results"},
                                      {"tolerance", tolerance},
                                      {"rows", std::move(rows)}};
  return ok;
}

// On the CPU: in-process ranks (or the MPI processes).
StrategyRun cpu_strategy_run(const RunOptions& options, Communicator* world,
                             const ProblemData& data) {
  return [&options, world, &data](Strategy strategy, CpStats& stats, ProblemResults& cp) {
    const auto job = [&](Communicator& comm) {
      CpStats mine;
      ProblemResults whole = run_context_parallel(comm, data, {strategy, false, true}, true, mine);
      if (comm.rank() == 0) stats = mine, cp = std::move(whole);
    };
    if (world) {
      job(*world);
    } else {
      run_in_process(
          options.ranks,
          [&](Communicator& comm) {
            omp_set_num_threads(std::max(1, options.threads / options.ranks));
            job(comm);
          },
          Timeout(options.timeout_ms));
    }
  };
}

// On GPUs (run_cp_on_cuda), the training path: the forward keeps its states for the backward.
StrategyRun cuda_strategy_run(const RunOptions& options, Communicator* world,
                              const ProblemData& data) {
  return [&options, world, &data](Strategy strategy, CpStats& stats, ProblemResults& cp) {
    cp = run_cp_on_cuda(data, options.ranks, world, {strategy, false, true}, true, 3,
                        Timeout(options.timeout_ms), stats);
  };
}

// The single-rank passes' times, in text (GFLOP/s, or TFLOP/s on the GPU) and in the document's
// "single_rank".
void report_passes(const Problem& p, double forward_ms, double backward_ms, bool gpu,
                   Report& report) {
  const double flops = forward_flops(p), tokens = static_cast<double>(p.B * p.T);
  report.text("\n{:<18}{:>12}{:>14}{:>12}\n", "pass", "time (ms)", "tokens/s",
              gpu ? "TFLOP/s" : "GFLOP/s");
  nlohmann::ordered_json passes = nlohmann::ordered_json::object();
  for (const auto& [pass, key, ms, pass_flops] :
       {std::tuple{"forward", "forward", forward_ms, flops},
        std::tuple{"backward", "backward", backward_ms, 3 * flops},
        std::tuple{"forward+backward", "forward_backward", forward_ms + backward_ms, 4 * flops}}) {
    const double gflops = pass_flops / ms * 1e-6;
    report.text("{:<18}{:>12.{}f}{:>14.0f}{:>12.2f}\n", pass, ms, gpu ? 3 : 1, tokens / ms * 1e3,
                gpu ? gflops * 1e-3 : gflops);
    passes[key] = {{"ms", ms}, {"tokens_per_s", tokens / ms * 1e3}, {"gflop_per_s", gflops}};
  }
  report.doc()["single_rank"] = std::move(passes);
}

// The single-rank pass: times forward and backward.
void run_single_rank(const Problem& p, ProblemData& data, ProblemResults& results, Report& report) {
  const Progress progress(report, "running forward and backward on one rank");
  const double forward = seconds([&] { delta_rule_forward(data.inputs(), results.outputs()); });
  const double backward = seconds([&] { delta_rule_backward(data.inputs(), results.grads(data)); });
  report_passes(p, forward * 1e3, backward * 1e3, false, report);
  report.text("(GFLOP/s counts forward FLOPs x3 for backward)\n");
}

// Checks key head 0 of the single-rank results against the float64 recurrence and reports the
// errors; true when within tolerance. Run after the last collective call: only one rank does it.
bool check_single_rank(const Problem& p, const ProblemData& data, const ProblemResults& results,
                       double tolerance, Report& report) {
  std::vector<Check> checks;
  {
    const Progress progress(report, "checking key head 0 against the float64 recurrence");
    checks = check_first_head(p, data, results);
  }
  report.text("\nrelative error against the float64 recurrence, key head 0 and value heads 0-{}:\n",
              p.HV / p.HK - 1);
  double max_error = 0;
  nlohmann::ordered_json errors = nlohmann::ordered_json::object();
  for (const Check& c : checks) {
    report.text("  {:<14}{:.2e}\n", c.name, c.error);
    errors[c.name] = c.error;
    if (std::isnan(c.error) || c.error > max_error) max_error = c.error;  // NaN sticks and fails
  }
  const bool ok = max_error <= tolerance;
  report.text("  {:<14}{:.2e}  (tolerance {:.0e}: {})\n", "max", max_error, tolerance,
              ok ? "ok" : "FAILED");
  report.doc()["check"] = {{"against", "the float64 recurrence"},
                           {"key_head", 0},
                           {"value_heads", {0, p.HV / p.HK - 1}},
                           {"errors", std::move(errors)},
                           {"max_error", max_error},
                           {"tolerance", tolerance},
                           {"ok", ok}};
  return ok;
}

// The document's "problem" (the layer adds its own fields).
nlohmann::ordered_json problem_json(const Problem& p) {
  return {{"B", p.B},
          {"T", p.T},
          {"HK", p.HK},
          {"HV", p.HV},
          {"K", p.K},
          {"V", p.V},
          {"dtype", dtype_name(p.dtype)},
          {"chunk", p.chunk_size},
          {"l2norm", p.use_qk_l2norm},
          {"initial_state", p.initial_state},
          {"seed", p.seed}};
}

// The op on the GPU: forward and backward timed by CUDA events after a warm-up, checked like the
// single-rank pass (bf16 tolerance); then, with ranks, context parallel on GPUs against it.
bool run_cuda(const RunOptions& options, Communicator* world, Report& report) {
  Problem p = options.problem;
  if (p.dtype == DType::f32) p.dtype = DType::bf16;
  report.text("gdn run --device cuda: B={} T={} HK={} HV={} K={} V={}, {}, chunk {}, seed {}\n",
              p.B, p.T, p.HK, p.HV, p.K, p.V, dtype_name(p.dtype), p.chunk_size, p.seed);
  report.doc()["problem"] = problem_json(p);
  ProblemData data;
  {
    const Progress progress(report, "generating the problem");
    data = generate(p);
  }
  CudaTimes times;
  ProblemResults results;
  {
    const Progress progress(report, "running forward and backward on the GPU");
    results = run_on_cuda(data, true, times);
  }
  report_passes(p, times.forward_ms, times.backward_ms, true, report);
  bool ok = true;
  if (world || options.ranks > 1) {
    const std::string where = world                             ? "MPI processes, a GPU each"
                              : one_gpu_per_rank(options.ranks) ? "GPUs (NCCL)"
                                                                : "virtual ranks on one GPU";
    // Against the single-GPU op: within its bf16 tolerance (test_cuda_cp says why not bitwise).
    ok = run_strategies(options, world, results, 2e-2, where, Memory::device,
                        cuda_strategy_run(options, world, data), report) &&
         ok;
  }
  if (report.printer()) ok = check_single_rank(p, data, results, 2e-2, report) && ok;
  return ok;
}

}  // namespace

int run(const RunOptions& options) {
  const Problem& p = options.problem;
  omp_set_num_threads(options.threads);
  std::unique_ptr<Communicator> world =
      launched_by_mpirun() ? mpi_world(Timeout(options.timeout_ms)) : nullptr;
  check_ranks(options, world.get());
  Report report(options.json, !world || world->rank() == 0);
  report.doc()["command"] = options.layer ? "run --layer" : "run";
  report.doc()["version"] = GDN_VERSION;
  report.doc()["device"] = options.device;
  report.doc()["threads"] = options.threads;
  report.doc()["processes"] = world ? world->size() : 1;
  const auto finish = [&](bool ok) {
    report.finish(ok);
    return ok ? 0 : 1;
  };
  if (options.layer) return finish(run_layer_job(options, world.get(), report));
  if (options.device == "cuda") {
    require_cuda_gpu();
    return finish(run_cuda(options, world.get(), report));
  }
  report.text(
      "gdn run: B={} T={} HK={} HV={} K={} V={}, {}, chunk {}, l2norm {}, seed {}, threads {}\n",
      p.B, p.T, p.HK, p.HV, p.K, p.V, dtype_name(p.dtype), p.chunk_size,
      p.use_qk_l2norm ? "on" : "off", p.seed, options.threads);
  report.doc()["problem"] = problem_json(p);

  // Inputs q k v g beta dO and results o dq dk dv dg dbeta, of the storage dtype (g in f32).
  const double elements = static_cast<double>(p.B) * static_cast<double>(p.T) *
                          static_cast<double>(4 * p.HK * p.K + 4 * p.HV * p.V + 5 * p.HV);
  require_memory(fmt::format("gdn run -B {} -T {} --heads-k {} --heads-v {} --dim-k {} --dim-v {} "
                             "(the problem's inputs and results)",
                             p.B, p.T, p.HK, p.HV, p.K, p.V),
                 elements * static_cast<double>(std::max<std::size_t>(dtype_size(p.dtype), 4)));
  ProblemData data;
  {
    const Progress progress(report, "generating the problem");
    data = generate(p);
  }
  ProblemResults results = allocate_results(p, p.dtype);
  const double tolerance = p.dtype == DType::f32 ? 1e-4 : 2e-2;
  // Under mpirun every rank runs the single-rank pass, and only after the last collective call
  // does rank 0 run the float64 check: no rank waits in a collective while another works alone.
  run_single_rank(p, data, results, report);
  bool ok = true;
  if (world || options.ranks > 1)
    ok = run_strategies(options, world.get(), results, tolerance,
                        world ? "MPI processes" : "in-process ranks", Memory::host,
                        cpu_strategy_run(options, world.get(), data), report);
  if (report.printer()) ok = check_single_rank(p, data, results, tolerance, report) && ok;
  if (!ok && report.printer())
    fmt::print(stderr, "gdn: error: a relative error exceeds the tolerance {:.0e}\n", tolerance);
  return finish(ok);
}

}  // namespace gdn::app
