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
// Three kernels. Two are parallel over every chunk (gdn_chunk_prep.cu): the prep kernel, per key
// head, works out what the value heads of a key head share (q^, k^ transposed, K^ K^^T, Q^ K^^T)
// and each value head's beta and G; the WY kernel, per value head, solves T and computes -W and
// U = T diag(beta) V; both into a scratch record per chunk. The chunk kernel (here) is sequential
// over a sequence's chunks: one block (one per SM: up to 214 KB of shared memory) owns 64 state
// columns of one value head (32 where twice the blocks still fit one wave, dk 128; the same bits)
// and runs as two teams of 8 warps. The state team keeps the state slice in mma accumulators (and
// transposed in shared memory as the B operand) and computes Delta = U - W S and the state update;
// the output team computes Q^ S, P and the output. The earlier form, where the state team solves T
// and computes W and U itself, has the same bits; it runs where the chunk kernel's blocks fill the
// GPU (wy_form).
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
#include "kernels/cuda/gdn_chunk_tiles.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {
using namespace gdn_chunk;

// State columns per block of the chunk kernel: 64, or 32 where twice the blocks still fit the GPU
// in one wave (few value heads and sequences: the chunks are sequential, so a block's time is the
// kernel's, and the k side each block repeats costs less than the idle SMs).
constexpr int kSlice = 64;
constexpr int kNarrowSlice = 32;
// The chunk kernel runs one block per SM as two teams of 8 warps: the state team (warps 0-7)
// computes Delta and the state update (and, in the earlier form, solves T and computes W); the
// output team (warps 8-15) computes Q^ S and P, then the output from Delta, in parallel with it.
constexpr int kWarps = 2 * kTeamWarps;
constexpr int kThreads = kWarps * 32;

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
  static constexpr int t = kt + KeyHeadRecord<DK>::kk;             // K^K^^T, masked, then T (earlier form)
  static constexpr int p = kt + KeyHeadRecord<DK>::qk;             // Q^K^^T, then P
  static constexpr int q = kt + KeyHeadRecord<DK>::q;              // q^ [chunk][dk]
  static constexpr int w = kt + KeyHeadRecord<DK>::floats;         // -W [chunk][dk], as in a WY record
  static constexpr int gates = w + kChunk * kLdK;                  // G | beta
  static constexpr int v = gates + kValueHeadRecord;               // v, or U [chunk][slice]
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

// Where a chunk kernel block's inputs are.
struct ChunkSources {
  const float* u;  // conv output rows [T, ld]: q | k | v
  const float* scratch;
  const float* wy;  // the WY region
  int64_t ld, record;
  int v_off, v_cols, key_head, head, hk, hv, dv, col0;
};

