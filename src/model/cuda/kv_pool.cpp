#include "model/cuda/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

void KvPool::allocate(int layers, int64_t blocks, int block_size, int kv_heads, int head_dim, KvCacheDtype dtype,
                      int64_t copy_blocks, cudaStream_t s) {
  dtype_ = dtype;
  const int64_t block_values = int64_t(block_size) * kv_heads * head_dim;
  block_bytes_ = block_values * kv_cache_dtype_bytes(dtype);
  const int64_t values = blocks * block_values;
  for (int i = 0; i < layers; ++i) {
    k_.emplace_back(size_t(blocks * block_bytes_));
    v_.emplace_back(size_t(blocks * block_bytes_));
    // Arbitrary but finite contents: benchmark contexts read blocks nothing wrote.
    if (dtype == KvCacheDtype::Fp8E4M3) {
      // Codes with the exponent's top bit clear: |value| < 2, never the NaN codes 0x7f / 0xff.
      fill_random_bytes(k_.back().as<uint8_t>(), values, 77 + i, 0xbf, 0, s);
      fill_random_bytes(v_.back().as<uint8_t>(), values, 99 + i, 0xbf, 0, s);
    } else {
      fill_random_bf16(k_.back().as<bf16_t>(), values, 0.5f, 77 + i, s);
      fill_random_bf16(v_.back().as<bf16_t>(), values, 0.5f, 99 + i, s);
    }
  }
  if (copy_blocks > 0) {
    std::vector<void*> ptrs;
    for (int i = 0; i < layers; ++i) ptrs.push_back(k_[size_t(i)].data()), ptrs.push_back(v_[size_t(i)].data());
    ptrs_ = DeviceBuffer::from_host(ptrs);
    idx_ = DeviceBuffer(size_t(2) * copy_blocks * 4);
    page_idx_ = DeviceBuffer(size_t(copy_blocks) * (4 + 8) + 8);
    copy_limit_ = copy_blocks;
  }
}

int64_t KvPool::bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += int64_t(k_[i].bytes() + v_[i].bytes());
  return b;
}

void KvPool::copy_pages(const std::vector<int32_t>& blocks, const std::vector<char*>& pages, bool to_pages,
                        cudaStream_t s) {
  if (blocks.empty()) return;
  FATHOM_CHECK(blocks.size() == pages.size() && int64_t(blocks.size()) <= copy_limit_, "KvPool::copy_pages: ",
               blocks.size(), " blocks, ", pages.size(), " pages, room for ", copy_limit_);
  // [blocks as int32, padded to 8 bytes][page addresses]
  const size_t n = blocks.size(), addr_at = (n * 4 + 7) / 8 * 8;
  std::vector<char> idx(addr_at + n * 8, 0);
  std::memcpy(idx.data(), blocks.data(), n * 4);
  std::memcpy(idx.data() + addr_at, pages.data(), n * 8);
  // Pageable memory: the call returns once the indices are staged, so `idx` may go.
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(page_idx_.data(), idx.data(), idx.size(), cudaMemcpyHostToDevice, s));
  const char* d = page_idx_.as<char>();
  copy_kv_pages(ptrs_.as<void*>(), int(k_.size() * 2), reinterpret_cast<const int32_t*>(d),
                reinterpret_cast<void* const*>(d + addr_at), int(n), block_bytes_, to_pages, s);
}

void KvPool::copy_blocks(const std::vector<int32_t>& src, const std::vector<int32_t>& dst, cudaStream_t s) {
  if (src.empty()) return;
  std::vector<int32_t> idx(src);
  idx.insert(idx.end(), dst.begin(), dst.end());
  // Pageable memory: the call returns once the indices are staged, so `idx` may go.
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(idx_.data(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, s));
  const int32_t* d = idx_.as<int32_t>();
  copy_kv_blocks(ptrs_.as<void*>(), int(k_.size() * 2), d, d + src.size(), int(src.size()), block_bytes_, s);
}

}  // namespace fathom::cuda
