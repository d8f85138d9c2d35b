// Gated DeltaNet: causal depthwise conv with carried state, the gated delta rule (recurrent
// form, state columns split over lanes in registers) and the gated RMSNorm of its output.
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include <cooperative_groups.h>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_conv_step.cuh"
#include "kernels/cuda/gdn_gate.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

template <int KC>
__global__ void gdn_conv_kernel(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state,
                                const int32_t* seq_start, const int32_t* state_slot, float* u, int conv_dim,
                                StateHistory hs) {
  pdl_prologue();
  const int s = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= conv_dim) return;
  float* st = conv_state + int64_t(state_slot[s]) * (KC - 1) * conv_dim;
  float* keep = hs.conv && hs.keep[s] ? hs.conv + int64_t(state_slot[s]) * hs.entries * (KC - 1) * conv_dim : nullptr;
  float w[KC], hist[KC - 1];
#pragma unroll
  for (int i = 0; i < KC; ++i) w[i] = conv_w[int64_t(c) * KC + i];
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) hist[i] = st[int64_t(i) * conv_dim + c];
  if (keep)
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) keep[int64_t(i) * conv_dim + c] = hist[i];
  for (int t = seq_start[s]; t < seq_start[s + 1]; ++t) {
    u[int64_t(t) * conv_dim + c] = conv_step<KC>(w, hist, mixed[int64_t(t) * mixed_ld + c]);
    if (keep) {
      float* e = keep + int64_t(t - seq_start[s] + 1) * (KC - 1) * conv_dim;
#pragma unroll
      for (int i = 0; i < KC - 1; ++i) e[int64_t(i) * conv_dim + c] = hist[i];
    }
  }
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) st[int64_t(i) * conv_dim + c] = hist[i];
}

// Long sequences (prefill): the same convolution with the tokens split into chunks of
// kConvChunk, one thread per (channel, chunk), each starting from the inputs just before its
// chunk (or the stored state); conv_step keeps a token's bits the same as on the one-pass path.
// The state is updated afterwards by
// gdn_conv_state_kernel (chunks must not see a state that another chunk already replaced).
constexpr int kConvChunk = 64;

template <int KC>
__device__ __forceinline__ float conv_input(const float* mixed, int64_t mixed_ld, const float* st, int conv_dim,
                                            int start, int t, int c) {
  return t >= start ? mixed[int64_t(t) * mixed_ld + c] : st[int64_t(KC - 1 - (start - t)) * conv_dim + c];
}

template <int KC>
__global__ void gdn_conv_chunk_kernel(const float* mixed, int64_t mixed_ld, const float* conv_w,
                                      const float* conv_state, const int32_t* seq_start, const int32_t* state_slot,
                                      float* u, int conv_dim) {
  pdl_prologue();
  const int s = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int start = seq_start[s], end = seq_start[s + 1];
  const int t0 = start + int(blockIdx.z) * kConvChunk;
  if (c >= conv_dim || t0 >= end) return;
  const float* st = conv_state + int64_t(state_slot[s]) * (KC - 1) * conv_dim;
  float w[KC], hist[KC - 1];
#pragma unroll
  for (int i = 0; i < KC; ++i) w[i] = conv_w[int64_t(c) * KC + i];
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) hist[i] = conv_input<KC>(mixed, mixed_ld, st, conv_dim, start, t0 - (KC - 1) + i, c);
  const int t1 = min(end, t0 + kConvChunk);
  for (int t = t0; t < t1; ++t) {
    u[int64_t(t) * conv_dim + c] = conv_step<KC>(w, hist, mixed[int64_t(t) * mixed_ld + c]);
  }
}

// The conv state after the step: the last KC-1 inputs (older ones from the state itself).
template <int KC>
__global__ void gdn_conv_state_kernel(const float* mixed, int64_t mixed_ld, float* conv_state,
                                      const int32_t* seq_start, const int32_t* state_slot, int conv_dim) {
  pdl_prologue();
  const int s = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= conv_dim) return;
  const int start = seq_start[s], end = seq_start[s + 1];
  float* st = conv_state + int64_t(state_slot[s]) * (KC - 1) * conv_dim;
  float next[KC - 1];
#pragma unroll
  for (int i = 0; i < KC - 1; ++i)
    next[i] = conv_input<KC>(mixed, mixed_ld, st, conv_dim, start, end - (KC - 1) + i, c);
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) st[int64_t(i) * conv_dim + c] = next[i];
}

