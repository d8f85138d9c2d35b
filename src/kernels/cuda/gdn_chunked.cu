// Gated DeltaNet prefill: the gated delta rule over chunks of 64 tokens on tensor cores (tf32
// mma.sync). The recurrent kernel (gdn.cu) walks tokens one by one; here the tokens of a chunk are
// solved together (the WY form of Yang et al., "Gated Delta Networks"; the same algebra as HF's
// torch_chunk_gated_delta_rule) and only the chunks are sequential.
//
// Within a chunk of n tokens with state S (dk x dv) before it, normalised k^_i, q^_i, beta_i and
// cumulative log decays G_i (G_i = sum of g_m for m <= i, so e^{G_i - G_j} <= 1 for j <= i):
//   A_ij = beta_i e^{G_i-G_j} k^_i.k^_j (j < i),   T = (I + A)^{-1}   (unit lower triangular)
//   W = T diag(beta e^G) K^,   Delta = T diag(beta) V - W S      (the tokens' delta_i, n x dv)
//   O = diag(e^G) Q^ S + P Delta,   P_ij = e^{G_i-G_j} q^_i.k^_j (j <= i)
//   S' = e^{G_last} S + K^^T diag(e^{G_last-G}) Delta
// which is the recurrence S_i = e^{g_i} S_{i-1} + k^_i delta_i^T, delta_i = beta_i (v_i - e^{g_i}
// S_{i-1}^T k^_i), o_i = S_i^T q^_i unrolled over the chunk.
//
// Two kernels. The prep kernel, parallel over every chunk and key head, works out what the value
// heads of a key head share (q^, k^ transposed, K^ K^^T, Q^ K^^T) and each value head's beta and G,
// into a scratch record per chunk. The chunk kernel is sequential over a sequence's chunks: one
// block (one per SM: up to 214 KB of shared memory) owns 64 state columns of one value head (32
// where twice the blocks still fit one wave, dk 128; the same bits) and runs as two teams of 8
// warps. The state team keeps the state slice in mma accumulators (and transposed in shared
// memory as the B operand), solves T and computes W, Delta and the state update; the output team
// computes Q^ S, P and the output, and masks the next chunk's A while the state team updates the
// state.
// Inputs arrive by bulk copies (one thread each) and cp.async, the next chunk's while this one
// computes. Products are per-warp 16 x 8n tf32 tiles (ldmatrix where the operand is k-contiguous);
// T is solved by doubling (solve_unit_lower). What bounds it is shared-memory traffic (fp32
// operands, about 1 MB a chunk): see docs/perf.md.
#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_gate.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kChunk = 64;  // tokens per chunk
// State columns per block of the chunk kernel: 64, or 32 where twice the blocks still fit the GPU
// in one wave (few value heads and sequences: the chunks are sequential, so a block's time is the
// kernel's, and the k side each block repeats costs less than the idle SMs).
constexpr int kSlice = 64;
constexpr int kNarrowSlice = 32;
// The chunk kernel runs one block per SM as two teams of 8 warps: the state team (warps 0-7) solves
// T and computes W, Delta and the state update; the output team (warps 8-15) computes Q^ S and P,
// then the output from Delta, in parallel with it.
constexpr int kTeamWarps = 8;
constexpr int kTeamThreads = kTeamWarps * 32;
constexpr int kWarps = 2 * kTeamWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kPrepWarps = 8;
constexpr int kPrepThreads = kPrepWarps * 32;
constexpr int kLdC = kChunk + 4;  // floats per row of [*][chunk] matrices

// Per-chunk scratch, for each key head: k^ transposed [dk][chunk], K^ K^^T and Q^ K^^T
// [chunk][chunk], q^ [chunk][dk] (rows as in shared memory, so one bulk copy moves each; q^ carries
// the 1/sqrt(dk) of the scores); then for each value head: G and beta [chunk].
template <int DK>
struct KeyHeadRecord {
  static constexpr int kLdK = DK + 4;
  static constexpr int kt = 0, kk = DK * kLdC, qk = kk + kChunk * kLdC, q = qk + kChunk * kLdC;
  static constexpr int floats = q + kChunk * kLdK;
};
constexpr int kValueHeadRecord = 2 * kChunk;  // G | beta

template <int DK>
__host__ __device__ inline int64_t chunk_record_floats(int hk, int hv) {
  return int64_t(hk) * KeyHeadRecord<DK>::floats + int64_t(hv) * kValueHeadRecord;
}

// Index of sequence s's first chunk among the chunked sequences' (those with >= min_tokens).
__device__ inline int first_chunk(const int32_t* seq_start, int s, int min_tokens) {
  int c = 0;
  for (int i = 0; i < s; ++i) {
    const int n = seq_start[i + 1] - seq_start[i];
    if (n >= min_tokens && n > 0) c += (n + kChunk - 1) / kChunk;
  }
  return c;
}

// Derived per-token scalars of the chunk kernel, rows of kChunk floats.
enum Scalar { kExpG, kBetaExpG, kExpToLast, kNumScalars };

