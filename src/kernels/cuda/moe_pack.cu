// Repacking of routed-expert matrices at load into the order the packed expert kernels
// (moe_packed.cu) read: slabs of kPackedTileRows rows x kPackedSlabK k, one 16-byte load per lane
// and A-fragment group. k order within a slab: lane (g, c) holds the actual k 16c .. 16c+15, read
// by the kernels as the mma's logical k {2c, 2c+1, 2c+8, 2c+9} of the slab's four k16 steps (any
// permutation shared by A and B gives the same product), so a lane's activations are 32
// contiguous bytes.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

constexpr int kTileRows = kPackedTileRows;
constexpr int kSlabK = kPackedSlabK;

// Thread i of a packing kernel: lane (g, c) = (lane / 4, lane % 4) of slab (rt, ks).
struct SlabLane {
  int64_t slab;
  int lane, rt, ks, g, c;
};
__device__ __forceinline__ SlabLane slab_lane(int64_t i, int k_slabs) {
  SlabLane l;
  l.lane = int(i & 31);
  l.slab = i >> 5;
  l.rt = int(l.slab / k_slabs);
  l.ks = int(l.slab % k_slabs);
  l.g = l.lane >> 2;
  l.c = l.lane & 3;
  return l;
}

// ---- NVFP4

// e4m3 scale -> byte b with bf16 bits (b << 4) + (224 << 7) = scale * 2^118: 5 exponent bits
// (floor(log2 scale) + 21) and the 3 mantissa bits after the leading one, so e4m3 subnormals
// (down to 2^-9) stay exact. Zero scales give 0 (their codes are zeroed by the caller).
__device__ uint32_t scale_byte(uint8_t e) {
  const int E = (e >> 3) & 0xF, M = e & 7;
  if (E == 0 && M == 0) return 0;
  int log2s, mant;
  if (E == 0) {  // subnormal: M/8 * 2^-6
    const int top = 31 - __clz(M);
    log2s = top - 9;
    mant = (M << (3 - top)) & 7;
  } else if (E == 15 && M == 7) {  // NaN: no real checkpoint has it; read as the largest value
    log2s = 8, mant = 6;
  } else {
    log2s = E - 7, mant = M;
  }
  return uint32_t(((log2s + 21) << 3) | mant);
}

// Nibble p of a step's 32-bit word holds A element a[p < 4 ? 2p : 2(p-4)+1]: the decoder turns
// nibbles (p, p+4) into the bf16 pair of fragment register 3 - (its shift / 4), see decode_step.
__global__ void pack_fp4_kernel(const uint8_t* codes, const uint8_t* scales, int rows, int k, int k_slabs,
                                int64_t lanes, uint4* dst_codes, uint16_t* dst_scales) {
  pdl_prologue();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= lanes) return;
  const SlabLane L = slab_lane(i, k_slabs);
  const int rt = L.rt, ks = L.ks, g = L.g, c = L.c;
  const int kb = ks * 4 + c;  // the lane's block of 16 k
  const int row_lo = rt * kTileRows + g, row_hi = row_lo + 8;
  auto scale_at = [&](int row) -> uint8_t {
    return row < rows && kb * 16 < k ? scales[int64_t(row) * (k / 16) + kb] : uint8_t(0);
  };
  const uint8_t e_lo = scale_at(row_lo), e_hi = scale_at(row_hi);
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t word = 0;
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int ai = p < 4 ? 2 * p : 2 * (p - 4) + 1;  // A element a0..a7
      const bool hi = (ai >> 1) & 1;                    // a2, a3, a6, a7: row g + 8
      const int row = hi ? row_hi : row_lo;
      const uint8_t e = hi ? e_hi : e_lo;
      const int kk = ks * kSlabK + 16 * c + 4 * j + (ai & 1) + 2 * (ai >> 2);
      uint32_t nib = 0;
      if (row < rows && kk < k && (e & 0x7F) != 0)
        nib = (codes[int64_t(row) * (k / 2) + kk / 2] >> ((kk & 1) * 4)) & 0xF;
      word |= nib << (4 * p);
    }
    words[j] = word;
  }
  dst_codes[i] = make_uint4(words[0], words[1], words[2], words[3]);
  dst_scales[i] = uint16_t(scale_byte(e_lo) | (scale_byte(e_hi) << 8));
}

// ---- FP8 (E4M3)

