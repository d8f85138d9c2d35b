// The paged KV cache's element types on the device: bf16 values, or E4M3 codes of value / scale
// (KvCacheView in ops.h). Writing rounds to the nearest code (ties to even, saturated at +-448,
// as the CPU engine's f32_to_fp8_e4m3); reading turns codes into bf16 exactly (every E4M3 value
// is a bf16 value), so the kernels' products run on the same bf16 paths for both types and the
// scales are applied outside them (k_scale with the scores' scale, v_scale on the output).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace fathom::cuda {

using e4m3_t = uint8_t;  // one E4M3 code of the cache

// The type a cache of this dtype is stored as (the kernels' template parameter).
template <class T>
constexpr bool kIsE4m3Cache = sizeof(T) == 1;

__device__ __forceinline__ void kv_store(bf16_t* p, float x, float /*scale*/) { *p = to_bf(x); }
__device__ __forceinline__ void kv_store(e4m3_t* p, float x, float scale) {
  *p = e4m3_t(__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float kv_load(const bf16_t* p) { return bf(*p); }
// The code's value (without its scale).
__device__ __forceinline__ float kv_load(const e4m3_t* p) { return e4m3_to_f32(*p); }

// Two codes (the low byte first) as a bf16 pair, the low one in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack_bf16(f.x, f.y);
}

// Eight codes (8 bytes, the first in the lowest byte) as eight bf16 values (16 bytes).
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 codes) {
  return make_uint4(e4m3x2_to_bf16x2(uint16_t(codes.x)), e4m3x2_to_bf16x2(uint16_t(codes.x >> 16)),
                    e4m3x2_to_bf16x2(uint16_t(codes.y)), e4m3x2_to_bf16x2(uint16_t(codes.y >> 16)));
}

// load_kv_tile (mma.cuh) for an E4M3 cache: the same tile (swizzled bf16 rows, zeros where
// slots[i] < 0) and the same thread-to-chunk mapping, but each 16-byte bf16 chunk comes from 8
// bytes of codes read into registers and converted, so the stores are synchronous: the tile is
// complete for every thread after the caller's next __syncthreads (cp.async waits are no-ops
// for it). The reads of a few rows are issued together before their conversions and stores, so
// their latencies overlap.
template <int D, int kThreads, int kTileK, int kUnroll = kTileK>
__device__ __forceinline__ void load_kv_tile(bf16_t* tile, const e4m3_t* cache, const int32_t* slots, int nkv,
                                             int kvh) {
  constexpr int kChunks = D / 8;
  constexpr int kRows = kThreads / kChunks;  // rows per pass
  constexpr int kPasses = kTileK / kRows;
  // Rows read before any is stored: each holds 2 registers until converted, which the decode
  // kernel at d = 256 (168 registers beside its accumulators) cannot spare for more than 4.
  constexpr int kGroup = kUnroll < kPasses ? (kUnroll < 4 ? kUnroll : 4) : (kPasses < 4 ? kPasses : 4);
  static_assert(kThreads % kChunks == 0 && kTileK % (2 * kRows) == 0 && kRows >= 4, "copy passes must tile the keys");
  static_assert(kGroup % 2 == 0 && kPasses % kGroup == 0, "copies alternate between the two swizzle patterns");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const uint32_t dst[2] = {smem_addr(tile + swizzled<D>(row0, chunk)),
                           smem_addr(tile + swizzled<D>(row0 + kRows, chunk))};
  const e4m3_t* src = cache + int64_t(kvh) * D + chunk * 8;
#pragma unroll
  for (int i0 = 0; i0 < kPasses; i0 += kGroup) {
    uint2 codes[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int slot = slots[row0 + (i0 + j) * kRows];
      // Code 0 is +0: rows past the last key become zeros, as load_kv_tile's.
      codes[j] = slot >= 0 ? *reinterpret_cast<const uint2*>(src + int64_t(slot) * nkv * D) : make_uint2(0, 0);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int i = i0 + j;
      const uint32_t to = dst[i & 1] + uint32_t((i & ~1) * kRows * D * int(sizeof(bf16_t)));
      const uint4 v = e4m3x8_to_bf16x8(codes[j]);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(to), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
  }
}

}  // namespace fathom::cuda
