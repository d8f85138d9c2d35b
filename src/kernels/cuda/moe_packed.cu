// Routed experts on packed NVFP4 or FP8 weights with tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 out), for every batch size. The weights are the mma's A operand (16 output rows x 16 k)
// and the tokens its N dimension, so each weight is decoded once per tile of tokens instead of
// once per token. The weights are repacked at load (moe_pack.cu) so that one 16-byte load gives a
// lane its A fragments for 64 k (two for FP8), and the codes become bf16 with masks, shifts and
// one bf16 multiply. A format (Nvfp4Slabs, Fp8Slabs) is what the kernels are templated on.
//
// k order: the mma sums over its 16 "logical" k of a step in an order of its own, so any
// permutation of k shared by A and B gives the same product. Lane (g, c) of a slab holds logical
// k {2c, 2c+1, 2c+8, 2c+9} of each of the 4 steps; they are mapped to the actual k 16c .. 16c+15
// so that a lane's weights share one e4m3 scale (per 16 k) and its activations are 32
// contiguous bytes.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_packed.cuh"
#include "kernels/cuda/moe_packed_small.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
using namespace packed;
namespace {

constexpr int kSmallTile = 8;  // tokens per tile of the decode kernel (the mma's N)

// ---- decode-shaped kernel (moe_packed_small.cuh): a block = one work item, blockIdx.y its tile,
// blockIdx.x its row tile.
//
// The down kernel issues its first U slabs' weight loads before waiting for the gate/up kernel
// (programmatic dependent launch): only h comes from that kernel. The routing it reads was
// written before: the gate/up kernel's blocks each waited for their predecessor before letting
// this kernel start (pdl_prologue waits, then triggers), so the down weights stream while the
// gate/up kernel finishes.
template <class F, bool kGateUp, int W, int U, int kMinBlocks>
__global__ __launch_bounds__(W * 32, kMinBlocks) void moe_packed_small_kernel(MoeFp4Args a) {
  if constexpr (kGateUp) {
    if (a.prefetch_descriptors) prefetch_expert_descriptors(a.ex);
    pdl_prologue();
  }
  // The tile is read beside the tile count, not after it (one dependent load fewer before the
  // weights stream; the grid's rows never pass the tile buffer, and a tile past the count is
  // not used).
  const int num_tiles = *a.num_tiles;
  const SmallItem it = small_item<kGateUp>(a, blockIdx.y, blockIdx.x, true);
  if (int(blockIdx.y) >= num_tiles) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float red[W][8][32];
  small_item_partials<F, kGateUp, W, U>(a, it, warp, lane, red[warp], [] {
    if constexpr (!kGateUp) pdl_prologue();
  });
  __syncthreads();
  if (warp == 0) small_item_store<kGateUp, W>(a, it, red, lane);
}

// ---- prefill-shaped kernel: a block = W warps x (a pair of row tiles) x one tile of <= 64
// tokens, all of k. A kStages-deep cp.async pipeline stages, per slab, the token tile (16-byte
// chunks XOR-swizzled by row so the lanes' 16-byte reads do not conflict) and every warp's codes
// and scales, so the loads of slab ks + kStages - 1 are in flight while slab ks is computed.
constexpr int kChunks = kSlabK * 2 / 16;  // 16-byte chunks per token row of a slab

// One pipeline stage: the token tile and, per warp, 2 x 32 lanes x 16 B (FP8: 32 B) of codes and
// (NVFP4) 2 x 64 B of scales; FP8's slab scales are read from global memory (L1) by each warp.
template <class F, int W, int NT>
struct LargeStage {
  uint4 x[NT * 8 * kChunks];
  uint4 codes[W][2][32 * F::kWords];
  uint4 scales[W][2][F::kSlabScale ? 1 : 4];
};
template <class F, int W, int kStages, int NT>
constexpr size_t large_smem_bytes() { return sizeof(LargeStage<F, W, NT>) * kStages; }

// NT n8 tiles of tokens per block: each decoded weight serves NT mma (the decode, not the
// tensor cores, bounds this kernel: docs/perf.md, v8).
template <class F, bool kGateUp, int W, int kStages, int NT, int kMinBlocks = 1>
__global__ __launch_bounds__(W * 32, kMinBlocks) void moe_packed_large_kernel(MoeFp4Args a) {
  constexpr int NW = F::kWords;
  constexpr int kTile = NT * 8;
  pdl_prologue();
  if (int(blockIdx.y) >= *a.num_tiles) return;
  const int* td = a.tiles + 4 * blockIdx.y;
  const int e = td[0], begin = td[1], count = td[2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rt0 = kGateUp ? blockIdx.x * W + warp : 2 * (blockIdx.x * W + warp);
  const WarpRows w = warp_rows<F, kGateUp>(a, e, rt0, lane);
  const int KS = (kGateUp ? a.ex.gate[e] : a.ex.down[e]).k_slabs;
  const int k = kGateUp ? a.ex.hidden : a.ex.inter;
  const int32_t* pairs = a.sorted_pairs + begin;

  extern __shared__ uint4 smem_raw[];
  LargeStage<F, W, NT>* stage = reinterpret_cast<LargeStage<F, W, NT>*>(smem_raw);
  __shared__ int64_t xrow[kTile];
  for (int col = threadIdx.x; col < kTile; col += W * 32) {
    int64_t r = -1;
    if (col < count) {
      const int p = pairs[col];
      r = int64_t(kGateUp ? p / a.K : p) * a.x_ld;
    }
    xrow[col] = r;
  }
  __syncthreads();
  // The lane's scale source: lanes 0-3 copy tile 0's 64 bytes, lanes 4-7 tile 1's.
  const uint4* scale_src = !F::kSlabScale && lane < 8
                               ? reinterpret_cast<const uint4*>((lane < 4 ? w.s0 : w.s1) - lane) + (lane & 3)
                               : nullptr;
  const bool scale_ok = lane < 4 ? w.ok0 : w.ok1;
  // The token tile's loads: thread i copies chunk (i % 8) of rows i / 8 + r * kRowsPerPass, so its
  // source rows and shared-memory slots are fixed for the whole k loop (worked out once here).
  constexpr int kThreads = W * 32, kRowsPerPass = kThreads / kChunks, kPasses = kTile / kRowsPerPass;
  static_assert(kTile % kRowsPerPass == 0, "token tile rows must split evenly over the passes");
  const int ch = threadIdx.x % kChunks;
  const bf16_t* src[kPasses];
  int slot[kPasses];
#pragma unroll
  for (int r = 0; r < kPasses; ++r) {
    const int n = threadIdx.x / kChunks + r * kRowsPerPass;
    src[r] = xrow[n] >= 0 ? a.x + xrow[n] + ch * 8 : nullptr;
    slot[r] = n * kChunks + (ch ^ (n & 7));
  }
  auto load_stage = [&](int ks, int buf) {
    LargeStage<F, W, NT>& st = stage[buf];
    const bool in_k = ks * kSlabK + ch * 8 < k;
#pragma unroll
    for (int r = 0; r < kPasses; ++r) {
      if (src[r] && in_k) cp_async16(smem_addr(&st.x[slot[r]]), src[r] + ks * kSlabK);
      else st.x[slot[r]] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      if (w.ok0) cp_async16(smem_addr(&st.codes[warp][0][i * 32 + lane]), w.q0 + (ks * NW + i) * 32);
      if (w.ok1) cp_async16(smem_addr(&st.codes[warp][1][i * 32 + lane]), w.q1 + (ks * NW + i) * 32);
    }
    if constexpr (!F::kSlabScale)
      if (lane < 8 && scale_ok)  // 64 bytes of scales a slab
        cp_async16(smem_addr(&st.scales[warp][lane >> 2][lane & 3]), scale_src + ks * 4);
  };

  const int n_tiles = (count + 7) / 8;  // n8 tiles holding tokens (warp-uniform)
  float acc0[NT][4], acc1[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc0[t][i] = acc1[t][i] = 0.f;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < KS) load_stage(st, st);
    cp_async_commit();
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int ks = 0; ks < KS; ++ks) {
    float f0 = 0.f, f1 = 0.f;  // FP8: the slab's scales (issued before the wait)
    if constexpr (F::kSlabScale) {
      if (w.ok0) f0 = w.f0[ks];
      if (w.ok1) f1 = w.f1[ks];
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();  // slab ks has landed for every thread; slab ks-1's buffer is free
    if (ks + kStages - 1 < KS) load_stage(ks + kStages - 1, (ks + kStages - 1) % kStages);
    cp_async_commit();
    const LargeStage<F, W, NT>& st = stage[ks % kStages];
    uint4 cw0[NW], cw1[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      cw0[i] = w.ok0 ? st.codes[warp][0][i * 32 + lane] : zero;
      cw1[i] = w.ok1 ? st.codes[warp][1][i * 32 + lane] : zero;
    }
    // The 4 n8 tiles from t0 on, as the mma's B fragments (tiles past `count` hold zero tokens).
    auto tile_group = [&](int t0, uint4 (&xa)[4], uint4 (&xb)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = (t0 + i) * 8 + g;
        xa[i] = st.x[n * kChunks + ((2 * c) ^ g)];
        xb[i] = st.x[n * kChunks + ((2 * c + 1) ^ g)];
      }
    };
    if constexpr (F::kSlabScale) {
      // One operand at a time (FP8's A fragments and the slab's partial sums take twice the
      // registers): a group's partial sums, then times the slab's scale into the accumulators.
#pragma unroll
      for (int op = 0; op < 2; ++op) {
        uint32_t A[4][4];
        F::decode(op == 0 ? cw0 : cw1, 0u, A);
        const float f = op == 0 ? f0 : f1;
#pragma unroll
        for (int t0 = 0; t0 < NT; t0 += 4) {
          if (t0 < n_tiles) {
            uint4 xa[4], xb[4];
            tile_group(t0, xa, xb);
            float p[4][4] = {};
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const uint4& xv = j < 2 ? xa[i] : xb[i];
                mma_bf16(p[i], A[j], (j & 1) ? xv.z : xv.x, (j & 1) ? xv.w : xv.y);
              }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                float& d = op == 0 ? acc0[t0 + i][r] : acc1[t0 + i][r];
                d = fmaf(p[i][r], f, d);
              }
          }
        }
      }
    } else {
      const uint16_t* sc = reinterpret_cast<const uint16_t*>(&st.scales[warp][0][0]);
      uint32_t A0[4][4], A1[4][4];
      F::decode(cw0, w.ok0 ? sc[lane] : 0u, A0);
      F::decode(cw1, w.ok1 ? sc[32 + lane] : 0u, A1);
      // Groups of 4 n8 tiles without a branch per tile, k steps outer: consecutive mma go to
      // different accumulators, so they need not wait for each other (each accumulator still
      // sums its k steps in order).
#pragma unroll
      for (int t0 = 0; t0 < NT; t0 += 4) {
        if (t0 < n_tiles) {
          uint4 xa[4], xb[4];
          tile_group(t0, xa, xb);
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const uint4& xv = j < 2 ? xa[i] : xb[i];
              const uint32_t b0 = (j & 1) ? xv.z : xv.x, b1 = (j & 1) ? xv.w : xv.y;
              mma_bf16(acc0[t0 + i], A0[j], b0, b1);
              mma_bf16(acc1[t0 + i], A1[j], b0, b1);
            }
        }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int t = 0; t < NT; ++t)
    if (t < n_tiles) store_tile<kGateUp>(a, e, rt0, t * 8, count, pairs, acc0[t], acc1[t], lane);
}