// The chunk kernel's shared memory, in floats. Row-major operands read by ldmatrix want rows a
// multiple of 16 bytes and 16 mod 128 bytes apart (kLdK, kLdC); k-major ones read by scalar loads
// at (row t, column g) a stride of 8 mod 32 floats (kLdV). kt..q mirror a key-head record, so its
// parts land with one bulk copy each.
template <int DK, int SL = kSlice>
struct ChunkLayout {
  static constexpr int kLdK = DK + 4;
  static constexpr int kLdV = SL + 8;
  static constexpr int kt = 0;                                     // k^ transposed [dk][chunk]
  static constexpr int t = kt + KeyHeadRecord<DK>::kk;             // K^K^^T, masked, then T
  static constexpr int p = kt + KeyHeadRecord<DK>::qk;             // Q^K^^T, then P
  static constexpr int q = kt + KeyHeadRecord<DK>::q;              // q^ [chunk][dk]
  static constexpr int w = kt + KeyHeadRecord<DK>::floats;         // -W [chunk][dk]
  static constexpr int gates = w + kChunk * kLdK;                  // G | beta
  static constexpr int v = gates + kValueHeadRecord;               // v [chunk][slice]
  static constexpr int delta_t = v + kChunk * kLdV;                // Delta transposed [slice][chunk]
  static constexpr int s_t = delta_t + SL * kLdC;                 // S transposed [slice][dk]
  static constexpr int solve = s_t + SL * kLdK;                    // products of the solve: 32 x 40
  static constexpr int scalars = solve + 32 * 40;                  // [2][kNumScalars][chunk]
  static constexpr int bars = scalars + 2 * kNumScalars * kChunk;  // two mbarriers
  static constexpr int total = bars + 4;
  static constexpr size_t bytes = size_t(total) * sizeof(float);
  static_assert(w % 4 == 0 && kt % 4 == 0 && t % 4 == 0 && p % 4 == 0 && gates % 4 == 0 && v % 4 == 0 &&
                    delta_t % 4 == 0 && s_t % 4 == 0 && bars % 2 == 0,
                "16-byte aligned regions");
};

// The prep kernel's shared memory: q and k rows, k^ transposed.
template <int DK>
struct PrepLayout {
  static constexpr int kLdK = DK + 4;
  static constexpr int q = 0, k = q + kChunk * kLdK, kt = k + kChunk * kLdK;
  static constexpr size_t bytes = size_t(kt + DK * kLdC) * sizeof(float);
};

// An operand rounded to tf32 (the mma reads the top 19 bits of an fp32 register), by an integer add
// and mask rather than a cvt per element; with kPrecise also the rounding error as a second tf32:
// hi*hi + hi*lo + lo*hi ("3xTF32") is about as exact as an fp32 product, at three mma a tile.
template <bool kPrecise, int N>
struct Tf32Frag {
  uint32_t hi[N], lo[N];
  __device__ __forceinline__ void set(const float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      hi[i] = (__float_as_uint(x[i]) + 0x1000u) & 0xffffe000u;  // to nearest (ties away)
      if (kPrecise) lo[i] = __float_as_uint(x[i] - __uint_as_float(hi[i]));
    }
  }
};

// acc[i][n] += A_i[16 x k_end] * B[k_end x 8n..8n+8] for the NA operands A_i (row-major, `lda`
// floats per row, each pointing at the warp's first row) sharing one B. B(k, c) is b[c * ldb + k]
// when kBnMajor, else b[k * ldb + c] (b points at the warp's first column); with kScaled its row k
// is multiplied by scale[k]. Tiles n >= nt_count are skipped (all-zero parts of triangles).
template <bool kBnMajor, bool kScaled, bool kPrecise, int NA, int NT>
__device__ __forceinline__ void warp_mma(float (&acc)[NA][NT][4], const float* const* a, int lda, const float* b,
                                         int ldb, const float* scale, int k_end, int nt_count = NT) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // ldmatrix reads 8 rows of 16 bytes (4 fp32) per matrix, thread i getting row i/4, word i%4: four
  // of them are an A fragment (rows +8, columns +4), or b0/b1 of two n8 tiles of an n-major B.
  constexpr bool kLdmatrixB = kBnMajor && NT % 2 == 0;
  const int a_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * lda + 4 * (lane >> 4);
  const int b_off = kLdmatrixB ? (8 * (lane >> 4) + (lane & 7)) * ldb + 4 * ((lane >> 3) & 1) : 0;
#pragma unroll 2
  for (int k = 0; k < k_end; k += 8) {
    Tf32Frag<kPrecise, 4> af[NA];
#pragma unroll
    for (int i = 0; i < NA; ++i) {
      uint32_t r[4];
      ldmatrix_x4(r, smem_addr(a[i] + a_off + k));
      af[i].set({__uint_as_float(r[0]), __uint_as_float(r[1]), __uint_as_float(r[2]), __uint_as_float(r[3])});
    }
    float s0 = 1.f, s1 = 1.f;
    if (kScaled) {
      s0 = scale[k + t];
      s1 = scale[k + t + 4];
    }
    constexpr int kTilesPerLoad = kLdmatrixB ? 2 : 1;
#pragma unroll
    for (int n = 0; n < NT; n += kTilesPerLoad) {
      if (n >= nt_count) break;
      float bv[4] = {0.f, 0.f, 0.f, 0.f};  // b0, b1 of tile n (and of tile n + 1)
      if (kLdmatrixB) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(b + 8 * n * ldb + b_off + k));
#pragma unroll
        for (int e = 0; e < 4; ++e) bv[e] = __uint_as_float(r[e]);
      } else {
        const float* p = kBnMajor ? b + (8 * n + g) * ldb + k + t : b + (k + t) * ldb + 8 * n + g;
        bv[0] = p[0];
        bv[1] = kBnMajor ? p[4] : p[4 * ldb];
      }
      Tf32Frag<kPrecise, 4> bf;
      bf.set({bv[0] * s0, bv[1] * s1, bv[2] * s0, bv[3] * s1});
