// One token of the Gated DeltaNet's causal conv of a channel: silu(w . [history | x]), then x
// joins the history. Every conv kernel uses it (gdn.cu, and the projection with the conv as its
// epilogue, gdn_in_proj.cu), so a token's output has the same bits on any of them.
#pragma once
#include "kernels/cuda/common.cuh"

namespace fathom::cuda {

// The multiply-adds are explicit: left to contraction, the compiler fuses a different product of
// `w[KC-1] * x + w[0] * hist[0]` depending on the kernel it is inlined into (seen: 1-2 ulp apart).
template <int KC>
__device__ __forceinline__ float conv_step(const float (&w)[KC], float (&hist)[KC - 1], float x) {
  float acc = __fmul_rn(w[KC - 1], x);
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) acc = __fmaf_rn(w[i], hist[i], acc);
#pragma unroll
  for (int i = 0; i + 1 < KC - 1; ++i) hist[i] = hist[i + 1];
  hist[KC - 2] = x;
  return silu_f(acc);
}

}  // namespace fathom::cuda
