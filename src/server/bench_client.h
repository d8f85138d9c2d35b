// `fathom bench serve`: a load generator for OpenAI-compatible servers in the shape of
// `vllm bench serve` (random token-id prompts, streaming /v1/completions, TTFT/TPOT/ITL/E2EL):
// fixed concurrency levels, or Poisson arrivals at --request-rate; prompt and output lengths
// drawn around their means (--random-range-ratio); a goodput line for SLOs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fathom::server {

struct BenchConfig {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first id from /v1/models
  std::string api_key;
  std::vector<int> concurrency = {1};
  int input_len = 128, output_len = 32, num_prompts = 100;
  // Prompts: "random" token ids; "prefix-repeat": one shared prefix of prefix_len tokens before
  // each random prompt (a system prompt); "multi-turn": conversations of num_turns turns, each
  // prompt the conversation so far (earlier prompts and the server's answers) plus a new message
  // of input_len tokens, the turns of a conversation one after another (num_prompts requests).
  std::string dataset = "random";
  int prefix_len = 0;
  int num_turns = 1;
  // multi-turn: conversations in progress at once (vLLM's --max-active-conversations); the
  // clients take their next turns in turn, so each comes back after the others' (0: one a client).
  int max_active_conversations = 0;
  double range_ratio = 0;        // lengths uniform in [len * (1 - r), len * (1 + r)] (vLLM's random dataset)
  double request_rate = 0;       // > 0: Poisson arrivals at this rate (req/s) instead of fixed concurrency
  int max_concurrency = 0;       // with request_rate: requests in flight at most (0: all)
  int vocab_size = 512;  // prompt ids are drawn from [0, vocab_size - 16)
  uint64_t seed = 0;
  bool progress = true;
  // Sampling of the requests (vLLM's flags): temperature 0 is greedy. A share of them asks for
  // logprobs with this many alternatives.
  double temperature = 0, top_p = 1;
  int top_k = 0;
  int logprobs = -1;
  double logprobs_fraction = 1;  // share of the requests that ask for logprobs (when logprobs >= 0)
  std::vector<double> percentiles = {50, 90, 99};
  // Goodput SLOs in milliseconds (0: none), e.g. --goodput ttft:1000 tpot:50.
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2el_ms = 0;
};

// "ttft:MS", "tpot:MS" or "e2el:MS" into the config's SLOs (an error names a bad entry).
void parse_goodput(BenchConfig& cfg, const std::vector<std::string>& entries);

// Runs one benchmark per concurrency level, prints the result tables to stdout; returns the
// process exit code (non-zero when any request failed).
int run_bench_serve(const BenchConfig& cfg);

}  // namespace fathom::server
