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
//
// Staged form (kStaged): the block's weight rows are copied into shared memory by bulk copies
// issued before the PDL wait. Weights are constant during a forward, so the copy overlaps the
// kernel before this one (a norm, the recurrent step, attention: latency-bound kernels during
// which HBM idles); after the wait the rows are read from shared memory in the same order, so
// the bits are the plain GEMV's.
#pragma once
#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

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

// Rows one block of gemv_block covers: G warps a row, R rows a warp group.
__host__ __device__ inline int gemv_rows_per_block(int G, int R) { return kGemvBlock / 32 / G * R; }

// The staged form's prologue: warp 0 copies the block's rows (contiguous in w, one bulk copy a
// row) into `stage`, completing on `bar`; then the PDL wait, then every thread waits for the
// copies. Returns the first row staged. `block`: the block's index among the GEMV's blocks.
template <typename W>
__device__ __forceinline__ int stage_rows_then_wait(const W* __restrict__ w, W* stage, uint64_t* bar, int N, int K,
                                                    int rows_per_block, int block) {
  const int first = block * rows_per_block;
  const int rows = min(rows_per_block, N - first);
  const uint32_t row_bytes = uint32_t(K) * sizeof(W);
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      mbarrier_init(bar, 1);
      mbarrier_expect_bytes(bar, row_bytes * uint32_t(rows));
    }
    __syncwarp();
    for (int r = threadIdx.x; r < rows; r += 32)
      bulk_copy_to_shared(stage + int64_t(r) * K, w + int64_t(first + r) * K, row_bytes, bar);
  }
  pdl_prologue();
  __syncthreads();  // the barrier's initialization, before anyone waits on it
  mbarrier_wait(bar, 0);
  return first;
}

// R rows per warp group: each activation vector loaded is used for R rows (several tokens would
// otherwise be bound by the activation loads). Per row the sum runs in the same order as R = 1.
// kStaged: the rows come from `stage` (shared memory, filled by stage_rows_then_wait; `bar` its
// barrier), read in the order the plain form reads them from `w`. `block` (-1: blockIdx.x) is
// which of the GEMV's gemv_blocks blocks this one computes (a fused kernel lays its grid out
// otherwise).
template <typename W, int MAX_T, int R, class Store, bool kStaged = false>
__device__ __forceinline__ void gemv_block(const W* __restrict__ w, const W* __restrict__ x, const Store& store,
                                           int T, int N, int K, int G, W* stage = nullptr, uint64_t* bar = nullptr,
                                           int block = -1) {
  if (block < 0) block = int(blockIdx.x);
  constexpr int V = Vec<W>::V;
  __shared__ float part[kGemvBlock / 32][R][MAX_T];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / G, g = warp % G;
  const int n0 = (block * (kGemvBlock / 32 / G) + group) * R;
  float acc[R][MAX_T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < MAX_T; ++t) acc[r][t] = 0.f;
  const int chunk = ((K / V + G - 1) / G) * V;  // this warp's K range, a multiple of V
  const int kb = g * chunk, ke = min(K, kb + chunk);
  int k = kb + lane * V;
  // Row n's elements: in w, or at row n - first of the stage.
  int first = 0;
  auto load_w = [&](int n, int kk) {
    if constexpr (kStaged) return load_shared16(stage + int64_t(n - first) * K + kk);
    else return load_stream(w + int64_t(n) * K + kk);
  };
  // The weights are constant during a forward: the first loads are issued before waiting for the
  // kernel that writes x (programmatic dependent launch), overlapping its tail.
  uint4 first0 = make_uint4(0, 0, 0, 0), first1 = first0;
  const bool early = !kStaged && R == 1 && n0 < N && k + 32 * V < ke;
  if constexpr (kStaged) {
    first = stage_rows_then_wait(w, stage, bar, N, K, gemv_rows_per_block(G, R), block);
  } else {
    if (early) {
      first0 = load_w(n0, k);
      first1 = load_w(n0, k + 32 * V);
    }
    pdl_prologue();
  }
  if (n0 < N) {
    if constexpr (R == 1) {
      if (early) {
        accumulate<W, MAX_T>(first0, x, k, T, K, acc[0]);
        accumulate<W, MAX_T>(first1, x, k + 32 * V, T, K, acc[0]);
        k += 64 * V;
      }
      for (; k + 32 * V < ke; k += 64 * V) {  // two loads in flight per lane (four measured slower)
        const uint4 w0 = load_w(n0, k), w1 = load_w(n0, k + 32 * V);
        accumulate<W, MAX_T>(w0, x, k, T, K, acc[0]);
        accumulate<W, MAX_T>(w1, x, k + 32 * V, T, K, acc[0]);
      }
      if (k < ke) accumulate<W, MAX_T>(load_w(n0, k), x, k, T, K, acc[0]);
    } else {
      for (; k < ke; k += 32 * V) {
        float wf[R][V];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 wv = n0 + r < N ? load_w(n0 + r, k) : make_uint4(0, 0, 0, 0);
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
  // Lane r * MAX_T + t sums element (r, t) over the group's G warps, in warp order (the order one
  // thread summing them all would take: the same bits), so the R * MAX_T sums run side by side
  // instead of as one thread's chain of R * MAX_T * G shared-memory loads; the result goes back
  // into the group's first slot, where lane 0 hands each row to `store`.
  static_assert(R * MAX_T <= 32, "one lane a (row, token) element");
  if (g == 0) {
    float* first_slot = &part[group * G][0][0];
    if (lane < R * MAX_T) {
      float s = 0.f;
      for (int i = 0; i < G; ++i) s += (&part[group * G + i][0][0])[lane];
      first_slot[lane] = s;
    }
    __syncwarp();
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (n0 + r < N) {
          float v[MAX_T];
#pragma unroll
          for (int t = 0; t < MAX_T; ++t) v[t] = first_slot[r * MAX_T + t];
          store(n0 + r, v, T);
        }
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
  const int rows_per_block = gemv_rows_per_block(G, R);
  return (N + rows_per_block - 1) / rows_per_block;
}

// The staged form: which GEMVs take it (FATHOM_GEMV_STAGED, else kGemvStagingDefault; tests set
// it with set_gemv_staging_mode): 0 none, 1 those whose grid is resident in one wave (every
// block's rows copied while the kernel before runs), 2 all (grids of several waves stage their
// first wave early, the later ones as blocks finish). A block stages at most kGemvStageMaxBytes,
// so that blocks of the kernel before it still fit beside its blocks.
inline constexpr int kGemvStagingDefault = 1;
inline constexpr size_t kGemvStageMaxBytes = 64 * 1024;
int gemv_staging_mode();
// Shared memory a staged block of G warps a row and R rows a warp group takes for rows of K elements.
size_t gemv_stage_bytes(int G, int R, int K, size_t elem);
// Whether a launch of `blocks` blocks of the staged `kernel` (stage_bytes a block) takes the
// staged form in the current mode; if so, grants the kernel its shared memory.
bool gemv_takes_staged_form(const void* kernel, int blocks, size_t stage_bytes);

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
