// Gated full attention: q/k norm + partial RoPE + paged KV write, and attention over the paged
// cache with an online softmax (one block per query token and head; works for prefill chunks
// and decode alike).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kMaxHeadDim = kMaxAttentionHeadDim;

// Normalises buf[0..d) (zero-centred or plain weight) and applies NeoX RoPE on its first
// rotary_dim features, in shared memory.
__device__ void norm_rope(float* buf, const float* w, int d, int rotary_dim, float pos, float theta, float eps,
                          bool zc) {
  float ss = 0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += buf[i] * buf[i];
  const float inv = rsqrtf(block_sum(ss) / float(d) + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) buf[i] = buf[i] * inv * (zc ? 1.f + w[i] : w[i]);
  __syncthreads();
  const int half = rotary_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = 1.f / powf(theta, float(2 * i) / float(rotary_dim));
    float sn, cs;
    sincosf(pos * inv_freq, &sn, &cs);
    const float a = buf[i], b = buf[i + half];
    buf[i] = a * cs - b * sn;
    buf[i + half] = b * cs + a * sn;
  }
  __syncthreads();
}

// Block (t, j): j < nh is query head j, j >= nh is key/value head j - nh. CacheT: bf16_t or
// e4m3_t (then k, v are stored divided by k_scale, v_scale).
template <class CacheT>
__global__ void attention_prepare_kernel(const float* q_raw, const float* k_raw, const float* v_raw,
                                         const float* q_norm, const float* k_norm, const int32_t* pos,
                                         const int32_t* slot_mapping, float* q, float* gate, CacheT* k_cache,
                                         CacheT* v_cache, float k_scale, float v_scale, int nh, int nkv, int d,
                                         int rotary_dim, float theta, float eps, bool gated, bool zc, int64_t q_ld,
                                         int64_t kv_ld) {
  // The q / k norms' weights are asked for before the wait (weights: long gone from L2 by now).
  if (threadIdx.x * 32 < d) prefetch_l2((blockIdx.y < nh ? q_norm : k_norm) + threadIdx.x * 32);
  pdl_prologue();
  __shared__ float buf[kMaxHeadDim];
  const int t = blockIdx.x, j = blockIdx.y;
  const float p = float(pos[t]);
  if (j < nh) {
    const int h = j;
    const float* src = q_raw + int64_t(t) * q_ld + int64_t(h) * d * (gated ? 2 : 1);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      buf[i] = src[i];
      if (gated) gate[(int64_t(t) * nh + h) * d + i] = src[d + i];
    }
    __syncthreads();
    norm_rope(buf, q_norm, d, rotary_dim, p, theta, eps, zc);
    for (int i = threadIdx.x; i < d; i += blockDim.x) q[(int64_t(t) * nh + h) * d + i] = buf[i];
  } else {
    const int h = j - nh;
    const int64_t slot = slot_mapping[t];
    for (int i = threadIdx.x; i < d; i += blockDim.x) buf[i] = k_raw[int64_t(t) * kv_ld + int64_t(h) * d + i];
    __syncthreads();
    norm_rope(buf, k_norm, d, rotary_dim, p, theta, eps, zc);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      kv_store(k_cache + (slot * nkv + h) * d + i, buf[i], k_scale);
      kv_store(v_cache + (slot * nkv + h) * d + i, v_raw[int64_t(t) * kv_ld + int64_t(h) * d + i], v_scale);
    }
  }
}

constexpr int kAttnWarps = 4;
constexpr int kPerLane = kMaxHeadDim / 32;

