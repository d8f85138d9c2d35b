// The programmatic-dependent-launch switch of launch.cuh (on unless FATHOM_PDL=0) and the
// dynamic-shared-memory opt-ins.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {
bool environment_allows() {
  const char* v = std::getenv("FATHOM_PDL");
  return !(v && std::strcmp(v, "0") == 0);
}
const bool g_allowed = environment_allows();
// FATHOM_KNOCKOUT's names (comma-separated), empty when unset.
std::vector<std::string> knockout_names() {
  std::vector<std::string> names;
  const char* v = std::getenv("FATHOM_KNOCKOUT");
  std::string_view rest = v ? v : "";
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (comma != 0) names.emplace_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (!names.empty())
    std::fprintf(stderr, "fathom: FATHOM_KNOCKOUT=%s: kernels whose names contain these are not launched, so "
                 "results are wrong (a profiling switch)\n", v);
  return names;
}
const std::vector<std::string> g_knockout = knockout_names();
bool g_on = true;
}  // namespace

bool programmatic_launch_enabled() { return g_allowed && g_on; }
void set_programmatic_launch(bool on) { g_on = on; }

bool knockout_enabled() { return !g_knockout.empty(); }

bool knocked_out(const void* kernel) {
  static std::mutex mu;
  static std::map<const void*, bool> verdict;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = verdict.try_emplace(kernel, false);
  if (fresh) {
    const char* name = nullptr;
    FATHOM_CUDA_CHECK(cudaFuncGetName(&name, kernel));
    for (const std::string& n : g_knockout)
      if (name && std::string_view(name).find(n) != std::string_view::npos) it->second = true;
  }
  return it->second;
}

void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> granted;  // (kernel, device) -> bytes
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  int& have = granted[{kernel, device}];
  if (have >= bytes) return;
  FATHOM_CHECK(size_t(bytes) <= shared_memory_limit(), "a kernel needs ", bytes / 1024, " KB of shared memory a block, ",
               shared_memory_limit() / 1024, " KB allowed", sm120_profile() ? " (SM120 profile)" : "");
  FATHOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have = bytes;
}

int resident_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  allow_dynamic_smem(kernel, int(smem));
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t, int>, int> known;  // (kernel, threads, smem, device)
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = known.try_emplace({kernel, threads, smem, device}, 0);
  if (fresh) FATHOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, smem));
  return it->second;
}

}  // namespace fathom::cuda