#pragma unroll
      for (int h = 0; h < kTilesPerLoad; ++h) {
        if (n + h >= nt_count) break;
#pragma unroll
        for (int i = 0; i < NA; ++i) {
          if (kPrecise) {
            mma_tf32(acc[i][n + h], af[i].lo, bf.hi[2 * h], bf.hi[2 * h + 1]);
            mma_tf32(acc[i][n + h], af[i].hi, bf.lo[2 * h], bf.lo[2 * h + 1]);
          }
          mma_tf32(acc[i][n + h], af[i].hi, bf.hi[2 * h], bf.hi[2 * h + 1]);
        }
      }
    }
  }
}

// Barrier of one team (named barrier `id` > 0, kTeamThreads threads).
__device__ __forceinline__ void team_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(kTeamThreads) : "memory");
}

// T = (I + A)^{-1} in place, A strictly lower triangular with the unit diagonal implied, by
// doubling: the four 16 x 16 diagonal blocks by forward substitution in registers (warps 0-3), then
// the two 32 x 32 diagonal blocks and finally the whole, each from its halves as
//   [L1 0; B L2]^{-1} = [T1 0; -T2 B T1, T2]
// with the two products on tensor cores (3xTF32: T feeds every other product of the chunk).
// T: [chunk][kLdC]; X: room for 32 x 40 floats. Run by the team of warps 0-7 (barrier `bar`).
__device__ void solve_unit_lower(float* T, float* X, int bar) {
  constexpr int ld = kLdC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  if (warp < 4) {
    // Right-looking: X = I; for each m (row m of X is final), rows r > m lose A_rm X_m. Lane l
    // holds column l%16 of rows l/16 + 2i in registers; row m comes from its owner by shuffle.
    float* B = T + 16 * warp * ld + 16 * warp;
    const int c = lane & 15, half = lane >> 4;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = half + 2 * i == c ? 1.f : 0.f;
#pragma unroll
    for (int m = 0; m < 15; ++m) {
      const float xm = __shfl_sync(0xffffffff, x[m >> 1], c + 16 * (m & 1));
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = half + 2 * i;
        if (r > m) x[i] = fmaf(-B[r * ld + m], xm, x[i]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8; ++i) B[(half + 2 * i) * ld + c] = x[i];
  }
  team_sync(bar);
  // Level `size` (16, then 32): the 64 / (2*size) diagonal blocks of 2*size from their halves. Each
  // active warp computes one 16 x 8 tile of B T1 (into X), then of -T2 (B T1) (into T).
  constexpr int kLdX[2] = {24, 40};  // k-major reads at (t, g) hit 32 banks: 24 or 8 mod 32
#pragma unroll
  for (int level = 0; level < 2; ++level) {
    const int size = 16 << level, ldx = kLdX[level];
    const int tiles = (size / 16) * (size / 8);  // per block
    const int block = warp / tiles, tile = warp % tiles;
    const bool active = block < kChunk / (2 * size);
    const int base = 2 * size * block, mr = 16 * (tile / (size / 8)), nc = 8 * (tile % (size / 8));
    float* Xb = X + block * 16 * ldx;  // level 0: one 16-row X per block; level 1: one block
    if (active) {
      float acc[1][1][4] = {};
      const float* const b_rows[1] = {T + (base + size + mr) * ld + base};
      warp_mma<false, false, true>(acc, b_rows, ld, T + base * ld + base + nc, ld, nullptr, size);
#pragma unroll
      for (int e = 0; e < 4; ++e) Xb[(mr + g + 8 * (e >> 1)) * ldx + nc + 2 * tq + (e & 1)] = acc[0][0][e];
    }
    team_sync(bar);
    if (active) {
      float acc[1][1][4] = {};
      const float* const t2_rows[1] = {T + (base + size + mr) * ld + base + size};
      warp_mma<false, false, true>(acc, t2_rows, ld, Xb + nc, ldx, nullptr, size);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        T[(base + size + mr + g + 8 * (e >> 1)) * ld + base + nc + 2 * tq + (e & 1)] = -acc[0][0][e];
    }
    team_sync(bar);
  }
}

// Grid: (chunks of the longest sequence, key heads, sequences).
template <int DK, bool kPrecise>
__global__ void __launch_bounds__(kPrepThreads)
    gdn_chunk_prep_kernel(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                          const float* dt_bias, const int32_t* seq_start, int hk, int hv, int dv, int min_tokens,
                          float* scratch) {
  pdl_prologue();
  using L = PrepLayout<DK>;
  using R = KeyHeadRecord<DK>;
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  const int s = blockIdx.z, j = blockIdx.y, c = blockIdx.x;
  const int t_begin = seq_start[s], len = seq_start[s + 1] - t_begin;
  if (len < min_tokens || c * kChunk >= len) return;
  const int t0 = t_begin + c * kChunk, n = min(kChunk, len - c * kChunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  float* rec = scratch + int64_t(first_chunk(seq_start, s, min_tokens) + c) * chunk_record_floats<DK>(hk, hv);
  float* kh = rec + int64_t(j) * R::floats;
  const int64_t ld = 2 * int64_t(hk) * DK + int64_t(hv) * dv;

  constexpr int F4 = DK / 4;
  for (int i = threadIdx.x; i < kChunk * F4; i += kPrepThreads) {
    const int r = i / F4, f = i % F4;
    float* q = sm + L::q + r * L::kLdK + 4 * f;
    float* k = sm + L::k + r * L::kLdK + 4 * f;
    if (r < n) {
      const float* row = u + int64_t(t0 + r) * ld;
      cp_async16(smem_addr(q), row + j * DK + 4 * f);
      cp_async16(smem_addr(k), row + hk * DK + j * DK + 4 * f);
    } else {
      *reinterpret_cast<float4*>(q) = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(k) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  {  // Normalise q and k rows in place (8 rows a warp, reductions interleaved).
    constexpr int PER = DK / 32, ROWS = kChunk / kPrepWarps;
    float q[ROWS][PER], k[ROWS][PER], sq[ROWS], sk[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = warp * ROWS + r;
      sq[r] = sk[r] = 0.f;
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        q[r][e] = sm[L::q + row * L::kLdK + lane + 32 * e];
        k[r][e] = sm[L::k + row * L::kLdK + lane + 32 * e];
        sq[r] = fmaf(q[r][e], q[r][e], sq[r]);
        sk[r] = fmaf(k[r][e], k[r][e], sk[r]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        sq[r] += __shfl_xor_sync(0xffffffff, sq[r], o);
        sk[r] += __shfl_xor_sync(0xffffffff, sk[r], o);
      }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = warp * ROWS + r;
      const float inv_q = rsqrtf(sq[r] + 1e-6f) * rsqrtf(float(DK)), inv_k = rsqrtf(sk[r] + 1e-6f);
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        sm[L::q + row * L::kLdK + lane + 32 * e] = q[r][e] * inv_q;
        sm[L::k + row * L::kLdK + lane + 32 * e] = k[r][e] * inv_k;
      }
    }
  }
  __syncthreads();

  {  // K^ K^^T and Q^ K^^T (tiles above the diagonal are not needed: zeros).
    const int mt = warp & 3, nh = warp >> 2, r0 = 16 * mt;
    float acc[2][4][4] = {};
    const int nt_count = max(0, min(4, (r0 + 15 - 32 * nh) / 8 + 1));
    const float* const rows[2] = {sm + L::k + r0 * L::kLdK, sm + L::q + r0 * L::kLdK};
    warp_mma<true, false, kPrecise>(acc, rows, L::kLdK, sm + L::k + 32 * nh * L::kLdK, L::kLdK, nullptr, DK, nt_count);
#pragma unroll
    for (int nn = 0; nn < 4; ++nn)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = r0 + g + 8 * (e >> 1), jj = 32 * nh + 8 * nn + 2 * tq;
        *reinterpret_cast<float2*>(kh + R::kk + i * kLdC + jj) = make_float2(acc[0][nn][e], acc[0][nn][e + 1]);
        *reinterpret_cast<float2*>(kh + R::qk + i * kLdC + jj) = make_float2(acc[1][nn][e], acc[1][nn][e + 1]);
      }
  }
  // k^ transposed: a lane reads 4 consecutive elements of a row, 8 lanes 8 consecutive rows (one
  // conflict-free wavefront); a warp's stores go to 32 consecutive rows of kt.
  for (int i = threadIdx.x; i < kChunk * F4; i += kPrepThreads) {
    const int row = i % kChunk, d = 4 * (i / kChunk);
    const float4 v = *reinterpret_cast<const float4*>(sm + L::k + row * L::kLdK + d);
    sm[L::kt + (d + 0) * kLdC + row] = v.x;
    sm[L::kt + (d + 1) * kLdC + row] = v.y;
    sm[L::kt + (d + 2) * kLdC + row] = v.z;
    sm[L::kt + (d + 3) * kLdC + row] = v.w;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < DK * kLdC / 4; i += kPrepThreads)
    reinterpret_cast<float4*>(kh + R::kt)[i] = reinterpret_cast<const float4*>(sm + L::kt)[i];
  for (int i = threadIdx.x; i < kChunk * R::kLdK / 4; i += kPrepThreads)
    reinterpret_cast<float4*>(kh + R::q)[i] = reinterpret_cast<const float4*>(sm + L::q)[i];

  // Gates of the key head's value heads: lane l has tokens 2l and 2l+1; padded tokens get beta = 0
  // and g = 0, so they change nothing and G_63 = G_{n-1}.
  const int ratio = hv / hk;
  for (int hh = warp; hh < ratio; hh += kPrepWarps) {
    const int h = j * ratio + hh;
    const float A = expf(a_log[h]), dtb = dt_bias[h];
    float beta[2], lg[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * lane + e;
      const bool real = i < n;
      const int64_t r = int64_t(t0 + (real ? i : 0)) * ba_ld + h;
      const GdnGate gate = gdn_gate(b[r], a[r], A, dtb);
      beta[e] = real ? gate.beta : 0.f;
      lg[e] = real ? gate.log_decay : 0.f;
    }
    float sum = lg[0] + lg[1];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffff, sum, o);
      if (lane >= o) sum += y;
    }
    float* vh = rec + int64_t(hk) * R::floats + int64_t(h) * kValueHeadRecord;
    vh[2 * lane] = sum - lg[1];
    vh[2 * lane + 1] = sum;
    vh[kChunk + 2 * lane] = beta[0];
    vh[kChunk + 2 * lane + 1] = beta[1];
  }
}

