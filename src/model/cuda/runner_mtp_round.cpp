// An MTP round in one launch (ModelRunner::forward_verify_draft): the verify step's graph, each
// row's token chosen on the device (the argmax, or the device sampler over the round's sampling
// rows), then the MTP layer's graph over the same rows, its inputs (the verify rows' hidden states
// and chosen tokens) copied on the device, and one wait at the end. At batch 1 on a small model a
// round otherwise pays a second host round trip for the draft step, as much as the MTP layer's
// own GPU time.
#include <cstddef>

#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

bool CudaRunner::supports_fused_mtp_round() const { return impl_->w.has_mtp; }

VerifyDraftOutput CudaRunner::forward_verify_draft(std::span<const ForwardStep> steps,
                                                   std::span<const RowSampling> rows,
                                                   std::span<const LogitAdjustment> adjust,
                                                   std::span<const uint32_t> masks) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "forward_verify_draft: this model has no MTP layer loaded");
  int total = 0;
  for (const ForwardStep& st : steps) {
    FATHOM_CHECK(st.all_rows && st.keep_history, "forward_verify_draft: steps take all rows and keep history");
    const auto& sq = m.seq(st.seq);
    FATHOM_CHECK(sq.mtp_length == sq.length, "forward_verify_draft: the MTP layer of sequence ", st.seq, " is at ",
                 sq.mtp_length, " tokens, the model at ", sq.length);
    total += int(st.tokens.size());
  }
  FATHOM_CHECK(total <= m.T_max && total <= m.R_max && int(steps.size()) <= m.opt.max_seqs,
               "forward_verify_draft: the batch must fit one forward (", total, " tokens)");
  const bool sampled = !rows.empty();
  if (sampled) {
    // The sampled launch (runner_sampling.cpp) as one chunk: its rows are the steps' tokens in
    // order, its sampler's results in m.sampling.row_out, its final hidden rows in m.act.sel.
    FATHOM_CHECK(m.launched.empty(), "forward_verify_draft: an overlapped step is still in flight");
    launch(steps, rows, adjust, /*want_hidden=*/false, masks);
  } else {
    Impl::Plan p = m.prepare(steps);
    m.run(p);  // argmax rows in m.argmax, final hidden rows in m.sel, rows in token order
    m.commit(steps);
  }

  VerifyDraftOutput out;
  std::vector<MtpStep> mtp;
  const std::vector<int32_t> unread(size_t(total), 0);  // the next tokens come from the device
  int offset = 0;
  for (const ForwardStep& st : steps) {
    out.row_begin.push_back(offset);
    mtp.push_back(MtpStep{st.seq, {}, std::span<const int32_t>(unread.data() + offset, st.tokens.size()), true});
    offset += int(st.tokens.size());
  }
  Impl::Plan q = m.prepare_mtp(mtp, /*inputs_on_device=*/true);
  const cudaStream_t s = m.stream;
  // After the MTP step's metadata upload: its token ids are the verify rows' choices (the argmax
  // kept there, as the MTP head overwrites m.argmax; or the token field of each sampled row), its
  // hidden rows the verify rows' final hidden states.
  if (sampled) {
    const auto* first = reinterpret_cast<const char*>(m.sampling.row_out.data()) + offsetof(RowSample, token);
    FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(m.dmeta.ids, sizeof(int32_t), first, sizeof(RowSample), sizeof(int32_t),
                                        size_t(total), cudaMemcpyDeviceToDevice, s));
  } else {
    FATHOM_CUDA_CHECK(
        cudaMemcpyAsync(m.dmeta.ids, m.act.argmax.data(), size_t(total) * 4, cudaMemcpyDeviceToDevice, s));
  }
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.act.mtp_hidden.data(), m.act.sel.data(), size_t(total) * m.cfg.hidden_size * 4,
                                    cudaMemcpyDeviceToDevice, s));
  m.run_mtp_step(q);
  out.target.resize(size_t(total));
  out.draft.resize(size_t(total));
  if (!sampled)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(out.target.data(), m.dmeta.ids, size_t(total) * 4, cudaMemcpyDeviceToHost, s));
  FATHOM_CUDA_CHECK(
      cudaMemcpyAsync(out.draft.data(), m.act.argmax.data(), size_t(total) * 4, cudaMemcpyDeviceToHost, s));
  if (sampled) {  // the sampler's results (its copies were queued before the MTP step)
    SampledOutput so = finish_sampled();
    out.samples = std::move(so.samples);
    out.top_ids = std::move(so.top_ids);
    out.top_logprobs = std::move(so.top_logprobs);
    for (size_t i = 0; i < out.samples.size(); ++i) out.target[i] = out.samples[i].token;
  }
  m.finish_mtp(mtp, q, nullptr);  // waits; the MTP lengths advance
  return out;
}

}  // namespace fathom::cuda
