// NVFP4 weight-only kernels for GPUs without FP4 tensor cores (Hopper): the E2M1 codes and
// E4M3 block scales are decoded in registers. Decode-sized batches (T <= 16) use a GEMV-style
// kernel (one warp per output row, 16-byte weight loads); larger batches dequantize to bf16.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

__constant__ float kE2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// Each lane takes CB packed bytes at a time (2*CB values, CB/8 scale blocks): 16-byte loads when
// in_features is a multiple of 32, 8-byte ones when it is only a multiple of 16 (rows of K/2
// bytes are then only 8-byte aligned).
template <int MAX_T, int CB>
__global__ void nvfp4_gemv_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                  float global, const bf16_t* __restrict__ x, float* __restrict__ y, int T, int N,
                                  int K) {
  static_assert(CB == 16 || CB == 8, "16- or 8-byte chunks");
  constexpr int kWords = CB / 4, kVals = 2 * CB;
  pdl_prologue();
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = kE2M1[threadIdx.x];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;
  if (n >= N) return;
  const uint8_t* row = packed + int64_t(n) * (K / 2);
  const uint8_t* srow = scales + int64_t(n) * (K / 16);
  float acc[MAX_T];
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) acc[t] = 0.f;
  for (int byte0 = lane * CB; byte0 < K / 2; byte0 += 32 * CB) {
    uint32_t words[kWords];
    if constexpr (CB == 16) {
      const uint4 wv = *reinterpret_cast<const uint4*>(row + byte0);
      words[0] = wv.x, words[1] = wv.y, words[2] = wv.z, words[3] = wv.w;
    } else {
      const uint2 wv = *reinterpret_cast<const uint2*>(row + byte0);
      words[0] = wv.x, words[1] = wv.y;
    }
    const int k0 = byte0 * 2;
    float w[kVals];
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const float sc = e4m3_to_f32(srow[k0 / 16 + i / 2]) * global;  // two words (16 values) a scale block
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b = (words[i] >> (8 * j)) & 0xff;
        w[i * 8 + j * 2] = lut[b & 0xf] * sc;
        w[i * 8 + j * 2 + 1] = lut[b >> 4] * sc;
      }
    }
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) {
      if (t < T) {
        const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t(t) * K + k0);
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < kVals / 8; ++q) {
          const uint4 xv = xp[q];
          const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sum += w[q * 8 + e * 2] * __uint_as_float(xw[e] << 16);
            sum += w[q * 8 + e * 2 + 1] * __uint_as_float(xw[e] & 0xffff0000u);
          }
        }
        acc[t] += sum;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) {
    if (t < T) {
      float v = acc[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
      if (lane == 0) y[int64_t(t) * N + n] = v;
    }
  }
}

__global__ void nvfp4_dequantize_kernel(const uint8_t* packed, const uint8_t* scales, float global, bf16_t* out,
                                        int64_t N, int K) {
  pdl_prologue();
  const int64_t total = N * (K / 2);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / (K / 2);
    const int k = int(i % (K / 2)) * 2;
    const float sc = e4m3_to_f32(scales[n * (K / 16) + k / 16]) * global;
    const uint8_t b = packed[i];
    __nv_bfloat16 lo = __float2bfloat16_rn(kE2M1[b & 0xf] * sc), hi = __float2bfloat16_rn(kE2M1[b >> 4] * sc);
    out[n * K + k] = *reinterpret_cast<bf16_t*>(&lo);
    out[n * K + k + 1] = *reinterpret_cast<bf16_t*>(&hi);
  }
}

}  // namespace

template <int CB>
void launch_nvfp4_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s) {
  constexpr int kWarps = 4;
  const int grid = (w.out + kWarps - 1) / kWarps;
  if (T <= 1)
    launch(nvfp4_gemv_kernel<1, CB>, grid, kWarps * 32, 0, s, w.fp4, w.fp4_scale, w.fp4_global, x, y, T, w.out, w.in);
  else if (T <= 4)
    launch(nvfp4_gemv_kernel<4, CB>, grid, kWarps * 32, 0, s, w.fp4, w.fp4_scale, w.fp4_global, x, y, T, w.out, w.in);
  else
    launch(nvfp4_gemv_kernel<16, CB>, grid, kWarps * 32, 0, s, w.fp4, w.fp4_scale, w.fp4_global, x, y, T, w.out, w.in);
}

void nvfp4_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s) {
  FATHOM_CHECK(T >= 1 && T <= 16, "nvfp4_gemv handles 1..16 tokens, got ", T);
  FATHOM_CHECK(w.in % 16 == 0 && w.in > 0, "nvfp4_gemv needs in_features % 16 == 0, got ", w.in);
  FATHOM_CHECK(is_aligned(w.fp4, 16) && is_aligned(x, 16), "nvfp4_gemv: weights and x must be 16-byte aligned");
  if (w.in % 32 == 0) launch_nvfp4_gemv<16>(w, x, y, T, s);
  else launch_nvfp4_gemv<8>(w, x, y, T, s);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void nvfp4_dequantize(const DeviceLinear& w, bf16_t* out, cudaStream_t s) {
  const int64_t total = int64_t(w.out) * (w.in / 2);
  const int grid = int(std::min<int64_t>((total + 255) / 256, 65535));
  launch(nvfp4_dequantize_kernel, grid, 256, 0, s, w.fp4, w.fp4_scale, w.fp4_global, out, w.out, w.in);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
