// Small-batch products y[T, N] = x[T, K] W[N, K]^T (T <= kGemvMaxTokens) with bf16 or fp32
// weights, for decode and draft verification, where the weights are read once and bandwidth is
// the limit.
// The kernel's body (layout, batch invariance) is in gemv.cuh.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

template <typename W, int MAX_T, int R>
__global__ void __launch_bounds__(kGemvBlock) gemv_kernel(const W* __restrict__ w, const W* __restrict__ x,
                                                          float* __restrict__ y, int T, int N, int K, int G) {
  gemv_block<W, MAX_T, R>(w, x, GemvStoreRows{y, N}, T, N, K, G);
}

template <typename W>
void launch_gemv(const W* x, const W* w, float* y, int T, int N, int K, cudaStream_t s) {
  const int G = gemv_warps_per_row<W>(N, K);
  for_gemv_bucket(T, [&](auto b) {
    using B = decltype(b);
    launch(gemv_kernel<W, B::kMaxT, B::kRows>, gemv_blocks(N, G, B::kRows), kGemvBlock, 0, s, w, x, y, T, N, K, G);
  });
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

bool usable(const void* x, const void* w, int T, int K, int elem) {
  const int V = 16 / elem;
  return T >= 1 && T <= kGemvMaxTokens && K % V == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

}  // namespace

bool gemv_small_batch(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s) {
  if (!usable(x, w, T, K, 2)) return false;
  launch_gemv(x, w, y, T, N, K, s);
  return true;
}

bool gemv_small_batch(const float* x, const float* w, float* y, int T, int N, int K, cudaStream_t s) {
  if (!usable(x, w, T, K, 4)) return false;
  launch_gemv(x, w, y, T, N, K, s);
  return true;
}

}  // namespace fathom::cuda
