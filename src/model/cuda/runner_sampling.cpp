// Device sampling for the CUDA engine: forward passes that return chosen token ids instead of
// logits (the engine's serving path), and the MTP draft chain's argmax rows.
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/backend_switches.h"
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

// Unless the backend tuner found the device sampler wrong here (op "sampling": then the CPU
// sampler chooses from the logits).
bool CudaRunner::samples_on_device() const { return impl_->opt.kernels.device_sampling; }

// Waits for a chunk's results and copies them from the pinned output buffers into the launched
// step's output.
void CudaRunner::Impl::scatter(LaunchedStep& ls, const SampledChunk& c) {
  Impl& m = *this;
  FATHOM_CUDA_CHECK(cudaEventSynchronize(m.sampling.chunk_done[c.buf]));
  const int64_t H = m.cfg.hidden_size;
  for (int r = 0; r < c.RL; ++r) {
    const int64_t src = c.source[size_t(r)];
    if (src < 0) continue;
    ls.out.samples[size_t(src)] = m.sampling.row_out_host[c.buf][r];
    if (ls.wants_logprobs[size_t(src)]) {
      std::copy_n(m.sampling.row_top_ids_host[c.buf] + int64_t(r) * kMaxTopLogprobs, kMaxTopLogprobs,
                  ls.out.top_ids.begin() + src * kMaxTopLogprobs);
      std::copy_n(m.sampling.row_top_lp_host[c.buf] + int64_t(r) * kMaxTopLogprobs, kMaxTopLogprobs,
                  ls.out.top_logprobs.begin() + src * kMaxTopLogprobs);
    }
  }
  for (const auto& hc : c.hidden_copies)
    std::copy_n(c.hidden.begin() + hc.from * H, hc.n * H, ls.out.hidden.begin() + hc.to * H);
  const int64_t V = m.cfg.vocab_size;
  for (size_t i = 0; i < c.kept.size(); ++i) {
    ls.out.kept_rows.push_back(c.source[size_t(c.kept[i])]);
    const float* row = m.sampling.kept_host[c.buf] + int64_t(i) * V;
    ls.out.kept_logits.insert(ls.out.kept_logits.end(), row, row + V);
  }
}

void CudaRunner::launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                                bool defer_masks) {
  launch(steps, rows, adjust, /*want_hidden=*/false, masks, defer_masks);
}

