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

size_t shared_memory_limit() {
  // Asked on launch paths (the skinny GEMM, the FP8 GEMV, the recurrent step's choice): one query a device.
  static std::mutex mu;
  static std::map<int, size_t> limits;
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = limits.try_emplace(device, 0);
  if (fresh) {
    int optin = 0;
    FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    it->second = sm120_profile() ? std::min(size_t(optin), kSm120SharedBytes) : size_t(optin);
  }
  return it->second;
}

int multiprocessor_count() {
  // Asked on launch paths (the chunk kernel's slice rule, each prefill layer): one query a device.
  static std::mutex mu;
  static std::map<int, int> counts;
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = counts.try_emplace(device, 0);
  if (fresh) FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&it->second, cudaDevAttrMultiProcessorCount, device));
  return it->second;
}

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
