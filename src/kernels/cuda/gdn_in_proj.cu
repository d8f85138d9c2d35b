// The Gated DeltaNet's input projection at decode sizes with the causal conv as its epilogue
// (issue 32). The thread that finishes row n of the bf16 GEMV holds that row's value for every
// token of the step; for n < conv_dim the row is conv channel n, and the conv of a channel needs
// nothing else (its weights and state), so that thread runs it: the conv kernel and its launch
// boundary leave the decode chain. The row values are gemm_bf16's GEMV's (gemv.cuh) and the conv
// is gdn_conv's (gdn_conv_step.cuh), so the bits are those of the two-kernel path.
#include <algorithm>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_conv_step.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

// The conv kernel size of every Qwen3.5 and Qwen3-Next checkpoint; others take the two kernels.
constexpr int kKc = 4;

struct ConvEpilogue {
  GemvStoreRows rows;  // the projection itself (mixed)
  const float* conv_w;
  float* conv_state;
  const int32_t* seq_start;
  const int32_t* state_slot;
  float* u;
  int conv_dim, num_seqs;
  StateHistory hs;

  // As gdn_conv_kernel for channel n, over each sequence's tokens in order.
  template <int MAX_T>
  __device__ __forceinline__ void operator()(int n, const float (&v)[MAX_T], int T) const {
    rows(n, v, T);
    if (n >= conv_dim) return;
    float w[kKc];
#pragma unroll
    for (int i = 0; i < kKc; ++i) w[i] = conv_w[int64_t(n) * kKc + i];
    for (int s = 0; s < num_seqs; ++s) {
      const int t0 = seq_start[s], t1 = seq_start[s + 1];
      float* st = conv_state + int64_t(state_slot[s]) * (kKc - 1) * conv_dim;
      float* keep =
          hs.conv && hs.keep[s] ? hs.conv + int64_t(state_slot[s]) * hs.entries * (kKc - 1) * conv_dim : nullptr;
      float hist[kKc - 1];
#pragma unroll
      for (int i = 0; i < kKc - 1; ++i) hist[i] = st[int64_t(i) * conv_dim + n];
      if (keep)
#pragma unroll
        for (int i = 0; i < kKc - 1; ++i) keep[int64_t(i) * conv_dim + n] = hist[i];
#pragma unroll
      for (int t = 0; t < MAX_T; ++t) {
        if (t < t0 || t >= t1) continue;
        u[int64_t(t) * conv_dim + n] = conv_step<kKc>(w, hist, v[t]);
        if (keep) {
          float* e = keep + int64_t(t - t0 + 1) * (kKc - 1) * conv_dim;
#pragma unroll
          for (int i = 0; i < kKc - 1; ++i) e[int64_t(i) * conv_dim + n] = hist[i];
        }
      }
#pragma unroll
      for (int i = 0; i < kKc - 1; ++i) st[int64_t(i) * conv_dim + n] = hist[i];
    }
  }
};

template <int MAX_T, int R>
__global__ void __launch_bounds__(kGemvBlock) gdn_in_proj_conv_kernel(const bf16_t* __restrict__ w,
                                                                      const bf16_t* __restrict__ x, ConvEpilogue ep,
                                                                      int T, int N, int K, int G) {
  gemv_block<bf16_t, MAX_T, R>(w, x, ep, T, N, K, G);
}

// The staged form (gemv.cuh). Its grid is several waves (the 35B: 1,544 blocks), so it takes the
// form in mode 2 only: the first wave's rows are copied while the input norm runs, the later
// waves' as blocks finish.
template <int MAX_T, int R>
__global__ void __launch_bounds__(kGemvBlock) gdn_in_proj_conv_staged_kernel(const bf16_t* __restrict__ w,
                                                                             const bf16_t* __restrict__ x,
                                                                             ConvEpilogue ep, int T, int N, int K,
                                                                             int G) {
  extern __shared__ __align__(128) uint4 stage[];
  __shared__ uint64_t bar;
  gemv_block<bf16_t, MAX_T, R, ConvEpilogue, true>(w, x, ep, T, N, K, G, reinterpret_cast<bf16_t*>(stage), &bar);
}

}  // namespace

bool gdn_in_proj_conv(const bf16_t* x, const bf16_t* w, float* mixed, int T, int N, int K, const float* conv_w,
                      float* conv_state, const int32_t* seq_start, const int32_t* state_slot, float* u, int num_seqs,
                      int conv_dim, int kc, const StateHistory* hist, int gemv_max_tokens, cudaStream_t s) {
  // Injected faults name the plain GEMV and conv; they keep their own kernels.
  if (kc != kKc || T < 1 || T > std::min(gemv_max_tokens, kGemvMaxTokens) || num_seqs < 1 || num_seqs > T ||
      conv_dim > N || K % 8 != 0 || !is_aligned(x, 16) || !is_aligned(w, 16) || backend_faults_enabled())
    return false;
  const ConvEpilogue ep{{mixed, N}, conv_w, conv_state, seq_start, state_slot, u, conv_dim, num_seqs,
                        hist ? *hist : StateHistory{}};
  const int G = gemv_warps_per_row<bf16_t>(N, K);
  for_gemv_bucket(T, [&](auto b) {
    using B = decltype(b);
    const int blocks = gemv_blocks(N, G, B::kRows);
    const size_t stage = gemv_stage_bytes(G, B::kRows, K, sizeof(bf16_t));
    if (gemv_takes_staged_form(reinterpret_cast<const void*>(gdn_in_proj_conv_staged_kernel<B::kMaxT, B::kRows>),
                               blocks, stage)) {
      launch(gdn_in_proj_conv_staged_kernel<B::kMaxT, B::kRows>, blocks, kGemvBlock, stage, s, w, x, ep, T, N, K, G);
    } else {
      launch(gdn_in_proj_conv_kernel<B::kMaxT, B::kRows>, blocks, kGemvBlock, 0, s, w, x, ep, T, N, K, G);
    }
  });
  FATHOM_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace fathom::cuda