void CudaRunner::launch(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                        std::span<const LogitAdjustment> adjust, bool want_hidden, std::span<const uint32_t> masks,
                        bool defer_masks) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.launched.size() < 2, "launch_sampled: two launched steps are not finished yet");
  FATHOM_CHECK(!m.deferred, "launch_sampled: the previous step still waits for its token masks");
  for (const ForwardStep& st : steps) m.check_step(st.seq, m.seq(st.seq).length, st.tokens);
  OutputLayout layout = output_layout(steps);
  FATHOM_CHECK(int64_t(rows.size()) == layout.rows, "forward_sampled: ", rows.size(), " sampling rows for ",
               layout.rows, " logits rows");
  const int64_t V = m.cfg.vocab_size, H = m.cfg.hidden_size, W = mask_words(V);
  for (const RowSampling& r : rows) {
    check_row_lists(r, adjust, masks, W, defer_masks, "forward_sampled");
    // Drafts drawn from q (RowSampling::q_out, draft_q, draw_draft) belong to MTP rounds.
    FATHOM_CHECK(r.q_out < 0 && r.draft_q < 0 && !r.draw_draft,
                 "forward_sampled: sampled-draft rows run in fused MTP rounds only (launch_verify_draft)");
  }
  Impl::LaunchedStep& ls = m.launched.emplace_back();
  ls.want_hidden = want_hidden;
  for (const RowSampling& r : rows) {
    ls.wants_logprobs.push_back(r.logprobs >= 0 && !r.skip);
    ls.any_logprobs = ls.any_logprobs || ls.wants_logprobs.back();
  }
  ls.out.rows = layout.rows;
  ls.out.row_begin = std::move(layout.row_begin);
  ls.out.samples.resize(size_t(ls.out.rows));
  if (ls.any_logprobs) {
    ls.out.top_ids.assign(size_t(ls.out.rows) * kMaxTopLogprobs, -1);
    ls.out.top_logprobs.assign(size_t(ls.out.rows) * kMaxTopLogprobs, 0.f);
  }
  if (ls.want_hidden) {
    ls.out.hidden_row_begin = std::move(layout.hidden_row_begin);
    ls.out.hidden.resize(size_t(layout.hidden_rows) * H);
  }

  if (defer_masks) {  // the sampler of the step's last chunk waits; earlier chunks could not
    int chunks = 0;
    m.for_each_chunk(steps, [&](std::span<const ForwardStep>, const std::vector<Piece>&) { ++chunks; });
    FATHOM_CHECK(chunks == 1, "launch_sampled: a step whose token masks come later must fit one forward (",
                 chunks, " chunks)");
  }
  try {
    m.for_each_chunk(steps, [&](std::span<const ForwardStep> batch, const std::vector<Piece>& pieces) {
      // A pending chunk (an earlier one of this launch, or the other launch's) in the output
      // buffers this chunk takes: read it first.
      for (Impl::LaunchedStep& other : m.launched)
        if (other.chunk && other.chunk->buf == m.sampling.io_buf) {
          m.scatter(other, *other.chunk);
          other.chunk.reset();
        }
      Impl::Plan p = m.prepare(batch);
      m.run(p);
      m.commit(batch);
      Impl::SampledChunk c;
      c.RL = p.RL, c.R = p.R;
      c.buf = m.sampling.io_buf;
      m.sampling.io_buf ^= 1;
      // The chunk's logits rows, in order, with their rows of `rows`; a prefill piece that does not
      // end its step has a row nobody reads, as have padding rows.
      c.source.assign(size_t(p.RL), -1);
      std::vector<int32_t> slot_of_row(size_t(p.RL), -1);
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& pc = pieces[i];
        const ForwardStep& st = steps[pc.step];
        const int64_t lrow = p.logit_row_begin[i];
        if (st.all_rows) {
          for (int64_t j = 0; j < pc.n; ++j) c.source[size_t(lrow + j)] = ls.out.row_begin[pc.step] + pc.offset + j;
        } else if (pc.last) {
          c.source[size_t(lrow)] = ls.out.row_begin[pc.step];
          slot_of_row[size_t(lrow)] = m.seq(st.seq).slot;  // the next step may read this token on the device
        }
      }
      if (ls.want_hidden) c.hidden_copies = hidden_copies(steps, pieces, p, ls.out.hidden_row_begin);
      size_t n_adjust = 0;
      for (int64_t src : c.source)
        if (src >= 0) n_adjust += size_t(rows[size_t(src)].adjust_end - rows[size_t(src)].adjust_begin);
      m.sampling.reserve_adjustments(c.buf, n_adjust);
      LogitAdjustment* adjust_host = m.sampling.adjust_host[c.buf];
      // The chunk's token masks (structured output).
      size_t n_masks = 0;
      for (int64_t src : c.source)
        if (src >= 0 && rows[size_t(src)].mask_row >= 0) ++n_masks;
      m.sampling.reserve_masks(c.buf, n_masks * size_t(W));
      RowSampling* params = m.sampling.row_params_host[c.buf];
      int32_t next = 0;
      for (int r = 0; r < p.RL; ++r) {
        RowSampling& dst = params[r];
        if (c.source[size_t(r)] < 0) {
          dst = RowSampling{};
          dst.skip = 1;
          continue;
        }
        dst = rows[size_t(c.source[size_t(r)])];
        dst.state_slot = slot_of_row[size_t(r)];
        next = append_adjustments(dst, adjust, adjust_host, next);
        if (dst.mask_row >= 0) {  // renumbered in the chunk's row order; copied when the masks are known
          c.mask_source.push_back(dst.mask_row);
          dst.mask_row = int32_t(c.mask_source.size()) - 1;
        }
        if (dst.keep_logits && !dst.skip && c.kept.size() < size_t(SamplingBuffers::kMaxKeptRows)) c.kept.push_back(r);
      }
      c.n_adjust = next;
      const cudaStream_t s = m.stream;
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_params.data(), params, size_t(p.RL) * sizeof(RowSampling),
                                        cudaMemcpyHostToDevice, s));
      if (next > 0)
        FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.adjust_dev.data(), adjust_host, size_t(next) * sizeof(LogitAdjustment),
                                          cudaMemcpyHostToDevice, s));
      if (defer_masks) {
        m.deferred = std::move(c);
        return;
      }
      m.sample_chunk(ls, std::move(c), masks);
    });
  } catch (...) {  // nothing of this launch will be finished
    m.launched.pop_back();
    m.deferred.reset();
    throw;
  }
}

