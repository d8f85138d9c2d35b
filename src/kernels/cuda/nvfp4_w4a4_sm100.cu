// NVFP4 W4A4 GEMM for SM100 (B200) with the 5th-generation tensor cores (tcgen05): operands in
// shared memory, block scales and the fp32 accumulator in tensor memory (TMEM).
//
// UNVERIFIED: written and compiled without a B200 (sm_100a SASS is produced, nothing has run).
// The layouts below follow the PTX ISA and CUTLASS's SM100 block-scaled MMA traits; until
// tests/cuda/test_cuda_nvfp4_w4a4.cpp passes on an SM100 GPU, treat this path as experimental.
//
// Deliberately simple (correctness first, one stage, no TMA, no warp specialisation): a CTA of 4
// warps computes y^T for 128 output features (the MMA's M: weight rows) x 128 tokens (N), so
// decode steps waste MMA rows of tokens, not weight traffic. Per k-step of 256:
//   1. all threads cp.async the W and A codes into shared memory in the no-swizzle K-major
//      "core matrix" layout (8 rows x 16 bytes = 8 x 32 codes, contiguous 128 bytes), and the
//      scales into the 512-byte scale-factor atoms that tcgen05.cp expects;
//   2. fence.proxy.async (the tensor core reads shared memory through the async proxy), barrier;
//   3. thread 0 copies the scales to TMEM (tcgen05.cp 32x128b.warpx4), issues the 4 MMAs
//      (tcgen05.mma kind::mxf4nvf4 block16, M=128 N=128 K=64 each) and tcgen05.commit to an mbarrier;
//   4. everyone waits on the mbarrier before shared memory and the TMEM scale columns are reused.
// Then each warp reads its 32 TMEM lanes (rows = features) with tcgen05.ld and writes y.
//
// Layouts (PTX ISA "tcgen05 matrix descriptors", "scale factor layout in tensor memory"; CUTLASS
// make_umma_desc, UMMA::tmem_sf_frg, SM100_UTCCP_4x32dp128bit):
//   operand tile (128 rows x 128 bytes of codes): core matrix (row r, 16-byte column c) at
//     c * 2048 + (r / 8) * 128 + (r % 8) * 16. Descriptor of MMA i: start = tile + 2i * 2048,
//     LBO = 2048 (next 16 bytes of k), SBO = 128 (next 8 rows), version 1, no swizzle.
//   scale atom of MMA i (128 rows x 4 scales, one per 16 k): byte (r % 32) * 16 + (r / 32) * 4 + j.
//     tcgen05.cp 32x128b.warpx4 puts its 32 rows of 16 bytes into 4 TMEM columns of lanes 0..31 and
//     replicates them to the other 3 lane quarters; MMA i reads the scales at column base + 4i.
//   accumulator: lane = feature row, column = token (fp32), columns 0..127 of the allocation.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/nvfp4_w4a4.h"

// tcgen05 with kind::mxf4nvf4 exists on the arch-specific SM100 targets (sm_100a / sm_100f,
// sm_103a / sm_103f); everywhere else (sm_90a, sm_120a, ...) the kernel compiles to a trap.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
#if __CUDA_ARCH_FAMILY_SPECIFIC__ == 1000 || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1030
#define FATHOM_W4A4_TCGEN05 1
#endif
#endif

