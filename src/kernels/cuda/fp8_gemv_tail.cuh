// The bf16 rows the FP8 GEMVs compute in their own launch (extra blocks past the FP8 rows'): the
// bf16 projections beside FP8 ones of the same input in the FP8 releases (DeltaNet's [b | a], the
// shared expert's gate logit), so a step launches one kernel for both. One row per block: the 8
// warps split K, each lane keeps up to kTailLoads 16-byte loads in flight, fp32 sums in an order
// fixed by K (lane strides, the butterfly, then the warps in order), so a row's bits do not
// depend on T.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

struct Bf16TailArgs {
  const bf16_t* x;  // [T, K]
  const bf16_t* w;  // [n, K]
  float* y;         // [T, n]
  int T, K, n;
  int first_block;  // blocks before it compute the FP8 rows
};

constexpr int kTailLoads = 4;

// The block's row (blockIdx.x - first_block); part: kWarps x kMaxT floats of shared memory, warp
// w's at part + w * warp_stride.
template <int kWarps, int kMaxT>
__device__ void bf16_tail_row(const Bf16TailArgs& a, float* part, int warp_stride) {
  const int T = a.T, K = a.K, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x - a.first_block;
  const int span = (K + kWarps * 256 - 1) / (kWarps * 256) * 256;  // whole 256-element lane strides
  const int kb = warp * span, ke = min(K, kb + span);
  const bf16_t* w = a.w + int64_t(row) * K;
  float acc[kMaxT] = {};
  uint4 wv[kTailLoads];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kTailLoads; ++i) {
      const int k = k0 + i * 256 + lane * 8;
      wv[i] = k < ke ? load_stream(w + k) : make_uint4(0, 0, 0, 0);
    }
  };
  load(kb);  // weights: before waiting for the kernel that writes x
  pdl_prologue();
  for (int k0 = kb; k0 < ke; k0 += kTailLoads * 256) {
    if (k0 > kb) load(k0);
#pragma unroll
    for (int i = 0; i < kTailLoads; ++i) {
      const int k = k0 + i * 256 + lane * 8;
      if (k >= ke) break;
      const uint32_t ww[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
#pragma unroll
      for (int t = 0; t < kMaxT; ++t) {
        if (t >= T) break;
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(a.x + int64_t(t) * K + k));
        const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[t] = fmaf(__uint_as_float(ww[e] << 16), __uint_as_float(xw[e] << 16), acc[t]);
          acc[t] = fmaf(__uint_as_float(ww[e] & 0xffff0000u), __uint_as_float(xw[e] & 0xffff0000u), acc[t]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) acc[t] = warp_sum(acc[t]);
  if (lane == 0)
#pragma unroll
    for (int t = 0; t < kMaxT; ++t) part[warp * warp_stride + t] = acc[t];
  __syncthreads();
  if (warp == 0 && lane < T) {
    float sum = 0.f;
    for (int i = 0; i < kWarps; ++i) sum += part[i * warp_stride + lane];
    a.y[int64_t(lane) * a.n + row] = sum;
  }
}

}  // namespace fathom::cuda
