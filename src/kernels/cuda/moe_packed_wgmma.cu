// Routed experts' prefill GEMMs on packed NVFP4 weights with Hopper's warpgroup MMA (wgmma,
// sm_90a). The weights, decoded in registers, are wgmma's register A operand (a warp's 16 rows,
// a warpgroup's 64), and the token tile in shared memory its B operand (N = the tile's tokens
// rounded up to 32), which the tensor cores read without passing it through registers. A block
// is two warpgroups over one tile of tokens: 128 weight rows per token row read from L2.
//
// Per 64-k slab, a cp.async pipeline stages the tile's token rows (128 bytes each, with the
// 128-byte swizzle the B descriptor names: 16-byte chunk i of row n at chunk i ^ (n % 8)) and
// each warp's packed codes and scales. wgmma's k16 step j reads k 16j .. 16j + 15 of every token
// row in order, so a lane takes its A fragments (rows g, g + 8 at k 16j + {2c, 2c+1, 2c+8,
// 2c+9}) from the lane whose 16 packed bytes hold that k (lane (g, j)): two words of it, the
// nibbles of rows g and g + 8 in either the even or the odd bytes. The E2M1 -> bf16 placement
// and the scale are those of the mma.sync kernels (moe_packed.cuh), done with multiplies where
// those kernels shift (the integer multiply does not share the ALU pipe, which the decode keeps
// busy: docs/perf.md, issue 33).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_packed.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace fathom::cuda::packed {
namespace {

constexpr int kRowBytes = kSlabK * 2;  // a token's 64 k of one slab: one 128-byte swizzle row
constexpr int kWarps = 8, kThreads = 32 * kWarps;  // two warpgroups (M = 128 rows a block)

// One pipeline stage in shared memory: the token tile (kTok rows of 128 bytes, 128-byte swizzle,
// at the stage's 1024-aligned start), then per warp its slab's codes (8 row groups of 4 lanes'
// 64 bytes, each padded to 80 so that the 8 groups' words hit different banks) and its 64 bytes
// of scales. Four stages (three slabs of loads in flight) leave room for two blocks an SM.
constexpr int kTok = kWgmmaTileTokens;
struct Stage {
  static constexpr int kX = kTok * kRowBytes;
  static constexpr int kCodeGroupBytes = 80;
  static constexpr int kCodes = kWarps * 8 * kCodeGroupBytes;
  static constexpr int kScales = kWarps * 64;
  static constexpr int kBytes = (kX + kCodes + kScales + 1023) / 1024 * 1024;
  static constexpr int kCount = 4;
  static constexpr size_t kSmem = size_t(kCount) * kBytes + 1024;  // + room to align to 1024 (the swizzle)
};

#ifdef FATHOM_WGMMA
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// fp4x2_raw of nibbles 0 and 4 (or 1 and 5) of u, with multiplies instead of shifts (the integer
// multiply runs beside the ALU pipe, which the masks keep busy): the magnitude bits move to bf16
// bits 6-8 / 22-24 and the sign bit to 15 / 31 (the sign's copy the first product makes below it
// is taken back by the second's factor).
__device__ __forceinline__ uint32_t fp4x2_nibbles04(uint32_t u) {
  return (u & 0x000F000Fu) * 64u + (u & 0x00080008u) * (4096u - 64u);
}
__device__ __forceinline__ uint32_t fp4x2_nibbles15(uint32_t u) {
  return (u & 0x00F000F0u) * 4u + (u & 0x00800080u) * (256u - 4u);
}
__device__ __forceinline__ uint32_t byte_of(uint32_t w, int i) { return __byte_perm(w, 0, 0x4440 | i); }
// scale_bf16x2 as one multiply-add: (byte << 4) + 0x7000 in both halves.
__device__ __forceinline__ uint32_t scale_byte_bf16x2(uint32_t byte) { return byte * 0x00100010u + 0x70007000u; }
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

#endif  // FATHOM_WGMMA

// A block: two warpgroups sharing one tile of <= kTok tokens of one expert (each token row read
// from L2 once per 128 weight rows), all of k; two blocks an SM (128 registers a thread).
// gate/up: warpgroup 0 gate row tiles 4x .. 4x + 3, warpgroup 1 up's same four (SwiGLU pairs
// them through shared memory at the end); down: row tiles 8x .. 8x + 7.
template <bool kGateUp>
__global__ __launch_bounds__(kThreads, 2) void moe_wgmma_kernel(MoeFp4Args a) {
#ifdef FATHOM_WGMMA
  using St = Stage;
  constexpr int S = St::kCount;
  constexpr int kXCopies = kTok * 8 / kThreads;  // 16-byte token-row chunks a thread copies a slab
  pdl_prologue();
  if (int(blockIdx.y) >= *a.num_tiles) return;
  const int* td = a.tiles + 4 * blockIdx.y;
  const int e = td[0], begin = td[1], count = td[2];
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = lane >> 2, c = lane & 3;
  const int rt = kGateUp ? 4 * blockIdx.x + (warp & 3) : 8 * blockIdx.x + warp;
  const PackedMatrix& M = kGateUp ? (warp < 4 ? a.ex.gate[e] : a.ex.up[e]) : a.ex.down[e];
  const bool ok = rt < M.row_tiles;
  const int KS = M.k_slabs;  // the same for every row tile of the block (gate and up share k)
  const int k = kGateUp ? a.ex.hidden : a.ex.inter;
  const int32_t* pairs = a.sorted_pairs + begin;
  const uint8_t* codes = M.codes + int64_t(ok ? rt : 0) * KS * 512;  // slab ks: 512 bytes at ks * 512
  const uint8_t* scales = reinterpret_cast<const uint8_t*>(M.scales + int64_t(ok ? rt : 0) * KS * 32);

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);

