// `fathom bench serve --url U --concurrency 1,16,64,256 --input-len N --output-len M
//  --num-prompts P [--model NAME]`: load test of a running server, `vllm bench serve` output.
#include <cstdlib>

#include "cli/command.h"
#include "server/bench_client.h"

namespace fathom::cli {

void add_bench_serve(CLI::App* parent, const std::string& name) {
  auto a = std::make_shared<server::BenchConfig>();
  CLI::App* sub = parent->add_subcommand(name, "Benchmark a running OpenAI-compatible server (like `vllm bench serve`)");
  sub->add_option("--url", a->url, "Server base URL")->capture_default_str();
  sub->add_option("--model", a->model, "Model name (default: the first from /v1/models)");
  sub->add_option("--api-key", a->api_key, "Bearer key");
  sub->add_option("--concurrency", a->concurrency, "Comma-separated concurrency levels")->delimiter(',')->capture_default_str();
  sub->add_option("--input-len", a->input_len, "Prompt tokens (random ids)")->capture_default_str();
  sub->add_option("--output-len", a->output_len, "Generated tokens per request (ignore_eos)")->capture_default_str();
  sub->add_option("--num-prompts", a->num_prompts, "Requests per concurrency level")->capture_default_str();
  sub->add_option("--vocab-size", a->vocab_size, "Prompt ids are drawn from [0, vocab-size - 16)")->capture_default_str();
  sub->add_option("--seed", a->seed, "Prompt seed")->capture_default_str();
  sub->add_flag("--no-progress", [a](int64_t) { a->progress = false; }, "No progress bar on stderr");
  sub->callback([a] {
    int rc = server::run_bench_serve(*a);
    if (rc != 0) std::exit(rc);
  });
}

// `fathom bench serve` is attached by cmd_bench.cpp (which owns `bench`); `bench-serve` is the
// same command at the top level.
namespace {
CommandRegistrar reg([](CLI::App& app) { add_bench_serve(&app, "bench-serve"); });

}  // namespace
}  // namespace fathom::cli
