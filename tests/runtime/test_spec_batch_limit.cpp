// The automatic speculative batch limit (runtime/spec_batch_limit.h) on made-up step rates: it
// settles where drafting stops paying, probes above itself, and comes down when plain steps
// below it are faster.
#include <gtest/gtest.h>

#include "runtime/spec_batch_limit.h"

namespace fathom {
namespace {

// A model whose speculative steps emit `gain` times the plain rate at batches below `pays_below`,
// and 0.8 times it from there on; steps follow the engine's rule: speculative below the limit,
// plain from it (the batch stays at `batch`). Returns the speculative steps.
int run(SpecBatchLimit& lim, int batch, int pays_below, int steps) {
  int speculative = 0;
  for (int i = 0; i < steps; ++i) {
    const bool spec = batch < lim.limit();
    const double plain_tok_s = 1000.0 * batch;
    const double rate = spec ? plain_tok_s * (batch < pays_below ? 1.4 : 0.8) : plain_tok_s;
    lim.record(spec, batch, double(batch), double(batch) / rate);
    speculative += spec;
  }
  return speculative;
}

TEST(SpecBatchLimit, StartsAtTwoAndStaysWhereDraftingStopsPaying) {
  SpecBatchLimit lim;
  EXPECT_EQ(lim.limit(), 2);
  run(lim, 1, /*pays_below=*/2, 200);  // alone: speculative, measured faster than... nothing to compare
  EXPECT_EQ(lim.limit(), 2);
  run(lim, 2, 2, 20000);                // at the limit: plain, probes find speculation slower
  EXPECT_EQ(lim.settled(), 2);
}

TEST(SpecBatchLimit, ProbesUpWhileDraftingPays) {
  SpecBatchLimit lim;
  for (int b = 2; b <= 8; ++b) run(lim, b, /*pays_below=*/6, 20000);
  // Drafting pays below 6: the probes raised the limit to 6, where they found it slower.
  EXPECT_EQ(lim.settled(), 6);
  // A steady batch of 16 where drafting pays: a probe there lifts the limit above it at once.
  SpecBatchLimit steady;
  run(steady, 16, /*pays_below=*/32, 5000);
  EXPECT_EQ(steady.settled(), 17);
  // ... and where it does not, the limit stays (only probe windows open).
  SpecBatchLimit busy;
  run(busy, 16, 2, 5000);
  EXPECT_EQ(busy.settled(), 2);
}

// Probes that move nothing come less often (each runs its steps one at a time): at a steady
// batch of 16 where drafting does not pay, 100,000 steps hold probes after 4,096, 8,192, 16,384
// and 32,768 plain steps (4 x 16 speculative steps), not 24. Once drafting pays there, probes at
// most 65,536 plain steps apart find it (the second: the first one's steps still carry the
// decayed slow ones) and lift the limit.
TEST(SpecBatchLimit, ProbesThatMoveNothingBackOff) {
  using L = SpecBatchLimit;
  SpecBatchLimit busy;
  EXPECT_EQ(run(busy, 16, /*pays_below=*/2, 100000), 4 * L::kProbeSteps);
  EXPECT_EQ(busy.settled(), 2);
  run(busy, 16, /*pays_below=*/32, 2 * (L::kProbeEveryMax + L::kProbeSteps));
  EXPECT_EQ(busy.settled(), 17);
}

TEST(SpecBatchLimit, ComesDownWhenPlainIsFasterBelow) {
  SpecBatchLimit lim;
  for (int b = 2; b <= 8; ++b) run(lim, b, 6, 20000);
  ASSERT_EQ(lim.settled(), 6);
  // The model changes (say, longer contexts): drafting no longer pays at 5. Plain steps at 5
  // happen when nobody can draft; they are measured faster and the limit comes down.
  for (int i = 0; i < 200; ++i) {
    lim.record(false, 5, 5, 5 / 5000.0);
    lim.record(true, 5, 5, 5 / 3000.0);
  }
  EXPECT_EQ(lim.settled(), 5);
}

TEST(SpecBatchLimit, IgnoresEmptyMeasurements) {
  SpecBatchLimit lim;
  for (int i = 0; i < 100; ++i) {
    lim.record(true, 2, 0, 1.0);
    lim.record(false, 2, 2, 0.0);
    lim.record(true, 0, 1, 1.0);
  }
  EXPECT_EQ(lim.limit(), 2);
}

}  // namespace
}  // namespace fathom
