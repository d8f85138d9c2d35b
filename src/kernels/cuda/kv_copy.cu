// Whole KV blocks copied between places of the paged pools (prefix-cache snapshots), by bytes:
// the same for every cache dtype.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

namespace {

// Grid: (blocks, pools). Each block of threads copies one KV block of one pool, 16 bytes a lane.
__global__ void copy_kv_blocks_kernel(void* const* pools, const int32_t* src, const int32_t* dst, int64_t block_vecs) {
  uint4* pool = static_cast<uint4*>(pools[blockIdx.y]);
  const uint4* from = pool + int64_t(src[blockIdx.x]) * block_vecs;
  uint4* to = pool + int64_t(dst[blockIdx.x]) * block_vecs;
  for (int64_t i = threadIdx.x; i < block_vecs; i += blockDim.x) to[i] = from[i];
}

}  // namespace

void copy_kv_blocks(void* const* pools, int n_pools, const int32_t* src, const int32_t* dst, int n,
                    int64_t block_bytes, cudaStream_t s) {
  if (n == 0 || n_pools == 0) return;
  FATHOM_CHECK(block_bytes % 16 == 0, "copy_kv_blocks: a block of ", block_bytes, " bytes is not whole 16-byte vectors");
  copy_kv_blocks_kernel<<<dim3(n, n_pools), 256, 0, s>>>(pools, src, dst, block_bytes / 16);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
