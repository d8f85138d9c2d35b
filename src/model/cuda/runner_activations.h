// Every buffer a step's layers read and write, in one struct sized in one place (llm.c's
// activations): the residual stream, each mixer's and MLP's intermediates, the routed experts'
// pairs, the lm_head's rows. Sized for the step limits (tokens, output rows, expert pairs) and
// for the widest projection the loaded weights hold, so whatever linear() writes fits.
#pragma once
#include <cstdint>

#include "io/model_config.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/device_weights.h"
#include "model/tensor_split.h"

namespace fathom::cuda {

// The most a step holds: what the buffers are sized for and what a step is cut to fit.
struct StepLimits {
  int tokens = 0;      // T_max: tokens of one forward
  int rows = 0;        // R_max: output (hidden / logits) rows of one forward
  int pairs = 0;       // (token, routed expert) pairs the device-side MoE takes at once
  int max_seq_len = 0;  // positions, for the split-K attention's partials
};

// Query tokens the split-K decode attention takes at a time.
inline constexpr int kSplitTokens = 64;

// The split-K decode attention's shape for a step of `step_tokens` tokens: `few` (the model's
// attention_few_token_split) up to kGemvMaxTokens (the GEMV's class: a verify of that many tokens
// has a decode token's bits), else kManyTokenSplit; FATHOM_ATTENTION_SPLITS=16 pins the latter at
// every size (A/B runs).
AttentionSplitShape decode_split_shape(int step_tokens, AttentionSplitShape few);

struct Activations {
  // The residual stream and the normed layer input (bf16 for the projections; fp32 for the
  // router of decode steps).
  DeviceBuffer x, delta, xn, xn32;
  // Full attention: projections, rotated q, output gate, attention output, split-K partials.
  DeviceBuffer q_raw, k_raw, v_raw, q, gate, attn_out, part_m, part_l, part_acc;
  AttentionSplitShape few_token_split{1, 1};
  // Gated DeltaNet: [qkv | z | b | a] projections, convolution output, core output, gated norm,
  // and the chunked kernel's per-chunk products (prefill-sized steps only).
  DeviceBuffer mixed, zbuf, bbuf, abuf, ubuf, core, normed, gdn_scratch;
  // The recurrent kernel's per-(sequence, head) counts for the gated norm it runs (zeroed here;
  // every launch leaves them zero).
  DeviceBuffer gdn_norm_counters;
  // MoE: router logits (and its split bf16 input), top-k, the pairs' hidden and output rows.
  DeviceBuffer router_logits, router_x3, topk_ids, topk_w, pair_h, pair_out, group_buf;
  MoeGroupScratch group;
  // The shared expert and the dense MLP.
  DeviceBuffer sh_g, sh_u, sh_h, sh_out, sh_gate;
  // bf16 experts grouped on the host (steps past the device path's pairs).
  DeviceBuffer eg_x, eg_g, eg_u, eg_h, eg_o, eg_rows, eg_w;
  // linear()'s scratch: NVFP4 / weight-only FP8 weights dequantized for steps past the GEMV
  // sizes, or a W8A8 projection's E4M3 activations.
  DeviceBuffer dequant;
  // Output rows: selected hidden states, their normed bf16 form, logits (a split lm_head's own
  // slice and every rank's), argmax and its blocks' posts.
  DeviceBuffer sel, hidden_bf, logits, logits_part, logits_all, argmax, argmax_scratch;
  // The MTP layer's inputs: hidden rows, normed embedding and hidden halves.
  DeviceBuffer mtp_hidden, mtp_e, mtp_h;

  // Sizes every buffer. `cfg` is this rank's; `linear_layers` > 0 when the model has DeltaNet.
  void allocate(const ModelConfig& cfg, const DeviceWeights& w, const TensorSplit& tp, const StepLimits& limits,
                int linear_layers);
  // The split-K decode attention's shape and partials for the decode tokens of a step of
  // `step_tokens` tokens, taken kSplitTokens at a time.
  AttentionSplit decode_split(int step_tokens) const;
};

}  // namespace fathom::cuda
