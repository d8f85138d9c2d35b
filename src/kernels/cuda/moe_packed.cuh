// The packed expert formats as the tensor-core kernels see them (moe_packed.cu: mma.sync, every
// GPU; moe_packed_wgmma.cu: wgmma, SM90): decoding a lane's 16-byte slab of NVFP4 or FP8 codes
// into bf16 A fragments of the m16n8k16 layout (mma.sync's; the wgmma kernels take the same
// fragments from other lanes' bytes and decode them themselves, with the same exact products),
// the kernels' arguments, and the write of a tile's results (SwiGLU into h, or weighted rows
// into pair_out).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda::packed {

constexpr int kSlabK = kPackedSlabK;        // k per slab
constexpr int kTileRows = kPackedTileRows;  // rows per slab (the mma's M)

// ---- decoding and the mma

// Nibbles 3 and 7 of q as a bf16 pair of value * 2^-126 (the E2M1 exponent and mantissa bits
// put into the bf16 exponent's low bits; code 1 becomes a bf16 subnormal, which bf16 math keeps).
__device__ __forceinline__ uint32_t fp4x2_raw(uint32_t q) { return (q & 0x80008000u) | ((q >> 6) & 0x01C001C0u); }

// Exact product of bf16 pairs (an E2M1 value times an e4m3 scale has at most 5 significant bits).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t byte) {
  const uint32_t b = (byte << 4) + 0x7000u;
  return b | (b << 16);
}

// One k16 step: the word's 8 codes (rows g and g+8) times their scales -> A fragment registers
// (value * scale * 2^-8).
__device__ __forceinline__ void decode_step(uint32_t q, uint32_t s_lo, uint32_t s_hi, uint32_t (&a)[4]) {
  a[0] = mul_bf16x2(fp4x2_raw(q << 12), s_lo);  // a0, a1: row g
  a[1] = mul_bf16x2(fp4x2_raw(q << 8), s_hi);   // a2, a3: row g + 8
  a[2] = mul_bf16x2(fp4x2_raw(q << 4), s_lo);   // a4, a5: row g
  a[3] = mul_bf16x2(fp4x2_raw(q), s_hi);        // a6, a7: row g + 8
}

// Decodes a slab (16 B of codes, 2 scale bytes) into the A fragments of its 4 k16 steps.
__device__ __forceinline__ void decode_slab(uint4 w, uint32_t sc, uint32_t (&a)[4][4]) {
  const uint32_t s_lo = scale_bf16x2(sc & 0xFF), s_hi = scale_bf16x2(sc >> 8);
  decode_step(w.x, s_lo, s_hi, a[0]);
  decode_step(w.y, s_lo, s_hi, a[1]);
  decode_step(w.z, s_lo, s_hi, a[2]);
  decode_step(w.w, s_lo, s_hi, a[3]);
}

// acc += slab x (the lane's 16 activations xa | xb at k 16c .. 16c+15 of its token).
__device__ __forceinline__ void mma_slab(const uint32_t (&a)[4][4], uint4 xa, uint4 xb, float (&acc)[4]) {
  mma_bf16(acc, a[0], xa.x, xa.y);
  mma_bf16(acc, a[1], xa.z, xa.w);
  mma_bf16(acc, a[2], xb.x, xb.y);
  mma_bf16(acc, a[3], xb.z, xb.w);
}

// E4M3 bytes 0 and 2 (lo) or 1 and 3 (hi) of a word as a bf16 pair of value * 2^-120: the sign
// to bit 15, exponent and mantissa to bits 4-10 (e4m3 subnormals become bf16 subnormals).
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t w) { return ((w << 8) & 0x80008000u) | ((w << 4) & 0x07F007F0u); }
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t w) { return (w & 0x80008000u) | ((w >> 4) & 0x07F007F0u); }
constexpr uint32_t kBf16x2Pow120 = 0x7B807B80u;  // 2^120 in both halves: the codes' exact values