// M_ij = scale_i e^{G_i - G_j} M_ij below the diagonal (kStrict) or on and below it, 0 elsewhere
// (scale null: 1), in place on a [chunk][kLdC] matrix, by one team (`tid` its thread index).
template <bool kStrict>
__device__ __forceinline__ void decay_lower(float* M, const float* G, const float* scale, int tid) {
  const int jj = tid % kChunk, i0 = tid / kChunk;
  const float gj = G[jj];
#pragma unroll
  for (int m = 0; m < kChunk * kChunk / kTeamThreads; ++m) {
    const int i = i0 + m * (kTeamThreads / kChunk);
    float* x = M + i * kLdC + jj;
    const bool keep = kStrict ? jj < i : jj <= i;
    *x = keep ? (scale ? scale[i] : 1.f) * __expf(G[i] - gj) * *x : 0.f;
  }
}

// Where a chunk kernel block's inputs are.
struct ChunkSources {
  const float* u;  // conv output rows [T, ld]: q | k | v
  const float* scratch;
  int64_t ld, record;
  int v_off, v_cols, key_head, head, hk;
};

// The inputs of chunk c that the start of its computation needs: K^K^^T into t, q^ and the gates by
// bulk copies (team thread 0 announces their bytes), and the v rows by cp.async (rows past n and
// columns past dv become zeros). Run by one team; `tid` is the thread's index in it.
template <int DK, int SL>
__device__ void issue_early(float* sm, uint64_t* bar, const ChunkSources& src, int first, int t0, int n, int tid) {
  using L = ChunkLayout<DK, SL>;
  using R = KeyHeadRecord<DK>;
  const float* rec = src.scratch + int64_t(first) * src.record;
  const float* kh = rec + int64_t(src.key_head) * R::floats;
  const float* vh = rec + int64_t(src.hk) * R::floats + int64_t(src.head) * kValueHeadRecord;
  if (tid == 0) {
    mbarrier_expect_bytes(bar, uint32_t(sizeof(float)) * (kChunk * kLdC + kChunk * L::kLdK + kValueHeadRecord));
    bulk_copy_to_shared(sm + L::t, kh + R::kk, kChunk * kLdC * sizeof(float), bar);
  } else if (tid == 32) {
    bulk_copy_to_shared(sm + L::q, kh + R::q, kChunk * L::kLdK * sizeof(float), bar);
  } else if (tid == 64) {
    bulk_copy_to_shared(sm + L::gates, vh, kValueHeadRecord * sizeof(float), bar);
  }
  constexpr int V4 = SL / 4;
  for (int i = tid; i < kChunk * V4; i += kTeamThreads) {
    const int r = i / V4, c = 4 * (i % V4);
    float* v = sm + L::v + r * L::kLdV + c;
    if (r < n && c < src.v_cols)  // v_cols is a multiple of 4
      cp_async16(smem_addr(v), src.u + int64_t(t0 + r) * src.ld + src.v_off + c);
    else
      *reinterpret_cast<float4*>(v) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  cp_async_commit();
}

// One thread issues the rest: k^ transposed, and Q^K^^T (free once the previous chunk's output and
// state update are done).
template <int DK, int SL>
__device__ void issue_late(float* sm, uint64_t* bar, const ChunkSources& src, int first) {
  using L = ChunkLayout<DK, SL>;
  using R = KeyHeadRecord<DK>;
  const float* kh = src.scratch + int64_t(first) * src.record + int64_t(src.key_head) * R::floats;
  mbarrier_expect_bytes(bar, uint32_t(sizeof(float)) * (R::kk - R::kt + R::q - R::qk));
  bulk_copy_to_shared(sm + L::kt, kh + R::kt, (R::kk - R::kt) * sizeof(float), bar);
  bulk_copy_to_shared(sm + L::p, kh + R::qk, (R::q - R::qk) * sizeof(float), bar);
}

template <int DK, bool kPrecise, int SL>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunked_kernel(const float* u, float* state, const int32_t* seq_start, const int32_t* state_slot,
                       const float* scratch, float* out, int hk, int hv, int dv, int min_tokens) {
  pdl_prologue();
  using L = ChunkLayout<DK, SL>;
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm + L::bars);  // early, late
  const int s = blockIdx.z, h = blockIdx.y, c0 = blockIdx.x * SL;
  const int t_begin = seq_start[s], t_end = seq_start[s + 1];
  if (t_end - t_begin < min_tokens || t_end <= t_begin) return;  // the recurrent kernel takes it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int key_dim = hk * DK;
  const ChunkSources src{u,
                         scratch,
                         2 * int64_t(key_dim) + int64_t(hv) * dv,
                         chunk_record_floats<DK>(hk, hv),
                         2 * key_dim + h * dv + c0,
                         min(SL, dv - c0),
                         h / (hv / hk),
                         h,
                         hk};
  const int first = first_chunk(seq_start, s, min_tokens);
  if (threadIdx.x == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
  }
  float* sc_base = sm + L::scalars;
  const float* G = sm + L::gates;
  const float* beta = G + kChunk;
  const bool state_team = warp < kTeamWarps;
  const int tw = warp % kTeamWarps, tid = threadIdx.x % kTeamThreads;  // indices within the team
  __syncthreads();
  if (!state_team) issue_early<DK, SL>(sm, &bars[0], src, first, t_begin, min(kChunk, t_end - t_begin), tid);

  // Derived per-token scalars (double-buffered: the output team prepares chunk c+1's while the
  // state team still uses chunk c's) and A = beta_i e^{G_i - G_j} (K^K^^T)_ij below the diagonal
  // (else 0) in t, from the gates and K^K^^T of the chunk that just landed. Output team.
  auto prepare_chunk = [&](float* scb) {
    cp_async_wait_all();
    if (tid < kChunk) {
      const float eg = expf(G[tid]);
      scb[kExpG * kChunk + tid] = eg;
      scb[kBetaExpG * kChunk + tid] = beta[tid] * eg;
      scb[kExpToLast * kChunk + tid] = expf(G[kChunk - 1] - G[tid]);
    }
    decay_lower<true>(sm + L::t, G, beta, tid);
  };

  // The state slice in the state team's accumulators: a warp holds MS row tiles of 16 (of dk) from
  // srow by 4 column tiles of 8 from scol (32 x 32 at dk 128 and 64 columns: the fewest operand
  // loads per mma; 16 x 32 at 32 columns).
  constexpr int kColGroups = SL / 32, kRowGroups = kTeamWarps / kColGroups;
  constexpr int MS = DK / (16 * kRowGroups), NTS = 4;
  static_assert(SL % 32 == 0 && MS >= 1 && MS * 16 * kRowGroups == DK, "the state team's tiles cover dk x SL");
  const int srow = 16 * MS * (tw % kRowGroups), scol = 32 * (tw / kRowGroups);
  float* st_global = state + (int64_t(state_slot[s]) * hv + h) * DK * dv;
  float S[MS][NTS][4];
  // f(S element, its row d of dk, its column c of the slice) for each of the warp's accumulators.
  auto for_state = [&](auto&& f) {
#pragma unroll
    for (int m = 0; m < MS; ++m)
#pragma unroll
      for (int n = 0; n < NTS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(S[m][n][e], srow + 16 * m + g + 8 * (e >> 1), scol + 8 * n + 2 * tq + (e & 1));
  };
  if (state_team) {
    for_state([&](float& x, int d, int col) {
      x = c0 + col < dv ? st_global[int64_t(d) * dv + c0 + col] : 0.f;
      sm[L::s_t + col * L::kLdK + d] = x;
    });
  } else {
    mbarrier_wait(&bars[0], 0);
    prepare_chunk(sc_base);
  }
  // Tiles of the chunk-row products in either team: rows 16*mt, 32 columns from 32*half (DK/2
  // columns for W).
  const int mt = tw & 3, half = tw >> 2, r0 = 16 * mt;
  constexpr int NT = SL / 8 / 2;
  const int vc = half * (SL / 2);

#pragma unroll 1
  for (int c = 0;; ++c) {
    const int t0 = t_begin + c * kChunk;
    if (t0 >= t_end) break;
    const int n = min(kChunk, t_end - t0);
    const bool has_next = t0 + kChunk < t_end;
    float* sc = sc_base + (c & 1) * kNumScalars * kChunk;
    fence_async_writes();
    __syncthreads();  // chunk c's t is masked; the previous chunk is done with kt, p, delta_t, s_t

    float o[1][NT][4];
    if (state_team) {
      mbarrier_wait(&bars[0], c & 1);  // (landed already: the output team waited)
      solve_unit_lower(sm + L::t, sm + L::solve, 1);
      mbarrier_wait(&bars[1], c & 1);
      // -W = -T diag(beta e^G) K^, in 32-column parts (registers: the state stays live).
#pragma unroll 1
      for (int wc = half * (DK / 2); wc < (half + 1) * (DK / 2); wc += 32) {
        float acc[1][4][4] = {};
        const float* const rows[1] = {sm + L::t + r0 * kLdC};
        warp_mma<true, true, kPrecise>(acc, rows, kLdC, sm + L::kt + wc * kLdC, kLdC, sc + kBetaExpG * kChunk, r0 + 16);
#pragma unroll
        for (int nn = 0; nn < 4; ++nn)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int i = r0 + g + 8 * (e >> 1), d = wc + 8 * nn + 2 * tq;
            *reinterpret_cast<float2*>(sm + L::w + i * L::kLdK + d) = make_float2(-acc[0][nn][e], -acc[0][nn][e + 1]);
          }
      }
      team_sync(1);
      {  // Delta = T diag(beta) V - W S.
        float acc[1][NT][4] = {};
        const float* const t_rows[1] = {sm + L::t + r0 * kLdC};
        warp_mma<false, true, kPrecise>(acc, t_rows, kLdC, sm + L::v + vc, L::kLdV, beta, r0 + 16);
        const float* const w_rows[1] = {sm + L::w + r0 * L::kLdK};
        warp_mma<true, false, kPrecise>(acc, w_rows, L::kLdK, sm + L::s_t + vc * L::kLdK, L::kLdK, nullptr, DK);
#pragma unroll
        for (int nn = 0; nn < NT; ++nn)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = r0 + g + 8 * (e >> 1), cc = vc + 8 * nn + 2 * tq + (e & 1);
            sm[L::delta_t + cc * kLdC + i] = acc[0][nn][e];
          }
      }
    } else {
      if (tid == 0) issue_late<DK, SL>(sm, &bars[1], src, first + c);
      {  // The output's first part: e^{G_i} (Q^ S)_i with the state before the chunk.
#pragma unroll
        for (int nn = 0; nn < NT; ++nn)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[0][nn][e] = 0.f;
        const float* const q_rows[1] = {sm + L::q + r0 * L::kLdK};
        warp_mma<true, false, kPrecise>(o, q_rows, L::kLdK, sm + L::s_t + vc * L::kLdK, L::kLdK, nullptr, DK);
        const float e_lo = sc[kExpG * kChunk + r0 + g], e_hi = sc[kExpG * kChunk + r0 + g + 8];
#pragma unroll
        for (int nn = 0; nn < NT; ++nn) {
          o[0][nn][0] *= e_lo;
          o[0][nn][1] *= e_lo;
          o[0][nn][2] *= e_hi;
          o[0][nn][3] *= e_hi;
        }
      }
      mbarrier_wait(&bars[1], c & 1);
      decay_lower<false>(sm + L::p, G, nullptr, tid);  // P = e^{G_i - G_j} (Q^K^^T)_ij, j <= i
    }
    fence_async_writes();
    __syncthreads();  // Delta and P are complete; t, q, the gates and v are free

    if (state_team) {
      // S = e^{G_last} S + K^^T diag(e^{G_last - G}) Delta, and S^T for the next chunk.
      const float decay_all = sc[kExpG * kChunk + kChunk - 1];
      for_state([&](float& x, int, int) { x *= decay_all; });
      const float* kt_rows[MS];
#pragma unroll
      for (int m = 0; m < MS; ++m) kt_rows[m] = sm + L::kt + (srow + 16 * m) * kLdC;
      warp_mma<true, true, kPrecise>(S, kt_rows, kLdC, sm + L::delta_t + scol * kLdC, kLdC, sc + kExpToLast * kChunk,
                                     kChunk);
      for_state([&](float& x, int d, int col) { sm[L::s_t + col * L::kLdK + d] = x; });
    } else {
      if (has_next)  // the next chunk's first inputs
        issue_early<DK, SL>(sm, &bars[0], src, first + c + 1, t0 + kChunk, min(kChunk, t_end - t0 - kChunk), tid);
      {  // O += P Delta, to the output rows of the chunk's tokens.
        const float* const p_rows[1] = {sm + L::p + r0 * kLdC};
        warp_mma<true, false, kPrecise>(o, p_rows, kLdC, sm + L::delta_t + vc * kLdC, kLdC, nullptr, r0 + 16);
#pragma unroll
        for (int nn = 0; nn < NT; ++nn)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = r0 + g + 8 * (e >> 1), cc = c0 + vc + 8 * nn + 2 * tq + (e & 1);
            if (i < n && cc < dv) out[int64_t(t0 + i) * hv * dv + int64_t(h) * dv + cc] = o[0][nn][e];
          }
      }
      if (has_next) {
        mbarrier_wait(&bars[0], (c + 1) & 1);
        prepare_chunk(sc_base + ((c + 1) & 1) * kNumScalars * kChunk);
      }
    }
  }
  if (state_team)
    for_state([&](float& x, int d, int col) {
      if (c0 + col < dv) st_global[int64_t(d) * dv + c0 + col] = x;
    });
}