// The inputs of chunk c that the start of its computation needs: -W into w (K^K^^T into t in the
// earlier form), q^ and the gates by bulk copies (team thread 0 announces their bytes), and the
// slice's columns of U (v rows) by cp.async (columns past dv, and v's rows past n, become zeros).
// Run by one team; `tid` is the thread's index in it.
template <int DK, int SL, bool kWy>
__device__ void issue_early(float* sm, uint64_t* bar, const ChunkSources& src, int first, int t0, int n, int tid) {
  using L = ChunkLayout<DK, SL>;
  using R = KeyHeadRecord<DK>;
  const float* rec = src.scratch + int64_t(first) * src.record;
  const float* kh = rec + int64_t(src.key_head) * R::floats;
  const float* vh = rec + int64_t(src.hk) * R::floats + int64_t(src.head) * kValueHeadRecord;
  const float* wy = kWy ? src.wy + WyRecord<DK>::offset(first, src.hv, src.dv, src.head) : nullptr;
  if (tid == 0) {
    constexpr int first_floats = kWy ? kChunk * L::kLdK : kChunk * kLdC;
    mbarrier_expect_bytes(bar, uint32_t(sizeof(float)) * (first_floats + kChunk * L::kLdK + kValueHeadRecord));
    if (kWy)
      bulk_copy_to_shared(sm + L::w, wy + WyRecord<DK>::w, first_floats * sizeof(float), bar);
    else
      bulk_copy_to_shared(sm + L::t, kh + R::kk, first_floats * sizeof(float), bar);
  } else if (tid == 32) {
    bulk_copy_to_shared(sm + L::q, kh + R::q, kChunk * L::kLdK * sizeof(float), bar);
  } else if (tid == 64) {
    bulk_copy_to_shared(sm + L::gates, vh, kValueHeadRecord * sizeof(float), bar);
  }
  constexpr int V4 = SL / 4;
  for (int i = tid; i < kChunk * V4; i += kTeamThreads) {
    const int r = i / V4, c = 4 * (i % V4);
    float* v = sm + L::v + r * L::kLdV + c;
    if (kWy && c < src.v_cols)
      cp_async16(smem_addr(v), wy + WyRecord<DK>::u + int64_t(r) * src.dv + src.col0 + c);
    else if (!kWy && r < n && c < src.v_cols)  // v_cols is a multiple of 4
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

template <int DK, bool kPrecise, int SL, bool kWy>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunked_kernel(const float* u, float* state, const int32_t* seq_start, const int32_t* state_slot,
                       const float* scratch, const float* wy, float* out, int hk, int hv, int dv, int min_tokens) {
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
                         wy,
                         2 * int64_t(key_dim) + int64_t(hv) * dv,
                         chunk_record_floats<DK>(hk, hv),
                         2 * key_dim + h * dv + c0,
                         min(SL, dv - c0),
                         h / (hv / hk),
                         h,
                         hk,
                         hv,
                         dv,
                         c0};
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
  if (!state_team) issue_early<DK, SL, kWy>(sm, &bars[0], src, first, t_begin, min(kChunk, t_end - t_begin), tid);

  // Derived per-token scalars (double-buffered: the output team prepares chunk c+1's while the
  // state team still uses chunk c's) and, in the earlier form, A = beta_i e^{G_i - G_j} (K^K^^T)_ij
  // below the diagonal (else 0) in t, from the gates and K^K^^T of the chunk that just landed.
  // Output team.
  auto prepare_chunk = [&](float* scb) {
    cp_async_wait_all();
    if (tid < kChunk) {
      const float eg = expf(G[tid]);
      scb[kExpG * kChunk + tid] = eg;
      scb[kBetaExpG * kChunk + tid] = beta[tid] * eg;
      scb[kExpToLast * kChunk + tid] = expf(G[kChunk - 1] - G[tid]);
    }
    if (!kWy) decay_lower<true>(sm + L::t, G, beta, tid);
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
  // A warp's tiles of Delta (rows from r0, columns from vc) into delta_t, transposed.
  auto store_delta = [&](const float(&acc)[1][NT][4]) {
#pragma unroll
    for (int nn = 0; nn < NT; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = r0 + g + 8 * (e >> 1), cc = vc + 8 * nn + 2 * tq + (e & 1);
        sm[L::delta_t + cc * kLdC + i] = acc[0][nn][e];
      }
  };

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
    if (state_team && kWy) {
      mbarrier_wait(&bars[0], c & 1);  // -W (landed already: the output team waited)
      // Delta = U - W S.
      float acc[1][NT][4];
#pragma unroll
      for (int nn = 0; nn < NT; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[0][nn][e] = sm[L::v + (r0 + g + 8 * (e >> 1)) * L::kLdV + vc + 8 * nn + 2 * tq + (e & 1)];
      const float* const w_rows[1] = {sm + L::w + r0 * L::kLdK};
      warp_mma<true, false, kPrecise>(acc, w_rows, L::kLdK, sm + L::s_t + vc * L::kLdK, L::kLdK, nullptr, DK);
      store_delta(acc);
    } else if (state_team) {
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
        store_delta(acc);
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
      if (kWy) mbarrier_wait(&bars[1], c & 1);  // k^ transposed (landed already: the output team waited)
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
        issue_early<DK, SL, kWy>(sm, &bars[0], src, first + c + 1, t0 + kChunk, min(kChunk, t_end - t0 - kChunk), tid);
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

// Whether the chunk kernel's 64-column blocks for `seqs` sequences leave half the GPU or more idle
// (dk 128): the rule for both the narrow slices and the WY form.
bool leaves_half_idle(int dk, int dv, int hv, int seqs) {
  return dk == 128 && 2 * int64_t((dv + kSlice - 1) / kSlice) * hv * seqs <= multiprocessor_count();
}

// Where T, W and U are solved: in the WY kernel (1), inside the chunk kernel (0), or by the shape
// (2, FATHOM_GDN_WY unset): the WY kernel where one sequence's chunk kernel leaves half the GPU or
// more idle (its narrow-slice case), where the chunk kernel's sequential path is the kernel's time;
// where its blocks fill the GPU, moving the solve off that path saves nothing (measured: the 397B's
// 64 value heads) and its records cost scratch. The same bits either way.
enum WyMode { kWyOff = 0, kWyOn = 1, kWyByShape = 2 };
int wy_from_env() {
  const char* e = std::getenv("FATHOM_GDN_WY");
  return !e ? kWyByShape : std::atoi(e) != 0 ? kWyOn : kWyOff;
}
int g_wy = wy_from_env();
bool wy_form(int hv, int dk, int dv) {
  if (g_wy != kWyByShape) return g_wy == kWyOn;
  return leaves_half_idle(dk, dv, hv, 1);
}

template <int DK, int SL>
void launch_chunk_kernel(const float* u, float* state, const int32_t* seq_start, const int32_t* state_slot,
                         const float* scratch, const float* wy, float* out, int num_seqs, int hk, int hv, int dv,
                         int min_tokens, cudaStream_t s) {
  const bool with_wy = wy != nullptr;
  auto chunk = g_chunked_precise
                   ? (with_wy ? gdn_chunked_kernel<DK, true, SL, true> : gdn_chunked_kernel<DK, true, SL, false>)
                   : (with_wy ? gdn_chunked_kernel<DK, false, SL, true> : gdn_chunked_kernel<DK, false, SL, false>);
  allow_dynamic_smem(reinterpret_cast<const void*>(chunk), int(ChunkLayout<DK, SL>::bytes));
  launch(chunk, dim3((dv + SL - 1) / SL, hv, num_seqs), kThreads, ChunkLayout<DK, SL>::bytes, s, u, state, seq_start,
         state_slot, scratch, wy, out, hk, hv, dv, min_tokens);
}

template <int DK>
void launch_chunked(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                    const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot, float* out,
                    int num_seqs, int hk, int hv, int dv, int min_tokens, int max_seq_tokens, float* scratch,
                    float* wy, cudaStream_t s) {
  launch_chunk_prep(DK, g_chunked_precise, u, b, a, ba_ld, a_log, dt_bias, seq_start, num_seqs, hk, hv, dv, min_tokens,
                    max_seq_tokens, scratch, s);
  if (wy)
    launch_chunk_wy(DK, g_chunked_precise, u, seq_start, num_seqs, hk, hv, dv, min_tokens, max_seq_tokens, scratch, wy,
                    s);
  const bool narrow =
      DK == 128 && g_slice != kSlice && (g_slice == kNarrowSlice || leaves_half_idle(DK, dv, hv, num_seqs));
  if constexpr (DK == 128) {
    if (narrow) {
      launch_chunk_kernel<DK, kNarrowSlice>(u, state, seq_start, state_slot, scratch, wy, out, num_seqs, hk, hv, dv,
                                            min_tokens, s);
      return;
    }
  }
  launch_chunk_kernel<DK, kSlice>(u, state, seq_start, state_slot, scratch, wy, out, num_seqs, hk, hv, dv, min_tokens,
                                  s);
}

}  // namespace

bool gdn_chunked_supported(int dk, int dv) {
  static const bool disabled = [] {
    const char* e = std::getenv("FATHOM_GDN_CHUNKED");
    return e && std::atoi(e) == 0;
  }();
  if (disabled || !(dk == 64 || dk == 128) || dv <= 0 || dv % 4 != 0) return false;
  // The chunk kernel takes 214 KB of shared memory (dk 128): SM90 and SM100 have it, SM120 not. The
  // prep and WY kernels take less (at most 102 KB).
  const size_t need = dk == 64 ? ChunkLayout<64>::bytes : ChunkLayout<128>::bytes;
  return shared_memory_limit() >= need;
}

void set_gdn_chunked_precise(bool precise) { g_chunked_precise = precise; }
void set_gdn_chunked_slice(int columns) { g_slice = columns >= 0 ? columns : slice_from_env(); }
void set_gdn_chunked_wy(int on) { g_wy = on >= 0 ? (on != 0 ? kWyOn : kWyOff) : wy_from_env(); }

namespace {
// Chunk records the scratch holds: each chunked sequence (n >= min_tokens) has at most
// n/64 + 1 <= n/64 + n/min_tokens chunks.
int64_t scratch_chunks(int tokens, int min_tokens) { return tokens / kChunk + tokens / std::max(1, min_tokens) + 1; }
int64_t record_floats(int hk, int hv, int dk) {
  return dk == 64 ? chunk_record_floats<64>(hk, hv) : chunk_record_floats<128>(hk, hv);
}
}  // namespace

// The chunk records, then (the WY form) the WY region: a WY record per chunk record and value head.
size_t gdn_chunked_scratch_bytes(int tokens, int min_tokens, int hk, int hv, int dk, int dv) {
  const int64_t wy_record = dk == 64 ? WyRecord<64>::floats(dv) : WyRecord<128>::floats(dv);
  const int64_t wy = wy_form(hv, dk, dv) ? int64_t(hv) * wy_record : 0;
  return size_t(scratch_chunks(tokens, min_tokens) * (record_floats(hk, hv, dk) + wy)) * sizeof(float);
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
  FATHOM_CHECK(scratch.size >= int64_t(gdn_chunked_scratch_bytes(tokens, min_tokens, hk, hv, dk, dv)),
               "gdn_chunked: scratch of ", scratch.size, " bytes is short for ", tokens, " tokens");
  float* sp = reinterpret_cast<float*>(scratch.data);
  float* wy = wy_form(hv, dk, dv) ? sp + scratch_chunks(tokens, min_tokens) * record_floats(hk, hv, dk) : nullptr;
  if (dk == 64)
    launch_chunked<64>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, num_seqs, hk, hv, dv,
                       min_tokens, max_seq_tokens, sp, wy, s);
  else
    launch_chunked<128>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, num_seqs, hk, hv, dv,
                        min_tokens, max_seq_tokens, sp, wy, s);
  FATHOM_CUDA_LAUNCH_CHECK();
  inject_backend_fault(kGdnPrefillOp, kChunked, out, size_t(tokens) * hv * dv * sizeof(float), s);
}

}  // namespace fathom::cuda
