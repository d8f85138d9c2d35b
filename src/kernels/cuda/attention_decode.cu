// Decode / verify attention on tensor cores: split-K ("flash decoding") over the paged KV cache
// with the q heads that share a KV head (the GQA group) as the rows of one mma tile, so each KV
// row is read once per (token, KV head, split) instead of once per q head. Same inputs, partial
// buffers and result as paged_attention with an AttentionSplit (attention.cu), whose combine
// kernel merges the partials.
//
// Block (t, head group, split) = 4 warps; rows = up to 16 q heads of one KV head (zero rows pad
// a smaller group to the mma's M of 16). The block walks its key range [begin, end) in tiles of
// 64 keys gathered through the block table with cp.async (V of a tile loads while S = Q K^T is
// computed, K of the next tile while O += P V is). Warp w owns keys 16w..16w+15 of every tile
// and keeps its own online softmax (max, sum, 16 x d accumulator) in registers; the four are
// merged in shared memory at the end into the split's partial.
//
// Small grids (a one-token step: 32 blocks on 132 SMs) wait on memory, not on the SMs: the
// deep form keeps K and V of kDeepStages tiles in flight per block (one block an SM), instead
// of one K or V tile. Both forms add the same products in the same order: the same bits.

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;                     // q heads per block: one mma row tile
constexpr int kWarpKeys = 16;                 // keys per warp per tile: one k-step of P V
constexpr int kTileK = kWarps * kWarpKeys;    // keys per tile
static_assert(kTileK == kSplitTileKeys, "key ranges are whole tiles");
constexpr int kMergePad = 8;                  // floats of padding per row of the merge buffer (banks)
constexpr int kCopyUnroll = 8;                // K/V row copies unrolled together (all 16 spill at d = 256)

// Q tile: the fp32 rows of q heads h0 .. h0 + rows - 1 of token t (zeros below), times `scale`,
// as bf16.
template <int D>
__device__ __forceinline__ void load_group_q(bf16_t* tile, const float* q, int t, int h0, int rows, int nh,
                                             float scale) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (row < rows) {
      const float4* src = reinterpret_cast<const float4*>(q + (int64_t(t) * nh + h0 + row) * D + chunk * 8);
      const float4 a = src[0], b = src[1];
      packed = make_uint4(pack_bf16(a.x * scale, a.y * scale), pack_bf16(a.z * scale, a.w * scale),
                          pack_bf16(b.x * scale, b.y * scale), pack_bf16(b.z * scale, b.w * scale));
    }
    *reinterpret_cast<uint4*>(tile + swizzled<D>(row, chunk)) = packed;
  }
}

constexpr int kDeepStages = 3;  // K/V tile pairs in flight per block in the deep form

// Q, K and V tiles (the deep form: kDeepStages pairs); the merge buffer ([kWarps][kRows][D +
// kMergePad] fp32) reuses them at the end.
template <int D, bool kDeep>
constexpr int decode_smem_bytes() {
  return (kRows + 2 * kTileK * (kDeep ? kDeepStages : 1)) * D * int(sizeof(bf16_t));
}

// Blocks per SM the register budget is sized for (the accumulator is D/2 registers per lane):
// 4 at d = 128; at 256, 3 (as many as 72 KB of shared memory allow) where sm_90's ptxas fits
// the kernel in the 168 registers that leaves, 2 on newer targets, where it would spill.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
constexpr int kBlocksAtD256 = 2;
#else
constexpr int kBlocksAtD256 = 3;
#endif
template <int D, bool kDeep>
constexpr int decode_min_blocks() {
  return kDeep ? 1 : D == 256 ? kBlocksAtD256 : 4;
}

