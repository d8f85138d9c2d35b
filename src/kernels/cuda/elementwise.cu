// Embedding, dtype conversion, RMSNorm variants, SwiGLU, argmax and dummy-weight fills.
#include <algorithm>
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const bf16_t* table, float* out, int hidden,
                                 const int32_t* last_token) {
  pdl_prologue();
  const int t = blockIdx.x;
  int32_t id = ids[t];
  if (id < 0 && last_token) id = last_token[-1 - id];  // chosen on the device by the step before
  const bf16_t* row = table + int64_t(id) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[int64_t(t) * hidden + i] = bf(row[i]);
}

__global__ void f32_to_bf16_kernel(const float* x, bf16_t* y, int64_t n) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = to_bf(x[i]);
}

// Rows of fp32 [rows, n] as three bf16 parts [rows, 3n], v = hi + lo to 16 bits: weights as
// [hi | lo | hi], activations as [hi | hi | lo], so one bf16 product over 3n gives
// x_hi.w_hi + x_hi.w_lo + x_lo.w_hi (only x_lo.w_lo, about 2^-16 relative, is lost).
__global__ void split_bf16x3_kernel(const float* x, bf16_t* out, int rows, int n, bool weights) {
  pdl_prologue();
  const int64_t total = int64_t(rows) * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    const bf16_t hi = to_bf(x[i]);
    const bf16_t lo = to_bf(x[i] - bf(hi));
    bf16_t* o = out + r * 3 * n + c;
    o[0] = hi;
    o[n] = weights ? lo : hi;
    o[2 * n] = weights ? hi : lo;
  }
}

// The bf16 split [hi | hi | lo] of v at column i of a row of 3n (the activations of a
// split_bf16x3 product): the same bits as split_bf16x3 of v stored as fp32.
__device__ __forceinline__ void store_split3(bf16_t* row3, int64_t i, int n, float v) {
  const bf16_t hi = to_bf(v);
  row3[i] = hi;
  row3[n + i] = hi;
  row3[2 * int64_t(n) + i] = to_bf(v - bf(hi));
}

// Row norms, any n: x (plus delta when kAdd, written back) normalised into y_bf16, y_f32 and/or
// its split y3 (rows of 3n).
template <bool kAdd>
__global__ void rms_norm_kernel(float* x, const float* delta, const float* w, bf16_t* y_bf16, float* y_f32,
                                bf16_t* y3, int n, float eps, bool zc) {
  pdl_prologue();
  float* xr = x + int64_t(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i];
    if (kAdd) xr[i] = v = v + delta[int64_t(blockIdx.x) * n + i];
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i] * inv * (zc ? 1.f + w[i] : w[i]);
    if (y_bf16) y_bf16[int64_t(blockIdx.x) * n + i] = to_bf(v);
    if (y_f32) y_f32[int64_t(blockIdx.x) * n + i] = v;
    if (y3) store_split3(y3 + int64_t(blockIdx.x) * 3 * n, i, n, v);
  }
}

// Row norms with 16-byte loads, each thread's (up to kNormPer) float4s kept in registers between
// the sum of squares and the scaling: one pass over memory, and at batch 1 (one row, one block)
// a single round of loads instead of n / 256 dependent ones.
constexpr int kNormPer = 4;

