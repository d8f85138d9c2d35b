// A forward's metadata (runner_impl.h, Meta): each sequence's tokens, positions, KV slots, output
// rows, state slot and block table, written into the pinned host mirror and uploaded in one copy;
// decode batches padded to a captured graph's size.
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

void CudaRunner::Impl::check_step(SequenceId id, int64_t start, std::span<const int32_t> tokens) const {
  const int64_t n = int64_t(tokens.size());
  if (start + n > opt.max_seq_len)
    throw SequenceError(id, "sequence of " + std::to_string(start + n) + " tokens exceeds the engine's max_seq_len " +
                                std::to_string(opt.max_seq_len));
  for (int32_t t : tokens)
    if ((t < 0 && t != kPendingToken) || t >= cfg.vocab_size)
      throw SequenceError(id, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                  std::to_string(cfg.vocab_size) + ")");
}

void CudaRunner::Impl::add_to_plan(Plan& p, int i, SequenceId id, Sequence& sq, int64_t start,
                                   std::span<const int32_t> tokens, bool all_rows, bool all_hidden) {
  const int n = int(tokens.size());
  const int bs = opt.block_size;
  check_step(id, start, tokens);
  while (int64_t(sq.blocks.size()) * bs < start + n) {
    FATHOM_CHECK(!free_blocks.empty(), "KV cache is full (", kv_tokens, " tokens)");
    sq.blocks.push_back(free_blocks.back());
    free_blocks.pop_back();
  }
  for (int j = 0; j < n; ++j) {
    const int t = p.T + j;
    const int64_t posn = start + j;
    hmeta.ids[t] = tokens[j] == kPendingToken ? -1 - sq.slot : tokens[j];
    hmeta.pos[t] = int32_t(posn);
    hmeta.seq_of_token[t] = i;
    hmeta.slot_mapping[t] = sq.blocks[posn / bs] * bs + int32_t(posn % bs);
  }
  p.row_begin.push_back(p.R);
  p.logit_row_begin.push_back(p.RL);
  if (all_rows || all_hidden) {
    for (int j = 0; j < n; ++j) hmeta.rows[p.R++] = p.T + j;
  } else {
    hmeta.rows[p.R++] = p.T + n - 1;
  }
  if (all_rows) {
    for (int j = n; j > 0; --j) hmeta.logit_rows[p.RL++] = p.R - j;
  } else {
    hmeta.logit_rows[p.RL++] = p.R - 1;
  }
  const bool prefill = n >= kPrefillRunTokens;
  if (p.attention_runs.empty() || p.attention_runs.back().prefill != prefill)
    p.attention_runs.push_back(attention_run(p.T, prefill));
  p.attention_runs.back().n += n;
  p.max_seq_tokens = std::max(p.max_seq_tokens, n);
  p.T += n;
  hmeta.seq_start[i + 1] = p.T;
  hmeta.state_slot[i] = sq.slot;
  std::fill(hmeta.block_tables + int64_t(i) * max_blocks, hmeta.block_tables + int64_t(i + 1) * max_blocks, 0);
  std::copy(sq.blocks.begin(), sq.blocks.end(), hmeta.block_tables + int64_t(i) * max_blocks);
}

CudaRunner::Impl::Plan CudaRunner::Impl::prepare(std::span<const ForwardStep> steps) {
  wait_uploads();
  Plan p;
  bool decode_only = true;
  p.S = int(steps.size());
  FATHOM_CHECK(p.S <= opt.max_seqs, "batch of ", p.S, " sequences exceeds max_seqs ", opt.max_seqs);
  hmeta.seq_start[0] = 0;
  hist_step = false;
  for (int i = 0; i < p.S; ++i) {
    const ForwardStep& st = steps[i];
    Sequence& sq = seq(st.seq);
    const int n = int(st.tokens.size());
    FATHOM_CHECK(n > 0, "forward: a step has no tokens");
    hmeta.keep_hist[i] = st.keep_history ? 1 : 0;
    if (st.keep_history) {
      FATHOM_CHECK(n <= opt.max_history, "a keep_history step of ", n, " tokens exceeds max_history ", opt.max_history);
      states.ensure_history(opt.max_history + 1);
      hist_step = true;
      sq.hist_base = sq.length;
      sq.hist_len = n;
    }
    if (n != 1 && !(st.keep_history && st.all_rows && !st.all_hidden)) p.graphable = false;
    if (n != 1 || st.keep_history) decode_only = false;
    add_to_plan(p, i, st.seq, sq, sq.length, st.tokens, st.all_rows, st.all_hidden);
  }
  if (decode_only && uses_graphs()) {
    const int B = graph_bucket(opt.max_seqs, p.S);
    if (fits_graph(B)) pad_to(p, B);
  }
  upload_meta(p.S);
  last_prepared = p;
  return p;
}

CudaRunner::Impl::Plan CudaRunner::Impl::padding_plan(int B) {
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the previous step's metadata copy has left meta_host
  Plan p;
  hmeta.seq_start[0] = 0;
  hist_step = false;
  p.attention_runs.push_back(attention_run(0, /*prefill=*/false));
  p.max_seq_tokens = 1;
  pad_to(p, B);
  upload_meta(p.S);
  return p;
}

void CudaRunner::Impl::pad_to(Plan& p, int B) {
  for (int i = p.S; i < B; ++i) {
    const int t = p.T;
    hmeta.ids[t] = 0;
    hmeta.pos[t] = 0;
    hmeta.seq_of_token[t] = i;
    hmeta.slot_mapping[t] = pad_block * opt.block_size;
    p.row_begin.push_back(p.R);
    p.logit_row_begin.push_back(p.RL);
    hmeta.rows[p.R++] = t;
    hmeta.logit_rows[p.RL++] = p.R - 1;
    p.attention_runs.back().n += 1;  // decode rows, like the batch's own
    p.T += 1;
    hmeta.seq_start[i + 1] = p.T;
    hmeta.state_slot[i] = pad_slot;
    hmeta.keep_hist[i] = 0;
    hmeta.block_tables[int64_t(i) * max_blocks] = pad_block;
  }
  p.pad = B - p.S;
  p.S = B;
}

void CudaRunner::Impl::upload_meta(int S) {
  const size_t ints = meta_ints - size_t(opt.max_seqs - S) * size_t(max_blocks);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(meta_dev.data(), meta_host, ints * 4, cudaMemcpyHostToDevice, stream));
  FATHOM_CUDA_CHECK(cudaEventRecord(meta_uploaded, stream));
}

}  // namespace fathom::cuda