bool precise_from_env() {
  const char* e = std::getenv("FATHOM_GDN_CHUNKED_PRECISE");
  return e && std::atoi(e) != 0;
}
bool g_chunked_precise = precise_from_env();

// FATHOM_GDN_SLICE=64 or 32 pins the chunk kernel's state columns a block (A/B runs); unset, the
// narrow slice is taken where twice the blocks fit one wave (dk 128 only).
int slice_from_env() {
  const char* e = std::getenv("FATHOM_GDN_SLICE");
  return e ? std::atoi(e) : 0;
}
int g_slice = slice_from_env();

template <int DK, int SL>
void launch_chunk_kernel(const float* u, float* state, const int32_t* seq_start, const int32_t* state_slot,
                         const float* scratch, float* out, int num_seqs, int hk, int hv, int dv, int min_tokens,
                         cudaStream_t s) {
  auto chunk = g_chunked_precise ? gdn_chunked_kernel<DK, true, SL> : gdn_chunked_kernel<DK, false, SL>;
  allow_dynamic_smem(reinterpret_cast<const void*>(chunk), int(ChunkLayout<DK, SL>::bytes));
  launch(chunk, dim3((dv + SL - 1) / SL, hv, num_seqs), kThreads, ChunkLayout<DK, SL>::bytes, s, u, state, seq_start,
         state_slot, scratch, out, hk, hv, dv, min_tokens);
}

