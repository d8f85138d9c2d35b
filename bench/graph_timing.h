// Timing a chain of launches the way the engine replays a decode step: `calls` calls of fn(i, s)
// captured into one CUDA graph and replayed (kernels/cuda/kernel_timer.h, as the backend tuner
// times decode candidates), the median over `replays` replays of the time per call in
// microseconds. Shared by the decode benchmarks (launch_floor_bench, decode_ops_bench).
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/kernel_timer.h"

namespace fathom::bench {

template <class Fn>
double graph_us_per_call(int calls, Fn&& fn, int replays = 7) {
  return 1e3 * cuda::median_graph_launch_ms([&](int i, cudaStream_t s) { fn(i, s); }, calls, replays);
}

}  // namespace fathom::bench
