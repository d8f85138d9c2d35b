// An MTP round in one launch (ModelRunner::forward_verify_draft): the verify step, each row's
// token chosen on the device (the argmax, or the device sampler over the round's sampling rows),
// then the MTP layer over the same rows on the verify step's metadata (the same positions: no
// second upload, no host wait for one), reading the verify rows' chosen tokens and final hidden
// states on the device, and one wait at the end. At batch 1 on a small model a round otherwise
// pays a second host round trip for the draft step, as much as the MTP layer's own GPU time.
// Greedy rounds go through launch_verify_draft / finish_verify_draft as one graph (run_round),
// and chain: a round's outcome stays on the device per state slot (mtp_round_outcome), and a
// round launched before it is read takes its tokens, positions and linear-attention state from
// there (mtp_chain_patch, restore_linear_states_unless), its host-side lengths settled when the
// round before it is read.
#include <algorithm>
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
  if (!sampled) {
    launch_verify_draft(steps);
    return finish_verify_draft();
  }
  // The sampled launch (runner_sampling.cpp) as one chunk: its rows are the steps' tokens in
  // order, its sampler's results in m.sampling.row_out, its final hidden rows in m.act.sel.
  FATHOM_CHECK(m.launched.empty() && m.rounds.empty(), "forward_verify_draft: an overlapped step is still in flight");
  launch(steps, rows, adjust, /*want_hidden=*/false, masks);

  VerifyDraftOutput out;
  int offset = 0;
  for (const ForwardStep& st : steps) {
    out.row_begin.push_back(offset);
    offset += int(st.tokens.size());
  }
  const Impl::Plan q = m.mtp_plan_on_verify(m.last_prepared);
  const cudaStream_t s = m.stream;
  // The MTP step's token ids are the verify rows' choices (the token field of each sampled row),
  // its hidden rows the verify rows' final hidden states.
  const auto* first = reinterpret_cast<const char*>(m.sampling.row_out.data()) + offsetof(RowSample, token);
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(m.dmeta.ids, sizeof(int32_t), first, sizeof(RowSample), sizeof(int32_t),
                                      size_t(total), cudaMemcpyDeviceToDevice, s));
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.act.mtp_hidden.data(), m.act.sel.data(), size_t(total) * m.cfg.hidden_size * 4,
                                    cudaMemcpyDeviceToDevice, s));
  m.run_mtp_step(q);
  out.target.resize(size_t(total));
  out.draft.resize(size_t(total));
  FATHOM_CUDA_CHECK(
      cudaMemcpyAsync(out.draft.data(), m.act.argmax.data(), size_t(total) * 4, cudaMemcpyDeviceToHost, s));
  SampledOutput so = finish_sampled();  // the sampler's results (its copies were queued before the MTP step)
  out.samples = std::move(so.samples);
  out.top_ids = std::move(so.top_ids);
  out.top_logprobs = std::move(so.top_logprobs);
  for (size_t i = 0; i < out.samples.size(); ++i) out.target[i] = out.samples[i].token;
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));  // the drafts' copy
  for (const ForwardStep& st : steps) m.seq(st.seq).mtp_length += int64_t(st.tokens.size());
  return out;
}

bool CudaRunner::supports_chained_rounds() const { return impl_->w.has_mtp && !impl_->comm; }

void CudaRunner::Impl::ensure_chain_buffers() {
  if (chain_tok) return;
  const size_t out_ints = size_t(opt.max_seqs) + size_t(2) * T_max;  // a round's [S][T][T] outputs
  const size_t ints = size_t(3) * slots + size_t(T_max) + out_ints;
  chain_dev = DeviceBuffer(ints * 4);
  FATHOM_CUDA_CHECK(cudaMemsetAsync(chain_dev.data(), 0, ints * 4, stream));
  chain_tok = chain_dev.as<int32_t>();
  chain_a = chain_tok + 2 * slots;
  chain_draft = chain_a + slots;
  round_out = chain_draft + T_max;
  for (int b = 0; b < 2; ++b) {
    FATHOM_CUDA_CHECK(cudaMallocHost(&round_host[b], out_ints * 4));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&round_done[b], cudaEventDisableTiming));
  }
}

