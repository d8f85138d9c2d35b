#include "model/model_weights.h"

#include <algorithm>

#include "core/error.h"
#include "io/module_format.h"
#include "io/nvfp4.h"
#include "model/kv_cache_scales.h"
#include "model/model_tensors.h"
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
  WeightLoader(const Checkpoint& ckpt, const ModelConfig& cfg, const QuantConfig& quant, bool keep_nvfp4)
      : ckpt_(ckpt), cfg_(cfg), quant_(quant), keep_nvfp4_(keep_nvfp4) {}

  std::vector<float> vec(const std::string& name, int64_t n) const { return ckpt_.read_f32(name, {n}); }

  // A Linear stored as BF16/F16/F32 `.weight`, NVFP4 (`.weight` U8 + scales) or FP8 (E4M3 +
  // scales): io/module_format.h decides which.
  LinearWeight linear(const std::string& module, int out, int in) const { return linear(module, out, in, keep_nvfp4_); }

  LinearWeight linear(const std::string& module, int out, int in, bool keep_nvfp4) const {
    LinearWeight lw;
    lw.out = out;
    lw.in = in;
    const std::string wname = module + ".weight";
    const ModuleFormat f = resolve_module_format(ckpt_, quant_, module, out, in);
    switch (f.weight) {
      case WeightFormat::NVFP4:
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
        break;
      case WeightFormat::FP8:
        lw.quantized = lw.fp8 = true;
        lw.fp8_block = f.fp8.scaling == Fp8Scaling::Block;
        lw.fp8_per_row = f.fp8.scaling == Fp8Scaling::PerChannel;
        lw.w = read_fp8_linear(ckpt_, module, out, in, f.fp8);
        lw.input_scale = f.fp8.input_scale;
        break;
      case WeightFormat::Float:
        lw.w = ckpt_.read_f32(wname, {out, in});
        break;
    }
    return lw;
  }

  LinearWeight linear(const LinearSpec& l) const { return linear(l.module, l.out, l.in); }
  std::vector<float> vec(const TensorSpec& t) const { return vec(t.name, t.shape[0]); }

  MlpWeights mlp(const MlpTensors& t) const { return MlpWeights{linear(t.gate), linear(t.up), linear(t.down)}; }

  // Routed experts, fused ([E, 2I, H] gate_up + [E, H, I] down) or one module per expert.
  std::vector<MlpWeights> experts(const MoeTensors& t) const {
    const int E = cfg_.num_experts, I = cfg_.moe_intermediate_size, H = cfg_.hidden_size;
    std::vector<MlpWeights> out(E);
    if (ckpt_.has(t.fused_gate_up.name)) {
      for (const TensorSpec* f : {&t.fused_gate_up, &t.fused_down})
        FATHOM_CHECK(ckpt_.info(f->name).dtype != DType::F8_E4M3 && ckpt_.info(f->name).dtype != DType::U8,
                     "tensor '", f->name, "' in ", ckpt_.file_of(f->name), " is ", dtype_name(ckpt_.info(f->name).dtype),
                     ": fused routed experts are read as BF16/F16/F32 only (quantized experts are stored per expert)");
      std::vector<float> gate_up = ckpt_.read_f32(t.fused_gate_up.name, t.fused_gate_up.shape);
      std::vector<float> down = ckpt_.read_f32(t.fused_down.name, t.fused_down.shape);
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
    FATHOM_CHECK(ckpt_.has(t.expert(0).gate.weight()), "missing tensor '", t.fused_gate_up.name,
                 "' (fused experts) or '", t.expert(0).gate.weight(), "' (per expert) in ", ckpt_.dir().string());
    for (int e = 0; e < E; ++e) out[e] = mlp(t.expert(e));
    return out;
  }

  AttentionWeights attention(const AttentionTensors& t) const {
    AttentionWeights a;
    a.q = linear(t.q);
    a.k = linear(t.k);
    a.v = linear(t.v);
    a.o = linear(t.o);
    a.q_norm = vec(t.q_norm);
    a.k_norm = vec(t.k_norm);
    a.k_scale = read_kv_cache_scale(ckpt_, t.k_scale);
    a.v_scale = read_kv_cache_scale(ckpt_, t.v_scale);
    return a;
  }

  GatedDeltaNetWeights gated_delta_net(const GatedDeltaNetTensors& t) const {
    const int h = cfg_.hidden_size, hk = cfg_.linear_num_key_heads, hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int key_dim = cfg_.linear_key_dim(), value_dim = cfg_.linear_value_dim(), conv_dim = cfg_.linear_conv_dim();
    GatedDeltaNetWeights g;
    if (t.fused_per_key_head) {
      // Fused projections grouped per key head g: [q_g | k_g | v_g (r*dv) | z_g (r*dv)] and
      // [b_g (r) | a_g (r)]. Reorder rows to the Qwen3.5 layout [Q | K | V], Z, B, A.
      const int r = hv / hk;
      // Rows are reordered below, so quantized tensors are dequantized here in any mode.
      LinearWeight qkvz = linear(t.qkvz.module, t.qkvz.out, t.qkvz.in, false);
      LinearWeight ba = linear(t.ba.module, t.ba.out, t.ba.in, false);
      g.qkv = make_linear(conv_dim, h, std::vector<float>(size_t(conv_dim) * h), qkvz.quantized);
      g.z = make_linear(value_dim, h, std::vector<float>(size_t(value_dim) * h), qkvz.quantized);
      g.b = make_linear(hv, h, std::vector<float>(size_t(hv) * h), ba.quantized);
      g.a = make_linear(hv, h, std::vector<float>(size_t(hv) * h), ba.quantized);
      auto copy_row = [h](const LinearWeight& src, int src_row, LinearWeight& dst, int dst_row) {
        std::copy_n(src.w.data() + size_t(src_row) * h, h, dst.w.data() + size_t(dst_row) * h);
      };
      g.qkv.input_scale = g.z.input_scale = qkvz.input_scale;
      g.b.input_scale = g.a.input_scale = ba.input_scale;
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
      g.qkv = linear(t.qkv);
      g.z = linear(t.z);
      g.b = linear(t.b);
      g.a = linear(t.a);
    }
    g.out = linear(t.out);
    g.conv = ckpt_.read_f32(t.conv.name, t.conv.shape);
    g.dt_bias = vec(t.dt_bias);
    g.a_log = vec(t.a_log);
    g.norm = vec(t.norm);
    return g;
  }

  LayerWeights layer(const LayerTensors& t) const {
    LayerWeights l;
    l.type = t.type;
    l.input_norm = vec(t.input_norm);
    l.post_attention_norm = vec(t.post_attention_norm);
    if (t.type == LayerType::FullAttention) l.attn = attention(t.attn);
    else l.gdn = gated_delta_net(t.gdn);
    l.is_moe = t.is_moe;
    if (t.is_moe) {
      l.moe.router = linear(t.moe.router);
      l.moe.experts = experts(t.moe);
      if (t.moe.has_shared) {
        l.moe.shared = mlp(t.moe.shared);
        l.moe.shared_gate = linear(t.moe.shared_gate);
      }
    } else {
      l.mlp = mlp(t.mlp);
    }
    return l;
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  const QuantConfig& quant_;
  bool keep_nvfp4_;
};

}  // namespace

