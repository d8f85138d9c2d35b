// The W8A8 FP8 GEMV (up to kFp8GemvMaxTokens tokens) on tensor cores: mma.sync with the E4M3
// weights as they are stored and the activations quantized once per block into shared memory.
// The CUDA-core form (fp8_linear.cu, still serving weight-only FP8) spent more instructions
// decoding E4M3 pairs and re-quantizing activations than its loads could pay for (1.8 TB/s on the
// 397B shape, docs/perf.md).
//
// Layout: a warp owns 2 rows and a contiguous K range (G warps split K, G from N and K only), and
// reads 512 contiguous bytes of each row per load instruction, as the bf16 GEMV does: lane (g, q)
// = (lane / 4, lane % 4) loads 16 bytes at k0 + 64 g + 16 q of both rows. An m16n8k32 product then
// takes the 64-byte piece g of row 0 as its A row g, the same piece of row 1 as A row g + 8, and
// the token's activations of piece g as its B column g: the diagonal D[g][g] (and D[g + 8][g]) is
// piece g's part of the dot product, and the other 112 outputs are not used (the tensor cores
// are idle in a GEMV; what counts is that the loads stream and no lane decodes E4M3). A token is
// one product per step, so a step of T tokens issues T products with the same A.
// Sums: each product starts from zero (the tensor cores sum 32 exact E4M3 products; their
// accumulation is not full fp32, see the tests' bound) and is added in fp32 per piece, the eight
// pieces then summed by a butterfly, the G partials in order. Batch invariance: token t's
// products read only its own activations and every sum's order is fixed by (N, K), so a row has
// the same bits in a step of 1 or of 16 tokens.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_gemv_mma.h"
#include "kernels/cuda/fp8_gemv_tail.cuh"
#include "kernels/cuda/launch.cuh"