  // The token-row chunks this thread copies: chunk t + 256 i = row n, 16-byte chunk q (swizzled).
  const int q = t & 7;
  const int ncol = (count + 31) / 32 * 32;  // token rows the MMAs read (see `run` below)
  // Element offsets into x (32 bits: the launch checks that x and h have fewer elements; kNoRow:
  // a row past the tile's tokens, zero-filled).
  constexpr uint32_t kNoRow = 0xFFFFFFFFu;
  uint32_t src[kXCopies];
#pragma unroll
  for (int i = 0; i < kXCopies; ++i) {
    const int n = (t >> 3) + (kThreads / 8) * i;
    src[i] = kNoRow;
    if (n < count) {
      const int p = pairs[n];
      src[i] = uint32_t((kGateUp ? p / a.K : p) * int64_t(a.x_ld) + 8 * q);
    }
  }
  const uint32_t code_dst = uint32_t(St::kX + warp * 8 * St::kCodeGroupBytes + (lane >> 2) * St::kCodeGroupBytes +
                                     (lane & 3) * 16);
  const uint32_t scale_dst = uint32_t(St::kX + St::kCodes + warp * 64 + lane * 16);  // lanes 0-3
  auto load_stage = [&](int ks) {
    const uint32_t stage = base + uint32_t((ks % S) * St::kBytes);
    const bool in_k = ks * kSlabK + 8 * q < k;
#pragma unroll
    for (int i = 0; i < kXCopies; ++i) {
      const int n = (t >> 3) + (kThreads / 8) * i;
      const bool valid = src[i] != kNoRow && in_k;
      if (n < ncol)
        cp_async16_zfill(stage + uint32_t(n * kRowBytes + 16 * (q ^ (n & 7))), a.x + (valid ? src[i] + ks * kSlabK : 0),
                         valid);
    }
    cp_async16_zfill(stage + code_dst, codes + int64_t(ks) * 512 + lane * 16, ok);
    if (lane < 4) cp_async16_zfill(stage + scale_dst, scales + int64_t(ks) * 64 + lane * 16, ok);
  };

