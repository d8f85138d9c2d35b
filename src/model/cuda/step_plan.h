// One forward of the CUDA engine as the host plans it: its tokens, sequences and output rows,
// where each sequence's rows start, and the attention runs. Also how a batch of steps is cut into
// forwards that fit the step limits (for_each_chunk) and where the pieces' rows go back
// (output_layout, hidden_copies), and the decode batch sizes that get a CUDA graph. Host-side
// arithmetic only: the metadata itself is written by runner_step.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "model/model_runner.h"

namespace fathom::cuda {

// Attention over runs of consecutive sequences: runs whose sequences have at least
// kPrefillRunTokens tokens each go to the prefill kernel, the others to the decode kernel. The
// kernel of each run is planned with the step (tensor_core: the tensor-core kernel of its kind,
// else the CUDA-core one), not chosen again in every layer.
inline constexpr int kPrefillRunTokens = 16;
struct AttentionRun {
  int t0 = 0, n = 0;  // tokens [t0, t0 + n) of the step
  bool prefill = false;
  bool tensor_core = true;
};

struct StepPlan {
  int T = 0, S = 0, R = 0, RL = 0;  // tokens, sequences, hidden rows, logits rows
  std::vector<int64_t> row_begin, logit_row_begin;  // per sequence
  int max_seq_tokens = 0;                           // the most tokens of one sequence
  std::vector<AttentionRun> attention_runs;
  // Only decode steps (one token) and draft verification steps (keep_history, all rows): the
  // shapes a CUDA graph keyed by (T, S, R, history) can replay.
  bool graphable = true;
  int pad = 0;  // padding rows at the end (a decode batch raised to a graph bucket)
};

// Rows forward() returns for `steps`: logits rows (n per all_rows step, else 1) and hidden rows
// (n per all_rows or all_hidden step, else 1), each step's first row of both.
struct OutputLayout {
  int64_t rows = 0, hidden_rows = 0;
  std::vector<int64_t> row_begin, hidden_row_begin;
};
OutputLayout output_layout(std::span<const ForwardStep> steps);

// Where each piece of a chunk (from for_each_chunk) comes from: its original step, its first
// token inside that step, and whether it ends the step. Recorded as the chunks are cut, not
// recovered from the token pointers: steps may share token storage (prefixes of one array).
struct Piece {
  size_t step = 0;
  int64_t offset = 0, n = 0;
  bool last = false;
};

// n rows from row `from` of a chunk's output to row `to` of the step's.
struct RowCopy {
  int64_t from, to, n;
};

// Where a chunk's hidden rows go in the step's output: every row of an all_rows or all_hidden
// piece, else the last piece's one row.
std::vector<RowCopy> hidden_copies(std::span<const ForwardStep> steps, const std::vector<Piece>& pieces,
                                   const StepPlan& p, const std::vector<int64_t>& hidden_row_begin);

// What one forward holds.
struct ChunkLimits {
  int tokens = 0, rows = 0, sequences = 0;
};

// Splits steps so each forward fits the limits; calls fn(batch, pieces) for each chunk
// (pieces[i]: where batch[i] comes from).
template <class Fn>
void for_each_chunk(std::span<const ForwardStep> steps, const ChunkLimits& limits, Fn&& fn) {
  std::vector<ForwardStep> batch;
  std::vector<Piece> pieces;
  int tokens = 0, rows = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    fn(std::span<const ForwardStep>(batch), static_cast<const std::vector<Piece>&>(pieces));
    batch.clear();
    pieces.clear();
    tokens = rows = 0;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    ForwardStep st = steps[i];
    size_t done = 0;
    while (done < st.tokens.size()) {
      const int room_t = limits.tokens - tokens, room_r = limits.rows - rows;
      const bool rows_each = st.all_rows || st.all_hidden;  // one output row per token
      int n = int(std::min<size_t>(st.tokens.size() - done, size_t(room_t)));
      if (rows_each) n = std::min(n, room_r);
      const bool last_piece = done + size_t(n) == st.tokens.size();
      // A keep_history step (draft verification) is never split: its state history is per step.
      const bool split_history = st.keep_history && !last_piece && !batch.empty();
      if (n <= 0 || (!rows_each && last_piece && room_r < 1) || int(batch.size()) >= limits.sequences ||
          split_history) {
        flush();
        continue;
      }
      ForwardStep piece = st;
      piece.tokens = st.tokens.subspan(done, size_t(n));
      batch.push_back(piece);
      pieces.push_back(Piece{i, int64_t(done), int64_t(n), last_piece});
      tokens += n;
      rows += rows_each ? n : 1;
      done += size_t(n);
      if (!last_piece) flush();  // the rest of this sequence goes after this piece
    }
  }
  flush();
}

// Decode batch sizes that get a CUDA graph: a plain decode step of S sequences is padded to the
// smallest bucket >= S, so a few graphs, captured at start-up, serve every batch size.
std::vector<int> graph_buckets(int max_seqs);
int graph_bucket(int max_seqs, int S);

}  // namespace fathom::cuda
