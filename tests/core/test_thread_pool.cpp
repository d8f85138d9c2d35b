#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace fathom {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

// Many short regions back to back: a worker that is late for one region must never take chunks
// of the next (each index of every region exactly once, and every region returns).
TEST(ThreadPool, BackToBackRegionsStayApart) {
  for (int round = 0; round < 5000; ++round) {
    const int64_t n = 1 + round % 37;
    std::vector<std::atomic<int>> hits(n);
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "round " << round << " index " << i;
  }
}

TEST(ThreadPool, NestedCallsRunSerially) {
  std::atomic<int64_t> sum{0};
  parallel_for(16, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, 1, [&](int64_t b2, int64_t e2) { sum += e2 - b2; });
  });
  EXPECT_EQ(sum.load(), 160);
}

TEST(ThreadPool, ExceptionsPropagate) {
  EXPECT_THROW(parallel_for(100, 1,
                            [&](int64_t b, int64_t) {
                              if (b == 0) throw std::runtime_error("boom");
                            }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int64_t> count{0};
  parallel_for(100, 1, [&](int64_t b, int64_t e) { count += e - b; });
  EXPECT_EQ(count.load(), 100);
}

}  // namespace
}  // namespace fathom
