#pragma once
// The tool's subcommands: each declares its options on a CLI11 subcommand and runs from a plain
// options struct. Commands print for the user and return the exit status; gdn::Error propagates
// to main.

#include <charconv>
#include <cstdint>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "gdn/communicator.h"
#include "gdn/context_parallel.h"
#include "gdn/delta_rule.h"
#include "gdn/problem.h"

namespace gdn::app {

// Positive integers, in words (CLI11's PositiveNumber says "Value 0 not in range 0.000000 to
// 1797693...").
inline const CLI::Validator kPositive(
    [](std::string& value) {
      std::int64_t parsed = 0;
      const char* end = value.data() + value.size();
      const auto [at, error] = std::from_chars(value.data(), end, parsed);
      if (error != std::errc{} || at != end || parsed < 1)
        return fmt::format("must be a positive integer, got {}", value);
      return std::string();
    },
    "", "positive");

// An option naming one of `choices`; help and errors list the names (CLI11's enum mapping would
// show the enum's integers).
template <typename T>
CLI::Option* add_choice(CLI::App& command, const std::string& name, T& value,
                        std::vector<std::pair<std::string, T>> choices, const std::string& help) {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  const auto set = [&value, choices](const std::string& chosen) {
    for (const auto& [n, v] : choices)
      if (n == chosen) value = v;
  };
  return command.add_option_function<std::string>(name, set, help)
      ->check(CLI::IsMember(names))
      ->option_text(fmt::format("{}", fmt::join(names, "|")));
}

// --ranks, --strategy and --timeout of the subcommands that run context parallel ("all" only
// for gdn run); `Options` has ranks, strategy, timeout_ms, ranks_given and strategy_given.
template <typename Options>
void add_ranks_options(CLI::App& command, Options& options, bool allow_all) {
  command
      .add_option("--timeout", options.timeout_ms,
                  "Milliseconds a rank waits for its peers in one exchange before it fails "
                  "naming them (in-process ranks, mpirun's processes, GPUs)")
      ->check(kPositive);
  command
      .add_option("--ranks", options.ranks,
                  "Context parallel over this many in-process ranks (1: one rank); T must be "
                  "divisible by it. Under mpirun the processes are the ranks: a different "
                  "--ranks is an error")
      ->check(kPositive)
      ->each([&options](const std::string&) { options.ranks_given = true; });
  std::vector<std::string> names;
  if (allow_all) names.emplace_back("all");
  for (Strategy s : all_strategies()) names.emplace_back(strategy_name(s));
  names.emplace_back(strategy_name(Strategy::automatic));
  command
      .add_option("--strategy", options.strategy,
                  allow_all ? "Context-parallel strategy, or all of them (needs more than one "
                              "rank)"
                            : "Context-parallel strategy (needs more than one rank)")
      ->check(CLI::IsMember(names))
      ->option_text(fmt::format("{}", fmt::join(names, "|")))
      ->each([&options](const std::string&) { options.strategy_given = true; });
}

// Throws gdn::Error when --ranks disagrees with mpirun's process count (`world`), or when
// --strategy is given but only one rank runs (it would have no effect).
void check_ranks(int ranks, bool ranks_given, const std::string& strategy, bool strategy_given,
                 const Communicator* world);
template <typename Options>
void check_ranks(const Options& options, const Communicator* world) {
  check_ranks(options.ranks, options.ranks_given, options.strategy, options.strategy_given, world);
}

// "a, b, c": the names of the tensors a command wrote, for its one-line summary.
inline std::string names_of(const std::map<std::string, HostTensor>& tensors) {
  std::string out;
  for (const auto& [name, t] : tensors) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// gdn run: time the op on a generated problem, check it against the float64 recurrence.
struct RunOptions {
  Problem problem;
  int threads = 0;                // OpenMP threads (shared by in-process ranks)
  int ranks = 2;                  // context parallel: in-process ranks (mpirun: its processes)
  std::string strategy = "auto";  // a strategy name, or "all"
  std::string device = "cpu";     // or "cuda": the op on the GPU (bf16 inputs unless f16)
  std::int64_t timeout_ms = kDefaultTimeout.count();  // of the communicators
  bool ranks_given = false, strategy_given = false;   // on the command line
  bool layer = false;          // the whole layer with random weights instead of the op
  std::int64_t hidden = 4096;  // the layer's hidden size
  bool json = false;           // one JSON document on stdout instead of the text
};
void add_run_options(CLI::App& command, RunOptions& options);
int run(const RunOptions& options);

// gdn op: the op on tensors from a safetensors file, results to another.
struct OpOptions {
  std::string input, output;
  double scale = 0;
  bool use_qk_l2norm = false;
  int chunk_size = 64;
  Method method = Method::chunked;
  int ranks = 1;  // context parallel, as for gdn run
  std::string strategy = "auto";
  std::string device = "cpu";  // or "cuda"
  std::int64_t timeout_ms = kDefaultTimeout.count();
  bool ranks_given = false, strategy_given = false;
};
void add_op_options(CLI::App& command, OpOptions& options);
int op(const OpOptions& options);

// gdn layer: the Qwen3.5 GatedDeltaNet layer on a checkpoint and an input file.
struct LayerCommandOptions {
  std::string config, weights, prefix, input, output;
  int ranks = 1;
  std::string strategy = "auto";
  std::int64_t timeout_ms = kDefaultTimeout.count();
  bool ranks_given = false, strategy_given = false;
};
void add_layer_options(CLI::App& command, LayerCommandOptions& options);
int layer(const LayerCommandOptions& options);

// Throws gdn::Error naming `what` (the options that sized it) when `bytes` exceed this machine's
// memory: checked before the allocations, so a huge size is an error, not std::bad_alloc.
void require_memory(const std::string& what, double bytes);

class Report;

// gdn run --layer: times the layer single-rank and (with ranks or mpirun) per strategy.
bool run_layer_job(const RunOptions& options, Communicator* world, Report& report);

}  // namespace gdn::app
