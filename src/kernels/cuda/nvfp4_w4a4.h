// NVFP4 W4A4 products for GPUs with FP4 tensor cores (Blackwell: SM100 B200, SM120 RTX PRO 6000 /
// RTX 50xx): the activations are quantized to NVFP4 the way ModelOpt / TensorRT-LLM quantize them
// with the checkpoint's `input_scale`, and both operands go to the block-scaled FP4 MMA as they
// are (no decode in registers, unlike the W4A16 kernels of nvfp4.cu / moe_fp4.cu on Hopper).
// All pointers are device pointers; every call is asynchronous on `s`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace fathom::cuda {

// x [T, K] bf16 to NVFP4 in the weights' layout: codes [T, K/2] (element 2i in the low nibble),
// E4M3 block scales [T, K/16]; value = e2m1 * e4m3 * input_global. Per block of 16 values: scale =
// e4m3_rn_satfinite(amax / 6 / input_global) (fp32 divisions, correctly rounded), then each value
// x / (e4m3(scale) * input_global) to the nearest E2M1 (ties to even, saturating at 6; the sign
// is kept, so a negative value that rounds to zero is code 8). A block whose scale rounds to zero
// is all codes 0. K % 16 == 0, x 16-byte aligned, input_global > 0. Plain CUDA: any SM90+ GPU.
void nvfp4_quantize_activations(const bf16_t* x, int T, int K, float input_global, uint8_t* codes, uint8_t* scales,
                                cudaStream_t s);

// True when the current device is SM100 (tcgen05) or SM120 (mma.sync block_scale) and this
// binary holds the W4A4 kernel for it (built for sm_100a / sm_120a).
bool nvfp4_w4a4_supported();

// y[T, N] = dequant(A)[T, K] * dequant(W)^T in fp32, N = w.out, K = w.in. A: codes [T, K/2] and
// scales [T, K/16] of nvfp4_quantize_activations, a_global its input_global. W: an NVFP4
// DeviceLinear. The products of E2M1 codes and E4M3 scales are exact; the sum is fp32 (tensor
// cores), times a_global * w.fp4_global at the end. K % 64 == 0; codes 16-byte and scales 4-byte
// aligned. Throws fathom::Error when !nvfp4_w4a4_supported() or the shape does not fit.
void nvfp4_w4a4_gemm(const uint8_t* a_codes, const uint8_t* a_scales, float a_global, const DeviceLinear& w,
                     float* y, int T, cudaStream_t s);

// The per-architecture implementations behind nvfp4_w4a4_gemm (nvfp4_w4a4_sm120.cu,
// nvfp4_w4a4_sm100.cu); arguments already checked. *_available: the kernel's body was compiled
// for the current device (an arch-specific target of its family is in the binary).
// Whether `kernel`'s image for the current device is its real body: the bodies are compiled only
// for their arch-specific targets (a trap elsewhere), and only the real ones declare shared memory.
bool w4a4_kernel_has_body(const void* kernel);
bool nvfp4_w4a4_sm120_available();
void nvfp4_w4a4_gemm_sm120(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                           const uint8_t* b_scales, float alpha, float* y, int T, int N, int K, cudaStream_t s);
bool nvfp4_w4a4_sm100_available();
void nvfp4_w4a4_gemm_sm100(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                           const uint8_t* b_scales, float alpha, float* y, int T, int N, int K, cudaStream_t s);

}  // namespace fathom::cuda
