// `fathom generate MODEL --token-ids 1,2,3 --max-new-tokens N [--temperature 0] [--json]
//   [--speculative-algorithm mtp|nextn|ngram --speculative-num-steps K
//    --speculative-ngram-min N --speculative-ngram-max N --no-speculative-adaptive]`.
#include <nlohmann/json.hpp>
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "core/error.h"
#include "model/model_runner.h"
#include "runtime/offline_generate.h"

namespace fathom::cli {
namespace {

struct GenerateArgs {
  std::string model, token_ids, device = "auto";
  int max_new_tokens = 16, chunk = 512;
  TensorParallelism parallel;
  SamplingParams sampling;
  bool json = false, ignore_eos = false;
  std::string spec_algorithm;
  SpecOptions spec;
  std::string kv_cache_dtype = "auto";
};

void print_result(const GenerateArgs& a, const GenerateResult& r) {
  if (a.json) {
    nlohmann::json j = {{"token_ids", r.token_ids},
                        {"finish_reason", r.finish_reason},
                        {"prompt_tokens", r.prompt_tokens},
                        {"completion_tokens", r.token_ids.size()},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds},
                        {"target_forward_steps", r.target_forward_steps},
                        {"device", a.device}};
    if (r.speculative) {
      j["spec"] = {{"algorithm", spec_algorithm_name(a.spec.algorithm)},
                   {"num_steps", a.spec.num_steps},
                   {"adaptive", a.spec.adaptive},
                   {"steps", r.spec.steps},
                   {"draft_tokens", r.spec.draft_tokens},
                   {"accepted_tokens", r.spec.accepted_tokens},
                   {"acceptance_rate", r.spec.acceptance_rate()},
                   {"acceptance_by_position", r.spec.acceptance_by_position()},
                   {"drafted_at", r.spec.drafted_at},
                   {"accepted_at", r.spec.accepted_at},
                   {"draft_rounds", r.spec.draft_rounds},
                   {"tokens_per_step", r.spec.tokens_per_step()},
                   {"mean_accepted_length", r.spec.mean_accepted_length()}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < r.token_ids.size(); ++i) std::printf(i ? ",%d" : "%d", r.token_ids[i]);
    std::printf("\n");
  }
}

void run_generate(GenerateArgs a) {
  std::vector<int32_t> prompt = parse_token_ids(a.token_ids);
  a.spec.algorithm = parse_spec_algorithm(a.spec_algorithm);
  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.prefill_chunk = a.chunk;
  opt.sampling = a.sampling;
  if (a.spec.algorithm != SpecAlgorithm::None)
    FATHOM_CHECK(a.spec.num_steps >= 1 && a.spec.num_steps <= 4, "--speculative-num-steps must be 1..4 (got ",
                 a.spec.num_steps, ")");
  EngineOptions eo;
  eo.parallel = a.parallel;
  eo.kv_cache_dtype = a.kv_cache_dtype;
  if (a.spec.algorithm != SpecAlgorithm::None) eo.speculative_tokens = a.spec.num_steps;
  a.device = resolve_device(a.device);  // the JSON names the engine that ran
  auto runner = open_model(a.model, a.device, /*with_mtp=*/a.spec.algorithm == SpecAlgorithm::Mtp, eo);
  if (!a.ignore_eos) opt.stop_token_ids = runner->config().eos_token_ids;
  print_result(a, generate(*runner, prompt, opt, a.spec));
}

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate tokens after a prompt of token ids");
  sub->add_option("model", args->model, "Checkpoint folder")->required();
  sub->add_option("--token-ids", args->token_ids, "Comma-separated prompt token ids")->required();
  sub->add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate");
  sub->add_option("--temperature", args->sampling.temperature, "0 = greedy");
  sub->add_option("--top-p", args->sampling.top_p, "Nucleus sampling mass");
  sub->add_option("--top-k", args->sampling.top_k, "Keep the k most likely tokens (0 = off)");
  sub->add_option("--min-p", args->sampling.min_p, "Drop tokens below min_p x the top probability");
  sub->add_option("--seed", args->sampling.seed, "Sampling seed");
  sub->add_option("--device", args->device, "auto (cuda when a GPU is visible), cpu or cuda")->capture_default_str();
  sub->add_option("--prefill-chunk", args->chunk, "Tokens per prefill forward pass");
  sub->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the model's eos tokens");
  sub->add_flag("--json", args->json, "Print a JSON object with token_ids and timings");
  add_speculative_options(sub, args->spec_algorithm, args->spec.num_steps, args->spec.ngram_min, args->spec.ngram_max,
                          args->spec.adaptive);
  add_parallel_options(sub, args->parallel);
  add_kv_cache_dtype_option(sub, args->kv_cache_dtype);
  sub->callback([args] { run_generate(*args); });
});

}  // namespace
}  // namespace fathom::cli
