// The weight builder's quantized-format paths besides the NVFP4 experts: FP8 linears kept as
// stored (E4M3 codes, no bf16 copy on the host or the device) with their scales, and the tensors
// a bf16 layout needs from a quantized module (Qwen3-Next's reordered projections, an NVFP4
// lm_head, FP8 routed experts), dequantized on the device.
#include <algorithm>

#include "core/error.h"
#include "io/nvfp4.h"
#include "io/text_file.h"
#include "kernels/cuda/cuda_check.h"
#include "model/cuda/checkpoint_streamer.h"
#include "model/cuda/device_weights.h"
#include "model/weight_shard.h"

namespace fathom::cuda {

ModuleFormat WeightBuilder::format_of(const std::string& module, int64_t rows, int64_t cols) const {
  return resolve_module_format(st->checkpoint(), quant, module, rows, cols);
}

bool WeightBuilder::stored_float(const std::string& module) const {
  const DType t = st->checkpoint().info(module + ".weight").dtype;
  return t != DType::U8 && t != DType::F8_E4M3;
}

namespace {

// The block sizes the GPU's FP8 kernels and dequantization take.
void check_fp8_blocks(const std::string& module, const ModuleFormat& f) {
  FATHOM_CHECK(f.fp8.scaling != Fp8Scaling::Block || (f.fp8.block[0] == kFp8BlockSize && f.fp8.block[1] == kFp8BlockSize),
               "FP8 module '", module, "': weight_block_size [", f.fp8.block[0], ", ", f.fp8.block[1],
               "] is not supported by the CUDA engine (", kFp8BlockSize, " x ", kFp8BlockSize, ")");
}

// What the GPU's FP8 kernels take; anything else is refused at load naming the dimension.
void check_fp8_shape(const std::string& module, const ModuleFormat& f, int in) {
  FATHOM_CHECK(in % 16 == 0, "FP8 module '", module, "': input width ", in,
               " is not a multiple of 16 (the CUDA engine's FP8 kernels read 16 weights at a time)");
  check_fp8_blocks(module, f);
}

// A linear's FP8 scale fields from its resolved format (per-row or block scales uploaded apart).
void set_fp8_scales(DeviceLinear& d, const ModuleFormat& f, bool weight_only) {
  d.fp8_scaling = f.fp8.scaling;
  d.fp8_scale = f.fp8.tensor_scale;
  d.fp8_input_scale = weight_only ? 0.f : f.fp8.input_scale;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// Adjacent row ranges as one (a whole matrix is then one range, whatever its blocks).
std::vector<IndexRange> coalesced(const std::vector<IndexRange>& rows) {
  std::vector<IndexRange> out;
  for (const IndexRange& r : rows) {
    if (!out.empty() && out.back().end == r.begin) out.back().end = r.end;
    else out.push_back(r);
  }
  return out;
}

DeviceLinear WeightBuilder::fp8_rows(const std::string& module, const ModuleFormat& f,
                                     const std::vector<IndexRange>& split_rows, int stored_out, int in, bool expert) {
  check_fp8_shape(module, f, in);
  const std::vector<IndexRange> rows = coalesced(split_rows);
  DeviceLinear d;
  d.in = in;
  for (const IndexRange& r : rows) d.out += r.size();
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(d.out) * in, expert);
  int64_t row = 0;
  std::vector<IndexRange> block_rows;
  for (const IndexRange& r : rows) {
    // A block's scale covers 128 rows: a slice must keep whole blocks in place.
    FATHOM_CHECK(f.fp8.scaling != Fp8Scaling::Block ||
                     (row % kFp8BlockSize == 0 && r.begin % kFp8BlockSize == 0 &&
                      (r.end % kFp8BlockSize == 0 || r.end == stored_out)),
                 "block FP8 module '", module, "': rows [", r.begin, ", ", r.end, ") of ", stored_out,
                 " do not split on its 128-row blocks (tensor parallelism over this many ranks)");
    block_rows.push_back({r.begin / kFp8BlockSize, int(ceil_div(r.end, kFp8BlockSize))});
    st->copy(module + ".weight", codes + row * in, uint64_t(r.begin) * in, uint64_t(r.size()) * in);
    row += r.size();
  }
  d.fp8 = codes;
  set_fp8_scales(d, f, fp8_weight_only);
  if (f.fp8.scaling == Fp8Scaling::PerChannel) d.fp8_scales = upload_f32(rows_of(f.fp8.scales, 1, rows));
  if (f.fp8.scaling == Fp8Scaling::Block)
    d.fp8_scales = upload_f32(rows_of(f.fp8.scales, ceil_div(in, kFp8BlockSize), block_rows));
  return d;
}

DeviceLinear WeightBuilder::fp8_columns(const std::string& module, const ModuleFormat& f, int out, int stored_in,
                                        IndexRange cols, bool expert) {
  check_fp8_shape(module, f, cols.size());
  FATHOM_CHECK(f.fp8.scaling != Fp8Scaling::Block ||
                   (cols.begin % kFp8BlockSize == 0 && (cols.end % kFp8BlockSize == 0 || cols.end == stored_in)),
               "block FP8 module '", module, "': columns [", cols.begin, ", ", cols.end, ") of ", stored_in,
               " do not split on its 128-column blocks");
  DeviceBuffer stage(size_t(out) * stored_in);
  st->copy(module + ".weight", stage.data());
  st->fence();
  DeviceLinear d;
  d.out = out;
  d.in = cols.size();
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(out) * d.in, expert);
  FATHOM_CUDA_CHECK(cudaMemcpy2DAsync(codes, size_t(d.in), stage.as<uint8_t>() + cols.begin, size_t(stored_in),
                                      size_t(d.in), size_t(out), cudaMemcpyDeviceToDevice, stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `stage` is freed
  d.fp8 = codes;
  set_fp8_scales(d, f, fp8_weight_only);
  if (f.fp8.scaling == Fp8Scaling::PerChannel) d.fp8_scales = upload_f32(f.fp8.scales);
  if (f.fp8.scaling == Fp8Scaling::Block) {
    const int64_t bc = ceil_div(stored_in, kFp8BlockSize), c0 = cols.begin / kFp8BlockSize,
                  c1 = ceil_div(cols.end, kFp8BlockSize);
    std::vector<float> s;
    for (int64_t br = 0; br < ceil_div(out, kFp8BlockSize); ++br)
      s.insert(s.end(), f.fp8.scales.begin() + br * bc + c0, f.fp8.scales.begin() + br * bc + c1);
    d.fp8_scales = upload_f32(s);
  }
  return d;
}

DeviceLinear WeightBuilder::fp8_row_parts(const std::vector<RowPart>& parts, int in, int total_rows) {
  std::vector<ModuleFormat> formats;
  for (const RowPart& part : parts) formats.push_back(format_of(part.module, part.stored_rows, in));
  if (std::all_of(formats.begin(), formats.end(),
                  [](const ModuleFormat& f) { return f.weight == WeightFormat::FP8 && f.fp8.scaling == Fp8Scaling::Block; }))
    return fp8_block_row_parts(parts, formats, in, total_rows);
  for (const ModuleFormat& f : formats)
    if (f.weight != WeightFormat::FP8 || f.fp8.scaling == Fp8Scaling::Block || f.w8a8() != formats[0].w8a8() ||
        f.fp8.input_scale != formats[0].fp8.input_scale || in % 16 != 0)
      return {};
  DeviceLinear d;
  d.out = total_rows;
  d.in = in;
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(total_rows) * in, false);
  std::vector<float> row_scales;
  for (size_t i = 0; i < parts.size(); ++i) {
    const RowPart& part = parts[i];
    const Fp8Scales& s = formats[i].fp8;
    st->copy(part.module + ".weight", codes + int64_t(row_scales.size()) * in, uint64_t(part.row0) * in,
             uint64_t(part.rows) * in);
    for (int r = 0; r < part.rows; ++r)
      row_scales.push_back(s.scaling == Fp8Scaling::PerChannel ? s.scales[size_t(part.row0 + r)] : s.tensor_scale);
  }
  const int64_t filled = int64_t(row_scales.size());
  if (filled < total_rows)
    FATHOM_CUDA_CHECK(cudaMemsetAsync(codes + filled * in, 0, size_t(total_rows - filled) * in, stream));
  row_scales.resize(size_t(total_rows), 1.f);
  d.fp8 = codes;
  d.fp8_scaling = Fp8Scaling::PerChannel;
  d.fp8_scales = upload_f32(row_scales);
  d.fp8_input_scale = fp8_weight_only ? 0.f : formats[0].fp8.input_scale;
  return d;
}

// Block-scaled parts (Qwen's FP8 releases: q, k, v; [qkv | z]; the shared expert's gate and up) in
// one matrix when each starts on a 128-row block of its own tensor and of the result (every part
// but the last a whole number of blocks): the result's block-scale rows are the parts' in order.
DeviceLinear WeightBuilder::fp8_block_row_parts(const std::vector<RowPart>& parts,
                                                const std::vector<ModuleFormat>& formats, int in, int total_rows) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const Fp8Scales& f = formats[i].fp8;
    const bool last = i + 1 == parts.size();
    if (f.block[0] != kFp8BlockSize || f.block[1] != kFp8BlockSize || f.input_scale != 0.f || in % 16 != 0 ||
        parts[i].row0 % kFp8BlockSize != 0 || (!last && parts[i].rows % kFp8BlockSize != 0))
      return {};
  }
  DeviceLinear d;
  d.out = total_rows;
  d.in = in;
  uint8_t* codes = alloc_weight<uint8_t>(int64_t(total_rows) * in, false);
  const int64_t kblocks = ceil_div(in, kFp8BlockSize);
  std::vector<float> scales;
  int64_t row = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const RowPart& part = parts[i];
    st->copy(part.module + ".weight", codes + row * in, uint64_t(part.row0) * in, uint64_t(part.rows) * in);
    const std::vector<float> rows = rows_of(formats[i].fp8.scales, kblocks,
                                            {{int(part.row0 / kFp8BlockSize), int(ceil_div(part.row0 + part.rows, kFp8BlockSize))}});
    scales.insert(scales.end(), rows.begin(), rows.end());
    row += part.rows;
  }
  if (row < total_rows) FATHOM_CUDA_CHECK(cudaMemsetAsync(codes + row * in, 0, size_t(total_rows - row) * in, stream));
  scales.resize(size_t(ceil_div(total_rows, kFp8BlockSize) * kblocks), 1.f);  // blocks of zero rows
  d.fp8 = codes;
  d.fp8_scaling = Fp8Scaling::Block;
  d.fp8_scales = upload_f32(scales);
  return d;
}

