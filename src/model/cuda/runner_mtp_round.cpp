// An MTP round in one launch (ModelRunner::forward_verify_draft): the verify step, each row's
// token chosen on the device (the argmax, or the device sampler over the round's sampling rows),
// then the MTP layer over the same rows on the verify step's metadata (the same positions: no
// second upload, no host wait for one), reading the verify rows' chosen tokens and final hidden
// states on the device, and one wait at the end. At batch 1 on a small model a round otherwise
// pays a second host round trip for the draft step, as much as the MTP layer's own GPU time.
// Every round goes through launch_verify_draft / finish_verify_draft as one graph (run_round),
// and chains: a round's outcome stays on the device per state slot (mtp_round_outcome), and a
// round launched before it is read takes its tokens, positions, sampling rows and
// linear-attention state from there (mtp_chain_patch, restore_linear_states_unless), its
// host-side lengths settled when the round before it is read.
// Sampled drafts (RowSampling::draw_draft): the MTP rows go through the sampler too, drawing
// each draft from the MTP layer's distribution, and the q of the one the next round verifies is
// kept per state slot (SamplingBuffers::q_kept).
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

bool CudaRunner::supports_fused_mtp_round() const { return impl_->w.has_mtp; }

VerifyDraftOutput CudaRunner::forward_verify_draft(std::span<const ForwardStep> steps,
                                                   std::span<const RowSampling> rows,
                                                   std::span<const LogitAdjustment> adjust,
                                                   std::span<const uint32_t> masks) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "forward_verify_draft: this model has no MTP layer loaded");
  FATHOM_CHECK(m.rounds.empty(), "forward_verify_draft: a chained round is still in flight");
  launch_verify_draft(steps, rows, adjust, masks);
  return finish_verify_draft();
}

bool CudaRunner::supports_chained_rounds() const { return impl_->w.has_mtp && !impl_->comm; }

void CudaRunner::Impl::ensure_chain_buffers() {
  if (chain_tok) return;
  // A round's outputs: [S][T][T] ints, then a sampled round's T RowSamples.
  const size_t out_ints = size_t(opt.max_seqs) + size_t(2) * T_max + size_t(T_max) * (sizeof(RowSample) / 4);
  const size_t ints = size_t(3) * slots + size_t(2) * T_max + out_ints;
  chain_dev = DeviceBuffer(ints * 4);
  FATHOM_CUDA_CHECK(cudaMemsetAsync(chain_dev.data(), 0, ints * 4, stream));
  chain_tok = chain_dev.as<int32_t>();
  chain_a = chain_tok + 2 * slots;
  chain_draft = chain_a + slots;
  chain_fed = chain_draft + T_max;
  round_out = chain_fed + T_max;
  for (int b = 0; b < 2; ++b) {
    FATHOM_CUDA_CHECK(cudaMallocHost(&round_host[b], out_ints * 4));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&round_done[b], cudaEventDisableTiming));
  }
}

// A round queued: the verify step (each row's token: its argmax, or the device sampler over the
// round's rows), then the MTP layer over the same rows (its drafts: the argmax, or drawn from its
// distribution where rows draw drafts), then the round's outcome per state slot and its outputs
// to pinned memory. Chained steps (two kPendingToken) are planned as if the round in flight
// accepted nothing and made that round's own on the device before anything reads them.
void CudaRunner::launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                     std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "launch_verify_draft: this model has no MTP layer loaded");
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
  FATHOM_CHECK(rows.empty() || int(rows.size()) == total, "launch_verify_draft: ", rows.size(),
               " sampling rows for ", total, " tokens");
  m.ensure_chain_buffers();
  Impl::LaunchedRound lr;
  lr.T = total;
  lr.chained = chained;
  lr.buf = m.round_buf;
  Impl::SampledRound sr;
  if (!rows.empty()) m.upload_round_rows(steps, rows, adjust, masks, lr, sr);  // before any sequence changes
  else
    for (const ForwardStep& st : steps) m.seq(st.seq).round_draws = false;
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
  m.run_round(p, chained, lr.sampled ? &sr : nullptr);
  m.commit(steps);
  for (const ForwardStep& st : steps) m.seq(st.seq).mtp_length += int64_t(st.tokens.size());

  lr.S = p.S;
  int offset = 0;
  for (const ForwardStep& st : steps) {
    lr.row_begin.push_back(offset);
    lr.seqs.push_back(st.seq);
    offset += int(st.tokens.size());
  }
  // The round's outputs (accepted counts, targets, drafts; a sampled round's chosen rows after
  // them) to the host in one copy, a sampled round's top logprobs beside them.
  m.round_buf ^= 1;
  const size_t out_bytes = size_t(p.S + 2 * total) * 4 + (lr.sampled ? size_t(total) * sizeof(RowSample) : 0);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.round_host[lr.buf], m.round_out, out_bytes, cudaMemcpyDeviceToHost, s));
  if (lr.sampled) {
    if (lr.any_logprobs) {
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_top_ids_host[lr.buf], m.sampling.row_top_ids.data(),
                                        size_t(total) * kMaxTopLogprobs * 4, cudaMemcpyDeviceToHost, s));
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_top_lp_host[lr.buf], m.sampling.row_top_lp.data(),
                                        size_t(total) * kMaxTopLogprobs * 4, cudaMemcpyDeviceToHost, s));
    }
  }
  FATHOM_CUDA_CHECK(cudaEventRecord(m.round_done[lr.buf], s));
  m.rounds.push_back(std::move(lr));
}

