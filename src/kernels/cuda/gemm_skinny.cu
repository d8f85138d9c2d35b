// Dense bf16 products of a few dozen tokens (decode batches of 6 to 64, their verify steps):
// y[T, N] = x[T, K] W[N, K]^T on mma.sync tensor cores, the weights streamed once from HBM, in
// one launch. cuBLASLt at these shapes splits K and sums the slices in a second kernel (docs/
// perf.md, stop 55: the 35B's output projections at 1.3 TB/s at batch 64).
//
// Layout. The weight rows are the MMA's M (16 a warp), the tokens its N (n8 tiles). A block is 8
// warps, 128 rows, over one K slice; the slice's token rows are staged in shared memory by
// cp.async, and the weights go from HBM to registers in 16-byte streaming loads (the first ones
// before the PDL wait: weights are constant during a forward), two k64 steps in flight a warp. A
// lane reads 16 consecutive k of its two rows and of its token rows; both operands take the same
// permutation of k inside a k64 step, so the sum is the same sum.
// The slices of a row group form a cluster (1 x S, S <= 8): each block parks its 128 x T partial
// sums in shared memory, then reduces 1/S of the group's outputs over the S blocks' partials in
// rank order (distributed shared memory), so there is no second kernel and no workspace.
//
// Bits: a token's sum runs in an order fixed by (N, K) alone (the slices from N and K, the mma's
// sum per output element), never by T: a row is bit-identical at every T the kernel takes.
#include <algorithm>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_skinny.h"
#include "kernels/cuda/gemm_skinny.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace fathom::cuda {
namespace {

using namespace skinny;

constexpr int kStagePad = 8;  // bf16 after each staged token row: quads' 16-byte reads in distinct banks

size_t smem_bytes(int n_tiles, int slice_k) {
  const size_t stage = size_t(8 * n_tiles) * (slice_k + kStagePad) * sizeof(bf16_t);
  return std::max(stage, partial_bytes(n_tiles));
}

// NT n8 tiles of tokens (T <= 8 NT). Grid (row groups, slices), clusters of (1, slices).
template <int NT>
__global__ void __launch_bounds__(kThreads) gemm_skinny_kernel(const bf16_t* __restrict__ w,
                                                               const bf16_t* __restrict__ x, float* __restrict__ y,
                                                               int T, int N, int K, int slice_k) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* stage = reinterpret_cast<bf16_t*>(smem);   // [8 NT tokens][slice_k + kStagePad]
  float* partial = reinterpret_cast<float*>(smem);   // after the MMAs: [8 NT tokens][kPartialStride]
  const int ld = slice_k + kStagePad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int group_row = blockIdx.x * kRowsPerBlock;
  const int row = group_row + warp * 16 + g;  // this lane's rows: row and row + 8
  const int k0 = blockIdx.y * slice_k, k1 = min(K, k0 + slice_k);
  const int steps = (k1 - k0 + kStepK - 1) / kStepK;
  const bool lo = row < N, hi = row + 8 < N;
  const bf16_t* wlo = w + int64_t(lo ? row : 0) * K + k0 + 16 * q;
  const bf16_t* whi = w + int64_t(hi ? row + 8 : 0) * K + k0 + 16 * q;
  // K is a multiple of 16, so a lane's 16 k of a step are all inside the slice or all past it.
  auto load_w = [&](int step, uint4 (&a)[4]) {
    const int k = step * kStepK;
    const bool in = k0 + k + 16 * q < k1;
    const uint4 z = make_uint4(0, 0, 0, 0);
    a[0] = lo && in ? load_stream(wlo + k) : z;
    a[1] = lo && in ? load_stream(wlo + k + 8) : z;
    a[2] = hi && in ? load_stream(whi + k) : z;
    a[3] = hi && in ? load_stream(whi + k + 8) : z;
  };
  uint4 a0[4], a1[4];
  load_w(0, a0);
  if (steps > 1) load_w(1, a1);
  pdl_prologue();
  const int chunks = slice_k / 8;  // 16-byte chunks of a staged token row
  for (int i = threadIdx.x; i < 8 * NT * chunks; i += kThreads) {
    const int t = i / chunks, c = i % chunks, k = k0 + 8 * c;
    const bool in = t < T && k < k1;  // zeros for tokens past T and k past the slice
    cp_async16_zfill(smem_addr(stage + t * ld + 8 * c), in ? x + int64_t(t) * K + k : x, in);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const bf16_t* xq = stage + g * ld + 16 * q;  // token g of each n8 tile, this lane's 16 k
  // Word 2s of a lane's 16 k is mma k16 step s's (2q, 2q + 1) pair, word 2s + 1 its (2q + 8, 2q + 9).
  auto mma_step = [&](const uint4 (&a)[4], int step) {
    const uint32_t L[8] = {a[0].x, a[0].y, a[0].z, a[0].w, a[1].x, a[1].y, a[1].z, a[1].w};
    const uint32_t H[8] = {a[2].x, a[2].y, a[2].z, a[2].w, a[3].x, a[3].y, a[3].z, a[3].w};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const bf16_t* b = xq + j * 8 * ld + step * kStepK;
      const uint4 b0 = load_shared16(b), b1 = load_shared16(b + 8);
      const uint32_t B[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t af[4] = {L[2 * s], H[2 * s], L[2 * s + 1], H[2 * s + 1]};
        mma_bf16(acc[j], af, B[2 * s], B[2 * s + 1]);
      }
    }
  };
#pragma unroll 1
  for (int st = 0; st < steps; st += 2) {
    mma_step(a0, st);
    if (st + 2 < steps) load_w(st + 2, a0);
    if (st + 1 < steps) {
      mma_step(a1, st + 1);
      if (st + 3 < steps) load_w(st + 3, a1);
    }
  }

  __syncthreads();  // every warp is done with the staged tokens before the partial sums overwrite them
  reduce_over_cluster<NT>(partial, acc, y, T, N);
}

}  // namespace

bool gemm_skinny(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s) {
  if (!skinny_takes(x, w, T, N, K)) return false;
  const Shape sh = shape_of(N, K);
  if (sh.slices == 0) return false;
  const int n_tiles = n_tiles_of(T);
  const size_t bytes = smem_bytes(n_tiles, sh.slice_k);
  if (bytes > shared_memory_limit()) return false;  // the SM120 profile's 99 KB at wide slices
  const SkinnyKernel kernels[] = {gemm_skinny_kernel<1>, gemm_skinny_kernel<2>, gemm_skinny_kernel<4>,
                                  gemm_skinny_kernel<8>};
  launch_skinny(kernels[tiles_index(n_tiles)], sh, bytes, s, w, x, y, T, N, K);
  return true;
}

}  // namespace fathom::cuda
