// Chooses the engine for --device: the CPU reference engine, or the CUDA engine when built.
#include "core/error.h"
#include "model/cpu_runner.h"
#include "model/model_runner.h"
#ifdef FATHOM_HAVE_CUDA
#include "model/cuda/cuda_runner.h"
#endif

namespace fathom {

std::unique_ptr<ModelRunner> open_model(const std::string& path, const std::string& device, bool with_mtp) {
  if (device == "cpu") return std::make_unique<CpuRunner>(HybridModel::load(path, with_mtp));
  if (device == "cuda") {
#ifdef FATHOM_HAVE_CUDA
    return cuda::CudaRunner::from_checkpoint(path, cuda::CudaRunnerOptions{});
#else
    fail("--device cuda: this build of fathom has no CUDA engine (nvcc was not found at configure time)");
#endif
  }
  fail("unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace fathom