template <int DK>
void launch_chunked(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                    const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot, float* out,
                    int num_seqs, int hk, int hv, int dv, int min_tokens, int max_seq_tokens, float* scratch,
                    cudaStream_t s) {
  auto prep = g_chunked_precise ? gdn_chunk_prep_kernel<DK, true> : gdn_chunk_prep_kernel<DK, false>;
  allow_dynamic_smem(reinterpret_cast<const void*>(prep), int(PrepLayout<DK>::bytes));
  launch(prep, dim3((max_seq_tokens + kChunk - 1) / kChunk, hk, num_seqs), kPrepThreads, PrepLayout<DK>::bytes, s, u, b,
         a, ba_ld, a_log, dt_bias, seq_start, hk, hv, dv, min_tokens, scratch);
  const int64_t wide_blocks = int64_t((dv + kSlice - 1) / kSlice) * hv * num_seqs;
  const bool narrow =
      DK == 128 && g_slice != kSlice && (g_slice == kNarrowSlice || 2 * wide_blocks <= multiprocessor_count());
  if constexpr (DK == 128) {
    if (narrow) {
      launch_chunk_kernel<DK, kNarrowSlice>(u, state, seq_start, state_slot, scratch, out, num_seqs, hk, hv, dv,
                                            min_tokens, s);
      return;
    }
  }
  launch_chunk_kernel<DK, kSlice>(u, state, seq_start, state_slot, scratch, out, num_seqs, hk, hv, dv, min_tokens, s);
}

}  // namespace

