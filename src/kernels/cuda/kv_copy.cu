// Whole KV blocks copied between places of the paged pools (prefix-cache snapshots), by bytes:
// the same for every cache dtype.
#include <algorithm>

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

// Grid: (up to 32, pools), looping over the blocks. Page i holds block blocks[i] of every pool,
// pool p's at byte p * block_bytes; pages are host memory mapped into the device's address space
// (the host tier), so each 16-byte load or store crosses the bus.
__global__ void copy_kv_pages_kernel(void* const* pools, const int32_t* blocks, void* const* pages, int n,
                                     int64_t block_vecs, bool to_pages) {
  uint4* pool = static_cast<uint4*>(pools[blockIdx.y]);
  for (int b = blockIdx.x; b < n; b += gridDim.x) {
    uint4* in_pool = pool + int64_t(blocks[b]) * block_vecs;
    uint4* in_page = static_cast<uint4*>(pages[b]) + int64_t(blockIdx.y) * block_vecs;
    if (to_pages)
      for (int64_t i = threadIdx.x; i < block_vecs; i += blockDim.x) in_page[i] = in_pool[i];
    else
      for (int64_t i = threadIdx.x; i < block_vecs; i += blockDim.x) in_pool[i] = in_page[i];
  }
}

}  // namespace

void copy_kv_pages(void* const* pools, int n_pools, const int32_t* blocks, void* const* pages, int n,
                   int64_t block_bytes, bool to_pages, cudaStream_t s) {
  if (n == 0 || n_pools == 0) return;
  FATHOM_CHECK(block_bytes % 16 == 0, "copy_kv_pages: a block of ", block_bytes, " bytes is not whole 16-byte vectors");
  // 32 blocks of each pool in flight: enough to fill the bus, few enough to leave the SMs to the
  // steps running beside the copy.
  copy_kv_pages_kernel<<<dim3(std::min(n, 32), n_pools), 256, 0, s>>>(pools, blocks, pages, n, block_bytes / 16,
                                                                     to_pages);
  FATHOM_CUDA_LAUNCH_CHECK();
}

void copy_kv_blocks(void* const* pools, int n_pools, const int32_t* src, const int32_t* dst, int n,
                    int64_t block_bytes, cudaStream_t s) {
  if (n == 0 || n_pools == 0) return;
  FATHOM_CHECK(block_bytes % 16 == 0, "copy_kv_blocks: a block of ", block_bytes, " bytes is not whole 16-byte vectors");
  copy_kv_blocks_kernel<<<dim3(n, n_pools), 256, 0, s>>>(pools, src, dst, block_bytes / 16);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
