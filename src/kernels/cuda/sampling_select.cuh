// The device sampler's cut-offs (top-k, top-p): the largest key t whose tokens at or above it
// weigh at least a target, exactly as the CPU row sampler finds it (kernels/cpu/row_sampler.cpp).
// A bisection over keys reads the row once a bit of the key (~32 passes, a millisecond at 248K
// ids on one SM); by bins it reads the row twice: one pass weighs the bins of (m - x) * scale,
// the next keeps the keys of the one bin where the running weight from the top passes the
// target, and those, sorted in shared memory, give the answer.
#pragma once
#include "kernels/cuda/sampling_block.cuh"

namespace fathom::cuda::sampling_detail {

// Sum of weights (count: 1 each) of the tokens whose key is >= t.
template <bool kByMass>
__device__ unsigned long long mass_from(const float* l, int V, uint32_t t, Weights w, Shared& sh) {
  unsigned long long s = 0;
  for_each_logit(l, V, [&](int, float x) {
    if (order_key(x) >= t) s += kByMass ? w(x) : 1ull;
  });
  return block_sum_u64(s, sh);
}

// The largest key t in [lo, hi] whose tokens at or above it weigh at least `target` (lo when the
// tokens from lo up weigh less). Bisection over keys: exact, with no atomics.
template <bool kByMass>
__device__ uint32_t bisect_key(const float* l, int V, uint32_t lo, uint32_t hi, unsigned long long target, Weights w,
                               Shared& sh) {
  if (mass_from<kByMass>(l, V, hi, w, sh) >= target) return hi;
  if (mass_from<kByMass>(l, V, lo, w, sh) < target) return lo;
  uint32_t a = lo, b = hi - 1;  // W(a) >= target, W(b + 1) < target
  while (a < b) {
    const uint32_t mid = a + (b - a + 1) / 2;
    if (mass_from<kByMass>(l, V, mid, w, sh) >= target) a = mid;
    else b = mid - 1;
  }
  return a;
}

// The bins: kSelectBins - 1 of (m - x) * scale, the last one everything further down (and NaN).
// The bin never rises with x (each float operation rounds monotonically), so a bin is a run of
// keys and the bins above it hold only larger keys.
constexpr int kSelectBins = 256;
// Keys of one bin that fit shared memory; a fuller bin (many equal logits) falls back to bisection.
constexpr int kSelectCapacity = 8192;
// A bin's weight in 32-bit parts: a count, or a weight (<= 2^40) in limbs of 14, 14 and 13 bits,
// whose sums over kMaxVocab (2^18) ids still fit 32 bits. Shared-memory atomics are native at 32
// bits: three 32-bit adds an id measured twice as fast as one 64-bit add (docs/perf.md, stop 66).
constexpr int kLimbs = 3;
constexpr size_t kSelectBytes = kLimbs * kSelectBins * sizeof(uint32_t) + kSelectCapacity * sizeof(uint32_t);
// Bins by mass span the weights that are not 0 in fixed point (ln 2^40 = 27.7 temperatures); bins
// by count span 32 logits whatever the temperature (a top-k cut lies where the logits say).
constexpr float kMassSpan = 28.f, kCountSpan = 32.f;

// A weight added to bin b of the limbs ([kLimbs][kSelectBins]), and a bin's weight read back.
__device__ __forceinline__ void add_to_bin(uint32_t* limbs, int b, unsigned long long wi) {
  atomicAdd(&limbs[b], uint32_t(wi & 0x3fffu));
  if (const uint32_t mid = uint32_t(wi >> 14) & 0x3fffu) atomicAdd(&limbs[kSelectBins + b], mid);
  if (const uint32_t top = uint32_t(wi >> 28)) atomicAdd(&limbs[2 * kSelectBins + b], top);
}
__device__ __forceinline__ unsigned long long bin_weight(const uint32_t* limbs, int b) {
  return (static_cast<unsigned long long>(limbs[2 * kSelectBins + b]) << 28) +
         (static_cast<unsigned long long>(limbs[kSelectBins + b]) << 14) + limbs[b];
}

__device__ __forceinline__ int select_bin(float x, float m, float scale) {
  const float u = __fmul_rn(__fsub_rn(m, x), scale);  // no contraction: the two passes agree
  if (!(u < float(kSelectBins - 1))) return kSelectBins - 1;
  return u > 0.f ? int(u) : 0;
}

// Sorts keys[0, n) largest first (bitonic, over the next power of two: keys[n, p) must fit).
__device__ void sort_keys_descending(uint32_t* keys, int n) {
  int p = 1;
  while (p < n) p <<= 1;
  for (int i = n + int(threadIdx.x); i < p; i += kThreads) keys[i] = 0u;
  __syncthreads();
  for (int k = 2; k <= p; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < p; i += kThreads) {
        const int ij = i ^ j;
        if (ij > i) {
          const uint32_t a = keys[i], b = keys[ij];
          if (((i & k) == 0) == (a < b)) keys[i] = b, keys[ij] = a;
        }
      }
      __syncthreads();
    }
}

