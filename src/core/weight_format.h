// How a linear module's weight is stored, as resolved per module from a checkpoint
// (io/module_format.h) and carried to the engines' weights.
#pragma once
#include <cstdint>

namespace fathom {

enum class WeightFormat : uint8_t {
  Float,  // BF16 / F16 / F32 as stored
  NVFP4,  // E2M1 codes, an E4M3 scale per 16, an FP32 tensor scale
  FP8,    // E4M3 values times a scale (Fp8Scaling)
};

// Where an FP8 weight's scales apply.
enum class Fp8Scaling : uint8_t { PerTensor, PerChannel, Block };
// Block FP8: one scale per this many rows x columns (what Qwen's FP8 releases and the GPU
// kernels use; other block sizes are refused at load).
inline constexpr int kFp8BlockSize = 128;

}  // namespace fathom
