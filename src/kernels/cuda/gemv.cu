// Small-batch products y[T, N] = x[T, K] W[N, K]^T (T <= kGemvMaxTokens) with bf16 or fp32
// weights, for decode and draft verification, where the weights are read once and bandwidth is
// the limit.
// The kernel's body (layout, batch invariance, the staged form) is in gemv.cuh; which GEMVs take
// the staged form is gemv_takes_staged_form's choice.
#include <cstdlib>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

int g_staging_override = -1;  // set_gemv_staging_mode (tests); -1: the environment's

template <typename W, int MAX_T, int R>
__global__ void __launch_bounds__(kGemvBlock) gemv_kernel(const W* __restrict__ w, const W* __restrict__ x,
                                                          float* __restrict__ y, int T, int N, int K, int G) {
  gemv_block<W, MAX_T, R>(w, x, GemvStoreRows{y, N}, T, N, K, G);
}

template <typename W, int MAX_T, int R>
__global__ void __launch_bounds__(kGemvBlock) gemv_staged_kernel(const W* __restrict__ w, const W* __restrict__ x,
                                                                 float* __restrict__ y, int T, int N, int K, int G) {
  extern __shared__ __align__(128) uint4 stage[];
  __shared__ uint64_t bar;
  gemv_block<W, MAX_T, R, GemvStoreRows, true>(w, x, GemvStoreRows{y, N}, T, N, K, G, reinterpret_cast<W*>(stage),
                                               &bar);
}

// Past kGemvMaxTokens (the fp32 router at batch 6 to kGemvChunkedMaxTokens): the GEMV over
// chunks of 8 tokens, a chunk a grid row. A token's sum runs in an order fixed by (N, K) alone
// (batch invariance), so these rows have the bits of one-token GEMVs; the weights are read
// once a chunk, from L2 after the first.
using GemvChunk = GemvBucket<8, 4>;  // tokens a chunk, rows a warp group
template <typename W>
__global__ void __launch_bounds__(kGemvBlock) gemv_chunked_kernel(const W* __restrict__ w, const W* __restrict__ x,
                                                                  float* __restrict__ y, int T, int N, int K, int G) {
  using B = GemvChunk;
  const int t0 = blockIdx.y * B::kMaxT;
  gemv_block<W, B::kMaxT, B::kRows>(w, x + int64_t(t0) * K, GemvStoreRows{y + int64_t(t0) * N, N},
                                    min(B::kMaxT, T - t0), N, K, G);
}

template <typename W>
void launch_gemv(const W* x, const W* w, float* y, int T, int N, int K, cudaStream_t s) {
  const int G = gemv_warps_per_row<W>(N, K);
  for_gemv_bucket(T, [&](auto b) {
    using B = decltype(b);
    const int blocks = gemv_blocks(N, G, B::kRows);
    const size_t stage = gemv_stage_bytes(G, B::kRows, K, sizeof(W));
    if (gemv_takes_staged_form(reinterpret_cast<const void*>(gemv_staged_kernel<W, B::kMaxT, B::kRows>), blocks, stage))
      launch(gemv_staged_kernel<W, B::kMaxT, B::kRows>, blocks, kGemvBlock, stage, s, w, x, y, T, N, K, G);
    else
      launch(gemv_kernel<W, B::kMaxT, B::kRows>, blocks, kGemvBlock, 0, s, w, x, y, T, N, K, G);
  });
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

bool usable(const void* x, const void* w, int T, int K, int elem, int max_tokens = kGemvMaxTokens) {
  const int V = 16 / elem;
  return T >= 1 && T <= max_tokens && K % V == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

}  // namespace

int gemv_staging_mode() {
  static const int from_env = [] {
    const char* v = std::getenv("FATHOM_GEMV_STAGED");
    return v ? std::atoi(v) : kGemvStagingDefault;
  }();
  return g_staging_override >= 0 ? g_staging_override : from_env;
}
void set_gemv_staging_mode(int mode) { g_staging_override = mode; }

size_t gemv_stage_bytes(int G, int R, int K, size_t elem) {
  return size_t(gemv_rows_per_block(G, R)) * size_t(K) * elem;
}

bool gemv_takes_staged_form(const void* kernel, int blocks, size_t stage_bytes) {
  const int mode = gemv_staging_mode();
  if (mode < 1 || stage_bytes > kGemvStageMaxBytes) return false;
  if (mode >= 2) {
    allow_dynamic_smem(kernel, int(stage_bytes));
    return true;
  }
  return blocks <= resident_blocks_per_sm(kernel, kGemvBlock, stage_bytes) * multiprocessor_count();
}

namespace {
template <typename W>
bool staged_for(int T, int N, int K) {
  if (T < 1 || T > kGemvMaxTokens) return false;
  const int G = gemv_warps_per_row<W>(N, K);
  bool staged = false;
  for_gemv_bucket(T, [&](auto b) {
    using B = decltype(b);
    staged = gemv_takes_staged_form(reinterpret_cast<const void*>(gemv_staged_kernel<W, B::kMaxT, B::kRows>),
                                    gemv_blocks(N, G, B::kRows), gemv_stage_bytes(G, B::kRows, K, sizeof(W)));
  });
  return staged;
}
}  // namespace

bool gemv_staged_for(int T, int N, int K, size_t weight_bytes) {
  return weight_bytes == 2 ? staged_for<bf16_t>(T, N, K) : staged_for<float>(T, N, K);
}

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

bool gemv_chunked(const float* x, const float* w, float* y, int T, int N, int K, cudaStream_t s) {
  if (!usable(x, w, T, K, 4, kGemvChunkedMaxTokens)) return false;
  const int G = gemv_warps_per_row<float>(N, K);
  const dim3 grid(gemv_blocks(N, G, GemvChunk::kRows), (T + GemvChunk::kMaxT - 1) / GemvChunk::kMaxT);
  launch(gemv_chunked_kernel<float>, grid, kGemvBlock, 0, s, w, x, y, T, N, K, G);
  FATHOM_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace fathom::cuda
