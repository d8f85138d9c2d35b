// A one-token MoE block in one launch (issue 32): the router's fp32 product, the softmax + top-k,
// the routed experts' gate/up and their down product, as phases of one grid separated by
// grid-wide barriers instead of three kernels. At one token the chain route -> gate/up -> down
// was the costliest part of a decode step for its bytes (docs/perf.md, stop 54: 15.5 us a layer
// for 16 MB on the 35B): the experts' weights cannot be asked for before the routing launch has
// ended, and each boundary is a full drain of one grid and ramp of the next. Here a barrier is
// one atomic a block and a spin on one word, and the down product's first weights are asked for
// before the barrier that publishes h.
//
// Bits: each phase runs the code of the launch it replaces on the same work items (gemv_block's
// rows, topk_token_n, moe_packed_small.cuh's items with the plan's warp split), so the logits,
// picks, weights, h and pair_out equal moe_route + moe_experts_packed's
// (CudaFusedDecode.MoeOneTokenEqualsRouteThenExperts).
//
// Every block must be resident at once for the barriers: the grid is sized from the kernel's
// occupancy (and nothing this kernel waits for needs the SMs it holds: the kernel before it has
// started, the shared expert's kernels on the side stream do not wait for it, and kernels after
// it start only once all its blocks have).
//
// Measured slower than the chain on every Qwen3.5 shape (docs/perf.md, stop 72: +1.5-2% at the
// 35B's batch 1, +10% at the 397B's), so the runner takes it only with FATHOM_MOE_FUSED=1: a
// persistent block's round of items waits for its slowest item and holds its SM, where the
// chain's grids start a block wherever one drains; and the 397B's router (512 GEMV blocks) and
// expert phases take two and three rounds of the grid.
#include <algorithm>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_packed_small.cuh"
#include "kernels/cuda/moe_topk.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
using namespace packed;
namespace {

constexpr int kFusedWarps = 8, kFusedBlock = kFusedWarps * 32;
static_assert(kFusedBlock == kGemvBlock, "the router's rows are gemv_block's, at its block size");
constexpr int kMaxPicks = 32;  // experts a token (one warp's lanes hold the picks)

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t add_acq_rel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void add_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A barrier over the grid: bar[0] counts the blocks arrived (release: the block's writes, ordered
// before by the block barrier, go with it); the last to arrive zeroes it and advances
// bar[kBarrierPassed], which the others poll (acquire; polling every 32 ns measured the same). The
// words are then ready for the next barrier, and for the next launch whatever its grid.
__device__ __forceinline__ void grid_barrier(uint32_t* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* passed_word = bar + MoeGroupScratch::kBarrierPassed;
    const uint32_t passed = load_acquire(passed_word);
    if (add_acq_rel(bar, 1u) == gridDim.x - 1) {
      *reinterpret_cast<volatile uint32_t*>(bar) = 0u;
      add_release(passed_word, 1u);
    } else {
      while (load_acquire(passed_word) == passed) {
      }
    }
  }
  __syncthreads();
}

struct FusedMoeArgs {
  const float* router;
  const float* x32;
  float* logits;
  int E, H, G, K, router_blocks;
  bool renorm, staged;  // staged: each block's first router rows copied before the PDL wait (gemv.cuh)
  int32_t* ids;
  float* weights;
  MoeGroupScratch g;
  MoeFp4Args a;  // x: the token's bf16 row; h, pair_out: the outputs
};

// The work of one phase: items of W warps, kFusedWarps / W of them a block at a time; `hook`
// runs in the first round once the items' first weights are requested.
template <class F, bool kGateUp, int W, int U, class Hook>
__device__ __forceinline__ void run_items(const MoeFp4Args& a, int K, float (*red)[8][32], Hook&& hook) {
  constexpr int kAtOnce = kFusedWarps / W;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = kGateUp ? a.ex.inter : a.ex.hidden, tiles = (rows + kTileRows - 1) / kTileRows;
  const int rts = kGateUp ? tiles : (tiles + 1) / 2, items = K * rts;  // moe_experts_packed's grid.x
  for (int base = blockIdx.x * kAtOnce, first = 1; first || base < items; base += gridDim.x * kAtOnce, first = 0) {
    const int item = base + warp / W;
    const SmallItem it = small_item<kGateUp>(a, item / rts, item % rts, item < items);
    if (first)
      small_item_partials<F, kGateUp, W, U, true>(a, it, warp % W, lane, red[warp], hook);
    else
      small_item_partials<F, kGateUp, W, U, true>(a, it, warp % W, lane, red[warp], [] {});
    __syncthreads();
    if (warp % W == 0) small_item_store<kGateUp, W>(a, it, red + warp, lane);
    __syncthreads();
  }
}

template <class F, int WG, int UG, int WD, int UD, int N>
__global__ __launch_bounds__(kFusedBlock, 2) void moe_decode_fused_kernel(FusedMoeArgs f) {
  extern __shared__ __align__(128) uint4 stage[];
  __shared__ uint64_t stage_bar;
  __shared__ float red[kFusedWarps][8][32];
  __shared__ int32_t s_ids[kMaxPicks], s_pairs[kMaxPicks], s_tiles[4 * kMaxPicks], s_num_tiles;
  __shared__ float s_w[kMaxPicks];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (f.a.prefetch_descriptors) prefetch_expert_descriptors(f.a.ex);
  // 1. The router's logits: block vb of moe_route's GEMV grid (the first staged where it fits).
  for (int vb = blockIdx.x; vb < f.router_blocks; vb += gridDim.x) {
    const GemvStoreRows out{f.logits, f.E};
    if (f.staged && vb == int(blockIdx.x))
      gemv_block<float, 1, 1, GemvStoreRows, true>(f.router, f.x32, out, 1, f.E, f.H, f.G,
                                                   reinterpret_cast<float*>(stage), &stage_bar, vb);
    else
      gemv_block<float, 1, 1, GemvStoreRows, false>(f.router, f.x32, out, 1, f.E, f.H, f.G, nullptr, nullptr, vb);
    __syncthreads();  // gemv_block's partials are reused by the next
  }
  pdl_prologue();  // for the blocks without router rows (the others have waited)
  grid_barrier(f.g.barrier);
  // 2. Every block picks the token's experts itself (moe_route's one-token tail: a tile a pair, in
  // k order); block 0 also writes them where moe_route does.
  if (warp == 0) {
    const int e = topk_token_n<N>(f.logits, s_ids, s_w, 0, f.E, f.K, f.renorm);  // lane k's pick, or -1
    __syncwarp();
    if (lane < f.K) {
      const int id = e >= 0 ? e : s_ids[lane];
      s_pairs[lane] = lane;
      s_tiles[4 * lane] = id, s_tiles[4 * lane + 1] = lane, s_tiles[4 * lane + 2] = 1, s_tiles[4 * lane + 3] = 0;
      if (blockIdx.x == 0) {
        f.ids[lane] = id;
        f.weights[lane] = s_w[lane];
        f.g.sorted_pairs[lane] = lane;
        int32_t* t = f.g.tiles + 4 * lane;
        t[0] = id, t[1] = lane, t[2] = 1, t[3] = 0;
      }
    }
    if (lane == 0) {
      s_num_tiles = f.K;
      if (blockIdx.x == 0) *f.g.num_tiles = f.K;
    }
  }
  __syncthreads();
  MoeFp4Args a = f.a;
  a.sorted_pairs = s_pairs;
  a.tiles = s_tiles;
  a.num_tiles = &s_num_tiles;
  a.topk_w = s_w;
  // 3. gate/up into h.
  run_items<F, true, WG, UG>(a, f.K, red, [] {});
  // 4. down into pair_out; its first slabs are requested before the barrier that publishes h.
  a.x = f.a.h;
  a.x_ld = a.ex.inter;
  run_items<F, false, WD, UD>(a, f.K, red, [&] { grid_barrier(f.g.barrier); });
}

using FusedKernel = void (*)(FusedMoeArgs);

// The warp splits the fused form is built for: the fixed rule's at one token (d0, d4, d5: 4 warps
// of 2 slabs both) and the tuner's choice on the 35B (d9: 8 warps of 2, then 4 of 2).
template <class F>
FusedKernel fused_kernel_for(const SmallShapes& s, int E) {
  return for_topk_form(E, [&](auto n) -> FusedKernel {
    constexpr int N = decltype(n)::value;
    if (s.gate_unroll != 2 || s.down_warps != 4 || s.down_unroll != 2) return nullptr;
    if (s.gate_warps == 4) return moe_decode_fused_kernel<F, 4, 2, 4, 2, N>;
    if (s.gate_warps == 8) return moe_decode_fused_kernel<F, 8, 2, 4, 2, N>;
    return nullptr;
  });
}

}  // namespace

