// What the skinny GEMM's two forms share (gemm_skinny.cu on mma.sync, gemm_skinny_wgmma.cu on
// wgmma): the grid from (N, K) alone, 128 weight rows a block over one K slice, the slices of a
// row group one thread-block cluster, and the cluster's sum of the slices' partials in rank order
// through distributed shared memory. A lane's accumulators are mma.sync's C fragments (wgmma's
// m64 layout is the same per warp): rows g, g + 8 of its warp's 16 at token columns 2q, 2q + 1 of
// each n8 tile.
#pragma once
#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_skinny.h"
#include "kernels/cuda/launch.cuh"

namespace fathom::cuda::skinny {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRowsPerBlock = 16 * kWarps;
constexpr int kStepK = 64;           // k a step (a wgmma slab) takes: 16 a lane quad position
constexpr int kMaxSliceSteps = 16;   // slices of at most 1,024 k
constexpr int kWideSliceSteps = 8;   // slices wider than 512 k only where the cluster is full
constexpr int kTargetBlocks = 128;   // about a wave of an H100 / H200 (132 SMs), from (N, K) alone
constexpr int kMaxCluster = 8;       // the portable cluster size
constexpr int kPartialStride = kRowsPerBlock + 4;  // floats a token's partial sums take: conflict-free
                                                   // stores, 16-byte aligned rows

// The operands both forms take (gemm_skinny.h); the grid's K limit is shape_of's.
inline bool skinny_takes(const void* x, const void* w, int T, int N, int K) {
  return T >= 1 && T <= kSkinnyMaxTokens && N >= 1 && N <= kSkinnyMaxRows && K >= 16 && K % 16 == 0 &&
         is_aligned(x, 16) && is_aligned(w, 16);
}

struct Shape {
  int row_groups = 0, slices = 0, slice_k = 0;
};

// The grid from (N, K) alone (the bits depend on it): enough slices to fill `target` blocks, slices
// of at most `wide_steps` steps while the cluster has room (the mma.sync form stages a slice's
// token rows at once: 512 k), K past 8 slices of 1,024 refused (cuBLASLt).
inline Shape shape_of(int N, int K, int target = kTargetBlocks, int wide_steps = kWideSliceSteps) {
  Shape s;
  s.row_groups = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const int steps = (K + kStepK - 1) / kStepK;
  const int wanted = std::max((target + s.row_groups - 1) / s.row_groups, (steps + wide_steps - 1) / wide_steps);
  const int slices = std::min({wanted, kMaxCluster, steps});
  const int slice_steps = (steps + slices - 1) / slices;
  if (slice_steps > kMaxSliceSteps) return {};
  s.slices = (steps + slice_steps - 1) / slice_steps;  // no empty slice
  s.slice_k = slice_steps * kStepK;
  return s;
}

// The n8 tiles of tokens a step of T takes (1, 2, 4 or 8), and its index in a form's kernels.
inline int n_tiles_of(int T) { return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8; }
inline int tiles_index(int n_tiles) { return n_tiles == 1 ? 0 : n_tiles == 2 ? 1 : n_tiles == 4 ? 2 : 3; }

// A form's kernel for one token tiling, and its launch: grid (row groups, slices), clusters of
// (1, slices), `smem` bytes of dynamic shared memory.
using SkinnyKernel = void (*)(const bf16_t*, const bf16_t*, float*, int, int, int, int);
inline void launch_skinny(SkinnyKernel kernel, const Shape& sh, size_t smem, cudaStream_t s, const bf16_t* w,
                          const bf16_t* x, float* y, int T, int N, int K) {
  const dim3 grid(sh.row_groups, sh.slices), cluster(1, sh.slices, 1);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), int(smem));
  launch_in_clusters(&cluster, kernel, grid, kThreads, smem, s, w, x, y, T, N, K, sh.slice_k);
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

// Bytes the partial sums of 8 NT token columns take in shared memory.
inline size_t partial_bytes(int n_tiles) { return size_t(8 * n_tiles) * kPartialStride * sizeof(float); }

// Parks this block's partial sums (acc[j]: n8 tile j's C fragment of the lane) in `partial`
// (shared memory no warp reads any more), then sums the row group's slices over the cluster in
// rank order and writes y's rows of the T tokens.
template <int NT>
__device__ __forceinline__ void reduce_over_cluster(float* partial, const float (&acc)[NT][4], float* __restrict__ y,
                                                    int T, int N) {
  namespace cg = cooperative_groups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int r = warp * 16 + g, group_row = blockIdx.x * kRowsPerBlock;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int t = 8 * j + 2 * q;
    partial[t * kPartialStride + r] = acc[j][0];
    partial[(t + 1) * kPartialStride + r] = acc[j][1];
    partial[t * kPartialStride + r + 8] = acc[j][2];
    partial[(t + 1) * kPartialStride + r + 8] = acc[j][3];
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's partial sums are parked
  // Four rows of one token a thread, the S slices' values all asked for before the first add (one
  // round trip over the cluster, not S), summed in rank order from 0.
  const int slices = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const float4* parts[kMaxCluster];
#pragma unroll
  for (int b = 0; b < kMaxCluster; ++b)
    parts[b] = reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, b < slices ? b : 0));
  constexpr int kQuads = kRowsPerBlock / 4;
  const int total = T * kQuads, share = (total + slices - 1) / slices;
  const int end = min(total, (rank + 1) * share);
  for (int e = rank * share + int(threadIdx.x); e < end; e += kThreads) {
    const int t = e / kQuads, r4 = e % kQuads, i = t * (kPartialStride / 4) + r4;
    float4 v[kMaxCluster];
#pragma unroll
    for (int b = 0; b < kMaxCluster; ++b)
      if (b < slices) v[b] = parts[b][i];
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int b = 0; b < kMaxCluster; ++b)
      if (b < slices) sum[0] += v[b].x, sum[1] += v[b].y, sum[2] += v[b].z, sum[3] += v[b].w;
    const int n = group_row + 4 * r4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (n + j < N) y[int64_t(t) * N + n + j] = sum[j];
  }
  cluster.sync();  // no block leaves (its shared memory) while another still reads it
}

}  // namespace fathom::cuda::skinny
