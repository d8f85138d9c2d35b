// The key ranges of split-K decode attention, one rule for both split kernels (the tensor-core
// kernel in attention_decode.cu, the CUDA-core one in attention.cu), so that their partials
// cover the same keys and the combine merges either.
#pragma once
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

// Keys the tensor-core decode kernel loads at a time; ranges are whole tiles of them, so a
// range never ends in a tile holding a few keys (at a 4,097-key context, 64 ranges of 65 keys
// would each take two tiles).
inline constexpr int kSplitTileKeys = 64;

struct KeyRange {
  int begin, end;
};

// Range `split` of a token of n keys: ceil(n / splits) keys, at least min_keys, rounded up
// to whole tiles; the ranges past the token's keys are empty (begin == end == n).
__device__ __forceinline__ KeyRange split_key_range(int n, int split, int splits, int min_keys) {
  const int keys = max((n + splits - 1) / splits, min_keys);
  const int chunk = (keys + kSplitTileKeys - 1) / kSplitTileKeys * kSplitTileKeys;
  const int begin = min(n, split * chunk);
  return {begin, min(n, begin + chunk)};
}

}  // namespace fathom::cuda
