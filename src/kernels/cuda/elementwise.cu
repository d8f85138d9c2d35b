// Embedding, dtype conversion, RMSNorm variants, SwiGLU, argmax and dummy-weight fills.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const bf16_t* table, float* out, int hidden) {
  const int t = blockIdx.x;
  const bf16_t* row = table + int64_t(ids[t]) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[int64_t(t) * hidden + i] = bf(row[i]);
}

__global__ void f32_to_bf16_kernel(const float* x, bf16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = to_bf(x[i]);
}

__global__ void rms_norm_kernel(const float* x, const float* w, bf16_t* y_bf16, float* y_f32, int n, float eps,
                                bool zc) {
  const float* xr = x + int64_t(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i] * inv * (zc ? 1.f + w[i] : w[i]);
    if (y_bf16) y_bf16[int64_t(blockIdx.x) * n + i] = to_bf(v);
    if (y_f32) y_f32[int64_t(blockIdx.x) * n + i] = v;
  }
}

__global__ void add_rms_norm_kernel(float* x, const float* delta, const float* w, bf16_t* y, float* y_f32, int n,
                                    float eps, bool zc) {
  float* xr = x + int64_t(blockIdx.x) * n;
  const float* dr = delta + int64_t(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i] + dr[i];
    xr[i] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i] * inv * (zc ? 1.f + w[i] : w[i]);
    y[int64_t(blockIdx.x) * n + i] = to_bf(v);
    if (y_f32) y_f32[int64_t(blockIdx.x) * n + i] = v;
  }
}

__global__ void add_kernel(float* x, const float* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += d[i];
}

__global__ void silu_mul_kernel(const float* gate, const float* up, bf16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = to_bf(silu_f(gate[i]) * up[i]);
}

__global__ void gather_rows_f32_kernel(const float* x, const int32_t* rows, float* out, int n) {
  const float* src = x + int64_t(rows[blockIdx.x]) * n;
  for (int c = threadIdx.x; c < n; c += blockDim.x) out[int64_t(blockIdx.x) * n + c] = src[c];
}

__global__ void silu_mul_rows_kernel(const float* gu, int64_t ld, bf16_t* out, int inter) {
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < inter; i += blockDim.x)
    out[r * inter + i] = to_bf(silu_f(gu[r * ld + i]) * gu[r * ld + inter + i]);
}

__global__ void argmax_kernel(const float* logits, int32_t* out, int n) {
  const float* row = logits + int64_t(blockIdx.x) * n;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (row[i] > best) best = row[i], idx = i;
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffff, best, o);
    const int oi = __shfl_xor_sync(0xffffffff, idx, o);
    if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sb[warp] = best, si[warp] = idx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w)
      if (sb[w] > best || (sb[w] == best && si[w] < idx)) best = sb[w], idx = si[w];
    out[blockIdx.x] = idx;
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_bf16_kernel(bf16_t* p, int64_t n, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    // Sum of 4 uniforms: roughly normal, mean 0, variance 4/12.
    float u = 0;
    for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65535.f;
    p[i] = to_bf((u - 2.f) * 1.7320508f * std);
  }
}

__global__ void fill_random_f32_kernel(float* p, int64_t n, float std, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    float u = 0;
    for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65535.f;
    p[i] = (u - 2.f) * 1.7320508f * std;
  }
}

__global__ void fill_random_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t((mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull) & mask) + add);
}

__global__ void fill_f32_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}


}  // namespace

void embedding(const int32_t* ids, const bf16_t* table, float* out, int n, int hidden, cudaStream_t s) {
  if (n == 0) return;
  embedding_kernel<<<n, 256, 0, s>>>(ids, table, out, hidden);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void f32_to_bf16(const float* x, bf16_t* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n), 256, 0, s>>>(x, y, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void rms_norm(const float* x, const float* w, bf16_t* y_bf16, float* y_f32, int rows, int n, float eps,
              bool zero_centered, cudaStream_t s) {
  if (rows == 0) return;
  rms_norm_kernel<<<rows, 256, 0, s>>>(x, w, y_bf16, y_f32, n, eps, zero_centered);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void add_rms_norm(float* x, const float* delta, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                  bool zero_centered, cudaStream_t s, float* y_f32) {
  if (rows == 0) return;
  add_rms_norm_kernel<<<rows, 256, 0, s>>>(x, delta, w, y_bf16, y_f32, n, eps, zero_centered);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), 256, 0, s>>>(x, delta, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void silu_mul(const float* gate, const float* up, bf16_t* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  silu_mul_kernel<<<grid_for(n), 256, 0, s>>>(gate, up, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gather_rows_f32(const float* x, const int32_t* rows, float* out, int count, int n, cudaStream_t s) {
  if (count == 0) return;
  gather_rows_f32_kernel<<<count, 256, 0, s>>>(x, rows, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void silu_mul_rows(const float* gu, int64_t ld, bf16_t* out, int rows, int inter, cudaStream_t s) {
  if (rows == 0) return;
  silu_mul_rows_kernel<<<rows, 256, 0, s>>>(gu, ld, out, inter);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void argmax_rows(const float* logits, int32_t* out, int rows, int n, cudaStream_t s) {
  if (rows == 0) return;
  argmax_kernel<<<rows, 1024, 0, s>>>(logits, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_bf16(bf16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_bf16_kernel<<<grid_for(n), 256, 0, s>>>(p, n, std, seed);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add, cudaStream_t s) {
  if (n == 0) return;
  fill_random_bytes_kernel<<<grid_for(n), 256, 0, s>>>(p, n, seed, mask, add);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_f32_kernel<<<grid_for(n), 256, 0, s>>>(p, n, std, seed);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_f32(float* p, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return;
  fill_f32_kernel<<<grid_for(n), 256, 0, s>>>(p, n, value);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
