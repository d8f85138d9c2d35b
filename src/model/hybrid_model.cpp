#include "model/hybrid_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/fp8.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "kernels/cpu/cpu_ops.h"

namespace fathom {
void HybridModel::round_activations(float* p, size_t n) const {
  if (!bf16_activations_) return;
  for (size_t i = 0; i < n; ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

void HybridModel::round_kv(float* p, size_t n, float scale) const {
  if (!kv_cache_fp8_) return round_activations(p, n);
  // The division and product are the CUDA engine's (attention_prepare stores x / scale; the
  // kernels fold `scale` into their scales), so stored codes match it bit for bit.
  for (size_t i = 0; i < n; ++i) p[i] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(p[i] / scale)) * scale;
}

void HybridModel::linear(const float* x, const LinearWeight& w, float* y, int64_t n, bool routed) const {
  std::vector<float> xq;
  const bool w8a8 = w.input_scale > 0.f && fp8_activations_;
  if (w8a8) {
    // W8A8: the activations the FP8 product sees.
    xq.assign(x, x + n * w.in);
    for (float& v : xq) v = fp8_fake_quantize(v, w.input_scale);
    x = xq.data();
  }
  // The CUDA engine rounds weight-only quantized weights to bf16 where it dequantizes them: NVFP4
  // and block-FP8 linears for batches above its GEMVs, per-row FP8 routed experts at load. Per-tensor
  // and per-row FP8 linears and per-tensor and block FP8 routed experts stay exact there (E4M3 codes
  // are exact in bf16; the scales multiply fp32 products; a tensor-parallel split of block-FP8
  // experts off their 128-row blocks falls back to the rounded bf16 copy, not emulated here).
  const bool gpu_rounds = routed ? w.fp8_per_row : n > 16 && (!w.fp8 || w.fp8_block);
  if (bf16_activations_ && w.quantized && !w8a8 && gpu_rounds) {
    std::vector<float> rounded(w.w);
    round_activations(rounded.data(), rounded.size());
    cpu::matmul_nt(x, rounded.data(), y, n, w.in, w.out);
    return;
  }
  cpu::matmul_nt(x, w.w.data(), y, n, w.in, w.out);
}

HybridModel::HybridModel(ModelConfig cfg, ModelWeights weights)
    : HybridModel(cfg, std::move(weights), TensorSplit::whole(cfg), nullptr) {}

HybridModel::HybridModel(ModelConfig cfg, ModelWeights weights, const TensorSplit& split, Communicator* comm)
    : cfg_(std::move(cfg)), w_(std::move(weights)), split_(split), comm_(comm) {
  FATHOM_CHECK(!split_.is_split() || (comm_ && comm_->size() == split_.size && comm_->rank() == split_.rank),
               "a split model needs its rank's communicator");
  int a = 0, l = 0;
  for (LayerType t : cfg_.layer_types) {
    attn_slot_.push_back(t == LayerType::FullAttention ? a++ : -1);
    linear_slot_.push_back(t == LayerType::LinearAttention ? l++ : -1);
  }
}

std::unique_ptr<HybridModel> HybridModel::load(const std::filesystem::path& dir, bool with_mtp) {
  ModelConfig cfg = ModelConfig::load(dir);
  QuantConfig quant = QuantConfig::load(dir, read_text_file(dir / "config.json"));
  auto ckpt = Checkpoint::open(dir);
  ModelWeights w = load_model_weights(*ckpt, cfg, quant, with_mtp);
  return std::make_unique<HybridModel>(std::move(cfg), std::move(w));
}

std::unique_ptr<HybridModel> HybridModel::load(const std::filesystem::path& dir, bool with_mtp, Communicator& comm,
                                               bool expert_parallel) {
  ModelConfig cfg = ModelConfig::load(dir);
  QuantConfig quant = QuantConfig::load(dir, read_text_file(dir / "config.json"));
  auto ckpt = Checkpoint::open(dir);
  const TensorSplit split = TensorSplit::make(cfg, comm.rank(), comm.size(), expert_parallel);
  ModelWeights w = load_model_weights(*ckpt, cfg, quant, with_mtp, /*keep_nvfp4=*/false, &split);
  return std::make_unique<HybridModel>(std::move(cfg), std::move(w), split, &comm);
}

void HybridModel::all_reduce(std::vector<float>& v) const {
  if (comm_) comm_->all_reduce_sum(v);
}

void HybridModel::embed(std::span<const int32_t> tokens, float* dst) const {
  const int H = cfg_.hidden_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t tok = tokens[i];
    FATHOM_CHECK(tok >= 0 && tok < cfg_.vocab_size, "token id ", tok, " is outside the vocabulary [0, ",
                 cfg_.vocab_size, ")");
    float* row = dst + i * H;
    if (split_.vocab.contains(tok))
      std::copy_n(w_.embed.data() + size_t(tok - split_.vocab.begin) * H, H, row);
    else
      std::fill_n(row, H, 0.f);  // another rank holds it; the sum below brings it in
  }
  if (comm_) comm_->all_reduce_sum(std::span<float>(dst, tokens.size() * H));
}

SequenceState HybridModel::new_sequence() const {
  SequenceState s;
  const ModelConfig rank = rank_config(cfg_, split_);  // this rank's DeltaNet heads
  for (LayerType t : cfg_.layer_types) {
    if (t == LayerType::FullAttention) {
      s.kv.push_back(KvCache{split_.kv_heads.size(), cfg_.head_dim, {}, {}});
    } else {
      LinearAttentionState st;
      st.conv.assign(size_t(rank.linear_conv_state_values()), 0.f);
      st.recurrent.assign(size_t(rank.linear_recurrent_state_values()), 0.f);
      s.linear.push_back(std::move(st));
    }
  }
  s.mtp_kv = KvCache{split_.kv_heads.size(), cfg_.head_dim, {}, {}};
  return s;
}

HybridModel::Output HybridModel::forward(std::span<const Segment> batch, bool all_rows) const {
  const int H = cfg_.hidden_size;
  std::vector<SegmentView> segs;
  int64_t total = 0;
  for (const Segment& s : batch) {
    FATHOM_CHECK(!s.tokens.empty(), "forward: a sequence in the batch has no tokens");
    segs.push_back(SegmentView{total, int64_t(s.tokens.size()), s.state->num_tokens, nullptr, nullptr, nullptr});
    if (s.keep_history) {
      s.state->history_base = s.state->num_tokens;
      s.state->history.assign(s.state->linear.size(), {});
    }
    total += int64_t(s.tokens.size());
  }
  std::vector<float> x(size_t(total) * H);
  for (size_t si = 0; si < batch.size(); ++si) embed(batch[si].tokens, x.data() + segs[si].offset * H);
  for (size_t li = 0; li < w_.layers.size(); ++li) {
    for (size_t si = 0; si < segs.size(); ++si) {
      SequenceState* st = batch[si].state;
      segs[si].kv = attn_slot_[li] >= 0 ? &st->kv[attn_slot_[li]] : nullptr;
      segs[si].linear = linear_slot_[li] >= 0 ? &st->linear[linear_slot_[li]] : nullptr;
      segs[si].history = batch[si].keep_history && linear_slot_[li] >= 0 ? &st->history[linear_slot_[li]] : nullptr;
    }
    decoder_layer(w_.layers[li], x, segs);
  }
  for (size_t si = 0; si < segs.size(); ++si) batch[si].state->num_tokens += segs[si].count;
  return finish(x, w_.final_norm, segs, all_rows);
}

HybridModel::Output HybridModel::mtp_forward(std::span<const MtpSegment> batch, bool all_rows) const {
  FATHOM_CHECK(w_.mtp.has_value(), "this model has no MTP layer loaded");
  const MtpWeights& m = *w_.mtp;
  const int H = cfg_.hidden_size;
  const float eps = float(cfg_.rms_norm_eps);
  std::vector<SegmentView> segs;
  int64_t total = 0;
  for (const MtpSegment& s : batch) {
    const int64_t n = int64_t(s.next_tokens.size());
    FATHOM_CHECK(n > 0 && int64_t(s.hidden.size()) == n * H, "mtp_forward: hidden rows (",
                 s.hidden.size() / H, ") and next tokens (", n, ") differ");
    segs.push_back(SegmentView{total, n, s.state->mtp_kv.length(), &s.state->mtp_kv, nullptr, nullptr});
    total += n;
  }
  // u = fc([norm_e(embed(next)) | norm_h(hidden)]): embedding first, hidden second.
  std::vector<float> cat(size_t(total) * 2 * H), emb;
  for (size_t si = 0; si < batch.size(); ++si) {
    emb.resize(size_t(segs[si].count) * H);
    embed(batch[si].next_tokens, emb.data());
    for (int64_t i = 0; i < segs[si].count; ++i) {
      float* dst = cat.data() + (segs[si].offset + i) * 2 * H;
      cpu::rms_norm(emb.data() + i * H, m.pre_fc_norm_embedding.data(), dst, 1, H, eps, cfg_.norm_zero_centered);
      cpu::rms_norm(batch[si].hidden.data() + i * H, m.pre_fc_norm_hidden.data(), dst + H, 1, H, eps,
                    cfg_.norm_zero_centered);
    }
  }
  std::vector<float> x(size_t(total) * H);
  round_activations(cat.data(), cat.size());
  linear(cat.data(), m.fc, x.data(), total);
  decoder_layer(m.layer, x, segs);
  return finish(x, m.norm, segs, all_rows);
}

HybridModel::Output HybridModel::finish(const std::vector<float>& x, const std::vector<float>& final_norm,
                                        const std::vector<SegmentView>& segs, bool all_rows) const {
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  Output out;
  std::vector<int64_t> rows;
  for (const SegmentView& s : segs) {
    if (all_rows) {
      for (int64_t i = 0; i < s.count; ++i) rows.push_back(s.offset + i);
    } else {
      rows.push_back(s.offset + s.count - 1);
    }
  }
  out.rows = int64_t(rows.size());
  out.hidden.resize(size_t(out.rows) * H);
  for (int64_t r = 0; r < out.rows; ++r)
    cpu::rms_norm(x.data() + rows[r] * H, final_norm.data(), out.hidden.data() + r * H, 1, H,
                  float(cfg_.rms_norm_eps), cfg_.norm_zero_centered);
  out.logits.resize(size_t(out.rows) * V);
  std::vector<float> head_in(out.hidden);
  round_activations(head_in.data(), head_in.size());
  const float* head = w_.lm_head_data();
  std::vector<float> rounded_head;
  if (bf16_activations_ && w_.lm_head.quantized) {  // the CUDA engine keeps a quantized lm_head in bf16
    rounded_head = w_.lm_head.w;
    round_activations(rounded_head.data(), rounded_head.size());
    head = rounded_head.data();
  }
  if (!comm_) {
    cpu::matmul_nt(head_in.data(), head, out.logits.data(), out.rows, H, V);
    return out;
  }
  // Each rank's vocabulary slice, gathered as [rank][row][slice] and laid out as [row][vocab].
  const int64_t Vr = split_.vocab_rows;
  std::vector<float> mine(size_t(out.rows) * Vr), all(mine.size() * split_.size);
  cpu::matmul_nt(head_in.data(), head, mine.data(), out.rows, H, Vr);
  comm_->all_gather(mine, all);
  for (int r = 0; r < split_.size; ++r) {
    const int64_t v0 = r * Vr, n = std::min<int64_t>(Vr, V - v0);
    for (int64_t row = 0; row < out.rows && n > 0; ++row)
      std::copy_n(all.data() + (size_t(r) * out.rows + row) * Vr, n, out.logits.data() + row * V + v0);
  }
  return out;
}

void HybridModel::decoder_layer(const LayerWeights& lw, std::vector<float>& x,
                                const std::vector<SegmentView>& segs) const {
  const int H = cfg_.hidden_size;
  const int64_t n = int64_t(x.size()) / H;
  const float eps = float(cfg_.rms_norm_eps);
  std::vector<float> xn(x.size()), mix(x.size());
  cpu::rms_norm(x.data(), lw.input_norm.data(), xn.data(), n, H, eps, cfg_.norm_zero_centered);
  round_activations(xn.data(), xn.size());
  if (lw.type == LayerType::FullAttention)
    attention(lw.attn, xn.data(), mix.data(), segs);
  else
    gated_delta_net(lw.gdn, xn.data(), mix.data(), segs);
  all_reduce(mix);
  for (size_t i = 0; i < x.size(); ++i) x[i] += mix[i];
  cpu::rms_norm(x.data(), lw.post_attention_norm.data(), xn.data(), n, H, eps, cfg_.norm_zero_centered);
  if (lw.is_moe) {
    std::vector<float> xn_router(xn);  // routers read the unrounded activations
    round_activations(xn.data(), xn.size());
    moe(lw.moe, xn.data(), xn_router.data(), mix.data(), n);
  } else {
    round_activations(xn.data(), xn.size());
    mlp(lw.mlp, xn.data(), mix.data(), n);
  }
  all_reduce(mix);
  for (size_t i = 0; i < x.size(); ++i) x[i] += mix[i];
}

void HybridModel::attention(const AttentionWeights& aw, const float* xn, float* out,
                            const std::vector<SegmentView>& segs) const {
  const int nh = split_.q_heads.size(), nkv = split_.kv_heads.size(), d = cfg_.head_dim;
  const bool gated = cfg_.attn_output_gate;
  const int64_t n = segs.empty() ? 0 : segs.back().offset + segs.back().count;
  const float eps = float(cfg_.rms_norm_eps);
  std::vector<float> qg(size_t(n) * aw.q.out), k(size_t(n) * aw.k.out), v(size_t(n) * aw.v.out);
  linear(xn, aw.q, qg.data(), n);
  linear(xn, aw.k, k.data(), n);
  linear(xn, aw.v, v.data(), n);
  // Split per-head [query | gate] rows, q/k norm per head, then RoPE (norm before RoPE).
  std::vector<float> q(size_t(n) * nh * d), gate(gated ? size_t(n) * nh * d : 0);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < nh; ++h) {
      const float* src = qg.data() + t * aw.q.out + int64_t(h) * d * (gated ? 2 : 1);
      float* qd = q.data() + (t * nh + h) * d;
      cpu::rms_norm(src, aw.q_norm.data(), qd, 1, d, eps, cfg_.norm_zero_centered);
      if (gated) std::copy_n(src + d, d, gate.data() + (t * nh + h) * d);
    }
    for (int h = 0; h < nkv; ++h) {
      float* kd = k.data() + (t * nkv + h) * d;
      cpu::rms_norm(kd, aw.k_norm.data(), kd, 1, d, eps, cfg_.norm_zero_centered);
    }
  }
  std::vector<float> attn(size_t(n) * nh * d);
  for (const SegmentView& s : segs) {
    for (int64_t i = 0; i < s.count; ++i) {
      const int64_t t = s.offset + i, pos = s.pos0 + i;
      cpu::apply_rope(q.data() + t * nh * d, nh, d, cfg_.rotary_dim(), pos, cfg_.rope_theta);
      cpu::apply_rope(k.data() + t * nkv * d, nkv, d, cfg_.rotary_dim(), pos, cfg_.rope_theta);
    }
    FATHOM_CHECK(s.kv->length() == s.pos0, "KV cache holds ", s.kv->length(), " positions, expected ", s.pos0);
    const size_t row = size_t(nkv) * d;
    round_kv(k.data() + s.offset * row, size_t(s.count) * row, aw.k_scale);
    round_kv(v.data() + s.offset * row, size_t(s.count) * row, aw.v_scale);
    s.kv->k.insert(s.kv->k.end(), k.begin() + s.offset * row, k.begin() + (s.offset + s.count) * row);
    s.kv->v.insert(s.kv->v.end(), v.begin() + s.offset * row, v.begin() + (s.offset + s.count) * row);
    cpu::causal_attention(q.data() + s.offset * nh * d, s.kv->k.data(), s.kv->v.data(),
                          attn.data() + s.offset * nh * d, s.count, s.kv->length(), nh, nkv, d,
                          1.f / std::sqrt(float(d)));
  }
  if (gated)
    for (size_t i = 0; i < attn.size(); ++i) attn[i] *= cpu::sigmoid(gate[i]);
  round_activations(attn.data(), attn.size());
  linear(attn.data(), aw.o, out, n);
}

