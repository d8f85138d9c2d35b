// The model's weights in GPU memory, in the layouts the layer code runs on: fused bf16
// projections, NVFP4 experts repacked for the tensor-core kernels, fp32 routers (and their bf16
// three-way split), carved out of 1 GB slabs. WeightBuilder makes them one of three ways:
//  - from_checkpoint (device_weights_stream.cpp): streamed from the shards as stored, so host
//    memory stays at a few staging buffers whatever the model's size;
//  - from_host (device_weights_host.cpp): from fp32/raw host weights (load_model_weights), the
//    older path, kept to check the streamed one against it bit for bit;
//  - dummy (device_weights_dummy.cpp): random weights at a config's shapes, made on the device.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/module_format.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/model_tensors.h"
#include "model/model_weights.h"
#include "model/tensor_split.h"

namespace fathom::cuda {

struct DevLayer {
  LayerType type = LayerType::FullAttention;
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  DeviceLinear q, k, v, o;
  DeviceLinear attn_qkv;  // [q | k | v] in one bf16 matrix when none is NVFP4 (one GEMV/GEMM, not three)
  const float *q_norm = nullptr, *k_norm = nullptr;
  float k_scale = 1.f, v_scale = 1.f;  // FP8 KV cache scales (AttentionWeights'), host values passed to the kernels
  DeviceLinear qkv, z, b, a, out;
  DeviceLinear gdn_in;  // [qkv | z | b | a] in one bf16 matrix when none is NVFP4 (one GEMM, not four)
  const float *conv_w = nullptr, *dt_bias = nullptr, *a_log = nullptr, *gnorm = nullptr;
  bool is_moe = false;
  DeviceLinear router;
  DeviceLinear router3;  // the router split into bf16 [hi | lo | hi] columns (prefill on tensor cores)
  DeviceExperts experts;                             // device descriptor arrays (bf16 experts)
  std::vector<DeviceLinear> ex_gate, ex_up, ex_down;  // host copies (prefill path)
  bool packed = false;                               // NVFP4 or FP8 experts, repacked for the tensor-core kernels
  PackedExperts pexperts;
  bool has_shared = false;
  DeviceLinear s_gate, s_up, s_down, s_gate_logit;
  DeviceLinear s_fused;  // [gate | up | gate logit | zero rows] in one bf16 matrix when none is NVFP4
  DeviceLinear m_gate, m_up, m_down;  // dense MLP
  int attn_index = -1, linear_index = -1;

  // Every dense projection the layer code passes to linear() (empty ones included): what the
  // memory plan sizes the dequantization scratch and the projection outputs from.
  template <class F>
  void for_each_linear(F&& f) const {
    for (const DeviceLinear* d : {&q, &k, &v, &o, &attn_qkv, &qkv, &z, &b, &a, &out, &gdn_in, &s_gate, &s_up, &s_down,
                                  &s_gate_logit, &s_fused, &m_gate, &m_up, &m_down})
      f(*d);
    for (const auto* group : {&ex_gate, &ex_up, &ex_down})
      for (const DeviceLinear& d : *group) f(d);
  }
};

// Fused matrices get zero rows up to a multiple of 8: an output row pitch of 2S+1 floats
// (the shared expert's [gate | up | gate logit]) puts cuBLASLt on slow unaligned kernels.
inline int padded_rows(int rows) { return (rows + 7) / 8 * 8; }

struct DeviceWeights {
  const bf16_t* embed = nullptr;
  const bf16_t* lm_head = nullptr;
  const float* final_norm = nullptr;
  std::vector<DevLayer> layers;
  bool has_mtp = false;
  DevLayer mtp_layer;
  DeviceLinear mtp_fc_e, mtp_fc_h;  // fc split into its embedding half and its hidden half
  const float *mtp_norm_e = nullptr, *mtp_norm_h = nullptr, *mtp_norm = nullptr;
  int64_t weight_bytes = 0, expert_bytes = 0, dense_bytes = 0;
  std::vector<DeviceBuffer> arena;  // the slabs

  // Every projection of every layer, the MTP layer's and the MTP input projections.
  template <class F>
  void for_each_linear(F&& f) const {
    for (const DevLayer& l : layers) l.for_each_linear(f);
    if (has_mtp) {
      mtp_layer.for_each_linear(f);
      f(mtp_fc_e);
      f(mtp_fc_h);
    }
  }
};

class CheckpointStreamer;

class WeightBuilder {
 public:
  WeightBuilder(const ModelConfig& cfg, cudaStream_t stream, DeviceWeights& out)
      : split(TensorSplit::whole(cfg)), cfg(cfg), stream(stream), w(out) {}

