// Median time of a launch sequence on the default stream, by CUDA events: how the backend tuner
// and the kernel rigs time candidates.
#pragma once
#include <functional>

namespace fathom::cuda {

// One warm-up call (lazy kernel attributes), then the median milliseconds of `reps` calls.
double median_launch_ms(const std::function<void()>& launch, int reps);

}  // namespace fathom::cuda
