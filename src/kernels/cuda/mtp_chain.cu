// Chained MTP rounds of one draft (ops.h, ModelRunner::launch_verify_draft): a round's outcome
// kept per state slot on the device, and the next round's metadata made from it, so that the
// next round is queued before the host has read this one. The kernels sit between the round's
// other kernels in its graph, so they are programmatic launches (launch.cuh) like those.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kRowSampleWords = int(sizeof(RowSample) / 4);
static_assert(sizeof(RowSample) % 4 == 0 && alignof(RowSample) == 4, "a RowSample is copied as 32-bit words");

__global__ void round_outcome_kernel(const int32_t* fed, const int32_t* target, const int32_t* draft,
                                     const int32_t* seq_start, const int32_t* state_slot, int S, int32_t* chain_tok,
                                     int32_t* chain_a, int32_t* out) {
  pdl_prologue();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S) return;
  const int r0 = seq_start[i], n = seq_start[i + 1] - r0, slot = state_slot[i], T = seq_start[S];
  int a = 0;
  while (a + 1 < n && target[r0 + a] == fed[r0 + a + 1]) ++a;
  chain_tok[2 * slot] = target[r0 + a];
  chain_tok[2 * slot + 1] = draft[r0 + a];
  chain_a[slot] = a;
  out[i] = a;
  for (int j = r0; j < r0 + n; ++j) out[S + j] = target[j], out[S + T + j] = draft[j];
}

__global__ void chain_patch_kernel(int32_t* ids, int32_t* pos, int32_t* slot_mapping, const int32_t* state_slot,
                                   const int32_t* block_tables, int max_blocks, int block_size, int S,
                                   const int32_t* chain_tok, const int32_t* chain_a, RowSampling* rows,
                                   RowSampling* draft_rows) {
  pdl_prologue();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;  // token t = 2i + j of sequence i
  if (t >= 2 * S) return;
  const int i = t / 2, j = t % 2, slot = state_slot[i];
  const int a = chain_a[slot];
  const int p = pos[t] + a;
  pos[t] = p;
  slot_mapping[t] = block_tables[int64_t(i) * max_blocks + p / block_size] * block_size + p % block_size;
  ids[t] = chain_tok[2 * slot + j];
  if (!rows) return;
  rows[t].draw += uint64_t(a);
  if (rows[t].draft == kDraftFromRound) rows[t].draft = chain_tok[2 * slot + 1];
  if (draft_rows) draft_rows[t].draw += uint64_t(a);
}

// Block (i, c): sequence i's outcome (block c = 0 writes it), and where its rows draw their
// drafts, floats c * blockDim.x * 4 .. (c + 1) * blockDim.x * 4 - 1 of its kept q. Each block
// finds a itself (at most a round's rows of one sequence), so the copy needs no second launch.
__global__ void round_outcome_sampled_kernel(const RowSample* chosen, const int32_t* draft, const RowSampling* rows,
                                             const int32_t* seq_start, const int32_t* state_slot, int S,
                                             int32_t* chain_tok, int32_t* chain_a, int32_t* out, const float* q_drawn,
                                             float* q_kept, int64_t vocab) {
  pdl_prologue();
  const int i = blockIdx.x;
  const int r0 = seq_start[i], n = seq_start[i + 1] - r0, slot = state_slot[i], T = seq_start[S];
  int a = 0;
  while (a + 1 < n && chosen[r0 + a].accepted != 0) ++a;
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    chain_tok[2 * slot] = chosen[r0 + a].token;
    chain_tok[2 * slot + 1] = draft[r0 + a];
    chain_a[slot] = a;
    out[i] = a;
    for (int j = r0; j < r0 + n; ++j) {
      out[S + j] = chosen[j].token, out[S + T + j] = draft[j];
      const int32_t* words = reinterpret_cast<const int32_t*>(chosen + j);  // the row's RowSample too
      for (int k = 0; k < kRowSampleWords; ++k) out[S + 2 * T + kRowSampleWords * j + k] = words[k];
    }
  }
  if (!q_drawn || !rows[r0].draw_draft) return;
  const float* src = q_drawn + int64_t(r0 + a) * vocab;
  float* dst = q_kept + int64_t(slot) * vocab;
  const int64_t per_block = int64_t(blockDim.x) * 4;
  const int64_t begin = int64_t(blockIdx.y) * per_block, end = begin + per_block < vocab ? begin + per_block : vocab;
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) dst[k] = src[k];
}

}  // namespace

void mtp_round_outcome_sampled(const RowSample* chosen, const int32_t* draft, const RowSampling* rows,
                               const int32_t* seq_start, const int32_t* state_slot, int S, int32_t* chain_tok,
                               int32_t* chain_a, int32_t* out, const float* q_drawn, float* q_kept, int64_t vocab,
                               cudaStream_t s) {
  if (S <= 0) return;
  constexpr int kThreads = 256;
  const bool copies = q_drawn && q_kept;
  const dim3 grid(unsigned(S), copies ? unsigned((vocab + kThreads * 4 - 1) / (kThreads * 4)) : 1u);
  launch(round_outcome_sampled_kernel, grid, dim3(copies ? kThreads : 32), 0, s, chosen, draft, rows, seq_start,
         state_slot, S, chain_tok, chain_a, out, copies ? q_drawn : nullptr, q_kept, vocab);
}

void mtp_round_outcome(const int32_t* fed, const int32_t* target, const int32_t* draft, const int32_t* seq_start,
                       const int32_t* state_slot, int S, int32_t* chain_tok, int32_t* chain_a, int32_t* out,
                       cudaStream_t s) {
  if (S <= 0) return;
  launch(round_outcome_kernel, dim3((S + 127) / 128), dim3(128), 0, s, fed, target, draft, seq_start, state_slot, S,
         chain_tok, chain_a, out);
}

void mtp_chain_patch(int32_t* ids, int32_t* pos, int32_t* slot_mapping, const int32_t* state_slot,
                     const int32_t* block_tables, int max_blocks, int block_size, int S, const int32_t* chain_tok,
                     const int32_t* chain_a, RowSampling* rows, RowSampling* draft_rows, cudaStream_t s) {
  if (S <= 0) return;
  launch(chain_patch_kernel, dim3((2 * S + 127) / 128), dim3(128), 0, s, ids, pos, slot_mapping, state_slot,
         block_tables, max_blocks, block_size, S, chain_tok, chain_a, rows, draft_rows);
}

}  // namespace fathom::cuda
