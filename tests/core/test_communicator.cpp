// The in-process communicator (core/communicator.h): ranks as threads. Collectives give the sums
// and gathers a direct computation gives, bit-identical on every rank; an abort, or ranks that
// disagree about a call, end every rank's wait with CommunicatorAborted instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/communicator.h"

namespace fathom {
namespace {

// Runs fn(rank communicator) on `n` threads; returns how many threads threw CommunicatorAborted.
template <class Fn>
int run_ranks(LocalGroup& g, Fn fn) {
  std::atomic<int> aborted{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < g.size(); ++r)
    ts.emplace_back([&, r] {
      auto c = g.rank(r);
      try {
        fn(*c);
      } catch (const CommunicatorAborted&) {
        ++aborted;
      }
    });
  for (auto& t : ts) t.join();
  return aborted.load();
}

std::vector<float> data_of(int rank, size_t n, int round) {
  std::mt19937 g(uint32_t(1000 * rank + round));
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(LocalGroup, CollectivesMatchDirectComputation) {
  for (int n : {1, 2, 4, 8}) {
    LocalGroup g(n);
    const size_t len = 1000;
    std::vector<std::vector<float>> reduced(static_cast<size_t>(n)), gathered(static_cast<size_t>(n)),
        scattered(static_cast<size_t>(n));
    const int rounds = 5;  // back-to-back collectives reuse the rendezvous
    run_ranks(g, [&](Communicator& c) {
      for (int round = 0; round < rounds; ++round) {
        std::vector<float> v = data_of(c.rank(), len, round);
        c.all_reduce_sum(v);
        std::vector<float> all(len * size_t(n));
        c.all_gather(data_of(c.rank(), len, round), all);
        std::vector<float> mine(250);
        std::vector<float> big = data_of(c.rank(), 250 * size_t(n), round + 100);
        c.reduce_scatter_sum(big, mine);
        c.barrier();
        if (round == rounds - 1) {
          reduced[size_t(c.rank())] = v;
          gathered[size_t(c.rank())] = all;
          scattered[size_t(c.rank())] = mine;
        }
      }
    });
    const int round = rounds - 1;
    std::vector<float> want(len, 0.f);
    for (int k = 0; k < n; ++k) {  // in rank order, as the group sums
      const std::vector<float> v = data_of(k, len, round);
      for (size_t i = 0; i < len; ++i) want[i] += v[i];
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(reduced[size_t(r)], want) << "n=" << n << " rank " << r;  // bit-identical on every rank
      for (int k = 0; k < n; ++k) {
        const std::vector<float> v = data_of(k, len, round);
        EXPECT_TRUE(std::equal(v.begin(), v.end(), gathered[size_t(r)].begin() + ptrdiff_t(k * len))) << n;
      }
      std::vector<float> slice(250, 0.f);
      for (int k = 0; k < n; ++k) {
        const std::vector<float> big = data_of(k, 250 * size_t(n), round + 100);
        for (size_t i = 0; i < 250; ++i) slice[i] += big[size_t(r) * 250 + i];
      }
      EXPECT_EQ(scattered[size_t(r)], slice) << "n=" << n << " rank " << r;
    }
  }
}

TEST(LocalGroup, AbortEndsEveryWaitingRank) {
  LocalGroup g(4);
  const int aborted = run_ranks(g, [&](Communicator& c) {
    if (c.rank() == 2) {
      c.abort("an error in rank 2");
      throw CommunicatorAborted("rank 2 gave up");
    }
    std::vector<float> v(8, 1.f);
    c.all_reduce_sum(v);  // ranks 0, 1, 3 would wait for rank 2 for ever
  });
  EXPECT_EQ(aborted, 4);
  try {
    std::vector<float> v(1);
    g.rank(0)->all_reduce_sum(v);
    FAIL() << "a collective after the abort returned";
  } catch (const CommunicatorAborted& e) {
    EXPECT_NE(std::string(e.what()).find("an error in rank 2"), std::string::npos) << e.what();
  }
}

TEST(LocalGroup, DisagreeingCallsAbortInsteadOfHanging) {
  LocalGroup g(3);
  const int aborted = run_ranks(g, [&](Communicator& c) {
    std::vector<float> v(c.rank() == 1 ? 5 : 4, 1.f);  // rank 1 passes another length
    c.all_reduce_sum(v);
  });
  EXPECT_GE(aborted, 1);
  EXPECT_THROW(LocalGroup(0), Error);
}

}  // namespace
}  // namespace fathom
