// The one-shot exchange kernel of PeerCommunicator (peer_communicator.h has the protocol).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/one_shot.h"

namespace fathom::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(v), "l"(p) : "memory");
}

// gather: out = [rank 0's in | rank 1's | ...]; else out = sum over ranks of in, in rank order.
__global__ void one_shot_kernel(OneShotArgs a, const float* in, float* out, size_t count, bool gather) {
  const int b = blockIdx.x;
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = ++a.counter[b];
  __syncthreads();
  const uint32_t e = epoch_s;
  const size_t per = (count + gridDim.x - 1) / gridDim.x;
  const size_t c0 = size_t(b) * per < count ? size_t(b) * per : count;
  const size_t c1 = c0 + per < count ? c0 + per : count;
  float* mine = a.bufs[a.rank][e & 1];
  for (size_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) mine[i] = in[i];
  __syncthreads();
  if (int(threadIdx.x) < a.n) {
    __threadfence_system();
    store_release(a.flags[threadIdx.x] + b * kOneShotMaxRanks + a.rank, e);
    const uint32_t* f = a.flags[a.rank] + b * kOneShotMaxRanks + threadIdx.x;
    uint64_t spins = 0;
    while (load_acquire(f) < e)
      if (++spins > (uint64_t(1) << 26)) __trap();  // a peer that never comes (seconds): fail, do not hang
  }
  __syncthreads();
  if (gather) {
    for (int r = 0; r < a.n; ++r) {
      const float* src = a.bufs[r][e & 1];
      for (size_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) out[size_t(r) * count + i] = src[i];
    }
  } else {
    for (size_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
      float acc = a.bufs[0][e & 1][i];
      for (int r = 1; r < a.n; ++r) acc += a.bufs[r][e & 1][i];
      out[i] = acc;
    }
  }
}

}  // namespace

void one_shot_exchange(const OneShotArgs& a, const float* in, float* out, size_t count, bool gather, cudaStream_t s) {
  // Every rank launches every block (a block's chunk may be empty): the per-block counters and
  // flags must advance together on all ranks. A plain launch: no programmatic dependent launch
  // may let it start before the step's previous kernel has written `in`.
  one_shot_kernel<<<kOneShotBlocks, kThreads, 0, s>>>(a, in, out, count, gather);
  FATHOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fathom::cuda
