// NVFP4 W4A4 GEMM for SM120 (RTX PRO 6000 Blackwell, RTX 50xx): the warp-level block-scaled FP4
// MMA, mma.sync m16n8k64 kind::mxf4nvf4 scale_vec::4X with ue4m3 scales (one scale per 16 k,
// the NVFP4 block), which exists on sm_120a/sm_121a only. Both operands are K-major NVFP4 in the
// checkpoint layout, so tiles are copied to shared memory as they are (cp.async) and the fragments
// are plain 32-bit loads: a register holds 8 consecutive k of one row, which is how the codes sit
// in memory (element 2i in the low nibble of byte i).
//
// Block: 4 warps, a 64 (tokens) x 64 (outputs) tile, k in steps of 128 through a 3-stage cp.async
// pipeline (33 KB of static shared memory, under SM120's 99 KB). Warp (wm, wn) owns rows
// 32wm..32wm+31 and columns 32wn..32wn+31: 2 x 4 MMAs per k64 step.
//
// Fragments (PTX ISA "matrix fragments for mma.m16n8k64", CUTLASS SM120_16x8x64_TN_VS traits;
// g = lane / 4, t = lane % 4):
//   A (16 x 64): a0 row g, k 8t..8t+7; a1 row g+8, same k; a2 row g, k 32+8t..; a3 row g+8, k 32+8t..
//   B (64 x 8, column n = weight row): b0 n = g, k 8t..8t+7; b1 n = g, k 32+8t..
//   C (16 x 8): c0, c1 row g, columns 2t, 2t+1; c2, c3 row g+8.
//   scale A: lane gives the 4 scales (k-blocks 0..3 in bytes 0..3) of row g + 8 * (lane % 2);
//            lanes with lane % 4 >= 2 repeat lanes 0/1 of their quad (selectors byte 0, thread 0).
//   scale B: lane gives the 4 scales of column g.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/nvfp4_w4a4.h"

// The block-scaled mma.sync exists on the arch-specific SM12x targets (sm_120a, sm_121a and the
// sm_12xf family targets); everywhere else (sm_90a, sm_100a, ...) the kernel compiles to a trap.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
#if __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1200 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define FATHOM_W4A4_SM120_MMA 1
#endif
#endif

namespace fathom::cuda {
namespace {

constexpr int kBM = 64, kBN = 64;
constexpr int kThreads = 128;

#ifdef FATHOM_W4A4_SM120_MMA
constexpr int kBK = 128;                // k per pipeline stage (two MMA k-steps)
constexpr int kStages = 3;
constexpr int kCodeBytes = kBK / 2;     // codes of one row per stage
constexpr int kRowStride = kCodeBytes + 16;  // 80 bytes: the 8 rows a fragment load touches hit distinct banks
constexpr int kScaleWords = kBK / 64;   // one 32-bit word of 4 scales per row and MMA k-step

struct Stage {
  uint8_t a[kBM * kRowStride];
  uint8_t b[kBN * kRowStride];
  uint32_t sa[kBM * kScaleWords];
  uint32_t sb[kBN * kScaleWords];
};

// Operands load with cp_async*_zfill (mma.cuh): rows past T or N and k past K become zero codes,
// which contribute nothing whatever the scale.
__device__ __forceinline__ void mma_nvf4(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], uint32_t sfa,
                                         uint32_t sfb) {
  const uint16_t sel = 0;  // byte-id and thread-id selectors: scales in byte order, from lanes 0/1 of each quad
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, {%10}, {%11, %12}, {%13}, {%14, %15};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "h"(sel), "h"(sel), "r"(sfb),
        "h"(sel), "h"(sel));
}

