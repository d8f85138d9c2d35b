// `fathom bench serve --url U --concurrency 1,16,64,256 --input-len N --output-len M
//  --num-prompts P [--model NAME] [--random-range-ratio R] [--request-rate RPS --max-concurrency C]
//  [--temperature T --top-p P --logprobs K --logprobs-fraction F] [--goodput ttft:MS tpot:MS]
//  [--dataset-name random|prefix-repeat|multi-turn --prefix-len S --num-turns T
//  --max-active-conversations A]`:
//  load test of a running server, `vllm bench serve` flags and output.
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
  sub->add_option("--dataset-name,--dataset", a->dataset,
                  "Prompts: random (token ids), prefix-repeat (--prefix-len shared tokens before each), multi-turn "
                  "(--num-turns turns a conversation, each prompt the conversation so far plus --input-len new tokens)")
      ->check(CLI::IsMember({"random", "prefix-repeat", "multi-turn"}))
      ->capture_default_str();
  sub->add_option("--prefix-len", a->prefix_len,
                  "prefix-repeat: tokens of the prefix every prompt shares (with --input-len 0 each prompt is that "
                  "prefix exactly)")
      ->capture_default_str();
  sub->add_option("--num-turns", a->num_turns, "multi-turn: turns of each conversation")->capture_default_str();
  sub->add_option("--max-active-conversations", a->max_active_conversations,
                  "multi-turn: conversations in progress at once, their turns taken in turn by the clients, so "
                  "that each comes back after the others' (default: one a client)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--input-len,--random-input-len", a->input_len, "Prompt tokens (random ids), mean")->capture_default_str();
  sub->add_option("--output-len,--random-output-len", a->output_len, "Generated tokens per request (ignore_eos), mean")
      ->capture_default_str();
  sub->add_option("--random-range-ratio", a->range_ratio,
                  "Lengths uniform in [len * (1 - r), len * (1 + r)] (vLLM's random dataset)")
      ->capture_default_str();
  sub->add_option("--request-rate", a->request_rate,
                  "Requests per second with Poisson arrivals (default: fixed --concurrency levels)");
  sub->add_option("--max-concurrency", a->max_concurrency, "With --request-rate: requests in flight at most");
  sub->add_option("--temperature", a->temperature, "Sampling temperature of the requests (0: greedy)")->capture_default_str();
  sub->add_option("--top-p", a->top_p, "top_p of the requests")->capture_default_str();
  sub->add_option("--top-k", a->top_k, "top_k of the requests (0: off)")->capture_default_str();
  sub->add_option("--logprobs", a->logprobs, "Ask for the chosen token's logprob and this many alternatives");
  sub->add_option("--logprobs-fraction", a->logprobs_fraction, "Share of the requests that ask for --logprobs")
      ->capture_default_str();
  sub->add_option("--metric-percentiles", a->percentiles, "Percentiles of TTFT/TPOT/ITL/E2EL to print")
      ->delimiter(',')
      ->capture_default_str();
  auto goodput = std::make_shared<std::vector<std::string>>();
  sub->add_option("--goodput", *goodput, "SLOs for the goodput line: ttft:MS tpot:MS e2el:MS");
  sub->add_option("--num-prompts", a->num_prompts, "Requests per concurrency level")->capture_default_str();
  sub->add_option("--vocab-size", a->vocab_size, "Prompt ids are drawn from [0, vocab-size - 16)")->capture_default_str();
  sub->add_option("--seed", a->seed, "Prompt seed")->capture_default_str();
  sub->add_flag("--no-progress", [a](int64_t) { a->progress = false; }, "No progress bar on stderr");
  sub->callback([a, goodput] {
    server::parse_goodput(*a, *goodput);
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
