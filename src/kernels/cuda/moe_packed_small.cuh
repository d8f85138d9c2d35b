// The decode-shaped expert kernel's work (moe_packed.cu), as device functions shared with the
// one-token MoE launch (moe_decode_fused.cu), so that both compute a tile with the same bits.
//
// A work item = one pair of row tiles (gate and up at row tile rt, or down row tiles 2rt and
// 2rt + 1) x one tile of <= 8 tokens; its W warps split k (warp w takes slabs w, w + W, ...) and
// their sums are added in warp order, so the result of a token depends only on the shapes and W.
// Each warp has U slabs of loads in flight.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_packed.cuh"

namespace fathom::cuda::packed {

template <class F, int U>
struct SlabLoads {
  uint4 w0[U][F::kWords], w1[U][F::kWords];
  uint32_t s0[U], s1[U];  // NVFP4: the lane's scale words
  float f0[U], f1[U];     // FP8: the slabs' scales
};

// Tile `tile` of the grouping (a.tiles, a.sorted_pairs) at row-tile index `rt` (gate/up: rt;
// down: the pair 2rt, 2rt + 1). `ok` false: an item past the work, which loads and stores nothing.
struct SmallItem {
  int e, rt0, count;
  const int32_t* pairs;
  bool ok;
};
template <bool kGateUp>
__device__ __forceinline__ SmallItem small_item(const MoeFp4Args& a, int tile, int rt, bool ok) {
  const int* td = a.tiles + 4 * tile;
  SmallItem it;
  it.ok = ok;
  it.e = ok ? td[0] : 0;
  it.count = ok ? td[2] : 0;
  it.pairs = a.sorted_pairs + (ok ? td[1] : 0);
  it.rt0 = kGateUp ? rt : 2 * rt;
  return it;
}

// Warp `warp` (of the item's W) of an item: its partial sums of both operands, into red[warp]
// (8 x 32 floats: acc0 then acc1 by lane). `after_first_loads()` runs once the first U slabs'
// weights are requested, before any activation is read (the down kernel waits for the gate/up
// results there; every warp calls it, with or without work). kL2: the activations are read
// through L2 only (ld.cg), for a launch whose other blocks wrote them (moe_decode_fused's h).
template <class F, bool kGateUp, int W, int U, bool kL2 = false, class Hook>
__device__ __forceinline__ void small_item_partials(const MoeFp4Args& a, const SmallItem& it, int warp, int lane,
                                                    float (*red)[32], Hook&& after_first_loads) {
  const int g = lane >> 2, c = lane & 3;
  const WarpRows w = warp_rows<F, kGateUp>(a, it.e, it.rt0, lane);
  const int KS = it.ok ? (kGateUp ? a.ex.gate[it.e] : a.ex.down[it.e]).k_slabs : 0;
  const int k = kGateUp ? a.ex.hidden : a.ex.inter;
  const bool col_ok = g < it.count;
  // The x row is read beside the tile, not after the loads (one dependent load fewer before the
  // weights stream).
  const int32_t pair = col_ok ? it.pairs[g] : 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  constexpr int NW = F::kWords;
  SlabLoads<F, U> L;
  // The weights (and scales) of slabs base, base + W, ... (U of them; zeros past KS).
  auto load_weights = [&](int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ks = base + W * u;
#pragma unroll
      for (int i = 0; i < NW; ++i) L.w0[u][i] = L.w1[u][i] = zero;
      L.s0[u] = L.s1[u] = 0;
      L.f0[u] = L.f1[u] = 0.f;
      if (ks < KS) {
        if (w.ok0) {
#pragma unroll
          for (int i = 0; i < NW; ++i) L.w0[u][i] = load_stream(w.q0 + (ks * NW + i) * 32);
          if constexpr (F::kSlabScale) L.f0[u] = w.f0[ks];
          else L.s0[u] = w.s0[ks * 32];
        }
        if (w.ok1) {
#pragma unroll
          for (int i = 0; i < NW; ++i) L.w1[u][i] = load_stream(w.q1 + (ks * NW + i) * 32);
          if constexpr (F::kSlabScale) L.f1[u] = w.f1[ks];
          else L.s1[u] = w.s1[ks * 32];
        }
      }
    }
  };
  load_weights(warp);
  after_first_loads();
  const int64_t x_offset = col_ok ? int64_t(kGateUp ? pair / a.K : pair) * a.x_ld : 0;
  const bf16_t* xrow = a.x + x_offset;
  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
  for (int base = warp; base < KS; base += W * U) {
    if (base != warp) load_weights(base);
    uint4 xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      xa[u] = xb[u] = zero;
      const int ks = base + W * u, kx = ks * kSlabK + 16 * c;
      if (ks < KS && col_ok && kx < k) {
        const uint4* xp = reinterpret_cast<const uint4*>(xrow + kx);
        if constexpr (kL2) {
          xa[u] = __ldcg(xp);
          xb[u] = __ldcg(xp + 1);
        } else {
          xa[u] = xp[0];
          xb[u] = xp[1];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t A[4][4];
      F::decode(L.w0[u], L.s0[u], A);
      accumulate_slab<F>(A, xa[u], xb[u], L.f0[u], acc0);
      F::decode(L.w1[u], L.s1[u], A);
      accumulate_slab<F>(A, xa[u], xb[u], L.f1[u], acc1);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[i][lane] = acc0[i], red[4 + i][lane] = acc1[i];
}

// The item's first warp, after a barrier over its W warps' partials (red: W x 8 x 32 floats):
// their sums in warp order, stored (SwiGLU into h, or weighted rows into pair_out).
template <bool kGateUp, int W>
__device__ __forceinline__ void small_item_store(const MoeFp4Args& a, const SmallItem& it, float (*red)[8][32],
                                                 int lane) {
  if (!it.ok) return;
  float v0[4], v1[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v0[i] = red[0][i][lane];
    v1[i] = red[0][4 + i][lane];
#pragma unroll
    for (int ww = 1; ww < W; ++ww) v0[i] += red[ww][i][lane], v1[i] += red[ww][4 + i][lane];
  }
  store_tile<kGateUp>(a, it.e, it.rt0, 0, it.count, it.pairs, v0, v1, lane);
}

// The warps and slabs in flight of the decode kernels moe_experts_packed runs for a step of T
// tokens under `plan` (the tuned or fixed variant).
struct SmallShapes {
  int gate_warps, gate_unroll, down_warps, down_unroll;
};
SmallShapes small_shapes_for(const MoeFp4Plan& plan, int T);

}  // namespace fathom::cuda::packed
