// The paged KV cache's memory: one K and one V pool per attention layer (the MTP layer's last),
// each [blocks][block_size][kv_heads][head_dim] values of the cache's dtype (bf16 or E4M3), and
// block copies between them (prefix snapshots). Which blocks a sequence holds is the runner's
// accounting, not this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/kv_cache_dtype.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

class KvPool {
 public:
  // `layers` pools of `blocks` blocks; `copy_blocks` > 0 makes room for copies of up to that
  // many blocks at once.
  void allocate(int layers, int64_t blocks, int block_size, int kv_heads, int head_dim, KvCacheDtype dtype,
                int64_t copy_blocks, cudaStream_t s);
  KvCacheDtype dtype() const { return dtype_; }
  // Layer `layer`'s pools as the attention ops take them, with its scales (E4M3 only).
  KvCacheView view(int layer, float k_scale, float v_scale) const {
    return KvCacheView{k_[size_t(layer)].data(), v_[size_t(layer)].data(), dtype_, k_scale, v_scale};
  }
  int64_t bytes() const;
  bool can_copy() const { return ptrs_.data() != nullptr; }
  // Blocks src[i] -> dst[i] of every layer's K and V, queued on `s`.
  void copy_blocks(const std::vector<int32_t>& src, const std::vector<int32_t>& dst, cudaStream_t s);
  // One block of every pool, what a page of the host tier holds (kv_copy.cu's layout).
  int64_t page_bytes() const { return block_bytes_ * int64_t(k_.size() * 2); }
  // Blocks blocks[i] of every pool into page pages[i] (to_pages), or back, queued on `s`: the
  // host tier's copies. Their indices have a buffer of their own, so that these copies, on
  // another stream than copy_blocks', never share one; copies on one stream run in order, so
  // the next one's indices are written after the last one has read them.
  void copy_pages(const std::vector<int32_t>& blocks, const std::vector<char*>& pages, bool to_pages, cudaStream_t s);

 private:
  std::vector<DeviceBuffer> k_, v_;
  DeviceBuffer ptrs_, idx_;  // every pool's base (K, V per layer), and the copy's block ids
  DeviceBuffer page_idx_;    // copy_pages': block ids, then page addresses
  int64_t copy_limit_ = 0;   // blocks a copy may move at once
  KvCacheDtype dtype_ = KvCacheDtype::Bf16;
  int64_t block_bytes_ = 0;  // bytes of one block of one pool
};

}  // namespace fathom::cuda
