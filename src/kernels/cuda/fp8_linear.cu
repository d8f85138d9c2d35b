// FP8 (E4M3) weight kernels of dense linears (ModelOpt FP8, Qwen's block-FP8 releases): the
// weight-only decode GEMV (W8A8 weights take fp8_gemv_mma.cu's tensor-core GEMV), the
// dequantization of larger steps' weights to bf16 and the quantization of W8A8 activations. The
// FP8 tensor-core product (gemm_fp8) is in gemm.cu, beside the other cuBLASLt plans.
//
// GEMV layout (as gemv.cu's): G warps per group of R output rows, G from (N, K) only; each lane
// streams 16-byte loads (16 weights) of a contiguous K range, the next step's loads issued before
// the current step's arithmetic. Activations are read through L1 (__ldg): every row reads them.
// Batch invariance: a row's sum runs in an order fixed by (N, K) (each lane's 16-weight chunks
// in K order, then the butterfly shuffle, then the G partials in order) whatever T, R or the
// loads in flight are, so a token's row has the same bits in a step of 1 or of 16 tokens.
//
// W8A8 activations are quantized as e4m3(x * (1 / input_scale)): the reciprocal formed once in
// fp32 and the product correctly rounded (__fmul_rn), rounded to nearest even and saturated at
// +-448 by the cvt's satfinite mode; the host reference (core/dtype.h fp8_quantize_activation)
// does the same.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_gemv_mma.h"
#include "kernels/cuda/fp8_gemv_tail.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kBlock = 256;               // 8 warps
constexpr int kChunk = 16;                // E4M3 weights per 16-byte load
constexpr int kWarpStep = 32 * kChunk;    // the weights a warp's lanes load at once

struct Fp8GemvArgs {
  const uint8_t* w;      // [N, K] E4M3
  const float* scales;   // PerChannel [N] or Block [ceil(N/128), ceil(K/128)]; else null
  float scale;           // PerTensor
  const bf16_t* x;       // [T, K]
  float* y;              // [T, N]
  int T, N, K, G;
  int fp8_blocks;        // the blocks of the FP8 rows; a bf16 tail's rows follow, one block each
  const bf16_t* tail_w;  // [tail_n, K] bf16 rows of the same input (or null)
  float* tail_y;         // [T, tail_n]
  int tail_n;
};

// Two E4M3 codes (the low byte first) as floats: one cvt.f16x2.e4m3x2, then exact widenings.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

__device__ __forceinline__ void decode16(const uint4& v, float* f) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 lo = e4m3x2_to_float2(words[i]), hi = e4m3x2_to_float2(words[i] >> 16);
    f[4 * i] = lo.x, f[4 * i + 1] = lo.y, f[4 * i + 2] = hi.x, f[4 * i + 3] = hi.y;
  }
}

// 16 activations (32 bytes of bf16) as floats.
__device__ __forceinline__ void load_x16(const bf16_t* p, float* f) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Rows n0..n0+R-1 at chunks k0 + u * kWarpStep (u < U); zeros past the rows or the warp's range.
template <int R, int U>
__device__ __forceinline__ void load_weights(uint4 (&dst)[U][R], const uint8_t* w, int n0, int N, int K, int k0,
                                             int ke) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int k = k0 + u * kWarpStep;
      dst[u][r] = k < ke && n0 + r < N ? load_stream(w + int64_t(n0 + r) * K + k) : make_uint4(0, 0, 0, 0);
    }
}

// One 16-weight chunk into a row's sum: BLOCK sums the chunk, then scales it into the row's sum
// (a chunk never straddles two blocks); otherwise straight into the row's sum (its scale is
// applied to the finished sum). The same operations in the same order whatever the loop nest.
template <bool BLOCK>
__device__ __forceinline__ void chunk_fma(const float* w, const float* x, float block_scale, float& acc) {
  if constexpr (BLOCK) {
    float p = 0.f;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) p = fmaf(w[e], x[e], p);
    acc = fmaf(p, block_scale, acc);
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) acc = fmaf(w[e], x[e], acc);
  }
}