// Gated RMSNorm of the delta rule's output: y = w * rmsnorm(x) * silu(z), a row per value head
// and token (z rows z_ld apart, the heads of a token side by side).
__global__ void gated_rms_norm_kernel(const float* x, const float* z, int64_t z_ld, int heads, const float* w,
                                      bf16_t* y, int rows, int dv, float eps) {
  pdl_prologue();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + int64_t(row) * dv;
  const float* zr = z + int64_t(row / heads) * z_ld + int64_t(row % heads) * dv;
  float ss = 0.f;
  for (int i = lane; i < dv; i += 32) ss += xr[i] * xr[i];
  const float inv = rsqrtf(warp_sum(ss) / float(dv) + eps);
  for (int i = lane; i < dv; i += 32) y[int64_t(row) * dv + i] = to_bf(w[i] * (xr[i] * inv) * silu_f(zr[i]));
}

// The same with 16-byte loads, a row's x and z held in registers (dv a multiple of 4, at most
// 128 * kGatedNormMaxVec; rows 16-byte aligned): one pass over memory instead of two over x.
constexpr int kGatedNormMaxVec = 4;
// The pieces of a row's norm, written out (no contraction left to the compiler) so that the
// recurrent kernel's cluster form (gated_norm_over_cluster) has the same bits: a float4's squares,
// the scale from the row's sum, and a pair of outputs.
__device__ __forceinline__ float sum_squares4(float4 v) {
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}
__device__ __forceinline__ float gated_norm_scale(float sum, int dv, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum, float(dv)), eps));
}
__device__ __forceinline__ uint2 gated_norm_out4(float4 w, float4 x, float4 z, float inv) {
  return make_uint2(pack_bf16(w.x * (x.x * inv) * silu_f(z.x), w.y * (x.y * inv) * silu_f(z.y)),
                    pack_bf16(w.z * (x.z * inv) * silu_f(z.z), w.w * (x.w * inv) * silu_f(z.w)));
}

// One warp a row; x is read through L2 (the fused recurrent kernel reads rows other blocks wrote).
__device__ __forceinline__ void gated_norm_row_vec(const float* x, const float* z, int64_t z_ld, int heads,
                                                   const float* w, bf16_t* y, int row, int dv, float eps) {
  const int lane = threadIdx.x % 32;
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(row) * dv);
  const float4* zr = reinterpret_cast<const float4*>(z + int64_t(row / heads) * z_ld + int64_t(row % heads) * dv);
  const int n4 = dv / 4;
  float4 xv[kGatedNormMaxVec], zv[kGatedNormMaxVec];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kGatedNormMaxVec; ++k) {
    const int i = lane + 32 * k;
    if (i < n4) {
      xv[k] = __ldcg(xr + i);
      zv[k] = zr[i];
      ss = __fadd_rn(ss, sum_squares4(xv[k]));
    }
  }
  const float inv = gated_norm_scale(warp_sum(ss), dv, eps);
  uint2* yr = reinterpret_cast<uint2*>(y + int64_t(row) * dv);
  const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int k = 0; k < kGatedNormMaxVec; ++k) {
    const int i = lane + 32 * k;
    if (i < n4) yr[i] = gated_norm_out4(w4[i], xv[k], zv[k], inv);
  }
}

__global__ void gated_rms_norm_vec_kernel(const float* x, const float* z, int64_t z_ld, int heads, const float* w,
                                          bf16_t* y, int rows, int dv, float eps) {
  pdl_prologue();
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row < rows) gated_norm_row_vec(x, z, z_ld, heads, w, y, row, dv, eps);
}

bool gated_norm_vec_applies(const float* x, const float* z, int64_t z_ld, const float* w, const bf16_t* y, int dv) {
  return dv % 4 == 0 && dv <= 128 * kGatedNormMaxVec && z_ld % 4 == 0 && is_aligned(x, 16) && is_aligned(z, 16) &&
         is_aligned(w, 16) && is_aligned(y, 8);
}

