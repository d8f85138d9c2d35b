// The skinny GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): y[T, N] = x[T, K] W[N, K]^T for the
// same products as the mma.sync form (gemm_skinny.cu: decode batches of 6 to 64 tokens, bf16),
// with blocks of 128 weight rows over one K slice and the same sum of the slices over a
// thread-block cluster (gemm_skinny.cuh). Its slices may be 1,024 k wide wherever that fills the
// wave (the token rows are staged a slab at a time, not a slice): fewer, longer blocks measured
// faster at 8 tokens on the H100, the same at 64 (docs/perf.md, stop 71).
//
// Why a second form: the mma.sync form holds the weights in registers and issues 32 MMAs and 16
// shared-memory loads a k64 step from the same warps that wait on HBM, which at 64 tokens is
// slower than cuBLASLt (docs/perf.md, stop 70). Here both operands go to shared memory by
// cp.async (no registers, no shuffles) and the tensor cores read them there: per 64-k slab, the
// block's 128 weight rows and the T token rows, as K-major tiles of 128-byte rows with the
// 128-byte swizzle (wgmma.cuh); each warpgroup's 64 rows are the MMA's A, the tokens (rounded up
// to 8, 16, 32 or 64) its B. A pipeline of 4 slabs keeps 3 slabs of weights in flight; the
// weights of the first 3 are asked for before the PDL wait (they are constant during a forward).
//
// Bits: a token's sum runs in an order fixed by (N, K) alone (slab by slab, the k16 steps in
// order, then the slices in rank order); checked bit-identical across T in the GPU tests.
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_skinny.cuh"
#include "kernels/cuda/gemm_skinny.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace fathom::cuda {
namespace {

using namespace skinny;

constexpr int kRowBytes = kStepK * 2;                 // one slab of a row: one 128-byte swizzle row
constexpr int kWeightBytes = kRowsPerBlock * kRowBytes;  // a slab's weight tile, 16 KB
constexpr int kStages = 4;

// A stage: the weight tile, then the token tile (8 NT rows), both 1024-aligned.
__host__ __device__ constexpr int stage_bytes(int n_tiles) { return kWeightBytes + 8 * n_tiles * kRowBytes; }
size_t smem_bytes(int n_tiles) {
  return std::max(size_t(kStages) * stage_bytes(n_tiles), partial_bytes(n_tiles)) + 1024;  // + room to align
}

// The swizzled place of 16-byte chunk c of tile row r.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return uint32_t(r * kRowBytes + 16 * (c ^ (r & 7))); }

// NT n8 tiles of tokens (T <= 8 NT). Grid (row groups, slices), clusters of (1, slices); two
// blocks an SM.
template <int NT>
__global__ void __launch_bounds__(kThreads, 2) gemm_skinny_wgmma_kernel(const bf16_t* __restrict__ w,
                                                                        const bf16_t* __restrict__ x,
                                                                        float* __restrict__ y, int T, int N, int K,
                                                                        int slice_k) {
#ifdef FATHOM_WGMMA
  constexpr int kTok = 8 * NT, kStage = stage_bytes(NT);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  float* partial = reinterpret_cast<float*>(smem_raw + (base - raw));  // after the MMAs
  const int t = threadIdx.x, warp = t / 32, c = t % 8;
  const int group_row = blockIdx.x * kRowsPerBlock;
  const int k0 = blockIdx.y * slice_k, k1 = min(K, k0 + slice_k);
  const int slabs = (k1 - k0 + kStepK - 1) / kStepK;
  // Chunk c (8 k) of a slab: K is a multiple of 16, so it is all inside the slice or all past it.
  auto load_weights = [&](int ks) {
    const uint32_t stage = base + uint32_t((ks % kStages) * kStage);
    const int k = k0 + ks * kStepK + 8 * c;
#pragma unroll
    for (int i = 0; i < kRowsPerBlock * 8 / kThreads; ++i) {
      const int r = t / 8 + (kThreads / 8) * i, n = group_row + r;
      const bool valid = k < k1 && n < N;
      cp_async16_zfill(stage + sw128(r, c), valid ? w + int64_t(n) * K + k : w, valid);
    }
  };
  auto load_tokens = [&](int ks) {
    const uint32_t stage = base + uint32_t((ks % kStages) * kStage + kWeightBytes);
    const int k = k0 + ks * kStepK + 8 * c;
    for (int r = t / 8; r < kTok; r += kThreads / 8) {
      const bool valid = k < k1 && r < T;  // zeros for tokens past T
      cp_async16_zfill(stage + sw128(r, c), valid ? x + int64_t(r) * K + k : x, valid);
    }
  };
  for (int ks = 0; ks < kStages - 1 && ks < slabs; ++ks) load_weights(ks);
  pdl_prologue();
  // Group ks: slab ks's tokens (group 0 also the weights asked for above).
  for (int ks = 0; ks < kStages - 1; ++ks) {
    if (ks < slabs) load_tokens(ks);
    cp_async_commit();
  }

  constexpr int kAcc = 4 * NT;  // m64 x 8 NT over a warpgroup's 128 threads
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  const uint32_t a_tile = uint32_t((warp / 4) * 64 * kRowBytes);  // this warpgroup's 64 rows
  for (int ks = 0; ks < slabs; ++ks) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async();  // the copies' bytes, for the tensor cores' reads
    __syncthreads();      // every thread's copies of slab ks; every MMA of slab ks - 1 done (below)
    if (ks + kStages - 1 < slabs) {
      load_weights(ks + kStages - 1);
      load_tokens(ks + kStages - 1);
    }
    cp_async_commit();
    const uint32_t stage = base + uint32_t((ks % kStages) * kStage);
    uint64_t da[4], db[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      da[s] = sw128_descriptor(stage + a_tile + 32 * s);
      db[s] = sw128_descriptor(stage + kWeightBytes + 32 * s);
      pin(da[s]);
      pin(db[s]);
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) pin(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) WgmmaSS<kTok>::mma(acc, da[s], db[s]);
    wgmma_commit();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) pin(acc[i]);
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages before the partial sums overwrite them
  float frag[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) frag[j][i] = acc[4 * j + i];
  reduce_over_cluster<NT>(partial, frag, y, T, N);
#else
  __trap();  // built without sm_90a: wgmma_available() keeps this kernel from being chosen
#endif
}

}  // namespace

bool gemm_skinny_wgmma(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s) {
  if (!skinny_takes(x, w, T, N, K) || !wgmma_available()) return false;
  const Shape sh = shape_of(N, K, kTargetBlocks, kMaxSliceSteps);
  if (sh.slices == 0) return false;
  const int n_tiles = n_tiles_of(T);
  const size_t bytes = smem_bytes(n_tiles);
  if (bytes > shared_memory_limit()) return false;
  const SkinnyKernel kernels[] = {gemm_skinny_wgmma_kernel<1>, gemm_skinny_wgmma_kernel<2>, gemm_skinny_wgmma_kernel<4>,
                                  gemm_skinny_wgmma_kernel<8>};
  launch_skinny(kernels[tiles_index(n_tiles)], sh, bytes, s, w, x, y, T, N, K);
  return true;
}

}  // namespace fathom::cuda
