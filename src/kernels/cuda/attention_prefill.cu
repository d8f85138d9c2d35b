// Prefill attention on tensor cores: FlashAttention-2 over the paged KV cache with
// mma.sync.m16n8k16 (bf16 inputs, fp32 accumulation), for steps with many query tokens. Same
// inputs and result as paged_attention (attention.cu), which stays the reference and the fallback.
//
// Block = 4 warps = one head and 64 consecutive query tokens (16 rows per warp, the mma's M).
// The block walks key tiles of 64 positions from 0 upwards, gathering K and V through the block
// table into shared memory with cp.async (V of a tile loads while S = Q K^T is computed, K of
// the next tile while O += P V is). Scores stay in registers: the fp32 accumulator layout of S
// is, once packed to bf16 pairs, exactly the A-operand layout of the P V product.
//
// Ragged steps: the 64 tokens of a block may belong to several sequences. Tokens of one sequence
// are contiguous, so the tile splits into segments of rows; the block runs the key loop once per
// segment over that sequence's keys, and rows outside the segment see every key masked (a warp
// with no row in the segment skips the arithmetic). A single long prompt has one segment per
// block.
#include <climits>

#include "kernels/cuda/common.cuh"
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
constexpr int kTileQ = kWarps * 16;  // query rows per block
constexpr int kTileK = 64;           // keys per step
constexpr int kNoKey = -1;           // key limit of a row outside the current segment: no key is visible

// Q tile: fp32 rows of tokens t0.. (zeros past T), times `scale`, to bf16.
template <int D>
__device__ __forceinline__ void load_q_tile(bf16_t* tile, const float* q, int t0, int rows, int nh, int h,
                                            float scale) {
  constexpr int kChunks = D / 8;
#pragma unroll 4
  for (int idx = threadIdx.x; idx < kTileQ * kChunks; idx += kThreads) {
    const int row = idx / kChunks, chunk = idx % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (row < rows) {
      const float4* src = reinterpret_cast<const float4*>(q + (int64_t(t0 + row) * nh + h) * D + chunk * 8);
      const float4 a = src[0], b = src[1];
      packed = make_uint4(pack_bf16(a.x * scale, a.y * scale), pack_bf16(a.z * scale, a.w * scale),
                          pack_bf16(b.x * scale, b.y * scale), pack_bf16(b.z * scale, b.w * scale));
    }
    *reinterpret_cast<uint4*>(tile + swizzled<D>(row, chunk)) = packed;
  }
}

template <int D>
constexpr int prefill_smem_bytes() {
  return (kTileQ + 2 * kTileK) * D * int(sizeof(bf16_t));  // Q, K, V tiles
}

// Blocks per SM the register budget is sized for: 2 at d = 256 (the O accumulators alone take
// 128 registers), 3 at 128, 4 at 64; shared memory allows as many.
template <int D>
constexpr int prefill_min_blocks() {
  return D == 256 ? 2 : D == 128 ? 3 : 4;
}

