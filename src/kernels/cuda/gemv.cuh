// The body of the small-batch GEMV (gemv.cu), shared with the kernels that fuse a GEMV with what
// follows it (moe_route.cu), so that a fused product has the bits of the plain one.
//
// Layout: G warps per group of R output rows (G from N and K only: enough warps to cover the
// GPU; R grows with T so each activation load serves several rows), each warp streams a
// contiguous K range of its rows with 16-byte loads that bypass L1, while the activations stay
// cached. Batch invariance: token t's sum runs in an order
// fixed by (N, K) (lane-strided partial sums, a butterfly shuffle, then the G partials in order),
// never by T, so a verify step over several tokens gives bit-identical rows to decode steps of
// one token each; cuBLASLt picks different algorithms for different T and does not.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace fathom::cuda {

constexpr int kGemvBlock = 256;  // 8 warps

// The V values of a 16-byte vector as floats (8 bf16 or 4 fp32).
template <typename W>
struct Vec;
template <>
struct Vec<bf16_t> {
  static constexpr int V = 8;
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Vec<float> {
  static constexpr int V = 4;
  __device__ __forceinline__ static void unpack(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
};

template <typename W, int MAX_T>
__device__ __forceinline__ void accumulate(const uint4& wv, const W* __restrict__ x, int64_t k, int T, int K,
                                           float* acc) {
  constexpr int V = Vec<W>::V;
  float wf[V];
  Vec<W>::unpack(wv, wf);
#pragma unroll
  for (int t = 0; t < MAX_T; ++t) {
    if (t < T) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K + k));
      float xf[V];
      Vec<W>::unpack(xv, xf);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[t] = fmaf(wf[e], xf[e], acc[t]);
    }
  }
}

// Where a finished row goes: row n's values for tokens 0..T-1 (v[t], t < MAX_T), called once per
// row by the one thread that holds them. The plain GEMV writes y[t, n]; fused kernels add an
// epilogue per row (gdn_in_proj.cu: the causal conv of the row's channel).
struct GemvStoreRows {
  float* y;
  int N;
  template <int MAX_T>
  __device__ __forceinline__ void operator()(int n, const float (&v)[MAX_T], int T) const {
#pragma unroll
    for (int t = 0; t < MAX_T; ++t)
      if (t < T) y[int64_t(t) * N + n] = v[t];
  }
};

// R rows per warp group: each activation vector loaded is used for R rows (several tokens would
// otherwise be bound by the activation loads). Per row the sum runs in the same order as R = 1.
template <typename W, int MAX_T, int R, class Store>
__device__ __forceinline__ void gemv_block(const W* __restrict__ w, const W* __restrict__ x, const Store& store,
                                           int T, int N, int K, int G) {
  constexpr int V = Vec<W>::V;
  __shared__ float part[kGemvBlock / 32][R][MAX_T];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / G, g = warp % G;
  const int n0 = (blockIdx.x * (kGemvBlock / 32 / G) + group) * R;
  float acc[R][MAX_T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) acc[r][t] = 0.f;
  const int chunk = ((K / V + G - 1) / G) * V;  // this warp's K range, a multiple of V
  const int kb = g * chunk, ke = min(K, kb + chunk);
  int k = kb + lane * V;
  // The weights are constant during a forward: the first loads are issued before waiting for the
  // kernel that writes x (programmatic dependent launch), overlapping its tail.
  uint4 first0 = make_uint4(0, 0, 0, 0), first1 = first0;
  const bool early = R == 1 && n0 < N && k + 32 * V < ke;
  if (early) {
    first0 = load_stream(w + int64_t(n0) * K + k);
    first1 = load_stream(w + int64_t(n0) * K + k + 32 * V);
  }
  pdl_prologue();
  if (n0 < N) {
    if constexpr (R == 1) {
      const W* row = w + int64_t(n0) * K;
      if (early) {
        accumulate<W, MAX_T>(first0, x, k, T, K, acc[0]);
        accumulate<W, MAX_T>(first1, x, k + 32 * V, T, K, acc[0]);
        k += 64 * V;
      }
      for (; k + 32 * V < ke; k += 64 * V) {  // two loads in flight per lane (four measured slower)
        const uint4 w0 = load_stream(row + k), w1 = load_stream(row + k + 32 * V);
        accumulate<W, MAX_T>(w0, x, k, T, K, acc[0]);
        accumulate<W, MAX_T>(w1, x, k + 32 * V, T, K, acc[0]);
      }
      if (k < ke) accumulate<W, MAX_T>(load_stream(row + k), x, k, T, K, acc[0]);
    } else {
      for (; k < ke; k += 32 * V) {
        float wf[R][V];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 wv = n0 + r < N ? load_stream(w + int64_t(n0 + r) * K + k) : make_uint4(0, 0, 0, 0);
          Vec<W>::unpack(wv, wf[r]);
        }
#pragma unroll
        for (int t = 0; t < MAX_T; ++t) {
          if (t < T) {
            float xf[V];
            Vec<W>::unpack(__ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K + k)), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int e = 0; e < V; ++e) acc[r][t] = fmaf(wf[r][e], xf[e], acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (G == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (n0 + r < N) store(n0 + r, acc[r], T);
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
      if (n0 + r < N) {
        float v[MAX_T];
#pragma unroll
        for (int t = 0; t < MAX_T; ++t) {
          float s = 0.f;
          for (int i = 0; i < G; ++i) s += part[group * G + i][r][t];
          v[t] = s;
        }
        store(n0 + r, v, T);
      }
}

// The GEMV's token buckets: fn(GemvBucket<MAX_T, R>{}) for a step of T <= kGemvMaxTokens tokens.
// Every kernel built on gemv_block launches through them (with gemv_blocks' grid), so its rows
// have the plain GEMV's bits.
template <int MAX_T, int R>
struct GemvBucket {
  static constexpr int kMaxT = MAX_T, kRows = R;
};
template <class Fn>
void for_gemv_bucket(int T, Fn&& fn) {
  static_assert(kGemvMaxTokens <= 8);
  if (T <= 1) fn(GemvBucket<1, 1>{});
  else if (T <= 2) fn(GemvBucket<2, 2>{});
  else if (T <= 4) fn(GemvBucket<4, 4>{});
  else fn(GemvBucket<8, 4>{});
}
// Blocks of a launch over N rows, G warps a row, R rows a warp group.
inline int gemv_blocks(int N, int G, int R) {
  const int rows_per_block = kGemvBlock / 32 / G * R;
  return (N + rows_per_block - 1) / rows_per_block;
}

// Warps per row, from N and K only (so per-row sums never depend on T): enough rows x warps to
// fill the GPU (about 4K warps), while every lane still gets two or more 16-byte loads.
template <typename W>
inline int gemv_warps_per_row(int N, int K) {
  constexpr int V = Vec<W>::V;
  int G = 1;
  while (G < 8 && int64_t(N) * G < 4096 && K / (2 * G) >= 64 * V) G *= 2;
  return G;
}

}  // namespace fathom::cuda
