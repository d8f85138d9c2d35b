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

double median_graph_launch_ms(const std::function<void(int, cudaStream_t)>& launch, int count, int reps) {
  cudaStream_t s;
  FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int j = 0; j < count; ++j) launch(j, s);  // warm-up outside the capture (lazy kernel attributes)
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  FATHOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int j = 0; j < count; ++j) launch(j, s);
  FATHOM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  FATHOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  FATHOM_CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::vector<double> ms;
  for (int r = 0; r < std::max(1, reps); ++r) {
    FATHOM_CUDA_CHECK(cudaEventRecord(a, s));
    FATHOM_CUDA_CHECK(cudaGraphLaunch(exec, s));
    FATHOM_CUDA_CHECK(cudaEventRecord(b, s));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(double(t) / count);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  FATHOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FATHOM_CUDA_CHECK(cudaGraphDestroy(graph));
  FATHOM_CUDA_CHECK(cudaStreamDestroy(s));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace fathom::cuda
