// Bulk asynchronous copies global -> shared (the TMA unit's 1-D form, sm_90) completing on a
// shared-memory mbarrier: one thread issues a copy of any multiple of 16 bytes, where cp.async
// needs a thread per 16 bytes; consumers wait for the barrier's phase. Usage per phase:
// expect_bytes (once, the phase's total), the copies, then every consumer waits with the phase's
// parity (0, 1, 0, ...). Shared memory written through ordinary stores and later overwritten by
// a bulk copy needs fence_async_writes() by the writers before the barrier that precedes the copy.
#pragma once
#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace fathom::cuda {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The calling thread's arrival, announcing `bytes` of copies for the current phase.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// dst, src 16-byte aligned; bytes a multiple of 16.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Orders this thread's earlier shared-memory accesses before later bulk copies into them.
__device__ __forceinline__ void fence_async_writes() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace fathom::cuda
