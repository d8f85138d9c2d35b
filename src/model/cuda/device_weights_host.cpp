// Device weights from host weights (load_model_weights with keep_nvfp4): the older loading path,
// which needs the whole model in host memory; kept to check the streamed path against it.
#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "model/cuda/device_weights.h"

namespace fathom::cuda {

DeviceLinear WeightBuilder::upload_linear(const LinearWeight& lw, bool expert) {
  DeviceLinear d;
  d.out = lw.out;
  d.in = lw.in;
  if (!lw.fp4.empty()) {
    uint8_t* p = alloc_weight<uint8_t>(int64_t(lw.fp4.size()), expert);
    FATHOM_CUDA_CHECK(cudaMemcpy(p, lw.fp4.data(), lw.fp4.size(), cudaMemcpyHostToDevice));
    uint8_t* s = alloc_weight<uint8_t>(int64_t(lw.fp4_scale.size()), expert);
    FATHOM_CUDA_CHECK(cudaMemcpy(s, lw.fp4_scale.data(), lw.fp4_scale.size(), cudaMemcpyHostToDevice));
    d.fp4 = p;
    d.fp4_scale = s;
    d.fp4_global = lw.fp4_global;
  } else {
    std::vector<bf16_t> h(lw.w.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = ::fathom::f32_to_bf16(lw.w[i]);
    bf16_t* p = alloc_weight<bf16_t>(int64_t(h.size()), expert);
    FATHOM_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    d.bf16 = p;
  }
  return d;
}

DeviceLinear WeightBuilder::upload_linear_f32(const LinearWeight& lw) {
  FATHOM_CHECK(lw.fp4.empty(), "router stored as NVFP4 is not supported");
  DeviceLinear d;
  d.out = lw.out;
  d.in = lw.in;
  d.f32 = upload_f32(lw.w);
  return d;
}

// Stacks the rows of several bf16-stored linears with the same input, or nothing when one of
// them is NVFP4 (those keep their own kernels).
std::optional<LinearWeight> WeightBuilder::concat_rows(std::initializer_list<const LinearWeight*> parts) {
  LinearWeight out;
  out.in = (*parts.begin())->in;
  for (const LinearWeight* w : parts) {
    if (!w->fp4.empty() || w->in != out.in) return std::nullopt;
    out.out += w->out;
    out.w.insert(out.w.end(), w->w.begin(), w->w.end());
  }
  return out;
}

LinearWeight WeightBuilder::pad_rows(LinearWeight lw) {
  lw.out = padded_rows(lw.out);
  lw.w.resize(size_t(lw.out) * lw.in, 0.f);
  return lw;
}

PackedMatrix WeightBuilder::upload_packed(const LinearWeight& lw) {
  uint8_t* st = stage_for(lw.out, lw.in);
  uint8_t* st_scales = st + (lw.fp4.size() + 255) / 256 * 256;
  FATHOM_CUDA_CHECK(cudaMemcpy(st, lw.fp4.data(), lw.fp4.size(), cudaMemcpyHostToDevice));
  FATHOM_CUDA_CHECK(cudaMemcpy(st_scales, lw.fp4_scale.data(), lw.fp4_scale.size(), cudaMemcpyHostToDevice));
  const PackedMatrix p = pack_staged(st, st_scales, lw.fp4_global, lw.out, lw.in);
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the stage is reused by the next matrix
  return p;
}

void WeightBuilder::from_host(const ModelWeights& host) {
  w.embed = upload_bf16(host.embed);
  w.lm_head = host.tied_lm_head ? w.embed : upload_linear(host.lm_head, false).bf16;
  FATHOM_CHECK(w.lm_head != nullptr, "lm_head stored as NVFP4 is not supported by the CUDA engine yet");
  w.final_norm = upload_f32(host.final_norm);
  for (const LayerWeights& lw : host.layers) w.layers.push_back(upload_layer(lw));
  if (host.mtp) {
    const MtpWeights& m = *host.mtp;
    const int H = cfg.hidden_size;
    w.has_mtp = true;
    w.mtp_layer = upload_layer(m.layer);
    LinearWeight fe, fh;  // fc = [W_e | W_h] over the concatenated input
    fe.out = fh.out = H;
    fe.in = fh.in = H;
    FATHOM_CHECK(m.fc.fp4.empty(), "mtp.fc stored as NVFP4 is not supported");
    for (int r = 0; r < H; ++r) {
      fe.w.insert(fe.w.end(), m.fc.w.begin() + int64_t(r) * 2 * H, m.fc.w.begin() + int64_t(r) * 2 * H + H);
      fh.w.insert(fh.w.end(), m.fc.w.begin() + int64_t(r) * 2 * H + H, m.fc.w.begin() + int64_t(r + 1) * 2 * H);
    }
    w.mtp_fc_e = upload_linear(fe, false);
    w.mtp_fc_h = upload_linear(fh, false);
    w.mtp_norm_e = upload_f32(m.pre_fc_norm_embedding);
    w.mtp_norm_h = upload_f32(m.pre_fc_norm_hidden);
    w.mtp_norm = upload_f32(m.norm);
  }
}

DevLayer WeightBuilder::upload_layer(const LayerWeights& lw) {
  DevLayer l;
  l.type = lw.type;
  l.input_norm = upload_f32(lw.input_norm);
  l.post_norm = upload_f32(lw.post_attention_norm);
  if (lw.type == LayerType::FullAttention) {
    if (const auto fused = concat_rows({&lw.attn.q, &lw.attn.k, &lw.attn.v})) {
      l.attn_qkv = upload_linear(*fused, false);
    } else {
      l.q = upload_linear(lw.attn.q, false);
      l.k = upload_linear(lw.attn.k, false);
      l.v = upload_linear(lw.attn.v, false);
    }
    l.o = upload_linear(lw.attn.o, false);
    l.q_norm = upload_f32(lw.attn.q_norm);
    l.k_norm = upload_f32(lw.attn.k_norm);
    l.k_scale = lw.attn.k_scale;
    l.v_scale = lw.attn.v_scale;
  } else {
    if (const auto fused = concat_rows({&lw.gdn.qkv, &lw.gdn.z, &lw.gdn.b, &lw.gdn.a})) {
      l.gdn_in = upload_linear(*fused, false);
    } else {
      l.qkv = upload_linear(lw.gdn.qkv, false);
      l.z = upload_linear(lw.gdn.z, false);
      l.b = upload_linear(lw.gdn.b, false);
      l.a = upload_linear(lw.gdn.a, false);
    }
    l.out = upload_linear(lw.gdn.out, false);
    l.conv_w = upload_f32(lw.gdn.conv);
    l.dt_bias = upload_f32(lw.gdn.dt_bias);
    l.a_log = upload_f32(lw.gdn.a_log);
    l.gnorm = upload_f32(lw.gdn.norm);
  }
  l.is_moe = lw.is_moe;
  if (lw.is_moe) {
    l.router = upload_linear_f32(lw.moe.router);
    l.router3 = split_router(l.router);
    bool all_fp4 = !lw.moe.experts.empty();
    for (const MlpWeights& e : lw.moe.experts)
      all_fp4 = all_fp4 && !e.gate.fp4.empty() && !e.up.fp4.empty() && !e.down.fp4.empty() &&
                can_pack(e.gate.out, e.gate.in);
    if (all_fp4) {
      std::vector<PackedMatrix> g, u, d;
      for (const MlpWeights& e : lw.moe.experts) {
        g.push_back(upload_packed(e.gate));
        u.push_back(upload_packed(e.up));
        d.push_back(upload_packed(e.down));
      }
      l.packed = true;
      l.pexperts = upload_packed_table(g, u, d);
    } else {
      for (const MlpWeights& e : lw.moe.experts) {
        l.ex_gate.push_back(upload_linear(e.gate, true));
        l.ex_up.push_back(upload_linear(e.up, true));
        l.ex_down.push_back(upload_linear(e.down, true));
      }
      l.experts = upload_expert_table(l);
    }
    if (lw.moe.shared) {
      l.has_shared = true;
      if (const auto fused = concat_rows({&lw.moe.shared->gate, &lw.moe.shared->up, &lw.moe.shared_gate})) {
        l.s_fused = upload_linear(pad_rows(*fused), false);
      } else {
        l.s_gate = upload_linear(lw.moe.shared->gate, false);
        l.s_up = upload_linear(lw.moe.shared->up, false);
        l.s_gate_logit = upload_linear(lw.moe.shared_gate, false);
      }
      l.s_down = upload_linear(lw.moe.shared->down, false);
    }
  } else {
    l.m_gate = upload_linear(lw.mlp.gate, false);
    l.m_up = upload_linear(lw.mlp.up, false);
    l.m_down = upload_linear(lw.mlp.down, false);
  }
  return l;
}

}  // namespace fathom::cuda
