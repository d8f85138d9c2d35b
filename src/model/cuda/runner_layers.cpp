// The CUDA engine's layers (CudaRunner::Impl): a decoder layer (norms, attention or Gated
// DeltaNet, MLP or MoE), the final norm and lm_head, and the MTP draft layer's step.
#include "model/cuda/runner_impl.h"

#include <cstdlib>
#include <string_view>
#include <utility>

#include "kernels/cuda/backend_switches.h"

namespace fathom::cuda {
namespace {

// The decode-step fusions (issue 32): router + top-k + grouping in one launch, the conv as the
// DeltaNet projection's epilogue, the gated norm in the recurrent kernel, the MoE combine in the
// next layer's input norm; each has the bits of the launches it replaces. All of them apply to
// steps of at most kGemvMaxTokens tokens; FATHOM_DECODE_FUSION=0 turns them off (A/B runs).
bool decode_fusion(int T) {
  static const bool on = [] {
    const char* v = std::getenv("FATHOM_DECODE_FUSION");
    return !(v && std::string_view(v) == "0");
  }();
  return on && T <= kGemvMaxTokens;
}

// A one-token MoE block as one launch (moe_decode_fused): FATHOM_MOE_FUSED=1 turns it on.
bool moe_fused(int T) {
  static const bool on = [] {
    const char* v = std::getenv("FATHOM_MOE_FUSED");
    return v && std::string_view(v) == "1";
  }();
  return on && T == 1 && decode_fusion(T);
}

}  // namespace

// One decoder layer on the residual stream x: input norm (fused with adding the previous
// layer's output `delta`, unless `first`), the mixer, post norm, the MLP or MoE; the layer's
// output is left in `delta`. Used by the main layers and the MTP layer alike.
void CudaRunner::Impl::decoder_layer(const DevLayer& l, const Plan& p, bool first) {
  const cudaStream_t s = stream;
  const int H = cfg.hidden_size, T = p.T;
  const float eps = float(cfg.rms_norm_eps);
  const bool zc = cfg.norm_zero_centered;
  float* X = act.x.as<float>();
  float* D = act.delta.as<float>();
  bf16_t* XN = act.xn.as<bf16_t>();
  if (first) {
    Scope sc(profiler, "norm");
    rms_norm(X, l.input_norm, XN, nullptr, T, H, eps, zc, s);
  } else {
    add_input_norm(l, T);
  }
  if (l.type == LayerType::FullAttention) attention_block(l, p);
  else gdn_block(l, p);
  {
    Scope sc(profiler, "norm");
    // The router's input: fp32 for decode and verify steps, already split for its bf16 product
    // in prefill-sized ones.
    const bool split = l.is_moe && router_split(l, T);
    add_rms_norm(X, D, l.post_norm, XN, T, H, eps, zc, s, l.is_moe && !split ? act.xn32.as<float>() : nullptr,
                 split ? act.router_x3.as<bf16_t>() : nullptr);
  }
  if (l.is_moe) moe_block(l, p);
  else mlp_block(l.m_gate, l.m_up, l.m_down, XN, act.delta.array<float>(), T);
  reduce_partial(D, T);
}

void CudaRunner::Impl::add_input_norm(const DevLayer& l, int T) {
  Scope sc(profiler, "norm");
  const int H = cfg.hidden_size;
  const float eps = float(cfg.rms_norm_eps);
  const bool zc = cfg.norm_zero_centered;
  float* X = act.x.as<float>();
  float* D = act.delta.as<float>();
  bf16_t* XN = act.xn.as<bf16_t>();
  const bool pending = std::exchange(combine_pending, false);
  if (pending && combine_add_rms_norm(X, pending_combine, l.input_norm, XN, T, H, eps, zc, stream)) return;
  if (pending) {
    const MoeCombineRows& c = pending_combine;
    moe_combine_pairs(c.pair_out, D, T, c.K, H, c.shared, c.shared_gate, c.gate_ld, stream, c.topk_ids);
  }
  add_rms_norm(X, D, l.input_norm, XN, T, H, eps, zc, stream);
}

void CudaRunner::Impl::run_layers(const Plan& p) {
  const cudaStream_t s = stream;
  const int H = cfg.hidden_size, T = p.T;
  float* X = act.x.as<float>();
  float* D = act.delta.as<float>();
  {
    Scope sc(profiler, "embedding");
    embedding(dmeta.ids, w.embed, X, T, H, s, sampling.last_token.as<int32_t>());
  }
  for (size_t li = 0; li < w.layers.size(); ++li) {
    defer_combine = decode_fusion(p.T) && !comm && li + 1 < w.layers.size();
    decoder_layer(w.layers[li], p, /*first=*/li == 0);
  }
  defer_combine = false;
  Scope sc(profiler, "norm");
  add_inplace(X, D, int64_t(T) * H, s);
}

void CudaRunner::Impl::attention_block(const DevLayer& l, const Plan& p) {
  const cudaStream_t s = stream;
  const int T = p.T, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  const float *qp = act.q_raw.as<float>(), *kp = act.k_raw.as<float>(), *vp = act.v_raw.as<float>();
  int64_t qkv_ld = 0;
  {
    Scope sc(profiler, "attn.proj");
    if (l.attn_qkv.out > 0) {
      linear(l.attn_qkv, act.xn.as<bf16_t>(), act.q_raw.array<float>(), T, dq, s, opt.kernels);
      qkv_ld = l.attn_qkv.out;
      kp = qp + (qkv_ld - 2 * nkv * d);
      vp = kp + nkv * d;
    } else {
      linear(l.q, act.xn.as<bf16_t>(), act.q_raw.array<float>(), T, dq, s, opt.kernels);
      linear(l.k, act.xn.as<bf16_t>(), act.k_raw.array<float>(), T, dq, s, opt.kernels);
      linear(l.v, act.xn.as<bf16_t>(), act.v_raw.array<float>(), T, dq, s, opt.kernels);
    }
  }
  {
    Scope sc(profiler, "attn.core");
    attention_prepare(qp, kp, vp, l.q_norm, l.k_norm, dmeta.pos, dmeta.slot_mapping, act.q.as<float>(),
                      act.gate.as<float>(), kv.view(l.attn_index, l.k_scale, l.v_scale), T,
                      nh, nkv, d, cfg.rotary_dim(), float(cfg.rope_theta), float(cfg.rms_norm_eps),
                      cfg.attn_output_gate, cfg.norm_zero_centered, s, qkv_ld);
    attend(l, p);
  }
  {
    Scope sc(profiler, "attn.proj");
    linear(l.o, act.attn_out.as<bf16_t>(), act.delta.array<float>(), T, dq, s, opt.kernels);
  }
  reduce_partial(act.delta.as<float>(), T);
}

// Attention over the paged cache, by the plan's runs and the kernels planned for them: prefill
// runs on the tensor-core prefill kernel, decode and verify tokens on the tensor-core split-K
// decode kernel, kSplitTokens tokens at a time, or either on the CUDA-core kernels where the
// backend tuner chose them or the head shape is not covered (attention_run).
void CudaRunner::Impl::attend(const DevLayer& l, const Plan& p) {
  const cudaStream_t s = stream;
  const int d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const float* g = cfg.attn_output_gate ? act.gate.as<float>() : nullptr;
  const KvCacheView cache = kv.view(l.attn_index, l.k_scale, l.v_scale);
  const int32_t *pos = dmeta.pos, *seq_of = dmeta.seq_of_token;
  const AttentionSplit split = act.decode_split(p.T);
  auto attend_tokens = [&](int t0, int n, bool prefill, bool tensor_core) {
    const int64_t o = int64_t(t0) * nh * d;
    const float* q = act.q.as<float>() + o;
    const float* gt = g ? g + o : nullptr;
    bf16_t* out = act.attn_out.as<bf16_t>() + o;
    if (prefill && tensor_core) {
      FATHOM_CHECK(paged_attention_prefill(q, gt, cache, pos + t0, seq_of + t0, dmeta.block_tables, max_blocks,
                                           opt.block_size, out, n, nh, nkv, d, s),
                   "the tensor-core prefill attention refused a step it was planned for");
    } else if (tensor_core) {
      FATHOM_CHECK(paged_attention_decode(q, gt, cache, pos + t0, seq_of + t0, dmeta.block_tables, max_blocks,
                                          opt.block_size, out, n, nh, nkv, d, s, split),
                   "the tensor-core decode attention refused a step it was planned for");
    } else {
      paged_attention(q, gt, cache, pos + t0, seq_of + t0, dmeta.block_tables, max_blocks, opt.block_size, out, n, nh, nkv,
                      d, s, prefill ? nullptr : &split);
    }
  };
  for (const AttentionRun& r : p.attention_runs) {
    if (r.prefill) {
      attend_tokens(r.t0, r.n, true, r.tensor_core);
      continue;
    }
    for (int c = 0; c < r.n; c += kSplitTokens) attend_tokens(r.t0 + c, std::min(kSplitTokens, r.n - c), false, r.tensor_core);
  }
}

void CudaRunner::Impl::gdn_block(const DevLayer& l, const Plan& p) {
  const cudaStream_t s = stream;
  const int T = p.T;
  const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
  const int conv_dim = cfg.linear_conv_dim();
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  float* cs = states.conv(l.linear_index);
  float* rs = states.rec(l.linear_index);
  const StateHistory h = hist_step ? states.layer_history(l.linear_index, dmeta.keep_hist) : StateHistory{};
  // Projections: one fused GEMM ([qkv | z | b | a] per row) or four.
  const float *mix_p, *z_p, *b_p, *a_p;
  int64_t mix_ld, z_ld, ba_ld;
  bool conv_done = false;
  {
    Scope sc(profiler, "gdn.proj");
    if (l.gdn_in.out > 0) {
      const int64_t W = l.gdn_in.out;
      // At decode sizes the conv of the q/k/v rows runs as the projection's epilogue.
      const DeviceLinear& in = l.gdn_in;
      conv_done = decode_fusion(T) && !in.is_fp8() && !in.is_fp4() && in.bf16 &&
                  gdn_in_proj_conv(act.xn.as<bf16_t>(), in.bf16, act.mixed.as<float>(), T, in.out, in.in, l.conv_w, cs,
                                   dmeta.seq_start, dmeta.state_slot, act.ubuf.as<float>(), p.S, conv_dim, kc,
                                   hist_step ? &h : nullptr, opt.kernels.gemv_max_tokens, s);
      if (!conv_done) linear(l.gdn_in, act.xn.as<bf16_t>(), act.mixed.array<float>(), T, dq, s, opt.kernels);
      mix_p = act.mixed.as<float>();
      z_p = mix_p + conv_dim;
      b_p = z_p + int64_t(hv) * dv;
      a_p = b_p + hv;
      mix_ld = z_ld = ba_ld = W;
    } else {
      // Four projections, or [qkv | z] (FP8) and [b | a] (bf16) in two.
      linear_pair(l.qkv, l.b, act.xn.as<bf16_t>(), act.mixed.array<float>(), act.bbuf.array<float>(), T, dq, s,
                  opt.kernels);
      mix_p = act.mixed.as<float>();
      b_p = act.bbuf.as<float>();
      if (l.z.out > 0) {
        linear(l.z, act.xn.as<bf16_t>(), act.zbuf.array<float>(), T, dq, s, opt.kernels);
        z_p = act.zbuf.as<float>();
        mix_ld = conv_dim;
        z_ld = int64_t(hv) * dv;
      } else {
        z_p = mix_p + conv_dim;
        mix_ld = z_ld = l.qkv.out;
      }
      if (l.a.out > 0) {
        linear(l.a, act.xn.as<bf16_t>(), act.abuf.array<float>(), T, dq, s, opt.kernels);
        a_p = act.abuf.as<float>();
        ba_ld = hv;
      } else {
        a_p = b_p + hv;
        ba_ld = l.b.out;
      }
    }
  }
  bool normed = false;
  {
    if (!conv_done) {
      Scope sc(profiler, "gdn.conv");
      gdn_conv(mix_p, mix_ld, l.conv_w, cs, dmeta.seq_start, dmeta.state_slot, act.ubuf.as<float>(), p.S, conv_dim, kc,
               s, hist_step ? &h : nullptr, p.max_seq_tokens);
    }
    {
      // Prefill-sized sequences take the chunked form (unless the tuner chose the recurrent one);
      // the others (decode, verify) the recurrent one, whose bits do not depend on the step's
      // other sequences.
      const bool prefill = !hist_step && p.max_seq_tokens >= kGdnChunkedMinTokens;
      const bool chunked = prefill && opt.kernels.gdn_chunked && act.gdn_scratch.bytes() > 0;
      const int long_from = chunked ? kGdnChunkedMinTokens : 0;
      Scope sc(profiler, "gdn.recurrent");
      // The gated norm rides on the recurrent kernel where it can.
      const GatedNormFuse fuse{z_p, z_ld, l.gnorm, act.normed.as<bf16_t>(), float(cfg.rms_norm_eps),
                               act.gdn_norm_counters.as<uint32_t>()};
      normed = gdn_recurrent(act.ubuf.as<float>(), b_p, a_p, ba_ld, l.a_log, l.dt_bias, rs, dmeta.seq_start,
                             dmeta.state_slot, act.core.as<float>(), p.S, hk, hv, dk, dv, s, hist_step ? &h : nullptr,
                             long_from, prefill ? kGdnPrefillOp : kGdnDecodeOp, opt.kernels.gdn_decode_smem,
                             decode_fusion(T) ? &fuse : nullptr);
      if (long_from > 0)
        gdn_chunked(act.ubuf.as<float>(), b_p, a_p, ba_ld, l.a_log, l.dt_bias, rs, dmeta.seq_start, dmeta.state_slot,
                    act.core.as<float>(), p.S, hk, hv, dk, dv, long_from, T, p.max_seq_tokens,
                    act.gdn_scratch.array<uint8_t>(), s);
    }
    if (!normed) {
      Scope sc(profiler, "gdn.norm");
      gated_rms_norm(act.core.as<float>(), z_p, z_ld, hv, l.gnorm, act.normed.as<bf16_t>(), T * hv, dv,
                     float(cfg.rms_norm_eps), s);
    }
  }
  {
    Scope sc(profiler, "gdn.proj");
    linear(l.out, act.normed.as<bf16_t>(), act.delta.array<float>(), T, dq, s, opt.kernels);
  }
  reduce_partial(act.delta.as<float>(), T);
}

void CudaRunner::Impl::mlp_block(const DeviceLinear& g, const DeviceLinear& u, const DeviceLinear& dn,
                                 const bf16_t* in, DeviceArray<float> out, int T) {
  const cudaStream_t s = stream;
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  linear(g, in, act.sh_g.array<float>(), T, dq, s, opt.kernels);
  linear(u, in, act.sh_u.array<float>(), T, dq, s, opt.kernels);
  silu_mul(act.sh_g.as<float>(), act.sh_u.as<float>(), act.sh_h.as<bf16_t>(), int64_t(T) * g.out, s);
  linear(dn, act.sh_h.as<bf16_t>(), out, T, dq, s, opt.kernels);
}

// The shared expert of a MoE layer: output in sh_out; returns where token t's gate logit is
// (at [t * gate_ld]), or null without a shared expert.
const float* CudaRunner::Impl::shared_expert(const DevLayer& l, int T, cudaStream_t s, int64_t* gate_ld) {
  Scope sc(profiler, "moe.shared");
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  if (l.has_shared && l.s_fused.out > 0) {  // [gate | up | gate logit], or [gate | up] (FP8) and the logit
    const int S = l.s_down.in;
    if (l.s_gate_logit.out > 0)
      linear_pair(l.s_fused, l.s_gate_logit, act.xn.as<bf16_t>(), act.sh_g.array<float>(), act.sh_gate.array<float>(),
                  T, dq, s, opt.kernels);
    else
      linear(l.s_fused, act.xn.as<bf16_t>(), act.sh_g.array<float>(), T, dq, s, opt.kernels);
    silu_mul_rows(act.sh_g.as<float>(), l.s_fused.out, act.sh_h.as<bf16_t>(), T, S, s);
    linear(l.s_down, act.sh_h.as<bf16_t>(), act.sh_out.array<float>(), T, dq, s, opt.kernels);
    if (l.s_gate_logit.out > 0) {
      *gate_ld = 1;
      return act.sh_gate.as<float>();
    }
    *gate_ld = l.s_fused.out;
    return act.sh_g.as<float>() + 2 * S;
  }
  if (l.has_shared) {
    mlp_block(l.s_gate, l.s_up, l.s_down, act.xn.as<bf16_t>(), act.sh_out.array<float>(), T);
    linear(l.s_gate_logit, act.xn.as<bf16_t>(), act.sh_gate.array<float>(), T, dq, s, opt.kernels);
    *gate_ld = 1;
    return act.sh_gate.as<float>();
  }
  return nullptr;
}

// A MoE layer's routing of T tokens (ids and weights into topk_ids / topk_w): at one token,
// with FATHOM_MOE_FUSED=1, the routed experts in the same launch; at decode sizes router, top-k
// and the packed experts' grouping in one launch; else the router product, then top-k (grouped
// where it fits).
CudaRunner::Impl::MoeRouting CudaRunner::Impl::route(const DevLayer& l, int T) {
  const cudaStream_t s = stream;
  const int H = cfg.hidden_size, E = cfg.num_experts, K = cfg.num_experts_per_tok;
  bool grouped = false;  // the packed experts' pairs grouped by moe_route
  if (moe_fused(T) && l.packed && !tp.expert_parallel && !router_split(l, T)) {
    Scope sc(profiler, "moe.experts");
    if (moe_decode_fused(l.router.f32, act.xn32.as<float>(), act.router_logits.as<float>(), E, H, K,
                         cfg.norm_topk_prob, l.pexperts, act.xn.as<bf16_t>(), act.topk_ids.as<int32_t>(),
                         act.topk_w.as<float>(), act.pair_h.as<bf16_t>(), act.pair_out.as<float>(), act.group,
                         opt.kernels.moe, s))
      return MoeRouting::FusedWithExperts;
  }
  {
    Scope sc(profiler, "moe.router");
    // Decode sizes: router, top-k and the experts' grouping in one launch.
    if (decode_fusion(T) && l.packed && !tp.expert_parallel && !router_split(l, T))
      grouped = moe_route(l.router.f32, act.xn32.as<float>(), act.router_logits.as<float>(), T, E, H, K,
                          cfg.norm_topk_prob, act.topk_ids.as<int32_t>(), act.topk_w.as<float>(), act.group,
                          moe_fp4_tile_tokens(l.pexperts, T, K, opt.kernels.moe), s);
    if (!grouped) {
      if (router_split(l, T)) {  // router_x3 from the norm before the block
        gemm_bf16(act.router_x3.as<bf16_t>(), l.router3.bf16, act.router_logits.as<float>(), T, E, 3 * H, s,
                  opt.kernels);
      } else {
        linear_f32(l.router, act.xn32.as<float>(), act.router_logits.as<float>(), T, s);
      }
      if (l.packed && !tp.expert_parallel)  // top-k and the grouping in one launch where it fits
        grouped = moe_topk_group(act.router_logits.as<float>(), act.topk_ids.as<int32_t>(), act.topk_w.as<float>(), T,
                                 E, K, cfg.norm_topk_prob, act.group,
                                 moe_fp4_tile_tokens(l.pexperts, T, K, opt.kernels.moe), s);
      if (!grouped)
        moe_topk(act.router_logits.as<float>(), act.topk_ids.as<int32_t>(), act.topk_w.as<float>(), T, E, K,
                 cfg.norm_topk_prob, s);
      if (tp.expert_parallel) moe_localize_ids(act.topk_ids.as<int32_t>(), T * K, tp.experts.begin, tp.experts.size(), s);
    }
  }
  return grouped ? MoeRouting::Grouped : MoeRouting::Ungrouped;
}

void CudaRunner::Impl::moe_block(const DevLayer& l, const Plan& p) {
  const cudaStream_t s = stream;
  const int T = p.T, H = cfg.hidden_size, K = cfg.num_experts_per_tok;
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  float* D = act.delta.as<float>();
  // Only at GEMV sizes: there no cuBLASLt call (one shared workspace) runs on either stream.
  const bool overlap = l.packed && l.has_shared && l.s_fused.out > 0 && T <= kGemvMaxTokens && !opt.profile;
  const cudaStream_t shared_stream = overlap ? side_stream : s;
  if (overlap) {
    FATHOM_CUDA_CHECK(cudaEventRecord(fork_event, s));
    FATHOM_CUDA_CHECK(cudaStreamWaitEvent(side_stream, fork_event));
  }
  const float* shared_gate = nullptr;
  int64_t gate_ld = 1;
  if (overlap) shared_gate = shared_expert(l, T, shared_stream, &gate_ld);
  const MoeRouting routing = route(l, T);
  const bool fused = routing == MoeRouting::FusedWithExperts, grouped = routing != MoeRouting::Ungrouped;
  const int32_t* skip_ids = tp.expert_parallel ? act.topk_ids.as<int32_t>() : nullptr;  // other ranks' pairs
  if (!overlap) shared_gate = shared_expert(l, T, s, &gate_ld);
  Scope sc(profiler, "moe.experts");
  const float* shared = l.has_shared ? act.sh_out.as<float>() : nullptr;
  if (l.packed) {
    if (!fused)
      moe_experts_packed(l.pexperts, act.xn.as<bf16_t>(), act.topk_ids.as<int32_t>(), act.topk_w.as<float>(),
                         act.pair_h.as<bf16_t>(), act.pair_out.as<float>(), nullptr, T, K, shared, shared_gate, gate_ld,
                         act.group, s, opt.kernels.moe, grouped);
    if (overlap) {
      FATHOM_CUDA_CHECK(cudaEventRecord(join_event, side_stream));
      FATHOM_CUDA_CHECK(cudaStreamWaitEvent(s, join_event));
    }
    const MoeCombineRows combine{act.pair_out.as<float>(), K, shared, shared_gate, gate_ld, skip_ids};
    if (defer_combine) {
      pending_combine = combine;
      combine_pending = true;
    } else {
      moe_combine_pairs(combine.pair_out, D, T, K, H, shared, shared_gate, gate_ld, s, skip_ids);
    }
  } else if (T * K <= pair_limit) {
    // Writes D, shared expert included; grouping pays off once experts repeat.
    moe_experts_decode(l.experts, act.xn.as<bf16_t>(), act.topk_ids.as<int32_t>(), act.topk_w.as<float>(), act.pair_h.as<bf16_t>(),
                       act.pair_out.as<float>(), D, T, K, shared, shared_gate, gate_ld, s,
                       T >= 4 || skip_ids ? &act.group : nullptr);
  } else {
    FATHOM_CUDA_CHECK(cudaMemsetAsync(D, 0, size_t(T) * H * 4, s));
    // Large batches: group tokens by expert on the host, then one GEMM chain per expert.
    std::vector<int32_t> ids(size_t(T) * K);
    std::vector<float> w(size_t(T) * K);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(ids.data(), act.topk_ids.data(), ids.size() * 4, cudaMemcpyDeviceToHost, s));
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(w.data(), act.topk_w.data(), w.size() * 4, cudaMemcpyDeviceToHost, s));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
    const int E_held = int(l.ex_gate.size());  // this rank's experts (all without expert parallelism)
    std::vector<std::vector<int32_t>> rows(E_held);
    std::vector<std::vector<float>> wts(E_held);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        if (ids[size_t(t) * K + k] < 0) continue;  // another rank's expert
        rows[ids[size_t(t) * K + k]].push_back(t);
        wts[ids[size_t(t) * K + k]].push_back(w[size_t(t) * K + k]);
      }
    std::vector<int32_t> all_rows;
    std::vector<float> all_w;
    std::vector<int> offset(E_held + 1, 0);
    for (int e = 0; e < E_held; ++e) {
      offset[e] = int(all_rows.size());
      all_rows.insert(all_rows.end(), rows[e].begin(), rows[e].end());
      all_w.insert(all_w.end(), wts[e].begin(), wts[e].end());
    }
    offset[E_held] = int(all_rows.size());
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(act.eg_rows.data(), all_rows.data(), all_rows.size() * 4, cudaMemcpyHostToDevice, s));
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(act.eg_w.data(), all_w.data(), all_w.size() * 4, cudaMemcpyHostToDevice, s));
    for (int e = 0; e < E_held; ++e) {
      const int m = offset[e + 1] - offset[e];
      if (m == 0) continue;
      const int32_t* r = act.eg_rows.as<int32_t>() + offset[e];
      gather_rows_bf16(act.xn.as<bf16_t>(), r, act.eg_x.as<bf16_t>(), m, H, s);
      linear(l.ex_gate[e], act.eg_x.as<bf16_t>(), act.eg_g.array<float>(), m, dq, s, opt.kernels);
      linear(l.ex_up[e], act.eg_x.as<bf16_t>(), act.eg_u.array<float>(), m, dq, s, opt.kernels);
      silu_mul(act.eg_g.as<float>(), act.eg_u.as<float>(), act.eg_h.as<bf16_t>(), int64_t(m) * l.ex_gate[e].out, s);
      linear(l.ex_down[e], act.eg_h.as<bf16_t>(), act.eg_o.array<float>(), m, dq, s, opt.kernels);
      scatter_add_rows(D, act.eg_o.as<float>(), r, act.eg_w.as<float>() + offset[e], m, H, s);
    }
    // The host vectors above must outlive the async copies.
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
    if (shared) add_sigmoid_gated(D, shared, shared_gate, gate_ld, T, H, s);
  }
}

