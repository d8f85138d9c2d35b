// Helpers shared by the speculative-decoding tests: chi-square goodness of fit, and the exact
// joint distribution of the first three sampled tokens by teacher forcing on the CPU model.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/hybrid_model.h"
#include "runtime/generate.h"
#include "runtime/spec_sampling.h"

namespace fathom::testing {

// Upper 99.9% quantile of chi-square with k degrees of freedom (Wilson-Hilferty).
inline double chi2_999(int k) {
  const double z = 3.0902, a = 2.0 / (9.0 * k);
  return k * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Chi-square of observed counts against expected probabilities; cells expecting < 5 are pooled.
inline double chi_square(const std::vector<double>& p, const std::vector<int64_t>& counts, int64_t n, int* dof) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * double(n);
    if (e < 5) {
      pooled_e += e;
      pooled_o += double(counts[i]);
      EXPECT_FALSE(p[i] == 0 && counts[i] > 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  if (pooled_e >= 1) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  *dof = std::max(cells - 1, 1);
  return stat;
}

// P(t0, t1, t2) after `prompt` under sampling params `sp`, over every triple of nonzero
// probability; cell_of maps sampled tokens to their cell (-1: probability 0).
struct Joint3 {
  std::vector<std::array<int32_t, 3>> cells;
  std::vector<double> p;
  int64_t cell_of(const std::vector<int32_t>& t) const {
    if (t.size() < 3) return -1;
    for (size_t i = 0; i < cells.size(); ++i)
      if (cells[i][0] == t[0] && cells[i][1] == t[1] && cells[i][2] == t[2]) return int64_t(i);
    return -1;
  }
};

inline Joint3 exact_joint3(const HybridModel& m, const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  const int64_t V = m.config().vocab_size;
  auto dist_after = [&](const std::vector<int32_t>& seq) {
    SequenceState st = m.new_sequence();
    auto out = prefill(m, st, seq, 1 << 20, false);
    return target_distribution(out.logits.data(), V, sp);
  };
  Joint3 j;
  auto p0 = dist_after(prompt);
  for (int32_t a = 0; a < V; ++a) {
    if (p0[size_t(a)] == 0) continue;
    auto s1 = prompt;
    s1.push_back(a);
    auto p1 = dist_after(s1);
    for (int32_t b = 0; b < V; ++b) {
      if (p1[size_t(b)] == 0) continue;
      auto s2 = s1;
      s2.push_back(b);
      auto p2 = dist_after(s2);
      for (int32_t c = 0; c < V; ++c) {
        if (p2[size_t(c)] == 0) continue;
        j.cells.push_back({a, b, c});
        j.p.push_back(p0[size_t(a)] * p1[size_t(b)] * p2[size_t(c)]);
      }
    }
  }
  return j;
}

}  // namespace fathom::testing