// A greedy round queued: the verify step (each row's argmax), then the MTP layer over the same
// rows, then the round's outcome per state slot and its outputs to pinned memory. Chained steps
// (two kPendingToken) are planned as if the round in flight accepted nothing and made that
// round's own on the device before anything reads them.
void CudaRunner::launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                     std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks) {
  Impl& m = *impl_;
  (void)adjust, (void)masks;
  FATHOM_CHECK(m.w.has_mtp, "launch_verify_draft: this model has no MTP layer loaded");
  FATHOM_CHECK(rows.empty(), "launch_verify_draft: the CUDA runner chains greedy rounds only");
  FATHOM_CHECK(m.launched.empty() && m.rounds.size() < 2,
               "launch_verify_draft: two rounds (or an overlapped step) are still in flight");
  const auto pending = [](const ForwardStep& st) {
    return std::find(st.tokens.begin(), st.tokens.end(), kPendingToken) != st.tokens.end();
  };
  const bool chained = !steps.empty() && pending(steps[0]);
  int total = 0;
  for (const ForwardStep& st : steps) {
    FATHOM_CHECK(st.all_rows && st.keep_history, "launch_verify_draft: steps take all rows and keep history");
    FATHOM_CHECK(pending(st) == chained, "launch_verify_draft: chained and unchained steps in one round");
    Impl::Sequence& sq = m.seq(st.seq);
    if (chained) {
      FATHOM_CHECK(st.tokens.size() == 2 && st.tokens[0] == kPendingToken && st.tokens[1] == kPendingToken &&
                       !m.rounds.empty() && sq.hist_base >= 0 && sq.hist_len == 2 && sq.length == sq.hist_base + 2 &&
                       sq.mtp_length == sq.length && !sq.awaiting_outcome,
                   "launch_verify_draft: sequence ", st.seq, " has no round of one draft in flight to continue");
      m.check_step(st.seq, sq.hist_base + 2, st.tokens);  // the latest the round can sit; before any change
    } else {
      FATHOM_CHECK(sq.mtp_length == sq.length && !sq.awaiting_outcome, "launch_verify_draft: the MTP layer of sequence ",
                   st.seq, " is at ", sq.mtp_length, " tokens, the model at ", sq.length);
      m.check_step(st.seq, sq.length, st.tokens);
    }
    total += int(st.tokens.size());
  }
  FATHOM_CHECK(total <= m.T_max && total <= m.R_max && int(steps.size()) <= m.opt.max_seqs,
               "launch_verify_draft: the batch must fit one forward (", total, " tokens)");
  m.ensure_chain_buffers();
  const int64_t bs = m.opt.block_size;
  if (chained) {
    for (const ForwardStep& st : steps) {
      Impl::Sequence& sq = m.seq(st.seq);
      // As if the round in flight accepted nothing; blocks for the case it accepted its draft.
      sq.length = sq.mtp_length = sq.hist_base + 1;
      sq.awaiting_outcome = true;
      while (int64_t(sq.blocks.size()) * bs < sq.length + 3) {
        FATHOM_CHECK(!m.free_blocks.empty(), "KV cache is full (", m.kv_tokens, " tokens)");
        sq.blocks.push_back(m.free_blocks.back());
        m.free_blocks.pop_back();
      }
    }
  }
  const cudaStream_t s = m.stream;
  const Impl::Plan p = m.prepare(steps);
  m.run_round(p, chained);
  m.commit(steps);
  for (const ForwardStep& st : steps) m.seq(st.seq).mtp_length += int64_t(st.tokens.size());

  Impl::LaunchedRound lr;
  lr.T = total;
  lr.S = p.S;
  int offset = 0;
  for (const ForwardStep& st : steps) {
    lr.row_begin.push_back(offset);
    lr.seqs.push_back(st.seq);
    offset += int(st.tokens.size());
  }
  // The round's outputs (accepted counts, targets, drafts) to the host in one copy.
  lr.buf = m.round_buf;
  m.round_buf ^= 1;
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.round_host[lr.buf], m.round_out, size_t(p.S + 2 * total) * 4,
                                    cudaMemcpyDeviceToHost, s));
  FATHOM_CUDA_CHECK(cudaEventRecord(m.round_done[lr.buf], s));
  m.rounds.push_back(std::move(lr));
}

