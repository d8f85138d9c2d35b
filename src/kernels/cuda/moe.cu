// Mixture of experts: softmax + top-k routing, and the decode path that runs each selected
// (token, expert) pair directly off the expert weights (bf16 or NVFP4) with SwiGLU fused.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kMaxExpertsPerLane = 32;  // E <= 1024

// One warp per token.
__global__ void moe_topk_kernel(const float* logits, int32_t* ids, float* weights, int T, int E, int K,
                                bool renorm) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= T) return;
  const float* row = logits + int64_t(t) * E;
  float p[kMaxExpertsPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? row[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    p[i] = (lane + 32 * i) < E ? expf(p[i] - mx) : -1.f;
    sum += p[i] > 0.f ? p[i] : 0.f;
  }
  sum = warp_sum(sum);
  float picked_sum = 0.f;
  for (int k = 0; k < K; ++k) {
    float best = -1.f;
    int best_e = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i)
      if (p[i] > best) best = p[i], best_e = lane + 32 * i;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffff, best, o);
      const int oe = __shfl_xor_sync(0xffffffff, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if ((best_e % 32) == lane) {
#pragma unroll
      for (int i = 0; i < kMaxExpertsPerLane; ++i)
        if (lane + 32 * i == best_e) p[i] = -1.f;
    }
    const float prob = best / sum;
    picked_sum += prob;
    if (lane == 0) {
      ids[int64_t(t) * K + k] = best_e;
      weights[int64_t(t) * K + k] = prob;
    }
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[int64_t(t) * K + k] /= picked_sum;
}

__constant__ float kE2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// Dot product of one weight row with a bf16 vector, by a whole warp; the result is in every lane.
// `lut` is the E2M1 table in shared memory (constant memory would serialise divergent lookups).
__device__ float warp_row_dot(const DeviceLinear& L, int row, const bf16_t* x, const float* lut) {
  float sum = 0.f;
  const int lane = threadIdx.x % 32;
  if (L.fp4) {
    const uint8_t* w = L.fp4 + int64_t(row) * (L.in / 2);
    const uint8_t* sc = L.fp4_scale + int64_t(row) * (L.in / 16);
    for (int byte0 = lane * 16; byte0 < L.in / 2; byte0 += 32 * 16) {
      const uint4 wv = *reinterpret_cast<const uint4*>(w + byte0);
      const int k0 = byte0 * 2;
      const float s0 = e4m3_to_f32(sc[k0 / 16]) * L.fp4_global, s1 = e4m3_to_f32(sc[k0 / 16 + 1]) * L.fp4_global;
      const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
      const uint4* xp = reinterpret_cast<const uint4*>(x + k0);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 xv = xp[q];
        const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
        const float s = q < 2 ? s0 : s1;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t b = (words[q] >> (8 * e)) & 0xff;
          sum += lut[b & 0xf] * s * __uint_as_float(xw[e] << 16);
          sum += lut[b >> 4] * s * __uint_as_float(xw[e] & 0xffff0000u);
        }
      }
    }
  } else {
    const bf16_t* w = L.bf16 + int64_t(row) * L.in;
    for (int k0 = lane * 8; k0 < L.in; k0 += 32 * 8) {
      const uint4 wv = *reinterpret_cast<const uint4*>(w + k0);
      const uint4 xv = *reinterpret_cast<const uint4*>(x + k0);
      const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w}, xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sum += __uint_as_float(ww[e] << 16) * __uint_as_float(xw[e] << 16);
        sum += __uint_as_float(ww[e] & 0xffff0000u) * __uint_as_float(xw[e] & 0xffff0000u);
      }
    }
  }
  return warp_sum(sum);
}

constexpr int kWarps = 4;

__device__ __forceinline__ void load_lut(float* lut) {
  if (threadIdx.x < 16) lut[threadIdx.x] = kE2M1[threadIdx.x];
  __syncthreads();
}