// A sampled round's rows into the pinned half `lr.buf` and up to the device: the verify rows
// (a draft kDraftQKept resolved to the sequence's kept q where it is that draft's, else the
// deterministic rule), the MTP rows of the rows that draw drafts (mtp_draft_row, q_out = row), the
// adjustments renumbered, the token masks in row order. A chained step's rows are the engine's as
// if the round in flight accepted nothing; the device moves them (mtp_chain_patch). The draft
// rows follow the verify rows (row_params[T, 2T)), so both go up in one copy.
void CudaRunner::Impl::upload_round_rows(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                         std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                                         LaunchedRound& lr, SampledRound& sr) {
  const int T = int(rows.size()), b = lr.buf;
  const int64_t V = cfg.vocab_size, W = mask_words(V);
  size_t n_adjust = 0, n_masks = 0;
  bool kept_q = false;  // some row verifies a draft against a kept q
  for (const RowSampling& r : rows) {
    check_row_lists(r, adjust, masks, W, /*masks_later=*/false, "forward_verify_draft");
    FATHOM_CHECK(!r.skip && !r.keep_logits && r.q_out < 0 && (r.draft_q < 0 || r.draft_q == kDraftQKept),
                 "forward_verify_draft: a round's rows are read, keep no logits and draw no draft of their own");
    FATHOM_CHECK(lr.chained || r.draft != kDraftFromRound, "forward_verify_draft: kDraftFromRound outside a chained round");
    n_adjust += size_t(r.adjust_end - r.adjust_begin);
    n_masks += r.mask_row >= 0 ? 1 : 0;
    sr.draws = sr.draws || r.draw_draft;
    kept_q = kept_q || r.draft_q == kDraftQKept;
    sr.logprobs = sr.logprobs || r.logprobs >= 0;
    sr.no_argmax = sr.no_argmax && r.temperature > 0.f && V <= kSampleRowsStagedVocab;
    sr.all_draw = sr.all_draw && r.draw_draft && V <= kSampleRowsStagedVocab;
  }
  lr.sampled = true;
  lr.any_logprobs = sr.logprobs;
  if (sr.draws || kept_q) {
    if (size_t(T) > sampling.draft_rows && !rounds.empty()) FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (sampling.reserve_drafts(T, slots, V)) round_graphs.clear();  // their q buffers moved
  }
  sampling.reserve_adjustments(b, n_adjust);
  sampling.reserve_masks(b, n_masks * size_t(W));
  RowSampling* params = sampling.row_params_host[b];
  RowSampling* draft_params = params + T;
  LogitAdjustment* adjust_host = sampling.adjust_host[b];
  int32_t next_adjust = 0, next_mask = 0;
  for (size_t i = 0, r = 0; i < steps.size(); ++i) {
    Sequence& sq = seq(steps[i].seq);
    const bool round_before_draws = sq.round_draws;
    sq.round_draws = false;
    for (size_t k = 0; k < steps[i].tokens.size(); ++k, ++r) {
      RowSampling p = rows[r];
      if (p.draft_q == kDraftQKept) {
        if (lr.chained) p.draft_q = p.draft == kDraftFromRound && round_before_draws ? sq.slot : -1;
        else p.draft_q = sq.kept_token >= 0 && sq.kept_token == p.draft && sq.kept_draw == p.draw ? sq.slot : -1;
      }
      sr.verifies = sr.verifies || p.draft_q >= 0;
      p.state_slot = -1;
      next_adjust = append_adjustments(p, adjust, adjust_host, next_adjust);
      if (p.mask_row >= 0) {
        std::copy_n(masks.begin() + int64_t(p.mask_row) * W, W, sampling.mask_host[b] + int64_t(next_mask) * W);
        p.mask_row = next_mask++;
      }
      params[r] = p;
      if (sr.draws) {  // a row that does not draw its draft takes the MTP argmax (a greedy row)
        RowSampling d = mtp_draft_row(rows[r]);
        if (rows[r].draw_draft) d.q_out = int32_t(r);
        draft_params[r] = d;
      }
      lr.draw.push_back(rows[r].draw);
      lr.draws_draft.push_back(char(rows[r].draw_draft));
      sq.round_draws = sq.round_draws || rows[r].draw_draft;
    }
  }
  sr.adjust = next_adjust > 0;
  sr.masks = next_mask > 0;
  const cudaStream_t s = stream;
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(sampling.row_params.data(), params,
                                    size_t(sr.draws ? 2 * T : T) * sizeof(RowSampling), cudaMemcpyHostToDevice, s));
  if (sr.adjust)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(sampling.adjust_dev.data(), adjust_host,
                                      size_t(next_adjust) * sizeof(LogitAdjustment), cudaMemcpyHostToDevice, s));
  if (sr.masks)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(sampling.mask_dev.data(), sampling.mask_host[b], size_t(next_mask) * size_t(W) * 4,
                                      cudaMemcpyHostToDevice, s));
}