// Gated delta rule, recurrent form. The columns S[:, v] of a head's state evolve independently
// given each token's q, k, beta and decay, so a block owns kGdnCols columns of one value head of
// one sequence, and kGdnLanesPerCol lanes share a column (each holds DK/4 of its rows in
// registers; the lanes add their partial dot products with two shuffles): 4x the blocks and a
// quarter of the serial work per token compared with one thread per column. The block stages
// kGdnChunk tokens at a time in shared memory (cp.async, double-buffered: the next chunk loads
// while this one is computed) and works out each token's scalars (norms, q.k, beta, decay) once
// for all its columns. With the norms folded into scalars, both dot products use the state
// before the token, and the serial chain per token is one pass over the column:
//   S' = decay S + k^ delta^T,  delta = beta (v - decay S^T k^),
//   o = S'^T q^ = decay S^T q^ + delta (q^.k^).
// Bit-identity across step sizes: every token goes through the same code with a summation order
// fixed by DK and the lane layout, never by the number of tokens, chunk position or sequences.
constexpr int kGdnCols = 32;                           // state columns per block
constexpr int kGdnLanesPerCol = 4;                     // lanes sharing one column
constexpr int kGdnThreads = kGdnCols * kGdnLanesPerCol;  // 4 warps: 8 columns x 4 lanes each
constexpr int kGdnChunk = 16;                          // tokens staged per step
static_assert(kGdnLanesPerCol == 4 && kGdnThreads == 128, "lane layout: 4 warps of 8 columns x 4 lanes");

template <int DK>
struct GdnStage {
  float4 q[2][kGdnChunk][DK / 4];  // raw q, k of the value head's key head
  float4 k[2][kGdnChunk][DK / 4];
  float v[2][kGdnChunk][kGdnCols];  // the block's v columns
  float ba[2][kGdnChunk][2];        // b, a of the value head
  float4 scalars[kGdnChunk][2];     // {beta, decay, decay*inv_k, decay*inv_q}, {inv_k, q^.k^, -, -}
};

// Where the block's inputs live: u rows [T, ld] (q | k | v), b and a rows ba_ld apart.
struct GdnSources {
  const float *u, *b, *a;
  int64_t ld, ba_ld;
  int q_off, k_off, v_off, v_cols, head;
  bool vec16;  // u and its rows 16-byte aligned
};

// Starts the copy of tokens [t0, t0+n) into buffer `buf` (one cp.async group).
template <int DK>
__device__ void gdn_stage_chunk(GdnStage<DK>& sm, int buf, const GdnSources& src, int t0, int n) {
  constexpr int F4 = DK / 4;
  if (src.vec16) {
    for (int i = threadIdx.x; i < n * F4; i += kGdnThreads) {
      const int tt = i / F4, f = i % F4;
      const float* row = src.u + int64_t(t0 + tt) * src.ld;
      cp_async16(smem_addr(&sm.q[buf][tt][f]), row + src.q_off + 4 * f);
      cp_async16(smem_addr(&sm.k[buf][tt][f]), row + src.k_off + 4 * f);
    }
  } else {
    for (int i = threadIdx.x; i < n * DK; i += kGdnThreads) {
      const int tt = i / DK, e = i % DK;
      const float* row = src.u + int64_t(t0 + tt) * src.ld;
      cp_async4(smem_addr(reinterpret_cast<float*>(sm.q[buf][tt]) + e), row + src.q_off + e);
      cp_async4(smem_addr(reinterpret_cast<float*>(sm.k[buf][tt]) + e), row + src.k_off + e);
    }
  }
  for (int i = threadIdx.x; i < n * kGdnCols; i += kGdnThreads) {
    const int tt = i / kGdnCols, c = i % kGdnCols;
    if (c < src.v_cols) cp_async4(smem_addr(&sm.v[buf][tt][c]), src.u + int64_t(t0 + tt) * src.ld + src.v_off + c);
  }
  if (int(threadIdx.x) < n) {
    const int64_t r = int64_t(t0 + int(threadIdx.x)) * src.ba_ld + src.head;
    cp_async4(smem_addr(&sm.ba[buf][threadIdx.x][0]), src.b + r);
    cp_async4(smem_addr(&sm.ba[buf][threadIdx.x][1]), src.a + r);
  }
  cp_async_commit();
}

