// Timing a chain of launches the way the engine replays a decode step: `calls` calls of fn(i, s)
// captured into one CUDA graph, replayed, and the median over `replays` replays of the time per
// call (microseconds). Shared by the decode benchmarks (launch_floor_bench, decode_ops_bench).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace fathom::bench {

template <class Fn>
double graph_us_per_call(int calls, Fn&& fn, int replays = 7) {
  cudaStream_t s;
  FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  FATHOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) fn(i, s);
  FATHOM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  FATHOM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  for (int r = 0; r < 2; ++r) FATHOM_CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm-up
  std::vector<double> runs;
  for (int r = 0; r < replays; ++r) {
    FATHOM_CUDA_CHECK(cudaEventRecord(a, s));
    FATHOM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    FATHOM_CUDA_CHECK(cudaEventRecord(b, s));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(ms * 1e3 / calls);
  }
  std::sort(runs.begin(), runs.end());
  FATHOM_CUDA_CHECK(cudaEventDestroy(a));
  FATHOM_CUDA_CHECK(cudaEventDestroy(b));
  FATHOM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  FATHOM_CUDA_CHECK(cudaGraphDestroy(g));
  FATHOM_CUDA_CHECK(cudaStreamDestroy(s));
  return runs[runs.size() / 2];
}

}  // namespace fathom::bench