// MAX_T tokens at most, R rows per warp group, U loads per row in flight (twice that with the
// next step's), BLOCK: a scale per 128 x 128 block (else per row, applied once to the finished
// sum).
template <int MAX_T, int R, int U, bool BLOCK>
__global__ void __launch_bounds__(kBlock) fp8_gemv_kernel(Fp8GemvArgs a) {
  __shared__ float part[kBlock / 32][R][MAX_T];
  if (int(blockIdx.x) >= a.fp8_blocks)
    return bf16_tail_row<kBlock / 32, MAX_T>({a.x, a.tail_w, a.tail_y, a.T, a.K, a.tail_n, a.fp8_blocks},
                                             &part[0][0][0], R * MAX_T);
  const int T = a.T, N = a.N, K = a.K, G = a.G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / G, g = warp % G;
  const int n0 = (blockIdx.x * (kBlock / 32 / G) + group) * R;
  const int span = ((K / kChunk + G - 1) / G) * kChunk;  // this warp's K range, whole chunks
  const int kb = g * span, ke = min(K, kb + span);
  const int kblocks = (K + kFp8BlockSize - 1) / kFp8BlockSize;
  float acc[R][MAX_T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) acc[r][t] = 0.f;
  int k = kb + lane * kChunk;
  // The weights are constant during a forward: the first loads go out before waiting for the
  // kernel that writes x (programmatic dependent launch).
  uint4 cur[U][R];
  load_weights<R, U>(cur, a.w, n0, N, K, k, ke);
  pdl_prologue();
  if (n0 < N) {
    for (; k < ke; k += U * kWarpStep) {
      uint4 next[U][R];
      load_weights<R, U>(next, a.w, n0, N, K, k + U * kWarpStep, ke);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k + u * kWarpStep;
        if (kk < ke) {
          float bs[R] = {};  // BLOCK: this chunk's scale per row
          if constexpr (BLOCK) {
#pragma unroll
            for (int r = 0; r < R; ++r)
              bs[r] = n0 + r < N ? __ldg(a.scales + int64_t((n0 + r) / kFp8BlockSize) * kblocks + kk / kFp8BlockSize)
                                 : 0.f;
          }
          // The R rows decoded once, each token's chunk loaded as it is used.
          float wf[R][kChunk];
#pragma unroll
          for (int r = 0; r < R; ++r) decode16(cur[u][r], wf[r]);
#pragma unroll
          for (int t = 0; t < MAX_T; ++t) {
            if (t < T) {
              float xf[kChunk];
              load_x16(a.x + int64_t(t) * K + kk, xf);
#pragma unroll
              for (int r = 0; r < R; ++r) chunk_fma<BLOCK>(wf[r], xf, bs[r], acc[r][t]);
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) cur[u][r] = next[u][r];
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) acc[r][t] = warp_sum(acc[r][t]);
  // What multiplies a row's finished sum: the per-row or per-tensor weight scale (BLOCK: applied
  // per chunk already).
  float mult[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    mult[r] = BLOCK ? 1.f : (a.scales != nullptr && n0 + r < N ? __ldg(a.scales + n0 + r) : a.scale);
  if (G == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < MAX_T; ++t)
          if (t < T && n0 + r < N) a.y[int64_t(t) * N + n0 + r] = acc[r][t] * mult[r];
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t) part[warp][r][t] = acc[r][t];
  __syncthreads();
  if (g == 0 && lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t)
        if (t < T && n0 + r < N) {
          float sum = 0.f;
          for (int i = 0; i < G; ++i) sum += part[group * G + i][r][t];
          a.y[int64_t(t) * N + n0 + r] = sum * mult[r];
        }
}

template <int MAX_T, int R, int U>
void launch_rows(Fp8GemvArgs a, bool block, cudaStream_t s) {
  const int rows_per_block = kBlock / 32 / a.G * R;
  a.fp8_blocks = (a.N + rows_per_block - 1) / rows_per_block;
  const int grid = a.fp8_blocks + a.tail_n;
  if (block) launch(fp8_gemv_kernel<MAX_T, R, U, true>, grid, kBlock, 0, s, a);
  else launch(fp8_gemv_kernel<MAX_T, R, U, false>, grid, kBlock, 0, s, a);
}

// The rows per group grow with T so one activation load serves several rows (one row with two
// loads in flight at T = 1, as gemv.cu).
void launch_gemv(const Fp8GemvArgs& a, bool block, cudaStream_t s) {
  static_assert(kFp8GemvMaxTokens <= 16);
  if (a.T <= 1) launch_rows<1, 1, 2>(a, block, s);
  else if (a.T <= 2) launch_rows<2, 2, 1>(a, block, s);
  else if (a.T <= 4) launch_rows<4, 4, 1>(a, block, s);
  else if (a.T <= 8) launch_rows<8, 4, 1>(a, block, s);
  else launch_rows<16, 4, 1>(a, block, s);
}

// The scale of weight (n, k): per tensor, per row or per 128 x 128 block.
__device__ __forceinline__ float weight_scale(Fp8Scaling mode, float scale, const float* scales, int64_t n, int64_t k,
                                              int kblocks) {
  switch (mode) {
    case Fp8Scaling::PerChannel: return scales[n];
    case Fp8Scaling::Block: return scales[(n / kFp8BlockSize) * kblocks + k / kFp8BlockSize];
    default: return scale;
  }
}

// VEC: 16 weights (one 16-byte load, two 16-byte stores) per step, rows of a multiple of 16.
template <bool VEC>
__global__ void fp8_dequantize_kernel(const uint8_t* __restrict__ w, Fp8Scaling mode, float scale,
                                      const float* __restrict__ scales, bf16_t* __restrict__ out, int N, int K) {
  pdl_prologue();
  const int kblocks = (K + kFp8BlockSize - 1) / kFp8BlockSize;
  constexpr int kPer = VEC ? kChunk : 1;
  const int64_t steps = int64_t(N) * K / kPer;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < steps; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e0 = i * kPer, n = e0 / K, k = e0 % K;
    const float sc = weight_scale(mode, scale, scales, n, k, kblocks);  // one per 16 (VEC: k % 16 == 0)
    if constexpr (VEC) {
      float f[kChunk];
      decode16(load_stream(w + e0), f);
      uint32_t packed[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) packed[j] = uint32_t(to_bf(f[2 * j] * sc)) | (uint32_t(to_bf(f[2 * j + 1] * sc)) << 16);
      uint4* o = reinterpret_cast<uint4*>(out + e0);
      o[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      o[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    } else {
      out[e0] = to_bf(e4m3_to_f32(w[e0]) * sc);
    }
  }
}

__device__ __forceinline__ uint8_t quantize1(bf16_t x, float inv) {
  return __nv_cvt_float_to_fp8(__fmul_rn(bf(x), inv), __NV_SATFINITE, __NV_E4M3);
}

// VEC: 8 activations (16 bytes in, 8 out) per step over the first n / 8 * 8; the rest one by one.
template <bool VEC>
__global__ void fp8_quantize_kernel(const bf16_t* __restrict__ x, float inv, uint8_t* __restrict__ q, int64_t n) {
  pdl_prologue();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t done = 0;
  if constexpr (VEC) {
    done = n / 8 * 8;
    for (int64_t i = first; i < n / 8; i += stride) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(x) + i);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      uint32_t out[2] = {0, 0};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = make_float2(__fmul_rn(__uint_as_float(words[j] << 16), inv),
                                     __fmul_rn(__uint_as_float(words[j] & 0xffff0000u), inv));
        out[j / 2] |= uint32_t(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3)) << (16 * (j % 2));
      }
      reinterpret_cast<uint2*>(q)[i] = make_uint2(out[0], out[1]);
    }
  }
  for (int64_t i = done + first; i < n; i += stride) q[i] = quantize1(x[i], inv);
}

