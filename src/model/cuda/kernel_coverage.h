// Which model shapes the CUDA engine's kernels cover. Every shape the CPU engine accepts either
// runs (the fast kernels where they cover it, generic ones where they do not: slower, same
// results within rounding) or is refused at load with a message naming the dimension.
#pragma once
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/cuda/device_weights.h"

namespace fathom::cuda {

// Throws, naming the dimension, for a shape no CUDA kernel runs (before any weight is loaded).
void check_cuda_shapes(const ModelConfig& cfg);
// One line per op that runs a generic kernel for this model's shapes, and why (the start-up log).
std::vector<std::string> generic_kernel_notes(const ModelConfig& cfg, const DeviceWeights& w);

}  // namespace fathom::cuda
