// Kernel launches with programmatic dependent launch (PDL, SM90+): a kernel's blocks may be
// scheduled while the kernel before it drains, and each kernel waits for its predecessor's
// results at its top (pdl_prologue), so the results are those of ordinary launches; what is
// saved is the launch gap between kernels, which adds up over the ~450 small kernels of a
// batch-1 decode step. Every kernel launched with launch() must begin with pdl_prologue().
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

bool programmatic_launch_enabled();

// Opts `kernel` into `bytes` of dynamic shared memory on the current device (needed above the
// default 48 KB; done once per kernel and device).
void allow_dynamic_smem(const void* kernel, int bytes);
// Blocks of `threads` threads and `smem` bytes of dynamic shared memory that one SM holds at once
// for `kernel` on the current device (the smem granted first), queried once per kernel, shape and
// device: grids that must be resident in one wave are sized from it.
int resident_blocks_per_sm(const void* kernel, int threads, size_t smem);

// A profiling tool: with FATHOM_KNOCKOUT=name[,name...] set, launch() skips every kernel whose
// name contains one of the names, so a step's time without them shows what they cost inside the
// decode graph (`fathom bench`); the step's results are wrong while it is set.
bool knockout_enabled();
bool knocked_out(const void* kernel);

inline bool is_aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// `cluster` (nullptr: none) groups the grid's blocks into thread-block clusters (SM90+), whose
// blocks may read each other's shared memory.
template <typename... Params, typename... Args>
void launch_in_clusters(const dim3* cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (programmatic_launch_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster->x;
    attr[n].val.clusterDim.y = cluster->y;
    attr[n++].val.clusterDim.z = cluster->z;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  if (knockout_enabled() && knocked_out(reinterpret_cast<const void*>(kernel))) return;
  FATHOM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_in_clusters(nullptr, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace fathom::cuda
