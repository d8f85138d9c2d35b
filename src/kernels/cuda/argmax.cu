// Row-wise argmax over the logits, each row split over blocks. One block a row streamed a 248K
// vocabulary's 1 MB through one SM (57 us a step at batch 1 on an H100, docs/perf.md issue 32);
// in stripes of kStripe logits ~60 blocks on as many SMs read it at once. Each block reduces its
// stripe, posts (value, index) and counts itself in (last_block_to_finish, whose count wraps back
// to zero, so the scratch stays zeroed between calls and in graphs); the row's last block reduces
// the posts.
// The pick, largest value and lowest index among equals with NaN never chosen, is an order-free
// reduction: the same index whatever the split.
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerRow = kThreads;  // the last block reduces one post per thread
constexpr int kStripe = 4096;               // logits a block (16 KB)

struct Post {
  float value;
  int32_t index;
};
// A row's scratch, at the same place whatever the number of rows of a call.
struct RowScratch {
  unsigned count;  // blocks of the row done
  unsigned pad;
  Post posts[kMaxBlocksPerRow];
};

// Blocks a row takes, and the logits each block reads.
int blocks_per_row(int n) { return int(std::clamp<int64_t>((int64_t(n) + kStripe - 1) / kStripe, 1, kMaxBlocksPerRow)); }
int stripe_of(int n, int blocks) { return int((int64_t(n) + blocks - 1) / blocks); }

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The block's pick of (best, idx) over its threads' picks (every thread gets it).
__device__ void block_pick(float& best, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffff, best, o);
    const int oi = __shfl_xor_sync(0xffffffff, idx, o);
    if (better(ob, oi, best, idx)) best = ob, idx = oi;
  }
  __shared__ float sb[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sb[warp] = best, si[warp] = idx;
  __syncthreads();
  best = sb[0], idx = si[0];
  for (int w = 1; w < kThreads / 32; ++w)
    if (better(sb[w], si[w], best, idx)) best = sb[w], idx = si[w];
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* logits, int32_t* out, int n, int stripe,
                                                          RowScratch* scratch) {
  pdl_prologue();
  const int row = blockIdx.y, b = blockIdx.x, blocks = gridDim.x;
  const float* l = logits + int64_t(row) * n;
  const int begin = b * stripe, end = min(n, begin + stripe);
  float best = -INFINITY;
  int idx = INT_MAX;
#pragma unroll 4
  for (int i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = l[i];
    if (better(v, i, best, idx)) best = v, idx = i;
  }
  block_pick(best, idx);
  if (blocks == 1) {
    if (threadIdx.x == 0) out[row] = idx;
    return;
  }
  RowScratch& rs = scratch[row];
  if (threadIdx.x == 0) rs.posts[b] = Post{best, idx};
  if (!last_block_to_finish(&rs.count)) return;  // the row's count wraps back to zero
  best = -INFINITY, idx = INT_MAX;
  if (int(threadIdx.x) < blocks) {  // read past L1: other blocks wrote these
    best = __ldcg(&rs.posts[threadIdx.x].value);
    idx = __ldcg(&rs.posts[threadIdx.x].index);
  }
  block_pick(best, idx);
  if (threadIdx.x == 0) out[row] = idx;
}

}  // namespace

size_t argmax_scratch_bytes(int rows) { return size_t(rows) * sizeof(RowScratch); }

void argmax_rows(const float* logits, int32_t* out, int rows, int n, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  FATHOM_CHECK(n > 0, "argmax_rows: rows of ", n, " logits");
  const int blocks = blocks_per_row(n);
  FATHOM_CHECK(blocks == 1 || scratch, "argmax_rows: rows of ", n, " logits need the scratch of argmax_scratch_bytes");
  launch(argmax_kernel, dim3(blocks, rows), kThreads, 0, s, logits, out, n, stripe_of(n, blocks),
         static_cast<RowScratch*>(scratch));
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