// Per-token scalars of the staged chunk, LPT lanes per token (whole warps take part or none).
template <int DK>
__device__ void gdn_token_scalars(GdnStage<DK>& sm, int buf, int n, float A, float dt_bias) {
  constexpr int LPT = DK / 4 < 8 ? DK / 4 : 8;
  constexpr int PER_LANE = DK / 4 / LPT;  // float4s of q (and of k) per lane
  static_assert((kGdnChunk * LPT) % 32 == 0 && kGdnChunk * LPT <= kGdnThreads, "token groups must fill warps");
  const int tt = threadIdx.x / LPT, sl = threadIdx.x % LPT;
  if (tt >= kGdnChunk) return;
  float sq = 0.f, sk = 0.f, sqk = 0.f;
#pragma unroll
  for (int p = 0; p < PER_LANE; ++p) {
    const float4 q = sm.q[buf][tt][sl + LPT * p], k = sm.k[buf][tt][sl + LPT * p];
    sq = fmaf(q.x, q.x, fmaf(q.y, q.y, fmaf(q.z, q.z, fmaf(q.w, q.w, sq))));
    sk = fmaf(k.x, k.x, fmaf(k.y, k.y, fmaf(k.z, k.z, fmaf(k.w, k.w, sk))));
    sqk = fmaf(q.x, k.x, fmaf(q.y, k.y, fmaf(q.z, k.z, fmaf(q.w, k.w, sqk))));
  }
#pragma unroll
  for (int o = LPT / 2; o > 0; o >>= 1) {
    sq += __shfl_xor_sync(0xffffffff, sq, o);
    sk += __shfl_xor_sync(0xffffffff, sk, o);
    sqk += __shfl_xor_sync(0xffffffff, sqk, o);
  }
  if (sl != 0 || tt >= n) return;
  const float inv_q = rsqrtf(sq + 1e-6f) * rsqrtf(float(DK)), inv_k = rsqrtf(sk + 1e-6f);
  const GdnGate gate = gdn_gate(sm.ba[buf][tt][0], sm.ba[buf][tt][1], A, dt_bias);
  const float beta = gate.beta, decay = expf(gate.log_decay);
  sm.scalars[tt][0] = make_float4(beta, decay, decay * inv_k, decay * inv_q);
  sm.scalars[tt][1] = make_float4(inv_k, sqk * inv_q * inv_k, 0.f, 0.f);
}

// A lane's part of its state column: rows 4*(g + 4i) + e (float4 i of its quarter g, component e)
// of a [DK, dv] matrix. `p` points at row 4g of the column; walking it row by row keeps the
// compiler from holding 4F row offsets in registers across the token loop.
template <int F>
__device__ __forceinline__ void gdn_load_column(float (&S)[4 * F], const float* p, int dv) {
#pragma unroll
  for (int i = 0; i < F; ++i, p += 12 * int64_t(dv))
#pragma unroll
    for (int e = 0; e < 4; ++e, p += dv) S[4 * i + e] = *p;
}
template <int F>
__device__ __forceinline__ void gdn_store_column(const float (&S)[4 * F], float* p, int dv) {
#pragma unroll
  for (int i = 0; i < F; ++i, p += 12 * int64_t(dv))
#pragma unroll
    for (int e = 0; e < 4; ++e, p += dv) *p = S[4 * i + e];
}

// The gated norm of rows t_begin..t_end-1 of head h (token t's row t * hv + h of `out`) by the
// cluster of the head's column blocks (cluster rank = blockIdx.x, one kGdnCols slice each), in
// place of the last-block tail: each block parks the squares of its float4s in shared memory,
// every block reads all of the row's from the cluster and sums them as gated_norm_row_vec's lanes
// and warp do (the same bits), then writes its own columns of y.
constexpr int kClusterNormTokens = 16;  // rows a round
constexpr int kSliceVec = kGdnCols / 4;  // float4s of a block's slice
constexpr int kMaxNormCluster = 8;      // portable cluster size: dv up to 256
__device__ void gated_norm_over_cluster(const float* out, const GatedNormFuse& gn, int t_begin, int t_end, int h,
                                        int hv, int dv, int c0) {
  namespace cg = cooperative_groups;
  __shared__ float squares[kClusterNormTokens][kSliceVec];
  __shared__ float scale[kClusterNormTokens];
  const cg::cluster_group cluster = cg::this_cluster();
  const int n4 = dv / 4, own = c0 / 4, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // this block's rows of `out` are written
  for (int t0 = t_begin; t0 < t_end; t0 += kClusterNormTokens) {
    const int n = min(kClusterNormTokens, t_end - t0);
    for (int i = threadIdx.x; i < n * kSliceVec; i += kGdnThreads) {
      const int tt = i / kSliceVec, j = i % kSliceVec;
      const float* row = out + (int64_t(t0 + tt) * hv + h) * dv;
      squares[tt][j] = own + j < n4 ? sum_squares4(*reinterpret_cast<const float4*>(row + 4 * (own + j))) : 0.f;
    }
    cluster.sync();  // every slice's squares are parked
    for (int tt = warp; tt < n; tt += kGdnThreads / 32) {
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < kGatedNormMaxVec; ++k) {
        const int i = lane + 32 * k;
        if (i < n4) ss = __fadd_rn(ss, cluster.map_shared_rank(&squares[tt][0], i / kSliceVec)[i % kSliceVec]);
      }
      const float inv = gated_norm_scale(warp_sum(ss), dv, gn.eps);
      if (lane == 0) scale[tt] = inv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n * kSliceVec; i += kGdnThreads) {
      const int tt = i / kSliceVec, j = own + i % kSliceVec;
      if (j >= n4) continue;
      const int t = t0 + tt;
      const int64_t row = int64_t(t) * hv + h;
      const float4 x = reinterpret_cast<const float4*>(out + row * dv)[j];
      const float4 z = reinterpret_cast<const float4*>(gn.z + int64_t(t) * gn.z_ld + int64_t(h) * dv)[j];
      reinterpret_cast<uint2*>(gn.y + row * dv)[j] = gated_norm_out4(reinterpret_cast<const float4*>(gn.w)[j], x, z,
                                                                      scale[tt]);
    }
    cluster.sync();  // no block reuses or leaves its squares while another still reads them
  }
}