bool moe_decode_fused(const float* router, const float* x32, float* logits, int E, int H, int K, bool renorm,
                      const PackedExperts& ex, const bf16_t* x, int32_t* topk_ids, float* topk_w, bf16_t* h,
                      float* pair_out, const MoeGroupScratch& g, const MoeFp4Plan& plan, cudaStream_t s) {
  if (router == nullptr || E > kMaxExperts || K < 1 || K > E || K > kMaxPicks || H % 4 != 0 || ex.hidden != H ||
      ex.num != E || ex.hidden % 8 != 0 || ex.inter % 8 != 0 || !is_aligned(router, 16) || !is_aligned(x32, 16) ||
      !is_aligned(x, 16) || g.barrier == nullptr)
    return false;
  const bool fp8 = ex.format == PackedFormat::Fp8;
  const SmallShapes shapes = small_shapes_for(plan, 1);
  const FusedKernel kernel = fp8 ? fused_kernel_for<Fp8Slabs>(shapes, E) : fused_kernel_for<Nvfp4Slabs>(shapes, E);
  if (!kernel) return false;
  const int G = gemv_warps_per_row<float>(E, H);
  const int router_blocks = gemv_blocks(E, G, 1);
  const size_t stage = gemv_stage_bytes(G, 1, H, sizeof(float));
  const bool staged = gemv_staging_mode() >= 1 && stage <= kGemvStageMaxBytes;
  const size_t smem = staged ? stage : 0;
  // Every block resident (the barriers), at most two an SM (one measured slower: the expert items
  // then take two rounds).
  const int per_sm = std::min(resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kFusedBlock, smem), 2);
  if (per_sm < 1) return false;
  const int blocks = per_sm * multiprocessor_count();
  FusedMoeArgs f{router, x32, logits, E, H, G, K, router_blocks, renorm, staged, topk_ids, topk_w, g, {}};
  f.a = MoeFp4Args{ex, x, ex.hidden, K, nullptr, nullptr, nullptr, nullptr, h, pair_out, true};
  launch(kernel, blocks, kFusedBlock, smem, s, f);
  FATHOM_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace fathom::cuda
