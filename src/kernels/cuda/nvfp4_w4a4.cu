// NVFP4 W4A4: the activation quantizer (plain CUDA, every architecture) and the dispatch of the
// W4A4 GEMM to the kernel of the current device's architecture (nvfp4_w4a4_sm120.cu,
// nvfp4_w4a4_sm100.cu).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/nvfp4_w4a4.h"

namespace fathom::cuda {
namespace {

// Nearest E2M1 code of q (ties to even, saturating at 6): the count of the rounding boundaries
// below |q|; a boundary that rounds down to the even code is passed only strictly (0.25, 1.25,
// 2.5, 5), one that rounds up to it already when reached (0.75, 1.75, 3.5). The sign bit is kept.
__device__ __forceinline__ uint32_t e2m1_code(float q) {
  const float a = fabsf(q);
  const uint32_t c = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) + uint32_t(a >= 1.75f) +
                     uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) + uint32_t(a > 5.f);
  return c | (signbit(q) ? 8u : 0u);
}

// One thread per block of 16 values (32 bytes of bf16 in, 8 bytes of codes and 1 scale out).
// Divisions are __fdiv_rn so that the result does not depend on fast-math flags: the host
// reference of the tests repeats the same fp32 operations and expects the same bits.
__global__ void nvfp4_quantize_kernel(const bf16_t* __restrict__ x, int64_t blocks, float input_global,
                                      uint8_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  pdl_prologue();
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const uint4* src = reinterpret_cast<const uint4*>(x + b * 16);
    const uint4 lo = src[0], hi = src[1];
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float v[16];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      amax = fmaxf(amax, fmaxf(fabsf(v[2 * i]), fabsf(v[2 * i + 1])));
    }
    const float sf = __fdiv_rn(__fdiv_rn(amax, 6.f), input_global);
    const uint8_t sc = uint8_t(__nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3));
    const float scale = __fmul_rn(e4m3_to_f32(sc), input_global);
    uint32_t packed[2] = {0u, 0u};
    if (scale > 0.f) {
#pragma unroll
      for (int i = 0; i < 16; ++i) packed[i / 8] |= e2m1_code(__fdiv_rn(v[i], scale)) << (4 * (i % 8));
    }
    *reinterpret_cast<uint2*>(codes + b * 8) = make_uint2(packed[0], packed[1]);
    scales[b] = sc;
  }
}

// Per device: 0 not asked yet, 1 no W4A4 kernel runs on it, 2 one does.
constexpr int kMaxDevices = 64;
std::atomic<int> g_supported[kMaxDevices] = {};

bool probe_supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (major == 12) return nvfp4_w4a4_sm120_available();
  if (major == 10) return nvfp4_w4a4_sm100_available();
  return false;
}

}  // namespace

void nvfp4_quantize_activations(const bf16_t* x, int T, int K, float input_global, uint8_t* codes, uint8_t* scales,
                                cudaStream_t s) {
  FATHOM_CHECK(K % 16 == 0, "nvfp4_quantize_activations needs K % 16 == 0, got ", K);
  FATHOM_CHECK(input_global > 0.f, "nvfp4_quantize_activations needs a positive input scale, got ", input_global);
  FATHOM_CHECK(is_aligned(x, 16) && is_aligned(codes, 8), "nvfp4_quantize_activations: x must be 16-byte and codes ",
               "8-byte aligned");
  const int64_t blocks = int64_t(T) * (K / 16);
  if (blocks <= 0) return;
  launch(nvfp4_quantize_kernel, grid_for(blocks), 256, 0, s, x, blocks, input_global, codes, scales);
  FATHOM_CUDA_LAUNCH_CHECK();
}

bool nvfp4_w4a4_supported() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 0 || dev >= kMaxDevices) return probe_supported();
  int v = g_supported[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = probe_supported() ? 2 : 1;
    g_supported[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

void nvfp4_w4a4_gemm(const uint8_t* a_codes, const uint8_t* a_scales, float a_global, const DeviceLinear& w,
                     float* y, int T, cudaStream_t s) {
  FATHOM_CHECK(w.is_fp4(), "nvfp4_w4a4_gemm needs NVFP4 weights");
  FATHOM_CHECK(w.in % 64 == 0 && w.in > 0 && w.out > 0, "nvfp4_w4a4_gemm needs in_features % 64 == 0, got ", w.in,
               " x ", w.out);
  FATHOM_CHECK(is_aligned(a_codes, 16) && is_aligned(w.fp4, 16) && is_aligned(a_scales, 4) &&
                   is_aligned(w.fp4_scale, 4),
               "nvfp4_w4a4_gemm: codes must be 16-byte and scales 4-byte aligned");
  FATHOM_CHECK(T >= 0, "nvfp4_w4a4_gemm: negative token count ", T);
  int dev = 0, major = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&dev));
  FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FATHOM_CHECK(nvfp4_w4a4_supported(), "nvfp4_w4a4_gemm: no W4A4 kernel for this GPU (compute capability ", major,
               ".x; needs sm_100a or sm_120a in the build)");
  if (T == 0) return;
  const float alpha = a_global * w.fp4_global;
  if (major == 12)
    nvfp4_w4a4_gemm_sm120(a_codes, a_scales, w.fp4, w.fp4_scale, alpha, y, T, w.out, w.in, s);
  else
    nvfp4_w4a4_gemm_sm100(a_codes, a_scales, w.fp4, w.fp4_scale, alpha, y, T, w.out, w.in, s);
}

bool w4a4_kernel_has_body(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device: not an error of the caller's
    return false;
  }
  return attr.sharedSizeBytes > 0;
}

}  // namespace fathom::cuda
