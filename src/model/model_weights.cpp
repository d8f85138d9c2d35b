#include "model/model_weights.h"

#include <algorithm>

#include "core/error.h"
#include "io/nvfp4.h"
#include "model/weight_shard.h"

namespace fathom {
namespace {

LinearWeight make_linear(int out, int in, std::vector<float> w, bool quantized = false) {
  LinearWeight lw;
  lw.out = out;
  lw.in = in;
  lw.w = std::move(w);
  lw.quantized = quantized;
  return lw;
}

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ckpt, const ModelConfig& cfg, bool keep_nvfp4)
      : ckpt_(ckpt), cfg_(cfg), keep_nvfp4_(keep_nvfp4) {}

  std::vector<float> vec(const std::string& name, int64_t n) const { return ckpt_.read_f32(name, {n}); }

  // A Linear stored as BF16/F16/F32 `.weight`, or as NVFP4 (`.weight` U8 + scales).
  LinearWeight linear(const std::string& module, int out, int in) const { return linear(module, out, in, keep_nvfp4_); }

  LinearWeight linear(const std::string& module, int out, int in, bool keep_nvfp4) const {
    LinearWeight lw;
    lw.out = out;
    lw.in = in;
    const std::string wname = module + ".weight";
    const TensorInfo& info = ckpt_.info(wname);
    if (info.dtype == DType::U8) {
      FATHOM_CHECK(ckpt_.has(module + ".weight_scale"), "tensor '", wname, "' in ", ckpt_.file_of(wname),
                   " is U8 (packed FP4) but '", module, ".weight_scale' is missing");
      lw.quantized = true;
      if (keep_nvfp4) {
        read_nvfp4_linear(ckpt_, module, out, in);  // validates names, dtypes and shapes
        auto raw = [&](const std::string& name) {
          auto b = ckpt_.bytes(name);
          return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()),
                                      reinterpret_cast<const uint8_t*>(b.data()) + b.size());
        };
        lw.fp4 = raw(wname);
        lw.fp4_scale = raw(module + ".weight_scale");
        lw.fp4_global = ckpt_.read_f32(module + ".weight_scale_2", ckpt_.info(module + ".weight_scale_2").shape)[0];
      } else {
        lw.w = read_nvfp4_linear(ckpt_, module, out, in);
      }
    } else {
      lw.w = ckpt_.read_f32(wname, {out, in});
    }
    return lw;
  }

  MlpWeights mlp(const std::string& prefix, int inter) const {
    const int h = cfg_.hidden_size;
    return MlpWeights{linear(prefix + ".gate_proj", inter, h), linear(prefix + ".up_proj", inter, h),
                      linear(prefix + ".down_proj", h, inter)};
  }

  // Routed experts, fused ([E, 2I, H] gate_up + [E, H, I] down) or one module per expert.
  std::vector<MlpWeights> experts(const std::string& prefix) const {
    const int E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
    std::vector<MlpWeights> out(E);
    if (ckpt_.has(prefix + ".gate_up_proj")) {
      std::vector<float> gate_up = ckpt_.read_f32(prefix + ".gate_up_proj", {E, 2 * I, H});
      std::vector<float> down = ckpt_.read_f32(prefix + ".down_proj", {E, H, I});
      const size_t gu = size_t(I) * H;
      for (int e = 0; e < E; ++e) {
        const float* base = gate_up.data() + size_t(e) * 2 * gu;
        out[e].gate = make_linear(I, H, std::vector<float>(base, base + gu));
        out[e].up = make_linear(I, H, std::vector<float>(base + gu, base + 2 * gu));
        const float* d = down.data() + size_t(e) * gu;
        out[e].down = make_linear(H, I, std::vector<float>(d, d + gu));
      }
      return out;
    }
    FATHOM_CHECK(ckpt_.has(prefix + ".0.gate_proj.weight"), "missing tensor '", prefix,
                 ".gate_up_proj' (fused experts) or '", prefix, ".0.gate_proj.weight' (per expert) in ",
                 ckpt_.dir().string());
    for (int e = 0; e < E; ++e) out[e] = mlp(prefix + "." + std::to_string(e), I);
    return out;
  }

  AttentionWeights attention(const std::string& p) const {
    const int h = cfg_.hidden_size, d = cfg_.head_dim;
    const int q_rows = cfg_.num_attention_heads * d * (cfg_.attn_output_gate ? 2 : 1);
    AttentionWeights a;
    a.q = linear(p + ".q_proj", q_rows, h);
    a.k = linear(p + ".k_proj", cfg_.num_key_value_heads * d, h);
    a.v = linear(p + ".v_proj", cfg_.num_key_value_heads * d, h);
    a.o = linear(p + ".o_proj", h, cfg_.num_attention_heads * d);
    a.q_norm = vec(p + ".q_norm.weight", d);
    a.k_norm = vec(p + ".k_norm.weight", d);
    return a;
  }

  GatedDeltaNetWeights gated_delta_net(const std::string& p) const {
    const int h = cfg_.hidden_size, hk = cfg_.linear_num_key_heads, hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
    const int kc = cfg_.linear_conv_kernel_dim;
    GatedDeltaNetWeights g;
    if (cfg_.family == ModelFamily::Qwen3Next) {
      // Fused projections grouped per key head g: [q_g | k_g | v_g (r*dv) | z_g (r*dv)] and
      // [b_g (r) | a_g (r)]. Reorder rows to the Qwen3.5 layout [Q | K | V], Z, B, A.
      const int r = hv / hk;
      // Rows are reordered below, so quantized tensors are dequantized here in any mode.
      LinearWeight qkvz = linear(p + ".in_proj_qkvz", 2 * key_dim + 2 * value_dim, h, false);
      LinearWeight ba = linear(p + ".in_proj_ba", 2 * hv, h, false);
      g.qkv = make_linear(conv_dim, h, std::vector<float>(size_t(conv_dim) * h), qkvz.quantized);
      g.z = make_linear(value_dim, h, std::vector<float>(size_t(value_dim) * h), qkvz.quantized);
      g.b = make_linear(hv, h, std::vector<float>(size_t(hv) * h), ba.quantized);
      g.a = make_linear(hv, h, std::vector<float>(size_t(hv) * h), ba.quantized);
      auto copy_row = [h](const LinearWeight& src, int src_row, LinearWeight& dst, int dst_row) {
        std::copy_n(src.w.data() + size_t(src_row) * h, h, dst.w.data() + size_t(dst_row) * h);
      };
      const int group_rows = 2 * dk + 2 * r * dv;
      for (int kh = 0; kh < hk; ++kh) {
        const int base = kh * group_rows;
        for (int i = 0; i < dk; ++i) copy_row(qkvz, base + i, g.qkv, kh * dk + i);
        for (int i = 0; i < dk; ++i) copy_row(qkvz, base + dk + i, g.qkv, key_dim + kh * dk + i);
        for (int i = 0; i < r * dv; ++i) copy_row(qkvz, base + 2 * dk + i, g.qkv, 2 * key_dim + kh * r * dv + i);
        for (int i = 0; i < r * dv; ++i) copy_row(qkvz, base + 2 * dk + r * dv + i, g.z, kh * r * dv + i);
        for (int i = 0; i < r; ++i) copy_row(ba, kh * 2 * r + i, g.b, kh * r + i);
        for (int i = 0; i < r; ++i) copy_row(ba, kh * 2 * r + r + i, g.a, kh * r + i);
      }
    } else {
      g.qkv = linear(p + ".in_proj_qkv", conv_dim, h);
      g.z = linear(p + ".in_proj_z", value_dim, h);
      g.b = linear(p + ".in_proj_b", hv, h);
      g.a = linear(p + ".in_proj_a", hv, h);
    }
    g.out = linear(p + ".out_proj", h, value_dim);
    g.conv = ckpt_.read_f32(p + ".conv1d.weight", {conv_dim, 1, kc});
    g.dt_bias = vec(p + ".dt_bias", hv);
    g.a_log = vec(p + ".A_log", hv);
    g.norm = vec(p + ".norm.weight", dv);
    return g;
  }

  LayerWeights layer(const std::string& p, LayerType type, bool is_moe) const {
    const int h = cfg_.hidden_size;
    LayerWeights l;
    l.type = type;
    l.input_norm = vec(p + ".input_layernorm.weight", h);
    l.post_attention_norm = vec(p + ".post_attention_layernorm.weight", h);
    if (type == LayerType::FullAttention)
      l.attn = attention(p + ".self_attn");
    else
      l.gdn = gated_delta_net(p + ".linear_attn");
    l.is_moe = is_moe;
    if (is_moe) {
      l.moe.router = linear(p + ".mlp.gate", cfg_.num_experts, h);
      l.moe.experts = experts(p + ".mlp.experts");
      if (cfg_.shared_expert_intermediate_size > 0) {
        l.moe.shared = mlp(p + ".mlp.shared_expert", cfg_.shared_expert_intermediate_size);
        l.moe.shared_gate = linear(p + ".mlp.shared_expert_gate", 1, h);
      }
    } else {
      l.mlp = mlp(p + ".mlp", cfg_.intermediate_size);
    }
    return l;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  bool keep_nvfp4_;
};

}  // namespace

