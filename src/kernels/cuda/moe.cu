// Mixture of experts: softmax + top-k routing, and the decode path that runs each selected
// (token, expert) pair directly off the expert weights (bf16 or NVFP4) with SwiGLU fused.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_topk.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kCombineLoads = 8;  // pair rows loaded before they are summed

// The same chosen in the kernel (a warp-uniform branch), for the kernels off the one-token chain.
__device__ int topk_token(const float* logits, int32_t* ids, float* weights, int t, int E, int K, bool renorm) {
  if (E <= kTopk4LaneExperts) return topk_token_n<4>(logits, ids, weights, t, E, K, renorm);
  if (E <= kTopk8LaneExperts) return topk_token_n<8>(logits, ids, weights, t, E, K, renorm);
  return topk_token_n<kTopkPlainLanes>(logits, ids, weights, t, E, K, renorm);
}

// One warp per token.
__global__ void moe_topk_kernel(const float* logits, int32_t* ids, float* weights, int T, int E, int K,
                                bool renorm) {
  pdl_prologue();
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t < T) topk_token(logits, ids, weights, t, E, K, renorm);
}

__constant__ float kE2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// Dot products of R consecutive weight rows (row0 ..) with one bf16 vector, by a whole warp; the
// results are in every lane. Each lane loads its slice of x once and reuses it for the R rows,
// so x traffic stays below weight traffic. `lut` is the E2M1 table in shared memory (constant
// memory would serialise divergent lookups).
template <int R>
__device__ void warp_rows_dot(const DeviceLinear& L, int row0, const bf16_t* x, const float* lut, float* out) {
  float sum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sum[r] = 0.f;
  const int lane = threadIdx.x % 32;
  if (L.fp4) {
    const int64_t row_bytes = L.in / 2;
    for (int byte0 = lane * 16; byte0 < L.in / 2; byte0 += 32 * 16) {
      const int k0 = byte0 * 2;
      float xf[32];
      const uint4* xp = reinterpret_cast<const uint4*>(x + k0);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint4 xv = xp[q];
        const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          xf[q * 8 + e * 2] = __uint_as_float(xw[e] << 16);
          xf[q * 8 + e * 2 + 1] = __uint_as_float(xw[e] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
        if (row >= L.out) break;
        const uint4 wv = *reinterpret_cast<const uint4*>(L.fp4 + row * row_bytes + byte0);
        const uint8_t* sc = L.fp4_scale + int64_t(row) * (L.in / 16) + k0 / 16;
        const float s0 = e4m3_to_f32(sc[0]) * L.fp4_global, s1 = e4m3_to_f32(sc[1]) * L.fp4_global;
        const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const uint32_t b = (words[q] >> (8 * e)) & 0xff;
            const float v = lut[b & 0xf] * xf[q * 8 + e * 2] + lut[b >> 4] * xf[q * 8 + e * 2 + 1];
            if (q < 2) a0 += v; else a1 += v;
          }
        }
        sum[r] += a0 * s0 + a1 * s1;
      }
    }
  } else {
    for (int k0 = lane * 8; k0 < L.in; k0 += 32 * 8) {
      const uint4 xv = *reinterpret_cast<const uint4*>(x + k0);
      const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
        if (row >= L.out) break;
        const uint4 wv = *reinterpret_cast<const uint4*>(L.bf16 + int64_t(row) * L.in + k0);
        const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sum[r] += __uint_as_float(ww[e] << 16) * __uint_as_float(xw[e] << 16);
          sum[r] += __uint_as_float(ww[e] & 0xffff0000u) * __uint_as_float(xw[e] & 0xffff0000u);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = warp_sum(sum[r]);
}

constexpr int kWarps = 4;

__device__ __forceinline__ void load_lut(float* lut) {
  if (threadIdx.x < 16) lut[threadIdx.x] = kE2M1[threadIdx.x];
  __syncthreads();
}

constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

// h_row[r0 .. r0+R) = silu(x G_e^T) * (x U_e^T) for this warp's rows.
__device__ void gate_up_rows(const DeviceExperts& ex, int e, int r0, const bf16_t* xt, const float* lut,
                             bf16_t* h_row) {
  float g[kRowsPerWarp], u[kRowsPerWarp];
  warp_rows_dot<kRowsPerWarp>(ex.gate[e], r0, xt, lut, g);
  warp_rows_dot<kRowsPerWarp>(ex.up[e], r0, xt, lut, u);
  const int lane = threadIdx.x % 32;
  if (lane < kRowsPerWarp && r0 + lane < ex.inter) {
    float gv = 0.f, uv = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      if (r == lane) gv = g[r], uv = u[r];
    h_row[r0 + lane] = to_bf(silu_f(gv) * uv);
  }
}

// out_row[n0 .. n0+R) = w * (h D_e^T) for this warp's rows.
__device__ void down_rows(const DeviceExperts& ex, int e, int n0, const bf16_t* hp, const float* lut, float w,
                          float* out_row) {
  float v[kRowsPerWarp];
  warp_rows_dot<kRowsPerWarp>(ex.down[e], n0, hp, lut, v);
  const int lane = threadIdx.x % 32;
  if (lane < kRowsPerWarp && n0 + lane < ex.hidden) {
    float vv = 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      if (r == lane) vv = v[r];
    out_row[n0 + lane] = vv * w;
  }
}

// Block (row block, p): one (token, k) pair.
__global__ void expert_gate_up_kernel(DeviceExperts ex, const bf16_t* x, const int32_t* ids, bf16_t* h, int K) {
  pdl_prologue();
  __shared__ float lut[16];
  load_lut(lut);
  const int p = blockIdx.y;
  const int r0 = blockIdx.x * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (r0 >= ex.inter) return;
  gate_up_rows(ex, ids[p], r0, x + int64_t(p / K) * ex.hidden, lut, h + int64_t(p) * ex.inter);
}

__global__ void expert_down_kernel(DeviceExperts ex, const bf16_t* h, const int32_t* ids, const float* w,
                                   float* pair_out) {
  pdl_prologue();
  __shared__ float lut[16];
  load_lut(lut);
  const int p = blockIdx.y;
  const int n0 = blockIdx.x * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (n0 >= ex.hidden) return;
  down_rows(ex, ids[p], n0, h + int64_t(p) * ex.inter, lut, w[p], pair_out + int64_t(p) * ex.hidden);
}

// Exclusive prefix sums over the block of three per-thread counts (blockDim.x <= 1024); every
// thread also gets the totals.
__device__ void block_exclusive_scan3(int3 v, int3* excl, int3* total) {
  __shared__ int3 warp_totals[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int3 inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffff, inc.x, o), y = __shfl_up_sync(0xffffffff, inc.y, o),
              z = __shfl_up_sync(0xffffffff, inc.z, o);
    if (lane >= o) inc.x += x, inc.y += y, inc.z += z;
  }
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  int3 before = make_int3(0, 0, 0), all = make_int3(0, 0, 0);
  for (int w = 0; w < warps; ++w) {
    const int3 t = warp_totals[w];
    if (w < warp) before.x += t.x, before.y += t.y, before.z += t.z;
    all.x += t.x, all.y += t.y, all.z += t.z;
  }
  *excl = make_int3(before.x + inc.x - v.x, before.y + inc.y - v.y, before.z + inc.z - v.z);
  *total = all;
}