// The warp's 16 keys of a tile: S = Q K^T, masked past `end`, the online softmax step, and P as
// a bf16 A fragment for P V.
template <int D>
__device__ __forceinline__ void warp_scores(const LaneTileAddress<D>& q_addr, const LaneTileAddress<D>& k_addr,
                                            uint32_t k_offset, int key0, int end, int c, float (&m)[2], float (&l)[2],
                                            float (&o)[D / 8][4], uint32_t (&pf)[4]) {
  float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4], b[4];
    ldmatrix_x4(a, q_addr.at(0, 2 * kk));
    ldmatrix_x4(b, k_addr.at(0, 2 * kk) + k_offset);
    mma_bf16(s[0], a, b[0], b[1]);
    mma_bf16(s[1], a, b[2], b[3]);
  }
  if (key0 + kWarpKeys > end) {  // tail of the range: keys past `end` are zero rows, masked
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + j * 8 + 2 * c + (e & 1) >= end) s[j][e] = -INFINITY;
  }
  online_softmax_step(s, m, l, o);
  // The accumulator of the 16 keys (n-tiles 0, 1) is the A fragment of P.
  pf[0] = pack_bf16(s[0][0], s[0][1]);
  pf[1] = pack_bf16(s[0][2], s[0][3]);
  pf[2] = pack_bf16(s[1][0], s[1][1]);
  pf[3] = pack_bf16(s[1][2], s[1][3]);
}

// O += P V for the warp's 16 keys (V rows at the Q lanes' addresses plus `v_offset`).
template <int D>
__device__ __forceinline__ void warp_pv(const LaneTileAddress<D>& qv_addr, uint32_t v_offset, const uint32_t (&pf)[4],
                                        float (&o)[D / 8][4]) {
#pragma unroll
  for (int dn = 0; dn < D / 8; dn += 2) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, qv_addr.at(0, dn) + v_offset);
    mma_bf16(o[dn], pf, b[0], b[1]);
    mma_bf16(o[dn + 1], pf, b[2], b[3]);
  }
}

// Grid (T, nh / rows, splits). Block (t, y, s): q heads y*rows .. y*rows + rows - 1 (all of KV head
// y*rows / group), keys of the s-th range; writes their partials (natural-log max, sum, accumulator).
// CacheT: bf16_t, or e4m3_t (tiles converted to bf16 as they load; k_scale joins q's scale,
// v_scale multiplies the partial accumulator).
template <int D, class CacheT, bool kDeep>
__global__ void __launch_bounds__(kThreads, decode_min_blocks<D, kDeep>())
    paged_attention_decode_kernel(const float* q, const CacheT* k_cache, const CacheT* v_cache, float k_scale,
                                  float v_scale, const int32_t* pos, const int32_t* seq_of_token,
                                  const int32_t* block_tables, int max_blocks, int block_size, int nh, int nkv,
                                  int group, int rows, float* part_m, float* part_l, float* part_acc, int min_keys) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* sq = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sk = sq + kRows * D;
  bf16_t* sv = sk + kTileK * D;
  // Of the tile being loaded and of the next one (the deep form: of each stage's tile).
  __shared__ int32_t slots[kDeep ? kDeepStages : 2][kTileK];
  __shared__ float warp_m[kWarps][kRows], warp_l[kWarps][kRows], warp_scale[kWarps][kRows];

  const int t = blockIdx.x, h0 = blockIdx.y * rows, kvh = h0 / group;
  const int split = blockIdx.z, splits = gridDim.z;
  // The key range: as paged_attention_split_kernel splits it.
  const KeyRange range = split_key_range(pos[t] + 1, split, splits, min_keys);
  const int begin = range.begin, end = range.end;
  const int tiles = (end - begin + kTileK - 1) / kTileK;
  if (tiles == 0) {  // an empty range: the combine reads only its max (skipped)
    pdl_prologue();
    for (int r = threadIdx.x; r < rows; r += kThreads) part_m[(int64_t(t) * nh + h0 + r) * splits + split] = -INFINITY;
    return;
  }
  const int32_t* table = block_tables + int64_t(seq_of_token[t]) * max_blocks;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;  // this lane's rows g, g+8 and columns 2c, 2c+1 of each mma fragment
  const int wkey = warp * kWarpKeys;     // the warp's first key within a tile

  // Scores come out pre-multiplied by log2(e)/sqrt(d), so the softmax uses exp2.
  float q_scale = rsqrtf(float(D)) * kLog2e;
  if constexpr (kIsE4m3Cache<CacheT>) q_scale *= k_scale;
  // The block table lookups go out before waiting for the kernel that writes q (programmatic
  // dependent launch): positions and tables are the step's, written before the kernels that
  // precede this one, which are done once it starts.
  compute_slots<kTileK>(slots[0], table, block_size, begin, end - 1);
  if constexpr (kDeep)