void HybridModel::gated_delta_net(const GatedDeltaNetWeights& gw, const float* xn, float* out,
                                  const std::vector<SegmentView>& segs) const {
  // This rank's heads; with key heads replicated (fewer than ranks) hk is 1 and every local
  // value head reads it, so h / (hv / hk) still names the right key head.
  const int hk = split_.linear_key_heads.size(), hv = split_.linear_value_heads.size();
  const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
  const int key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
  const int kc = cfg_.linear_conv_kernel_dim, ratio = hv / hk;
  const int64_t n = segs.empty() ? 0 : segs.back().offset + segs.back().count;
  const float eps = float(cfg_.rms_norm_eps);
  std::vector<float> mixed(size_t(n) * conv_dim), z(size_t(n) * value_dim), b(size_t(n) * hv), a(size_t(n) * hv);
  linear(xn, gw.qkv, mixed.data(), n);
  linear(xn, gw.z, z.data(), n);
  linear(xn, gw.b, b.data(), n);
  linear(xn, gw.a, a.data(), n);
  std::vector<float> core(size_t(n) * value_dim);
  for (const SegmentView& seg : segs) {
    LinearAttentionState& st = *seg.linear;
    if (seg.history) seg.history->push_back(st);
    // With history, one token at a time so the state after each token can be kept.
    const int64_t step = seg.history ? 1 : seg.count;
    for (int64_t sub = 0; sub < seg.count; sub += step) {
    const SegmentView s{seg.offset + sub, std::min(step, seg.count - sub), seg.pos0 + sub, nullptr, nullptr, nullptr};
    // Causal depthwise conv over [conv window | new inputs], then SiLU.
    std::vector<float> window(size_t(kc - 1 + s.count) * conv_dim);
    std::copy(st.conv.begin(), st.conv.end(), window.begin());
    std::copy_n(mixed.data() + s.offset * conv_dim, s.count * conv_dim, window.begin() + (kc - 1) * conv_dim);
    std::vector<float> u(size_t(s.count) * conv_dim);
    parallel_for(conv_dim, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t t = 0; t < s.count; ++t) {
          float acc = 0;
          for (int i = 0; i < kc; ++i) acc += gw.conv[c * kc + i] * window[(t + i) * conv_dim + c];
          u[t * conv_dim + c] = cpu::silu(acc);
        }
    });
    std::copy(window.end() - (kc - 1) * conv_dim, window.end(), st.conv.begin());
    // Gated delta rule, token by token (the recurrent form is exact; chunking is an optimisation).
    parallel_for(hv, 1, [&](int64_t h0, int64_t h1) {
      std::vector<float> qh(dk), kh(dk), m(dv);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t j = h / ratio;
        float* S = st.recurrent.data() + h * dk * dv;
        const float A = std::exp(gw.a_log[h]);
        for (int64_t i = 0; i < s.count; ++i) {
          const int64_t t = s.offset + i;
          const float* ut = u.data() + i * conv_dim;
          std::copy_n(ut + j * dk, dk, qh.data());
          std::copy_n(ut + key_dim + j * dk, dk, kh.data());
          const float* vh = ut + 2 * key_dim + h * dv;
          cpu::l2_normalize(qh.data(), dk, 1e-6f);
          cpu::l2_normalize(kh.data(), dk, 1e-6f);
          const float qscale = 1.f / std::sqrt(float(dk));
          for (float& e : qh) e *= qscale;
          const float beta = cpu::sigmoid(b[t * hv + h]);
          const float g = -A * cpu::softplus(a[t * hv + h] + gw.dt_bias[h]);
          const float decay = std::exp(g);
          for (int64_t e = 0; e < int64_t(dk) * dv; ++e) S[e] *= decay;
          std::fill(m.begin(), m.end(), 0.f);
          for (int kk = 0; kk < dk; ++kk)
            for (int vv = 0; vv < dv; ++vv) m[vv] += S[kk * dv + vv] * kh[kk];
          for (int vv = 0; vv < dv; ++vv) m[vv] = beta * (vh[vv] - m[vv]);
          for (int kk = 0; kk < dk; ++kk)
            for (int vv = 0; vv < dv; ++vv) S[kk * dv + vv] += kh[kk] * m[vv];
          float* o = core.data() + t * value_dim + h * dv;
          std::fill(o, o + dv, 0.f);
          for (int kk = 0; kk < dk; ++kk)
            for (int vv = 0; vv < dv; ++vv) o[vv] += S[kk * dv + vv] * qh[kk];
        }
      }
    });
    if (seg.history) seg.history->push_back(st);
    }
  }
  std::vector<float> normed(core.size());
  cpu::gated_rms_norm(core.data(), z.data(), gw.norm.data(), normed.data(), n * hv, dv, eps);
  round_activations(normed.data(), normed.size());
  linear(normed.data(), gw.out, out, n);
}

