#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/sampler.h"

namespace fathom {
namespace {

TEST(Sampler, GreedyTakesFirstMaximum) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 1);
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  std::vector<float> logits = {0.5f, 0.1f, 3.0f, 2.9f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits.data(), 4), 2);
}

TEST(Sampler, SeedReproducible) {
  std::vector<float> logits = {0.0f, 0.3f, 0.2f, 0.1f, -0.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits.data(), 5), b.sample(logits.data(), 5));
}

// Sampled frequencies follow softmax(logits / T): chi-square over 20,000 draws (fixed seed, so
// deterministic), against the 99.9% quantile for 3 degrees of freedom (16.27).
TEST(Sampler, FrequenciesFollowSoftmax) {
  std::vector<float> logits = {1.0f, 0.0f, -0.5f, 0.7f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 42;
  Sampler s(p);
  const int n = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) counts[s.sample(logits.data(), 4)]++;
  double z = 0;
  std::vector<double> prob(4);
  for (int i = 0; i < 4; ++i) z += prob[i] = std::exp(logits[i] / p.temperature);
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    double e = n * prob[i] / z;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  // probabilities ~ [0.64, 0.24, 0.09, 0.03]; top_p 0.5 keeps only the first.
  std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits.data(), 4), 0);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  std::vector<float> logits = {5.0f, 4.9f, -5.0f, -6.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.1f;
  p.seed = 9;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.sample(logits.data(), 4), 2);
}

// OpenAI's logit bias is added to the logits before selection, after the penalties.
TEST(Sampler, LogitBiasShiftsTheChoice) {
  std::vector<float> logits = {0.5f, 3.0f, 1.0f, -2.0f};
  SamplingParams p;
  p.logit_bias = {{3, 100.f}};
  Sampler s(p);
  EXPECT_TRUE(s.adjusts_logits());
  EXPECT_EQ(s.sample(logits.data(), 4, {}, {}), 3);
  p.logit_bias = {{1, -100.f}};
  EXPECT_EQ(Sampler(p).sample(logits.data(), 4, {}, {}), 2);
  std::vector<float> adjusted = logits;
  p.logit_bias = {{0, 1.5f}, {7, 5.f}};  // an id past the vocabulary changes nothing
  apply_logit_adjustments(adjusted.data(), 4, p, {}, {});
  EXPECT_FLOAT_EQ(adjusted[0], 2.0f);
  EXPECT_FLOAT_EQ(adjusted[1], 3.0f);
  EXPECT_FALSE(Sampler(SamplingParams{}).adjusts_logits());
}

}  // namespace
}  // namespace fathom