bool gdn_chunked_supported(int dk, int dv) {
  static const bool disabled = [] {
    const char* e = std::getenv("FATHOM_GDN_CHUNKED");
    return e && std::atoi(e) == 0;
  }();
  if (disabled || !(dk == 64 || dk == 128) || dv <= 0 || dv % 4 != 0) return false;
  // The chunk kernel takes 214 KB of shared memory (dk 128): SM90 and SM100 have it, SM120 not.
  const size_t need = dk == 64 ? ChunkLayout<64>::bytes : ChunkLayout<128>::bytes;
  return shared_memory_limit() >= std::max(need, dk == 64 ? PrepLayout<64>::bytes : PrepLayout<128>::bytes);
}

void set_gdn_chunked_precise(bool precise) { g_chunked_precise = precise; }
void set_gdn_chunked_slice(int columns) { g_slice = columns >= 0 ? columns : slice_from_env(); }

size_t gdn_chunked_scratch_bytes(int tokens, int min_tokens, int hk, int hv, int dk) {
  // Each chunked sequence (n >= min_tokens) has at most n/64 + 1 <= n/64 + n/min_tokens chunks.
  const int64_t chunks = tokens / kChunk + tokens / std::max(1, min_tokens) + 1;
  const int64_t record = dk == 64 ? chunk_record_floats<64>(hk, hv) : chunk_record_floats<128>(hk, hv);
  return size_t(chunks * record) * sizeof(float);
}

