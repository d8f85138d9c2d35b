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
  return verify_draft_on_host(*this, steps, rows, adjust, masks);
}

VerifyDraftOutput verify_draft_on_host(ModelRunner& m, std::span<const ForwardStep> steps,
                                       std::span<const RowSampling> rows, std::span<const LogitAdjustment> adjust,
                                       std::span<const uint32_t> masks, const float* q_in,
                                       std::vector<float>* q_drawn) {
  const int64_t V = m.config().vocab_size, H = m.config().hidden_size;
  int64_t total = 0;
  for (const ForwardStep& st : steps) {
    FATHOM_CHECK(st.all_rows && st.keep_history && m.mtp_length(st.seq) == m.length(st.seq),
                 "forward_verify_draft: steps take all rows, keep history and start where the MTP layer is");
    total += int64_t(st.tokens.size());
  }
  FATHOM_CHECK(rows.empty() || int64_t(rows.size()) == total, "forward_verify_draft: ", rows.size(),
               " sampling rows for ", total, " rows");
  bool draws = false;
  for (const RowSampling& r : rows) {
    FATHOM_CHECK(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(),
                 "forward_verify_draft: a row's adjustments lie outside the list");
    FATHOM_CHECK(r.mask_row < 0 || (int64_t(r.mask_row) + 1) * mask_words(V) <= int64_t(masks.size()),
                 "forward_verify_draft: a row's token mask lies outside the mask table");
    FATHOM_CHECK(r.draft_q < 0 || q_in, "forward_verify_draft: a row verifies a sampled draft without its q");
    FATHOM_CHECK(r.q_out < 0, "forward_verify_draft: verify rows draw no drafts themselves (draw_draft does)");
    draws = draws || r.draw_draft;
  }
  FATHOM_CHECK(!draws || q_drawn, "forward_verify_draft: rows draw sampled drafts and nothing keeps their q");
  ForwardOutput fo = m.forward(steps);
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
                     out.top_logprobs.data(), masks.empty() ? nullptr : masks.data(), const_cast<float*>(q_in));
    for (const RowSample& s : out.samples) out.target.push_back(s.token);
  }
  std::vector<MtpStep> mtp;
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t n = steps[i].tokens.size();
    mtp.push_back(MtpStep{steps[i].seq,
                          std::span<const float>(fo.hidden.data() + fo.hidden_row_begin[i] * H, n * size_t(H)),
                          std::span<const int32_t>(out.target.data() + fo.row_begin[i], n), true});
  }
  if (!draws) {
    out.draft = m.mtp_forward_greedy(mtp).ids;
    return out;
  }
  // Sampled drafts: every MTP row by the row sampler (greedy rows' q one-hot at their argmax).
  ForwardOutput mo = m.mtp_forward(mtp);
  std::vector<RowSampling> dr;
  for (int64_t r = 0; r < mo.rows; ++r) {
    RowSampling d = mtp_draft_row(rows[size_t(r)]);
    d.q_out = int32_t(r);
    dr.push_back(d);
  }
  q_drawn->assign(size_t(mo.rows * V), 0.f);
  std::vector<RowSample> drafts(size_t(mo.rows));
  cpu::sample_rows(mo.logits.data(), mo.rows, V, dr.data(), nullptr, drafts.data(), nullptr, nullptr, nullptr,
                   q_drawn->data());
  for (const RowSample& d : drafts) out.draft.push_back(d.token);
  return out;
}

}  // namespace fathom