// Float4 i of row t of moe_combine_pairs's output, with its bits: the pairs' rows in k order, then
// the gated shared expert. kLoads pair rows are loaded before they are summed (the same order):
// 8 covers the top-8 models' pairs in one round trip, where registers allow (a float4 a thread).
template <int kLoads>
__device__ __forceinline__ float4 combine_float4(const MoeCombineRows& c, int t, int i, int n4) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k0 = 0; k0 < c.K; k0 += kLoads) {
    float4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t p = int64_t(t) * c.K + k0 + j;
      const bool use = k0 + j < c.K && !(c.topk_ids && c.topk_ids[p] < 0);
      v[j] = use ? reinterpret_cast<const float4*>(c.pair_out)[p * n4 + i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t p = int64_t(t) * c.K + k0 + j;
      if (k0 + j < c.K && !(c.topk_ids && c.topk_ids[p] < 0))
        acc.x += v[j].x, acc.y += v[j].y, acc.z += v[j].z, acc.w += v[j].w;
    }
  }
  if (c.shared) {
    const float g = sigmoid_f(c.shared_gate[int64_t(t) * c.gate_ld]);
    const float4 v = reinterpret_cast<const float4*>(c.shared)[int64_t(t) * n4 + i];
    // Explicit multiply-adds: the same operation as moe_combine_pairs's whatever the compiler contracts.
    acc.x = __fmaf_rn(g, v.x, acc.x), acc.y = __fmaf_rn(g, v.y, acc.y);
    acc.z = __fmaf_rn(g, v.z, acc.z), acc.w = __fmaf_rn(g, v.w, acc.w);
  }
  return acc;
}

// kCombine: the added row is a MoE layer's combine (c), computed here instead of read from delta.
// kPer: the float4s a thread takes (the launch's ceil(n / 4 / threads), up to kNormPer): registers
// for no more, so that the combine's kLoads pair rows fit beside them at 1,024 threads.
template <bool kAdd, bool kCombine = false, int kPer = kNormPer>
__global__ void __launch_bounds__(1024)
    rms_norm_vec_kernel(float* x, const float* delta, const float* w, bf16_t* y, float* y_f32, bf16_t* y3, int n,
                        float eps, bool zc, MoeCombineRows c) {
  const int n4 = n / 4;
  // The norm's weights before the wait: constant in a forward, and long gone from L2 by the time
  // this layer runs, so read after the sum they would add a DRAM round trip to the chain.
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 wv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) wv[j] = w4[i];
  }
  pdl_prologue();
  float4* xr = reinterpret_cast<float4*>(x + int64_t(blockIdx.x) * n);
  const float4* dr = kAdd && !kCombine ? reinterpret_cast<const float4*>(delta + int64_t(blockIdx.x) * n) : nullptr;
  float4 v[kPer];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) {
      float4 a = xr[i];
      if (kAdd) {
        const float4 d = kCombine ? combine_float4<kPer == 1 ? 8 : 4>(c, int(blockIdx.x), i, n4) : dr[i];
        a.x += d.x, a.y += d.y, a.z += d.z, a.w += d.w;
        xr[i] = a;
      }
      v[j] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n4) {
      const float4 ww = wv[j];
      const float4 o = make_float4(v[j].x * inv * (zc ? 1.f + ww.x : ww.x), v[j].y * inv * (zc ? 1.f + ww.y : ww.y),
                                   v[j].z * inv * (zc ? 1.f + ww.z : ww.z), v[j].w * inv * (zc ? 1.f + ww.w : ww.w));
      if (y) {
        const uint2 packed = make_uint2(uint32_t(to_bf(o.x)) | (uint32_t(to_bf(o.y)) << 16),
                                        uint32_t(to_bf(o.z)) | (uint32_t(to_bf(o.w)) << 16));
        reinterpret_cast<uint2*>(y + int64_t(blockIdx.x) * n)[i] = packed;
      }
      if (y_f32) reinterpret_cast<float4*>(y_f32 + int64_t(blockIdx.x) * n)[i] = o;
      if (y3) {
        bf16_t* row3 = y3 + int64_t(blockIdx.x) * 3 * n;
        const bf16_t hx = to_bf(o.x), hy = to_bf(o.y), hz = to_bf(o.z), hw = to_bf(o.w);
        const uint2 hi = make_uint2(uint32_t(hx) | (uint32_t(hy) << 16), uint32_t(hz) | (uint32_t(hw) << 16));
        const uint2 lo = make_uint2(uint32_t(to_bf(o.x - bf(hx))) | (uint32_t(to_bf(o.y - bf(hy))) << 16),
                                    uint32_t(to_bf(o.z - bf(hz))) | (uint32_t(to_bf(o.w - bf(hw))) << 16));
        reinterpret_cast<uint2*>(row3)[i] = hi;
        reinterpret_cast<uint2*>(row3 + n)[i] = hi;
        reinterpret_cast<uint2*>(row3 + 2 * n)[i] = lo;
      }
    }
  }
}