// bisect_key's answer, by bins. `space`: kSelectBytes of shared memory (the bins' limbs, then keys);
// null: by bisection (the reference form, for tests).
template <bool kByMass>
__device__ uint32_t select_key(const float* l, int V, uint32_t lo, uint32_t hi, unsigned long long target, Weights w,
                               Shared& sh, unsigned char* space) {
  if (!space) return bisect_key<kByMass>(l, V, lo, hi, target, w, sh);
  uint32_t* limbs = reinterpret_cast<uint32_t*>(space);  // [kLimbs][kSelectBins]
  uint32_t* keys = limbs + kLimbs * kSelectBins;
  const int tid = threadIdx.x;
  const float scale = float(kSelectBins - 1) / (kByMass ? kMassSpan / w.inv_t : kCountSpan);
  for (int b = tid; b < kLimbs * kSelectBins; b += kThreads) limbs[b] = 0;
  if (tid == 0) sh.kept = 0;
  __syncthreads();
  // 1. Each bin's weight (the deepest bin's summed apart: most of the vocabulary may sit there).
  unsigned long long deep = 0;
  for_each_logit(l, V, [&](int, float x) {
    const unsigned long long wi = kByMass ? w(x) : 1ull;
    if (wi == 0) return;
    const int b = select_bin(x, w.m, scale);
    if (b == kSelectBins - 1) deep += wi;
    else if (kByMass) add_to_bin(limbs, b, wi);
    else atomicAdd(&limbs[b], 1u);  // a count: the low limb alone
  });
  deep = block_sum_u64(deep, sh);  // its barriers also complete the bins
  const unsigned long long mine = tid < kSelectBins - 1 ? bin_weight(limbs, tid) : tid == kSelectBins - 1 ? deep : 0ull;
  unsigned long long all = 0;
  const unsigned long long above = block_exclusive_scan(mine, all, sh);
  if (all < target) return lo;
  if (mine > 0 && above < target && target <= above + mine) sh.bin = tid, sh.above = above;
  __syncthreads();
  const int bin = sh.bin;
  const unsigned long long above_bin = sh.above;
  // 2. The keys of that bin, a warp's at once (one atomic a warp and load: a full bin is one address).
  const int lane = tid % 32;
  auto keep = [&](bool in, float x) {
    const unsigned ballot = __ballot_sync(0xffffffffu, in);
    if (ballot == 0) return;
    int base = 0;
    if (lane == 0) base = atomicAdd(&sh.kept, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int at = base + __popc(ballot & ((1u << lane) - 1u));
    if (in && at < kSelectCapacity) keys[at] = order_key(x);
  };
  auto in_bin = [&](float x) { return select_bin(x, w.m, scale) == bin && (!kByMass || w(x) != 0); };
  if (reads_wide(l, V)) {  // as for_each_logit, warp by warp
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int c0 = tid - lane; c0 < V / 4; c0 += kThreads) {
      const int c = c0 + lane;
      const float4 a = c < V / 4 ? l4[c] : make_float4(0.f, 0.f, 0.f, 0.f);
      const bool ok = c < V / 4;
      keep(ok && in_bin(a.x), a.x), keep(ok && in_bin(a.y), a.y), keep(ok && in_bin(a.z), a.z),
          keep(ok && in_bin(a.w), a.w);
    }
  } else {
    for (int i0 = tid - lane; i0 < V; i0 += kThreads) {
      const int i = i0 + lane;
      const float x = i < V ? l[i] : 0.f;
      keep(i < V && in_bin(x), x);
    }
  }
  __syncthreads();
  const int n = sh.kept;
  if (n > kSelectCapacity) return bisect_key<kByMass>(l, V, lo, hi, target, w, sh);
  // 3. Largest first, the key where the running weight reaches the target (every token of an equal
  // key weighs the same, so the first token to reach it carries the answer).
  sort_keys_descending(keys, n);
  const int per = (n + kThreads - 1) / kThreads, b0 = min(n, tid * per), b1 = min(n, b0 + per);
  unsigned long long s = 0;
  for (int j = b0; j < b1; ++j) s += kByMass ? w(key_float(keys[j])) : 1ull;
  unsigned long long bin_weight = 0;
  unsigned long long acc = above_bin + block_exclusive_scan(s, bin_weight, sh);
  if (acc < target && target <= acc + s)
    for (int j = b0; j < b1; ++j) {
      acc += kByMass ? w(key_float(keys[j])) : 1ull;
      if (acc >= target) {
        sh.key = keys[j];
        break;
      }
    }
  __syncthreads();
  const uint32_t t = sh.key;
  return t < lo ? lo : t > hi ? hi : t;
}

}  // namespace fathom::cuda::sampling_detail
