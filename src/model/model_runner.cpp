// ModelRunner's fused MTP round for engines without a launch of their own: a forward, each row's
// token chosen on the host (the argmax, or the device sampler's semantics by the CPU row sampler),
// then the MTP layer over the same rows.
#include "model/model_runner.h"

#include <algorithm>

#include "kernels/cpu/row_sampler.h"

namespace fathom {

VerifyDraftOutput ModelRunner::forward_verify_draft(std::span<const ForwardStep> steps,
                                                    std::span<const RowSampling> rows,
                                                    std::span<const LogitAdjustment> adjust,
                                                    std::span<const uint32_t> masks) {
  const int64_t V = config().vocab_size, H = config().hidden_size;
  int64_t total = 0;
  for (const ForwardStep& st : steps) {
    FATHOM_CHECK(st.all_rows && st.keep_history && mtp_length(st.seq) == length(st.seq),
                 "forward_verify_draft: steps take all rows, keep history and start where the MTP layer is");
    total += int64_t(st.tokens.size());
  }
  FATHOM_CHECK(rows.empty() || int64_t(rows.size()) == total, "forward_verify_draft: ", rows.size(),
               " sampling rows for ", total, " rows");
  for (const RowSampling& r : rows) {
    FATHOM_CHECK(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(),
                 "forward_verify_draft: a row's adjustments lie outside the list");
    FATHOM_CHECK(r.mask_row < 0 || (int64_t(r.mask_row) + 1) * mask_words(V) <= int64_t(masks.size()),
                 "forward_verify_draft: a row's token mask lies outside the mask table");
  }
  ForwardOutput fo = forward(steps);
  VerifyDraftOutput out;
  out.row_begin = fo.row_begin;
  if (rows.empty()) {
    for (int64_t r = 0; r < fo.rows; ++r) {  // ties to the lowest id, as torch.argmax
      const float* row = fo.logits.data() + r * V;
      out.target.push_back(int32_t(std::max_element(row, row + V) - row));
    }
  } else {
    std::vector<LogitAdjustment> adj(adjust.begin(), adjust.end());  // the sampler writes their raw logits
    out.samples.resize(size_t(fo.rows));
    out.top_ids.assign(size_t(fo.rows) * kMaxTopLogprobs, -1);
    out.top_logprobs.assign(size_t(fo.rows) * kMaxTopLogprobs, 0.f);
    cpu::sample_rows(fo.logits.data(), fo.rows, V, rows.data(), adj.data(), out.samples.data(), out.top_ids.data(),
                     out.top_logprobs.data(), masks.empty() ? nullptr : masks.data());
    for (const RowSample& s : out.samples) out.target.push_back(s.token);
  }
  std::vector<MtpStep> mtp;
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t n = steps[i].tokens.size();
    mtp.push_back(MtpStep{steps[i].seq,
                          std::span<const float>(fo.hidden.data() + fo.hidden_row_begin[i] * H, n * size_t(H)),
                          std::span<const int32_t>(out.target.data() + fo.row_begin[i], n), true});
  }
  out.draft = mtp_forward_greedy(mtp).ids;
  return out;
}

}  // namespace fathom