void CudaRunner::Impl::head(const Plan& p, const float* norm, int32_t* argmax_out) {
  const cudaStream_t s = stream;
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  Scope sc(profiler, "lm_head");
  gather_rows_f32(act.x.as<float>(), dmeta.rows, act.sel.as<float>(), p.R, H, s);
  rms_norm(act.sel.as<float>(), norm, act.hidden_bf.as<bf16_t>(), act.sel.as<float>(), p.R, H, float(cfg.rms_norm_eps),
           cfg.norm_zero_centered, s);
  const bf16_t* head_in = act.hidden_bf.as<bf16_t>();
  if (p.RL < p.R) {  // all_hidden steps: logits for a subset of the rows (xn is free by now)
    gather_rows_bf16(act.hidden_bf.as<bf16_t>(), dmeta.logit_rows, act.xn.as<bf16_t>(), p.RL, H, s);
    head_in = act.xn.as<bf16_t>();
  }
  if (!tp.is_split()) {
    gemm_bf16(head_in, w.lm_head, act.logits.as<float>(), p.RL, V, H, s, opt.kernels);
  } else {
    // This rank's vocabulary slice, gathered from every rank as [rank][row][slice] and laid out
    // as [row][vocab]: every rank then holds the whole logits and samples the same tokens.
    const int Vr = tp.vocab_rows;
    gemm_bf16(head_in, w.lm_head, act.logits_part.as<float>(), p.RL, Vr, H, s, opt.kernels);
    {
      Scope sg(profiler, "allgather");
      comm->all_gather(std::span<const float>(act.logits_part.as<float>(), size_t(p.RL) * Vr),
                       std::span<float>(act.logits_all.as<float>(), size_t(p.RL) * Vr * tp.size));
    }
    for (int r = 0; r < tp.size; ++r)
      FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(act.logits.as<float>() + int64_t(r) * Vr, size_t(V) * 4,
                                          act.logits_all.as<float>() + int64_t(r) * p.RL * Vr, size_t(Vr) * 4,
                                          size_t(Vr) * 4, size_t(p.RL), cudaMemcpyDeviceToDevice, s));
  }
  if (argmax_out) argmax_rows(act.logits.as<float>(), argmax_out, p.RL, V, act.argmax_scratch.data(), s);
}

