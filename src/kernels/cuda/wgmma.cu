// wgmma_available() (backend_switches.h): whether this device runs the binary's wgmma kernels.
#include <atomic>

#include "kernels/cuda/wgmma.cuh"

namespace fathom::cuda {
namespace {

__global__ void wgmma_probe_kernel(int* out) {
#ifdef FATHOM_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

constexpr int kMaxDevices = 64;
std::atomic<int> g_available[kMaxDevices] = {};  // 0 not asked, 1 no, 2 yes

}  // namespace

bool wgmma_available() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  if (const int known = g_available[dev].load()) return known == 2;
  bool yes = false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
      minor == 0) {
    // The binary's sm_90 code may lack the arch-specific features (built for sm_90, not sm_90a).
    int* d = nullptr;
    int h = 0;
    if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
      wgmma_probe_kernel<<<1, 1>>>(d);
      yes = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1;
      cudaFree(d);
    }
  }
  g_available[dev].store(yes ? 2 : 1);
  return yes;
}

}  // namespace fathom::cuda