// Lane (g, c) of slab (rt, ks) gets two 16-byte words: steps 0-1 and 2-3. A step's 8 bytes are two
// 32-bit words {a0, a2, a1, a3} and {a4, a6, a5, a7}: bytes 0 and 2 of a word are one bf16x2
// fragment register (row g), bytes 1 and 3 the next (row g + 8), so the kernel turns a word into
// two registers with shifts and masks (e4m3x2_lo / e4m3x2_hi in moe_packed.cu).
__global__ void pack_fp8_kernel(const uint8_t* codes, int rows, int k, int k_slabs, int64_t lanes, uint4* dst) {
  pdl_prologue();
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= lanes) return;
  const SlabLane L = slab_lane(i, k_slabs);
  const int row_lo = L.rt * kTileRows + L.g, row_hi = row_lo + 8;
  auto code = [&](int row, int kk) -> uint32_t {
    return row < rows && kk < k ? codes[int64_t(row) * k + kk] : 0u;
  };
  uint32_t words[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int kk = L.ks * kSlabK + 16 * L.c + 4 * j;
    // Register pairs (a0, a1) / (a4, a5) are row g at k kk, kk+1 / kk+2, kk+3; (a2, a3) / (a6, a7) row g + 8.
    words[2 * j] = code(row_lo, kk) | code(row_hi, kk) << 8 | code(row_lo, kk + 1) << 16 | code(row_hi, kk + 1) << 24;
    words[2 * j + 1] =
        code(row_lo, kk + 2) | code(row_hi, kk + 2) << 8 | code(row_lo, kk + 3) << 16 | code(row_hi, kk + 3) << 24;
  }
  uint4* out = dst + (L.slab * 2) * 32 + L.lane;
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[32] = make_uint4(words[4], words[5], words[6], words[7]);
}

// Slabs of a [rows, k] matrix.
int64_t slab_count(int rows, int k) {
  return int64_t((rows + kTileRows - 1) / kTileRows) * ((k + kSlabK - 1) / kSlabK);
}

// The descriptor of a packed [rows, k] matrix, checked; the caller adds its scales.
PackedMatrix packed_matrix(const char* what, int rows, int k, const uint8_t* dst_codes) {
  FATHOM_CHECK(k % 16 == 0 && rows > 0, what, ": matrix [", rows, ", ", k, "] needs k divisible by 16");
  FATHOM_CHECK(reinterpret_cast<uintptr_t>(dst_codes) % 16 == 0, what, ": codes must be 16-byte aligned");
  PackedMatrix p;
  p.rows = rows;
  p.k = k;
  p.row_tiles = (rows + kTileRows - 1) / kTileRows;
  p.k_slabs = (k + kSlabK - 1) / kSlabK;
  p.codes = dst_codes;
  return p;
}

}  // namespace

int64_t packed_fp4_code_bytes(int rows, int k) { return slab_count(rows, k) * 512; }
int64_t packed_fp4_scale_bytes(int rows, int k) { return slab_count(rows, k) * 64; }

PackedMatrix pack_fp4(const uint8_t* codes, const uint8_t* scales, float fp4_global, int rows, int k, uint8_t* dst_codes,
                      uint16_t* dst_scales, cudaStream_t s) {
  PackedMatrix p = packed_matrix("pack_fp4", rows, k, dst_codes);
  p.scales = dst_scales;
  p.global = fp4_global * 256.f;
  const int64_t lanes = slab_count(rows, k) * 32;
  launch(pack_fp4_kernel, int((lanes + 255) / 256), 256, 0, s, codes, scales, rows, k, p.k_slabs, lanes,
         reinterpret_cast<uint4*>(dst_codes), dst_scales);
  FATHOM_CUDA_LAUNCH_CHECK();
  return p;
}

int64_t packed_fp8_code_bytes(int rows, int k) { return slab_count(rows, k) * 1024; }
int64_t packed_fp8_slab_scales(int rows, int k) { return slab_count(rows, k); }

PackedMatrix pack_fp8(const uint8_t* codes, const float* slab_scales, int rows, int k, uint8_t* dst_codes,
                      cudaStream_t s) {
  PackedMatrix p = packed_matrix("pack_fp8", rows, k, dst_codes);
  p.slab_scales = slab_scales;
  const int64_t lanes = slab_count(rows, k) * 32;
  launch(pack_fp8_kernel, int((lanes + 255) / 256), 256, 0, s, codes, rows, k, p.k_slabs, lanes,
         reinterpret_cast<uint4*>(dst_codes));
  FATHOM_CUDA_LAUNCH_CHECK();
  return p;
}

}  // namespace fathom::cuda