// Grid: (column slices of kGdnCols, value heads, sequences). Lane l of warp w works on column
// w*8 + l%8 of the slice and on rows 4*(l/8 + 4i) + 0..3 of it (float4 i of its quarter).
template <int DK>
__global__ void __launch_bounds__(kGdnThreads) gdn_recurrent_kernel(
    const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log, const float* dt_bias,
    float* state, const int32_t* seq_start, const int32_t* state_slot, float* out, int hk, int hv, int dv,
    bool vec16, StateHistory hs, int long_from, int fault, GatedNormFuse gn, bool cluster_norm) {
  constexpr int F = DK / 16;  // float4s of the column per lane
  __shared__ GdnStage<DK> sm;
  const int g = (threadIdx.x & 31) >> 3, col = (threadIdx.x >> 5) * 8 + (threadIdx.x & 7);
  const int c0 = blockIdx.x * kGdnCols, h = blockIdx.y, s = blockIdx.z;
  const int v = c0 + col;
  const bool active = v < dv;
  const int key_dim = hk * DK, j = h / (hv / hk);
  // The step's metadata and the state are not the previous kernel's (programmatic dependent
  // launch: the kernels before it are done once it lets this one start), so the state column's
  // loads go out before the wait; only u, b and a come from it.
  const int t_begin = seq_start[s], t_end = seq_start[s + 1];
  if (long_from > 0 && t_end - t_begin >= long_from) return;  // gdn_chunked takes it
  // This lane's rows of column v, from row 4g (inactive lanes of a partial slice hold zeros).
  const int64_t lane_offset = int64_t(4 * g) * dv + v;
  float S[4 * F] = {};
  float* st = state + (int64_t(state_slot[s]) * hv + h) * DK * dv + lane_offset;
  if (active) gdn_load_column<F>(S, st, dv);
  // The head's constants and (for the gated norm at the end) the norm's weights: weights, long
  // gone from L2 when this layer runs; asked for before the wait they leave the chain.
  const float A = expf(a_log[h]), dtb = dt_bias[h];
  if (gn.counters && threadIdx.x * 32 < dv) prefetch_l2(gn.w + threadIdx.x * 32);
  pdl_prologue();
  // Fault injection (backend_switches.h): the step's token count is on the device only, so the
  // kernel itself writes NaN or wrong values, an illegal address, or just past its output (oob).
  if (fault == int(BackendFault::Crash)) *reinterpret_cast<volatile float*>(uintptr_t(64)) = 1.f;
  // oob: 64 bytes just past the step's output (seq_start[num_seqs] tokens), from each sequence run here.
  if (fault == int(BackendFault::Oob) && blockIdx.x == 0 && h == 0 && threadIdx.x < 16)
    out[int64_t(seq_start[gridDim.z]) * hv * dv + threadIdx.x] = 0.747f;
  const GdnSources src{u, b, a, 2 * int64_t(key_dim) + int64_t(hv) * dv, ba_ld, j * DK, key_dim + j * DK,
                       2 * key_dim + h * dv + c0, min(kGdnCols, dv - c0), h, vec16};
  if (t_begin < t_end) gdn_stage_chunk<DK>(sm, 0, src, t_begin, min(kGdnChunk, t_end - t_begin));
  // History entry i of this head: the state after i tokens of the step.
  float* keep = hs.recurrent && hs.keep[s]
                    ? hs.recurrent + (int64_t(state_slot[s]) * hs.entries * hv + h) * DK * dv + lane_offset
                    : nullptr;
  const int64_t entry_stride = int64_t(hv) * DK * dv;
  if (keep && active) gdn_store_column<F>(S, keep, dv);

  int buf = 0;
  for (int t0 = t_begin; t0 < t_end; t0 += kGdnChunk, buf ^= 1) {
    const int n = min(kGdnChunk, t_end - t0);
    cp_async_wait_all();
    __syncthreads();  // chunk landed; everyone is done with the other buffer and the scalars
    const int next = t0 + kGdnChunk;
    if (next < t_end) gdn_stage_chunk<DK>(sm, buf ^ 1, src, next, min(kGdnChunk, t_end - next));
    gdn_token_scalars<DK>(sm, buf, n, A, dtb);
    __syncthreads();
#pragma unroll 1
    for (int tt = 0; tt < n; ++tt) {
      const float4 sc0 = sm.scalars[tt][0], sc1 = sm.scalars[tt][1];
      const float4* kt = sm.k[buf][tt];
      const float4* qt = sm.q[buf][tt];
      // Partial S^T k and S^T q over this lane's rows, four accumulators each for ILP.
      float ak[4] = {0.f, 0.f, 0.f, 0.f}, aq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < F; ++i) {
        const float4 k4 = kt[g + 4 * i], q4 = qt[g + 4 * i];
        ak[0] = fmaf(S[4 * i + 0], k4.x, ak[0]);
        ak[1] = fmaf(S[4 * i + 1], k4.y, ak[1]);
        ak[2] = fmaf(S[4 * i + 2], k4.z, ak[2]);
        ak[3] = fmaf(S[4 * i + 3], k4.w, ak[3]);
        aq[0] = fmaf(S[4 * i + 0], q4.x, aq[0]);
        aq[1] = fmaf(S[4 * i + 1], q4.y, aq[1]);
        aq[2] = fmaf(S[4 * i + 2], q4.z, aq[2]);
        aq[3] = fmaf(S[4 * i + 3], q4.w, aq[3]);
      }
      float sk = (ak[0] + ak[1]) + (ak[2] + ak[3]), sq = (aq[0] + aq[1]) + (aq[2] + aq[3]);
      // The four lanes of the column (lane bits 3 and 4) end with the same bits: + commutes.
      sk += __shfl_xor_sync(0xffffffff, sk, 8);
      sq += __shfl_xor_sync(0xffffffff, sq, 8);
      sk += __shfl_xor_sync(0xffffffff, sk, 16);
      sq += __shfl_xor_sync(0xffffffff, sq, 16);
      const float vv = active ? sm.v[buf][tt][col] : 0.f;
      const float delta = sc0.x * fmaf(-sk, sc0.z, vv);  // beta (v - decay S^T k^)
      const float kd = delta * sc1.x;                     // delta * inv_k: k^ delta = k kd
#pragma unroll
      for (int i = 0; i < F; ++i) {
        const float4 k4 = kt[g + 4 * i];
        S[4 * i + 0] = fmaf(k4.x, kd, S[4 * i + 0] * sc0.y);
        S[4 * i + 1] = fmaf(k4.y, kd, S[4 * i + 1] * sc0.y);
        S[4 * i + 2] = fmaf(k4.z, kd, S[4 * i + 2] * sc0.y);
        S[4 * i + 3] = fmaf(k4.w, kd, S[4 * i + 3] * sc0.y);
      }
      const int t = t0 + tt;
      if (active && g == 0)
        out[int64_t(t) * hv * dv + int64_t(h) * dv + v] = fault == int(BackendFault::Nan)     ? __int_as_float(-1)
                                                          : fault == int(BackendFault::Wrong) ? 0.747f
                                                                                              : fmaf(sq, sc0.w, delta * sc1.y);
      if (keep && active) gdn_store_column<F>(S, keep + int64_t(t - t_begin + 1) * entry_stride, dv);
    }
  }
  if (active) gdn_store_column<F>(S, st, dv);
  if (cluster_norm) {
    gated_norm_over_cluster(out, gn, t_begin, t_end, h, hv, dv, c0);
    return;
  }
  if (gn.counters == nullptr) return;
  // The gated norm of this sequence's rows of head h, by the last of the head's column blocks to
  // finish.
  if (!last_block_to_finish(gn.counters + int64_t(s) * hv + h)) return;
  for (int t = t_begin + int(threadIdx.x / 32); t < t_end; t += kGdnThreads / 32)
    gated_norm_row_vec(out, gn.z, gn.z_ld, hv, gn.w, gn.y, t * hv + h, dv, gn.eps);
}