  // Every tensor the model needs (and the MTP layer's when `load_mtp`), streamed to the device.
  void from_checkpoint(const Checkpoint& ckpt, bool load_mtp);
  void from_host(const ModelWeights& host);
  // fp8_dense: the NVFP4-V2 layout's FP8 W8A8 attention, DeltaNet and shared-expert projections;
  // fp8_experts: routed experts in FP8 (Qwen's FP8 releases), packed.
  void dummy(bool nvfp4_experts, bool load_mtp, uint64_t seed, bool fp8_dense = false, bool fp8_experts = false);

  // A tensor-parallel rank's slice (model/tensor_split.h; whole by default). from_checkpoint
  // streams only it (cfg is then the whole model's); dummy() takes its lm_head rows and experts
  // from it (cfg is then the rank's); from_host gets host weights already cut. The embedding and
  // the routers stay whole.
  TensorSplit split;

 private:
  // Weights are carved out of large slabs: one cudaMalloc per tensor would waste whole pages
  // on the hundreds of thousands of small expert tensors of a 512-expert model.
  size_t slab_used = 0;
  template <class T>
  T* alloc_weight(int64_t count, bool expert) {
    constexpr size_t kSlab = size_t(1) << 30, kAlign = 256;
    const size_t bytes = (size_t(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    if (w.arena.empty() || slab_used + bytes > w.arena.back().bytes()) {
      w.arena.emplace_back(std::max(kSlab, bytes));
      slab_used = 0;
    }
    T* p = reinterpret_cast<T*>(static_cast<char*>(w.arena.back().data()) + slab_used);
    slab_used += bytes;
    w.weight_bytes += int64_t(count * sizeof(T));
    (expert ? w.expert_bytes : w.dense_bytes) += int64_t(count * sizeof(T));
    return p;
  }

  DeviceLinear split_router(const DeviceLinear& r);
  const float* upload_f32(const std::vector<float>& v);
  const bf16_t* upload_bf16(const std::vector<float>& v);
  DeviceExperts upload_expert_table(DevLayer& l);
  // NVFP4 experts are repacked (pack_fp4) from a device staging buffer into the weight slabs, so
  // they take no more memory than the checkpoint's layout.
  uint8_t* stage_for(int out, int in, bool fp8 = false);  // NVFP4 codes and scales, or FP8 codes
  PackedMatrix pack_staged(const uint8_t* codes, const uint8_t* scales, float global, int out, int in);
  PackedExperts upload_packed_table(const std::vector<PackedMatrix>& g, const std::vector<PackedMatrix>& u,
                                    const std::vector<PackedMatrix>& d);
  // The tensor-core expert kernels need every matrix in NVFP4 (k a multiple of 16, which also
  // keeps the bf16 activation rows 16-byte aligned).
  static bool can_pack(int I, int H) { return I % 16 == 0 && H % 16 == 0; }

  // from_host
  DeviceLinear upload_linear(const LinearWeight& lw, bool expert);
  DeviceLinear upload_linear_f32(const LinearWeight& lw);
  static std::optional<LinearWeight> concat_rows(std::initializer_list<const LinearWeight*> parts);
  static LinearWeight pad_rows(LinearWeight lw);
  PackedMatrix upload_packed(const LinearWeight& lw);
  DevLayer upload_layer(const LayerWeights& lw);

  // from_checkpoint
  QuantConfig quant;  // the checkpoint's, read by from_checkpoint
 public:
  bool fp8_weight_only = false;  // W8A8 FP8 linears built weight-only (CudaRunnerOptions)
 private:
  void load_quant_config(const Checkpoint& ck);
  ModuleFormat format_of(const std::string& module, int64_t rows, int64_t cols) const;
  bool stored_fp4(const std::string& module) const;
  bool stored_float(const std::string& module) const;  // neither NVFP4 nor FP8
  // FP8 linears as stored (device_weights_fp8.cpp): rows `rows` of a [stored_out, in] matrix, or
  // its input columns `cols`.
  DeviceLinear fp8_rows(const std::string& module, const ModuleFormat& f, const std::vector<IndexRange>& rows,
                        int stored_out, int in, bool expert);
  DeviceLinear fp8_columns(const std::string& module, const ModuleFormat& f, int out, int stored_in, IndexRange cols,
                           bool expert);
  // A quantized module's whole matrix dequantized to bf16 on the device (cached for the next call).
  const bf16_t* dequantized(const std::string& module, int64_t rows, int in);
  DeviceBuffer dequant_cache;
  std::string dequant_cache_name;
  void rows_bf16(const std::string& tensor, int rows, int in, bf16_t* dst, int64_t row0 = 0);
  DeviceLinear fused_bf16(const std::vector<std::pair<std::string, int>>& parts, int in, int total_rows, bool expert);
  // Row blocks of stored matrices (module, first row, rows; `stored_rows` checks the shape) in
  // one bf16 matrix, zero rows up to total_rows.
  struct RowPart {
    std::string module;
    int64_t row0;
    int rows, stored_rows;
  };
  DeviceLinear bf16_row_parts(const std::vector<RowPart>& parts, int in, int total_rows, bool expert);
  // Row blocks of FP8 linears with the same input in one FP8 matrix with a scale per row (their
  // per-tensor or per-row scales), zero rows up to total_rows: when every part is FP8 per tensor
  // or per row, all W8A8 with one input scale or all weight-only; or with 128 x 128 block scales
  // when every part starts on a block (fp8_block_row_parts). Empty (out == 0) otherwise.
  DeviceLinear fp8_row_parts(const std::vector<RowPart>& parts, int in, int total_rows);
  DeviceLinear fp8_block_row_parts(const std::vector<RowPart>& parts, const std::vector<ModuleFormat>& formats, int in,
                                   int total_rows);
  DeviceLinear stored_linear(const std::string& module, int out, int in, bool expert);
  // Rows `rows` (in order) of a stored [stored_out, in] linear, bf16 or NVFP4.
  DeviceLinear stored_rows(const std::string& module, const std::vector<IndexRange>& rows, int stored_out, int in,
                           bool expert);
  // Input columns `cols` of a stored [out, stored_in] linear, bf16 or NVFP4 (the whole matrix
  // is staged on the device, then the columns copied out).
  DeviceLinear stored_columns(const std::string& module, int out, int stored_in, IndexRange cols, bool expert);
  // Columns `cols` of rows [row0, row0 + rows) of a bf16-convertible tensor of rows of stored_in.
  DeviceLinear bf16_columns(const std::string& tensor, int64_t row0, int rows, int stored_in, IndexRange cols,
                            bool expert);

  DeviceLinear stored_router(const LinearSpec& router);
  // Per-expert NVFP4 or FP8 matrices, read in parallel into a ring of device stages and repacked there.
  void stream_packed_experts(const MoeTensors& t, DevLayer& l, PackedFormat format);
  bool packable_fp8_expert(const std::string& module, int rows, int in, IndexRange kept_rows,
                           IndexRange kept_cols) const;
  const float* fp8_slab_scales(const std::string& module, int rows, int in, IndexRange kept_rows, IndexRange kept_cols);
  std::vector<float> small_f32(const std::string& tensor, const std::vector<int64_t>& shape);
  std::vector<float> small_f32(const TensorSpec& t);
  DevLayer stream_layer(const LayerTensors& t);
  void stream_attention(DevLayer& l, const AttentionTensors& t);
  void stream_gated_delta_net(DevLayer& l, const GatedDeltaNetTensors& t);
  void stream_moe(DevLayer& l, const MoeTensors& t);

  // dummy
  float fill_dummy_fp4(uint8_t* codes, uint8_t* scales, int out, int in);
  DeviceLinear dummy_linear(int out, int in, bool fp4, bool expert);
  DeviceLinear dummy_fp8_linear(int out, int in);  // per-tensor W8A8
  const float* dummy_f32(int64_t n, float v);
  PackedMatrix dummy_packed(int out, int in);
  PackedMatrix dummy_packed_fp8(int out, int in);
  DevLayer dummy_layer(const LayerTensors& t, bool nvfp4_experts);
  bool dummy_fp8 = false;
  bool dummy_fp8_experts = false;

  ModelConfig cfg;
  cudaStream_t stream;
  DeviceWeights& w;
  DeviceBuffer pack_stage;
  DeviceBuffer pack_ring;  // from_checkpoint's stages (kStageRing matrices)
  static constexpr int kStageRing = 48;
  uint64_t seed = 1;
  CheckpointStreamer* st = nullptr;  // during from_checkpoint
};

}  // namespace fathom::cuda