ModelWeights load_model_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const QuantConfig& quant,
                                bool load_mtp, bool keep_nvfp4, const TensorSplit* split) {
  const TensorSplit whole = TensorSplit::whole(cfg);
  const TensorSplit& s = split ? *split : whole;
  check_quantized_layers(ckpt, quant);
  WeightLoader load(ckpt, cfg, quant, keep_nvfp4);
  const ModelTensors t = model_tensors(cfg);
  ModelWeights w;
  w.embed = ckpt.read_f32(t.embed.name, t.embed.shape);
  w.final_norm = load.vec(t.final_norm);
  w.tied_lm_head = cfg.tie_word_embeddings && !ckpt.has(t.lm_head.weight());
  if (!w.tied_lm_head) w.lm_head = load.linear(t.lm_head);
  for (const LayerTensors& layer : t.layers) w.layers.push_back(shard_layer(load.layer(layer), cfg, s));
  if (load_mtp && t.mtp) {
    FATHOM_CHECK(ckpt.has(t.mtp->fc.weight()), "config declares mtp_num_hidden_layers = ", cfg.mtp_num_hidden_layers,
                 " but tensor '", t.mtp->fc.weight(), "' is missing in ", ckpt.dir().string());
    MtpWeights m;
    m.fc = load.linear(t.mtp->fc);
    m.pre_fc_norm_embedding = load.vec(t.mtp->pre_fc_norm_embedding);
    m.pre_fc_norm_hidden = load.vec(t.mtp->pre_fc_norm_hidden);
    m.norm = load.vec(t.mtp->norm);
    m.layer = shard_layer(load.layer(t.mtp->layer), cfg, s);
    w.mtp = std::move(m);
  }
  shard_vocabulary(w, cfg, s);
  return w;
}

}  // namespace fathom