// The two formats as the kernels see them: kWords 16-byte code loads a lane and slab; NVFP4 has
// a scale word a lane (decoded into A), FP8 a scale a slab (applied to the slab's fp32 sums).
struct Nvfp4Slabs {
  static constexpr int kWords = 1;
  static constexpr bool kSlabScale = false;
  __device__ static void decode(const uint4 (&w)[1], uint32_t lane_scale, uint32_t (&a)[4][4]) {
    decode_slab(w[0], lane_scale, a);
  }
};
struct Fp8Slabs {
  static constexpr int kWords = 2;
  static constexpr bool kSlabScale = true;
  __device__ static void step(uint32_t w0, uint32_t w1, uint32_t (&a)[4]) {
    a[0] = mul_bf16x2(e4m3x2_lo(w0), kBf16x2Pow120);  // a0, a1: row g
    a[1] = mul_bf16x2(e4m3x2_hi(w0), kBf16x2Pow120);  // a2, a3: row g + 8
    a[2] = mul_bf16x2(e4m3x2_lo(w1), kBf16x2Pow120);  // a4, a5: row g
    a[3] = mul_bf16x2(e4m3x2_hi(w1), kBf16x2Pow120);  // a6, a7: row g + 8
  }
  __device__ static void decode(const uint4 (&w)[2], uint32_t, uint32_t (&a)[4][4]) {
    step(w[0].x, w[0].y, a[0]);
    step(w[0].z, w[0].w, a[1]);
    step(w[1].x, w[1].y, a[2]);
    step(w[1].z, w[1].w, a[3]);
  }
};

// acc += the slab's product, times its scale for FP8 (fp32 partial sums of the slab first).
template <class F>
__device__ __forceinline__ void accumulate_slab(const uint32_t (&a)[4][4], uint4 xa, uint4 xb, float slab_scale,
                                                float (&acc)[4]) {
  if constexpr (F::kSlabScale) {
    float p[4] = {0.f, 0.f, 0.f, 0.f};
    mma_slab(a, xa, xb, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = fmaf(p[i], slab_scale, acc[i]);
  } else {
    mma_slab(a, xa, xb, acc);
  }
}

struct MoeFp4Args {
  PackedExperts ex;
  const bf16_t* x;  // gate/up: token rows [T, hidden]; down: h rows [T*K, inter]
  int64_t x_ld;
  int K;            // experts per token (gate/up: the x row of pair p is p / K)
  const int32_t* sorted_pairs;
  const int32_t* tiles;
  const int32_t* num_tiles;
  const float* topk_w;
  bf16_t* h;        // gate/up output
  float* pair_out;  // down output
  bool prefetch_descriptors = false;  // the decode gate/up kernel warms L2 with every expert's descriptors
};

// Asks L2 for the lines of the experts' gate, up and down descriptors, spread over the grid's
// threads (a line each). A decode step streams gigabytes of weights, so a layer's descriptors are
// long gone from L2 when its routing picks experts; fetched while the routing runs, the expert
// kernels' chain tile -> descriptor -> weights loses a DRAM round trip.
__device__ __forceinline__ void prefetch_expert_descriptors(const PackedExperts& ex) {
  constexpr int kLine = 128;
  const int64_t bytes = int64_t(ex.num) * int64_t(sizeof(PackedMatrix));
  const int64_t lines = (bytes + kLine - 1) / kLine;
  const int64_t i = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= 3 * lines) return;
  const PackedMatrix* arrays[3] = {ex.gate, ex.up, ex.down};
  prefetch_l2(reinterpret_cast<const char*>(arrays[i / lines]) + (i % lines) * kLine);
}