// Groups the (token, k) pairs by expert (counting sort in one block) so that each selected
// expert's weights are read from memory once per step, whatever the number of its tokens. With
// `tile_tokens` > 0 it also lists work tiles: (expert, first sorted pair, pair count) with at
// most tile_tokens pairs each, experts in increasing order. Each thread owns a run of experts
// (prefix sums over the block, no serial loop over E: this runs once per MoE layer per step).
// `counts`: 2E ints of shared memory. Any block size that is a multiple of 32 gives the same
// layout (only the order of pairs within an expert, which no result depends on, varies).
__device__ void group_pairs_block(const int32_t* ids, int P, int E, int32_t* counts, int32_t* sorted_pairs,
                                  int32_t* expert_start, int32_t* active, int32_t* num_active, int tile_tokens,
                                  int32_t* tiles, int32_t* num_tiles) {
  int32_t* cursor = counts + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  // ids through L2 (__ldcg): moe_topk_group's other blocks wrote them.
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int id = __ldcg(ids + p);
    if (id >= 0) atomicAdd(&counts[id], 1);  // < 0: another rank's expert (expert parallel)
  }
  __syncthreads();
  const int per = (E + blockDim.x - 1) / blockDim.x;
  const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
  int3 mine = make_int3(0, 0, 0);  // pairs, active experts, tiles
  for (int e = e0; e < e1; ++e) {
    const int n = counts[e];
    mine.x += n;
    mine.y += n > 0;
    if (tile_tokens > 0) mine.z += (n + tile_tokens - 1) / tile_tokens;
  }
  int3 at, total;
  block_exclusive_scan3(mine, &at, &total);
  for (int e = e0; e < e1; ++e) {
    const int n = counts[e];
    expert_start[e] = at.x;
    cursor[e] = at.x;
    if (n > 0) active[at.y++] = e;
    if (tile_tokens > 0)
      for (int b = 0; b < n; b += tile_tokens, ++at.z) {
        tiles[4 * at.z] = e;
        tiles[4 * at.z + 1] = at.x + b;
        tiles[4 * at.z + 2] = min(tile_tokens, n - b);
        tiles[4 * at.z + 3] = 0;
      }
    at.x += n;
  }
  if (threadIdx.x == 0) {
    expert_start[E] = total.x;
    *num_active = total.y;
    if (tile_tokens > 0) *num_tiles = total.z;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int id = __ldcg(ids + p);
    if (id >= 0) sorted_pairs[atomicAdd(&cursor[id], 1)] = p;
  }
}

