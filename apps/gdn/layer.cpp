// gdn layer: the Qwen3.5 GatedDeltaNet layer on a real-format checkpoint and input file; and the
// layer part of gdn run (random Qwen3.5-9B-shaped weights, single rank and context parallel).

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "context_parallel_job.h"
#include "gdn/error.h"
#include "gdn/layer_weights.h"
#include "gdn/safetensors.h"
#include "report.h"

namespace gdn::app {
namespace {

HostTensor to_f32(const HostTensor& t) {
  return t.bytes.empty() || t.dtype == DType::f32 ? t : convert(t, DType::f32);
}

TensorRef ref_or_none(const HostTensor& t) {
  return t.bytes.empty() ? TensorRef{} : t.ref();
}

struct LayerRun {
  HostTensor out, dx;
  LayerWeights grads;
  double forward_seconds = 0, total_seconds = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The layer on one rank (comm null) or on this rank's shard of x, mask and d_out; returns the
// whole output and dx (gathered) and the parameter gradients (summed over ranks).
LayerRun run_layer(Communicator* comm, const CpOptions& cp, const LayerConfig& config,
                   const LayerWeights& weights, const HostTensor& x, const HostTensor& mask,
                   const HostTensor& d_out, LayerOptions options = {}) {
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  const std::int64_t T = x.shape[1];
  if (T % ranks != 0)
    throw Error(fmt::format("T = {} must be divisible by the ranks ({})", T, ranks));
  const std::int64_t Tl = T / ranks;
  const HostTensor xs = slice_tokens(x, rank * Tl, Tl), masks = slice_tokens(mask, rank * Tl, Tl);
  const HostTensor d_outs = slice_tokens(d_out, rank * Tl, Tl);
  GatedDeltaNet layer = comm ? GatedDeltaNet(*comm, cp, config, view(weights), options)
                             : GatedDeltaNet(config, view(weights), options);
  LayerRun r;
  HostTensor out = HostTensor::zeros(x.dtype, xs.shape), dx = out;
  r.grads = allocate_parameters(config, x.dtype);
  if (comm) comm->barrier();
  const auto start = std::chrono::steady_clock::now();
  layer.forward(xs.ref(), ref_or_none(masks), out.ref());
  r.forward_seconds = seconds_since(start);
  if (!d_out.bytes.empty())
    layer.backward(xs.ref(), ref_or_none(masks), d_outs.ref(), dx.ref(), view(r.grads));
  r.total_seconds = seconds_since(start);
  if (!comm) {
    r.out = std::move(out);
    r.dx = std::move(dx);
    return r;
  }
  r.forward_seconds = slowest(*comm, r.forward_seconds);
  r.total_seconds = slowest(*comm, r.total_seconds);
  r.out = gather_tokens(*comm, out, T);
  r.dx = gather_tokens(*comm, dx, T);
  return r;
}

// Runs the layer on one rank, or over the in-process ranks / mpirun's processes; rank 0's view.
LayerRun run_anywhere(int ranks, int threads, Timeout timeout, const CpOptions& cp,
                      const LayerConfig& config, const LayerWeights& weights, const HostTensor& x,
                      const HostTensor& mask, const HostTensor& d_out, Communicator* world,
                      LayerOptions options = {}) {
  if (world) return run_layer(world, cp, config, weights, x, mask, d_out, options);
  if (ranks == 1) return run_layer(nullptr, cp, config, weights, x, mask, d_out, options);
  LayerRun result;
  run_in_process(
      ranks,
      [&](Communicator& comm) {
        omp_set_num_threads(std::max(1, threads / ranks));
        LayerRun mine = run_layer(&comm, cp, config, weights, x, mask, d_out, options);
        if (comm.rank() == 0) result = std::move(mine);
      },
      timeout);
  return result;
}

// hidden_states [B, T, hidden], attention_mask [B, T] and grad_output [B, T, hidden] (when
// given), checked whole before anything cuts them by token.
void check_layer_inputs(const std::string& file, const LayerConfig& config, const HostTensor& x,
                        const HostTensor& mask, const HostTensor& d_out) {
  const auto expect = [&](const char* name, const HostTensor& t,
                          const std::vector<std::int64_t>& shape, const char* layout) {
    if (t.shape != shape)
      throw Error(fmt::format("{}: {} must have shape {} = {}, got {}", file, name, layout,
                              TensorRef{nullptr, t.dtype, shape}.shape_string(),
                              t.ref().shape_string()));
  };
  if (x.shape.size() != 3 || x.shape[0] < 1 || x.shape[1] < 1)
    throw Error(
        fmt::format("{}: hidden_states must have shape [B, T, hidden] with B, T >= 1, got {}", file,
                    x.ref().shape_string()));
  const std::int64_t B = x.shape[0], T = x.shape[1];
  expect("hidden_states", x, {B, T, config.hidden_size}, "[B, T, hidden]");
  const auto given = [](const HostTensor& t) { return !t.shape.empty() || !t.bytes.empty(); };
  if (given(mask)) expect("attention_mask", mask, {B, T}, "[B, T]");
  if (given(d_out)) expect("grad_output", d_out, {B, T, config.hidden_size}, "[B, T, hidden]");
}

// Batch 0's first `count` tokens of a [B, T, ...] tensor, as [1, count, ...] in `dtype`.
HostTensor prefix(const HostTensor& t, std::int64_t count, DType dtype) {
  HostTensor first_batch = slice_tokens(t, 0, count);
  first_batch.shape[0] = 1;
  first_batch.bytes.resize(first_batch.bytes.size() / static_cast<std::size_t>(t.shape[0]));
  return convert(first_batch, dtype);
}

// gdn run --layer runs the layer as transformers has it: f32 on the CPU, q and k normalized, a
// zero initial state. The options that would change that are errors, not ignored.
void reject_layer_run_options(const RunOptions& options) {
  const Problem& p = options.problem;
  const auto reject = [](const std::string& option, const char* why) {
    throw Error(fmt::format("gdn run --layer: {} is not supported ({})", option, why));
  };
  if (options.device != "cpu")
    reject("--device " + options.device, "the layer runs on the CPU only");
  if (p.dtype != DType::f32)
    reject(fmt::format("--dtype {}", dtype_name(p.dtype)), "the layer runs in f32");
  if (!p.use_qk_l2norm)
    reject("--no-l2norm", "the layer always L2-normalizes q and k, as transformers' does");
  if (p.initial_state)
    reject("--initial-state", "the layer starts from a zero state: it takes no cache");
}

// The single-rank layer against its float64 recurrence (LayerOptions::method = recurrent, the
// weights in f64) on batch 0's first tokens: the layer is causal, so the prefix is a problem of
// its own. The output is the timed run's; the gradients come from an f32 run on the prefix (the
// timed run's depend on d_out past it). Reports the errors; true when within 1e-4.
bool check_layer_single_rank(const LayerConfig& config, const LayerWeights& weights,
                             const HostTensor& x, const HostTensor& d_out, const LayerRun& timed,
                             int chunk_size, Report& report) {
  const Progress progress(report, "checking the layer against its float64 recurrence");
  const std::int64_t T = x.shape[1];
  const std::int64_t tokens =
      std::min(T, std::max<std::int64_t>(128, 2 * std::min<std::int64_t>(chunk_size, T)));
  LayerWeights weights64 = weights;
  for_each_parameter(weights64, [](const char*, HostTensor& w) { w = convert(w, DType::f64); });
  const LayerRun ref = run_layer(nullptr, {}, config, weights64, prefix(x, tokens, DType::f64), {},
                                 prefix(d_out, tokens, DType::f64), {.method = Method::recurrent});
  const LayerRun f32 = run_layer(nullptr, {}, config, weights, prefix(x, tokens, DType::f32), {},
                                 prefix(d_out, tokens, DType::f32), {.chunk_size = chunk_size});
  const auto error = [](const HostTensor& t, const HostTensor& r) {
    return relative_error(convert(t, DType::f64).ref(), r.ref());
  };
  std::vector<std::pair<std::string, double>> checks = {
      {"output", error(prefix(timed.out, tokens, DType::f32), ref.out)},
      {"grad.hidden_states", error(f32.dx, ref.dx)}};
  LayerWeights grads = f32.grads, ref_grads = ref.grads;
  std::vector<HostTensor*> refs;
  for_each_parameter(ref_grads, [&](const char*, HostTensor& g) { refs.push_back(&g); });
  std::size_t i = 0;
  for_each_parameter(grads, [&](const char* name, HostTensor& g) {
    checks.emplace_back(fmt::format("grad.{}", name), error(g, *refs[i++]));
  });
  report.text(
      "\nrelative error of the single rank against the layer's float64 recurrence, batch 0, "
      "tokens 0-{} (gradients: an f32 run on those tokens):\n",
      tokens - 1);
  double max_error = 0;
  nlohmann::ordered_json errors = nlohmann::ordered_json::object();
  for (const auto& [name, e] : checks) {
    report.text("  {:<26}{:.2e}\n", name, e);
    errors[name] = e;
    if (std::isnan(e) || e > max_error) max_error = e;  // NaN sticks and fails
  }
  const bool ok = max_error <= 1e-4;
  report.text("  {:<26}{:.2e}  (tolerance 1e-04: {})\n", "max", max_error, ok ? "ok" : "FAILED");
  report.doc()["check"] = {{"against", "the layer's float64 recurrence"},
                           {"batch", 0},
                           {"tokens", {0, tokens - 1}},
                           {"gradients_from", "an f32 run on those tokens"},
                           {"errors", std::move(errors)},
                           {"max_error", max_error},
                           {"tolerance", 1e-4},
                           {"ok", ok}};
  return ok;
}

}  // namespace

void add_layer_options(CLI::App& command, LayerCommandOptions& options) {
  command.add_option("--config", options.config, "config.json (or a directory holding one)")
      ->required();
  command
      .add_option("--weights", options.weights,
                  "A .safetensors file, a model.safetensors.index.json, or a directory")
      ->required();
  command.add_option("--prefix", options.prefix,
                     "Key prefix of the layer's tensors, e.g. model.layers.0.linear_attn.");
  command
      .add_option("--input", options.input,
                  "safetensors with hidden_states [B, T, hidden], optionally attention_mask "
                  "[B, T] and grad_output [B, T, hidden]")
      ->required();
  command
      .add_option("--output", options.output,
                  "safetensors to write: output and, with grad_output, grad.hidden_states and "
                  "grad.<parameter> for every parameter (f32)")
      ->required();
  add_ranks_options(command, options, false);
}

int layer(const LayerCommandOptions& options) {
  std::unique_ptr<Communicator> world =
      launched_by_mpirun() ? mpi_world(Timeout(options.timeout_ms)) : nullptr;
  check_ranks(options, world.get());
  const LayerConfig config = load_layer_config(options.config);
  const LayerWeights weights = load_layer_weights(options.weights, config, options.prefix);
  const SafetensorsFile in(options.input);  // names first: tensors are read below
  for (const auto& [name, entry] : in.entries())
    if (name != "hidden_states" && name != "attention_mask" && name != "grad_output")
      throw Error(
          fmt::format("{}: unexpected tensor \"{}\" (expected hidden_states and "
                      "optionally attention_mask, grad_output)",
                      options.input, name));
  if (!in.contains("hidden_states"))
    throw Error(fmt::format("{}: missing tensor \"hidden_states\"", options.input));
  const auto take = [&](const char* name) {
    return in.contains(name) ? to_f32(in.read(name)) : HostTensor{};
  };
  const HostTensor x = take("hidden_states"), mask = take("attention_mask");
  const HostTensor d_out = take("grad_output");
  check_layer_inputs(options.input, config, x, mask, d_out);

  LayerRun r = run_anywhere(options.ranks, omp_get_max_threads(), Timeout(options.timeout_ms),
                            {parse_strategy(options.strategy), false, !d_out.bytes.empty()}, config,
                            weights, x, mask, d_out, world.get());
  if (world && world->rank() != 0) return 0;
  TensorMap out;
  out["output"] = std::move(r.out);
  if (!d_out.bytes.empty()) {
    out["grad.hidden_states"] = std::move(r.dx);
    for_each_parameter(r.grads, [&](const std::string& name, HostTensor& g) {
      out["grad." + name] = std::move(g);
    });
  }
  const std::size_t written = out.size();
  write_safetensors(options.output, out);
  fmt::print("gdn layer: {} of hidden_states {} on {} rank{} -> {}: output{}\n",
             d_out.bytes.empty() ? "forward" : "forward and backward", x.ref().shape_string(),
             world ? world->size() : options.ranks,
             (world ? world->size() : options.ranks) > 1 ? "s" : "", options.output,
             written > 1
                 ? fmt::format(", grad.hidden_states and {} parameter gradients", written - 2)
                 : std::string());
  return 0;
}

bool run_layer_job(const RunOptions& options, Communicator* world, Report& report) {
  reject_layer_run_options(options);
  const Problem& p = options.problem;
  const LayerOptions layer_options{.chunk_size = p.chunk_size};
  const LayerConfig config{.hidden_size = options.hidden,
                           .linear_num_key_heads = p.HK,
                           .linear_num_value_heads = p.HV,
                           .linear_key_head_dim = p.K,
                           .linear_value_head_dim = p.V,
                           .linear_conv_kernel_dim = 4};
  // Weights and their gradients; x, dO, out, dx and about 12 activations of the layer's width.
  const double width = static_cast<double>(config.conv_dim() + 2 * config.value_dim());
  require_memory(
      fmt::format("gdn run --layer --hidden {} -B {} -T {} (the layer's weights and activations)",
                  options.hidden, p.B, p.T),
      4 * (2 * width * static_cast<double>(options.hidden) +
           static_cast<double>(p.B) * static_cast<double>(p.T) *
               (4 * static_cast<double>(options.hidden) + 12 * width)));
  const LayerWeights weights = random_parameters(config, DType::f32, p.seed);
  HostTensor x = HostTensor::zeros(DType::f32, {p.B, p.T, options.hidden}), d_out = x;
  std::mt19937_64 rng(p.seed + 1);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < d_out.numel(); ++i) d_out.as<float>()[i] = normal(rng);
  const double tokens = static_cast<double>(p.B * p.T);
  report.text(
      "gdn run --layer: B={} T={} hidden={} HK={} HV={} K={} V={} conv 4, f32, chunk {}, "
      "random weights (seed {})\n\n{:<26}{:>10}{:>14}{:>14}{:>13}\n",
      p.B, p.T, options.hidden, p.HK, p.HV, p.K, p.V, p.chunk_size, p.seed, "layer", "fwd (ms)",
      "fwd+bwd (ms)", "tokens/s", "error");
  report.doc()["problem"] = {{"B", p.B},
                             {"T", p.T},
                             {"hidden", options.hidden},
                             {"HK", p.HK},
                             {"HV", p.HV},
                             {"K", p.K},
                             {"V", p.V},
                             {"conv", 4},
                             {"dtype", "f32"},
                             {"chunk", p.chunk_size},
                             {"weights", "random"},
                             {"seed", p.seed}};
  // Under mpirun every rank runs the single-rank pass too: no rank may wait in a collective call
  // while another works alone.
  LayerRun single;
  {
    const Progress progress(report, "running the layer forward and backward on one rank");
    single = run_layer(nullptr, {}, config, weights, x, {}, d_out, layer_options);
  }
  report.text("{:<26}{:>10.1f}{:>14.1f}{:>14.0f}{:>13}\n", "single rank",
              single.forward_seconds * 1e3, single.total_seconds * 1e3,
              tokens / single.total_seconds, "-");
  report.doc()["single_rank"] = {
      {"forward",
       {{"ms", single.forward_seconds * 1e3}, {"tokens_per_s", tokens / single.forward_seconds}}},
      {"forward_backward",
       {{"ms", single.total_seconds * 1e3}, {"tokens_per_s", tokens / single.total_seconds}}}};
  // Each strategy against the single-rank results; then, after the last collective call, rank 0
  // checks the single rank against the float64 recurrence.
  std::vector<Strategy> strategies = options.strategy == "all"
                                         ? all_strategies()
                                         : std::vector<Strategy>{parse_strategy(options.strategy)};
  if (!world && options.ranks == 1) strategies.clear();
  const int ranks = world ? world->size() : options.ranks;
  // The layer's op runs on shards of the same shape: auto's pick is the model's for the problem.
  const Strategy automatic =
      automatic_choice(p, ranks, world ? world->ranks_on_host() : ranks, Memory::host,
                       world ? options.threads : std::max(1, options.threads / ranks), true);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  bool ok = true;
  for (Strategy s : strategies) {
    if (s == Strategy::ulysses && (p.HK % ranks != 0 || p.HV % ranks != 0)) {
      report.text("{:<26}(needs HK and HV divisible by {})\n", "ulysses", ranks);
      rows.push_back({{"strategy", "ulysses"},
                      {"ranks", ranks},
                      {"skipped", fmt::format("needs HK and HV divisible by {}", ranks)}});
      continue;
    }
    LayerRun cp;
    {
      const Progress progress(report, fmt::format("running the layer with strategy {} on {} ranks",
                                                  strategy_name(s), ranks));
      cp = run_anywhere(options.ranks, options.threads, Timeout(options.timeout_ms),
                        {s, false, true}, config, weights, x, {}, d_out, world, layer_options);
    }
    if (!report.printer()) continue;
    double error = std::max(relative_error(cp.out.ref(), single.out.ref()),
                            relative_error(cp.dx.ref(), single.dx.ref()));
    LayerParams a = view(cp.grads), b = view(single.grads);
    std::vector<TensorRef> mine, theirs;
    for_each_parameter(a, [&](const char*, TensorRef& t) { mine.push_back(t); });
    for_each_parameter(b, [&](const char*, TensorRef& t) { theirs.push_back(t); });
    for (std::size_t i = 0; i < mine.size(); ++i)
      error = std::max(error, relative_error(mine[i], theirs[i]));
    ok = ok && error <= 1e-4;
    const Strategy used = s == Strategy::automatic ? automatic : s;
    report.text("{:<26}{:>10.1f}{:>14.1f}{:>14.0f}{:>13.2e}\n",
                fmt::format("{}{} x {}", s == Strategy::automatic ? "auto: " : "",
                            strategy_name(used), ranks),
                cp.forward_seconds * 1e3, cp.total_seconds * 1e3, tokens / cp.total_seconds, error);
    nlohmann::ordered_json row = {{"strategy", strategy_name(used)},
                                  {"ranks", ranks},
                                  {"forward_ms", cp.forward_seconds * 1e3},
                                  {"forward_backward_ms", cp.total_seconds * 1e3},
                                  {"tokens_per_s", tokens / cp.total_seconds},
                                  {"error", error},
                                  {"ok", error <= 1e-4}};
    if (s == Strategy::automatic) row["requested"] = "auto";
    rows.push_back(std::move(row));
  }
  if (!strategies.empty()) {
    if (options.strategy == "all")
      report.text("auto (the cost model) picks {} here\n", strategy_name(automatic));
    report.doc()["context_parallel"] = {{"ranks", ranks},
                                        {"on", world ? "MPI processes" : "in-process ranks"},
                                        {"requested", options.strategy},
                                        {"auto", strategy_name(automatic)},
                                        {"reference", "the single-rank results"},
                                        {"tolerance", 1e-4},
                                        {"rows", std::move(rows)}};
  }
  if (report.printer())
    ok = check_layer_single_rank(config, weights, x, d_out, single, p.chunk_size, report) && ok;
  return ok;
}

}  // namespace gdn::app