void gdn_chunked(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                 const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot, float* out,
                 int num_seqs, int hk, int hv, int dk, int dv, int min_tokens, int tokens, int max_seq_tokens,
                 DeviceArray<uint8_t> scratch, cudaStream_t s) {
  if (num_seqs == 0 || max_seq_tokens < std::max(1, min_tokens)) return;
  FATHOM_CHECK(gdn_chunked_supported(dk, dv), "gdn_chunked: unsupported here: head dims dk ", dk, ", dv ", dv,
               " (supported: dk 64 or 128, dv a multiple of 4, on a device with 214 KB of shared memory a block)");
  FATHOM_CHECK(hk > 0 && hv % hk == 0, "gdn_chunked: ", hv, " value heads over ", hk, " key heads");
  FATHOM_CHECK(is_aligned(u, 16), "gdn_chunked: u must be 16-byte aligned");
  FATHOM_CHECK(scratch.size >= int64_t(gdn_chunked_scratch_bytes(tokens, min_tokens, hk, hv, dk)),
               "gdn_chunked: scratch of ", scratch.size, " bytes is short for ", tokens, " tokens");
  float* sp = reinterpret_cast<float*>(scratch.data);
  if (dk == 64)
    launch_chunked<64>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, num_seqs, hk, hv, dv,
                       min_tokens, max_seq_tokens, sp, s);
  else
    launch_chunked<128>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, num_seqs, hk, hv, dv,
                        min_tokens, max_seq_tokens, sp, s);
  FATHOM_CUDA_LAUNCH_CHECK();
  inject_backend_fault(kGdnPrefillOp, kChunked, out, size_t(tokens) * hv * dv * sizeof(float), s);
}

}  // namespace fathom::cuda
