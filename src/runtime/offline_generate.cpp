#include "runtime/offline_generate.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "core/error.h"
#include "runtime/engine.h"

namespace fathom {
namespace {

void check_prompts(const ModelConfig& cfg, const std::vector<std::vector<int32_t>>& prompts,
                   const GenerateOptions& opt) {
  FATHOM_CHECK(opt.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  FATHOM_CHECK(opt.prefill_chunk > 0, "prefill chunk size must be positive");
  for (const auto& p : prompts) {
    FATHOM_CHECK(!p.empty(), "the prompt is empty");
    FATHOM_CHECK(cfg.max_position_embeddings <= 0 ||
                     int64_t(p.size()) + opt.max_new_tokens <= cfg.max_position_embeddings,
                 "prompt (", p.size(), " tokens) plus max_new_tokens (", opt.max_new_tokens,
                 ") exceeds the model's context length of ", cfg.max_position_embeddings);
  }
}

// Every prompt admitted at once and in every step: each prompt's next prefill_chunk tokens, or
// a decode round with all its drafts. Host logits (the runner's plain forward), no prefix cache;
// the stop tokens are the caller's (no eos of the engine's own).
EngineConfig offline_config(const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt,
                            const SpecOptions& spec) {
  const int64_t n = std::max<int64_t>(1, int64_t(prompts.size()));
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int64_t(p.size()));
  const int64_t round = spec.algorithm == SpecAlgorithm::None ? 1 : int64_t(spec.num_steps) + 1;
  EngineConfig c;
  c.max_num_seqs = int(n);
  c.max_queue_len = int(n);
  c.max_chunk_tokens = opt.prefill_chunk;
  c.max_num_batched_tokens = n * std::max<int64_t>(opt.prefill_chunk, round);
  c.max_model_len = longest + opt.max_new_tokens;
  c.spec = spec;
  c.device_sampling = false;
  c.overlap_schedule = false;
  c.enable_prefix_caching = false;
  return c;
}

RequestParams request_params(const GenerateOptions& opt, size_t i) {
  RequestParams p;
  p.sampling = opt.sampling;
  p.sampling.seed = opt.sampling.seed + i;
  p.max_tokens = opt.max_new_tokens;
  p.stop_token_ids.assign(opt.stop_token_ids.begin(), opt.stop_token_ids.end());
  p.detokenize = false;
  return p;
}

// Collects the engine's events into the results; the prefill ends when every sequence has its
// first token.
class Collector {
 public:
  Collector(std::vector<GenerateResult>& results, std::shared_ptr<OutputChannel> channel)
      : results_(results), channel_(std::move(channel)), start_(Clock::now()), prefilled_(start_) {}

  void read() {
    while (std::optional<RequestOutput> o = channel_->try_pop()) {
      GenerateResult& r = results_[size_t(o->index)];
      if (r.token_ids.empty() && !o->token_ids.empty() && ++started_ == results_.size()) prefilled_ = Clock::now();
      r.token_ids.insert(r.token_ids.end(), o->token_ids.begin(), o->token_ids.end());
      if (!o->finished) continue;
      r.finish_reason = o->finish_reason;
      r.target_forward_steps = o->decode_steps;
      r.spec = o->spec;
      if (o->finish_reason == "error" && error_.empty()) error_ = o->error;
      if (o->finish_reason == "abort" && error_.empty()) error_ = "a sequence could not be scheduled";
    }
  }

  void finish() {
    const auto end = Clock::now();
    for (GenerateResult& r : results_) {
      r.prefill_seconds = std::chrono::duration<double>(prefilled_ - start_).count();
      r.decode_seconds = std::chrono::duration<double>(end - prefilled_).count();
    }
    if (!error_.empty()) fail("generation failed: ", error_);
  }

 private:
  std::vector<GenerateResult>& results_;
  std::shared_ptr<OutputChannel> channel_;
  Clock::time_point start_, prefilled_;
  size_t started_ = 0;
  std::string error_;
};

}  // namespace

std::vector<GenerateResult> generate_batch(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt, const SpecOptions& spec) {
  check_prompts(runner.config(), prompts, opt);
  Engine engine(runner, /*tokenizer=*/nullptr, offline_config(prompts, opt, spec));
  std::vector<GenerateResult> results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    results[i].prompt_tokens = int(prompts[i].size());
    results[i].finish_reason = "length";
    results[i].speculative = spec.algorithm != SpecAlgorithm::None;
  }
  if (opt.max_new_tokens == 0 || prompts.empty()) return results;
  auto channel = std::make_shared<OutputChannel>();
  std::vector<RequestSpec> specs;
  for (size_t i = 0; i < prompts.size(); ++i)
    specs.push_back(RequestSpec{/*group=*/1, int(i), prompts[i], request_params(opt, i), channel});
  Collector collector(results, channel);
  FATHOM_CHECK(engine.submit(std::move(specs)) == Engine::SubmitResult::Ok, "the engine refused the prompts");
  engine.run_until_done([&] { collector.read(); });
  collector.finish();
  return results;
}

GenerateResult generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const SpecOptions& spec) {
  return generate_batch(runner, {prompt}, opt, spec).front();
}

}  // namespace fathom
