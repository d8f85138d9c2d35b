// The softmax + top-k of one token's router logits by one warp (moe.cu's routing kernels and the
// one-token MoE launch, moe_decode_fused.cu): the same picks and weights wherever it runs.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

// Softmax and top-k of token t's logits, by one warp holding N of them a lane (N * 32 >= E). The
// logits are read through L2 (ld.cg): in moe_route_kernel other blocks of the same launch wrote
// them. N only bounds the registers scanned: the padding is never picked and adds nothing to the
// sum, so every N gives the same ids and weights. kLaneWrites (K <= 32): lane k keeps pick k and
// writes it once the sum is known, and returns it; else lane 0 writes each pick, renormalises
// from memory, and every lane returns -1.
template <int N, bool kLaneWrites>
__device__ int topk_token_lanes(const float* logits, int32_t* ids, float* weights, int t, int E, int K, bool renorm) {
  const int lane = threadIdx.x % 32;
  const float* row = logits + int64_t(t) * E;
  float p[N];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? __ldcg(row + e) : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    p[i] = (lane + 32 * i) < E ? expf(p[i] - mx) : -1.f;
    sum += p[i] > 0.f ? p[i] : 0.f;
  }
  sum = warp_sum(sum);
  float picked_sum = 0.f, my_prob = 0.f;
  int my_e = 0;
  for (int k = 0; k < K; ++k) {
    float best = -1.f;
    int best_e = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (p[i] > best) best = p[i], best_e = lane + 32 * i;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffff, best, o);
      const int oe = __shfl_xor_sync(0xffffffff, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if ((best_e % 32) == lane) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (lane + 32 * i == best_e) p[i] = -1.f;
    }
    const float prob = best / sum;
    picked_sum += prob;
    if (kLaneWrites && K <= 32) {
      if (lane == k) my_e = best_e, my_prob = prob;
    } else if (lane == 0) {
      ids[int64_t(t) * K + k] = best_e;
      weights[int64_t(t) * K + k] = prob;
    }
  }
  // Every lane holds the same picks and sums (xor reductions), so lane k writes pick k once the
  // sum is known (no stores read back for the renormalisation).
  if (kLaneWrites && K <= 32) {
    if (lane < K) {
      ids[int64_t(t) * K + lane] = my_e;
      weights[int64_t(t) * K + lane] = renorm ? my_prob / picked_sum : my_prob;
    }
    return lane < K ? my_e : -1;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[int64_t(t) * K + k] /= picked_sum;
  return -1;
}

// Up to 256 experts, topk_token_lanes with the fewest registers a lane that hold E logits and
// lane writes (8 registers scanned a round at 256 experts, not kMaxExperts / 32 = 32); past that
// the form before, which 16 registers with lane writes measured slower than at 512 experts
// (docs/perf.md, stop 58). N: the registers a lane (topk_lanes_for).
constexpr int kTopkPlainLanes = kMaxExperts / 32;
constexpr int kTopk4LaneExperts = 4 * 32, kTopk8LaneExperts = 8 * 32;  // the most experts each form holds
constexpr int topk_lanes_for(int E) {
  return E <= kTopk4LaneExperts ? 4 : E <= kTopk8LaneExperts ? 8 : kTopkPlainLanes;
}
template <int N>
__device__ int topk_token_n(const float* logits, int32_t* ids, float* weights, int t, int E, int K, bool renorm) {
  return topk_token_lanes<N, (N < kTopkPlainLanes)>(logits, ids, weights, t, E, K, renorm);
}
// Returns f(std::integral_constant<int, topk_lanes_for(E)>{}). The one-token routing kernel takes
// its form as a template argument chosen at launch, so it holds one form's code only (the three
// inlined together made the 512-expert tail slower than the form alone: docs/perf.md, stop 59).
template <class F>
decltype(auto) for_topk_form(int E, F&& f) {
  switch (topk_lanes_for(E)) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return f(std::integral_constant<int, kTopkPlainLanes>{});
  }
}

}  // namespace fathom::cuda
