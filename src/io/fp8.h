// FP8 (E4M3) weights as ModelOpt and Qwen's FP8 releases store them: `.weight` F8_E4M3 [rows,
// cols]; dequantized w[r, c] = e4m3(q[r, c]) x its scale: `.weight_scale` (ModelOpt; an FP32
// scalar, or one per row) or `.weight_scale_inv` (Qwen; FP32 [ceil(rows/b0), ceil(cols/b1)], one
// per block). W8A8 checkpoints also give a static `.input_scale` (FP32 scalar): activations are
// quantized as e4m3(x * (1 / input_scale)) before the product.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/weight_format.h"
#include "io/checkpoint.h"

namespace fathom {

// An FP8 linear's scales, checked.
struct Fp8Scales {
  Fp8Scaling scaling = Fp8Scaling::PerTensor;
  std::array<int, 2> block{kFp8BlockSize, kFp8BlockSize};  // Block: rows x columns per scale
  float tensor_scale = 1.f;                                // PerTensor
  std::vector<float> scales;  // PerChannel: [rows]; Block: [ceil(rows/b0), ceil(cols/b1)]
  float input_scale = 0.f;    // > 0: W8A8 with this static activation scale

  // The scale of element (r, c).
  float at(int64_t r, int64_t c, int64_t cols) const {
    switch (scaling) {
      case Fp8Scaling::PerTensor: return tensor_scale;
      case Fp8Scaling::PerChannel: return scales[size_t(r)];
      case Fp8Scaling::Block: return scales[size_t((r / block[0]) * ((cols + block[1] - 1) / block[1]) + c / block[1])];
    }
    return tensor_scale;
  }
};

// Checks `<module>.weight` (F8_E4M3 [rows, cols]) and its scales and reads them (not the codes).
// `block`: the config's weight_block_size ({0, 0} when it gives none); `static_input`: whether an
// `.input_scale` makes the module W8A8 (false for dynamic-activation checkpoints). Throws
// fathom::Error naming the tensor: a missing scale, a scale of the wrong shape or dtype, a scale
// that is not finite and positive.
Fp8Scales read_fp8_scales(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols,
                          std::array<int, 2> block, bool static_input);

// The fp32 matrix [rows, cols] of a checked FP8 linear; a NaN code (0x7f, 0xff) is an error
// naming the tensor and the element.
std::vector<float> read_fp8_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols,
                                   const Fp8Scales& scales);

// What a W8A8 linear does to an activation before the product: e4m3(x * (1 / s)) * s
// (core/dtype.h fp8_quantize_activation).
float fp8_fake_quantize(float x, float input_scale);

}  // namespace fathom
