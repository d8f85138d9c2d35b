#include "kernels/cuda/backend_switches.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/backend_selection.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

bool sm120_profile() {
  static const bool on = [] {
    const char* e = std::getenv("FATHOM_SM120_PROFILE");
    return e && std::string(e) == "1";
  }();
  return on;
}

namespace {

// The current device's `attr`, queried once a device: these are asked on launch paths (the skinny
// GEMM, the FP8 GEMV, the recurrent step's choice, the chunk kernel's slice rule).
int device_attribute(cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = known.try_emplace({device, int(attr)}, 0);
  if (fresh) FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&it->second, attr, device));
  return it->second;
}

}  // namespace

size_t shared_memory_limit() {
  const size_t optin = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  return sm120_profile() ? std::min(optin, kSm120SharedBytes) : optin;
}

int multiprocessor_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

namespace {
__global__ void illegal_write_kernel(float* p) { p[threadIdx.x] = 1.f; }
}  // namespace

bool backend_faults_enabled() {
  static const bool on = [] {
    const char* spec = std::getenv("FATHOM_BACKEND_FAULT");
    return spec && *spec;
  }();
  return on;
}

BackendFault backend_fault_of(const char* op, const char* candidate) {
  if (!backend_faults_enabled()) return BackendFault::None;
  static const char* spec = std::getenv("FATHOM_BACKEND_FAULT");
  static std::mutex m;
  static std::map<std::pair<std::string, std::string>, BackendFault> known;
  std::lock_guard<std::mutex> lock(m);
  auto key = std::make_pair(std::string(op), std::string(candidate));
  auto it = known.find(key);
  if (it == known.end()) it = known.emplace(key, backend_fault_in(spec, op, candidate)).first;
  return it->second;
}

void inject_backend_fault(const char* op, const char* candidate, void* out, size_t bytes, cudaStream_t s) {
  const BackendFault f = backend_fault_of(op, candidate);
  if (f == BackendFault::Nan) FATHOM_CUDA_CHECK(cudaMemsetAsync(out, 0xff, bytes, s));
  if (f == BackendFault::Wrong) FATHOM_CUDA_CHECK(cudaMemsetAsync(out, 0x3f, bytes, s));
  if (f == BackendFault::Crash) illegal_write_kernel<<<1, 32, 0, s>>>(reinterpret_cast<float*>(uintptr_t(64)));
  if (f == BackendFault::Oob)
    FATHOM_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(out) + bytes, 0x3f, kOobFaultBytes, s));
}

}  // namespace fathom::cuda