// Online softmax of query (t, h) over keys [begin, end) of its sequence, by kAttnWarps warps
// (warp w takes keys begin+w, begin+w+kAttnWarps, ...), merged in shared memory. Returns the
// running max M and sum L, and leaves the accumulator (relative to M, unnormalised) in acc_out.
// An E4M3 cache's codes are read as their values: k_scale joins the scores' scale and the
// accumulator is multiplied by v_scale at the end (a bf16 cache has neither).
template <class CacheT>
__device__ void attend_range(const float* q, const CacheT* k_cache, const CacheT* v_cache, float k_scale,
                             float v_scale, const int32_t* table, int block_size, int nkv, int kvh, int d, int begin,
                             int end, float* M_out, float* L_out, float* acc_out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float scale = rsqrtf(float(d));
  if constexpr (kIsE4m3Cache<CacheT>) scale *= k_scale;
  float qr[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    qr[i] = c < d ? q[c] * scale : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = begin + warp; j < end; j += kAttnWarps) {
    const int64_t slot = int64_t(table[j / block_size]) * block_size + j % block_size;
    const CacheT* kp = k_cache + (slot * nkv + kvh) * d;
    const CacheT* vp = v_cache + (slot * nkv + kvh) * d;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < d) dot += qr[i] * kv_load(kp + c);
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int c = lane + 32 * i;
      acc[i] = acc[i] * corr + (c < d ? p * kv_load(vp + c) : 0.f);
    }
    m = m_new;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps];
  __shared__ float sacc[kAttnWarps][kMaxHeadDim];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c < d) sacc[warp][c] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (sm[w] > -INFINITY) L += sl[w] * __expf(sm[w] - M);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm[w] > -INFINITY) o += sacc[w][c] * __expf(sm[w] - M);
    if constexpr (kIsE4m3Cache<CacheT>) o *= v_scale;
    acc_out[c] = o;
  }
  *M_out = M;
  *L_out = L;
}

// One block per (query token, head) over all its keys: prefill chunks.
template <class CacheT>
__global__ void paged_attention_kernel(const float* q, const float* gate, const CacheT* k_cache,
                                       const CacheT* v_cache, float k_scale, float v_scale, const int32_t* pos,
                                       const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks,
                                       int block_size, bf16_t* out, int nh, int nkv, int d) {
  pdl_prologue();
  const int t = blockIdx.x, h = blockIdx.y;
  __shared__ float o[kMaxHeadDim];
  float M, L;
  attend_range(q + (int64_t(t) * nh + h) * d, k_cache, v_cache, k_scale, v_scale,
               block_tables + int64_t(seq_of_token[t]) * max_blocks, block_size, nkv, h / (nh / nkv), d, 0, pos[t] + 1,
               &M, &L, o);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = o[c] / L;
    if (gate) v *= sigmoid_f(gate[(int64_t(t) * nh + h) * d + c]);
    out[(int64_t(t) * nh + h) * d + c] = to_bf(v);
  }
}

// Split-K ("flash decoding") for few query tokens over long contexts: block (t, h, s) covers
// the s-th of `splits` equal key ranges and writes its partial (max, sum, accumulator).
template <class CacheT>
__global__ void paged_attention_split_kernel(const float* q, const CacheT* k_cache, const CacheT* v_cache,
                                             float k_scale, float v_scale, const int32_t* pos,
                                             const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks,
                                             int block_size, int nh, int nkv, int d, float* part_m, float* part_l,
                                             float* part_acc, int min_keys) {
  pdl_prologue();
  const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const KeyRange range = split_key_range(pos[t] + 1, split, splits, min_keys);  // as the tensor-core kernel
  const int begin = range.begin, end = range.end;
  const int64_t part = (int64_t(t) * nh + h) * splits + split;
  float M, L;
  attend_range(q + (int64_t(t) * nh + h) * d, k_cache, v_cache, k_scale, v_scale,
               block_tables + int64_t(seq_of_token[t]) * max_blocks, block_size, nkv, h / (nh / nkv), d, begin, end,
               &M, &L, part_acc + part * d);
  if (threadIdx.x == 0) part_m[part] = M, part_l[part] = L;
}