ModelWeights load_model_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const QuantConfig& quant,
                                bool load_mtp, bool keep_nvfp4, const TensorSplit* split) {
  const TensorSplit whole = TensorSplit::whole(cfg);
  const TensorSplit& s = split ? *split : whole;
  (void)quant;  // storage decides the format per tensor; QuantConfig is reported by `inspect`
  WeightLoader load(ckpt, cfg, keep_nvfp4);
  const std::string& pre = cfg.weight_prefix;
  const int h = cfg.hidden_size, vocab = cfg.vocab_size;
  ModelWeights w;
  w.embed = ckpt.read_f32(pre + "embed_tokens.weight", {vocab, h});
  w.final_norm = load.vec(pre + "norm.weight", h);
  w.tied_lm_head = cfg.tie_word_embeddings && !ckpt.has("lm_head.weight");
  if (!w.tied_lm_head) w.lm_head = load.linear("lm_head", vocab, h);
  for (int i = 0; i < cfg.num_hidden_layers; ++i)
    w.layers.push_back(
        shard_layer(load.layer(pre + "layers." + std::to_string(i), cfg.layer_types[i], cfg.is_moe_layer(i)), cfg, s));
  if (load_mtp && cfg.mtp_num_hidden_layers > 0) {
    FATHOM_CHECK(ckpt.has("mtp.fc.weight"), "config declares mtp_num_hidden_layers = ",
                 cfg.mtp_num_hidden_layers, " but tensor 'mtp.fc.weight' is missing in ", ckpt.dir().string());
    MtpWeights m;
    m.fc = load.linear("mtp.fc", h, 2 * h);
    m.pre_fc_norm_embedding = load.vec("mtp.pre_fc_norm_embedding.weight", h);
    m.pre_fc_norm_hidden = load.vec("mtp.pre_fc_norm_hidden.weight", h);
    m.norm = load.vec("mtp.norm.weight", h);
    m.layer = shard_layer(load.layer("mtp.layers.0", LayerType::FullAttention, cfg.num_experts > 0), cfg, s);
    w.mtp = std::move(m);
  }
  shard_vocabulary(w, cfg, s);
  return w;
}

}  // namespace fathom
