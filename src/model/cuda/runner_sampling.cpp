// Device sampling for the CUDA engine: forward passes that return chosen token ids instead of
// logits (the engine's serving path), and the MTP draft chain's argmax rows.
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

bool CudaRunner::samples_on_device() const { return true; }

SampledOutput CudaRunner::forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                          std::span<const LogitAdjustment> adjust, bool want_hidden) {
  Impl& m = *impl_;
  for (const ForwardStep& st : steps) m.check_step(st.seq, m.seq(st.seq).length, st.tokens);
  const int64_t V = m.cfg.vocab_size, H = m.cfg.hidden_size;
  Impl::OutputLayout layout = Impl::output_layout(steps);
  FATHOM_CHECK(int64_t(rows.size()) == layout.rows, "forward_sampled: ", rows.size(), " sampling rows for ",
               layout.rows, " logits rows");
  for (const RowSampling& r : rows)
    FATHOM_CHECK(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(),
                 "forward_sampled: a row's adjustments lie outside the list");
  bool any_logprobs = false;
  for (const RowSampling& r : rows) any_logprobs = any_logprobs || (r.logprobs >= 0 && !r.skip);
  SampledOutput out;
  out.rows = layout.rows;
  out.row_begin = std::move(layout.row_begin);
  out.samples.resize(size_t(out.rows));
  if (any_logprobs) {
    out.top_ids.assign(size_t(out.rows) * kMaxTopLogprobs, -1);
    out.top_logprobs.assign(size_t(out.rows) * kMaxTopLogprobs, 0.f);
  }
  if (want_hidden) {
    out.hidden_row_begin = std::move(layout.hidden_row_begin);
    out.hidden.resize(size_t(layout.hidden_rows) * H);
  }

  m.for_each_chunk(steps, [&](std::span<const ForwardStep> batch) {
    Impl::Plan p = m.prepare(batch);
    m.run(p);
    // The chunk's logits rows, in order, with their rows of `rows`; a prefill piece that does not
    // end its step has a row nobody reads.
    const std::vector<Impl::Piece> pieces = Impl::pieces_of(steps, batch);
    std::vector<int64_t> source(size_t(p.RL), -1);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Impl::Piece& pc = pieces[i];
      const int64_t lrow = p.logit_row_begin[i];
      if (steps[pc.step].all_rows) {
        for (int64_t j = 0; j < pc.n; ++j) source[size_t(lrow + j)] = out.row_begin[pc.step] + pc.offset + j;
      } else if (pc.last) {
        source[size_t(lrow)] = out.row_begin[pc.step];
      }
    }
    size_t n_adjust = 0;
    for (int64_t src : source)
      if (src >= 0) n_adjust += size_t(rows[size_t(src)].adjust_end - rows[size_t(src)].adjust_begin);
    if (n_adjust > m.adjust_cap) {
      if (m.adjust_host) cudaFreeHost(m.adjust_host);
      m.adjust_cap = std::max<size_t>(n_adjust, 2 * m.adjust_cap);
      FATHOM_CUDA_CHECK(cudaMallocHost(&m.adjust_host, m.adjust_cap * sizeof(LogitAdjustment)));
      m.adjust_dev = DeviceBuffer(m.adjust_cap * sizeof(LogitAdjustment));
    }
    int32_t next = 0;
    for (int r = 0; r < p.RL; ++r) {
      RowSampling& dst = m.row_params_host[r];
      if (source[size_t(r)] < 0) {
        dst = RowSampling{};
        dst.skip = 1;
        continue;
      }
      dst = rows[size_t(source[size_t(r)])];
      const int32_t count = dst.adjust_end - dst.adjust_begin;
      std::copy_n(adjust.begin() + dst.adjust_begin, count, m.adjust_host + next);
      dst.adjust_begin = next;
      dst.adjust_end = next + count;
      next += count;
    }
    const cudaStream_t s = m.stream;
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.row_params.data(), m.row_params_host, size_t(p.RL) * sizeof(RowSampling),
                                      cudaMemcpyHostToDevice, s));
    if (next > 0)
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.adjust_dev.data(), m.adjust_host, size_t(next) * sizeof(LogitAdjustment),
                                        cudaMemcpyHostToDevice, s));
    sample_rows(m.logits.as<float>(), p.RL, int(V), m.row_params.as<RowSampling>(),
                next > 0 ? m.adjust_dev.as<LogitAdjustment>() : nullptr, m.row_out.as<RowSample>(),
                m.row_top_ids.as<int32_t>(), m.row_top_lp.as<float>(), s);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.row_out_host, m.row_out.data(), size_t(p.RL) * sizeof(RowSample),
                                      cudaMemcpyDeviceToHost, s));
    if (any_logprobs) {
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.row_top_ids_host, m.row_top_ids.data(), size_t(p.RL) * kMaxTopLogprobs * 4,
                                        cudaMemcpyDeviceToHost, s));
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(m.row_top_lp_host, m.row_top_lp.data(), size_t(p.RL) * kMaxTopLogprobs * 4,
                                        cudaMemcpyDeviceToHost, s));
    }
    std::vector<float> hidden;
    if (want_hidden) {
      hidden.resize(size_t(p.R) * H);
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(hidden.data(), m.sel.data(), hidden.size() * 4, cudaMemcpyDeviceToHost, s));
    }
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
    m.commit(batch);
    for (int r = 0; r < p.RL; ++r) {
      const int64_t src = source[size_t(r)];
      if (src < 0) continue;
      out.samples[size_t(src)] = m.row_out_host[r];
      if (any_logprobs && rows[size_t(src)].logprobs >= 0) {
        std::copy_n(m.row_top_ids_host + int64_t(r) * kMaxTopLogprobs, kMaxTopLogprobs,
                    out.top_ids.begin() + src * kMaxTopLogprobs);
        std::copy_n(m.row_top_lp_host + int64_t(r) * kMaxTopLogprobs, kMaxTopLogprobs,
                    out.top_logprobs.begin() + src * kMaxTopLogprobs);
      }
    }
    if (want_hidden) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Impl::Piece& pc = pieces[i];
        const ForwardStep& st = steps[pc.step];
        const int64_t prow = p.row_begin[i];
        if (st.all_rows || st.all_hidden) {
          std::copy_n(hidden.begin() + prow * H, pc.n * H,
                      out.hidden.begin() + (out.hidden_row_begin[pc.step] + pc.offset) * H);
        } else if (pc.last) {
          std::copy_n(hidden.begin() + prow * H, H, out.hidden.begin() + out.hidden_row_begin[pc.step] * H);
        }
      }
    }
  });
  return out;
}

GreedyOutput CudaRunner::mtp_forward_greedy(std::span<const MtpStep> steps) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "this model has no MTP layer loaded");
  const int64_t H = m.cfg.hidden_size;
  Impl::Plan p = m.prepare_mtp(steps);
  m.run_mtp(p);
  GreedyOutput out;
  out.row_begin = p.row_begin;
  out.ids.resize(size_t(p.R));
  out.hidden.resize(size_t(p.R) * H);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(out.ids.data(), m.argmax.data(), out.ids.size() * 4, cudaMemcpyDeviceToHost,
                                    m.stream));
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(out.hidden.data(), m.sel.data(), out.hidden.size() * 4, cudaMemcpyDeviceToHost,
                                    m.stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (const MtpStep& st : steps) m.seq(st.seq).mtp_length += int64_t(st.next_tokens.size());
  return out;
}

}  // namespace fathom::cuda
