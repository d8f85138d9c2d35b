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

DeviceLinear WeightBuilder::dummy_fp8_linear(int out, int in) {
  DeviceLinear d;
  d.out = out;
  d.in = in;
  uint8_t* p = alloc_weight<uint8_t>(int64_t(out) * in, false);
  // Sign and exponent up to 7 (|v| < 2, never the NaN code), so the scale sets the size.
  fill_random_bytes(p, int64_t(out) * in, seed++, 0xbf, 0, stream);
  d.fp8 = p;
  d.fp8_scale = 0.8f / std::sqrt(float(in));
  d.fp8_input_scale = 8.f / 448.f;  // activations of up to 8 in magnitude
  return d;
}

const float* WeightBuilder::dummy_f32(int64_t n, float v) {
  float* p = alloc_weight<float>(n, false);
  fill_f32(p, n, v, stream);
  return p;
}

PackedMatrix WeightBuilder::dummy_packed(int out, int in) {
  uint8_t* st = stage_for(out, in);
  const int64_t code_bytes = int64_t(out) * in / 2;
  uint8_t* st_scales = st + (code_bytes + 255) / 256 * 256;
  const float global = fill_dummy_fp4(st, st_scales, out, in);
  return pack_staged(st, st_scales, global, out, in);  // stream-ordered reuse of the stage
}

// Random E4M3 codes of |v| < 2 (never NaN) and one slab scale for the whole matrix, packed.
PackedMatrix WeightBuilder::dummy_packed_fp8(int out, int in) {
  uint8_t* st = stage_for(out, in, /*fp8=*/true);
  fill_random_bytes(st, int64_t(out) * in, seed++, 0xbf, 0, stream);
  const int64_t n = packed_fp8_slab_scales(out, in);
  float* scales = alloc_weight<float>(n, true);
  fill_f32(scales, n, 0.8f / std::sqrt(float(in)), stream);
  return pack_fp8(st, scales, out, in, alloc_weight<uint8_t>(packed_fp8_code_bytes(out, in), true), stream);
}

