// NVFP4 (ModelOpt) weight decoding: W[n,k] = e2m1(q[n,k]) * e4m3(scale[n,k/16]) * scale_2.
// Two E2M1 codes per byte along K, element 2i in the low nibble.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint.h"

namespace fathom {

// Dequantizes rows x cols weights. packed: rows*cols/2 bytes; scales: rows*cols/16 E4M3 bytes.
void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale, int64_t rows,
                      int64_t cols, float* out);

// Checks NVFP4 block scales (E4M3, bytes `first_index`.. of tensor `tensor`): none may be a NaN
// code (0x7F, 0xFF) or negative, which would silently poison or flip a block of weights.
// Throws fathom::Error naming the tensor and the scale's index.
void check_nvfp4_scales(std::string_view tensor, const uint8_t* scales, size_t n, uint64_t first_index = 0);

// Checks an NVFP4 linear's tensors without reading its codes: `.weight` U8 [rows, cols/2],
// `.weight_scale` F8_E4M3 [rows, cols/16], `.weight_scale_2` an F32 scalar, finite and positive.
// Returns the global scale. Throws fathom::Error naming the tensor.
float check_nvfp4_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols);

// Reads `<module>.weight` (U8 [rows, cols/2]), `.weight_scale` (F8_E4M3 [rows, cols/16]) and
// `.weight_scale_2` (F32 scalar) from the checkpoint, checking dtypes and shapes, and returns
// the fp32 matrix [rows, cols].
std::vector<float> read_nvfp4_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows,
                                     int64_t cols);

}  // namespace fathom
