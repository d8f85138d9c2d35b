// The W8A8 FP8 GEMV on tensor cores (fp8_gemv_mma.cu): what fp8_gemv runs for weights with a
// static input scale.
#pragma once
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

// Whether this GPU has E4M3 mma.sync (SM89 and later).
bool fp8_gemv_w8a8_supported();
// y[T, out] = (e4m3(x * (1 / input_scale)) * input_scale) W^T, T <= kFp8GemvMaxTokens, in % 16 == 0;
// with a `tail` (bf16 rows of the same input) also tail_y[T, tail.out] = x tail^T, in the same
// launch.
void fp8_gemv_w8a8(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s,
                   const DeviceLinear* tail = nullptr, float* tail_y = nullptr);

}  // namespace fathom::cuda
