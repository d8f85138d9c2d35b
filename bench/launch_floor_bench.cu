// What one kernel boundary costs inside a decode-step graph (issue 32): a CUDA graph of N
// dependent kernels, replayed, with and without programmatic dependent launch (PDL). Each kernel
// is a grid of `blocks` blocks of 256 threads that waits for its predecessor and has one thread
// add 1 to the value the previous kernel wrote, so the chain is a true dependency chain and the
// time per kernel is the floor under every fused-away launch of a batch-1 step (~500 kernels at
// the 35B shape). Also the same chain with each kernel streaming `kb` KB of weights (a small
// GEMV's bytes) issued before or after the wait, to show what early loads hide.
// usage: launch_floor_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "graph_timing.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

using namespace fathom::cuda;

namespace {

__global__ void chain_kernel(float* v, int i) {
  pdl_prologue();
  if (blockIdx.x == 0 && threadIdx.x == 0) v[i + 1] = v[i] + 1.f;
}

// Each block streams its share of `w` (uint4 loads), before the wait when `early`.
template <bool kEarly>
__global__ void stream_kernel(float* v, int i, const uint4* w, int per_block) {
  const uint4* p = w + int64_t(blockIdx.x) * per_block;
  uint32_t acc = 0;
  if (kEarly) {
    for (int j = threadIdx.x; j < per_block; j += blockDim.x) acc ^= load_stream(p + j).x;
    pdl_prologue();
  } else {
    pdl_prologue();
    for (int j = threadIdx.x; j < per_block; j += blockDim.x) acc ^= load_stream(p + j).x;
  }
  const float prev = v[i];
  if (acc == 0x12345678u) v[0] = 0.f;  // keeps the loads
  if (blockIdx.x == 0 && threadIdx.x == 0) v[i + 1] = prev + 1.f;
}

}  // namespace

int main() {
  constexpr int kChain = 400;
  float* v = nullptr;
  FATHOM_CUDA_CHECK(cudaMalloc(&v, (kChain + 1) * sizeof(float)));
  FATHOM_CUDA_CHECK(cudaMemset(v, 0, (kChain + 1) * sizeof(float)));
  int sms = 0;
  FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("kernel boundary floor (graph of %d dependent kernels, 256 threads a block), us per kernel:\n", kChain);
  std::printf("  %-34s %9s %9s\n", "kernel", "PDL", "no PDL");
  for (int blocks : {1, sms, 4 * sms}) {
    double us[2];
    for (int pdl = 1; pdl >= 0; --pdl) {
      set_programmatic_launch(pdl == 1);
      us[1 - pdl] = fathom::bench::graph_us_per_call(
          kChain, [&](int i, cudaStream_t s) { launch(chain_kernel, blocks, 256, 0, s, v, i); });
    }
    std::printf("  empty, %4d blocks                 %9.2f %9.2f\n", blocks, us[0], us[1]);
  }
  // Streaming kernels: 4 weight copies cycled so the bytes come from HBM, not L2.
  for (int kb : {256, 1024, 4096, 16384}) {
    const int blocks = 2 * sms;
    const int per_block = std::max(1, kb * 1024 / 16 / blocks);
    const size_t bytes = size_t(per_block) * blocks * 16;
    std::vector<uint4*> w(16);
    for (auto& p : w) {
      FATHOM_CUDA_CHECK(cudaMalloc(&p, bytes));
      FATHOM_CUDA_CHECK(cudaMemset(p, 0x3c, bytes));
    }
    double us[3];
    set_programmatic_launch(true);
    us[0] = fathom::bench::graph_us_per_call(kChain, [&](int i, cudaStream_t s) {
      launch(stream_kernel<true>, blocks, 256, 0, s, v, i, (const uint4*)w[i % 16], per_block);
    });
    us[1] = fathom::bench::graph_us_per_call(kChain, [&](int i, cudaStream_t s) {
      launch(stream_kernel<false>, blocks, 256, 0, s, v, i, (const uint4*)w[i % 16], per_block);
    });
    set_programmatic_launch(false);
    us[2] = fathom::bench::graph_us_per_call(kChain, [&](int i, cudaStream_t s) {
      launch(stream_kernel<false>, blocks, 256, 0, s, v, i, (const uint4*)w[i % 16], per_block);
    });
    set_programmatic_launch(true);
    std::printf("  stream %6d KB (%d blocks): early loads + PDL %6.2f us (%.2f TB/s), loads after wait + PDL %6.2f, "
                "no PDL %6.2f\n",
                kb, blocks, us[0], bytes / (us[0] * 1e-6) / 1e12, us[1], us[2]);
    for (auto p : w) FATHOM_CUDA_CHECK(cudaFree(p));
  }
  float last = 0;
  FATHOM_CUDA_CHECK(cudaMemcpy(&last, v + kChain, sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("chain check: v[%d] = %.0f (expected %d)\n", kChain, last, kChain);
  FATHOM_CUDA_CHECK(cudaFree(v));
  return 0;
}
