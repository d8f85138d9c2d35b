// The skinny GEMM (gemm_skinny.cu): bf16 products of a few dozen tokens on tensor cores, the
// weights read once, one launch: candidate "skinny" of op gemm.bf16.batch, which gemm_bf16 takes
// past the GEMV's sizes where the kernel plan says so (the tuner's choice; the fixed rule is
// cuBLASLt, faster at 64 tokens on the H100: docs/perf.md, stop 70).
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/ops.h"

namespace fathom::cuda {

// kSkinnyMaxTokens (kernel_plan.h): 8 n8 tiles of accumulators a warp.
inline constexpr int kSkinnyMaxRows = 16384;   // wider products (lm_head) keep cuBLASLt: see gemm_skinny.cu

// y[T, N] = x[T, K] W^T, bf16 x and W, fp32 y. Rows bit-identical at every T (an order fixed by
// N and K). False (nothing launched) past kSkinnyMaxTokens or kSkinnyMaxRows, K not a multiple
// of 16 or past 8,192, x or W not 16-byte aligned, or a stage past the device's shared memory.
bool gemm_skinny(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s);

// The same product on wgmma (gemm_skinny_wgmma.cu: candidate "skinny-wgmma"), the same limits, and false
// where wgmma_available() is not (other GPUs, a binary without sm_90a code).
bool gemm_skinny_wgmma(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s);

}  // namespace fathom::cuda