#pragma unroll
    for (int st = 1; st < kDeepStages; ++st)
      if (st < tiles) compute_slots<kTileK>(slots[st], table, block_size, begin + st * kTileK, end - 1);
  pdl_prologue();
  load_group_q<D>(sq, q, t, h0, rows, nh, q_scale);
  __syncthreads();

  // Fragment addresses: A of Q (rows lane%16, chunk bit lane/16), B of K (the warp's keys lane%8 +
  // 8*(lane/16), chunk bit (lane/8)%2), B of V through ldmatrix.trans (the warp's keys lane%16,
  // chunk bit lane/16). Q and V lanes read rows of the same swizzle pattern, so V's addresses are
  // Q's plus one offset (registers are tight next to the d/2 accumulators).
  const LaneTileAddress<D> qv_addr(sq, lane & 15, lane >> 4);
  const LaneTileAddress<D> k_addr(sk, wkey + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t v_offset = smem_addr(sv + wkey * D) - smem_addr(sq);

  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g+8 over the warp's keys (log2 domain)
  float l[2] = {0.f, 0.f};              // this lane's part of the running sums (quad-reduced at the end)

  if constexpr (kDeep) {
    // Stage i holds K then V of tile i % kDeepStages; tiles it + 1 .. it + kDeepStages - 1 load
    // while tile it is computed.
    constexpr uint32_t kStageBytes = 2 * kTileK * D * sizeof(bf16_t);
#pragma unroll
    for (int st = 0; st < kDeepStages - 1; ++st) {
      if (st < tiles) {
        bf16_t* stage = sk + st * 2 * kTileK * D;
        load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(stage, k_cache, slots[st], nkv, kvh);
        load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(stage + kTileK * D, v_cache, slots[st], nkv, kvh);
      }
      cp_async_commit();
    }
    for (int it = 0; it < tiles; ++it) {
      // Tile it + kDeepStages - 1 into the stage freed by tile it - 1 (every warp is done with it
      // after the barrier below), then tile it's copies are waited for.
      const int next = it + kDeepStages - 1, ns = next % kDeepStages;
      if (next < tiles) {
        bf16_t* stage = sk + ns * 2 * kTileK * D;
        load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(stage, k_cache, slots[ns], nkv, kvh);
        load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(stage + kTileK * D, v_cache, slots[ns], nkv, kvh);
      }
      cp_async_commit();
      cp_async_wait<kDeepStages - 1>();
      __syncthreads();  // tile it has landed for every thread
      const int first = begin + it * kTileK;
      // Tile it's slots were read when its copies were issued: the entry takes tile it + kDeepStages'.
      if (it + kDeepStages < tiles)
        compute_slots<kTileK>(slots[it % kDeepStages], table, block_size, first + kDeepStages * kTileK, end - 1);
      const uint32_t offset = (it % kDeepStages) * kStageBytes;
      if (first + wkey < end) {
        uint32_t pf[4];
        warp_scores<D>(qv_addr, k_addr, offset, first + wkey, end, c, m, l, o, pf);
        warp_pv<D>(qv_addr, v_offset + offset, pf, o);
      }
      __syncthreads();  // every warp is done with tile it's stage (refilled next), its slots are written
    }
    cp_async_wait<0>();
  } else {
    if (tiles > 0) {
      load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(sk, k_cache, slots[0], nkv, kvh);
      cp_async_commit();
    }
    for (int it = 0; it < tiles; ++it) {
      const int first = begin + it * kTileK;
      cp_async_wait_all();
      __syncthreads();  // K(it) is in; every warp is done with V(it-1) and slots[(it+1)%2]
      load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(sv, v_cache, slots[it & 1], nkv, kvh);
      cp_async_commit();
      if (it + 1 < tiles) compute_slots<kTileK>(slots[(it + 1) & 1], table, block_size, first + kTileK, end - 1);

      const bool active = first + wkey < end;  // the warp has a key in this tile (only the last one has gaps)
      uint32_t pf[4];                          // P of the warp's 16 keys as a bf16 A fragment
      if (active) warp_scores<D>(qv_addr, k_addr, 0, first + wkey, end, c, m, l, o, pf);

      cp_async_wait_all();
      __syncthreads();  // V(it) is in; every warp is done with K(it); slots of tile it+1 are written
      if (it + 1 < tiles) {
        load_kv_tile<D, kThreads, kTileK, kCopyUnroll>(sk, k_cache, slots[(it + 1) & 1], nkv, kvh);
        cp_async_commit();
      }
      if (active) warp_pv<D>(qv_addr, v_offset, pf, o);
    }
  }

  // Merge of the four warps' softmax states, in a fixed order (deterministic): M = max of the
  // warps' maxima, each warp weighted by 2^(m_w - M). A warp that saw no key has m = -inf, l = 0.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
  }
  constexpr int kLd = D + kMergePad;
  float* merge = reinterpret_cast<float*>(smem_raw);  // [kWarps][kRows][kLd]
  __syncthreads();                                    // every warp is done with the Q, K and V tiles
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* dst = merge + (warp * kRows + g + 8 * r) * kLd + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(o[dn][2 * r], o[dn][2 * r + 1]);
    if (c == 0) warp_m[warp][g + 8 * r] = m[r], warp_l[warp][g + 8 * r] = l[r];
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w][r]);
    float L = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = warp_m[w][r] == -INFINITY ? 0.f : fast_exp2(warp_m[w][r] - M);
      warp_scale[w][r] = f;
      L += warp_l[w][r] * f;
    }
    if (r < rows) {
      // The combine works in natural units (e^(m - M)): 2^(x - M2) = e^(x ln2 - M2 ln2). An empty
      // range gives M = -inf, L = 0, which the combine skips.
      const int64_t part = (int64_t(t) * nh + h0 + r) * splits + split;
      part_m[part] = M * kLn2;
      part_l[part] = L;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), col = (idx % (D / 4)) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = warp_scale[w][r];
      const float4 x = *reinterpret_cast<const float4*>(merge + (w * kRows + r) * kLd + col);
      acc.x += x.x * f;
      acc.y += x.y * f;
      acc.z += x.z * f;
      acc.w += x.w * f;
    }
    if constexpr (kIsE4m3Cache<CacheT>) acc.x *= v_scale, acc.y *= v_scale, acc.z *= v_scale, acc.w *= v_scale;
    const int64_t part = (int64_t(t) * nh + h0 + r) * splits + split;
    *reinterpret_cast<float4*>(part_acc + part * D + col) = acc;
  }
}