// The rest of a launched chunk once its token masks are known: the masks (renumbered in the
// chunk's row order), the sampler, and the copies of its results to the pinned outputs.
void CudaRunner::Impl::sample_chunk(LaunchedStep& ls, SampledChunk c, std::span<const uint32_t> masks) {
  Impl& m = *this;
  const int64_t V = m.cfg.vocab_size, H = m.cfg.hidden_size, W = mask_words(V);
  const cudaStream_t s = m.stream;
  const int32_t n_masks = int32_t(c.mask_source.size());
  for (int32_t i = 0; i < n_masks; ++i) {
    const int64_t from = c.mask_source[size_t(i)];
    FATHOM_CHECK((from + 1) * W <= int64_t(masks.size()), "forward_sampled: a row's token mask lies outside the mask table");
    std::copy_n(masks.begin() + from * W, W, m.sampling.mask_host[c.buf] + int64_t(i) * W);
  }
  if (n_masks > 0)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.mask_dev.data(), m.sampling.mask_host[c.buf], size_t(n_masks) * size_t(W) * 4,
                                      cudaMemcpyHostToDevice, s));
  // Kept rows as they left lm_head: the sampler adjusts its rows in place.
  m.sampling.reserve_kept(c.buf, c.kept.size() * size_t(V));
  for (size_t i = 0; i < c.kept.size(); ++i)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.kept_host[c.buf] + int64_t(i) * V,
                                      m.act.logits.as<float>() + int64_t(c.kept[i]) * V, size_t(V) * 4,
                                      cudaMemcpyDeviceToHost, s));
  sample_rows(m.act.logits.as<float>(), c.RL, int(V), m.sampling.row_params.as<RowSampling>(),
              c.n_adjust > 0 ? m.sampling.adjust_dev.as<LogitAdjustment>() : nullptr, m.sampling.row_out.as<RowSample>(),
              m.sampling.row_top_ids.as<int32_t>(), m.sampling.row_top_lp.as<float>(), s, m.sampling.last_token.as<int32_t>(),
              n_masks > 0 ? m.sampling.mask_dev.as<uint32_t>() : nullptr, m.act.argmax.as<int32_t>());
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_out_host[c.buf], m.sampling.row_out.data(), size_t(c.RL) * sizeof(RowSample),
                                    cudaMemcpyDeviceToHost, s));
  if (ls.any_logprobs) {
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_top_ids_host[c.buf], m.sampling.row_top_ids.data(),
                                      size_t(c.RL) * kMaxTopLogprobs * 4, cudaMemcpyDeviceToHost, s));
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.sampling.row_top_lp_host[c.buf], m.sampling.row_top_lp.data(),
                                      size_t(c.RL) * kMaxTopLogprobs * 4, cudaMemcpyDeviceToHost, s));
  }
  if (ls.want_hidden) {  // pageable: this copy waits for the step (drafting needs no overlap)
    c.hidden.resize(size_t(c.R) * H);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(c.hidden.data(), m.act.sel.data(), c.hidden.size() * 4, cudaMemcpyDeviceToHost, s));
  }
  FATHOM_CUDA_CHECK(cudaEventRecord(m.sampling.chunk_done[c.buf], s));
  if (ls.chunk) {  // an earlier chunk of this launch (other buffers): read it now
    m.scatter(ls, *ls.chunk);
    ls.chunk.reset();
  }
  ls.chunk = std::move(c);
}

// On by default since the host tier pins its memory at start-up: a snapshot per unshared prompt
// cost 8-10% of a concurrency-64 load while its moves down pinned memory, 0.7-1.0% since
// (docs/perf.md, stop 62). FATHOM_DEVICE_PROMPT_ENDS=0 turns them off (for measurements); read
// when an engine is built.
bool CudaRunner::returns_kept_logits() const {
  const char* v = std::getenv("FATHOM_DEVICE_PROMPT_ENDS");
  return !(v && std::string_view(v) == "0");
}

// One forward chunk at most: the engine's token budget (the runner's chunk size).
int64_t CudaRunner::deferred_mask_tokens() const { return impl_->T_max; }

void CudaRunner::supply_masks(std::span<const uint32_t> masks) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.deferred.has_value(), "supply_masks: no launched step waits for its token masks");
  Impl::SampledChunk c = std::move(*m.deferred);
  m.deferred.reset();
  m.sample_chunk(m.launched.back(), std::move(c), masks);
}

SampledOutput CudaRunner::finish_sampled() {
  Impl& m = *impl_;
  FATHOM_CHECK(!m.launched.empty(), "finish_sampled: no step was launched");
  Impl::LaunchedStep& ls = m.launched.front();
  if (ls.chunk) m.scatter(ls, *ls.chunk);
  SampledOutput out = std::move(ls.out);
  m.launched.pop_front();
  return out;
}

SampledOutput CudaRunner::forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                          std::span<const LogitAdjustment> adjust, bool want_hidden,
                                          std::span<const uint32_t> masks) {
  launch(steps, rows, adjust, want_hidden, masks);
  return finish_sampled();
}

GreedyOutput CudaRunner::mtp_forward_greedy(std::span<const MtpStep> steps) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "this model has no MTP layer loaded");
  Impl::Plan p = m.prepare_mtp(steps);
  m.run_mtp_step(p);
  GreedyOutput out;
  out.row_begin = p.row_begin;
  out.ids.resize(size_t(p.R));
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(out.ids.data(), m.act.argmax.data(), out.ids.size() * 4, cudaMemcpyDeviceToHost,
                                    m.stream));
  m.finish_mtp(steps, p, &out.hidden);
  return out;
}

}  // namespace fathom::cuda
