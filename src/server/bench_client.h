// `fathom bench serve`: a load generator for OpenAI-compatible servers in the shape of
// `vllm bench serve` (random token-id prompts, streaming /v1/completions, TTFT/TPOT/ITL/E2EL).
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
  int vocab_size = 512;  // prompt ids are drawn from [0, vocab_size - 16)
  uint64_t seed = 0;
  bool progress = true;
};

// Runs one benchmark per concurrency level, prints the result tables to stdout; returns the
// process exit code (non-zero when any request failed).
int run_bench_serve(const BenchConfig& cfg);

}  // namespace fathom::server
