#include "model/cuda/runner_activations.h"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "kernels/cuda/kernel_plan.h"

namespace fathom::cuda {
namespace {

DeviceBuffer f32(int64_t n) { return DeviceBuffer(size_t(std::max<int64_t>(n, 1)) * 4); }
DeviceBuffer b16(int64_t n) { return DeviceBuffer(size_t(std::max<int64_t>(n, 1)) * 2); }

// The widest output of a projection role among the loaded weights (fused matrices may carry
// padding rows), so that a buffer holds whatever linear() writes into it.
int64_t widest(const DeviceWeights& w, std::initializer_list<DeviceLinear DevLayer::*> roles) {
  int64_t most = 0;
  auto of = [&](const DevLayer& l) {
    for (auto role : roles) most = std::max<int64_t>(most, (l.*role).out);
  };
  for (const DevLayer& l : w.layers) of(l);
  if (w.has_mtp) of(w.mtp_layer);
  return most;
}

}  // namespace

AttentionSplitShape decode_split_shape(int step_tokens, AttentionSplitShape few) {
  static const bool pinned_many = [] {
    const char* v = std::getenv("FATHOM_ATTENTION_SPLITS");
    return v && std::string(v) == std::to_string(kManyTokenSplit.splits);
  }();
  return step_tokens <= kGemvMaxTokens && !pinned_many ? few : kManyTokenSplit;
}

void Activations::allocate(const ModelConfig& cfg, const DeviceWeights& w, const TensorSplit& tp,
                           const StepLimits& limits, int linear_layers) {
  const int H = cfg.hidden_size, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim;
  const int conv_dim = cfg.linear_conv_dim();
  const int K = std::max(1, cfg.num_experts_per_tok);
  const int64_t T = limits.tokens, R = limits.rows;
  x = f32(T * H);
  delta = f32(T * H);
  xn = b16(T * H);
  xn32 = f32(T * H);
  // Split-K decode attention: the partials of kSplitTokens query tokens at a time, in either shape.
  few_token_split = attention_few_token_split(nh, nkv, d);
  const int64_t rows = std::max(int64_t(std::min(kSplitTokens, kGemvMaxTokens)) * few_token_split.splits,
                                int64_t(kSplitTokens) * kManyTokenSplit.splits);
  part_m = f32(rows * nh);
  part_l = f32(rows * nh);
  part_acc = f32(rows * nh * d);
  q_raw = f32(T * std::max<int64_t>({cfg.attention_q_rows() + 2 * nkv * d, widest(w, {&DevLayer::attn_qkv, &DevLayer::q})}));
  k_raw = f32(T * nkv * d);
  v_raw = f32(T * nkv * d);
  q = f32(T * nh * d);
  gate = f32(T * nh * d);
  attn_out = b16(T * nh * d);
  mixed = f32(T * std::max<int64_t>({conv_dim + hv * dv + 2 * hv, widest(w, {&DevLayer::gdn_in, &DevLayer::qkv})}));
  zbuf = f32(T * hv * dv);
  bbuf = f32(T * std::max<int64_t>(hv, widest(w, {&DevLayer::b})));  // [b | a] when fused
  abuf = f32(T * hv);
  ubuf = f32(T * conv_dim);
  core = f32(T * hv * dv);
  if (linear_layers > 0 && gdn_chunked_supported(dk, dv) && T >= kGdnChunkedMinTokens)
    gdn_scratch = DeviceBuffer(gdn_chunked_scratch_bytes(int(T), kGdnChunkedMinTokens, hk, hv, dk, dv));
  normed = b16(T * std::max(hv * dv, nh * d));
  gdn_norm_counters = DeviceBuffer(size_t(std::max<int64_t>(T * hv, 1)) * 4);  // a step has at most T sequences
  FATHOM_CUDA_CHECK(cudaMemset(gdn_norm_counters.data(), 0, gdn_norm_counters.bytes()));
  const int E = std::max(1, cfg.num_experts), I = std::max(1, cfg.moe_intermediate_size);
  router_logits = f32(T * E);
  router_x3 = b16(T * 3 * H);
  topk_ids = DeviceBuffer(size_t(T) * K * 4);
  topk_w = f32(T * K);
  pair_h = b16(int64_t(limits.pairs) * I);
  group_buf = DeviceBuffer(size_t(moe_group_scratch_ints(limits.pairs, E)) * 4);
  // moe_route's count and moe_decode_fused's barrier start at zero.
  FATHOM_CUDA_CHECK(cudaMemset(group_buf.data(), 0, group_buf.bytes()));
  group = moe_group_scratch(group_buf.as<int32_t>(), limits.pairs, E);
  pair_out = f32(int64_t(limits.pairs) * H);
  const int S = std::max({1, cfg.shared_expert_intermediate_size, cfg.intermediate_size});
  sh_g = f32(T * std::max<int64_t>({padded_rows(2 * S + 1),
                                    widest(w, {&DevLayer::s_fused, &DevLayer::s_gate, &DevLayer::m_gate})}));
  sh_u = f32(T * std::max<int64_t>(S, widest(w, {&DevLayer::s_up, &DevLayer::m_up})));
  sh_h = b16(T * S);
  sh_out = f32(T * H);
  sh_gate = f32(T);
  eg_x = b16(T * H);
  eg_g = f32(T * I);
  eg_u = f32(T * I);
  eg_h = b16(T * I);
  eg_o = f32(T * H);
  eg_rows = DeviceBuffer(size_t(T) * K * 4);
  eg_w = f32(T * K);
  // The scratch of the most demanding quantized projection of any kind at a full step: a
  // dequantized NVFP4 / weight-only FP8 matrix, or a W8A8 projection's quantized activations.
  int64_t scratch = 0;
  w.for_each_linear([&](const DeviceLinear& dl) { scratch = std::max(scratch, linear_scratch_elems(dl, T)); });
  dequant = b16(scratch);
  sel = f32(R * H);
  if (w.has_mtp) {
    mtp_hidden = f32(T * H);
    mtp_e = b16(T * H);
    mtp_h = b16(T * H);
  }
  hidden_bf = b16(R * H);
  logits = f32(R * cfg.vocab_size);
  if (tp.is_split()) {
    logits_part = f32(R * tp.vocab_rows);
    logits_all = f32(R * tp.vocab_rows * tp.size);
  }
  argmax = DeviceBuffer(size_t(R) * 4);
  argmax_scratch = DeviceBuffer(argmax_scratch_bytes(int(R)));
  FATHOM_CUDA_CHECK(cudaMemset(argmax_scratch.data(), 0, argmax_scratch.bytes()));  // argmax_rows' counts start at zero
}

AttentionSplit Activations::decode_split(int step_tokens) const {
  const AttentionSplitShape shape = decode_split_shape(step_tokens, few_token_split);
  return {shape.splits, part_m.as<float>(), part_l.as<float>(), part_acc.as<float>(), shape.min_keys};
}

}  // namespace fathom::cuda