void HybridModel::rollback(SequenceState& st, int64_t new_length) const {
  FATHOM_CHECK(new_length >= 0 && new_length <= st.num_tokens, "rollback to ", new_length,
               " tokens: the sequence has ", st.num_tokens);
  if (new_length == st.num_tokens) return;
  if (!st.linear.empty()) {
    const int64_t i = new_length - st.history_base;
    FATHOM_CHECK(st.history_base >= 0 && i >= 0 && !st.history.empty() && i < int64_t(st.history[0].size()),
                 "rollback to ", new_length, " tokens: no linear-attention state kept for that length");
    for (size_t l = 0; l < st.linear.size(); ++l) st.linear[l] = st.history[l][size_t(i)];
  }
  for (KvCache& kv : st.kv) kv.truncate(new_length);
  if (st.mtp_kv.length() > new_length) st.mtp_kv.truncate(new_length);
  st.num_tokens = new_length;
}

void HybridModel::mlp(const MlpWeights& mw, const float* xn, float* out, int64_t n, bool routed) const {
  const int inter = mw.gate.out;
  std::vector<float> g(size_t(n) * inter), u(size_t(n) * inter);
  linear(xn, mw.gate, g.data(), n, routed);
  linear(xn, mw.up, u.data(), n, routed);
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
  round_activations(g.data(), g.size());
  linear(g.data(), mw.down, out, n, routed);
}