// Grid (nh, query tiles); the last tiles (most keys under the causal mask) are scheduled first.
// CacheT: bf16_t, or e4m3_t (tiles converted to bf16 as they load; k_scale joins q's scale,
// v_scale multiplies the output).
template <int D, class CacheT>
__global__ void __launch_bounds__(kThreads, prefill_min_blocks<D>())
    paged_attention_prefill_kernel(const float* q, const float* gate, const CacheT* k_cache, const CacheT* v_cache,
                                   float k_scale, float v_scale, const int32_t* pos, const int32_t* seq_of_token,
                                   const int32_t* block_tables, int max_blocks, int block_size, bf16_t* out, int T,
                                   int nh, int nkv) {
  pdl_prologue();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* sq = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sk = sq + kTileQ * D;
  bf16_t* sv = sk + kTileK * D;
  __shared__ int32_t row_seq[kTileQ], row_pos[kTileQ];
  __shared__ int32_t slots[2][kTileK];  // of the tile being loaded and of the next one

  const int h = blockIdx.x, kvh = h / (nh / nkv);
  const int t0 = (gridDim.y - 1 - blockIdx.y) * kTileQ;
  const int rows = min(kTileQ, T - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;  // this lane's rows g, g+8 and columns 2c, 2c+1 of each mma fragment
  const int wrow = warp * 16;

  if (threadIdx.x < kTileQ) {
    const int r = threadIdx.x;
    row_seq[r] = r < rows ? seq_of_token[t0 + r] : -1;
    row_pos[r] = r < rows ? pos[t0 + r] : kNoKey;
  }
  // Scores come out pre-multiplied by log2(e)/sqrt(d), so the softmax uses exp2.
  float q_scale = rsqrtf(float(D)) * kLog2e;
  if constexpr (kIsE4m3Cache<CacheT>) q_scale *= k_scale;
  load_q_tile<D>(sq, q, t0, rows, nh, h, q_scale);
  __syncthreads();

  // Fragment addresses: A of Q (rows wrow + lane%16, chunk bit lane/16), B of K (keys lane%8 +
  // 8*(lane/16), chunk bit (lane/8)%2), B of V through ldmatrix.trans (keys lane%16, chunk bit lane/16).
  const LaneTileAddress<D> q_addr(sq, wrow + (lane & 15), lane >> 4);
  const LaneTileAddress<D> k_addr(sk, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const LaneTileAddress<D> v_addr(sv, lane & 15, lane >> 4);

  // Up to d = 128 the warp's Q fragments stay in registers; at 256 they would crowd out the
  // accumulators, so they are re-read from shared memory for every key tile.
  constexpr bool kQInRegisters = D <= 128;
  uint32_t qf[kQInRegisters ? D / 16 : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_addr.at(0, 2 * kk));
  }

  float o[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g+8 (log2 domain)
  float l[2] = {0.f, 0.f};              // this lane's part of the running sums (quad-reduced at the end)

  for (int seg_begin = 0; seg_begin < rows;) {
    // Segment = the rows [seg_begin, seg_end) of one sequence; its keys are positions 0..seg_last.
    const int seq = row_seq[seg_begin];
    int seg_end = seg_begin + 1, seg_last = row_pos[seg_begin];
    while (seg_end < rows && row_seq[seg_end] == seq) seg_last = max(seg_last, row_pos[seg_end++]);
    auto key_limit = [&](int r) { return r >= seg_begin && r < seg_end ? row_pos[r] : kNoKey; };
    const int lim[2] = {key_limit(wrow + g), key_limit(wrow + g + 8)};
    int warp_min = INT_MAX, warp_max = kNoKey;
    for (int r = wrow; r < wrow + 16; ++r) {
      const int x = key_limit(r);
      warp_min = min(warp_min, x);
      warp_max = max(warp_max, x);
    }
    const int32_t* table = block_tables + int64_t(seq) * max_blocks;
    const int tiles = seg_last / kTileK + 1;

    compute_slots<kTileK>(slots[0], table, block_size, 0, seg_last);
    __syncthreads();
    load_kv_tile<D, kThreads, kTileK>(sk, k_cache, slots[0], nkv, kvh);
    cp_async_commit();

    for (int it = 0; it < tiles; ++it) {
      const int first = it * kTileK;
      cp_async_wait_all();
      __syncthreads();  // K(it) is in; every warp is done with V(it-1) and slots[(it+1)%2]
      load_kv_tile<D, kThreads, kTileK>(sv, v_cache, slots[it & 1], nkv, kvh);
      cp_async_commit();
      if (it + 1 < tiles) compute_slots<kTileK>(slots[(it + 1) & 1], table, block_size, first + kTileK, seg_last);

      const bool active = first <= warp_max;  // some row of the warp sees a key of this tile
      uint32_t pf[kTileK / 16][4];            // P as bf16 A fragments, one per 16 keys
      if (active) {
        float s[kTileK / 8][4];
#pragma unroll
        for (int j = 0; j < kTileK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t a[4];
          if constexpr (kQInRegisters) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
          } else {
            ldmatrix_x4(a, q_addr.at(0, 2 * kk));
          }
#pragma unroll
          for (int j = 0; j < kTileK / 8; j += 2) {
            uint32_t b[4];
            ldmatrix_x4(b, k_addr.at(j * 8, 2 * kk));
            mma_bf16(s[j], a, b[0], b[1]);
            mma_bf16(s[j + 1], a, b[2], b[3]);
          }
        }
        if (first + kTileK - 1 > warp_min) {  // causal diagonal, segment edge or tail of the tile
#pragma unroll
          for (int j = 0; j < kTileK / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (first + j * 8 + 2 * c + (e & 1) > lim[e >> 1]) s[j][e] = -INFINITY;
        }
        online_softmax_step(s, m, l, o);
        // The accumulator of keys 16kk..16kk+15 (n-tiles 2kk, 2kk+1) is the A fragment of P.
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          pf[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
          pf[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
          pf[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
          pf[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
      }

      cp_async_wait_all();
      __syncthreads();  // V(it) is in; every warp is done with K(it); slots of tile it+1 are written
      if (it + 1 < tiles) {
        load_kv_tile<D, kThreads, kTileK>(sk, k_cache, slots[(it + 1) & 1], nkv, kvh);
        cp_async_commit();
      }

      if (active) {
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk)
#pragma unroll
          for (int dn = 0; dn < D / 8; dn += 2) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, v_addr.at(kk * 16, dn));
            mma_bf16(o[dn], pf[kk], b[0], b[1]);
            mma_bf16(o[dn + 1], pf[kk], b[2], b[3]);
          }
      }
    }
    seg_begin = seg_end;
  }

  // Epilogue: O / l, times sigmoid(gate), as bf16.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wrow + g + 8 * r;
    if (row >= rows) continue;
    float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    if constexpr (kIsE4m3Cache<CacheT>) inv *= v_scale;
    const int64_t base = (int64_t(t0 + row) * nh + h) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      float v0 = o[dn][2 * r] * inv, v1 = o[dn][2 * r + 1] * inv;
      if (gate) {
        const float2 gg = *reinterpret_cast<const float2*>(gate + base + dn * 8);
        v0 *= sigmoid_f(gg.x);
        v1 *= sigmoid_f(gg.y);
      }
      *reinterpret_cast<uint32_t*>(out + base + dn * 8) = pack_bf16(v0, v1);
    }
  }
}

template <int D, class CacheT>
void launch_prefill(const float* q, const float* gate, const CacheT* k_cache, const CacheT* v_cache, float k_scale,
                    float v_scale, const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                    int max_blocks, int block_size, bf16_t* out, int T, int nh, int nkv, cudaStream_t s) {
  constexpr int smem = prefill_smem_bytes<D>();
  allow_dynamic_smem(reinterpret_cast<const void*>(paged_attention_prefill_kernel<D, CacheT>), smem);
  const dim3 grid(nh, (T + kTileQ - 1) / kTileQ);
  launch(paged_attention_prefill_kernel<D, CacheT>, grid, kThreads, smem, s, q, gate, k_cache, v_cache, k_scale,
         v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, out, T, nh, nkv);
  FATHOM_CUDA_LAUNCH_CHECK();
}

template <class CacheT>
void launch_prefill_for(int d, const float* q, const float* gate, const CacheT* k_cache, const CacheT* v_cache,
                        float k_scale, float v_scale, const int32_t* pos, const int32_t* seq_of_token,
                        const int32_t* block_tables, int max_blocks, int block_size, bf16_t* out, int T, int nh,
                        int nkv, cudaStream_t s) {
  switch (d) {
    case 64:
      launch_prefill<64>(q, gate, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables, max_blocks,
                         block_size, out, T, nh, nkv, s);
      break;
    case 128:
      launch_prefill<128>(q, gate, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables, max_blocks,
                          block_size, out, T, nh, nkv, s);
      break;
    default:
      launch_prefill<256>(q, gate, k_cache, v_cache, k_scale, v_scale, pos, seq_of_token, block_tables, max_blocks,
                          block_size, out, T, nh, nkv, s);
  }
}

}  // namespace

