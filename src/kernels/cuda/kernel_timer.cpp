#include "kernels/cuda/kernel_timer.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

double median_launch_ms(const std::function<void()>& launch, int reps) {
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  launch();
  std::vector<double> ms;
  for (int r = 0; r < std::max(1, reps); ++r) {
    FATHOM_CUDA_CHECK(cudaEventRecord(a));
    launch();
    FATHOM_CUDA_CHECK(cudaEventRecord(b));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace fathom::cuda