// The round's device work (prepare() has uploaded its metadata): a chained round's tokens,
// positions and KV slots (and a sampled round's rows) from the round before's outcome, and the
// DeltaNet state after that round's first token where its draft was refused; the verify step
// (each row's argmax in act.argmax, final hidden rows in act.sel; a sampled round's chosen rows in
// sampling.row_out); the MTP step on the same metadata, reading the chosen tokens and hidden rows
// where they are (the MTP layer sits where the model was: same positions, KV slots and rows),
// its drafts in chain_draft (drawn through the sampler where rows draw drafts, their q in
// q_drawn); then each slot's outcome (and kept q) and the round's outputs in round_out.
// dmeta.ids keeps the tokens fed, which a greedy outcome compares with the targets.
void CudaRunner::Impl::run_round(const Plan& p, bool chained, const SampledRound* sr) {
  const cudaStream_t s = stream;
  const Plan q = mtp_plan_on_verify(p);
  set_programmatic_launch(p.T <= kSplitTokens);
  // Adjustments and masks live in buffers that grow on demand: such rounds run eagerly.
  const bool graphable = uses_graphs() && p.graphable && q.graphable && (!sr || (!sr->adjust && !sr->masks)) &&
                         p.T * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
  const int64_t V = cfg.vocab_size;
  const int key = int(chained) | (sr ? sr->key() : 0);
  const bool eager = round_graphs.run(s, GraphCache::Key{p.T, p.S, p.R, key}, graphable, [&] {
    RowSampling* rows = sampling.row_params.as<RowSampling>();
    RowSampling* draft_rows = sr && sr->draws ? rows + p.T : nullptr;
    if (chained) {
      mtp_chain_patch(dmeta.ids, dmeta.pos, dmeta.slot_mapping, dmeta.state_slot, dmeta.block_tables, max_blocks,
                      opt.block_size, p.S, chain_tok, chain_a, sr ? rows : nullptr, draft_rows, s);
      if (n_linear > 0)
        restore_linear_states_unless(states.conv(0), states.rec(0), states.layer_history(0, nullptr), n_linear, slots,
                                     dmeta.state_slot, p.S, chain_a, /*entry=*/1, states.conv_values(),
                                     states.rec_values(), s);
    }
    hist_step = true;  // the verify step records the linear-attention history (rollback)
    run_layers(p);
    head(p, w.final_norm, sr && sr->no_argmax ? nullptr : act.argmax.as<int32_t>());
    hist_step = false;
    if (!sr) {
      run_mtp(q, act.argmax.as<int32_t>(), act.sel.as<float>(), chain_draft);
      mtp_round_outcome(dmeta.ids, act.argmax.as<int32_t>(), chain_draft, dmeta.seq_start, dmeta.state_slot, p.S,
                        chain_tok, chain_a, round_out, s);
      return;
    }
    // The samplers write their tokens where the MTP step and the outcome read them.
    RowSample* chosen = sampling.row_out.as<RowSample>();
    sample_rows(act.logits.as<float>(), p.T, int(V), rows, sr->adjust ? sampling.adjust_dev.as<LogitAdjustment>() : nullptr,
                chosen, sampling.row_top_ids.as<int32_t>(), sampling.row_top_lp.as<float>(), s, nullptr,
                sr->masks ? sampling.mask_dev.as<uint32_t>() : nullptr,
                sr->no_argmax ? nullptr : act.argmax.as<int32_t>(), sr->verifies ? sampling.q_kept.as<float>() : nullptr,
                chain_fed, /*programmatic=*/true);
    const bool mtp_argmax = !draft_rows || !sr->all_draw;
    run_mtp(q, chain_fed, act.sel.as<float>(), mtp_argmax ? chain_draft : nullptr);
    if (draft_rows)
      sample_rows(act.logits.as<float>(), p.T, int(V), draft_rows, nullptr, chosen + p.T, nullptr, nullptr, s, nullptr,
                  nullptr, mtp_argmax ? chain_draft : nullptr, sampling.q_drawn.as<float>(), chain_draft,
                  /*programmatic=*/true);
    mtp_round_outcome_sampled(chosen, chain_draft, rows, dmeta.seq_start, dmeta.state_slot, p.S, chain_tok, chain_a,
                              round_out, draft_rows ? sampling.q_drawn.as<float>() : nullptr,
                              draft_rows ? sampling.q_kept.as<float>() : nullptr, V, s);
  });
  hist_step = false;
  if (eager) collect_profile();
}

