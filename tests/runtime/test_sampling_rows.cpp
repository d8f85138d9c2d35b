// The device sampler's rows as the engine builds them (runtime/sampling_rows.h): applying a row's
// adjustments as core/row_sampling.h defines them gives the CPU sampler's adjusted logits
// (runtime/sampler.h: penalties and bias; the engine's min_tokens masking), for rows that verify
// drafts too (the drafts before a row count as output).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/sampling_rows.h"

namespace fathom {
namespace {

// The kernel's arithmetic on one row (kernels/cuda/sampling.cu, step 2).
void apply(std::vector<float>& row, const std::vector<LogitAdjustment>& all, const RowSampling& rs) {
  for (int32_t a = rs.adjust_begin; a < rs.adjust_end; ++a) {
    const LogitAdjustment& e = all[size_t(a)];
    float x = row[size_t(e.token)];
    if (e.rep != 1.f) x = x > 0 ? x / e.rep : x * e.rep;
    x -= e.sub;
    x += e.bias;
    if (e.mask) x = -std::numeric_limits<float>::infinity();
    row[size_t(e.token)] = x;
  }
}

TEST(SamplingRows, AdjustmentsEqualTheCpuSampler) {
  const int V = 64;
  std::mt19937 g(11);
  std::normal_distribution<float> n(0.f, 2.f);
  std::vector<float> logits(V);
  for (float& x : logits) x = n(g);

  RequestSpec spec;
  spec.prompt = {3, 5, 5, 9, 40};
  spec.params.sampling.temperature = 0.7f;
  spec.params.sampling.top_k = 12;
  spec.params.sampling.top_p = 0.9f;
  spec.params.sampling.min_p = 0.05f;
  spec.params.sampling.seed = 77;
  spec.params.sampling.repetition_penalty = 1.3f;
  spec.params.sampling.presence_penalty = 0.4f;
  spec.params.sampling.frequency_penalty = 0.25f;
  spec.params.sampling.logit_bias = {{7, 2.f}, {5, -1.f}, {V + 3, 9.f}};  // the last is outside the vocabulary
  spec.params.min_tokens = 5;
  spec.params.stop_token_ids = {11};
  spec.params.logprobs = 2;
  Request r(spec, Clock::now());
  for (int32_t t : {9, 12, 12, 30}) r.tokens.push_back(t);  // four tokens generated so far
  const std::set<int32_t> eos = {2};
  const std::vector<int32_t> drafts = {12, 50};

  SamplingRows rows(V);
  rows.add_skip();
  for (size_t d = 0; d <= drafts.size(); ++d)
    rows.add(r, std::span<const int32_t>(drafts).first(d), d < drafts.size() ? drafts[d] : -1, eos);
  ASSERT_EQ(rows.rows().size(), 4u);
  EXPECT_EQ(rows.rows()[0].skip, 1);
  for (size_t d = 0; d <= drafts.size(); ++d) {
    const RowSampling& rs = rows.rows()[d + 1];
    EXPECT_EQ(rs.draw, 4 + d);  // the output position this row picks
    EXPECT_EQ(rs.draft, d < drafts.size() ? drafts[d] : -1);
    EXPECT_EQ(rs.seed, 77u);
    EXPECT_FLOAT_EQ(rs.temperature, 0.7f);
    EXPECT_EQ(rs.top_k, 12);
    EXPECT_EQ(rs.logprobs, 2);
    // The CPU sampler's view: min_tokens masks eos and stop ids, then penalties over the output
    // with the drafts before this row, then the bias.
    std::vector<int32_t> output(r.output_span().begin(), r.output_span().end());
    output.insert(output.end(), drafts.begin(), drafts.begin() + std::ptrdiff_t(d));
    std::vector<float> want = logits;
    if (int64_t(output.size()) < spec.params.min_tokens) {
      want[2] = -std::numeric_limits<float>::infinity();
      want[11] = -std::numeric_limits<float>::infinity();
    }
    apply_logit_adjustments(want.data(), V, spec.params.sampling, r.prompt_span(), output);
    std::vector<float> got = logits;
    apply(got, rows.adjustments(), rs);
    for (int i = 0; i < V; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "row " << d << " token " << i;
  }
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// A row's token mask (structured output) is copied into the step's mask table and the row points
// at it; rows without one point nowhere.
TEST(SamplingRows, TokenMasksAreTabledPerRow) {
  const int V = 70;  // three words a row
  RequestSpec spec;
  spec.prompt = {1, 2};
  Request r(spec, Clock::now());
  std::vector<uint32_t> a(size_t(mask_words(V)), 0u), b(size_t(mask_words(V)), 0u);
  a[0] = 1u << 5;
  b[2] = 1u << 1;  // token 65
  SamplingRows rows(V);
  rows.add(r, {}, -1, {}, a.data());
  rows.add(r, {}, -1, {});
  rows.add(r, {}, -1, {}, b.data());
  ASSERT_EQ(rows.rows().size(), 3u);
  EXPECT_EQ(rows.rows()[0].mask_row, 0);
  EXPECT_EQ(rows.rows()[1].mask_row, -1);
  EXPECT_EQ(rows.rows()[2].mask_row, 1);
  ASSERT_EQ(rows.masks().size(), size_t(2 * mask_words(V)));
  EXPECT_EQ(rows.masks()[0], 1u << 5);
  EXPECT_EQ(rows.masks()[size_t(mask_words(V)) + 2], 1u << 1);
  rows.clear();
  EXPECT_TRUE(rows.masks().empty());
}

}  // namespace
}  // namespace fathom