// The two A operands of a warp: gate and up row tile rt (SwiGLU needs both at the same rows),
// or down row tiles rt and rt + 1.
struct WarpRows {
  const uint4* q0;
  const uint4* q1;
  const uint16_t* s0;  // NVFP4: the lane's scale words
  const uint16_t* s1;
  const float* f0;     // FP8: the row tile's slab scales
  const float* f1;
  bool ok0, ok1;
};

template <class F, bool kGateUp>
__device__ __forceinline__ WarpRows warp_rows(const MoeFp4Args& a, int e, int rt0, int lane) {
  const PackedMatrix& A0 = kGateUp ? a.ex.gate[e] : a.ex.down[e];
  const PackedMatrix& A1 = kGateUp ? a.ex.up[e] : a.ex.down[e];
  const int rt1 = kGateUp ? rt0 : rt0 + 1;
  WarpRows w;
  w.ok0 = rt0 < A0.row_tiles;
  w.ok1 = rt1 < A1.row_tiles;
  const int64_t t0 = int64_t(w.ok0 ? rt0 : 0) * A0.k_slabs, t1 = int64_t(w.ok1 ? rt1 : 0) * A1.k_slabs;
  w.q0 = reinterpret_cast<const uint4*>(A0.codes) + t0 * 32 * F::kWords + lane;
  w.q1 = reinterpret_cast<const uint4*>(A1.codes) + t1 * 32 * F::kWords + lane;
  w.s0 = w.s1 = nullptr;
  w.f0 = w.f1 = nullptr;
  if constexpr (F::kSlabScale) {
    w.f0 = A0.slab_scales + t0;
    w.f1 = A1.slab_scales + t1;
  } else {
    w.s0 = A0.scales + t0 * 32 + lane;
    w.s1 = A1.scales + t1 * 32 + lane;
  }
  return w;
}

// Writes a warp's results for one n8 tile: v0/v1 are the two operands' accumulators (rows g and
// g + 8, token columns 2c and 2c + 1 of the tile, counted from `col0`).
template <bool kGateUp>
__device__ __forceinline__ void store_tile(const MoeFp4Args& a, int e, int rt0, int col0, int count,
                                           const int32_t* pairs, const float v0[4], const float v1[4], int lane) {
  const int g = lane >> 2, c = lane & 3;
  if (kGateUp) {
    const PackedMatrix& G = a.ex.gate[e];
    const float gg = G.global, gu = a.ex.up[e].global;
    const int I = a.ex.inter;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = col0 + 2 * c + (i & 1), row = rt0 * kTileRows + g + (i >> 1) * 8;
      if (col < count && row < I) {
        const int p = pairs[col];
        a.h[int64_t(p) * I + row] = to_bf(silu_f(v0[i] * gg) * (v1[i] * gu));
      }
    }
  } else {
    const PackedMatrix& D = a.ex.down[e];
    const float gd = D.global;
    const int H = a.ex.hidden;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = col0 + 2 * c + (i & 1);
      if (col >= count) continue;
      const int p = pairs[col];
      const float w = a.topk_w[p] * gd;
      const int r0 = rt0 * kTileRows + g + (i >> 1) * 8, r1 = r0 + kTileRows;
      if (r0 < H) a.pair_out[int64_t(p) * H + r0] = v0[i] * w;
      if (r1 < H) a.pair_out[int64_t(p) * H + r1] = v1[i] * w;
    }
  }
}

// moe_packed_wgmma.cu: the prefill GEMMs on wgmma (NVFP4, sm_90a): 8 warps a block, tiles of
// kWgmmaTileTokens tokens, 4 and 8 row tiles a block (gate/up, down), two blocks an SM.
inline constexpr int kWgmmaTileTokens = 128;
struct WgmmaExpertKernels {
  void (*gate_up)(MoeFp4Args);
  void (*down)(MoeFp4Args);
  size_t smem;  // dynamic shared memory a block
};
WgmmaExpertKernels wgmma_expert_kernels();  // usable where wgmma_available() (backend_switches.h)

}  // namespace fathom::cuda::packed