// Waits for the oldest launched round; a sequence that a chained round continues takes the
// drafts this one accepted into its lengths. A sequence whose draft this round drew keeps its
// position and token (the next unchained round's draft row finds its q by them).
VerifyDraftOutput CudaRunner::finish_verify_draft() {
  Impl& m = *impl_;
  FATHOM_CHECK(!m.rounds.empty(), "finish_verify_draft: no round was launched");
  const Impl::LaunchedRound lr = std::move(m.rounds.front());
  m.rounds.pop_front();
  FATHOM_CUDA_CHECK(cudaEventSynchronize(m.round_done[lr.buf]));
  const int32_t* host = m.round_host[lr.buf];  // [S accepted][T targets][T drafts], a sampled round's [T] rows
  VerifyDraftOutput out;
  out.row_begin = lr.row_begin;
  out.target.assign(host + lr.S, host + lr.S + lr.T);
  out.draft.assign(host + lr.S + lr.T, host + lr.S + 2 * lr.T);
  if (lr.sampled) {
    out.samples.resize(size_t(lr.T));
    std::memcpy(out.samples.data(), host + lr.S + 2 * lr.T, size_t(lr.T) * sizeof(RowSample));
    if (lr.any_logprobs) {
      const size_t n = size_t(lr.T) * kMaxTopLogprobs;
      out.top_ids.assign(m.sampling.row_top_ids_host[lr.buf], m.sampling.row_top_ids_host[lr.buf] + n);
      out.top_logprobs.assign(m.sampling.row_top_lp_host[lr.buf], m.sampling.row_top_lp_host[lr.buf] + n);
    }
  }
  for (size_t i = 0; i < lr.seqs.size(); ++i) {
    auto it = m.seqs.find(lr.seqs[i]);
    if (it == m.seqs.end()) continue;  // removed
    Impl::Sequence& sq = it->second;
    const int a = host[i];
    if (lr.sampled) {  // the draft of row r0 + a, drawn at its draw + 1 (a chained round's rows drew round_a further)
      const size_t at = size_t(lr.row_begin[i] + a);
      sq.kept_token = lr.draws_draft[at] ? out.draft[at] : -1;
      sq.kept_draw = lr.draw[at] + uint64_t(lr.chained ? sq.round_a : 0) + 1;
    } else {
      sq.kept_token = -1;
    }
    sq.round_a = a;
    if (!sq.awaiting_outcome) continue;  // not continued
    sq.length += a;
    sq.mtp_length += a;
    sq.hist_base += a;
    sq.awaiting_outcome = false;
  }
  return out;
}

}  // namespace fathom::cuda
