// The host tier's pinned memory (model/cuda/host_snapshot_pool.h), past one registration: the
// pool pins its budget a GB at a time, and a copy may not span two registrations (a state piece
// that did made cudaMemcpy2DAsync fail with "invalid argument" in served runs, stop 62). Pieces of
// sizes that do not divide a GB are taken until the budget is used up; each must lie inside one
// registration, be written and read back by the copies the runner uses, and the budget must hold
// exactly as many as fit.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/cuda/host_snapshot_pool.h"

namespace fathom::cuda {
namespace {

TEST(CudaHostSnapshotPool, PiecesStayInsideOneRegistrationAndCopy) {
  constexpr int64_t kGB = int64_t(1) << 30;
  const int64_t page = 3 * 1000 * 1000 + 16 * 7, state = 70 * 1000 * 1000 + 16 * 3;  // neither divides a GB
  const int64_t budget = 2 * kGB + 5 * page;
  HostSnapshotPool pool;
  pool.configure(page, state, budget);
  ASSERT_GE(pool.pinned_bytes(), budget);
  std::vector<char*> pages;
  char* st = nullptr;
  int64_t taken = 0;
  int snapshots = 0;
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, size_t(state)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dev, 0x5a, size_t(state)), cudaSuccess);
  std::vector<std::pair<char*, int64_t>> pieces;
  while (pool.take(4, pages, st)) {
    ++snapshots;
    taken += 4 * page + state;
    pieces.emplace_back(st, state);
    for (char* p : pages) pieces.emplace_back(p, page);
    // The state piece as the runner copies it: rows of a 2D copy from the device.
    ASSERT_EQ(cudaMemcpy2DAsync(st, size_t(state / 16), dev, size_t(state / 16), size_t(state / 16), 16,
                                cudaMemcpyDeviceToHost, nullptr),
              cudaSuccess)
        << "snapshot " << snapshots;
    for (char* p : pages)
      ASSERT_EQ(cudaMemcpyAsync(p, dev, size_t(page), cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(taken, budget);
  // What is left cannot hold another snapshot, and each of the two registration ends wastes less
  // than one.
  EXPECT_GT(taken + 3 * (4 * page + state), budget) << snapshots << " snapshots";
  uintptr_t lo = UINTPTR_MAX;
  for (const auto& [p, n] : pieces) lo = std::min(lo, uintptr_t(p));
  for (const auto& [p, n] : pieces) {
    const uintptr_t off = uintptr_t(p) - lo;
    EXPECT_EQ(off / uintptr_t(kGB), (off + uintptr_t(n) - 1) / uintptr_t(kGB)) << "a piece spans two registrations";
    EXPECT_EQ(p[0], 0x5a);
    EXPECT_EQ(p[n - 1], 0x5a);
  }
  cudaFree(dev);
}

}  // namespace
}  // namespace fathom::cuda
