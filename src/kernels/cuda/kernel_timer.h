// Median time of a launch sequence, by CUDA events: how the backend tuner and the kernel rigs
// time candidates.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace fathom::cuda {

// One warm-up call (lazy kernel attributes), then the median milliseconds of `reps` calls.
double median_launch_ms(const std::function<void()>& launch, int reps);

// Median milliseconds per launch of `count` launches captured back to back in one CUDA graph
// (launch(j, s) for j = 0 .. count - 1 on the capturing stream s), over `reps` replays. Decode-sized
// kernels take a few microseconds: timed one call at a time they measure the host's launch gaps,
// not the kernels, which in a served step run inside a graph like this one.
double median_graph_launch_ms(const std::function<void(int, cudaStream_t)>& launch, int count, int reps);

}  // namespace fathom::cuda