// One pass per sequence, or (chunks > 1) the chunked kernel then the state update.
template <int KC>
void launch_conv(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state,
                 const int32_t* seq_start, const int32_t* state_slot, float* u, int num_seqs, int conv_dim,
                 cudaStream_t s, const StateHistory& hs, int chunks) {
  const dim3 grid((conv_dim + 255) / 256, num_seqs);
  if (chunks == 1) {
    launch(gdn_conv_kernel<KC>, grid, 256, 0, s, mixed, mixed_ld, conv_w, conv_state, seq_start, state_slot, u,
           conv_dim, hs);
    return;
  }
  launch(gdn_conv_chunk_kernel<KC>, dim3(grid.x, grid.y, chunks), 256, 0, s, mixed, mixed_ld, conv_w, conv_state,
         seq_start, state_slot, u, conv_dim);
  launch(gdn_conv_state_kernel<KC>, grid, 256, 0, s, mixed, mixed_ld, conv_state, seq_start, state_slot, conv_dim);
}

// Copies one sequence's kept states (history entry `entry`) back over its current conv and
// recurrent states, every linear-attention layer in one launch: blockIdx.y the layer, .z which
// state. With `slot_list`, .z / 2 picks the sequence (its slot slot_list[z / 2]), and a sequence
// whose `skip[slot]` is set keeps its states (a chained round whose draft was accepted).
__global__ void restore_state_kernel(float* conv_state, float* rec_state, const float* hist_conv,
                                     const float* hist_rec, int slots, int slot, const int32_t* slot_list,
                                     const int32_t* skip, int entries, int entry, int64_t conv, int64_t rec) {
  const int which = blockIdx.z % 2;
  if (slot_list) {
    slot = slot_list[blockIdx.z / 2];
    if (skip[slot]) return;
  }
  const int64_t n = which == 0 ? conv : rec;
  const int64_t layer_slot = int64_t(blockIdx.y) * slots + slot;
  float* dst = (which == 0 ? conv_state : rec_state) + layer_slot * n;
  const float* src = (which == 0 ? hist_conv : hist_rec) + (layer_slot * entries + entry) * n;
  if (n % 4 == 0) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x)
      reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
  } else {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
      dst[i] = src[i];
  }
}

}  // namespace