namespace fathom::cuda {
namespace {

constexpr int kBlock = 256;  // 8 warps
constexpr int kWarps = kBlock / 32;
constexpr int kRows = 2;           // rows per warp (the A operand's two halves)
constexpr int kLaneBytes = 16;     // one 16-byte load per row per lane
constexpr int kStepK = 32 * kLaneBytes;  // a warp's load instruction: 512 contiguous bytes of a row
constexpr int kUnroll = 2;         // steps per iteration (twice that in flight with the next's)

struct MmaArgs {
  const uint8_t* w;      // [N, K] E4M3
  const float* scales;   // PerChannel [N] or Block [ceil(N/128), ceil(K/128)]; else null
  Fp8Scaling scaling;
  float scale;           // PerTensor
  float input_scale;
  float input_inv;       // 1 / input_scale in fp32
  const bf16_t* x;       // [T, K]
  float* y;              // [T, N]
  int T, N, K, G, span;  // span: each warp's K range, a multiple of kStepK
  int fp8_blocks;        // the blocks of the FP8 rows; the tail's rows follow, one block each
  const bf16_t* tail_w;  // [tail_n, K] bf16 rows of the same input (or null)
  float* tail_y;         // [T, tail_n]
  int tail_n;
};

// 16 activations of one token as E4M3 codes (4 words, the lowest k in the low byte): e4m3(x *
// inv), as fp8_quantize and the host's fp8_quantize_activation round them.
__device__ __forceinline__ uint4 quantize16(const bf16_t* p, float inv) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p)), b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  const uint32_t in[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t word = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t v = in[2 * i + h];
      const float2 f =
          make_float2(__fmul_rn(__uint_as_float(v << 16), inv), __fmul_rn(__uint_as_float(v & 0xffff0000u), inv));
      word |= uint32_t(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3)) << (16 * h);
    }
    out[i] = word;
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// d = A[16 x 32] B[32 x 8] from zero, E4M3 operands in mma.sync's fragments: a0/a2 this lane's
// k slots of A row g (lane / 4), a1/a3 of A row g + 8, b0/b1 of B column g.
__device__ __forceinline__ void mma_e4m3(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                         float (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
#else
  d[0] = d[1] = d[2] = d[3] = 0.f;  // never launched: fp8_gemv_w8a8_supported() is false
#endif
}

// The step's activations quantized once per block into shared memory: T rows of K codes.
__device__ void quantize_to_shared(const MmaArgs& a, uint8_t* xs) {
  const int chunks = a.K / kLaneBytes;
  for (int i = threadIdx.x; i < a.T * chunks; i += kBlock) {
    const int t = i / chunks, k = (i % chunks) * kLaneBytes;
    *reinterpret_cast<uint4*>(xs + t * a.K + k) = quantize16(a.x + int64_t(t) * a.K + k, a.input_inv);
  }
  __syncthreads();
}

// Up to MAX_T tokens; XS: activations from shared memory (else each lane quantizes its 16 as it
// goes: the same codes, for steps whose activations do not fit).
template <int MAX_T, bool BLOCK, bool XS>
__global__ void __launch_bounds__(kBlock) fp8_gemv_mma_kernel(MmaArgs a) {
  __shared__ float part[kWarps][kRows][MAX_T];
  extern __shared__ __align__(16) uint8_t xs[];
  if (int(blockIdx.x) >= a.fp8_blocks)
    return bf16_tail_row<kWarps, MAX_T>({a.x, a.tail_w, a.tail_y, a.T, a.K, a.tail_n, a.fp8_blocks}, &part[0][0][0],
                                        kRows * MAX_T);
  const int T = a.T, N = a.N, K = a.K, G = a.G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int group = warp / G, slice = warp % G;
  const int n0 = (blockIdx.x * (kWarps / G) + group) * kRows;
  const int kb = slice * a.span, ke = min(K, kb + a.span);
  const int lane_k = g * 64 + q * kLaneBytes;  // this lane's bytes within a step
  const uint8_t* row0 = a.w + int64_t(min(n0, N - 1)) * K;
  const uint8_t* row1 = a.w + int64_t(min(n0 + 1, N - 1)) * K;
  const bool has0 = n0 < N, has1 = n0 + 1 < N;
  auto load = [&](uint4 (&dst)[kUnroll][kRows], int k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = k0 + u * kStepK + lane_k;
      dst[u][0] = k < ke && has0 ? load_stream(row0 + k) : make_uint4(0, 0, 0, 0);
      dst[u][1] = k < ke && has1 ? load_stream(row1 + k) : make_uint4(0, 0, 0, 0);
    }
  };
  float acc[MAX_T][kRows] = {};
  uint4 cur[kUnroll][kRows];
  // The weights are constant during a forward: the first loads go out before waiting for the
  // kernel that writes x (programmatic dependent launch).
  load(cur, kb);
  pdl_prologue();
  if constexpr (XS) quantize_to_shared(a, xs);
  const int kblocks = (K + kFp8BlockSize - 1) / kFp8BlockSize;
  if (n0 < N) {
    for (int k0 = kb; k0 < ke; k0 += kUnroll * kStepK) {  // warp-uniform: mma.sync needs every lane
      uint4 next[kUnroll][kRows];
      load(next, k0 + kUnroll * kStepK);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u * kStepK >= ke) break;
        const int k = k0 + u * kStepK + lane_k;
        const bool in = k < ke;
        // BLOCK: the scales of piece g (64 bytes never straddle a block), which the diagonal lane
        // applies to the piece's sum: read at the piece's start, where some of its lanes may be
        // past the warp's range and the diagonal lane one of them.
        float bs0 = 1.f, bs1 = 1.f;
        if constexpr (BLOCK) {
          const int kp = k0 + u * kStepK + g * 64;
          if (kp < ke) {
            bs0 = has0 ? __ldg(a.scales + int64_t(n0 / kFp8BlockSize) * kblocks + kp / kFp8BlockSize) : 0.f;
            bs1 = has1 ? __ldg(a.scales + int64_t((n0 + 1) / kFp8BlockSize) * kblocks + kp / kFp8BlockSize) : 0.f;
          }
        }
        const uint4 w0 = cur[u][0], w1 = cur[u][1];
#pragma unroll
        for (int t = 0; t < MAX_T; ++t) {
          if (t >= T) break;
          uint4 xq = make_uint4(0, 0, 0, 0);
          if (in && XS) xq = *reinterpret_cast<const uint4*>(xs + t * K + k);
          else if (in) xq = quantize16(a.x + int64_t(t) * K + k, a.input_inv);
          float d0[4], d1[4];
          mma_e4m3(w0.x, w1.x, w0.y, w1.y, xq.x, xq.y, d0);  // bytes 0-7 of the lane's 16
          mma_e4m3(w0.z, w1.z, w0.w, w1.w, xq.z, xq.w, d1);  // bytes 8-15
          // Piece g's diagonal: D[g][g] and D[g + 8][g], held by lane (g, g / 2).
          const float v0 = (g & 1) ? d0[1] + d1[1] : d0[0] + d1[0];
          const float v1 = (g & 1) ? d0[3] + d1[3] : d0[2] + d1[2];
          if constexpr (BLOCK) {
            acc[t][0] = fmaf(v0, bs0, acc[t][0]);
            acc[t][1] = fmaf(v1, bs1, acc[t][1]);
          } else {
            acc[t][0] += v0;
            acc[t][1] += v1;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cur[u][0] = next[u][0], cur[u][1] = next[u][1];
    }
  }
  const bool diagonal = q == g / 2;
#pragma unroll
  for (int t = 0; t < MAX_T; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = warp_sum(diagonal ? acc[t][r] : 0.f);
  auto multiplier = [&](int row) {
    const float w = a.scaling == Fp8Scaling::PerChannel ? __ldg(a.scales + row)
                    : a.scaling == Fp8Scaling::Block    ? 1.f
                                                        : a.scale;
    return a.input_scale * w;
  };
  if (G == 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < MAX_T; ++t)
          if (t < T && n0 + r < N) a.y[int64_t(t) * N + n0 + r] = acc[t][r] * multiplier(n0 + r);
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < MAX_T; ++t) part[warp][r][t] = acc[t][r];
  __syncthreads();
  if (slice == 0 && lane < kRows * MAX_T) {
    const int r = lane / MAX_T, t = lane % MAX_T, row = n0 + r;
    if (t < T && row < N) {
      float sum = 0.f;
      for (int i = 0; i < G; ++i) sum += part[group * G + i][r][t];
      a.y[int64_t(t) * N + row] = sum * multiplier(row);
    }
  }
}

template <int MAX_T, bool BLOCK, bool XS>
void launch_kernel(const MmaArgs& a, int grid, cudaStream_t s) {
  const int smem = XS ? a.T * a.K : 0;
  const auto kernel = fp8_gemv_mma_kernel<MAX_T, BLOCK, XS>;
  if (smem > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch(kernel, grid, kBlock, size_t(smem), s, a);
}

template <int MAX_T>
void launch_rows(MmaArgs a, cudaStream_t s) {
  const int rows_per_block = kWarps / a.G * kRows;
  a.fp8_blocks = (a.N + rows_per_block - 1) / rows_per_block;
  const int grid = a.fp8_blocks + a.tail_n;
  // The step's quantized activations in shared memory where they fit (the SM120 profile's cap).
  const bool xs = size_t(a.T) * a.K + sizeof(float) * kWarps * kRows * MAX_T <= shared_memory_limit();
  const bool block = a.scaling == Fp8Scaling::Block;
  if (xs) block ? launch_kernel<MAX_T, true, true>(a, grid, s) : launch_kernel<MAX_T, false, true>(a, grid, s);
  else block ? launch_kernel<MAX_T, true, false>(a, grid, s) : launch_kernel<MAX_T, false, false>(a, grid, s);
}

}  // namespace

bool fp8_gemv_w8a8_supported() {
  int device = 0, major = 0, minor = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;  // E4M3 mma.sync
}

void fp8_gemv_w8a8(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s, const DeviceLinear* tail,
                   float* tail_y) {
  static_assert(kFp8GemvMaxTokens <= 16);
  FATHOM_CHECK(w.is_w8a8(), "fp8_gemv_w8a8 needs W8A8 FP8 weights");
  FATHOM_CHECK(w.in % kLaneBytes == 0, "fp8_gemv_w8a8 needs in_features % 16 == 0, got ", w.in);
  MmaArgs a{};
  a.w = w.fp8;
  a.scales = w.fp8_scaling == Fp8Scaling::PerTensor ? nullptr : w.fp8_scales;
  a.scaling = w.fp8_scaling;
  a.scale = w.fp8_scale;
  a.input_scale = w.fp8_input_scale;
  a.input_inv = 1.f / w.fp8_input_scale;
  a.x = x, a.y = y, a.T = T, a.N = w.out, a.K = w.in;
  if (tail != nullptr) {
    FATHOM_CHECK(tail->bf16 != nullptr && tail->in == w.in && tail->out > 0 && tail_y != nullptr &&
                     is_aligned(tail->bf16, 16),
                 "fp8_gemv_w8a8: the tail must be aligned bf16 rows of the same input (", w.in, " columns)");
    a.tail_w = tail->bf16, a.tail_y = tail_y, a.tail_n = tail->out;
  }
  // Warps per row pair, from N and K only (so a row's sum never depends on T): about 4K warps
  // over the GPU, each with two or more iterations of kUnroll loads per row.
  const int64_t pairs = (w.out + kRows - 1) / kRows;
  int G = 1;
  while (G < kWarps && pairs * G < 4096 && w.in / (2 * G) >= kUnroll * kStepK) G *= 2;
  a.G = G;
  a.span = (w.in + kStepK * G - 1) / (kStepK * G) * kStepK;
  if (T <= 1) launch_rows<1>(a, s);
  else if (T <= 2) launch_rows<2>(a, s);
  else if (T <= 4) launch_rows<4>(a, s);
  else if (T <= 8) launch_rows<8>(a, s);
  else launch_rows<16>(a, s);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
