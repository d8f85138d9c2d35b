#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "core/error.h"

namespace fathom::cli {
std::vector<CommandSetup>& command_setups() {
  static std::vector<CommandSetup> setups;
  return setups;
}
}  // namespace fathom::cli

int main(int argc, char** argv) {
  CLI::App app{"fathom: inference server for hybrid MoE language models"};
  app.require_subcommand(1);
  for (auto& setup : fathom::cli::command_setups()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fathom::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
