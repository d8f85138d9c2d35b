// Device weights streamed from the checkpoint's shards (CheckpointStreamer): BF16 tensors go to
// their place in the device layout as stored (fused projections are row blocks of one buffer),
// NVFP4 expert codes and scales go to a ring of device stages and are repacked there, small
// tensors (norms, routers) are converted on the host. The result is bit for bit what from_host makes from the
// same checkpoint; tensors stored in other float types take that path's host conversion.
#include <cmath>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "io/nvfp4.h"
#include "kernels/cuda/cuda_check.h"
#include "model/cuda/checkpoint_streamer.h"
#include "model/cuda/device_weights.h"

namespace fathom::cuda {

namespace {

std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> h(v.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = ::fathom::f32_to_bf16(v[i]);
  return h;
}

}  // namespace

bool WeightBuilder::stored_fp4(const std::string& module) const {
  return st->checkpoint().info(module + ".weight").dtype == DType::U8;
}

std::vector<float> WeightBuilder::small_f32(const std::string& tensor, const std::vector<int64_t>& shape) {
  return st->host_f32(tensor, shape);
}

// Rows [row0, row0 + rows) of a [*, in] matrix stored as `tensor` to `dst` as bf16. A linear
// stored as NVFP4 is dequantized on the host (only Qwen3-Next's reordered projections need it).
void WeightBuilder::rows_bf16(const std::string& tensor, int rows, int in, bf16_t* dst, int64_t row0) {
  const Checkpoint& ck = st->checkpoint();
  const TensorInfo& t = ck.info(tensor);
  const bool fp4 = t.dtype == DType::U8;  // packed: two codes a byte
  int64_t total_rows = 1;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i) total_rows *= t.shape[i];
  FATHOM_CHECK(t.shape.size() >= 2 && t.shape.back() == (fp4 ? in / 2 : in) && row0 + rows <= total_rows, "tensor '",
               tensor, "' in ", ck.file_of(tensor), ": expected rows of ", in, " values (rows ", row0, "..", row0 + rows,
               "), found shape ", shape_str(t.shape));
  if (t.dtype == DType::BF16) {
    st->copy(tensor, dst, uint64_t(row0) * in * 2, uint64_t(rows) * in * 2);
    return;
  }
  std::vector<float> all;
  if (fp4) {
    const std::string module = tensor.substr(0, tensor.size() - std::string(".weight").size());
    all = read_nvfp4_linear(ck, module, total_rows, in);
  } else {
    all = ck.read_f32(tensor, t.shape);
  }
  const std::vector<float> part(all.begin() + row0 * in, all.begin() + (row0 + rows) * in);
  const std::vector<bf16_t> h = to_bf16(part);
  FATHOM_CUDA_CHECK(cudaMemcpy(dst, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// One bf16 matrix from the rows of several stored linears with the same input (fused
// projections), zero rows up to `total_rows`.
DeviceLinear WeightBuilder::fused_bf16(const std::vector<std::pair<std::string, int>>& parts, int in, int total_rows,
                                       bool expert) {
  DeviceLinear d;
  d.out = total_rows;
  d.in = in;
  bf16_t* p = alloc_weight<bf16_t>(int64_t(total_rows) * in, expert);
  int row = 0;
  for (const auto& [module, rows] : parts) {
    const std::string name = module + ".weight";
    const TensorInfo& t = st->checkpoint().info(name);
    FATHOM_CHECK(t.shape == (std::vector<int64_t>{rows, in}), "tensor '", name, "' in ", st->checkpoint().file_of(name),
                 ": expected shape ", shape_str({rows, in}), ", found ", shape_str(t.shape));
    rows_bf16(name, rows, in, p + int64_t(row) * in);
    row += rows;
  }
  if (row < total_rows)
    FATHOM_CUDA_CHECK(cudaMemsetAsync(p + int64_t(row) * in, 0, size_t(total_rows - row) * in * 2, stream));
  d.bf16 = p;
  return d;
}

// A linear as stored: NVFP4 (codes, block scales, global scale) or bf16.
DeviceLinear WeightBuilder::stored_linear(const std::string& module, int out, int in, bool expert) {
  if (!stored_fp4(module)) return fused_bf16({{module, out}}, in, out, expert);
  DeviceLinear d;
  d.out = out;
  d.in = in;
  d.fp4_global = check_nvfp4_linear(st->checkpoint(), module, out, in);
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(out) * in / 2, expert);
  uint8_t* scales = alloc_weight<uint8_t>(int64_t(out) * in / 16, expert);
  st->copy(module + ".weight", codes);
  st->copy_scales(module + ".weight_scale", scales);
  d.fp4 = codes;
  d.fp4_scale = scales;
  return d;
}

// Routers stay fp32 (see split_router).
DeviceLinear WeightBuilder::stored_router(const std::string& module) {
  FATHOM_CHECK(!stored_fp4(module), "router '", module, "' stored as NVFP4 is not supported");
  DeviceLinear d;
  d.out = cfg.num_experts;
  d.in = cfg.hidden_size;
  d.f32 = upload_f32(small_f32(module + ".weight", {d.out, d.in}));
  return d;
}

// Expert matrices are small (0.6 MB at 35B, 2.3 MB at 397B): one at a time, reading would wait
// on every repack. Codes and scales of up to kStageRing matrices go to a ring of device stages,
// read by all the streamer's readers at once; then the loader's stream repacks them (after
// fence) and the ring is refilled only after that (fence_back).
void WeightBuilder::stream_packed_experts(const std::string& ex, DevLayer& l) {
  const int E = experts_held(), I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  const size_t code_bytes = (size_t(I) * H / 2 + 255) / 256 * 256, slot = code_bytes + (size_t(I) * H / 16 + 255) / 256 * 256;
  if (pack_ring.bytes() < slot * kStageRing) pack_ring = DeviceBuffer(slot * kStageRing);
  std::vector<PackedFp4> g(static_cast<size_t>(E)), u(static_cast<size_t>(E)), d(static_cast<size_t>(E));
  struct Pending {
    PackedFp4* out;
    int rows, cols;
    float global;
    uint8_t *codes, *scales;
  };
  std::vector<Pending> pending;
  auto flush = [&] {
    st->fence();
    for (const Pending& p : pending) *p.out = pack_staged(p.codes, p.scales, p.global, p.rows, p.cols);
    st->fence_back();
    pending.clear();
  };
  for (int e = 0; e < E; ++e) {
    const std::string m = ex + "." + std::to_string(expert_begin + e);
    for (auto [name, out, rows, cols] : {std::tuple{m + ".gate_proj", &g[size_t(e)], I, H},
                                         std::tuple{m + ".up_proj", &u[size_t(e)], I, H},
                                         std::tuple{m + ".down_proj", &d[size_t(e)], H, I}}) {
      if (int(pending.size()) == kStageRing) flush();
      uint8_t* codes = pack_ring.as<uint8_t>() + pending.size() * slot;
      const float global = check_nvfp4_linear(st->checkpoint(), name, rows, cols);
      st->copy(name + ".weight", codes);
      st->copy_scales(name + ".weight_scale", codes + code_bytes);
      pending.push_back(Pending{out, rows, cols, global, codes, codes + code_bytes});
    }
  }
  flush();
  l.packed = true;
  l.pexperts = upload_packed_table(g, u, d);
}

void WeightBuilder::stream_attention(DevLayer& l, const std::string& p) {
  const int H = cfg.hidden_size, d = cfg.head_dim;
  const int q_rows = cfg.num_attention_heads * d * (cfg.attn_output_gate ? 2 : 1), kv_rows = cfg.num_key_value_heads * d;
  if (!stored_fp4(p + ".q_proj") && !stored_fp4(p + ".k_proj") && !stored_fp4(p + ".v_proj")) {
    l.attn_qkv = fused_bf16({{p + ".q_proj", q_rows}, {p + ".k_proj", kv_rows}, {p + ".v_proj", kv_rows}}, H,
                            q_rows + 2 * kv_rows, false);
  } else {
    l.q = stored_linear(p + ".q_proj", q_rows, H, false);
    l.k = stored_linear(p + ".k_proj", kv_rows, H, false);
    l.v = stored_linear(p + ".v_proj", kv_rows, H, false);
  }
  l.o = stored_linear(p + ".o_proj", H, cfg.num_attention_heads * d, false);
  l.q_norm = upload_f32(small_f32(p + ".q_norm.weight", {d}));
  l.k_norm = upload_f32(small_f32(p + ".k_norm.weight", {d}));
}

void WeightBuilder::stream_gated_delta_net(DevLayer& l, const std::string& p) {
  const int H = cfg.hidden_size, hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
  const int key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;
  if (cfg.family == ModelFamily::Qwen3Next) {
    // Fused projections grouped per key head g: [q_g | k_g | v_g (r*dv) | z_g (r*dv)] and
    // [b_g (r) | a_g (r)], reordered to the layout [Q | K | V | Z | B | A] of one bf16 matrix.
    const int r = hv / hk, group_rows = 2 * dk + 2 * r * dv;
    const std::string qkvz = p + ".in_proj_qkvz.weight", ba = p + ".in_proj_ba.weight";
    const Checkpoint& ck = st->checkpoint();
    for (const auto& [t, want] : {std::pair{qkvz, 2 * key_dim + 2 * value_dim}, std::pair{ba, 2 * hv}})
      FATHOM_CHECK(ck.info(t).shape.size() == 2 && ck.info(t).shape[0] == want, "tensor '", t, "' in ", ck.file_of(t),
                   ": expected ", want, " rows, found shape ", shape_str(ck.info(t).shape));
    const int rows = conv_dim + value_dim + 2 * hv;
    DeviceLinear d;
    d.out = rows;
    d.in = H;
    bf16_t* m = alloc_weight<bf16_t>(int64_t(rows) * H, false);
    auto put = [&](const std::string& t, int src_row, int count, int dst_row) {
      rows_bf16(t, count, H, m + int64_t(dst_row) * H, src_row);
    };
    for (int g = 0; g < hk; ++g) {
      const int base = g * group_rows;
      put(qkvz, base, dk, g * dk);
      put(qkvz, base + dk, dk, key_dim + g * dk);
      put(qkvz, base + 2 * dk, r * dv, 2 * key_dim + g * r * dv);
      put(qkvz, base + 2 * dk + r * dv, r * dv, conv_dim + g * r * dv);
      put(ba, g * 2 * r, r, conv_dim + value_dim + g * r);
      put(ba, g * 2 * r + r, r, conv_dim + value_dim + hv + g * r);
    }
    d.bf16 = m;
    l.gdn_in = d;
  } else if (!stored_fp4(p + ".in_proj_qkv") && !stored_fp4(p + ".in_proj_z") && !stored_fp4(p + ".in_proj_b") &&
             !stored_fp4(p + ".in_proj_a")) {
    l.gdn_in = fused_bf16({{p + ".in_proj_qkv", conv_dim}, {p + ".in_proj_z", value_dim}, {p + ".in_proj_b", hv},
                           {p + ".in_proj_a", hv}},
                          H, conv_dim + value_dim + 2 * hv, false);
  } else {
    l.qkv = stored_linear(p + ".in_proj_qkv", conv_dim, H, false);
    l.z = stored_linear(p + ".in_proj_z", value_dim, H, false);
    l.b = stored_linear(p + ".in_proj_b", hv, H, false);
    l.a = stored_linear(p + ".in_proj_a", hv, H, false);
  }
  l.out = stored_linear(p + ".out_proj", H, value_dim, false);
  l.conv_w = upload_f32(small_f32(p + ".conv1d.weight", {conv_dim, 1, kc}));
  l.dt_bias = upload_f32(small_f32(p + ".dt_bias", {hv}));
  l.a_log = upload_f32(small_f32(p + ".A_log", {hv}));
  l.gnorm = upload_f32(small_f32(p + ".norm.weight", {dv}));
}

void WeightBuilder::stream_moe(DevLayer& l, const std::string& p) {
  const int H = cfg.hidden_size, E_all = cfg.num_experts, E = experts_held(), I = cfg.moe_intermediate_size;
  const Checkpoint& ck = st->checkpoint();
  l.router = stored_router(p + ".gate");
  l.router3 = split_router(l.router);
  const std::string ex = p + ".experts";
  if (ck.has(ex + ".gate_up_proj")) {  // fused [E, 2I, H] + [E, H, I], stored unquantized
    FATHOM_CHECK(ck.info(ex + ".gate_up_proj").shape == (std::vector<int64_t>{E_all, 2 * I, H}), "tensor '", ex,
                 ".gate_up_proj': expected shape ", shape_str({E_all, 2 * I, H}), ", found ",
                 shape_str(ck.info(ex + ".gate_up_proj").shape));
    FATHOM_CHECK(ck.info(ex + ".down_proj").shape == (std::vector<int64_t>{E_all, H, I}), "tensor '", ex,
                 ".down_proj': expected shape ", shape_str({E_all, H, I}), ", found ",
                 shape_str(ck.info(ex + ".down_proj").shape));
    for (int e = expert_begin; e < expert_begin + E; ++e) {
      auto rows_of = [&](const std::string& t, int64_t row0, int out, int in) {
        DeviceLinear d;
        d.out = out;
        d.in = in;
        bf16_t* m = alloc_weight<bf16_t>(int64_t(out) * in, true);
        rows_bf16(t, out, in, m, row0);
        d.bf16 = m;
        return d;
      };
      l.ex_gate.push_back(rows_of(ex + ".gate_up_proj", int64_t(e) * 2 * I, I, H));
      l.ex_up.push_back(rows_of(ex + ".gate_up_proj", int64_t(e) * 2 * I + I, I, H));
      l.ex_down.push_back(rows_of(ex + ".down_proj", int64_t(e) * H, H, I));
    }
    l.experts = upload_expert_table(l);
  } else {
    FATHOM_CHECK(ck.has(ex + ".0.gate_proj.weight"), "missing tensor '", ex, ".gate_up_proj' (fused experts) or '", ex,
                 ".0.gate_proj.weight' (per expert) in ", ck.dir().string());
    bool all_fp4 = can_pack(I, H);
    for (int e = expert_begin; e < expert_begin + E && all_fp4; ++e)
      for (const char* m : {".gate_proj", ".up_proj", ".down_proj"})
        all_fp4 = all_fp4 && stored_fp4(ex + "." + std::to_string(e) + m);
    if (all_fp4) {
      stream_packed_experts(ex, l);
    } else {
      for (int e = expert_begin; e < expert_begin + E; ++e) {
        const std::string m = ex + "." + std::to_string(e);
        l.ex_gate.push_back(stored_linear(m + ".gate_proj", I, H, true));
        l.ex_up.push_back(stored_linear(m + ".up_proj", I, H, true));
        l.ex_down.push_back(stored_linear(m + ".down_proj", H, I, true));
      }
      l.experts = upload_expert_table(l);
    }
  }
  if (cfg.shared_expert_intermediate_size > 0) {
    const int S = cfg.shared_expert_intermediate_size;
    const std::string se = p + ".shared_expert";
    l.has_shared = true;
    if (!stored_fp4(se + ".gate_proj") && !stored_fp4(se + ".up_proj") && !stored_fp4(p + ".shared_expert_gate")) {
      l.s_fused = fused_bf16({{se + ".gate_proj", S}, {se + ".up_proj", S}, {p + ".shared_expert_gate", 1}}, H,
                             padded_rows(2 * S + 1), false);
    } else {
      l.s_gate = stored_linear(se + ".gate_proj", S, H, false);
      l.s_up = stored_linear(se + ".up_proj", S, H, false);
      l.s_gate_logit = stored_linear(p + ".shared_expert_gate", 1, H, false);
    }
    l.s_down = stored_linear(se + ".down_proj", H, S, false);
  }
}

DevLayer WeightBuilder::stream_layer(const std::string& p, LayerType type, bool is_moe) {
  const int H = cfg.hidden_size;
  DevLayer l;
  l.type = type;
  l.input_norm = upload_f32(small_f32(p + ".input_layernorm.weight", {H}));
  l.post_norm = upload_f32(small_f32(p + ".post_attention_layernorm.weight", {H}));
  if (type == LayerType::FullAttention) stream_attention(l, p + ".self_attn");
  else stream_gated_delta_net(l, p + ".linear_attn");
  l.is_moe = is_moe;
  if (is_moe) {
    stream_moe(l, p + ".mlp");
  } else {
    l.m_gate = stored_linear(p + ".mlp.gate_proj", cfg.intermediate_size, H, false);
    l.m_up = stored_linear(p + ".mlp.up_proj", cfg.intermediate_size, H, false);
    l.m_down = stored_linear(p + ".mlp.down_proj", H, cfg.intermediate_size, false);
  }
  return l;
}

void WeightBuilder::from_checkpoint(const Checkpoint& ck, bool load_mtp) {
  load_mtp = load_mtp && cfg.mtp_num_hidden_layers > 0;
  uint64_t total = 0;
  for (const std::string& name : ck.names())
    if (load_mtp || name.rfind("mtp.", 0) != 0) total += ck.info(name).nbytes;
  CheckpointStreamer streamer(ck, stream, total);
  st = &streamer;
  const std::string& pre = cfg.weight_prefix;
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  {
    bf16_t* e = alloc_weight<bf16_t>(int64_t(V) * H, false);
    rows_bf16(pre + "embed_tokens.weight", V, H, e);
    FATHOM_CHECK(ck.info(pre + "embed_tokens.weight").shape == (std::vector<int64_t>{V, H}), "tensor '", pre,
                 "embed_tokens.weight': expected shape ", shape_str({V, H}));
    w.embed = e;
  }
  const bool tied = cfg.tie_word_embeddings && !ck.has("lm_head.weight");
  if (tied) {
    w.lm_head = w.embed;
  } else {
    FATHOM_CHECK(!stored_fp4("lm_head"), "lm_head stored as NVFP4 is not supported by the CUDA engine yet");
    w.lm_head = stored_linear("lm_head", V, H, false).bf16;
  }
  w.final_norm = upload_f32(small_f32(pre + "norm.weight", {H}));
  for (int i = 0; i < cfg.num_hidden_layers; ++i)
    w.layers.push_back(stream_layer(pre + "layers." + std::to_string(i), cfg.layer_types[i], cfg.is_moe_layer(i)));
  if (load_mtp) {
    FATHOM_CHECK(ck.has("mtp.fc.weight"), "config declares mtp_num_hidden_layers = ", cfg.mtp_num_hidden_layers,
                 " but tensor 'mtp.fc.weight' is missing in ", ck.dir().string());
    FATHOM_CHECK(!stored_fp4("mtp.fc"), "mtp.fc stored as NVFP4 is not supported");
    w.has_mtp = true;
    w.mtp_layer = stream_layer("mtp.layers.0", LayerType::FullAttention, cfg.num_experts > 0);
    // fc = [W_e | W_h] over the concatenated input: the two column halves become two matrices.
    DeviceBuffer fc(size_t(H) * 2 * H * 2);
    rows_bf16("mtp.fc.weight", H, 2 * H, fc.as<bf16_t>());
    st->fence();  // the strided copies below read what the readers brought
    FATHOM_CHECK(ck.info("mtp.fc.weight").shape == (std::vector<int64_t>{H, 2 * H}), "tensor 'mtp.fc.weight': expected shape ",
                 shape_str({H, 2 * H}));
    for (int half = 0; half < 2; ++half) {
      DeviceLinear d;
      d.out = d.in = H;
      bf16_t* m = alloc_weight<bf16_t>(int64_t(H) * H, false);
      FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(m, size_t(H) * 2, fc.as<bf16_t>() + int64_t(half) * H, size_t(2 * H) * 2,
                                          size_t(H) * 2, size_t(H), cudaMemcpyDeviceToDevice, stream));
      d.bf16 = m;
      (half == 0 ? w.mtp_fc_e : w.mtp_fc_h) = d;
    }
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `fc` is freed
    w.mtp_norm_e = upload_f32(small_f32("mtp.pre_fc_norm_embedding.weight", {H}));
    w.mtp_norm_h = upload_f32(small_f32("mtp.pre_fc_norm_hidden.weight", {H}));
    w.mtp_norm = upload_f32(small_f32("mtp.norm.weight", {H}));
  }
  streamer.finish();
  st = nullptr;
}

}  // namespace fathom::cuda