void HybridModel::moe(const MoeWeights& mw, const float* xn, const float* xn_router, float* out, int64_t n) const {
  const int H = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  std::vector<float> probs(size_t(n) * E);
  linear(xn_router, mw.router, probs.data(), n);
  // softmax over all experts, then top-k, then (optionally) renormalise the k weights.
  std::vector<std::vector<std::pair<int64_t, float>>> per_expert(E);  // (token, weight)
  std::vector<int> idx(E);
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs.data() + t * E;
    cpu::softmax(p, E);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                      [&](int x, int y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += p[idx[k]];
    for (int k = 0; k < K; ++k) per_expert[idx[k]].push_back({t, cfg_.norm_topk_prob ? p[idx[k]] / sum : p[idx[k]]});
  }
  std::fill(out, out + n * H, 0.f);
  std::vector<float> xs, ys;
  for (int e = split_.experts.begin; e < split_.experts.end; ++e) {  // this rank's experts (all without EP)
    const auto& list = per_expert[e];
    if (list.empty()) continue;
    const int64_t m = int64_t(list.size());
    xs.resize(size_t(m) * H);
    ys.resize(size_t(m) * H);
    for (int64_t i = 0; i < m; ++i) std::copy_n(xn + list[i].first * H, H, xs.data() + i * H);
    mlp(mw.experts[size_t(e - split_.experts.begin)], xs.data(), ys.data(), m, /*routed=*/true);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + list[i].first * H;
      const float wgt = list[i].second;
      for (int c = 0; c < H; ++c) o[c] += wgt * ys[i * H + c];
    }
  }
  if (mw.shared) {
    std::vector<float> s(size_t(n) * H), gate(n);
    mlp(*mw.shared, xn, s.data(), n);
    linear(xn, mw.shared_gate, gate.data(), n);
    for (int64_t t = 0; t < n; ++t) {
      const float g = cpu::sigmoid(gate[t]);
      for (int c = 0; c < H; ++c) out[t * H + c] += g * s[t * H + c];
    }
  }
}

}  // namespace fathom