__global__ void fp8_scale_columns_kernel(float* __restrict__ y, const float* __restrict__ scales, float scale,
                                         int64_t n, int N) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] *= scales != nullptr ? __ldg(scales + i % N) : scale;
}

}  // namespace

void fp8_scale_columns(float* y, const float* scales, float scale, int T, int N, cudaStream_t s) {
  const int64_t n = int64_t(T) * N;
  if (n <= 0) return;
  const int grid = int(std::min<int64_t>((n + 255) / 256, 65535));
  launch(fp8_scale_columns_kernel, grid, 256, 0, s, y, scales, scale, n, N);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fp8_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s, const DeviceLinear* tail,
              float* tail_y) {
  FATHOM_CHECK(w.is_fp8(), "fp8_gemv needs FP8 weights");
  FATHOM_CHECK(T >= 1 && T <= kFp8GemvMaxTokens, "fp8_gemv handles 1..", kFp8GemvMaxTokens, " tokens, got ", T);
  FATHOM_CHECK(w.in > 0 && w.in % kChunk == 0 && w.out > 0, "fp8_gemv needs in_features % 16 == 0, got [", w.out,
               ", ", w.in, "]");
  FATHOM_CHECK(is_aligned(w.fp8, 16) && is_aligned(x, 16), "fp8_gemv: weights and x must be 16-byte aligned");
  FATHOM_CHECK(w.fp8_scaling == Fp8Scaling::PerTensor || w.fp8_scales != nullptr,
               "fp8_gemv: per-channel and block FP8 weights need their scales");
  if (w.is_w8a8()) {
    static const bool mma = fp8_gemv_w8a8_supported();
    FATHOM_CHECK(mma, "W8A8 FP8 linears need E4M3 tensor cores (SM89 or later)");
    fp8_gemv_w8a8(w, x, y, T, s, tail, tail_y);
    return;
  }
  Fp8GemvArgs a{};
  a.w = w.fp8;
  a.scales = w.fp8_scaling == Fp8Scaling::PerTensor ? nullptr : w.fp8_scales;
  a.scale = w.fp8_scale;
  a.x = x, a.y = y, a.T = T, a.N = w.out, a.K = w.in;
  if (tail != nullptr) {
    FATHOM_CHECK(tail->bf16 != nullptr && tail->in == w.in && tail->out > 0 && tail_y != nullptr &&
                     is_aligned(tail->bf16, 16),
                 "fp8_gemv: the tail must be aligned bf16 rows of the same input (", w.in, " columns)");
    a.tail_w = tail->bf16, a.tail_y = tail_y, a.tail_n = tail->out;
  }
  // Warps per row group, from N and K only (so a row's sum never depends on T): enough warps to
  // cover the GPU, while each lane keeps two or more 16-byte loads of its range.
  int G = 1;
  while (G < 8 && int64_t(w.out) * G < 8192 && w.in / (2 * G) >= 2 * kWarpStep) G *= 2;
  a.G = G;
  const bool block = w.fp8_scaling == Fp8Scaling::Block;
  launch_gemv(a, block, s);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fp8_dequantize(const DeviceLinear& w, bf16_t* out, cudaStream_t s, bool with_scales) {
  FATHOM_CHECK(w.is_fp8(), "fp8_dequantize needs FP8 weights");
  FATHOM_CHECK(w.fp8_scaling == Fp8Scaling::PerTensor || w.fp8_scales != nullptr,
               "fp8_dequantize: per-channel and block FP8 weights need their scales");
  const int64_t total = int64_t(w.out) * w.in;
  if (total == 0) return;
  const bool vec = w.in % kChunk == 0 && is_aligned(w.fp8, 16) && is_aligned(out, 16);
  const int64_t steps = vec ? total / kChunk : total;
  const int grid = int(std::min<int64_t>((steps + 255) / 256, 65535));
  const Fp8Scaling mode = with_scales ? w.fp8_scaling : Fp8Scaling::PerTensor;
  const float scale = with_scales ? w.fp8_scale : 1.f;
  if (vec) launch(fp8_dequantize_kernel<true>, grid, 256, 0, s, w.fp8, mode, scale, w.fp8_scales, out, w.out, w.in);
  else launch(fp8_dequantize_kernel<false>, grid, 256, 0, s, w.fp8, mode, scale, w.fp8_scales, out, w.out, w.in);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fp8_quantize(const bf16_t* x, float scale, uint8_t* q, int64_t n, cudaStream_t s) {
  FATHOM_CHECK(scale > 0.f, "fp8_quantize needs a positive scale, got ", scale);
  if (n <= 0) return;
  const bool vec = is_aligned(x, 16) && is_aligned(q, 8);
  const int grid = int(std::min<int64_t>(((vec ? n / 8 : n) + 255) / 256 + 1, 65535));
  const float inv = 1.f / scale;  // fp32, as the host's fp8_quantize_activation forms it
  if (vec) launch(fp8_quantize_kernel<true>, grid, 256, 0, s, x, inv, q, n);
  else launch(fp8_quantize_kernel<false>, grid, 256, 0, s, x, inv, q, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