// Threads for the vectorised norm of rows of n, or 0 when it does not apply.
int norm_threads(int n, const void* x, const void* delta, const void* w, const void* y, const void* y_f32,
                 const void* y3) {
  auto aligned = [](const void* p, int a) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (n % 4 != 0 || n == 0 || n / 4 > 1024 * kNormPer || !aligned(x, 16) || !aligned(delta, 16) || !aligned(w, 16) ||
      !aligned(y, 8) || !aligned(y_f32, 16) || !aligned(y3, 8))
    return 0;
  return std::min(1024, (n / 4 + 31) / 32 * 32);  // one float4 a thread where the row allows
}

__global__ void add_kernel(float* x, const float* d, int64_t n) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += d[i];
}

__global__ void silu_mul_kernel(const float* gate, const float* up, bf16_t* out, int64_t n) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = to_bf(silu_f(gate[i]) * up[i]);
}

__global__ void gather_rows_f32_kernel(const float* x, const int32_t* rows, float* out, int n) {
  pdl_prologue();
  const float* src = x + int64_t(rows[blockIdx.x]) * n;
  for (int c = threadIdx.x; c < n; c += blockDim.x) out[int64_t(blockIdx.x) * n + c] = src[c];
}

__global__ void silu_mul_rows_kernel(const float* gu, int64_t ld, bf16_t* out, int inter) {
  pdl_prologue();
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < inter; i += blockDim.x)
    out[r * inter + i] = to_bf(silu_f(gu[r * ld + i]) * gu[r * ld + inter + i]);
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_bf16_kernel(bf16_t* p, int64_t n, float std, uint64_t seed) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    // Sum of 4 uniforms: roughly normal, mean 0, variance 4/12.
    float u = 0;
    for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65535.f;
    p[i] = to_bf((u - 2.f) * 1.7320508f * std);
  }
}

__global__ void fill_random_f32_kernel(float* p, int64_t n, float std, uint64_t seed) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    float u = 0;
    for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65535.f;
    p[i] = (u - 2.f) * 1.7320508f * std;
  }
}

__global__ void fill_random_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t((mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull) & mask) + add);
}

__global__ void fill_f32_kernel(float* p, int64_t n, float v) {
  pdl_prologue();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}


}  // namespace