__global__ void moe_group_kernel(const int32_t* ids, int P, int E, int32_t* sorted_pairs, int32_t* expert_start,
                                 int32_t* active, int32_t* num_active, int tile_tokens, int32_t* tiles,
                                 int32_t* num_tiles) {
  pdl_prologue();
  extern __shared__ int32_t counts[];  // [E] counts, then [E] cursors
  group_pairs_block(ids, P, E, counts, sorted_pairs, expert_start, active, num_active, tile_tokens, tiles, num_tiles);
}

// Softmax + top-k of every token (a warp a token, as moe_topk), then the grouping of the pairs by
// the last block to finish (as moe_route's tail, counted on g.done): steps past the routing GEMV's
// sizes (6 to 128 tokens) save the launch between moe_topk and moe_group_pairs, with their results.
__global__ void moe_topk_group_kernel(const float* logits, int T, int E, int K, bool renorm, int32_t* ids,
                                      float* weights, MoeGroupScratch g, int tile_tokens) {
  pdl_prologue();
  extern __shared__ int32_t counts[];  // [E] counts, then [E] cursors
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t < T) topk_token(logits, ids, weights, t, E, K, renorm);
  if (!last_block_to_finish(reinterpret_cast<unsigned*>(g.done))) return;
  group_pairs_block(ids, T * K, E, counts, g.sorted_pairs, g.expert_start, g.active, g.num_active, tile_tokens, g.tiles,
                    g.num_tiles);
}

