// The Gated DeltaNet prefill's parallel kernels, over every chunk at once (the chunk kernel in
// gdn_chunked.cu then walks each sequence's chunks in order): the prep kernel, per key head, and the
// WY kernel, per value head, which takes the solve of T and the products T diag(beta e^G) K^ and
// T diag(beta) V off the chunk kernel's sequential path. They write the chunk's scratch record and
// its WY records (gdn_chunk_tiles.cuh). The WY kernel computes its products as the chunk kernel does
// in the earlier form (the same tiles, operands and order), so outputs and states keep their bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_chunk_tiles.cuh"
#include "kernels/cuda/gdn_gate.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace fathom::cuda::gdn_chunk {
namespace {

constexpr int kPrepWarps = 8;
constexpr int kPrepThreads = kPrepWarps * 32;

// The prep kernel's shared memory: q and k rows, k^ transposed.
template <int DK>
struct PrepLayout {
  static constexpr int kLdK = DK + 4;
  static constexpr int q = 0, k = q + kChunk * kLdK, kt = k + kChunk * kLdK;
  static constexpr size_t bytes = size_t(kt + DK * kLdC) * sizeof(float);
};

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
  ChunkPlace at;
  if (!place_chunk(seq_start, blockIdx.z, blockIdx.x, min_tokens, at)) return;
  const int j = blockIdx.y, t0 = at.t0, n = at.n;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  float* rec = scratch + int64_t(at.record) * chunk_record_floats<DK>(hk, hv);
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

// The WY kernel's shared memory, in floats: K^K^^T masked to A, then T; k^ transposed; a piece of
// up to 128 columns of v (k-major reads at (row t, column g): a stride of 8 mod 32 floats); the
// gates; beta e^G; the solve's products.
template <int DK>
struct WyLayout {
  static constexpr int kPiece = 128, kLdV = kPiece + 8;
  static constexpr int t = 0, kt = t + kChunk * kLdC, v = kt + DK * kLdC, gates = v + kChunk * kLdV;
  static constexpr int beta_exp = gates + 2 * kChunk, solve = beta_exp + kChunk;
  static constexpr size_t bytes = size_t(solve + 32 * 40) * sizeof(float);
  static_assert(kt % 4 == 0 && v % 4 == 0 && gates % 4 == 0, "16-byte aligned regions");
};

// Grid: (chunks of the longest sequence, value heads, sequences); one team of 8 warps. Per chunk and
// value head: A from K^K^^T and the gates, T = (I + A)^{-1}, -W = -T diag(beta e^G) K^ and
// U = T diag(beta) V into the head's WY record; the chunk kernel starts Delta = U - W S from them.
template <int DK, bool kPrecise>
__global__ void __launch_bounds__(kTeamThreads)
    gdn_chunk_wy_kernel(const float* u, const int32_t* seq_start, int hk, int hv, int dv, int min_tokens,
                        const float* scratch, float* wy_region) {
  pdl_prologue();
  using L = WyLayout<DK>;
  using R = KeyHeadRecord<DK>;
  using Wy = WyRecord<DK>;
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  ChunkPlace at;
  if (!place_chunk(seq_start, blockIdx.z, blockIdx.x, min_tokens, at)) return;
  const int h = blockIdx.y, t0 = at.t0, n = at.n;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const float* rec = scratch + int64_t(at.record) * chunk_record_floats<DK>(hk, hv);
  const float* kh = rec + int64_t(h / (hv / hk)) * R::floats;
  const float* vh = rec + int64_t(hk) * R::floats + int64_t(h) * kValueHeadRecord;
  float* wy = wy_region + Wy::offset(at.record, hv, dv, h);
  const int64_t ld = 2 * int64_t(hk) * DK + int64_t(hv) * dv;
  const float* v_rows = u + 2 * int64_t(hk) * DK + int64_t(h) * dv;

  // v columns [c0, c0 + 128) (rows past n and columns past dv as zeros, as the chunk kernel loaded v).
  auto load_v = [&](int c0) {
    constexpr int V4 = L::kPiece / 4;
    for (int i = tid; i < kChunk * V4; i += kTeamThreads) {
      const int r = i / V4, col = 4 * (i % V4);
      float* dst = sm + L::v + r * L::kLdV + col;
      if (r < n && c0 + col < dv)  // dv is a multiple of 4
        cp_async16(smem_addr(dst), v_rows + int64_t(t0 + r) * ld + c0 + col);
      else
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  for (int i = tid; i < kChunk * kLdC / 4; i += kTeamThreads)
    cp_async16(smem_addr(sm + L::t + 4 * i), kh + R::kk + 4 * i);
  for (int i = tid; i < DK * kLdC / 4; i += kTeamThreads)
    cp_async16(smem_addr(sm + L::kt + 4 * i), kh + R::kt + 4 * i);
  if (tid < kValueHeadRecord / 4) cp_async16(smem_addr(sm + L::gates + 4 * tid), vh + 4 * tid);
  load_v(0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  const float* G = sm + L::gates;
  const float* beta = G + kChunk;
  if (tid < kChunk) sm[L::beta_exp + tid] = beta[tid] * expf(G[tid]);
  decay_lower<true>(sm + L::t, G, beta, tid);  // A
  __syncthreads();
  solve_unit_lower(sm + L::t, sm + L::solve, 1);

  const int mt = warp & 3, half = warp >> 2, r0 = 16 * mt;
  const float* const t_rows[1] = {sm + L::t + r0 * kLdC};
  // -W, in 32-column parts.
#pragma unroll 1
  for (int wc = half * (DK / 2); wc < (half + 1) * (DK / 2); wc += 32) {
    float acc[1][4][4] = {};
    warp_mma<true, true, kPrecise>(acc, t_rows, kLdC, sm + L::kt + wc * kLdC, kLdC, sm + L::beta_exp, r0 + 16);
#pragma unroll
    for (int nn = 0; nn < 4; ++nn)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = r0 + g + 8 * (e >> 1), d = wc + 8 * nn + 2 * tq;
        *reinterpret_cast<float2*>(wy + Wy::w + i * Wy::kLdK + d) = make_float2(-acc[0][nn][e], -acc[0][nn][e + 1]);
      }
  }
  // U, in pieces of 128 columns: a warp's 16 rows by 64 columns.
#pragma unroll 1
  for (int c0 = 0; c0 < dv; c0 += L::kPiece) {
    if (c0 > 0) {
      __syncthreads();  // the previous piece's reads are done
      load_v(c0);
      cp_async_commit();
      cp_async_wait_all();
      __syncthreads();
    }
    constexpr int NT = L::kPiece / 16;
    const int vc = half * (L::kPiece / 2);
    float acc[1][NT][4] = {};
    warp_mma<false, true, kPrecise>(acc, t_rows, kLdC, sm + L::v + vc, L::kLdV, beta, r0 + 16);
#pragma unroll
    for (int nn = 0; nn < NT; ++nn)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = r0 + g + 8 * (e >> 1), col = c0 + vc + 8 * nn + 2 * tq;
        if (col < dv)  // and so col + 1 (dv is even)
          *reinterpret_cast<float2*>(wy + Wy::u + int64_t(i) * dv + col) =
              make_float2(acc[0][nn][e], acc[0][nn][e + 1]);
      }
  }
}

template <int DK>
void launch_prep(bool precise, const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                 const float* dt_bias, const int32_t* seq_start, int num_seqs, int hk, int hv, int dv, int min_tokens,
                 int max_seq_tokens, float* scratch, cudaStream_t s) {
  auto prep = precise ? gdn_chunk_prep_kernel<DK, true> : gdn_chunk_prep_kernel<DK, false>;
  allow_dynamic_smem(reinterpret_cast<const void*>(prep), int(PrepLayout<DK>::bytes));
  launch(prep, dim3((max_seq_tokens + kChunk - 1) / kChunk, hk, num_seqs), kPrepThreads, PrepLayout<DK>::bytes, s, u, b,
         a, ba_ld, a_log, dt_bias, seq_start, hk, hv, dv, min_tokens, scratch);
}

template <int DK>
void launch_wy(bool precise, const float* u, const int32_t* seq_start, int num_seqs, int hk, int hv, int dv,
               int min_tokens, int max_seq_tokens, const float* scratch, float* wy_region, cudaStream_t s) {
  auto wy = precise ? gdn_chunk_wy_kernel<DK, true> : gdn_chunk_wy_kernel<DK, false>;
  allow_dynamic_smem(reinterpret_cast<const void*>(wy), int(WyLayout<DK>::bytes));
  launch(wy, dim3((max_seq_tokens + kChunk - 1) / kChunk, hv, num_seqs), kTeamThreads, WyLayout<DK>::bytes, s, u,
         seq_start, hk, hv, dv, min_tokens, scratch, wy_region);
}

}  // namespace

void launch_chunk_prep(int dk, bool precise, const float* u, const float* b, const float* a, int64_t ba_ld,
                       const float* a_log, const float* dt_bias, const int32_t* seq_start, int num_seqs, int hk,
                       int hv, int dv, int min_tokens, int max_seq_tokens, float* scratch, cudaStream_t s) {
  if (dk == 64)
    launch_prep<64>(precise, u, b, a, ba_ld, a_log, dt_bias, seq_start, num_seqs, hk, hv, dv, min_tokens,
                    max_seq_tokens, scratch, s);
  else
    launch_prep<128>(precise, u, b, a, ba_ld, a_log, dt_bias, seq_start, num_seqs, hk, hv, dv, min_tokens,
                     max_seq_tokens, scratch, s);
}

void launch_chunk_wy(int dk, bool precise, const float* u, const int32_t* seq_start, int num_seqs, int hk, int hv,
                     int dv, int min_tokens, int max_seq_tokens, const float* scratch, float* wy, cudaStream_t s) {
  if (dk == 64)
    launch_wy<64>(precise, u, seq_start, num_seqs, hk, hv, dv, min_tokens, max_seq_tokens, scratch, wy, s);
  else
    launch_wy<128>(precise, u, seq_start, num_seqs, hk, hv, dv, min_tokens, max_seq_tokens, scratch, wy, s);
}

}  // namespace fathom::cuda::gdn_chunk
