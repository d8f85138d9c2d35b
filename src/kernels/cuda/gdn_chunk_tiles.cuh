// What the Gated DeltaNet prefill's three kernels share (gdn_chunk_prep.cu: the prep and WY
// kernels; gdn_chunked.cu: the chunk kernel): the chunk's size, the scratch record a chunk's
// kernels pass on, and the tensor-core tiles they compute with. The algebra is in gdn_chunked.cu.
#pragma once

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace fathom::cuda::gdn_chunk {

constexpr int kChunk = 64;  // tokens per chunk
// The chunk kernel runs as two teams of 8 warps; the WY kernel is one such team.
constexpr int kTeamWarps = 8;
constexpr int kTeamThreads = kTeamWarps * 32;
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

// What the WY kernel works out for the chunk kernel, per chunk and value head, in a region of the
// scratch after the chunk records (only where the WY form runs): -W [chunk][dk] (rows as in shared
// memory, so one bulk copy moves it) and U = T diag(beta) V [chunk][dv].
template <int DK>
struct WyRecord {
  static constexpr int kLdK = DK + 4;
  static constexpr int w = 0, u = kChunk * kLdK;
  __host__ __device__ static int64_t floats(int dv) { return u + int64_t(kChunk) * dv; }
  // Offset of value head h's record for chunk record `record` from the region's start.
  __host__ __device__ static int64_t offset(int record, int hv, int dv, int h) {
    return (int64_t(record) * hv + h) * floats(dv);
  }
};

// Index of sequence s's first chunk among the chunked sequences' (those with >= min_tokens).
__device__ inline int first_chunk(const int32_t* seq_start, int s, int min_tokens) {
  int c = 0;
  for (int i = 0; i < s; ++i) {
    const int n = seq_start[i + 1] - seq_start[i];
    if (n >= min_tokens && n > 0) c += (n + kChunk - 1) / kChunk;
  }
  return c;
}

// Chunk c of sequence s: its first token, its tokens and its record's index. The parallel kernels'
// blocks find theirs with place_chunk, false where the sequence is not chunked (fewer than
// min_tokens tokens) or has no chunk c.
struct ChunkPlace {
  int t0, n, record;
};
__device__ inline bool place_chunk(const int32_t* seq_start, int s, int c, int min_tokens, ChunkPlace& at) {
  const int t_begin = seq_start[s], len = seq_start[s + 1] - t_begin;
  if (len < min_tokens || c * kChunk >= len) return false;
  at = {t_begin + c * kChunk, min(kChunk, len - c * kChunk), first_chunk(seq_start, s, min_tokens) + c};
  return true;
}

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
__device__ inline void solve_unit_lower(float* T, float* X, int bar) {
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

// Launches (gdn_chunk_prep.cu), on every chunk of the sequences with at least min_tokens tokens in
// parallel. The prep kernel fills the chunk records (key heads and gates); the WY kernel, after it,
// solves each value head's T and writes -W and U into the WY region `wy`.
void launch_chunk_prep(int dk, bool precise, const float* u, const float* b, const float* a, int64_t ba_ld,
                       const float* a_log, const float* dt_bias, const int32_t* seq_start, int num_seqs, int hk,
                       int hv, int dv, int min_tokens, int max_seq_tokens, float* scratch, cudaStream_t s);
void launch_chunk_wy(int dk, bool precise, const float* u, const int32_t* seq_start, int num_seqs, int hk, int hv,
                     int dv, int min_tokens, int max_seq_tokens, const float* scratch, float* wy, cudaStream_t s);

}  // namespace fathom::cuda::gdn_chunk