void embedding(const int32_t* ids, const bf16_t* table, float* out, int n, int hidden, cudaStream_t s,
               const int32_t* last_token) {
  if (n == 0) return;
  launch(embedding_kernel, n, 256, 0, s, ids, table, out, hidden, last_token);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void f32_to_bf16(const float* x, bf16_t* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch(f32_to_bf16_kernel, grid_for(n), 256, 0, s, x, y, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

namespace {
// rms_norm_vec_kernel with `threads` threads and the float4s a thread needs (the same bits for
// any kPer that covers the row).
template <bool kAdd, bool kCombine>
void launch_norm_vec(int rows, int threads, cudaStream_t s, float* x, const float* delta, const float* w, bf16_t* y,
                     float* y_f32, bf16_t* y3, int n, float eps, bool zc, const MoeCombineRows& c) {
  const int per = (n / 4 + threads - 1) / threads;
  if (per <= 1)
    launch(rms_norm_vec_kernel<kAdd, kCombine, 1>, rows, threads, 0, s, x, delta, w, y, y_f32, y3, n, eps, zc, c);
  else if (per == 2)
    launch(rms_norm_vec_kernel<kAdd, kCombine, 2>, rows, threads, 0, s, x, delta, w, y, y_f32, y3, n, eps, zc, c);
  else
    launch(rms_norm_vec_kernel<kAdd, kCombine, kNormPer>, rows, threads, 0, s, x, delta, w, y, y_f32, y3, n, eps, zc,
           c);
}

// The vectorised kernel where the row and pointers allow it, else the scalar one.
template <bool kAdd>
void launch_rms_norm(float* x, const float* delta, const float* w, bf16_t* y_bf16, float* y_f32, bf16_t* y3, int rows,
                     int n, float eps, bool zero_centered, cudaStream_t s) {
  if (rows == 0) return;
  if (const int threads = norm_threads(n, x, delta, w, y_bf16, y_f32, y3))
    launch_norm_vec<kAdd, false>(rows, threads, s, x, delta, w, y_bf16, y_f32, y3, n, eps, zero_centered,
                                 MoeCombineRows{});
  else
    launch(rms_norm_kernel<kAdd>, rows, 256, 0, s, x, delta, w, y_bf16, y_f32, y3, n, eps, zero_centered);
  FATHOM_CUDA_LAUNCH_CHECK();
}
}  // namespace

void rms_norm(const float* x, const float* w, bf16_t* y_bf16, float* y_f32, int rows, int n, float eps,
              bool zero_centered, cudaStream_t s) {
  // x is only read (kAdd = false); the kernels' pointer is non-const for the add variant.
  launch_rms_norm<false>(const_cast<float*>(x), nullptr, w, y_bf16, y_f32, nullptr, rows, n, eps, zero_centered, s);
}

void add_rms_norm(float* x, const float* delta, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                  bool zero_centered, cudaStream_t s, float* y_f32, bf16_t* y_split3) {
  launch_rms_norm<true>(x, delta, w, y_bf16, y_f32, y_split3, rows, n, eps, zero_centered, s);
}

bool combine_add_rms_norm(float* x, const MoeCombineRows& c, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                          bool zero_centered, cudaStream_t s) {
  if (rows == 0) return true;
  const int threads = norm_threads(n, x, c.pair_out, w, y_bf16, nullptr, nullptr);
  if (threads == 0 || c.K < 1 || !is_aligned(c.shared, 16)) return false;
  launch_norm_vec<true, true>(rows, threads, s, x, nullptr, w, y_bf16, nullptr, nullptr, n, eps, zero_centered, c);
  FATHOM_CUDA_LAUNCH_CHECK();
  return true;
}

void split_bf16x3(const float* x, bf16_t* out, int rows, int n, bool weights, cudaStream_t s) {
  if (rows == 0) return;
  launch(split_bf16x3_kernel, grid_for(int64_t(rows) * n), 256, 0, s, x, out, rows, n, weights);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch(add_kernel, grid_for(n), 256, 0, s, x, delta, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void silu_mul(const float* gate, const float* up, bf16_t* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch(silu_mul_kernel, grid_for(n), 256, 0, s, gate, up, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gather_rows_f32(const float* x, const int32_t* rows, float* out, int count, int n, cudaStream_t s) {
  if (count == 0) return;
  launch(gather_rows_f32_kernel, count, 256, 0, s, x, rows, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void silu_mul_rows(const float* gu, int64_t ld, bf16_t* out, int rows, int inter, cudaStream_t s) {
  if (rows == 0) return;
  launch(silu_mul_rows_kernel, rows, 256, 0, s, gu, ld, out, inter);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_bf16(bf16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  launch(fill_random_bf16_kernel, grid_for(n), 256, 0, s, p, n, std, seed);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add, cudaStream_t s) {
  if (n == 0) return;
  launch(fill_random_bytes_kernel, grid_for(n), 256, 0, s, p, n, seed, mask, add);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_random_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  launch(fill_random_f32_kernel, grid_for(n), 256, 0, s, p, n, std, seed);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void fill_f32(float* p, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return;
  launch(fill_f32_kernel, grid_for(n), 256, 0, s, p, n, value);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