// The whole quantized matrix [rows, in] of `module` as bf16 in `dequant_cache` (kept for the next
// rows of the same tensor: Qwen3-Next's reorder reads a projection a few rows at a time).
const bf16_t* WeightBuilder::dequantized(const std::string& module, int64_t rows, int in) {
  if (dequant_cache_name == module) return dequant_cache.as<bf16_t>();
  const ModuleFormat f = format_of(module, rows, in);
  DeviceLinear v;
  v.out = int(rows);
  v.in = in;
  DeviceBuffer codes, scales;
  if (f.weight == WeightFormat::NVFP4) {
    codes = DeviceBuffer(size_t(rows) * in / 2);
    scales = DeviceBuffer(size_t(rows) * in / 16);
    st->copy(module + ".weight", codes.data());
    st->copy_scales(module + ".weight_scale", scales.data());
    v.fp4 = codes.as<uint8_t>();
    v.fp4_scale = scales.as<uint8_t>();
    v.fp4_global = check_nvfp4_linear(st->checkpoint(), module, rows, in);
  } else {
    FATHOM_CHECK(f.weight == WeightFormat::FP8, "module '", module, "' is not quantized");
    check_fp8_blocks(module, f);
    codes = DeviceBuffer(size_t(rows) * in);
    st->copy(module + ".weight", codes.data());
    v.fp8 = codes.as<uint8_t>();
    set_fp8_scales(v, f, /*weight_only=*/true);
    if (!f.fp8.scales.empty()) {
      scales = DeviceBuffer(f.fp8.scales.size() * 4);
      FATHOM_CUDA_CHECK(cudaMemcpy(scales.data(), f.fp8.scales.data(), f.fp8.scales.size() * 4, cudaMemcpyHostToDevice));
      v.fp8_scales = scales.as<float>();
    }
  }
  st->fence();
  dequant_cache = DeviceBuffer(size_t(rows) * in * 2);
  if (v.is_fp4()) nvfp4_dequantize(v, dequant_cache.as<bf16_t>(), stream);
  else fp8_dequantize(v, dequant_cache.as<bf16_t>(), stream);
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the stages are freed
  dequant_cache_name = module;
  return dequant_cache.as<bf16_t>();
}

void WeightBuilder::load_quant_config(const Checkpoint& ck) {
  const auto cfg_path = ck.dir() / "config.json";
  std::error_code ec;
  quant = QuantConfig::load(ck.dir(), std::filesystem::exists(cfg_path, ec) ? read_text_file(cfg_path) : std::string());
  check_quantized_layers(ck, quant);
}

}  // namespace fathom::cuda
