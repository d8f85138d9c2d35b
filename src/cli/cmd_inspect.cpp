// `fathom inspect MODEL [--json]`: summarize a checkpoint folder without loading its weights.
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "model/model_summary.h"

namespace {

struct InspectOptions {
  std::string model;
  bool json = false;
};

fathom::cli::CommandRegistrar reg([](CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand(
      "inspect", "Summarize a checkpoint: architecture, layers, parameters, quantization, MTP, memory per token");
  sub->add_option("MODEL", opts->model, "checkpoint folder (config.json + *.safetensors)")->required();
  sub->add_flag("--json", opts->json, "print the summary as JSON");
  sub->callback([opts] {
    const auto summary = fathom::summarize_checkpoint(opts->model);
    if (opts->json)
      std::cout << summary.to_json().dump(2) << "\n";
    else
      fathom::print_summary(std::cout, summary);
  });
});

}  // namespace