using SmallKernel = void (*)(MoeFp4Args);
struct SmallShape {
  int warps, unroll, min_blocks;
};
struct SmallVariant {
  SmallShape gate_shape, down_shape;
  SmallKernel gate_up, down;
};
template <class F, int W, int U, int B>
constexpr SmallKernel gate_up_kernel = moe_packed_small_kernel<F, true, W, U, B>;
template <class F, int W, int U, int B>
constexpr SmallKernel down_kernel = moe_packed_small_kernel<F, false, W, U, B>;
// (warps, unroll, min blocks per SM) of the gate/up and of the down kernel. By default
// (kAutoVariant) steps of up to 2 tokens run kFewTokensVariant and longer ones
// kManyTokensVariant, the fastest on the H200 at those sizes (docs/perf.md, v8). Both split k
// over 4 warps the same way, so a token's output bits do not depend on which of the two ran.
// The same shapes for both formats (one plan and one tuned choice apply to either).
template <class F>
constexpr SmallVariant kSmallVariantsOf[] = {
    {{4, 2, 1}, {4, 2, 1}, gate_up_kernel<F, 4, 2, 1>, down_kernel<F, 4, 2, 1>},
    {{4, 4, 1}, {4, 4, 1}, gate_up_kernel<F, 4, 4, 1>, down_kernel<F, 4, 4, 1>},
    {{4, 2, 1}, {8, 1, 1}, gate_up_kernel<F, 4, 2, 1>, down_kernel<F, 8, 1, 1>},
    {{4, 2, 1}, {16, 1, 1}, gate_up_kernel<F, 4, 2, 1>, down_kernel<F, 16, 1, 1>},
    {{4, 2, 6}, {4, 2, 6}, gate_up_kernel<F, 4, 2, 6>, down_kernel<F, 4, 2, 6>},
    {{4, 2, 8}, {4, 2, 8}, gate_up_kernel<F, 4, 2, 8>, down_kernel<F, 4, 2, 8>},
    {{4, 1, 8}, {4, 1, 8}, gate_up_kernel<F, 4, 1, 8>, down_kernel<F, 4, 1, 8>},
    {{8, 2, 1}, {8, 1, 1}, gate_up_kernel<F, 8, 2, 1>, down_kernel<F, 8, 1, 1>},
    // d1's and d7's gate/up beside d0's down kernel (d1's own down kernel, at 143 registers three
    // blocks an SM, takes two waves for the 35B's 576 blocks; d7's is 8w/u1): d9 is the fastest
    // at one token on the 35B (docs/perf.md, issue 32, stop 54).
    {{4, 4, 1}, {4, 2, 1}, gate_up_kernel<F, 4, 4, 1>, down_kernel<F, 4, 2, 1>},
    {{8, 2, 1}, {4, 2, 1}, gate_up_kernel<F, 8, 2, 1>, down_kernel<F, 4, 2, 1>},
};
// (Gate/up with 8 slabs a warp in flight, one round trip at the 35B's widths, was measured and
// never chosen: docs/perf.md, issue 32's second session.)
constexpr const SmallVariant (&kSmallVariants)[10] = kSmallVariantsOf<Nvfp4Slabs>;  // shapes and names
constexpr int kFewTokensVariant = 0, kManyTokensVariant = 6;  // 4 warps split k in both
int small_variant_for(const MoeFp4Plan& plan, int T) {
  if (plan.small_variant >= 0) return plan.small_variant;
  for (const auto& [max_t, v] : plan.small_table)
    if (T <= max_t) return v;
  if (!plan.small_table.empty()) return plan.small_table.back().second;
  return T <= 2 ? kFewTokensVariant : kManyTokensVariant;
}

}  // namespace

