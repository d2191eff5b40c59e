// gdn: the command-line tool, the only place that prints for users or exits.

#include <cstdio>
#include <exception>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line also when piped
  CLI::App app{"gdn: the gated delta rule (Gated DeltaNet linear attention), forward and backward"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();

  gdn::app::RunOptions run_options;
  CLI::App* run = app.add_subcommand(
      "run", "Time the op on a generated problem and check it against the float64 recurrence");
  gdn::app::add_run_options(*run, run_options);

  gdn::app::OpOptions op_options;
  CLI::App* op = app.add_subcommand(
      "op", "Run the op on tensors read from a safetensors file; write the results to another");
  gdn::app::add_op_options(*op, op_options);

  gdn::app::LayerCommandOptions layer_options;
  CLI::App* layer = app.add_subcommand(
      "layer", "Run the Qwen3.5 GatedDeltaNet layer on a checkpoint and an input file");
  gdn::app::add_layer_options(*layer, layer_options);

  app.set_version_flag("--version", "gdn " GDN_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 says "A subcommand is required" for both `gdn` and `gdn foo`.
    if (e.get_name() == "RequiredError" && app.get_subcommands().empty()) {
      const std::string given = argc > 1 ? fmt::format("unknown command \"{}\"", argv[1])
                                         : std::string("a command is required");
      fmt::print(stderr, "gdn: error: {}: expected run, op or layer (gdn --help)\n", given);
      return 2;
    }
    return app.exit(e);
  }
  try {
    if (run->parsed()) return gdn::app::run(run_options);
    if (layer->parsed()) return gdn::app::layer(layer_options);
    return gdn::app::op(op_options);
  } catch (const std::exception& e) {  // gdn::Error, and std::bad_alloc for oversized problems
    fmt::print(stderr, "gdn: error: {}\n", e.what());
    return 1;
  }
}