// u = fc([norm_e(embed(next)) | norm_h(hidden)]), one full-attention MoE layer, mtp.norm, lm_head.
void CudaRunner::Impl::run_mtp(const Plan& p, const int32_t* ids, const float* hidden, int32_t* draft) {
  const cudaStream_t s = stream;
  const int H = cfg.hidden_size, T = p.T;
  const float eps = float(cfg.rms_norm_eps);
  const bool zc = cfg.norm_zero_centered;
  float* X = act.x.as<float>();
  float* D = act.delta.as<float>();
  const DeviceArray<bf16_t> dq = act.dequant.array<bf16_t>();
  embedding(ids, w.embed, X, T, H, s);
  rms_norm(X, w.mtp_norm_e, act.mtp_e.as<bf16_t>(), nullptr, T, H, eps, zc, s);
  rms_norm(hidden, w.mtp_norm_h, act.mtp_h.as<bf16_t>(), nullptr, T, H, eps, zc, s);
  linear(w.mtp_fc_e, act.mtp_e.as<bf16_t>(), act.x.array<float>(), T, dq, s, opt.kernels);
  linear(w.mtp_fc_h, act.mtp_h.as<bf16_t>(), act.delta.array<float>(), T, dq, s, opt.kernels);
  add_inplace(X, D, int64_t(T) * H, s);
  decoder_layer(w.mtp_layer, p, /*first=*/true);  // u is the residual stream; nothing to add yet
  add_inplace(X, D, int64_t(T) * H, s);
  head(p, w.mtp_norm, draft);
}