// Merges the splits' partials of (token t, head h), columns blockIdx.z * kCombineCols onwards.
// Every block works out the splits' weights e^(m_s - M) (M = the largest maximum) and their sum
// L itself; then warp w sums splits w, w + 8, ... of its lanes' two columns, all of a warp's
// loads in flight at once (at one token a head's 64 splits were a chain of eight L2 round trips
// in one thread's loop, docs/perf.md issue 32), and the warps' sums are added in warp order.
// The order of every sum depends only on the split count: a token's bits do not depend on the
// other tokens of its step. A split with weight 0 (empty, or negligible) is skipped, so the
// partials of empty ranges are never read.
constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kCombineCols = 64;  // two a lane
constexpr int kCombineLoads = 8;  // split rows a lane has in flight
__global__ void __launch_bounds__(kCombineThreads)
    attention_combine_kernel(const float* part_m, const float* part_l, const float* part_acc, const float* gate,
                             bf16_t* out, int nh, int d, int splits) {
  pdl_prologue();
  __shared__ float weight[kMaxCombineSplits];
  __shared__ float warp_max[kCombineWarps];
  __shared__ float sums[kCombineWarps][kCombineCols];
  const int t = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * kCombineCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t base = (int64_t(t) * nh + h) * splits;
  float M = -INFINITY;  // a max is exact in any order
  for (int s2 = threadIdx.x; s2 < splits; s2 += kCombineThreads) M = fmaxf(M, weight[s2] = part_m[base + s2]);
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffff, M, o));
  if (lane == 0) warp_max[warp] = M;
  __syncthreads();
  for (int w = 0; w < kCombineWarps; ++w) M = fmaxf(M, warp_max[w]);
  float l = 0.f;
  for (int s2 = threadIdx.x; s2 < splits; s2 += kCombineThreads) {
    const float f = weight[s2] > -INFINITY ? __expf(weight[s2] - M) : 0.f;
    weight[s2] = f;
    if (f != 0.f) l = __fmaf_rn(part_l[base + s2], f, l);
  }
  const float L = block_sum(l);  // its barriers also publish the weights

  const int c = c0 + 2 * lane;
  float o0 = 0.f, o1 = 0.f;
  for (int s0 = warp; s0 < splits; s0 += kCombineWarps * kCombineLoads) {
    float a0[kCombineLoads], a1[kCombineLoads], f[kCombineLoads];
#pragma unroll
    for (int j = 0; j < kCombineLoads; ++j) {
      const int s2 = s0 + j * kCombineWarps;
      f[j] = s2 < splits ? weight[s2] : 0.f;
      const float* row = part_acc + (base + s2) * d;
      a0[j] = f[j] != 0.f && c < d ? row[c] : 0.f;
      a1[j] = f[j] != 0.f && c + 1 < d ? row[c + 1] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kCombineLoads; ++j)
      if (f[j] != 0.f) o0 = __fmaf_rn(a0[j], f[j], o0), o1 = __fmaf_rn(a1[j], f[j], o1);
  }
  sums[warp][2 * lane] = o0;
  sums[warp][2 * lane + 1] = o1;
  __syncthreads();
  const int col = c0 + int(threadIdx.x);
  if (threadIdx.x >= kCombineCols || col >= d) return;
  float o = 0.f;
  for (int w = 0; w < kCombineWarps; ++w) o += sums[w][threadIdx.x];
  o /= L;
  if (gate) o *= sigmoid_f(gate[(int64_t(t) * nh + h) * d + col]);
  out[(int64_t(t) * nh + h) * d + col] = to_bf(o);
}

}  // namespace

