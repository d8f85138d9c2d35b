#include "io/fp8.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace fathom {
namespace {

// An FP32 (or BF16) scale tensor's values, each finite and positive.
std::vector<float> positive_scales(const Checkpoint& ckpt, const std::string& name) {
  const TensorInfo& t = ckpt.info(name);
  if (t.dtype != DType::F32 && t.dtype != DType::BF16)
    fail("tensor '", name, "' in ", ckpt.file_of(name), ": expected dtype F32, found ", dtype_name(t.dtype));
  std::vector<float> v = ckpt.read_f32(name, t.shape);
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] <= 0.f)
      fail("tensor '", name, "' in ", ckpt.file_of(name), ": scale ", i, " is ", v[i],
           ", not a finite positive number");
  return v;
}

bool is_scalar(const TensorInfo& t) { return t.numel() == 1 && t.shape.size() <= 2; }

[[noreturn]] void wrong_shape(const Checkpoint& ckpt, const std::string& name, const std::string& expected) {
  fail("tensor '", name, "' in ", ckpt.file_of(name), ": expected shape ", expected, ", found ",
       shape_str(ckpt.info(name).shape));
}

}  // namespace

Fp8Scales read_fp8_scales(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols,
                          std::array<int, 2> block, bool static_input) {
  const std::string wname = module + ".weight", inv = module + ".weight_scale_inv", sc = module + ".weight_scale";
  ckpt.expect(wname, DType::F8_E4M3, {rows, cols});
  Fp8Scales s;
  if (ckpt.has(inv)) {
    s.scaling = Fp8Scaling::Block;
    if (block[0] > 0) s.block = block;
    const int64_t br = (rows + s.block[0] - 1) / s.block[0], bc = (cols + s.block[1] - 1) / s.block[1];
    if (ckpt.info(inv).shape != std::vector<int64_t>{br, bc})
      wrong_shape(ckpt, inv, shape_str({br, bc}) + " (one scale per " + std::to_string(s.block[0]) + "x" +
                                 std::to_string(s.block[1]) + " block of [" + std::to_string(rows) + ", " +
                                 std::to_string(cols) + "])");
    s.scales = positive_scales(ckpt, inv);
  } else if (ckpt.has(sc)) {
    const TensorInfo& t = ckpt.info(sc);
    if (is_scalar(t)) {
      s.scaling = Fp8Scaling::PerTensor;
      s.tensor_scale = positive_scales(ckpt, sc)[0];
    } else if (t.shape == std::vector<int64_t>{rows} || t.shape == std::vector<int64_t>{rows, 1}) {
      s.scaling = Fp8Scaling::PerChannel;
      s.scales = positive_scales(ckpt, sc);
    } else {
      wrong_shape(ckpt, sc, "[] (per tensor) or [" + std::to_string(rows) + "] (per output row)");
    }
  } else {
    fail("tensor '", wname, "' in ", ckpt.file_of(wname), " is FP8 (F8_E4M3) but its scale ('", sc, "' or '", inv,
         "') is missing");
  }
  const std::string in = module + ".input_scale";
  if (static_input && ckpt.has(in)) {
    if (!is_scalar(ckpt.info(in))) wrong_shape(ckpt, in, "[] (a static per-tensor activation scale)");
    s.input_scale = positive_scales(ckpt, in)[0];
    // The GPU's W8A8 product applies one scale to the whole weight (FP8 tensor cores): other
    // scalings run weight-only.
    if (s.scaling != Fp8Scaling::PerTensor) s.input_scale = 0.f;
  }
  return s;
}

std::vector<float> read_fp8_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols,
                                   const Fp8Scales& scales) {
  const std::string wname = module + ".weight";
  const auto bytes = ckpt.bytes(wname);
  const auto* q = reinterpret_cast<const uint8_t*>(bytes.data());
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t b = q[r * cols + c];
      if ((b & 0x7f) == 0x7f)
        fail("tensor '", wname, "' in ", ckpt.file_of(wname), ": element [", r, ", ", c, "] is an E4M3 NaN code");
      out[size_t(r * cols + c)] = fp8_e4m3_to_f32(b) * scales.at(r, c, cols);
    }
  return out;
}

float fp8_fake_quantize(float x, float input_scale) {
  return fp8_e4m3_to_f32(fp8_quantize_activation(x, input_scale)) * input_scale;
}

}  // namespace fathom
