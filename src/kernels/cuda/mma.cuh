// Tensor-core and async-copy building blocks of the kernels (attention, MoE, DeltaNet): PTX
// wrappers for cp.async, ldmatrix and mma.sync (m16n8k16 bf16 and m16n8k8 tf32 in, fp32
// accumulation; sm_80+), swizzled shared-memory tiles, and the gather of K/V rows from the paged
// cache into them.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace fathom::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// With a source size: a copy whose `valid` is false reads 0 bytes and zero-fills the destination
// (rows or k past the end of a tile's operand).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// 16 bytes of shared memory into registers.
__device__ __forceinline__ uint4 load_shared16(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(p)));
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for a 16x16 (row-major) by 16x8 (column-major) bf16 product.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a * b for a 16x8 (row-major) by 8x8 (column-major) tf32 product: the registers hold fp32
// bit patterns of which the mma reads the top 19 bits.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x in one MUFU instruction (2^-inf = 0); the probabilities are rounded to bf16 anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as a bf16 pair, `lo` in the low half (the lower column of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One step of the online softmax over a tile of scores held in mma accumulators: a lane holds
// rows g (elements 0, 1) and g+8 (elements 2, 3) of NS n8 tiles, and a row's scores are spread
// over the 4 lanes of its quad. Updates the running max m (log2 units) and sum l, rescales the
// output accumulators o, and turns s into probabilities. A row that has seen no key yet (max
// -inf) is kept away from -inf - -inf.
template <int NS, int NO>
__device__ __forceinline__ void online_softmax_step(float (&s)[NS][4], float (&m)[2], float (&l)[2],
                                                    float (&o)[NO][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < NS; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
  float ref[2], corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
    ref[r] = mx[r] == -INFINITY ? 0.f : mx[r];
    corr[r] = fast_exp2(m[r] - ref[r]);
    m[r] = mx[r];
    l[r] *= corr[r];
  }
#pragma unroll
  for (int dn = 0; dn < NO; ++dn) {
    o[dn][0] *= corr[0];
    o[dn][1] *= corr[0];
    o[dn][2] *= corr[1];
    o[dn][3] *= corr[1];
  }
#pragma unroll
  for (int j = 0; j < NS; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = fast_exp2(s[j][e] - ref[e >> 1]);
      l[e >> 1] += s[j][e];
    }
}

// ---- Shared-memory tiles: [rows][D] bf16, each row D/8 chunks of 16 bytes. Chunk c of row r is
// stored at chunk c ^ (r % 8): ldmatrix reads one chunk of 8 consecutive rows, and rows are a
// multiple of 128 bytes long, so without the swizzle all 8 would hit the same banks.

template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// One lane's ldmatrix addresses into a swizzled tile: the lane reads row `row + 8i` (any i) and
// chunk `c + bit` (c even). Chunk c + bit lands at 8*(c/8) + ((c%8 + bit) ^ (row%8)), so four
// precomputed addresses (c%8 = 0, 2, 4, 6) leave only compile-time offsets in unrolled loops.
template <int D>
struct LaneTileAddress {
  uint32_t base[4];
  __device__ __forceinline__ LaneTileAddress(const bf16_t* tile, int row, int bit) {
#pragma unroll
    for (int i = 0; i < 4; ++i) base[i] = smem_addr(tile + swizzled<D>(row, 2 * i + bit));
  }
  // `row_add` a multiple of 8, `c` even (both compile-time in the unrolled loops).
  __device__ __forceinline__ uint32_t at(int row_add, int c) const {
    return base[(c & 7) >> 1] + uint32_t(row_add * D + (c & ~7) * 8) * uint32_t(sizeof(bf16_t));
  }
};

// ---- Gather of paged K/V rows into a swizzled tile of kTileK keys, by kThreads threads.

// slots[i] = cache slot of key position first + i of the sequence, -1 past `last`. Threads 0..kTileK-1.
template <int kTileK>
__device__ __forceinline__ void compute_slots(int32_t* slots, const int32_t* table, int block_size, int first,
                                              int last) {
  if (threadIdx.x < kTileK) {
    const int p = first + int(threadIdx.x);
    slots[threadIdx.x] = p <= last ? table[p / block_size] * block_size + p % block_size : -1;
  }
}

// Issues the cp.async copies of one K or V tile: key i of the tile is cache slot slots[i], or
// zeros when slots[i] < 0 (past the last key: its block may not exist, and garbage there could
// be NaN, which a zero probability would not cancel in P V).
// Thread x copies chunk x % (D/8) of rows x / (D/8) + i * kRows; those rows have one of two
// swizzle patterns (kRows >= 4), so the shared-memory targets are two addresses plus constants.
// kUnroll (even) caps how many copies are unrolled together: each holds a slot and a source
// address in registers, which a kernel with large accumulators may not have to spare.
template <int D, int kThreads, int kTileK, int kUnroll = kTileK>
__device__ __forceinline__ void load_kv_tile(bf16_t* tile, const bf16_t* cache, const int32_t* slots, int nkv,
                                             int kvh) {
  constexpr int kChunks = D / 8;
  constexpr int kRows = kThreads / kChunks;  // rows per pass
  static_assert(kThreads % kChunks == 0 && kTileK % (2 * kRows) == 0 && kRows >= 4, "copy passes must tile the keys");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const uint32_t dst[2] = {smem_addr(tile + swizzled<D>(row0, chunk)),
                           smem_addr(tile + swizzled<D>(row0 + kRows, chunk))};
  const bf16_t* src = cache + int64_t(kvh) * D + chunk * 8;
  static_assert(kUnroll % 2 == 0, "copies alternate between the two swizzle patterns");
#pragma unroll kUnroll
  for (int i = 0; i < kTileK / kRows; ++i) {
    const int row = row0 + i * kRows;
    const uint32_t to = dst[i & 1] + uint32_t((i & ~1) * kRows * D * int(sizeof(bf16_t)));
    const int slot = slots[row];
    if (slot >= 0) {
      cp_async16(to, src + int64_t(slot) * nkv * D);
    } else {
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(to), "r"(0) : "memory");
    }
  }
}

}  // namespace fathom::cuda