// The round's device work (prepare() has uploaded its metadata): a chained round's tokens,
// positions and KV slots from the round before's outcome and the DeltaNet state after that
// round's first token where its draft was refused; the verify step (each row's argmax in
// act.argmax, final hidden rows in act.sel); the MTP step on the same metadata, reading those
// two where they are (the MTP layer sits where the model was: same positions, KV slots and
// rows), its drafts in chain_draft; then each slot's outcome and the round's outputs in
// round_out. dmeta.ids keeps the tokens fed, which the outcome compares with the targets.
void CudaRunner::Impl::run_round(const Plan& p, bool chained) {
  const cudaStream_t s = stream;
  const Plan q = mtp_plan_on_verify(p);
  set_programmatic_launch(p.T <= kSplitTokens);
  const bool graphable = uses_graphs() && p.graphable && q.graphable &&
                         p.T * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
  const bool eager = round_graphs.run(s, GraphCache::Key{p.T, p.S, p.R, chained}, graphable, [&] {
    if (chained) {
      mtp_chain_patch(dmeta.ids, dmeta.pos, dmeta.slot_mapping, dmeta.state_slot, dmeta.block_tables, max_blocks,
                      opt.block_size, p.S, chain_tok, chain_a, s);
      if (n_linear > 0)
        restore_linear_states_unless(states.conv(0), states.rec(0), states.layer_history(0, nullptr), n_linear, slots,
                                     dmeta.state_slot, p.S, chain_a, /*entry=*/1, states.conv_values(),
                                     states.rec_values(), s);
    }
    hist_step = true;  // the verify step records the linear-attention history (rollback)
    run_layers(p);
    head(p);
    hist_step = false;
    run_mtp(q, act.argmax.as<int32_t>(), act.sel.as<float>(), chain_draft);
    mtp_round_outcome(dmeta.ids, act.argmax.as<int32_t>(), chain_draft, dmeta.seq_start, dmeta.state_slot, p.S,
                      chain_tok, chain_a, round_out, s);
  });
  hist_step = false;
  if (eager) collect_profile();
}

// Waits for the oldest launched round; a sequence that a chained round continues takes the
// drafts this one accepted into its lengths.
VerifyDraftOutput CudaRunner::finish_verify_draft() {
  Impl& m = *impl_;
  FATHOM_CHECK(!m.rounds.empty(), "finish_verify_draft: no round was launched");
  const Impl::LaunchedRound lr = std::move(m.rounds.front());
  m.rounds.pop_front();
  FATHOM_CUDA_CHECK(cudaEventSynchronize(m.round_done[lr.buf]));
  const int32_t* host = m.round_host[lr.buf];  // [S accepted][T targets][T drafts]
  VerifyDraftOutput out;
  out.row_begin = lr.row_begin;
  out.target.assign(host + lr.S, host + lr.S + lr.T);
  out.draft.assign(host + lr.S + lr.T, host + lr.S + 2 * lr.T);
  for (size_t i = 0; i < lr.seqs.size(); ++i) {
    auto it = m.seqs.find(lr.seqs[i]);
    if (it == m.seqs.end() || !it->second.awaiting_outcome) continue;  // removed, or not continued
    Impl::Sequence& sq = it->second;
    const int a = host[i];
    sq.length += a;
    sq.mtp_length += a;
    sq.hist_base += a;
    sq.awaiting_outcome = false;
  }
  return out;
}

}  // namespace fathom::cuda