// The deep form where a block per SM is enough for the grid (kDeepStages K/V pairs need the
// shared memory of several shallow blocks); FATHOM_ATTENTION_DEEP=0 turns it off (A/B runs). The
// E4M3 cache's copies are synchronous loads, which a deeper ring would not overlap.
bool deep_decode_for(const dim3& grid) {
  static const bool enabled = [] {
    const char* v = std::getenv("FATHOM_ATTENTION_DEEP");
    return !v || std::string(v) != "0";
  }();
  static const int sms = multiprocessor_count();
  return enabled && int64_t(grid.x) * grid.y * grid.z <= sms;
}

template <int D, class CacheT, bool kDeep>
void launch_decode_form(const dim3& grid, const float* q, const CacheT* k_cache, const CacheT* v_cache, float k_scale,
                        float v_scale, const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                        int max_blocks, int block_size, int nh, int nkv, int group, int rows,
                        const AttentionSplit& split, cudaStream_t s) {
  constexpr int smem = decode_smem_bytes<D, kDeep>();
  static_assert(kWarps * kRows * (D + kMergePad) * int(sizeof(float)) <= decode_smem_bytes<D, false>(),
                "the merge buffer must fit in the tiles' shared memory");
  allow_dynamic_smem(reinterpret_cast<const void*>(paged_attention_decode_kernel<D, CacheT, kDeep>), smem);
  launch(paged_attention_decode_kernel<D, CacheT, kDeep>, grid, kThreads, smem, s, q, k_cache, v_cache, k_scale,
         v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, nh, nkv, group, rows, split.part_m,
         split.part_l, split.part_acc, split.min_keys);
  FATHOM_CUDA_LAUNCH_CHECK();
}