__global__ void expert_gate_up_kernel(DeviceExperts ex, const bf16_t* x, const int32_t* ids, bf16_t* h, int K) {
  __shared__ float lut[16];
  load_lut(lut);
  const int p = blockIdx.y, t = p / K;
  const int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= ex.inter) return;
  const int e = ids[p];
  const bf16_t* xt = x + int64_t(t) * ex.hidden;
  const float g = warp_row_dot(ex.gate[e], r, xt, lut);
  const float u = warp_row_dot(ex.up[e], r, xt, lut);
  if (threadIdx.x % 32 == 0) h[int64_t(p) * ex.inter + r] = to_bf(silu_f(g) * u);
}

__global__ void expert_down_kernel(DeviceExperts ex, const bf16_t* h, const int32_t* ids, const float* w,
                                   float* pair_out) {
  __shared__ float lut[16];
  load_lut(lut);
  const int p = blockIdx.y;
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  if (n >= ex.hidden) return;
  const float v = warp_row_dot(ex.down[ids[p]], n, h + int64_t(p) * ex.inter, lut);
  if (threadIdx.x % 32 == 0) pair_out[int64_t(p) * ex.hidden + n] = v * w[p];
}

__global__ void combine_pairs_kernel(const float* pair_out, float* y, int T, int K, int hidden) {
  const int64_t total = int64_t(T) * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, n = i % hidden;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += pair_out[(t * K + k) * hidden + n];
    y[i] += acc;
  }
}

__global__ void add_sigmoid_gated_kernel(float* y, const float* shared, const float* g, int T, int hidden) {
  const int64_t total = int64_t(T) * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += sigmoid_f(g[i / hidden]) * shared[i];
}

__global__ void gather_rows_kernel(const bf16_t* x, const int32_t* rows, bf16_t* out, int n) {
  const int i = blockIdx.x;
  const bf16_t* src = x + int64_t(rows[i]) * n;
  for (int c = threadIdx.x; c < n; c += blockDim.x) out[int64_t(i) * n + c] = src[c];
}

__global__ void scatter_add_kernel(float* y, const float* src, const int32_t* rows, const float* w, int n) {
  const int i = blockIdx.x;
  float* dst = y + int64_t(rows[i]) * n;
  const float wi = w[i];
  for (int c = threadIdx.x; c < n; c += blockDim.x) dst[c] += wi * src[int64_t(i) * n + c];
}

}  // namespace

void moe_topk(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
              cudaStream_t s) {
  if (T == 0) return;
  FATHOM_CHECK(E <= 32 * kMaxExpertsPerLane && K <= E, "moe_topk: ", E, " experts / top-", K, " unsupported");
  moe_topk_kernel<<<(T + 3) / 4, 128, 0, s>>>(logits, topk_ids, topk_w, T, E, K, renorm);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void moe_experts_decode(const DeviceExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                        bf16_t* h, float* pair_out, float* y, int T, int K, cudaStream_t s) {
  if (T == 0) return;
  const int P = T * K;
  expert_gate_up_kernel<<<dim3((ex.inter + kWarps - 1) / kWarps, P), kWarps * 32, 0, s>>>(ex, x, topk_ids, h, K);
  FATHOM_CUDA_LAUNCH_CHECK();
  expert_down_kernel<<<dim3((ex.hidden + kWarps - 1) / kWarps, P), kWarps * 32, 0, s>>>(ex, h, topk_ids, topk_w,
                                                                                         pair_out);
  FATHOM_CUDA_LAUNCH_CHECK();
  combine_pairs_kernel<<<grid_for(int64_t(T) * ex.hidden), 256, 0, s>>>(pair_out, y, T, K, ex.hidden);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void add_sigmoid_gated(float* y, const float* shared, const float* gate_logit, int T, int hidden, cudaStream_t s) {
  if (T == 0) return;
  add_sigmoid_gated_kernel<<<grid_for(int64_t(T) * hidden), 256, 0, s>>>(y, shared, gate_logit, T, hidden);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gather_rows_bf16(const bf16_t* x, const int32_t* rows, bf16_t* out, int count, int n, cudaStream_t s) {
  if (count == 0) return;
  gather_rows_kernel<<<count, 256, 0, s>>>(x, rows, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* w, int count, int n,
                      cudaStream_t s) {
  if (count == 0) return;
  scatter_add_kernel<<<count, 256, 0, s>>>(y, src, rows, w, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
