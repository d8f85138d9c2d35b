// The CPU row sampler (kernels/cpu/row_sampler.h) against the CPU Sampler's definitions
// (runtime/sampler.h): greedy rows pick the argmax, sampled rows draw only the Sampler's
// candidates with their probabilities (chi-square over many draws, fixed seeds), a draft is
// accepted with probability p(draft) and the emitted tokens keep p (rejection sampling is
// lossless), logprobs come from the raw row, adjustments and masks take effect, and a draw is a
// function of (seed, draw) alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "kernels/cpu/row_sampler.h"
#include "runtime/sampler.h"

namespace fathom {
namespace {

std::vector<float> random_row(int V, uint32_t seed, float scale = 2.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, scale);
  std::vector<float> row(static_cast<size_t>(V));
  for (float& x : row) x = n(g);
  return row;
}

RowSample sample_one(std::vector<float> row, const RowSampling& p, std::vector<LogitAdjustment> adjust = {},
                     const uint32_t* mask = nullptr) {
  RowSample out;
  std::vector<int32_t> ids(kMaxTopLogprobs, -1);
  std::vector<float> lp(kMaxTopLogprobs, 0.f);
  cpu::sample_rows(row.data(), 1, int64_t(row.size()), &p, adjust.data(), &out, ids.data(), lp.data(), mask);
  return out;
}

// Chi-square upper quantile at probability ~1e-6 (Wilson-Hilferty): a correct sampler fails it
// once in a million seeds; these seeds are fixed, so the outcome is too.
double chi_square_bound(int df) {
  const double z = 4.75, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic of `counts` against probabilities `p` (by token id) over `n` draws; bins
// expecting fewer than 5 are pooled. Fails when a token outside p's support was drawn.
void expect_distribution(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& p, int n,
                         const std::string& what) {
  for (const auto& [t, c] : counts) ASSERT_TRUE(p.count(t)) << what << ": drew token " << t << " outside the kept set";
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (const auto& [t, pt] : p) {
    const double e = n * pt;
    const double o = counts.count(t) ? counts.at(t) : 0;
    if (e < 5) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pooled_e >= 5) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++bins;
  ASSERT_GE(bins, 2) << what;
  EXPECT_LT(stat, chi_square_bound(bins - 1)) << what << ": chi-square " << stat << " over " << bins << " bins";
}

std::map<int32_t, double> candidates(const std::vector<float>& row, const RowSampling& r) {
  SamplingParams sp;
  sp.temperature = r.temperature, sp.top_k = r.top_k, sp.top_p = r.top_p, sp.min_p = r.min_p;
  const SamplingCandidates c = sampling_candidates(row.data(), int64_t(row.size()), sp);
  std::map<int32_t, double> p;
  for (size_t i = 0; i < c.ids.size(); ++i) p[c.ids[i]] = c.probs[i];
  return p;
}

TEST(RowSampler, GreedyTakesTheArgmaxTiesToTheLowestId) {
  std::vector<float> row = random_row(50, 1);
  row[7] = row[31] = 9.f;
  RowSampling p;
  EXPECT_EQ(sample_one(row, p).token, 7);
  p.draft = 7;
  EXPECT_EQ(sample_one(row, p).accepted, 1);
  p.draft = 31;
  const RowSample s = sample_one(row, p);
  EXPECT_EQ(s.token, 7);
  EXPECT_EQ(s.accepted, 0);
}

TEST(RowSampler, DrawsTheCpuSamplersCandidatesWithTheirProbabilities) {
  struct Cut {
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const Cut cuts[] = {{1.f, 0, 1.f, 0.f}, {0.7f, 12, 1.f, 0.f}, {1.3f, 0, 0.8f, 0.f},
                      {0.9f, 20, 0.9f, 0.05f}, {0.5f, 0, 1.f, 0.1f}, {2.f, 5, 0.95f, 0.f}};
  const int V = 64, N = 20000;
  for (size_t c = 0; c < std::size(cuts); ++c) {
    const std::vector<float> row = random_row(V, 100 + uint32_t(c));
    RowSampling p;
    p.temperature = cuts[c].temperature, p.top_k = cuts[c].top_k, p.top_p = cuts[c].top_p, p.min_p = cuts[c].min_p;
    p.seed = 1234 + c;
    std::map<int32_t, int> counts;
    for (int d = 0; d < N; ++d) {
      p.draw = uint64_t(d);
      ++counts[sample_one(row, p).token];
    }
    expect_distribution(counts, candidates(row, p), N, "cut " + std::to_string(c));
  }
}

TEST(RowSampler, RejectionSamplingOfADraftKeepsTheTargetDistribution) {
  const int V = 48, N = 40000;
  const std::vector<float> row = random_row(V, 7, 1.5f);
  RowSampling p;
  p.temperature = 0.8f, p.top_k = 16, p.seed = 99;
  const std::map<int32_t, double> target = candidates(row, p);
  // Drafts: the most likely token, a middling one, and one outside the kept set.
  std::vector<std::pair<int32_t, double>> by_p(target.begin(), target.end());
  std::sort(by_p.begin(), by_p.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  int32_t outside = 0;
  while (target.count(outside)) ++outside;
  for (const int32_t draft : {by_p[0].first, by_p[by_p.size() / 2].first, outside}) {
    p.draft = draft;
    std::map<int32_t, int> counts;
    int accepted = 0;
    for (int d = 0; d < N; ++d) {
      p.draw = uint64_t(d);
      const RowSample s = sample_one(row, p);
      ++counts[s.token];
      if (s.accepted) {
        ++accepted;
        EXPECT_EQ(s.token, draft);
      } else {
        EXPECT_NE(s.token, draft);
      }
    }
    const double pd = target.count(draft) ? target.at(draft) : 0.0;
    const double sd = std::sqrt(N * pd * (1 - pd)) + 1e-9;
    EXPECT_LT(std::abs(accepted - N * pd), 5 * sd + 0.5) << "draft " << draft << ": accepted " << accepted
                                                         << " of " << N << ", p(draft) " << pd;
    expect_distribution(counts, target, N, "draft " + std::to_string(draft));
  }
}

// Drafts drawn from a distribution q (RowSampling::q_out, the MTP layer's row sampled with the
// request's parameters) and verified against p with min(1, p / q) and the residual max(p - q, 0)
// (RowSampling::draft_q): the emitted tokens follow p whatever q is, the drafts follow q (their
// own random numbers, j = 2), q is written as the CPU Sampler's candidates, and a draft is
// accepted at the rate sum min(p, q). q: another row, a sharper one, p itself (accepted always),
// and a greedy row (one-hot: the deterministic rule, token for token).
TEST(RowSampler, DraftsDrawnFromQKeepTheTargetDistribution) {
  const int V = 48, N = 40000;
  const std::vector<float> row = random_row(V, 7, 1.5f);
  RowSampling p;
  p.temperature = 0.8f, p.top_k = 16, p.seed = 99;
  const std::map<int32_t, double> target = candidates(row, p);
  struct Draft {
    const char* name;
    std::vector<float> row;
    float temperature;
    float top_p;
  };
  const Draft drafts[] = {{"another row", random_row(V, 8, 1.5f), 1.f, 0.9f},
                          {"a sharper row", random_row(V, 9, 2.5f), 0.7f, 1.f},
                          {"p itself", row, 0.8f, 1.f},
                          {"greedy", random_row(V, 10, 1.5f), 0.f, 1.f}};
  for (const Draft& dr : drafts) {
    RowSampling pq;
    pq.temperature = dr.temperature, pq.top_p = dr.top_p, pq.seed = p.seed, pq.q_out = 0;
    if (&dr == &drafts[2]) pq.top_k = p.top_k;
    std::map<int32_t, double> q_ref;  // greedy: one-hot at the argmax
    if (dr.temperature > 0.f) q_ref = candidates(dr.row, pq);
    else q_ref[int32_t(std::max_element(dr.row.begin(), dr.row.end()) - dr.row.begin())] = 1.0;
    double overlap = 0;  // sum min(p, q)
    for (const auto& [t, qt] : q_ref) overlap += std::min(qt, target.count(t) ? target.at(t) : 0.0);
    std::vector<float> q(static_cast<size_t>(V));
    std::map<int32_t, int> counts, draft_counts;
    int accepted = 0;
    for (int d = 0; d < N; ++d) {
      pq.draw = p.draw = uint64_t(d);
      std::vector<float> qrow = dr.row;
      RowSample ds;
      cpu::sample_rows(qrow.data(), 1, V, &pq, nullptr, &ds, nullptr, nullptr, nullptr, q.data());
      ++draft_counts[ds.token];
      if (d == 0)
        for (int32_t t = 0; t < V; ++t)
          ASSERT_NEAR(q[size_t(t)], q_ref.count(t) ? q_ref.at(t) : 0.0, 1e-5) << dr.name << " token " << t;
      p.draft = ds.token, p.draft_q = 0;
      std::vector<float> prow = row;
      RowSample s;
      cpu::sample_rows(prow.data(), 1, V, &p, nullptr, &s, nullptr, nullptr, nullptr, q.data());
      ++counts[s.token];
      if (s.accepted) {
        ++accepted;
        ASSERT_EQ(s.token, ds.token) << dr.name;
      } else {
        ASSERT_NE(s.token, ds.token) << dr.name;
      }
      if (dr.temperature == 0.f) {  // one-hot q: the deterministic rule, token for token
        RowSampling det = p;
        det.draft_q = -1;
        ASSERT_EQ(sample_one(row, det).token, s.token) << "draw " << d;
      }
    }
    if (dr.temperature > 0.f) expect_distribution(draft_counts, q_ref, N, std::string(dr.name) + ": drafts");
    expect_distribution(counts, target, N, dr.name);
    const double sd = std::sqrt(N * overlap * (1 - overlap)) + 1e-9;
    EXPECT_LT(std::abs(accepted - N * overlap), 5 * sd + 0.5)
        << dr.name << ": accepted " << accepted << " of " << N << ", sum min(p, q) " << overlap;
  }
}

// A row that draws a draft and one that verifies a sampled draft need the draft distributions.
TEST(RowSampler, SampledDraftRowsWithoutDistributionsAreRefused) {
  std::vector<float> row = random_row(16, 3);
  RowSampling p;
  p.temperature = 1.f, p.q_out = 0;
  RowSample s;
  EXPECT_THROW(cpu::sample_rows(row.data(), 1, 16, &p, nullptr, &s, nullptr, nullptr), std::exception);
  p.q_out = -1, p.draft = 2, p.draft_q = 0;
  EXPECT_THROW(cpu::sample_rows(row.data(), 1, 16, &p, nullptr, &s, nullptr, nullptr), std::exception);
}

TEST(RowSampler, ADrawDependsOnSeedAndDrawAlone) {
  const int V = 300;
  const std::vector<float> a = random_row(V, 3), b = random_row(V, 4);
  std::vector<RowSampling> params(3);
  for (RowSampling& p : params) p.temperature = 1.f, p.top_p = 0.95f, p.seed = 5, p.draw = 17;
  params[1].seed = 6;  // another request between them
  std::vector<float> rows = a;
  rows.insert(rows.end(), b.begin(), b.end());
  rows.insert(rows.end(), a.begin(), a.end());
  std::vector<RowSample> out(3);
  cpu::sample_rows(rows.data(), 3, V, params.data(), nullptr, out.data(), nullptr, nullptr);
  EXPECT_EQ(out[0].token, out[2].token);
  EXPECT_EQ(out[0].token, sample_one(a, params[0]).token);
  int differ = 0;  // other draws of the same row move
  for (uint64_t d = 0; d < 20; ++d) {
    RowSampling p = params[0];
    p.draw = d;
    differ += sample_one(a, p).token != out[0].token;
  }
  EXPECT_GT(differ, 0);
}

TEST(RowSampler, LogprobsComeFromTheRawRow) {
  const int V = 200;
  const std::vector<float> row = random_row(V, 21);
  RowSampling p;
  p.temperature = 0.9f, p.seed = 3, p.logprobs = 5;
  std::vector<LogitAdjustment> adjust(1);
  adjust[0].token = 17, adjust[0].bias = 30.f;  // chosen for sure, reported with its raw logprob
  p.adjust_end = 1;
  RowSample out;
  std::vector<int32_t> ids(kMaxTopLogprobs, -1);
  std::vector<float> lp(kMaxTopLogprobs, 0.f);
  std::vector<float> work = row;
  cpu::sample_rows(work.data(), 1, V, &p, adjust.data(), &out, ids.data(), lp.data());
  EXPECT_EQ(out.token, 17);
  EXPECT_EQ(adjust[0].raw, row[17]);
  const TokenLogprobs ref = compute_logprobs(row.data(), V, 17, 5);
  EXPECT_NEAR(out.logprob, ref.logprob, 1e-5);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(ids[size_t(k)], ref.top[size_t(k)].first);
    EXPECT_NEAR(lp[size_t(k)], ref.top[size_t(k)].second, 1e-5);
  }
  EXPECT_EQ(ids[5], -1);  // only the k asked for
}

TEST(RowSampler, AdjustmentsAndMasksTakeEffect) {
  const int V = 70;
  std::vector<float> row = random_row(V, 8);
  const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  // min_tokens masking of the argmax: greedy takes the next one, sampling never draws it.
  std::vector<LogitAdjustment> adjust(1);
  adjust[0].token = best, adjust[0].mask = 1;
  RowSampling p;
  p.adjust_end = 1;
  std::vector<float> masked = row;
  masked[size_t(best)] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(sample_one(row, p, adjust).token, int32_t(std::max_element(masked.begin(), masked.end()) - masked.begin()));
  p.temperature = 1.f, p.seed = 1;
  for (uint64_t d = 0; d < 500; ++d) {
    p.draw = d;
    ASSERT_NE(sample_one(row, p, adjust).token, best);
  }
  // A grammar mask allowing three tokens: only they are drawn.
  std::vector<uint32_t> mask(size_t(mask_words(V)), 0u);
  for (int t : {3, 40, 69}) mask[size_t(t) / 32] |= 1u << (t % 32);
  RowSampling g;
  g.temperature = 1.5f, g.mask_row = 0, g.seed = 2;
  std::map<int32_t, int> seen;
  for (uint64_t d = 0; d < 300; ++d) {
    g.draw = d;
    ++seen[sample_one(row, g, {}, mask.data()).token];
  }
  for (const auto& [t, c] : seen) EXPECT_TRUE(t == 3 || t == 40 || t == 69) << t;
  EXPECT_EQ(seen.size(), 3u);
  // Skipped rows are left alone.
  RowSampling skip;
  skip.skip = 1;
  EXPECT_EQ(sample_one(row, skip).token, -1);
}

}  // namespace
}  // namespace fathom