void attention_prepare(const float* q_raw, const float* k_raw, const float* v_raw, const float* q_norm,
                       const float* k_norm, const int32_t* pos, const int32_t* slot_mapping, float* q,
                       float* gate, const KvCacheView& cache, int T, int nh, int nkv, int d, int rotary_dim,
                       float theta, float eps, bool gated, bool zero_centered, cudaStream_t s, int64_t qkv_ld) {
  if (T == 0) return;
  const int64_t q_ld = qkv_ld ? qkv_ld : int64_t(nh) * d * (gated ? 2 : 1), kv_ld = qkv_ld ? qkv_ld : int64_t(nkv) * d;
  FATHOM_CHECK(d <= kMaxHeadDim, "attention: head_dim ", d, " > ", kMaxHeadDim);
  if (cache.fp8()) {
    launch(attention_prepare_kernel<e4m3_t>, dim3(T, nh + nkv), 128, 0, s, q_raw, k_raw, v_raw, q_norm, k_norm, pos,
           slot_mapping, q, gate, static_cast<e4m3_t*>(cache.k), static_cast<e4m3_t*>(cache.v), cache.k_scale,
           cache.v_scale, nh, nkv, d, rotary_dim, theta, eps, gated, zero_centered, q_ld, kv_ld);
  } else {
    launch(attention_prepare_kernel<bf16_t>, dim3(T, nh + nkv), 128, 0, s, q_raw, k_raw, v_raw, q_norm, k_norm, pos,
           slot_mapping, q, gate, static_cast<bf16_t*>(cache.k), static_cast<bf16_t*>(cache.v), 1.f, 1.f, nh, nkv, d,
           rotary_dim, theta, eps, gated, zero_centered, q_ld, kv_ld);
  }
  FATHOM_CUDA_LAUNCH_CHECK();
}

void attention_combine(const AttentionSplit& split, const float* gate, bf16_t* out, int T, int nh, int d,
                       cudaStream_t s) {
  if (T == 0) return;
  FATHOM_CHECK(split.splits >= 1 && split.splits <= kMaxCombineSplits, "attention: ", split.splits,
               " key splits (at most ", kMaxCombineSplits, ")");
  launch(attention_combine_kernel, dim3(T, nh, (d + kCombineCols - 1) / kCombineCols), kCombineThreads, 0, s,
         split.part_m, split.part_l, split.part_acc, gate, out, nh, d, split.splits);
  FATHOM_CUDA_LAUNCH_CHECK();
}

namespace {

template <class CacheT>
void launch_paged_attention(const float* q, const float* gate, const CacheT* k_cache, const CacheT* v_cache,
                            float k_scale, float v_scale, const int32_t* pos, const int32_t* seq_of_token,
                            const int32_t* block_tables, int max_blocks, int block_size, bf16_t* out, int T, int nh,
                            int nkv, int d, cudaStream_t s, const AttentionSplit* split) {
  if (split && split->splits > 1) {
    dim3 grid(T, nh, split->splits);
    launch(paged_attention_split_kernel<CacheT>, grid, kAttnWarps * 32, 0, s, q, k_cache, v_cache, k_scale, v_scale,
           pos, seq_of_token, block_tables, max_blocks, block_size, nh, nkv, d, split->part_m, split->part_l,
           split->part_acc, split->min_keys);
    FATHOM_CUDA_LAUNCH_CHECK();
    attention_combine(*split, gate, out, T, nh, d, s);
  } else {
    launch(paged_attention_kernel<CacheT>, dim3(T, nh), kAttnWarps * 32, 0, s, q, gate, k_cache, v_cache, k_scale,
           v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, out, nh, nkv, d);
    FATHOM_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

void paged_attention(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                     const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                     bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s, const AttentionSplit* split) {
  if (T == 0) return;
  FATHOM_CHECK(d <= kMaxHeadDim, "attention: head_dim ", d, " > ", kMaxHeadDim);
  if (cache.fp8()) {
    launch_paged_attention(q, gate, static_cast<const e4m3_t*>(cache.k), static_cast<const e4m3_t*>(cache.v),
                           cache.k_scale, cache.v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, out,
                           T, nh, nkv, d, s, split);
  } else {
    launch_paged_attention(q, gate, static_cast<const bf16_t*>(cache.k), static_cast<const bf16_t*>(cache.v), 1.f, 1.f,
                           pos, seq_of_token, block_tables, max_blocks, block_size, out, T, nh, nkv, d, s, split);
  }
  // With split partials it serves decode steps, without them prefill chunks (backend_switches.h).
  inject_backend_fault(split ? kAttentionDecodeOp : kAttentionPrefillOp, kCudaCore, out, size_t(T) * nh * d * 2, s);
}

}  // namespace fathom::cuda