template <int D, class CacheT>
void launch_decode(const float* q, const CacheT* k_cache, const CacheT* v_cache, float k_scale, float v_scale,
                   const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks,
                   int block_size, int T, int nh, int nkv, int group, int rows, const AttentionSplit& split,
                   cudaStream_t s) {
  const dim3 grid(T, nh / rows, split.splits);
  if constexpr (!kIsE4m3Cache<CacheT>) {
    if (deep_decode_for(grid)) {
      launch_decode_form<D, CacheT, true>(grid, q, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables,
                                          max_blocks, block_size, nh, nkv, group, rows, split, s);
      return;
    }
  }
  launch_decode_form<D, CacheT, false>(grid, q, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables,
                                       max_blocks, block_size, nh, nkv, group, rows, split, s);
}

template <class CacheT>
void launch_decode_for(int d, const float* q, const CacheT* k_cache, const CacheT* v_cache, float k_scale,
                       float v_scale, const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                       int max_blocks, int block_size, int T, int nh, int nkv, int group, int rows,
                       const AttentionSplit& split, cudaStream_t s) {
  if (d == 128) {
    launch_decode<128>(q, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables, max_blocks, block_size,
                       T, nh, nkv, group, rows, split, s);
  } else {
    launch_decode<256>(q, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables, max_blocks, block_size,
                       T, nh, nkv, group, rows, split, s);
  }
}

}  // namespace

bool paged_attention_decode_covers(int nh, int nkv, int d) {
  if (d != 128 && d != 256) return false;
  if (nkv <= 0 || nh <= 0 || nh % nkv != 0) return false;
  // A group of up to 16 q heads is one (zero-padded) row tile; a larger one, a multiple of 16,
  // is split into row tiles of 16 (the KV head is then read once per row tile).
  const int group = nh / nkv;
  return group <= kRows || group % kRows == 0;
}

AttentionSplitShape attention_few_token_split(int nh, int nkv, int d) {
  // Blocks of one token for one range: the tensor-core kernel's row tiles, else a block a q head.
  const int per_range = paged_attention_decode_covers(nh, nkv, d) ? nh / std::min(nh / nkv, kRows) : nh;
  int splits = kManyTokenSplit.splits;
  while (splits < kFewTokenMaxSplits && 2 * splits * per_range <= multiprocessor_count()) splits *= 2;
  return {splits, kFewTokenMinKeys};
}

bool paged_attention_decode(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                            const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                            bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s, const AttentionSplit& split) {
  if (!paged_attention_decode_covers(nh, nkv, d)) return false;
  const int group = nh / nkv;
  const int rows = group < kRows ? group : kRows;
  if (split.splits < 1 || split.splits > kMaxCombineSplits || split.min_keys < 1 || nh / rows > 65535) return false;
  if (!split.part_m || !split.part_l || !split.part_acc) return false;
  // Vector accesses: 16-byte q reads, cache copies and accumulator writes.
  if (!is_aligned(q, 16) || !is_aligned(cache.k, 16) || !is_aligned(cache.v, 16) || !is_aligned(split.part_acc, 16))
    return false;
  if (T == 0) return true;
  if (cache.fp8()) {
    launch_decode_for(d, q, static_cast<const e4m3_t*>(cache.k), static_cast<const e4m3_t*>(cache.v), cache.k_scale,
                      cache.v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, T, nh, nkv, group, rows,
                      split, s);
  } else {
    launch_decode_for(d, q, static_cast<const bf16_t*>(cache.k), static_cast<const bf16_t*>(cache.v), 1.f, 1.f, pos,
                      seq_of_token, block_tables, max_blocks, block_size, T, nh, nkv, group, rows, split, s);
  }
  attention_combine(split, gate, out, T, nh, d, s);
  inject_backend_fault(kAttentionDecodeOp, kTensorCore, out, size_t(T) * nh * d * 2, s);
  return true;
}

}  // namespace fathom::cuda
