// Subcommand registry: each cmd_*.cpp defines a static CommandRegistrar that adds its
// subcommand to the CLI11 app, so commands live in their own files and main.cpp stays small.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace fathom::cli {

using CommandSetup = std::function<void(CLI::App& app)>;

std::vector<CommandSetup>& command_setups();

// Adds the `vllm bench serve`-style client benchmark as subcommand `name` of `parent`.
void add_bench_serve(CLI::App* parent, const std::string& name);

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { command_setups().push_back(std::move(setup)); }
};

}  // namespace fathom::cli