namespace fathom::cuda {
namespace {

constexpr int kTileM = 128;  // weight rows (output features) per CTA: the MMA's M
constexpr int kTileN = 128;  // tokens per CTA: the MMA's N
constexpr int kThreads = 128;

#ifdef FATHOM_W4A4_TCGEN05
constexpr int kTileK = 256;                   // k per step
constexpr int kMmas = kTileK / 64;            // MMAs per step (K = 64 each)
constexpr int kRowBytes = kTileK / 2;         // 128 bytes of codes per row and step
constexpr int kChunks = kRowBytes / 16;       // 16-byte core-matrix columns per row
constexpr int kColumnBytes = (kTileM / 8) * 128;  // one core-matrix column of the tile (2048)
constexpr int kOperandBytes = kTileM * kRowBytes;
constexpr int kSfAtomBytes = 512;
constexpr uint32_t kTmemCols = 256;  // accumulator 128 + scales 2 x 16, rounded to a power of two
constexpr uint32_t kSfaCol = 128, kSfbCol = kSfaCol + 4 * kMmas;
// Instruction descriptor (PTX ISA "instruction descriptor for .kind::mxf4nvf4"): A and B E2M1
// (format 1) K-major, N >> 3 at bit 17, scale format 0 = UE4M3 at bit 23, M >> 4 at bit 24,
// scale-factor ids 0, dense K = 64.
constexpr uint32_t kIdesc = (1u << 7) | (1u << 10) | (uint32_t(kTileN >> 3) << 17) | (uint32_t(kTileM >> 4) << 24);
static_assert(kTileM == 128 && kTileN % 16 == 0 && kTileN <= 256, "tcgen05.mma cta_group::1 M=128 shape");

struct __align__(1024) Smem {
  uint8_t a[kOperandBytes];  // weight codes
  uint8_t b[kOperandBytes];  // activation codes
  uint8_t sfa[kMmas * kSfAtomBytes];
  uint8_t sfb[kMmas * kSfAtomBytes];
  uint64_t mbar;
  uint32_t tmem_base;
};

// Shared memory matrix descriptor, no swizzle: address, LBO and SBO in 16-byte units, version 1.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 46);
}

__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory"); }

__device__ __forceinline__ void mbar_wait(uint32_t addr, uint32_t phase) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(phase)
        : "memory");
  } while (!done);
}

// 32 consecutive fp32 columns of this warp's 32 TMEM lanes (one row per thread).
__device__ __forceinline__ void tmem_ld32(uint32_t taddr, uint32_t (&r)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
      "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]),
        "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]),
        "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]),
        "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr));
  asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
}

// One operand's k-step: 128 rows x kRowBytes of codes and 128 rows x kMmas words of scales.
__device__ __forceinline__ void load_operand(uint8_t* tile, uint8_t* sf, const uint8_t* __restrict__ codes,
                                             const uint8_t* __restrict__ scales, int row0, int rows, int K, int k0) {
  const int tid = threadIdx.x;
  const int64_t row_bytes = K / 2, row_scales = K / 16;
#pragma unroll
  for (int i = 0; i < kTileM * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx / kChunks, c = idx % kChunks;
    const int64_t kb = k0 / 2 + c * 16;
    const bool v = row0 + r < rows && kb < row_bytes;
    cp_async16_zfill(smem_addr(tile + c * kColumnBytes + (r / 8) * 128 + (r % 8) * 16),
                     v ? codes + (row0 + r) * row_bytes + kb : codes, v);
  }
#pragma unroll
  for (int i = 0; i < kTileM * kMmas / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx / kMmas, m = idx % kMmas;
    const int64_t ks = k0 / 16 + m * 4;
    const bool v = row0 + r < rows && ks < row_scales;
    cp_async4_zfill(smem_addr(sf + m * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4),
                    v ? scales + (row0 + r) * row_scales + ks : scales, v);
  }
}
#endif  // FATHOM_W4A4_TCGEN05

