// The device sampler's block-wide building blocks (sampling.cu, sampling_select.cuh): one block of
// kThreads a row; order-preserving keys of floats, the seeded uniform draws, and reductions and
// scans over the block that are exact in any order (maxima and integer sums).
#pragma once
#include <cfloat>
#include <climits>
#include <cstdint>

namespace fathom::cuda::sampling_detail {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Probabilities relative to the row's largest one, as fixed-point integers: sums are then exact and
// independent of the order of addition, so a seeded draw gives the same token on every run.
constexpr float kFixedOne = 1099511627776.f;  // 2^40; up to 2^18 tokens of weight <= 1 fit 64 bits

// Order-preserving map of floats to unsigned keys (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) from (seed, draw, j) alone.
__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t draw, int j) {
  const uint64_t z = splitmix(seed ^ splitmix(draw * 4 + uint64_t(j)));
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The float whose order_key is k.
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// (value, index) as one key whose maximum is the largest value, ties to the lowest index.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  return (static_cast<unsigned long long>(order_key(v)) << 32) | static_cast<uint32_t>(~i);
}

__device__ __forceinline__ float key_value(unsigned long long k) { return key_float(uint32_t(k >> 32)); }
__device__ __forceinline__ int key_index(unsigned long long k) { return int(~uint32_t(k)); }

static_assert(kWarps == 32, "the block reductions combine one warp's value a lane");

struct Shared {
  unsigned long long warp[kWarps];
  unsigned long long result;
  float f[kWarps];
  int token;
  int group;                          // the group the draw lands in (-1: none)
  unsigned long long offset;          // the draw's offset inside it
  unsigned long long gsum[kThreads];  // the groups' weights
  int bin, kept;                      // key selection: the answer's bin, the keys compacted
  unsigned long long above;           // the weight of the bins above it
  uint32_t key;                       // the key selected
};

// Block-wide reductions: each warp reduces, lane 0 posts, warp 0 combines the posts (a lane
// each) and posts the result, everyone reads it; the barrier at the end keeps the next
// reduction's writes away from this one's readers. Max and integer sums: exact in any order.
template <class Op>
__device__ unsigned long long block_reduce_u64(unsigned long long x, Op op, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffff, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned long long r = sh.warp[lane];
    for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffff, r, o));
    if (lane == 0) sh.result = r;
  }
  __syncthreads();
  const unsigned long long r = sh.result;
  __syncthreads();
  return r;
}

struct MaxOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};
struct SumOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a + b; }
};

// Largest (value, lowest index) over the block; every thread gets it.
__device__ void block_argmax(float& v, int& idx, Shared& sh) {
  const unsigned long long k = block_reduce_u64(idx == INT_MAX ? 0ull : argmax_key(v, idx), MaxOp{}, sh);
  if (k == 0) {
    v = -INFINITY, idx = INT_MAX;
  } else {
    v = key_value(k), idx = key_index(k);
  }
}

__device__ unsigned long long block_sum_u64(unsigned long long x, Shared& sh) { return block_reduce_u64(x, SumOp{}, sh); }

__device__ float block_sum(float x, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.f[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = 0;
    for (int w = 0; w < kWarps; ++w) r += sh.f[w];
    sh.f[0] = r;
  }
  __syncthreads();
  const float r = sh.f[0];
  __syncthreads();
  return r;
}

// Inclusive prefix sum over a warp's lanes in order.
__device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long x, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffff, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive prefix sum over the threads in order; `total` gets the sum. Warp 0 scans the warps'
// sums (a lane each) into the prefix each warp adds.
__device__ unsigned long long block_exclusive_scan(unsigned long long x, unsigned long long& total, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned long long inc = warp_inclusive_scan(x, lane);
  if (lane == 31) sh.warp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const unsigned long long w_inc = warp_inclusive_scan(sh.warp[lane], lane);
    __syncwarp();
    sh.warp[lane] = w_inc;  // the sum of warps 0 .. lane
  }
  __syncthreads();
  const unsigned long long before = warp > 0 ? sh.warp[warp - 1] : 0ull;
  total = sh.warp[kWarps - 1];
  __syncthreads();
  return before + inc - x;
}

// Rows read 16 bytes a load (a multiple of 4 ids, aligned to 16 bytes): one block reading a row
// not staged in shared memory is bound by the loads it keeps in flight, not by bandwidth.
__device__ __forceinline__ bool reads_wide(const float* l, int V) {
  return (V & 3) == 0 && (reinterpret_cast<uintptr_t>(l) & 15) == 0;
}

// Calls f(i, l[i]) for this thread's share of the row's ids, in no set order; reads_wide rows two
// 16-byte loads a thread at once.
template <class F>
__device__ __forceinline__ void for_each_logit(const float* l, int V, F f) {
  if (reads_wide(l, V)) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    const int n4 = V / 4;
    int c = threadIdx.x;
    for (; c + kThreads < n4; c += 2 * kThreads) {
      const float4 a = l4[c], b = l4[c + kThreads];
      const int i = 4 * c, j = 4 * (c + kThreads);
      f(i, a.x), f(i + 1, a.y), f(i + 2, a.z), f(i + 3, a.w);
      f(j, b.x), f(j + 1, b.y), f(j + 2, b.z), f(j + 3, b.w);
    }
    if (c < n4) {
      const float4 a = l4[c];
      const int i = 4 * c;
      f(i, a.x), f(i + 1, a.y), f(i + 2, a.z), f(i + 3, a.w);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += kThreads) f(i, l[i]);
  }
}

struct Weights {
  float m, inv_t;
  __device__ unsigned long long operator()(float x) const {
    return static_cast<unsigned long long>(__expf((x - m) * inv_t) * kFixedOne);
  }
};

}  // namespace fathom::cuda::sampling_detail