// A decode-sized step's routing in one launch: the router's fp32 GEMV (gemv_block: the bits of
// linear_f32), then the last block to finish takes the softmax + top-k of every token and the
// grouping of the pairs (last_block_to_finish, counted on g.done). Saves two kernel boundaries a
// MoE layer (docs/perf.md, issue 32).
// kStaged: the router's rows are copied into shared memory before the PDL wait (gemv.cuh), while
// the norm before it runs.
template <int MAX_T, int R, bool kStaged, int N>
__global__ void __launch_bounds__(kGemvBlock) moe_route_kernel(const float* router, const float* x, float* logits,
                                                               int T, int E, int H, int G, int K, bool renorm,
                                                               int32_t* ids, float* weights, MoeGroupScratch g,
                                                               int tile_tokens) {
  if constexpr (kStaged) {
    extern __shared__ __align__(128) uint4 stage[];
    __shared__ uint64_t bar;
    gemv_block<float, MAX_T, R, GemvStoreRows, true>(router, x, GemvStoreRows{logits, E}, T, E, H, G,
                                                     reinterpret_cast<float*>(stage), &bar);
  } else {
    gemv_block<float, MAX_T, R>(router, x, GemvStoreRows{logits, E}, T, E, H, G);
  }
  __shared__ int32_t counts[2 * kMaxExperts];
  if (!last_block_to_finish(reinterpret_cast<unsigned*>(g.done))) return;
  if (T == 1 && tile_tokens > 0 && K <= 32) {
    // One token: its K experts are distinct, so the grouping is a tile per pair, in k order (the
    // packed expert kernels' results do not depend on the tiles' order); one warp, no block-wide
    // counting sort. expert_start and active are not written (only moe_group_pairs' users read them).
    if (threadIdx.x >= 32) return;
    const int e = topk_token_n<N>(logits, ids, weights, 0, E, K, renorm);  // lane k's pick k, or -1
    __syncwarp();  // ids written by lane 0 where topk_token returned -1
    const int k = threadIdx.x;
    if (k < K) {
      g.sorted_pairs[k] = k;
      int32_t* tile = g.tiles + 4 * k;
      tile[0] = e >= 0 ? e : ids[k], tile[1] = k, tile[2] = 1, tile[3] = 0;
    }
    if (k == 0) *g.num_tiles = K;
    return;
  }
  for (int t = threadIdx.x / 32; t < T; t += blockDim.x / 32) topk_token_n<N>(logits, ids, weights, t, E, K, renorm);
  __syncthreads();
  group_pairs_block(ids, T * K, E, counts, g.sorted_pairs, g.expert_start, g.active, g.num_active, tile_tokens, g.tiles,
                    g.num_tiles);
}

// Block (row block, a): the a-th active expert, every pair routed to it (its weight rows stay in
// L1 across the pairs).
__global__ void expert_gate_up_grouped_kernel(DeviceExperts ex, const bf16_t* x, const int32_t* sorted_pairs,
                                              const int32_t* expert_start, const int32_t* active,
                                              const int32_t* num_active, bf16_t* h, int K) {
  pdl_prologue();
  __shared__ float lut[16];
  load_lut(lut);
  if (int(blockIdx.y) >= *num_active) return;
  const int e = active[blockIdx.y];
  const int r0 = blockIdx.x * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (r0 >= ex.inter) return;
  for (int i = expert_start[e]; i < expert_start[e + 1]; ++i) {
    const int p = sorted_pairs[i];
    gate_up_rows(ex, e, r0, x + int64_t(p / K) * ex.hidden, lut, h + int64_t(p) * ex.inter);
  }
}

__global__ void expert_down_grouped_kernel(DeviceExperts ex, const bf16_t* h, const int32_t* sorted_pairs,
                                           const int32_t* expert_start, const int32_t* active,
                                           const int32_t* num_active, const float* w, float* pair_out) {
  pdl_prologue();
  __shared__ float lut[16];
  load_lut(lut);
  if (int(blockIdx.y) >= *num_active) return;
  const int e = active[blockIdx.y];
  const int n0 = blockIdx.x * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (n0 >= ex.hidden) return;
  for (int i = expert_start[e]; i < expert_start[e + 1]; ++i) {
    const int p = sorted_pairs[i];
    down_rows(ex, e, n0, h + int64_t(p) * ex.inter, lut, w[p], pair_out + int64_t(p) * ex.hidden);
  }
}

__global__ void combine_pairs_kernel(const float* pair_out, float* y, int T, int K, int hidden, const float* shared,
                                     const float* shared_gate, int64_t gate_ld, const int32_t* ids) {
  pdl_prologue();
  const int64_t total = int64_t(T) * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, n = i % hidden;
    // Loads first, kCombineLoads in flight, then the sum in k order (a loop of dependent loads was
    // ~6 us a MoE layer at one token, docs/perf.md issue 32).
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += kCombineLoads) {
      float v[kCombineLoads];
#pragma unroll
      for (int j = 0; j < kCombineLoads; ++j)
        v[j] = k0 + j < K && (!ids || ids[t * K + k0 + j] >= 0) ? pair_out[(t * K + k0 + j) * hidden + n] : 0.f;
#pragma unroll
      for (int j = 0; j < kCombineLoads; ++j)
        if (k0 + j < K && (!ids || ids[t * K + k0 + j] >= 0)) acc += v[j];
    }
    if (shared) acc = __fmaf_rn(sigmoid_f(shared_gate[t * gate_ld]), shared[i], acc);  // as combine_float4
    y[i] = acc;
  }
}