// MTP rows of each step sit at positions mtp_length.. of its sequence (the positions of the
// hidden states they consume), in the MTP layer's own KV pool with the sequence's block table.
CudaRunner::Impl::Plan CudaRunner::Impl::prepare_mtp(std::span<const MtpStep> steps, bool inputs_on_device) {
  wait_uploads();
  Plan p;
  p.S = int(steps.size());
  FATHOM_CHECK(p.S <= opt.max_seqs, "batch of ", p.S, " sequences exceeds max_seqs ", opt.max_seqs);
  hist_step = false;
  const int H = cfg.hidden_size;
  hmeta.seq_start[0] = 0;
  for (int i = 0; i < p.S; ++i) {
    const MtpStep& st = steps[i];
    Sequence& sq = seq(st.seq);
    const int n = int(st.next_tokens.size());
    FATHOM_CHECK(n > 0 && (inputs_on_device || int64_t(st.hidden.size()) == int64_t(n) * H),
                 "mtp_forward: hidden rows (", st.hidden.size() / H, ") and next tokens (", n, ") differ");
    FATHOM_CHECK(p.T + n <= T_max && p.R + (st.all_rows ? n : 1) <= R_max, "mtp_forward: batch of ", p.T + n,
                 " tokens larger than one engine step (", T_max, " tokens, ", R_max, " rows)");
    hmeta.keep_hist[i] = 0;
    // Chained drafts run ahead of the verified tokens; the block table grows for them and the
    // main pools use the same blocks at those positions later.
    // The previous MTP step ended with a wait, so its copy out of the pinned rows is done.
    if (!inputs_on_device) std::copy(st.hidden.begin(), st.hidden.end(), mtp_hidden_host + int64_t(p.T) * H);
    add_to_plan(p, i, st.seq, sq, sq.mtp_length, st.next_tokens, st.all_rows);
  }
  // Graphs for the shapes a draft step has (a few tokens a sequence: one decode-style attention
  // run, as verify steps); prompt-sized extends run eagerly.
  p.graphable = p.max_seq_tokens < kPrefillRunTokens;
  upload_meta(p.S);
  if (!inputs_on_device)
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(act.mtp_hidden.data(), mtp_hidden_host, size_t(p.T) * H * 4, cudaMemcpyHostToDevice,
                                      stream));
  return p;
}

}  // namespace fathom::cuda