  // Lane (g, c)'s A fragments of k16 step s are rows g, g + 8 at k 16s + {2c, 2c+1, 2c+8, 2c+9}:
  // in lane (g, s)'s 16 bytes (k 16s .. 16s + 15, 4 words of 4 k), words c / 2 and 2 + c / 2,
  // nibble pairs (0, 4) / (1, 5) for rows g / g + 8 when c is even, (2, 6) / (3, 7) when odd
  // (shifted down a byte, so that every lane decodes nibbles 0, 4 and 1, 5).
  const uint32_t code_src = uint32_t(St::kX + warp * 8 * St::kCodeGroupBytes + g * St::kCodeGroupBytes + 4 * (c >> 1));
  const uint32_t scale_src = uint32_t(St::kX + St::kCodes + warp * 64 + g * 8);
  const uint32_t odd_shift = 8 * (c & 1);
  auto decode = [&](int ks, uint32_t (&A)[4][4]) {
    const uint32_t stage = base + uint32_t((ks % S) * St::kBytes);
    const uint2 sw = lds64(stage + scale_src);  // lane (g, s)'s scale pair, s = 0..3
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t w_lo = lds32(stage + code_src + 16 * s) >> odd_shift;
      const uint32_t w_hi = lds32(stage + code_src + 16 * s + 8) >> odd_shift;
      const uint32_t sp = s < 2 ? sw.x : sw.y;  // bytes: row g, row g + 8 of steps 2 (s / 2), 2 (s / 2) + 1
      const uint32_t s_lo = scale_byte_bf16x2(byte_of(sp, 2 * (s & 1))), s_hi = scale_byte_bf16x2(byte_of(sp, 2 * (s & 1) + 1));
      A[s][0] = mul_bf16x2(fp4x2_nibbles04(w_lo), s_lo);
      A[s][1] = mul_bf16x2(fp4x2_nibbles15(w_lo), s_hi);
      A[s][2] = mul_bf16x2(fp4x2_nibbles04(w_hi), s_lo);
      A[s][3] = mul_bf16x2(fp4x2_nibbles15(w_hi), s_hi);
    }
  };

  // The MMAs' N: the tile's tokens rounded up to 32 (columns past them would be zeros).
  auto run = [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    constexpr int kAcc = N / 2;  // accumulators a thread (m64 x N over a warpgroup)
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
      if (st < KS) load_stage(st);
      cp_async_commit();
    }

    // Slab ks: wait for its stage, start the copies of slab ks + S - 1 into the stage of ks - 1
    // (every warp waited for its MMAs before this barrier), decode its A, issue its 4 MMAs and
    // wait for them (one A buffer; the block's other warpgroup and the SM's other block use the
    // tensor cores meanwhile).
    for (int ks = 0; ks < KS; ++ks) {
      cp_async_wait<S - 2>();
      fence_proxy_async();  // the copies' bytes, for the tensor cores' reads
      __syncthreads();
      if (ks + S - 1 < KS) load_stage(ks + S - 1);
      cp_async_commit();
      uint32_t A[4][4];
      decode(ks, A);
      uint64_t desc[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        desc[s] = sw128_descriptor(base + uint32_t((ks % S) * St::kBytes + 32 * s));
        pin(desc[s]);
#pragma unroll
        for (int i = 0; i < 4; ++i) pin(A[s][i]);
      }
#pragma unroll
      for (int i = 0; i < kAcc; ++i) pin(acc[i]);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) Wgmma<N>::mma(acc, A[s], desc[s]);
      wgmma_commit();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) pin(acc[i]);
      wgmma_wait<0>();
    }
    cp_async_wait<0>();

    if constexpr (kGateUp) {
      // up's accumulators to gate's warps through shared memory, then SwiGLU into h.
      __syncthreads();  // every warp's MMAs are done reading the stages
      float* ex = reinterpret_cast<float*>(smem);
      if (warp >= 4)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) ex[((warp & 3) * kAcc + i) * 32 + lane] = acc[i];
      __syncthreads();
      if (warp < 4) {
#pragma unroll
        for (int tile = 0; tile < N / 8; ++tile) {
          if (tile * 8 >= count) break;
          float vg[4], vu[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            vg[i] = acc[4 * tile + i];
            vu[i] = ex[((warp & 3) * kAcc + 4 * tile + i) * 32 + lane];
          }
          store_tile<true>(a, e, rt, tile * 8, count, pairs, vg, vu, lane);
        }
      }
    } else {
      const int H = a.ex.hidden;
      const float gd = M.global;
#pragma unroll
      for (int tile = 0; tile < N / 8; ++tile) {
        if (tile * 8 >= count) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = tile * 8 + 2 * c + (i & 1), r = rt * kTileRows + g + (i >> 1) * 8;
          if (col < count && r < H) {
            const int p = pairs[col];
            a.pair_out[int64_t(p) * H + r] = acc[4 * tile + i] * (a.topk_w[p] * gd);
          }
        }
      }
    }
  };
  if (ncol <= 32) run(std::integral_constant<int, 32>{});
  else if (ncol <= 64) run(std::integral_constant<int, 64>{});
  else if (ncol <= 96) run(std::integral_constant<int, 96>{});
  else run(std::integral_constant<int, 128>{});
#else
  __trap();  // built without sm_90a: wgmma_available() keeps this kernel from being chosen
#endif
}

}  // namespace

WgmmaExpertKernels wgmma_expert_kernels() { return {moe_wgmma_kernel<true>, moe_wgmma_kernel<false>, Stage::kSmem}; }

}  // namespace fathom::cuda::packed
