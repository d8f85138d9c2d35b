// Device helpers shared by the kernels: bf16/e4m3 conversions and block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/ops.h"

namespace fathom::cuda {

__device__ __forceinline__ float bf(bf16_t v) { return __uint_as_float(uint32_t(v) << 16); }

__device__ __forceinline__ bf16_t to_bf(float f) {
  __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<bf16_t*>(&h);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// 16 bytes of data read once (weights streamed from HBM): kept out of L1.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// Sum over the block; every thread gets the total. blockDim.x must be a multiple of 32.
// Safe to call repeatedly in one kernel (the leading barrier orders reuse of the scratch).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += partial[i];
  return total;
}

// Whether this block is the last of the grid's gridDim.x blocks to get here; every thread of the
// block gets the answer. Each block fences its writes, then counts itself in on `counter`;
// atomicInc wraps the count back to 0 at the last block, so the counter is ready for the next
// launch without a reset. The last block fences again before it reads what the others wrote.
__device__ __forceinline__ bool last_block_to_finish(unsigned* counter) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicInc(counter, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Asks L2 for the 128-byte line holding p (no registers wait for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + __expf(-x)); }

inline int grid_for(int64_t n, int block = 256) {
  int64_t g = (n + block - 1) / block;
  return int(g < 65535 ? (g > 0 ? g : 1) : 65535);
}

}  // namespace fathom::cuda