void WeightBuilder::dummy(bool nvfp4_experts, bool load_mtp, uint64_t first_seed, bool fp8_dense, bool fp8_experts) {
  seed = first_seed;
  dummy_fp8 = fp8_dense;
  dummy_fp8_experts = fp8_experts;
  const ModelTensors t = model_tensors(cfg);
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  const float norm_w = cfg.norm_zero_centered ? 0.f : 1.f;
  bf16_t* e = alloc_weight<bf16_t>(int64_t(V) * H, false);
  fill_random_bf16(e, int64_t(V) * H, 1.f, seed++, stream);
  w.embed = e;
  w.lm_head = cfg.tie_word_embeddings ? w.embed + int64_t(split.vocab.begin) * H
                                      : dummy_linear(split.vocab_rows, H, false, false).bf16;
  w.final_norm = dummy_f32(H, norm_w);
  for (const LayerTensors& layer : t.layers) w.layers.push_back(dummy_layer(layer, nvfp4_experts));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (load_mtp && t.mtp) {
    // The MTP layer like the model's own, plus fc (split in halves) and norms.
    w.mtp_layer = dummy_layer(t.mtp->layer, nvfp4_experts);
    w.mtp_fc_e = dummy_linear(H, H, false, false);
    w.mtp_fc_h = dummy_linear(H, H, false, false);
    w.mtp_norm_e = dummy_f32(H, norm_w);
    w.mtp_norm_h = dummy_f32(H, norm_w);
    w.mtp_norm = dummy_f32(H, norm_w);
    w.has_mtp = true;
  }
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Dense projections are bf16 (fused the way the streamed loader fuses bf16 ones); routed experts
// NVFP4 or FP8 when asked, repacked for the tensor-core kernels where their shape allows.
DevLayer WeightBuilder::dummy_layer(const LayerTensors& t, bool nvfp4_experts) {
  const int H = cfg.hidden_size;
  const float norm_w = cfg.norm_zero_centered ? 0.f : 1.f;
  DevLayer l;
  l.type = t.type;
  l.input_norm = dummy_f32(H, norm_w);
  l.post_norm = dummy_f32(H, norm_w);
  if (l.type == LayerType::FullAttention) {
    const AttentionTensors& a = t.attn;
    if (dummy_fp8) {  // fused as the loader fuses them (fp8_row_parts)
      l.attn_qkv = dummy_fp8_linear(a.q.out + a.k.out + a.v.out, H);
      l.o = dummy_fp8_linear(a.o.out, a.o.in);
    } else {
      l.attn_qkv = dummy_linear(a.q.out + a.k.out + a.v.out, H, false, false);
      l.o = dummy_linear(a.o.out, a.o.in, false, false);
    }
    l.q_norm = dummy_f32(a.q_norm.shape[0], norm_w);
    l.k_norm = dummy_f32(a.k_norm.shape[0], norm_w);
  } else {
    const GatedDeltaNetTensors& g = t.gdn;
    if (dummy_fp8) {  // FP8 [qkv | z]; in_proj_b / in_proj_a stay bf16 in the V2 release: [b | a]
      l.qkv = dummy_fp8_linear(g.qkv.out + g.z.out, H);
      l.b = dummy_linear(g.b.out + g.a.out, H, false, false);
      l.out = dummy_fp8_linear(g.out.out, g.out.in);
    } else {
      l.gdn_in = dummy_linear(g.qkv.out + g.z.out + g.b.out + g.a.out, H, false, false);
      l.out = dummy_linear(g.out.out, g.out.in, false, false);
    }
    l.conv_w = dummy_f32(g.conv.shape[0] * g.conv.shape[2], 0.25f);
    l.dt_bias = dummy_f32(g.dt_bias.shape[0], 0.f);
    l.a_log = dummy_f32(g.a_log.shape[0], -2.f);
    l.gnorm = dummy_f32(g.norm.shape[0], 1.f);
  }
  l.is_moe = t.is_moe;
  if (!l.is_moe) {
    l.m_gate = dummy_linear(t.mlp.gate.out, t.mlp.gate.in, false, false);
    l.m_up = dummy_linear(t.mlp.up.out, t.mlp.up.in, false, false);
    l.m_down = dummy_linear(t.mlp.down.out, t.mlp.down.in, false, false);
    return l;
  }
  const MoeTensors& m = t.moe;
  const int I = m.moe_intermediate;
  float* r = alloc_weight<float>(int64_t(m.router.out) * H, false);
  fill_random_f32(r, int64_t(m.router.out) * H, 1.f / std::sqrt(float(H)), seed++, stream);
  l.router.out = m.router.out;
  l.router.in = H;
  l.router.f32 = r;
  l.router3 = split_router(l.router);
  if ((nvfp4_experts || dummy_fp8_experts) && can_pack(I, H)) {
    std::vector<PackedMatrix> g, u, dn;
    auto make = [&](int out, int in) { return dummy_fp8_experts ? dummy_packed_fp8(out, in) : dummy_packed(out, in); };
    for (int e2 = 0; e2 < split.experts.size(); ++e2) {
      g.push_back(make(I, H));
      u.push_back(make(I, H));
      dn.push_back(make(H, I));
    }
    l.packed = true;
    l.pexperts = upload_packed_table(g, u, dn);
    if (dummy_fp8_experts) l.pexperts.format = PackedFormat::Fp8;
  } else {
    for (int e2 = 0; e2 < split.experts.size(); ++e2) {
      l.ex_gate.push_back(dummy_linear(I, H, nvfp4_experts, true));
      l.ex_up.push_back(dummy_linear(I, H, nvfp4_experts, true));
      l.ex_down.push_back(dummy_linear(H, I, nvfp4_experts, true));
    }
    l.experts = upload_expert_table(l);
  }
  if (m.has_shared) {
    l.has_shared = true;
    if (dummy_fp8) {
      l.s_fused = dummy_fp8_linear(padded_rows(m.shared.gate.out + m.shared.up.out), H);
      l.s_gate_logit = dummy_linear(1, H, false, false);
      l.s_down = dummy_fp8_linear(m.shared.down.out, m.shared.down.in);
    } else {
      l.s_fused = dummy_linear(padded_rows(m.shared.gate.out + m.shared.up.out + m.shared_gate.out), H, false, false);
      l.s_down = dummy_linear(m.shared.down.out, m.shared.down.in, false, false);
    }
  }
  return l;
}

}  // namespace fathom::cuda