// Copies k-tile `kt` of A (rows m0..) and B (rows n0..) into `st`: 2 code chunks of 16 bytes and one
// scale word of each operand per thread.
__device__ __forceinline__ void load_stage(Stage& st, const uint8_t* __restrict__ a_codes,
                                           const uint8_t* __restrict__ a_scales, const uint8_t* __restrict__ b_codes,
                                           const uint8_t* __restrict__ b_scales, int m0, int n0, int T, int N, int K,
                                           int kt) {
  const int tid = threadIdx.x;
  const int kb0 = kt * kCodeBytes, ks0 = kt * (kBK / 16);
  const int64_t row_bytes = K / 2, row_scales = K / 16;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = tid + i * kThreads, r = c / 4, q = c % 4;
    const bool kin = kb0 + q * 16 < row_bytes;
    const bool va = kin && m0 + r < T, vb = kin && n0 + r < N;
    cp_async16_zfill(smem_addr(st.a + r * kRowStride + q * 16),
                     va ? a_codes + (m0 + r) * row_bytes + kb0 + q * 16 : a_codes, va);
    cp_async16_zfill(smem_addr(st.b + r * kRowStride + q * 16),
                     vb ? b_codes + (n0 + r) * row_bytes + kb0 + q * 16 : b_codes, vb);
  }
  const int r = tid / kScaleWords, w = tid % kScaleWords;
  const bool kin = ks0 + w * 4 < row_scales;
  const bool va = kin && m0 + r < T, vb = kin && n0 + r < N;
  cp_async4_zfill(smem_addr(&st.sa[r * kScaleWords + w]), va ? a_scales + (m0 + r) * row_scales + ks0 + w * 4 : a_scales,
                  va);
  cp_async4_zfill(smem_addr(&st.sb[r * kScaleWords + w]), vb ? b_scales + (n0 + r) * row_scales + ks0 + w * 4 : b_scales,
                  vb);
}
#endif  // FATHOM_W4A4_SM120_MMA

__global__ void __launch_bounds__(kThreads) w4a4_sm120_kernel(const uint8_t* __restrict__ a_codes,
                                                              const uint8_t* __restrict__ a_scales,
                                                              const uint8_t* __restrict__ b_codes,
                                                              const uint8_t* __restrict__ b_scales, float alpha,
                                                              float* __restrict__ y, int T, int N, int K) {
  pdl_prologue();
#ifdef FATHOM_W4A4_SM120_MMA
  static_assert(kBM * 4 == 2 * kThreads && kBN * 4 == 2 * kThreads && kBM * kScaleWords == kThreads,
                "load_stage assumes 2 code chunks and 1 scale word per thread and operand");
  __shared__ __align__(16) Stage stages[kStages];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;
  const int KT = (K + kBK - 1) / kBK;

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(stages[s], a_codes, a_scales, b_codes, b_scales, m0, n0, T, N, K, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is free for the prefetch below
    const int nk = kt + kStages - 1;
    if (nk < KT) load_stage(stages[nk % kStages], a_codes, a_scales, b_codes, b_scales, m0, n0, T, N, K, nk);
    cp_async_commit();

    const Stage& st = stages[kt % kStages];
#pragma unroll
    for (int ks = 0; ks < kBK / 64; ++ks) {
      uint32_t af[2][4], sfa[2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint8_t* base = st.a + (wm * 32 + mi * 16 + g) * kRowStride + ks * 32 + 4 * t;
        af[mi][0] = *reinterpret_cast<const uint32_t*>(base);
        af[mi][1] = *reinterpret_cast<const uint32_t*>(base + 8 * kRowStride);
        af[mi][2] = *reinterpret_cast<const uint32_t*>(base + 16);
        af[mi][3] = *reinterpret_cast<const uint32_t*>(base + 8 * kRowStride + 16);
        sfa[mi] = st.sa[(wm * 32 + mi * 16 + g + 8 * (lane % 2)) * kScaleWords + ks];
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int n = wn * 32 + ni * 8 + g;
        const uint8_t* base = st.b + n * kRowStride + ks * 32 + 4 * t;
        const uint32_t bf[2] = {*reinterpret_cast<const uint32_t*>(base),
                                *reinterpret_cast<const uint32_t*>(base + 16)};
        const uint32_t sfb = st.sb[n * kScaleWords + ks];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_nvf4(acc[mi][ni], af[mi], bf, sfa[mi], sfb);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * 32 + mi * 16 + g + 8 * h;
        const int col = n0 + wn * 32 + ni * 8 + 2 * t;
        if (row >= T) continue;
        float* out = y + int64_t(row) * N + col;
        if (col < N) out[0] = acc[mi][ni][2 * h] * alpha;
        if (col + 1 < N) out[1] = acc[mi][ni][2 * h + 1] * alpha;
      }
#else
  __trap();  // not built for an SM12x arch-specific target: nvfp4_w4a4_sm120_available() is false
#endif
}

}  // namespace

bool nvfp4_w4a4_sm120_available() { return w4a4_kernel_has_body(reinterpret_cast<const void*>(w4a4_sm120_kernel)); }

void nvfp4_w4a4_gemm_sm120(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                           const uint8_t* b_scales, float alpha, float* y, int T, int N, int K, cudaStream_t s) {
  const dim3 grid((N + kBN - 1) / kBN, (T + kBM - 1) / kBM);
  launch(w4a4_sm120_kernel, grid, kThreads, 0, s, a_codes, a_scales, b_codes, b_scales, alpha, y, T, N, K);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
