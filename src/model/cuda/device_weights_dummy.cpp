// Device weights with random values at a config's shapes, made on the device (bench, tests).
#include <cmath>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "model/cuda/device_weights.h"

namespace fathom::cuda {

// Random NVFP4 codes and E4M3 scales (0.5 .. 0.94) of an [out, in] matrix; returns the global
// scale that gives outputs of about unit size.
float WeightBuilder::fill_dummy_fp4(uint8_t* codes, uint8_t* scales, int out, int in) {
  fill_random_bytes(codes, int64_t(out) * in / 2, seed++, 0xff, 0, stream);
  fill_random_bytes(scales, int64_t(out) * in / 16, seed++, 0x07, 0x30, stream);
  return 0.3f / std::sqrt(float(in));
}

DeviceLinear WeightBuilder::dummy_linear(int out, int in, bool fp4, bool expert) {
  DeviceLinear d;
  d.out = out;
  d.in = in;
  if (fp4) {
    uint8_t* p = alloc_weight<uint8_t>(int64_t(out) * in / 2, expert);
    uint8_t* s = alloc_weight<uint8_t>(int64_t(out) * in / 16, expert);
    d.fp4_global = fill_dummy_fp4(p, s, out, in);
    d.fp4 = p;
    d.fp4_scale = s;
  } else {
    bf16_t* p = alloc_weight<bf16_t>(int64_t(out) * in, expert);
    fill_random_bf16(p, int64_t(out) * in, 1.f / std::sqrt(float(in)), seed++, stream);
    d.bf16 = p;
  }
  return d;
}

const float* WeightBuilder::dummy_f32(int64_t n, float v) {
  float* p = alloc_weight<float>(n, false);
  fill_f32(p, n, v, stream);
  return p;
}

PackedFp4 WeightBuilder::dummy_packed(int out, int in) {
  uint8_t* st = stage_for(out, in);
  const int64_t code_bytes = int64_t(out) * in / 2;
  uint8_t* st_scales = st + (code_bytes + 255) / 256 * 256;
  const float global = fill_dummy_fp4(st, st_scales, out, in);
  return pack_staged(st, st_scales, global, out, in);  // stream-ordered reuse of the stage
}

void WeightBuilder::dummy(bool nvfp4_experts, bool load_mtp, uint64_t first_seed) {
  seed = first_seed;
  make_dummy_layers(nvfp4_experts);
  if (load_mtp && cfg.mtp_num_hidden_layers > 0) {
    // One full-attention MoE layer like the model's own, plus fc (split in halves) and norms.
    const int H = cfg.hidden_size;
    const float norm_w = cfg.norm_zero_centered ? 0.f : 1.f;
    ModelConfig one = cfg;
    one.num_hidden_layers = 1;
    one.layer_types = {LayerType::FullAttention};
    std::swap(cfg, one);
    std::vector<DevLayer> saved;
    std::swap(w.layers, saved);
    make_dummy_layers(nvfp4_experts, /*with_embeddings=*/false);
    w.mtp_layer = std::move(w.layers[0]);
    std::swap(w.layers, saved);
    std::swap(cfg, one);
    w.mtp_fc_e = dummy_linear(H, H, false, false);
    w.mtp_fc_h = dummy_linear(H, H, false, false);
    w.mtp_norm_e = dummy_f32(H, norm_w);
    w.mtp_norm_h = dummy_f32(H, norm_w);
    w.mtp_norm = dummy_f32(H, norm_w);
    w.has_mtp = true;
  }
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void WeightBuilder::make_dummy_layers(bool nvfp4_experts, bool with_embeddings) {
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  const float norm_w = cfg.norm_zero_centered ? 0.f : 1.f;
  if (with_embeddings) {
    bf16_t* e = alloc_weight<bf16_t>(int64_t(V) * H, false);
    fill_random_bf16(e, int64_t(V) * H, 1.f, seed++, stream);
    w.embed = e;
    w.lm_head = cfg.tie_word_embeddings ? w.embed + int64_t(split.vocab.begin) * H
                                        : dummy_linear(split.vocab_rows, H, false, false).bf16;
    w.final_norm = dummy_f32(H, norm_w);
  }
  const int d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim;
  const int conv_dim = 2 * hk * dk + hv * dv;
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    DevLayer l;
    l.type = cfg.layer_types[i];
    l.input_norm = dummy_f32(H, norm_w);
    l.post_norm = dummy_f32(H, norm_w);
    if (l.type == LayerType::FullAttention) {
      l.attn_qkv = dummy_linear(nh * d * (cfg.attn_output_gate ? 2 : 1) + 2 * nkv * d, H, false, false);
      l.o = dummy_linear(H, nh * d, false, false);
      l.q_norm = dummy_f32(d, norm_w);
      l.k_norm = dummy_f32(d, norm_w);
    } else {
      l.gdn_in = dummy_linear(conv_dim + hv * dv + 2 * hv, H, false, false);
      l.out = dummy_linear(H, hv * dv, false, false);
      l.conv_w = dummy_f32(int64_t(conv_dim) * cfg.linear_conv_kernel_dim, 0.25f);
      l.dt_bias = dummy_f32(hv, 0.f);
      l.a_log = dummy_f32(hv, -2.f);
      l.gnorm = dummy_f32(dv, 1.f);
    }
    l.is_moe = cfg.is_moe_layer(i);
    if (l.is_moe) {
      const int I = cfg.moe_intermediate_size;
      {
        float* r = alloc_weight<float>(int64_t(cfg.num_experts) * H, false);
        fill_random_f32(r, int64_t(cfg.num_experts) * H, 1.f / std::sqrt(float(H)), seed++, stream);
        l.router.out = cfg.num_experts;
        l.router.in = H;
        l.router.f32 = r;
        l.router3 = split_router(l.router);
      }
      if (nvfp4_experts && can_pack(I, H)) {
        std::vector<PackedFp4> g, u, dn;
        for (int e2 = 0; e2 < split.experts.size(); ++e2) {
          g.push_back(dummy_packed(I, H));
          u.push_back(dummy_packed(I, H));
          dn.push_back(dummy_packed(H, I));
        }
        l.packed = true;
        l.pexperts = upload_packed_table(g, u, dn);
      } else {
        for (int e2 = 0; e2 < split.experts.size(); ++e2) {
          l.ex_gate.push_back(dummy_linear(I, H, nvfp4_experts, true));
          l.ex_up.push_back(dummy_linear(I, H, nvfp4_experts, true));
          l.ex_down.push_back(dummy_linear(H, I, nvfp4_experts, true));
        }
        l.experts = upload_expert_table(l);
      }
      if (cfg.shared_expert_intermediate_size > 0) {
        const int S = cfg.shared_expert_intermediate_size;
        l.has_shared = true;
        l.s_fused = dummy_linear(padded_rows(2 * S + 1), H, false, false);
        l.s_down = dummy_linear(H, S, false, false);
      }
    } else {
      l.m_gate = dummy_linear(cfg.intermediate_size, H, false, false);
      l.m_up = dummy_linear(cfg.intermediate_size, H, false, false);
      l.m_down = dummy_linear(H, cfg.intermediate_size, false, false);
    }
    w.layers.push_back(std::move(l));
  }
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace fathom::cuda
