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
#include "model/kv_cache_scales.h"
#include "model/weight_shard.h"

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

std::vector<float> WeightBuilder::small_f32(const TensorSpec& t) { return small_f32(t.name, t.shape); }

// Rows [row0, row0 + rows) of a [*, in] matrix stored as `tensor` to `dst` as bf16. A linear
// stored as NVFP4 or FP8 is dequantized on the device (Qwen3-Next's reordered projections, an
// NVFP4 lm_head, FP8 routed experts).
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
  if (t.dtype == DType::U8 || t.dtype == DType::F8_E4M3) {  // a quantized linear, dequantized on the device
    const std::string module = tensor.substr(0, tensor.size() - std::string(".weight").size());
    const bf16_t* all = dequantized(module, total_rows, in);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(dst, all + row0 * in, size_t(rows) * in * 2, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const std::vector<float> all = ck.read_f32(tensor, t.shape);
  const std::vector<float> part(all.begin() + row0 * in, all.begin() + (row0 + rows) * in);
  const std::vector<bf16_t> h = to_bf16(part);
  FATHOM_CUDA_CHECK(cudaMemcpy(dst, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// One bf16 matrix from the rows of several stored linears with the same input (fused
// projections), zero rows up to `total_rows`.
DeviceLinear WeightBuilder::fused_bf16(const std::vector<std::pair<std::string, int>>& parts, int in, int total_rows,
                                       bool expert) {
  std::vector<RowPart> whole;
  for (const auto& [module, rows] : parts) whole.push_back(RowPart{module, 0, rows, rows});
  return bf16_row_parts(whole, in, total_rows, expert);
}

DeviceLinear WeightBuilder::bf16_row_parts(const std::vector<RowPart>& parts, int in, int total_rows, bool expert) {
  DeviceLinear d;
  d.out = total_rows;
  d.in = in;
  bf16_t* p = alloc_weight<bf16_t>(int64_t(total_rows) * in, expert);
  int row = 0;
  for (const RowPart& part : parts) {
    format_of(part.module, part.stored_rows, in);  // checks the tensors against the quantization config
    const std::string name = part.module + ".weight";
    const TensorInfo& t = st->checkpoint().info(name);
    const int64_t stored_in = t.dtype == DType::U8 ? in / 2 : in;  // packed FP4: two codes a byte
    FATHOM_CHECK(t.shape == (std::vector<int64_t>{part.stored_rows, stored_in}), "tensor '", name, "' in ",
                 st->checkpoint().file_of(name), ": expected shape ", shape_str({part.stored_rows, stored_in}),
                 ", found ", shape_str(t.shape));
    rows_bf16(name, part.rows, in, p + int64_t(row) * in, part.row0);
    row += part.rows;
  }
  if (row < total_rows)
    FATHOM_CUDA_CHECK(cudaMemsetAsync(p + int64_t(row) * in, 0, size_t(total_rows - row) * in * 2, stream));
  d.bf16 = p;
  return d;
}

// A linear as stored: NVFP4 (codes, block scales, global scale), FP8 (codes and scales) or bf16.
DeviceLinear WeightBuilder::stored_linear(const std::string& module, int out, int in, bool expert) {
  return stored_rows(module, {{0, out}}, out, in, expert);
}

DeviceLinear WeightBuilder::stored_rows(const std::string& module, const std::vector<IndexRange>& rows, int stored_out,
                                        int in, bool expert) {
  int out = 0;
  for (const IndexRange& r : rows) out += r.size();
  const ModuleFormat f = format_of(module, stored_out, in);
  // FP8 routed experts the packed kernels do not take (per-row scales) run on the bf16 expert
  // kernels: dequantized at load.
  if (f.weight == WeightFormat::FP8 && !expert) return fp8_rows(module, f, rows, stored_out, in, expert);
  if (f.weight != WeightFormat::NVFP4) {
    std::vector<RowPart> parts;
    for (const IndexRange& r : rows) parts.push_back(RowPart{module, r.begin, r.size(), stored_out});
    return bf16_row_parts(parts, in, out, expert);
  }
  DeviceLinear d;
  d.out = out;
  d.in = in;
  d.fp4_global = check_nvfp4_linear(st->checkpoint(), module, stored_out, in);
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(out) * in / 2, expert);
  uint8_t* scales = alloc_weight<uint8_t>(int64_t(out) * in / 16, expert);
  int64_t row = 0;
  for (const IndexRange& r : rows) {  // whole rows of codes and scales are contiguous
    st->copy(module + ".weight", codes + row * in / 2, uint64_t(r.begin) * in / 2, uint64_t(r.size()) * in / 2);
    st->copy_scales(module + ".weight_scale", scales + row * in / 16, uint64_t(r.begin) * in / 16,
                    uint64_t(r.size()) * in / 16);
    row += r.size();
  }
  d.fp4 = codes;
  d.fp4_scale = scales;
  return d;
}

DeviceLinear WeightBuilder::bf16_columns(const std::string& tensor, int64_t row0, int rows, int stored_in,
                                         IndexRange cols, bool expert) {
  DeviceBuffer stage(size_t(rows) * stored_in * 2);
  rows_bf16(tensor, rows, stored_in, stage.as<bf16_t>(), row0);
  st->fence();  // the strided copy below reads what the readers brought
  DeviceLinear d;
  d.out = rows;
  d.in = cols.size();
  bf16_t* m = alloc_weight<bf16_t>(int64_t(rows) * d.in, expert);
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(m, size_t(d.in) * 2, stage.as<bf16_t>() + cols.begin, size_t(stored_in) * 2,
                                      size_t(d.in) * 2, size_t(rows), cudaMemcpyDeviceToDevice, stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `stage` is freed
  d.bf16 = m;
  return d;
}

DeviceLinear WeightBuilder::stored_columns(const std::string& module, int out, int stored_in, IndexRange cols,
                                           bool expert) {
  if (cols.begin == 0 && cols.end == stored_in) return stored_linear(module, out, stored_in, expert);
  const ModuleFormat f = format_of(module, out, stored_in);
  if (f.weight == WeightFormat::FP8 && !expert) return fp8_columns(module, f, out, stored_in, cols, expert);
  if (f.weight != WeightFormat::NVFP4) {
    const TensorInfo& t = st->checkpoint().info(module + ".weight");
    FATHOM_CHECK(t.shape == (std::vector<int64_t>{out, stored_in}), "tensor '", module, ".weight': expected shape ",
                 shape_str({out, stored_in}), ", found ", shape_str(t.shape));
    return bf16_columns(module + ".weight", 0, out, stored_in, cols, expert);
  }
  // Codes pack two to a byte and share an e4m3 scale per 16: slices start and end on those.
  FATHOM_CHECK(cols.begin % 16 == 0 && cols.end % 16 == 0, "NVFP4 weight '", module, "' splits on 16-column blocks; [",
               cols.begin, ", ", cols.end, ") does not");
  DeviceLinear d;
  d.out = out;
  d.in = cols.size();
  d.fp4_global = check_nvfp4_linear(st->checkpoint(), module, out, stored_in);
  DeviceBuffer stage(size_t(out) * stored_in / 2 + size_t(out) * stored_in / 16);
  uint8_t* full_codes = stage.as<uint8_t>();
  uint8_t* full_scales = full_codes + size_t(out) * stored_in / 2;
  st->copy(module + ".weight", full_codes);
  st->copy_scales(module + ".weight_scale", full_scales);
  st->fence();
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(out) * d.in / 2, expert);
  uint8_t* scales = alloc_weight<uint8_t>(int64_t(out) * d.in / 16, expert);
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(codes, size_t(d.in) / 2, full_codes + cols.begin / 2, size_t(stored_in) / 2,
                                      size_t(d.in) / 2, size_t(out), cudaMemcpyDeviceToDevice, stream));
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(scales, size_t(d.in) / 16, full_scales + cols.begin / 16,
                                      size_t(stored_in) / 16, size_t(d.in) / 16, size_t(out),
                                      cudaMemcpyDeviceToDevice, stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `stage` is freed
  d.fp4 = codes;
  d.fp4_scale = scales;
  return d;
}

// Routers stay fp32 (see split_router).
DeviceLinear WeightBuilder::stored_router(const LinearSpec& r) {
  FATHOM_CHECK(stored_float(r.module), "router '", r.module, "' stored as ",
               dtype_name(st->checkpoint().info(r.weight()).dtype), " is not supported (routers are BF16/F32)");
  DeviceLinear d;
  d.out = r.out;
  d.in = r.in;
  d.f32 = upload_f32(small_f32(r.weight(), {d.out, d.in}));
  return d;
}

// Expert matrices are small (0.6 MB at 35B, 2.3 MB at 397B): one at a time, reading would wait
// on every repack. Codes (and NVFP4 scales) of up to kStageRing matrices go to a ring of device
// stages, read by all the streamer's readers at once; then the loader's stream repacks them (after
// fence) and the ring is refilled only after that (fence_back).
void WeightBuilder::stream_packed_experts(const MoeTensors& t, DevLayer& l, PackedFormat format) {
  const bool fp8 = format == PackedFormat::Fp8;
  const int E = split.experts.size(), I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  // A tensor-parallel rank keeps rows [c0, c1) of gate/up (contiguous in the file) and those
  // columns of down (staged whole, then copied out before the repack).
  const IndexRange cols = split.expert_columns;
  const int Ic = cols.size();
  FATHOM_CHECK(cols.begin % 16 == 0 && cols.end % 16 == 0, "packed experts split on 16-column blocks; [", cols.begin,
               ", ", cols.end, ") does not");
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  // Bytes of n codes, and of their NVFP4 scales (FP8's slab scales are made on the host).
  auto code_bytes_of = [&](int64_t n) { return size_t(fp8 ? n : n / 2); };
  auto scale_bytes_of = [&](int64_t n) { return fp8 ? size_t(0) : size_t(n / 16); };
  const size_t code_bytes = round(code_bytes_of(int64_t(I) * H)), scale_bytes = round(scale_bytes_of(int64_t(I) * H));
  const size_t cut_bytes =
      Ic < I ? round(code_bytes_of(int64_t(Ic) * H)) + round(scale_bytes_of(int64_t(Ic) * H)) : 0;
  const size_t slot = code_bytes + scale_bytes + cut_bytes;
  if (pack_ring.bytes() < slot * kStageRing) pack_ring = DeviceBuffer(slot * kStageRing);
  std::vector<PackedMatrix> g(static_cast<size_t>(E)), u(static_cast<size_t>(E)), d(static_cast<size_t>(E));
  struct Pending {
    PackedMatrix* out;
    int rows, cols;
    float global;             // NVFP4
    const float* slab_scales;  // FP8, on the device
    uint8_t *codes, *scales;
    const uint8_t *full_codes = nullptr, *full_scales = nullptr;  // down of a column-split rank
    int full_cols = 0, col0 = 0;
  };
  std::vector<Pending> pending;
  auto flush = [&] {
    st->fence();
    for (const Pending& p : pending) {
      if (p.full_codes) {
        FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(p.codes, code_bytes_of(p.cols), p.full_codes + code_bytes_of(p.col0),
                                            code_bytes_of(p.full_cols), code_bytes_of(p.cols), size_t(p.rows),
                                            cudaMemcpyDeviceToDevice, stream));
        if (!fp8)
          FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(p.scales, size_t(p.cols) / 16, p.full_scales + p.col0 / 16,
                                              size_t(p.full_cols) / 16, size_t(p.cols) / 16, size_t(p.rows),
                                              cudaMemcpyDeviceToDevice, stream));
      }
      if (fp8) {
        uint8_t* q = alloc_weight<uint8_t>(packed_fp8_code_bytes(p.rows, p.cols), true);
        *p.out = pack_fp8(p.codes, p.slab_scales, p.rows, p.cols, q, stream);
      } else {
        *p.out = pack_staged(p.codes, p.scales, p.global, p.rows, p.cols);
      }
    }
    st->fence_back();
    pending.clear();
  };
  for (int e = 0; e < E; ++e) {
    const MlpTensors m = t.expert(split.experts.begin + e);
    for (auto [name, out, down] : {std::tuple{m.gate.module, &g[size_t(e)], false},
                                   std::tuple{m.up.module, &u[size_t(e)], false},
                                   std::tuple{m.down.module, &d[size_t(e)], true}}) {
      if (int(pending.size()) == kStageRing) flush();
      uint8_t* base = pack_ring.as<uint8_t>() + pending.size() * slot;
      const int rows = down ? H : I, in = down ? I : H;  // stored
      Pending p{out, down ? H : Ic, down ? Ic : H, 1.f, nullptr, base, base + code_bytes};
      if (fp8) {
        // The packed matrix is rows kept_rows x columns kept_cols of the stored one.
        const IndexRange kept_rows = down ? IndexRange{0, H} : cols, kept_cols = down ? cols : IndexRange{0, H};
        FATHOM_CHECK(kept_rows.size() == p.rows && kept_cols.size() == p.cols, "FP8 expert '", name, "': slab scales for [",
                     kept_rows.size(), ", ", kept_cols.size(), "] but a packed matrix of [", p.rows, ", ", p.cols, "]");
        p.slab_scales = fp8_slab_scales(name, rows, in, kept_rows, kept_cols);
      } else {
        p.global = check_nvfp4_linear(st->checkpoint(), name, rows, in);
      }
      auto copy_whole = [&] {
        st->copy(name + ".weight", base);
        if (!fp8) st->copy_scales(name + ".weight_scale", base + code_bytes);
      };
      if (!down) {  // rows [c0, c1)
        st->copy(name + ".weight", base, code_bytes_of(int64_t(cols.begin) * H), code_bytes_of(int64_t(Ic) * H));
        if (!fp8)
          st->copy_scales(name + ".weight_scale", base + code_bytes, uint64_t(cols.begin) * H / 16,
                          uint64_t(Ic) * H / 16);
      } else if (Ic == I) {
        copy_whole();
      } else {  // whole matrix staged, columns [c0, c1) cut into the slot's tail
        copy_whole();
        uint8_t* cut = base + code_bytes + scale_bytes;
        p.full_codes = base;
        p.full_scales = base + code_bytes;
        p.codes = cut;
        p.scales = cut + round(code_bytes_of(int64_t(Ic) * H));
        p.full_cols = I;
        p.col0 = cols.begin;
      }
      pending.push_back(p);
    }
  }
  flush();
  l.packed = true;
  l.pexperts = upload_packed_table(g, u, d);
  l.pexperts.format = format;
}

// FP8 routed experts the packed kernels take: per-tensor or 128 x 128 block scales (a slab of 16
// rows x 64 k inside one block, so this rank's rows and columns start on a block), codes in a
// 16-wide k. W8A8 experts run weight-only there, as they do on the bf16 expert kernels.
static bool packable_fp8(const ModuleFormat& f, IndexRange kept_rows, IndexRange kept_cols) {
  if (f.weight != WeightFormat::FP8 || kept_rows.size() % 16 != 0 || kept_cols.size() % 16 != 0) return false;
  if (f.fp8.scaling == Fp8Scaling::PerTensor) return true;
  return f.fp8.scaling == Fp8Scaling::Block && f.fp8.block[0] == kFp8BlockSize && f.fp8.block[1] == kFp8BlockSize &&
         kept_rows.begin % kFp8BlockSize == 0 && kept_cols.begin % kFp8BlockSize == 0;
}

bool WeightBuilder::packable_fp8_expert(const std::string& module, int rows, int in, IndexRange kept_rows,
                                        IndexRange kept_cols) const {
  return packable_fp8(format_of(module, rows, in), kept_rows, kept_cols);
}

// The slab scales of rows kept_rows x columns kept_cols of an FP8 [rows, in] expert matrix: the
// scale over each 16 x 64 slab (uploaded; the packed kernels apply them to fp32 partial sums).
const float* WeightBuilder::fp8_slab_scales(const std::string& module, int rows, int in, IndexRange kept_rows,
                                            IndexRange kept_cols) {
  const ModuleFormat f = format_of(module, rows, in);
  FATHOM_CHECK(packable_fp8(f, kept_rows, kept_cols), "FP8 routed expert '", module, "' is ",
               f.label(st->checkpoint(), module),
               ", unlike its layer's first expert (FP8 per tensor or in 128 x 128 blocks, split on a block)");
  const int row_tiles = (kept_rows.size() + kPackedTileRows - 1) / kPackedTileRows;
  const int k_slabs = (kept_cols.size() + kPackedSlabK - 1) / kPackedSlabK;
  std::vector<float> s(size_t(row_tiles) * k_slabs);
  for (int rt = 0; rt < row_tiles; ++rt)
    for (int ks = 0; ks < k_slabs; ++ks)
      s[size_t(rt) * k_slabs + ks] =
          f.fp8.at(kept_rows.begin + rt * kPackedTileRows, kept_cols.begin + ks * kPackedSlabK, in);
  const float* dev = alloc_weight<float>(int64_t(s.size()), true);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(dev), s.data(), s.size() * 4, cudaMemcpyHostToDevice, stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `s` goes
  return dev;
}

void WeightBuilder::stream_attention(DevLayer& l, const AttentionTensors& t) {
  const int H = cfg.hidden_size;
  const IndexRange q = split.q_rows(cfg), kv = split.kv_rows(cfg);  // this rank's heads
  if (stored_float(t.q.module) && stored_float(t.k.module) && stored_float(t.v.module)) {
    l.attn_qkv = bf16_row_parts({{t.q.module, q.begin, q.size(), t.q.out},
                                 {t.k.module, kv.begin, kv.size(), t.k.out},
                                 {t.v.module, kv.begin, kv.size(), t.v.out}},
                                H, q.size() + 2 * kv.size(), false);
  } else {
    // FP8 projections of one input are one FP8 matrix with a scale per row (one GEMV, not three).
    l.attn_qkv = fp8_row_parts({{t.q.module, q.begin, q.size(), t.q.out},
                                {t.k.module, kv.begin, kv.size(), t.k.out},
                                {t.v.module, kv.begin, kv.size(), t.v.out}},
                               H, q.size() + 2 * kv.size());
    if (l.attn_qkv.out == 0) {
      l.q = stored_rows(t.q.module, {q}, t.q.out, H, false);
      l.k = stored_rows(t.k.module, {kv}, t.k.out, H, false);
      l.v = stored_rows(t.v.module, {kv}, t.v.out, H, false);
    }
  }
  l.o = stored_columns(t.o.module, H, t.o.in, split.o_columns(cfg), false);
  l.q_norm = upload_f32(small_f32(t.q_norm));
  l.k_norm = upload_f32(small_f32(t.k_norm));
  l.k_scale = read_kv_cache_scale(st->checkpoint(), t.k_scale);
  l.v_scale = read_kv_cache_scale(st->checkpoint(), t.v_scale);
}

void WeightBuilder::stream_gated_delta_net(DevLayer& l, const GatedDeltaNetTensors& t) {
  const int H = cfg.hidden_size, hk_all = cfg.linear_num_key_heads, hv_all = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
  // This rank's key heads [k0, k1) and value heads [v0, v1) (all of them without a split).
  const IndexRange kh = split.linear_key_heads;
  const IndexRange vh = split.linear_value_heads;
  const int hk = kh.size(), hv = vh.size();
  const int key_dim = hk * dk, value_dim = hv * dv, conv_dim = 2 * key_dim + value_dim;  // this rank's
  const int value_all = cfg.linear_value_dim(), conv_all = cfg.linear_conv_dim();
  const std::vector<IndexRange> qkv_rows = split.linear_qkv_rows(cfg);
  const IndexRange value_rows = split.linear_value_rows(cfg);
  if (t.fused_per_key_head) {
    // Fused projections grouped per key head g: [q_g | k_g | v_g (r*dv) | z_g (r*dv)] and
    // [b_g (r) | a_g (r)], reordered to the layout [Q | K | V | Z | B | A] of one bf16 matrix
    // (this rank's key heads, and value heads j of group g = j / r).
    const int r = hv_all / hk_all, group_rows = 2 * dk + 2 * r * dv;
    const std::string qkvz = t.qkvz.weight(), ba = t.ba.weight();
    const Checkpoint& ck = st->checkpoint();
    for (const auto& [name, want] : {std::pair{qkvz, t.qkvz.out}, std::pair{ba, t.ba.out}})
      FATHOM_CHECK(ck.info(name).shape.size() == 2 && ck.info(name).shape[0] == want, "tensor '", name, "' in ",
                   ck.file_of(name), ": expected ", want, " rows, found shape ", shape_str(ck.info(name).shape));
    const int rows = conv_dim + value_dim + 2 * hv;
    DeviceLinear d;
    d.out = rows;
    d.in = H;
    bf16_t* m = alloc_weight<bf16_t>(int64_t(rows) * H, false);
    auto put = [&](const std::string& name, int src_row, int count, int dst_row) {
      rows_bf16(name, count, H, m + int64_t(dst_row) * H, src_row);
    };
    for (int g = kh.begin; g < kh.end; ++g) {
      put(qkvz, g * group_rows, dk, (g - kh.begin) * dk);
      put(qkvz, g * group_rows + dk, dk, key_dim + (g - kh.begin) * dk);
    }
    for (int j = vh.begin; j < vh.end; ++j) {
      const int g = j / r, i = j % r, base = g * group_rows, to = j - vh.begin;
      put(qkvz, base + 2 * dk + i * dv, dv, 2 * key_dim + to * dv);
      put(qkvz, base + 2 * dk + r * dv + i * dv, dv, conv_dim + to * dv);
      put(ba, g * 2 * r + i, 1, conv_dim + value_dim + to);
      put(ba, g * 2 * r + r + i, 1, conv_dim + value_dim + hv + to);
    }
    d.bf16 = m;
    l.gdn_in = d;
  } else if (stored_float(t.qkv.module) && stored_float(t.z.module) && stored_float(t.b.module) &&
             stored_float(t.a.module)) {
    const std::string& qkv = t.qkv.module;
    l.gdn_in = bf16_row_parts({{qkv, qkv_rows[0].begin, qkv_rows[0].size(), conv_all},
                               {qkv, qkv_rows[1].begin, qkv_rows[1].size(), conv_all},
                               {qkv, qkv_rows[2].begin, qkv_rows[2].size(), conv_all},
                               {t.z.module, value_rows.begin, value_dim, value_all},
                               {t.b.module, vh.begin, hv, hv_all},
                               {t.a.module, vh.begin, hv, hv_all}},
                              H, conv_dim + value_dim + 2 * hv, false);
  } else {
    // NVIDIA's V2 layout: FP8 [qkv | z] in one matrix, bf16 [b | a] in another.
    const std::string& qkv = t.qkv.module;
    l.qkv = fp8_row_parts({{qkv, qkv_rows[0].begin, qkv_rows[0].size(), conv_all},
                           {qkv, qkv_rows[1].begin, qkv_rows[1].size(), conv_all},
                           {qkv, qkv_rows[2].begin, qkv_rows[2].size(), conv_all},
                           {t.z.module, value_rows.begin, value_dim, value_all}},
                          H, conv_dim + value_dim);
    if (l.qkv.out == 0) {
      l.qkv = stored_rows(t.qkv.module, qkv_rows, t.qkv.out, H, false);
      l.z = stored_rows(t.z.module, {value_rows}, t.z.out, H, false);
    }
    if (stored_float(t.b.module) && stored_float(t.a.module)) {
      l.b = bf16_row_parts({{t.b.module, vh.begin, hv, hv_all}, {t.a.module, vh.begin, hv, hv_all}}, H, 2 * hv, false);
    } else {
      l.b = stored_rows(t.b.module, {vh}, t.b.out, H, false);
      l.a = stored_rows(t.a.module, {vh}, t.a.out, H, false);
    }
  }
  l.out = stored_columns(t.out.module, H, t.out.in, value_rows, false);
  l.conv_w = upload_f32(rows_of(small_f32(t.conv), kc, qkv_rows));
  l.dt_bias = upload_f32(rows_of(small_f32(t.dt_bias), 1, {vh}));
  l.a_log = upload_f32(rows_of(small_f32(t.a_log), 1, {vh}));
  l.gnorm = upload_f32(small_f32(t.norm));
}

void WeightBuilder::stream_moe(DevLayer& l, const MoeTensors& t) {
  const int H = cfg.hidden_size, E = split.experts.size(), I = cfg.moe_intermediate_size;
  const IndexRange cols = split.expert_columns;  // this rank's expert columns
  const int Ic = cols.size();
  const Checkpoint& ck = st->checkpoint();
  l.router = stored_router(t.router);
  l.router3 = split_router(l.router);
  if (ck.has(t.fused_gate_up.name)) {  // fused [E, 2I, H] + [E, H, I], stored unquantized
    for (const TensorSpec* f : {&t.fused_gate_up, &t.fused_down})
      FATHOM_CHECK(ck.info(f->name).shape == f->shape, "tensor '", f->name, "': expected shape ", shape_str(f->shape),
                   ", found ", shape_str(ck.info(f->name).shape));
    for (int e = split.experts.begin; e < split.experts.begin + E; ++e) {
      auto rows_of = [&](const std::string& t, int64_t row0, int out, int in) {
        DeviceLinear d;
        d.out = out;
        d.in = in;
        bf16_t* m = alloc_weight<bf16_t>(int64_t(out) * in, true);
        rows_bf16(t, out, in, m, row0);
        d.bf16 = m;
        return d;
      };
      l.ex_gate.push_back(rows_of(t.fused_gate_up.name, int64_t(e) * 2 * I + cols.begin, Ic, H));
      l.ex_up.push_back(rows_of(t.fused_gate_up.name, int64_t(e) * 2 * I + I + cols.begin, Ic, H));
      l.ex_down.push_back(Ic == I ? rows_of(t.fused_down.name, int64_t(e) * H, H, I)
                                  : bf16_columns(t.fused_down.name, int64_t(e) * H, H, I, cols, true));
    }
    l.experts = upload_expert_table(l);
  } else {
    FATHOM_CHECK(ck.has(t.expert(0).gate.weight()), "missing tensor '", t.fused_gate_up.name, "' (fused experts) or '",
                 t.expert(0).gate.weight(), "' (per expert) in ", ck.dir().string());
    bool all_fp4 = can_pack(Ic, H);
    for (int e = split.experts.begin; e < split.experts.begin + E && all_fp4; ++e) {
      const MlpTensors m = t.expert(e);
      for (const LinearSpec* part : {&m.gate, &m.up, &m.down}) all_fp4 = all_fp4 && stored_fp4(part->module);
    }
    // FP8 experts are packed when the layer's first expert is (every expert's scales are checked
    // as they are read): half the memory of the bf16 kernels' copy, exact scales.
    const MlpTensors first = t.expert(split.experts.begin);
    const bool fp8 = !all_fp4 && E > 0 &&
                     packable_fp8_expert(first.gate.module, I, H, cols, {0, H}) &&
                     packable_fp8_expert(first.up.module, I, H, cols, {0, H}) &&
                     packable_fp8_expert(first.down.module, H, I, {0, H}, cols);
    if (all_fp4 || fp8) {
      stream_packed_experts(t, l, fp8 ? PackedFormat::Fp8 : PackedFormat::Nvfp4);
    } else {
      for (int e = split.experts.begin; e < split.experts.begin + E; ++e) {
        const MlpTensors m = t.expert(e);
        l.ex_gate.push_back(stored_rows(m.gate.module, {cols}, m.gate.out, H, true));
        l.ex_up.push_back(stored_rows(m.up.module, {cols}, m.up.out, H, true));
        l.ex_down.push_back(stored_columns(m.down.module, H, m.down.in, cols, true));
      }
      l.experts = upload_expert_table(l);
    }
  }
  if (t.has_shared) {
    const int S = t.shared.gate.out;
    const IndexRange sc = split.shared_columns;  // the gate logit stays whole
    l.has_shared = true;
    if (stored_float(t.shared.gate.module) && stored_float(t.shared.up.module) && stored_float(t.shared_gate.module)) {
      l.s_fused = bf16_row_parts({{t.shared.gate.module, sc.begin, sc.size(), S},
                                  {t.shared.up.module, sc.begin, sc.size(), S},
                                  {t.shared_gate.module, 0, 1, 1}},
                                 H, padded_rows(2 * sc.size() + 1), false);
    } else {
      // FP8 [gate | up] in one matrix; the gate logit (bf16 in every release) on its own.
      l.s_fused = fp8_row_parts({{t.shared.gate.module, sc.begin, sc.size(), S}, {t.shared.up.module, sc.begin, sc.size(), S}},
                                H, padded_rows(2 * sc.size()));
      if (l.s_fused.out == 0) {
        l.s_gate = stored_rows(t.shared.gate.module, {sc}, S, H, false);
        l.s_up = stored_rows(t.shared.up.module, {sc}, S, H, false);
      }
      l.s_gate_logit = stored_linear(t.shared_gate.module, 1, H, false);
    }
    l.s_down = stored_columns(t.shared.down.module, H, S, sc, false);
  }
}

DevLayer WeightBuilder::stream_layer(const LayerTensors& t) {
  DevLayer l;
  l.type = t.type;
  l.input_norm = upload_f32(small_f32(t.input_norm));
  l.post_norm = upload_f32(small_f32(t.post_attention_norm));
  if (t.type == LayerType::FullAttention) stream_attention(l, t.attn);
  else stream_gated_delta_net(l, t.gdn);
  l.is_moe = t.is_moe;
  if (t.is_moe) {
    stream_moe(l, t.moe);
  } else {
    const IndexRange mc = split.mlp_columns;
    l.m_gate = stored_rows(t.mlp.gate.module, {mc}, t.mlp.gate.out, t.mlp.gate.in, false);
    l.m_up = stored_rows(t.mlp.up.module, {mc}, t.mlp.up.out, t.mlp.up.in, false);
    l.m_down = stored_columns(t.mlp.down.module, t.mlp.down.out, t.mlp.down.in, mc, false);
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
  load_quant_config(ck);
  const ModelTensors t = model_tensors(cfg);
  const int H = cfg.hidden_size, V = cfg.vocab_size;
  {
    bf16_t* e = alloc_weight<bf16_t>(int64_t(V) * H, false);
    rows_bf16(t.embed.name, V, H, e);
    FATHOM_CHECK(ck.info(t.embed.name).shape == t.embed.shape, "tensor '", t.embed.name, "': expected shape ",
                 shape_str(t.embed.shape));
    w.embed = e;
  }
  // A tensor-parallel rank keeps the whole embedding and its vocabulary rows of lm_head (tied:
  // those rows of the embedding).
  const IndexRange vocab = split.vocab;
  FATHOM_CHECK(split.vocab_rows == vocab.size(), "lm_head splits evenly only: vocabulary ", V, " over ", split.size,
               " ranks");
  const bool tied = cfg.tie_word_embeddings && !ck.has(t.lm_head.weight());
  if (tied) {
    w.lm_head = w.embed + int64_t(vocab.begin) * H;
  } else {
    // The sampling kernels read a bf16 lm_head: a quantized one (Qwen3.6's W4A16 NVFP4) is
    // dequantized at load.
    format_of(t.lm_head.module, V, H);
    w.lm_head = bf16_row_parts({{t.lm_head.module, vocab.begin, vocab.size(), V}}, H, vocab.size(), false).bf16;
  }
  w.final_norm = upload_f32(small_f32(t.final_norm));
  for (const LayerTensors& layer : t.layers) w.layers.push_back(stream_layer(layer));
  if (load_mtp) {
    const MtpTensors& m = *t.mtp;
    FATHOM_CHECK(ck.has(m.fc.weight()), "config declares mtp_num_hidden_layers = ", cfg.mtp_num_hidden_layers,
                 " but tensor '", m.fc.weight(), "' is missing in ", ck.dir().string());
    FATHOM_CHECK(stored_float(m.fc.module), "mtp.fc stored as ", dtype_name(ck.info(m.fc.weight()).dtype),
                 " is not supported (BF16 in every release)");
    w.has_mtp = true;
    w.mtp_layer = stream_layer(m.layer);
    // fc = [W_e | W_h] over the concatenated input: the two column halves become two matrices.
    DeviceBuffer fc(size_t(H) * 2 * H * 2);
    rows_bf16(m.fc.weight(), H, 2 * H, fc.as<bf16_t>());
    st->fence();  // the strided copies below read what the readers brought
    FATHOM_CHECK(ck.info(m.fc.weight()).shape == (std::vector<int64_t>{m.fc.out, m.fc.in}), "tensor '", m.fc.weight(),
                 "': expected shape ", shape_str({m.fc.out, m.fc.in}));
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
    w.mtp_norm_e = upload_f32(small_f32(m.pre_fc_norm_embedding));
    w.mtp_norm_h = upload_f32(small_f32(m.pre_fc_norm_hidden));
    w.mtp_norm = upload_f32(small_f32(m.norm));
  }
  streamer.finish();
  dequant_cache = DeviceBuffer();
  dequant_cache_name.clear();
  st = nullptr;
}

}  // namespace fathom::cuda