__global__ void add_sigmoid_gated_kernel(float* y, const float* shared, const float* g, int64_t gate_ld, int T,
                                         int hidden) {
  pdl_prologue();
  const int64_t total = int64_t(T) * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += sigmoid_f(g[(i / hidden) * gate_ld]) * shared[i];
}

__global__ void gather_rows_kernel(const bf16_t* x, const int32_t* rows, bf16_t* out, int n) {
  pdl_prologue();
  const int i = blockIdx.x;
  const bf16_t* src = x + int64_t(rows[i]) * n;
  for (int c = threadIdx.x; c < n; c += blockDim.x) out[int64_t(i) * n + c] = src[c];
}

__global__ void scatter_add_kernel(float* y, const float* src, const int32_t* rows, const float* w, int n) {
  pdl_prologue();
  const int i = blockIdx.x;
  float* dst = y + int64_t(rows[i]) * n;
  const float wi = w[i];
  for (int c = threadIdx.x; c < n; c += blockDim.x) dst[c] += wi * src[int64_t(i) * n + c];
}

}  // namespace

void moe_topk(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
              cudaStream_t s) {
  if (T == 0) return;
  FATHOM_CHECK(E <= kMaxExperts && K <= E, "moe_topk: ", E, " experts / top-", K, " unsupported");
  launch(moe_topk_kernel, (T + 3) / 4, 128, 0, s, logits, topk_ids, topk_w, T, E, K, renorm);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void moe_experts_decode(const DeviceExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                        bf16_t* h, float* pair_out, float* y, int T, int K, const float* shared,
                        const float* shared_gate, int64_t gate_ld, cudaStream_t s, const MoeGroupScratch* g) {
  if (T == 0) return;
  const int P = T * K;
  if (g) {
    moe_group_pairs(topk_ids, P, ex.num, *g, 0, s);
    const int max_active = std::min(ex.num, P);
    launch(expert_gate_up_grouped_kernel, dim3((ex.inter + kRowsPerBlock - 1) / kRowsPerBlock, max_active), kWarps * 32,
           0, s, ex, x, g->sorted_pairs, g->expert_start, g->active, g->num_active, h, K);
    FATHOM_CUDA_LAUNCH_CHECK();
    launch(expert_down_grouped_kernel, dim3((ex.hidden + kRowsPerBlock - 1) / kRowsPerBlock, max_active), kWarps * 32,
           0, s, ex, h, g->sorted_pairs, g->expert_start, g->active, g->num_active, topk_w, pair_out);
    FATHOM_CUDA_LAUNCH_CHECK();
  } else {
    launch(expert_gate_up_kernel, dim3((ex.inter + kRowsPerBlock - 1) / kRowsPerBlock, P), kWarps * 32, 0, s, ex, x,
           topk_ids, h, K);
    FATHOM_CUDA_LAUNCH_CHECK();
    launch(expert_down_kernel, dim3((ex.hidden + kRowsPerBlock - 1) / kRowsPerBlock, P), kWarps * 32, 0, s, ex, h,
           topk_ids, topk_w, pair_out);
    FATHOM_CUDA_LAUNCH_CHECK();
  }
  moe_combine_pairs(pair_out, y, T, K, ex.hidden, shared, shared_gate, gate_ld, s, g ? topk_ids : nullptr);
}

__global__ void localize_ids_kernel(int32_t* ids, int P, int first, int count) {
  pdl_prologue();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < P) ids[p] = ids[p] >= first && ids[p] < first + count ? ids[p] - first : -1;
}

