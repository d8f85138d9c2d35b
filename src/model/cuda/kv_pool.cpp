#include "model/cuda/kv_pool.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

void KvPool::allocate(int layers, int64_t blocks, int block_size, int kv_heads, int head_dim, int64_t copy_blocks,
                      cudaStream_t s) {
  block_values_ = int64_t(block_size) * kv_heads * head_dim;
  const int64_t values = blocks * block_values_;
  for (int i = 0; i < layers; ++i) {
    k_.emplace_back(size_t(values) * 2);
    v_.emplace_back(size_t(values) * 2);
    // Arbitrary but finite contents: benchmark contexts read blocks nothing wrote.
    fill_random_bf16(k_.back().as<bf16_t>(), values, 0.5f, 77 + i, s);
    fill_random_bf16(v_.back().as<bf16_t>(), values, 0.5f, 99 + i, s);
  }
  if (copy_blocks > 0) {
    std::vector<bf16_t*> ptrs;
    for (int i = 0; i < layers; ++i) ptrs.push_back(k(i)), ptrs.push_back(v(i));
    ptrs_ = DeviceBuffer::from_host(ptrs);
    idx_ = DeviceBuffer(size_t(2) * copy_blocks * 4);
  }
}

int64_t KvPool::bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += int64_t(k_[i].bytes() + v_[i].bytes());
  return b;
}

void KvPool::copy_blocks(const std::vector<int32_t>& src, const std::vector<int32_t>& dst, cudaStream_t s) {
  if (src.empty()) return;
  std::vector<int32_t> idx(src);
  idx.insert(idx.end(), dst.begin(), dst.end());
  // Pageable memory: the call returns once the indices are staged, so `idx` may go.
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(idx_.data(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, s));
  const int32_t* d = idx_.as<int32_t>();
  copy_kv_blocks(ptrs_.as<bf16_t*>(), int(k_.size() * 2), d, d + src.size(), int(src.size()), block_values_, s);
}

}  // namespace fathom::cuda