SmallShapes packed::small_shapes_for(const MoeFp4Plan& plan, int T) {
  const SmallVariant& v = kSmallVariants[small_variant_for(plan, T)];
  return {v.gate_shape.warps, v.gate_shape.unroll, v.down_shape.warps, v.down_shape.unroll};
}

namespace {

template <class F>
void launch_small(int variant, MoeFp4Args a, dim3 gate_grid, dim3 down_grid, const bf16_t* h, int inter,
                  cudaStream_t s) {
  const SmallVariant& v = kSmallVariantsOf<F>[variant];
  launch(v.gate_up, gate_grid, v.gate_shape.warps * 32, 0, s, a);
  FATHOM_CUDA_LAUNCH_CHECK();
  a.x = h;
  a.x_ld = inter;
  launch(v.down, down_grid, v.down_shape.warps * 32, 0, s, a);
  FATHOM_CUDA_LAUNCH_CHECK();
}

struct LargeVariant {
  int warps, stages, tile_tokens, min_blocks;
  int gate_rows_tiles, down_row_tiles;  // row tiles a block covers
  SmallKernel gate_up, down;
  size_t smem;
  bool wgmma = false;  // moe_packed_wgmma.cu's kernels (gate_up/down/smem from wgmma_expert_kernels)
};
template <class F, int W, int S, int NT, int B = 1>
constexpr LargeVariant large_variant() {
  return {W,
          S,
          NT * 8,
          B,
          W,
          2 * W,
          moe_packed_large_kernel<F, true, W, S, NT, B>,
          moe_packed_large_kernel<F, false, W, S, NT, B>,
          large_smem_bytes<F, W, S, NT>()};
}
// The first is the default: capped at 128 registers so 4 blocks fit an SM, 211 against 197
// TFLOP/s uncapped at 4,096 tokens (docs/perf.md, v8). 128-token tiles, as 2 or 1 row tiles a
// warp, measured slower: fewer warps fit.
// p4: NVFP4 on wgmma (SM90, moe_packed_wgmma.cu); FP8 has no wgmma form and runs p0's kernels
// there (FP8 experts are not tuned; the entry keeps the lists parallel).
constexpr LargeVariant wgmma_variant() { return {8, 4, kWgmmaTileTokens, 2, 4, 8, nullptr, nullptr, 0, true}; }
template <class F>
constexpr LargeVariant wgmma_or_p0() {
  return F::kSlabScale ? large_variant<F, 4, 3, 8, 4>() : wgmma_variant();
}
template <class F>
constexpr LargeVariant kLargeVariantsOf[] = {large_variant<F, 4, 3, 8, 4>(), large_variant<F, 4, 3, 8>(),
                                             large_variant<F, 4, 4, 8>(), large_variant<F, 8, 3, 8>(),
                                             wgmma_or_p0<F>()};
constexpr int kNumLargeVariants = 5;
constexpr const LargeVariant (&kLargeVariants)[kNumLargeVariants] = kLargeVariantsOf<Nvfp4Slabs>;  // shapes, names
static_assert(sizeof(kLargeVariantsOf<Fp8Slabs>) == sizeof(kLargeVariants), "one variant list per format");
const LargeVariant& large_variant_of(PackedFormat f, int v) {
  return f == PackedFormat::Fp8 ? kLargeVariantsOf<Fp8Slabs>[v] : kLargeVariants[v];
}

template <class F>
void launch_large(int variant, MoeFp4Args a, int gate_tiles, int down_tiles, int max_tiles, const bf16_t* h, int inter,
                  cudaStream_t s) {
  LargeVariant v = kLargeVariantsOf<F>[variant];
  if (v.wgmma) {
    FATHOM_CHECK(wgmma_available(), "moe_fp4: prefill variant p", variant,
                 " needs an SM90 GPU and sm_90a code (wgmma)");
    const WgmmaExpertKernels k = wgmma_expert_kernels();
    v.gate_up = k.gate_up;
    v.down = k.down;
    v.smem = k.smem;
  }
  allow_dynamic_smem(reinterpret_cast<const void*>(v.gate_up), int(v.smem));
  allow_dynamic_smem(reinterpret_cast<const void*>(v.down), int(v.smem));
  launch(v.gate_up, dim3((gate_tiles + v.gate_rows_tiles - 1) / v.gate_rows_tiles, max_tiles), v.warps * 32, v.smem, s,
         a);
  FATHOM_CUDA_LAUNCH_CHECK();
  a.x = h;
  a.x_ld = inter;
  launch(v.down, dim3((down_tiles + v.down_row_tiles - 1) / v.down_row_tiles, max_tiles), v.warps * 32, v.smem, s, a);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace

std::string moe_fp4_small_variant_id(int v) { return "d" + std::to_string(v); }
std::string moe_fp4_large_variant_id(int v) { return "p" + std::to_string(v); }
int moe_fp4_fixed_small_variant(int T) { return T <= 2 ? kFewTokensVariant : kManyTokensVariant; }
void check_moe_fp4_plan(const MoeFp4Plan& plan) {
  for (const auto& [t, v] : plan.small_table)
    FATHOM_CHECK(v >= 0 && v < moe_fp4_small_variants(), "moe_fp4: no small-kernel variant ", v);
  FATHOM_CHECK(std::is_sorted(plan.small_table.begin(), plan.small_table.end()),
               "moe_fp4: the decode variants' table must be in ascending step sizes");
  FATHOM_CHECK(plan.small_variant < moe_fp4_small_variants(), "moe_fp4: no small-kernel variant ", plan.small_variant);
  FATHOM_CHECK(plan.large_variant >= 0 && plan.large_variant < moe_fp4_large_variants(),
               "moe_fp4: no prefill-kernel variant ", plan.large_variant);
}

int moe_fp4_large_variants() { return int(sizeof(kLargeVariants) / sizeof(kLargeVariants[0])); }
size_t moe_fp4_large_variant_smem(int v) {
  return kLargeVariants[v].wgmma ? wgmma_expert_kernels().smem : kLargeVariants[v].smem;
}
bool moe_fp4_large_variant_needs_wgmma(int v) { return kLargeVariants[v].wgmma; }
std::string moe_fp4_large_variant_name(int v) {
  return std::string("prefill ") + (kLargeVariants[v].wgmma ? "wgmma " : "") + std::to_string(kLargeVariants[v].warps) +
         "w/" + std::to_string(kLargeVariants[v].stages) + "st/" + std::to_string(kLargeVariants[v].tile_tokens) +
         "tok/b" + std::to_string(kLargeVariants[v].min_blocks);
}

int moe_fp4_small_variants() { return int(sizeof(kSmallVariants) / sizeof(kSmallVariants[0])); }
std::string moe_fp4_small_variant_name(int v) {
  auto name = [](const SmallShape& sh) {
    return std::to_string(sh.warps) + "w/u" + std::to_string(sh.unroll) + "/b" + std::to_string(sh.min_blocks);
  };
  return "gate " + name(kSmallVariants[v].gate_shape) + " down " + name(kSmallVariants[v].down_shape);
}

// FATHOM_MOE_FP4_SMALL_PAIRS=n: average pairs per expert up to which steps longer than
// kMoeFp4SmallT still run the decode-shaped kernels (0: by T alone).
int moe_fp4_small_pairs_per_expert() {
  static const int n = [] {
    const char* v = std::getenv("FATHOM_MOE_FP4_SMALL_PAIRS");
    return v ? std::max(0, std::atoi(v)) : kMoeFp4SmallPairsPerExpert;
  }();
  return n;
}

// FATHOM_MOE_PREFETCH_DESCRIPTORS=0 turns prefetch_expert_descriptors off (A/B measurements).
static bool moe_prefetch_descriptors() {
  static const bool on = [] {
    const char* v = std::getenv("FATHOM_MOE_PREFETCH_DESCRIPTORS");
    return !v || std::atoi(v) != 0;
  }();
  return on;
}

// Few tokens per expert (a decode step, or one with a prefill chunk beside it): the 8-token
// tiles, which read each expert once per 8 of its tokens; the 64-token tiles compute all 64
// columns however few tokens an expert has.
static bool small_tiles(const PackedExperts& ex, int T, int K) {
  return T <= kMoeFp4SmallT || int64_t(T) * K <= int64_t(moe_fp4_small_pairs_per_expert()) * ex.num;
}

int moe_fp4_tile_tokens(const PackedExperts& ex, int T, int K, const MoeFp4Plan& plan) {
  FATHOM_CHECK(plan.large_variant >= 0 && plan.large_variant < moe_fp4_large_variants(),
               "moe_fp4: no prefill-kernel variant ", plan.large_variant);
  return small_tiles(ex, T, K) ? kSmallTile : large_variant_of(ex.format, plan.large_variant).tile_tokens;
}

void moe_experts_packed(const PackedExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                     bf16_t* h, float* pair_out, float* y, int T, int K, const float* shared, const float* shared_gate,
                     int64_t gate_ld, const MoeGroupScratch& g, cudaStream_t s, const MoeFp4Plan& plan, bool grouped) {
  if (T == 0) return;
  FATHOM_CHECK(ex.hidden % 8 == 0 && ex.inter % 8 == 0, "moe_experts_packed: hidden ", ex.hidden, " and inter ",
               ex.inter, " must be multiples of 8");
  const int P = T * K;
  const bool small = small_tiles(ex, T, K);
  const int tile = moe_fp4_tile_tokens(ex, T, K, plan);
  if (!grouped) moe_group_pairs(topk_ids, P, ex.num, g, tile, s);
  const int max_tiles = std::min(ex.num, P) + P / tile;
  const int gate_tiles = (ex.inter + kTileRows - 1) / kTileRows, down_tiles = (ex.hidden + kTileRows - 1) / kTileRows;
  MoeFp4Args a{ex, x, ex.hidden, K, g.sorted_pairs, g.tiles, g.num_tiles, topk_w, h, pair_out,
               moe_prefetch_descriptors()};
  const int variant = small ? small_variant_for(plan, T) : plan.large_variant;
  FATHOM_CHECK(!small || (variant >= 0 && variant < moe_fp4_small_variants()), "moe_fp4: no small-kernel variant ", variant);
  const bool fp8 = ex.format == PackedFormat::Fp8;
  const dim3 gate_grid(gate_tiles, max_tiles), down_grid((down_tiles + 1) / 2, max_tiles);
  if (small) {
    (fp8 ? launch_small<Fp8Slabs> : launch_small<Nvfp4Slabs>)(variant, a, gate_grid, down_grid, h, ex.inter, s);
  } else {
    // The wgmma kernels address x and h with 32-bit element offsets.
    FATHOM_CHECK(!large_variant_of(ex.format, variant).wgmma ||
                     (int64_t(T) * ex.hidden < 0xFFFFFFFFll && int64_t(P) * ex.inter < 0xFFFFFFFFll),
                 "moe_fp4: prefill variant p", variant, " takes steps of < 2^32 elements of x and h; ", T,
                 " tokens x ", K, " experts x ", ex.inter, " are more");
    (fp8 ? launch_large<Fp8Slabs> : launch_large<Nvfp4Slabs>)(variant, a, gate_tiles, down_tiles, max_tiles, h,
                                                               ex.inter, s);
  }
  if (backend_faults_enabled())  // the variant's name is built only when faults are injected
    inject_backend_fault(small ? kMoeFp4DecodeOp : kMoeFp4PrefillOp,
                         (small ? moe_fp4_small_variant_id(variant) : moe_fp4_large_variant_id(variant)).c_str(),
                         pair_out, size_t(P) * ex.hidden * 4, s);
  if (y) moe_combine_pairs(pair_out, y, T, K, ex.hidden, shared, shared_gate, gate_ld, s);
}

}  // namespace fathom::cuda