void moe_localize_ids(int32_t* topk_ids, int P, int first, int count, cudaStream_t s) {
  if (P == 0) return;
  launch(localize_ids_kernel, (P + 255) / 256, 256, 0, s, topk_ids, P, first, count);
  FATHOM_CUDA_LAUNCH_CHECK();
}

bool moe_route(const float* router, const float* x, float* logits, int T, int E, int H, int K, bool renorm,
               int32_t* topk_ids, float* topk_w, const MoeGroupScratch& g, int tile_tokens, cudaStream_t s) {
  if (T < 1 || T > kGemvMaxTokens || E > kMaxExperts || K > E || H % 4 != 0 || !is_aligned(router, 16) ||
      !is_aligned(x, 16) || g.done == nullptr)
    return false;
  const int G = gemv_warps_per_row<float>(E, H);
  for_gemv_bucket(T, [&](auto b) {  // the GEMV's buckets, so the logits have linear_f32's bits
    using B = decltype(b);
    const int blocks = gemv_blocks(E, G, B::kRows);
    const size_t stage = gemv_stage_bytes(G, B::kRows, H, sizeof(float));
    for_topk_form(E, [&](auto n) {
      constexpr int N = decltype(n)::value;
      if (gemv_takes_staged_form(reinterpret_cast<const void*>(moe_route_kernel<B::kMaxT, B::kRows, true, N>), blocks,
                                 stage))
        launch(moe_route_kernel<B::kMaxT, B::kRows, true, N>, blocks, kGemvBlock, stage, s, router, x, logits, T, E, H,
               G, K, renorm, topk_ids, topk_w, g, tile_tokens);
      else
        launch(moe_route_kernel<B::kMaxT, B::kRows, false, N>, blocks, kGemvBlock, 0, s, router, x, logits, T, E, H, G,
               K, renorm, topk_ids, topk_w, g, tile_tokens);
    });
  });
  FATHOM_CUDA_LAUNCH_CHECK();
  return true;
}

bool moe_topk_group(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
                    const MoeGroupScratch& g, int tile_tokens, cudaStream_t s) {
  if (T < 1 || T > kTopkGroupMaxTokens || E > kMaxExperts || K > E || g.done == nullptr) return false;
  launch(moe_topk_group_kernel, (T + 3) / 4, 128, 2 * E * sizeof(int32_t), s, logits, T, E, K, renorm, topk_ids, topk_w,
         g, tile_tokens);
  FATHOM_CUDA_LAUNCH_CHECK();
  return true;
}

void moe_group_pairs(const int32_t* topk_ids, int P, int E, const MoeGroupScratch& g, int tile_tokens,
                     cudaStream_t s) {
  launch(moe_group_kernel, 1, 1024, 2 * E * sizeof(int32_t), s, topk_ids, P, E, g.sorted_pairs, g.expert_start,
         g.active, g.num_active, tile_tokens, g.tiles, g.num_tiles);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void moe_combine_pairs(const float* pair_out, float* y, int T, int K, int hidden, const float* shared,
                       const float* shared_gate, int64_t gate_ld, cudaStream_t s, const int32_t* topk_ids) {
  launch(combine_pairs_kernel, grid_for(int64_t(T) * hidden), 256, 0, s, pair_out, y, T, K, hidden, shared, shared_gate,
         gate_ld, topk_ids);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void add_sigmoid_gated(float* y, const float* shared, const float* gate_logit, int64_t gate_ld, int T, int hidden,
                       cudaStream_t s) {
  if (T == 0) return;
  launch(add_sigmoid_gated_kernel, grid_for(int64_t(T) * hidden), 256, 0, s, y, shared, gate_logit, gate_ld, T, hidden);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gather_rows_bf16(const bf16_t* x, const int32_t* rows, bf16_t* out, int count, int n, cudaStream_t s) {
  if (count == 0) return;
  launch(gather_rows_kernel, count, 256, 0, s, x, rows, out, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* w, int count, int n,
                      cudaStream_t s) {
  if (count == 0) return;
  launch(scatter_add_kernel, count, 256, 0, s, y, src, rows, w, n);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
