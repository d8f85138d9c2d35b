#include "runtime/sampling_rows.h"

#include <map>

#include "core/error.h"

namespace fathom {

void SamplingRows::clear() {
  rows_.clear();
  adjust_.clear();
  masks_.clear();
}

uint32_t* SamplingRows::mask(int32_t mask_row) {
  const int64_t w = mask_words(vocab_);
  FATHOM_CHECK(mask_row >= 0 && (int64_t(mask_row) + 1) * w <= int64_t(masks_.size()), "no mask row ", mask_row);
  return masks_.data() + int64_t(mask_row) * w;
}

void SamplingRows::add_skip() {
  RowSampling row;
  row.skip = 1;
  row.adjust_begin = row.adjust_end = int32_t(adjust_.size());
  rows_.push_back(row);
}

void SamplingRows::add(const Request& r, std::span<const int32_t> prior, int32_t draft, const std::set<int32_t>& eos,
                       const uint32_t* mask, int64_t unread) {
  const RequestParams& p = r.spec.params;
  const SamplingParams& sp = p.sampling;
  RowSampling row;
  row.temperature = sp.temperature;
  row.top_k = sp.top_k;
  row.top_p = sp.top_p;
  row.min_p = sp.min_p;
  row.seed = sp.seed;
  row.draw = uint64_t(r.num_output() + unread) + prior.size();
  row.draft = draft;
  row.logprobs = p.logprobs;
  row.adjust_begin = int32_t(adjust_.size());

  // One entry per token, in the CPU sampler's order: mask, repetition, presence/frequency, bias.
  std::map<int32_t, LogitAdjustment> entries;
  auto entry = [&](int32_t t) -> LogitAdjustment& {
    LogitAdjustment& e = entries[t];
    e.token = t;
    return e;
  };
  const int64_t num_out = r.num_output() + unread + int64_t(prior.size());
  if (num_out < p.min_tokens && (!eos.empty() || !p.stop_token_ids.empty())) {
    if (!p.ignore_eos)
      for (int32_t e : eos) entry(e).mask = 1;
    for (int32_t e : p.stop_token_ids) entry(e).mask = 1;
  }
  const bool rep = sp.repetition_penalty != 1.f && sp.repetition_penalty > 0.f;
  const bool pres_freq = sp.presence_penalty != 0.f || sp.frequency_penalty != 0.f;
  if (rep || pres_freq) {
    std::map<int32_t, int> counts;  // output tokens, the prior drafts included
    for (int32_t t : r.output_span()) ++counts[t];
    for (int32_t t : prior) ++counts[t];
    if (rep) {
      for (int32_t t : r.prompt_span()) entry(t).rep = sp.repetition_penalty;
      for (const auto& [t, c] : counts) entry(t).rep = sp.repetition_penalty;
    }
    if (pres_freq)
      for (const auto& [t, c] : counts) entry(t).sub = sp.frequency_penalty * float(c) + sp.presence_penalty;
  }
  for (const auto& [t, bias] : sp.logit_bias) entry(t).bias += bias;
  for (const auto& [t, e] : entries)
    if (t >= 0 && t < vocab_) adjust_.push_back(e);  // as the CPU sampler: ids outside the vocabulary do nothing
  row.adjust_end = int32_t(adjust_.size());
  if (mask) {
    const int64_t w = mask_words(vocab_);
    row.mask_row = int32_t(int64_t(masks_.size()) / w);
    masks_.insert(masks_.end(), mask, mask + w);
  }
  rows_.push_back(row);
}

}  // namespace fathom