bool paged_attention_prefill_covers(int d) { return d == 64 || d == 128 || d == 256; }

bool paged_attention_prefill(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                             const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                             bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s) {
  if (!paged_attention_prefill_covers(d)) return false;
  // Vector accesses: 16-byte q reads and cache copies, 8-byte gate reads, 4-byte output writes.
  if (!is_aligned(q, 16) || !is_aligned(cache.k, 16) || !is_aligned(cache.v, 16) || !is_aligned(gate, 8) ||
      !is_aligned(out, 4))
    return false;
  if ((T + kTileQ - 1) / kTileQ > 65535) return false;  // grid.y limit
  if (T == 0) return true;
  if (cache.fp8()) {
    launch_prefill_for(d, q, gate, static_cast<const e4m3_t*>(cache.k), static_cast<const e4m3_t*>(cache.v),
                       cache.k_scale, cache.v_scale, pos, seq_of_token, block_tables, max_blocks, block_size, out, T,
                       nh, nkv, s);
  } else {
    launch_prefill_for(d, q, gate, static_cast<const bf16_t*>(cache.k), static_cast<const bf16_t*>(cache.v), 1.f, 1.f,
                       pos, seq_of_token, block_tables, max_blocks, block_size, out, T, nh, nkv, s);
  }
  inject_backend_fault(kAttentionPrefillOp, kTensorCore, out, size_t(T) * nh * d * 2, s);
  return true;
}

}  // namespace fathom::cuda