void restore_linear_state(float* conv_state, float* rec_state, const StateHistory& hist, int layers, int slots,
                          int slot, int entry, int64_t conv, int64_t rec, cudaStream_t s) {
  if (layers <= 0) return;
  const int64_t most = std::max(conv, rec) / 4;
  const int blocks = int(std::clamp<int64_t>((most + 255) / 256, 1, 64));
  restore_state_kernel<<<dim3(blocks, layers, 2), 256, 0, s>>>(conv_state, rec_state, hist.conv, hist.recurrent, slots,
                                                               slot, nullptr, nullptr, hist.entries, entry, conv, rec);
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

void restore_linear_states_unless(float* conv_state, float* rec_state, const StateHistory& hist, int layers,
                                  int slots, const int32_t* slot_list, int n, const int32_t* skip, int entry,
                                  int64_t conv, int64_t rec, cudaStream_t s) {
  if (layers <= 0 || n <= 0) return;
  const int64_t most = std::max(conv, rec) / 4;
  const int blocks = int(std::clamp<int64_t>((most + 255) / 256, 1, 64));
  restore_state_kernel<<<dim3(blocks, layers, 2 * n), 256, 0, s>>>(conv_state, rec_state, hist.conv, hist.recurrent,
                                                                   slots, 0, slot_list, skip, hist.entries, entry, conv,
                                                                   rec);
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

void gdn_conv(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state, const int32_t* seq_start,
              const int32_t* state_slot, float* u, int num_seqs, int conv_dim, int kc, cudaStream_t s,
              const StateHistory* hist, int max_seq_tokens) {
  if (num_seqs == 0) return;
  const StateHistory hs = hist ? *hist : StateHistory{};
  const int chunks = !hist && max_seq_tokens > kConvChunk ? (max_seq_tokens + kConvChunk - 1) / kConvChunk : 1;
  // Every kernel size up to kMaxConvKernel: the window lives in registers, unrolled.
  auto run = [&](auto kc_const) {
    launch_conv<decltype(kc_const)::value>(mixed, mixed_ld, conv_w, conv_state, seq_start, state_slot, u, num_seqs,
                                           conv_dim, s, hs, chunks);
  };
  switch (kc) {
    case 2: run(std::integral_constant<int, 2>{}); break;
    case 3: run(std::integral_constant<int, 3>{}); break;
    case 4: run(std::integral_constant<int, 4>{}); break;
    case 5: run(std::integral_constant<int, 5>{}); break;
    case 6: run(std::integral_constant<int, 6>{}); break;
    case 7: run(std::integral_constant<int, 7>{}); break;
    case 8: run(std::integral_constant<int, 8>{}); break;
    default: fail("gdn_conv: conv kernel size ", kc, " (supported: 2..", kMaxConvKernel, ")");
  }
  FATHOM_CUDA_LAUNCH_CHECK();
}

bool gdn_recurrent_covers(int dk) { return dk == 16 || dk == 32 || dk == 64 || dk == 128; }

bool gdn_recurrent(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log, const float* dt_bias,
                   float* state, const int32_t* seq_start, const int32_t* state_slot, float* out, int num_seqs,
                   int hk, int hv, int dk, int dv, cudaStream_t s, const StateHistory* hist, int long_from,
                   const char* serves, bool decode_smem, const GatedNormFuse* norm) {
  const StateHistory hs = hist ? *hist : StateHistory{};
  if (num_seqs == 0) return norm != nullptr;
  // The shared-memory kernel when the tuner chose it for decode, and for every key head dim the
  // register-tiled kernel has no instance for (gdn_recurrent_covers).
  if ((decode_smem && std::string_view(serves) == kGdnDecodeOp) || !gdn_recurrent_covers(dk)) {
    gdn_recurrent_smem(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, num_seqs, hk, hv, dk, dv, s,
                       hist, long_from);
    return false;
  }
  FATHOM_CHECK(dv >= 1 && dv <= kMaxLinearValueHeadDim, "gdn_recurrent: value head dim ", dv, " must be in 1..",
               kMaxLinearValueHeadDim);
  FATHOM_CHECK(hk > 0 && hv % hk == 0, "gdn_recurrent: ", hv, " value heads over ", hk, " key heads");
  const int64_t ld = 2 * int64_t(hk) * dk + int64_t(hv) * dv;
  const bool vec16 = reinterpret_cast<uintptr_t>(u) % 16 == 0 && ld % 4 == 0;
  const dim3 grid((dv + kGdnCols - 1) / kGdnCols, hv, num_seqs);
  decltype(&gdn_recurrent_kernel<16>) kernel = nullptr;
  switch (dk) {
    case 16: kernel = gdn_recurrent_kernel<16>; break;
    case 32: kernel = gdn_recurrent_kernel<32>; break;
    case 64: kernel = gdn_recurrent_kernel<64>; break;
    case 128: kernel = gdn_recurrent_kernel<128>; break;
    default: fail("gdn_recurrent: no register-tiled kernel for key head dim ", dk);
  }
  // The gated norm rides along where every row is this kernel's (no chunked sequences), the
  // vectorised norm applies, and no fault is injected into this op.
  const BackendFault fault = backend_fault_of(serves, kRecurrent);
  const bool fuse = norm && norm->counters && long_from == 0 && fault == BackendFault::None &&
                    gated_norm_vec_applies(out, norm->z, norm->z_ld, norm->w, norm->y, dv);
  // The norm by the head's cluster of column blocks where a cluster holds them (dv <= 256), else
  // by the last of them to finish; FATHOM_GDN_CLUSTER_NORM=0 keeps the latter (A/B runs).
  static const bool cluster_enabled = [] {
    const char* v = std::getenv("FATHOM_GDN_CLUSTER_NORM");
    return !v || std::string_view(v) != "0";
  }();
  const bool cluster_norm = fuse && cluster_enabled && int(grid.x) <= kMaxNormCluster;
  const dim3 cluster(grid.x, 1, 1);
  launch_in_clusters(cluster_norm ? &cluster : nullptr, kernel, grid, dim3(kGdnThreads), 0, s, u, b, a, ba_ld, a_log,
                     dt_bias, state, seq_start, state_slot, out, hk, hv, dv, vec16, hs, long_from, int(fault),
                     fuse ? *norm : GatedNormFuse{}, cluster_norm);
  FATHOM_CUDA_LAUNCH_CHECK();
  return fuse;
}

void gated_rms_norm(const float* x, const float* z, int64_t z_ld, int heads, const float* w, bf16_t* y, int rows,
                    int dv, float eps, cudaStream_t s) {
  if (rows == 0) return;
  const bool vec = gated_norm_vec_applies(x, z, z_ld, w, y, dv);
  launch(vec ? gated_rms_norm_vec_kernel : gated_rms_norm_kernel, (rows + 3) / 4, 128, 0, s, x, z, z_ld, heads, w, y,
         rows, dv, eps);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