__global__ void __launch_bounds__(kThreads) w4a4_sm100_kernel(const uint8_t* __restrict__ a_codes,
                                                              const uint8_t* __restrict__ a_scales,
                                                              const uint8_t* __restrict__ b_codes,
                                                              const uint8_t* __restrict__ b_scales, float alpha,
                                                              float* __restrict__ y, int T, int N, int K) {
  pdl_prologue();
#ifdef FATHOM_W4A4_TCGEN05
  __shared__ Smem sm;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kTileM;  // first output feature (weight row)
  const int t0 = blockIdx.y * kTileN;  // first token
  const uint32_t mbar = smem_addr(&sm.mbar);

  if (warp == 0) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(smem_addr(&sm.tmem_base)),
                 "r"(kTmemCols)
                 : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  }
  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to tcgen05.commit's arrive
  }
  tc_fence_before();
  __syncthreads();
  tc_fence_after();
  const uint32_t tmem = sm.tmem_base;

  const int steps = (K + kTileK - 1) / kTileK;
  for (int s = 0; s < steps; ++s) {
    const int k0 = s * kTileK;
    // A of the MMA = the weights (rows n0..), B = the activations (rows t0..).
    load_operand(sm.a, sm.sfa, b_codes, b_scales, n0, N, K, k0);
    load_operand(sm.b, sm.sfb, a_codes, a_scales, t0, T, K, k0);
    cp_async_wait_all();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (tid == 0) {
      tc_fence_after();
      const int mmas = min(kMmas, (K - k0) / 64);
      for (int i = 0; i < mmas; ++i) {
        const uint64_t da = smem_desc(smem_addr(sm.sfa + i * kSfAtomBytes), 0, 128);
        const uint64_t db = smem_desc(smem_addr(sm.sfb + i * kSfAtomBytes), 0, 128);
        asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" ::"r"(tmem + kSfaCol + 4 * i), "l"(da)
                     : "memory");
        asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" ::"r"(tmem + kSfbCol + 4 * i), "l"(db)
                     : "memory");
      }
      for (int i = 0; i < mmas; ++i) {
        const uint64_t da = smem_desc(smem_addr(sm.a + 2 * i * kColumnBytes), kColumnBytes, 128);
        const uint64_t db = smem_desc(smem_addr(sm.b + 2 * i * kColumnBytes), kColumnBytes, 128);
        const uint32_t accumulate = (s > 0 || i > 0) ? 1u : 0u;
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
            "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16 [%0], %1, %2, %3, [%5], [%6], p;\n}\n" ::"r"(
                tmem),
            "l"(da), "l"(db), "r"(kIdesc), "r"(accumulate), "r"(tmem + kSfaCol + 4 * i), "r"(tmem + kSfbCol + 4 * i)
            : "memory");
      }
      // Arrives on the mbarrier once the MMAs (and the copies before them) have completed.
      asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(mbar)
                   : "memory");
    }
    mbar_wait(mbar, uint32_t(s & 1));
    tc_fence_after();
  }

  // Epilogue: thread (warp w, lane l) holds feature n0 + 32w + l for the tile's 128 tokens.
  const int n = n0 + warp * 32 + lane;
#pragma unroll 1
  for (int c0 = 0; c0 < kTileN; c0 += 32) {
    if (t0 + c0 >= T) break;  // warp-uniform: tcgen05.ld is .sync.aligned
    uint32_t r[32];
    tmem_ld32(tmem + (uint32_t(warp * 32) << 16) + uint32_t(c0), r);
    if (n < N) {
#pragma unroll
      for (int j = 0; j < 32; ++j)
        if (t0 + c0 + j < T) y[int64_t(t0 + c0 + j) * N + n] = __uint_as_float(r[j]) * alpha;
    }
  }
  tc_fence_before();
  __syncthreads();
  if (warp == 0)
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(tmem), "r"(kTmemCols) : "memory");
#else
  __trap();  // not built for an SM100 arch-specific target: nvfp4_w4a4_sm100_available() is false
#endif
}

}  // namespace

bool nvfp4_w4a4_sm100_available() { return w4a4_kernel_has_body(reinterpret_cast<const void*>(w4a4_sm100_kernel)); }

void nvfp4_w4a4_gemm_sm100(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                           const uint8_t* b_scales, float alpha, float* y, int T, int N, int K, cudaStream_t s) {
  const dim3 grid((N + kTileM - 1) / kTileM, (T + kTileN - 1) / kTileN);
  launch(w4a4_sm100_kernel, grid, kThreads, 0, s, a_codes, a_scales, b_codes, b_scales, alpha, y, T, N, K);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
