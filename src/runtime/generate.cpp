#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace fathom {

HybridModel::Output prefill(const HybridModel& model, SequenceState& state, const std::vector<int32_t>& prompt,
                            int chunk, bool all_rows) {
  FATHOM_CHECK(!prompt.empty(), "the prompt is empty");
  FATHOM_CHECK(chunk > 0, "prefill chunk size must be positive");
  HybridModel::Output total;
  for (size_t begin = 0; begin < prompt.size(); begin += size_t(chunk)) {
    const size_t end = std::min(prompt.size(), begin + size_t(chunk));
    HybridModel::Segment seg{&state, std::span<const int32_t>(prompt.data() + begin, end - begin)};
    HybridModel::Output out = model.forward(std::span<const HybridModel::Segment>(&seg, 1), all_rows);
    if (all_rows || end == prompt.size()) {
      total.rows += out.rows;
      total.logits.insert(total.logits.end(), out.logits.begin(), out.logits.end());
      total.hidden.insert(total.hidden.end(), out.hidden.begin(), out.hidden.end());
    }
  }
  return total;
}

GenerateResult generate(const HybridModel& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  const ModelConfig& cfg = model.config();
  FATHOM_CHECK(opt.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  FATHOM_CHECK(cfg.max_position_embeddings <= 0 ||
                   int64_t(prompt.size()) + opt.max_new_tokens <= cfg.max_position_embeddings,
               "prompt (", prompt.size(), " tokens) plus max_new_tokens (", opt.max_new_tokens,
               ") exceeds the model's context length of ", cfg.max_position_embeddings);
  GenerateResult res;
  res.prompt_tokens = int(prompt.size());
  res.finish_reason = "length";
  if (opt.max_new_tokens == 0) return res;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  SequenceState state = model.new_sequence();
  HybridModel::Output out = prefill(model, state, prompt, opt.prefill_chunk, false);
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  Sampler sampler(opt.sampling);
  const int64_t V = cfg.vocab_size;
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(out.logits.data() + (out.rows - 1) * V, V);
    res.token_ids.push_back(next);
    if (std::find(opt.stop_token_ids.begin(), opt.stop_token_ids.end(), next) != opt.stop_token_ids.end()) {
      res.finish_reason = "stop";
      break;
    }
    if (i + 1 == opt.max_new_tokens) break;
    HybridModel::Segment seg{&state, std::span<const int32_t>(&next, 1)};
    out = model.forward(std::span<const HybridModel::Segment>(&seg, 1), false);
    ++res.target_forward_steps;
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace fathom
