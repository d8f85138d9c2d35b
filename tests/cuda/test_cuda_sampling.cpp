// Device sampling (kernels/cuda/sampling.cu) against the CPU sampler (runtime/sampler.h,
// runtime/spec_sampling.h): greedy choices bit for bit, logprobs to rounding, and sampled
// distributions (temperature, top-k, top-p, min-p, penalties, draft rejection) by a chi-square
// test on many independent draws. Seeds are fixed, so each run draws the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "core/row_sampling.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "runtime/sampler.h"
#include "kernels/cpu/row_sampler.h"
#include "runtime/spec_sampling.h"

namespace fathom {
namespace {

struct DeviceResult {
  std::vector<RowSample> samples;
  std::vector<int32_t> top_ids;
  std::vector<float> top_lp;
};

// Runs sample_rows over `logits` [rows, V] with `params` (one per row) and `adjust`; with
// `head_argmax`, as the engine does: argmax_rows over the logits first, handed to the sampler.
// With `q`, the step's draft distributions ([rows, V], read and written: RowSampling::q_out,
// draft_q), and the chosen tokens also as a plain id array (a fused round's MTP input), which must
// agree with the samples.
DeviceResult run_device(const std::vector<float>& logits, int V, const std::vector<RowSampling>& params,
                        const std::vector<LogitAdjustment>& adjust, const std::vector<uint32_t>& masks = {},
                        bool head_argmax = false, std::vector<float>* q = nullptr) {
  const int rows = int(params.size());
  cuda::DeviceBuffer dl(logits.size() * 4), dp(params.size() * sizeof(RowSampling)),
      da(std::max<size_t>(1, adjust.size()) * sizeof(LogitAdjustment)), dout(params.size() * sizeof(RowSample)),
      dti(params.size() * kMaxTopLogprobs * 4), dtl(params.size() * kMaxTopLogprobs * 4);
  FATHOM_CUDA_CHECK(cudaMemcpy(dl.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
  FATHOM_CUDA_CHECK(cudaMemcpy(dp.data(), params.data(), params.size() * sizeof(RowSampling), cudaMemcpyHostToDevice));
  if (!adjust.empty())
    FATHOM_CUDA_CHECK(
        cudaMemcpy(da.data(), adjust.data(), adjust.size() * sizeof(LogitAdjustment), cudaMemcpyHostToDevice));
  cuda::DeviceBuffer dm(std::max<size_t>(1, masks.size()) * 4);
  if (!masks.empty()) FATHOM_CUDA_CHECK(cudaMemcpy(dm.data(), masks.data(), masks.size() * 4, cudaMemcpyHostToDevice));
  cuda::DeviceBuffer dq(q ? q->size() * 4 : 4), dt(size_t(rows) * 4);
  if (q) {
    FATHOM_CUDA_CHECK(cudaMemcpy(dq.data(), q->data(), q->size() * 4, cudaMemcpyHostToDevice));
    FATHOM_CUDA_CHECK(cudaMemset(dt.data(), 0xff, dt.bytes()));
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());  // pageable copies may still be in flight when cudaMemcpy returns
  cuda::DeviceBuffer dai(size_t(rows) * 4), scratch(cuda::argmax_scratch_bytes(rows));
  if (head_argmax) {
    FATHOM_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
    cuda::argmax_rows(dl.as<float>(), dai.as<int32_t>(), rows, V, scratch.data(), nullptr);
  }
  cuda::sample_rows(dl.as<float>(), rows, V, dp.as<RowSampling>(), da.as<LogitAdjustment>(), dout.as<RowSample>(),
                    dti.as<int32_t>(), dtl.as<float>(), nullptr, nullptr,
                    masks.empty() ? nullptr : dm.as<uint32_t>(), head_argmax ? dai.as<int32_t>() : nullptr,
                    q ? dq.as<float>() : nullptr, q ? dt.as<int32_t>() : nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  DeviceResult r;
  r.samples.resize(size_t(rows));
  r.top_ids.resize(size_t(rows) * kMaxTopLogprobs);
  r.top_lp.resize(size_t(rows) * kMaxTopLogprobs);
  FATHOM_CUDA_CHECK(cudaMemcpy(r.samples.data(), dout.data(), r.samples.size() * sizeof(RowSample), cudaMemcpyDeviceToHost));
  FATHOM_CUDA_CHECK(cudaMemcpy(r.top_ids.data(), dti.data(), r.top_ids.size() * 4, cudaMemcpyDeviceToHost));
  FATHOM_CUDA_CHECK(cudaMemcpy(r.top_lp.data(), dtl.data(), r.top_lp.size() * 4, cudaMemcpyDeviceToHost));
  if (q) {
    std::vector<int32_t> tokens(static_cast<size_t>(rows), 0);
    FATHOM_CUDA_CHECK(cudaMemcpy(tokens.data(), dt.data(), tokens.size() * 4, cudaMemcpyDeviceToHost));
    FATHOM_CUDA_CHECK(cudaMemcpy(q->data(), dq.data(), q->size() * 4, cudaMemcpyDeviceToHost));
    int differ = 0;
    for (size_t i = 0; i < tokens.size(); ++i) differ += tokens[i] != r.samples[i].token;
    EXPECT_EQ(differ, 0) << "rows whose token array differs from their sample";
  }
  return r;
}

// run_device's samples for rows with draft distributions `q`.
std::vector<RowSample> run_device_q(const std::vector<float>& logits, int V, const std::vector<RowSampling>& params,
                                    std::vector<float>& q) {
  return run_device(logits, V, params, {}, {}, /*head_argmax=*/false, &q).samples;
}

std::vector<float> random_logits(int rows, int V, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, scale);
  std::vector<float> l(size_t(rows) * V);
  for (float& x : l) x = n(g);
  return l;
}

// Greedy picks equal the CPU's argmax bit for bit, with ties (to the lowest id), with the
// adjustments applied as apply_logit_adjustments and min_tokens masking apply them, and with a
// draft (accepted exactly when it is the argmax).
TEST(CudaSampling, GreedyEqualsCpuArgmax) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  for (int V : {1000, 248320}) {
    const int rows = 48;
    std::vector<float> logits = random_logits(rows, V, 3.f, 7u + uint32_t(V));
    // Ties: rows 0..7 get their maximum copied to a lower and a higher id.
    for (int r = 0; r < 8; ++r) {
      float* row = logits.data() + int64_t(r) * V;
      const int32_t a = argmax(row, V);
      row[a / 2] = row[a];
      row[std::min(V - 1, a + 5)] = row[a];
    }
    std::vector<RowSampling> params(rows);
    std::vector<LogitAdjustment> adjust;
    std::vector<float> ref = logits;
    std::vector<int32_t> draft(rows, -1);
    for (int r = 0; r < rows; ++r) {
      params[size_t(r)].adjust_begin = int32_t(adjust.size());
      float* row = ref.data() + int64_t(r) * V;
      if (r % 3 == 1) {  // penalties, a bias and a masked token, as the engine would send them
        SamplingParams sp;
        sp.repetition_penalty = 1.5f;
        sp.presence_penalty = 0.7f;
        sp.frequency_penalty = 0.3f;
        const int32_t top = argmax(row, V);
        sp.logit_bias = {{(top + 11) % V, 4.f}};
        std::vector<int32_t> prompt = {top, 5, 9}, output = {top, top, 17, 5};
        std::map<int32_t, LogitAdjustment> e;
        for (int32_t t : prompt) e[t].rep = sp.repetition_penalty;
        std::map<int32_t, int> counts;
        for (int32_t t : output) ++counts[t], e[t].rep = sp.repetition_penalty;
        for (auto [t, c] : counts) e[t].sub = sp.frequency_penalty * float(c) + sp.presence_penalty;
        for (auto [t, b] : sp.logit_bias) e[t].bias += b;
        e[3].mask = 1;
        row[3] = -INFINITY;
        apply_logit_adjustments(row, V, sp, prompt, output);
        for (auto& [t, x] : e) {
          x.token = t;
          adjust.push_back(x);
        }
      }
      if (r % 4 == 2) draft[size_t(r)] = r % 8 == 2 ? argmax(row, V) : (argmax(row, V) + 1) % V;
      params[size_t(r)].draft = draft[size_t(r)];
      params[size_t(r)].adjust_end = int32_t(adjust.size());
    }
    const DeviceResult got = run_device(logits, V, params, adjust);
    const DeviceResult again = run_device(logits, V, params, adjust);
    // As the engine runs it: the rows with nothing to apply take argmax_rows' picks.
    const DeviceResult from_head = run_device(logits, V, params, adjust, {}, /*head_argmax=*/true);
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(from_head.samples[size_t(r)].token, got.samples[size_t(r)].token) << "V=" << V << " row " << r;
      EXPECT_EQ(from_head.samples[size_t(r)].accepted, got.samples[size_t(r)].accepted) << "V=" << V << " row " << r;
    }
    for (int r = 0; r < rows; ++r) {
      const int32_t want = argmax(ref.data() + int64_t(r) * V, V);
      const int32_t tok = got.samples[size_t(r)].token;
      EXPECT_EQ(again.samples[size_t(r)].token, tok) << "V=" << V << " row " << r << ": not deterministic";
      EXPECT_EQ(tok, want) << "V=" << V << " row " << r << ": values (host-adjusted) "
                           << (tok >= 0 && tok < V ? ref[size_t(int64_t(r) * V + tok)] : NAN) << " vs "
                           << ref[size_t(int64_t(r) * V + want)] << ", raw " << (tok >= 0 && tok < V ? logits[size_t(int64_t(r) * V + tok)] : NAN)
                           << " vs " << logits[size_t(int64_t(r) * V + want)];
      EXPECT_EQ(got.samples[size_t(r)].accepted != 0, draft[size_t(r)] >= 0 && draft[size_t(r)] == want) << "row " << r;
    }
  }
}

// Logprobs come from the raw logits (before the adjustments): the chosen token's and the top k,
// as compute_logprobs gives them.
TEST(CudaSampling, LogprobsMatchCpu) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 248320, rows = 8;
  const std::vector<float> logits = random_logits(rows, V, 2.f, 99u);
  std::vector<RowSampling> params(rows);
  std::vector<LogitAdjustment> adjust;
  for (int r = 0; r < rows; ++r) {
    params[size_t(r)].logprobs = r == 0 ? 0 : (r == 1 ? kMaxTopLogprobs : 5);
    params[size_t(r)].adjust_begin = int32_t(adjust.size());
    LogitAdjustment a;  // the chosen token's logprob stays the raw one
    a.token = argmax(logits.data() + int64_t(r) * V, V);
    a.bias = 1.f;
    adjust.push_back(a);
    params[size_t(r)].adjust_end = int32_t(adjust.size());
  }
  const DeviceResult got = run_device(logits, V, params, adjust);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + int64_t(r) * V;
    const RowSample& s = got.samples[size_t(r)];
    const TokenLogprobs want = compute_logprobs(row, V, s.token, params[size_t(r)].logprobs);
    EXPECT_NEAR(s.logprob, want.logprob, 1e-4) << "row " << r;
    ASSERT_EQ(int(want.top.size()), params[size_t(r)].logprobs);
    for (size_t j = 0; j < want.top.size(); ++j) {
      EXPECT_EQ(got.top_ids[size_t(r) * kMaxTopLogprobs + j], want.top[j].first) << "row " << r << " rank " << j;
      EXPECT_NEAR(got.top_lp[size_t(r) * kMaxTopLogprobs + j], want.top[j].second, 1e-4) << "row " << r;
    }
  }
}

// Chi-square statistic of observed counts against expected probabilities (cells with an expected
// count below 5 pooled), with its degrees of freedom; `outside` counts draws of probability-0 tokens.
struct ChiSquare {
  double stat = 0;
  int df = 0;
  int64_t outside = 0;
  // The 1e-6 upper quantile (Wilson-Hilferty): a correct sampler fails once in a million seeds.
  double critical() const {
    const double k = std::max(1, df), z = 4.753;
    return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  }
};

ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  ChiSquare c;
  double pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      c.outside += counts[i];
      continue;
    }
    const double e = p[i] * double(n);
    if (e < 5) {
      pooled_e += e, pooled_o += double(counts[i]);
      continue;
    }
    c.stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  if (pooled_e > 0) c.stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++cells;
  c.df = cells - 1;
  return c;
}

// Many draws of one row (each with its own draw counter) follow the CPU sampler's distribution:
// target_distribution after apply_logit_adjustments, for each filter combination; with a draft,
// the accepted-or-replaced token still follows it (rejection sampling is lossless) and the draft
// is accepted with probability p(draft).
TEST(CudaSampling, DistributionsMatchCpuSampler) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 96, N = 200000;
  std::vector<float> base = random_logits(1, V, 2.f, 4242u);
  struct Case {
    const char* name;
    SamplingParams sp;
    bool penalties = false;
    bool with_draft = false;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, float t, int k, float p, float mp, bool pen = false, bool draft = false) {
    Case c;
    c.name = name;
    c.sp.temperature = t, c.sp.top_k = k, c.sp.top_p = p, c.sp.min_p = mp;
    c.penalties = pen, c.with_draft = draft;
    cases.push_back(c);
  };
  add("t0.8 top_p0.95", 0.8f, 0, 0.95f, 0.f);
  add("t1 top_k10", 1.f, 10, 1.f, 0.f);
  add("t0.7 min_p0.05", 0.7f, 0, 1.f, 0.05f);
  add("t1.3 top_k20 top_p0.8 min_p0.02", 1.3f, 20, 0.8f, 0.02f);
  add("t1 penalties", 1.f, 0, 1.f, 0.f, true);
  add("t0.8 top_p0.95 draft", 0.8f, 0, 0.95f, 0.f, false, true);
  add("t1 top_k5 draft outside", 1.f, 5, 1.f, 0.f, false, true);
  for (const Case& c : cases) {
    SamplingParams sp = c.sp;
    std::vector<int32_t> prompt, output;
    std::vector<LogitAdjustment> adjust;
    std::vector<float> ref = base;
    if (c.penalties) {
      sp.repetition_penalty = 1.4f, sp.presence_penalty = 0.5f, sp.frequency_penalty = 0.25f;
      sp.logit_bias = {{7, 2.5f}};
      prompt = {argmax(base.data(), V), 1, 2};
      output = {3, 3, 4, prompt[0]};
      std::map<int32_t, LogitAdjustment> e;
      for (int32_t t : prompt) e[t].rep = sp.repetition_penalty;
      std::map<int32_t, int> counts;
      for (int32_t t : output) ++counts[t], e[t].rep = sp.repetition_penalty;
      for (auto [t, n] : counts) e[t].sub = sp.frequency_penalty * float(n) + sp.presence_penalty;
      for (auto [t, b] : sp.logit_bias) e[t].bias += b;
      for (auto& [t, x] : e) x.token = t, adjust.push_back(x);
      apply_logit_adjustments(ref.data(), V, sp, prompt, output);
    }
    const std::vector<double> p = target_distribution(ref.data(), V, sp);
    int32_t draft = -1;
    if (c.with_draft) {  // the second most likely token, or one outside the top-k set
      std::vector<int32_t> order(V);
      for (int i = 0; i < V; ++i) order[size_t(i)] = i;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return ref[size_t(a)] > ref[size_t(b)]; });
      draft = sp.top_k > 0 ? order[size_t(sp.top_k + 3)] : order[1];
    }
    std::vector<float> logits(size_t(N) * V);
    for (int i = 0; i < N; ++i) std::copy(base.begin(), base.end(), logits.begin() + int64_t(i) * V);
    std::vector<RowSampling> params(static_cast<size_t>(N));
    std::vector<LogitAdjustment> all_adjust;
    for (int i = 0; i < N; ++i) {
      RowSampling& r = params[size_t(i)];
      r.temperature = sp.temperature, r.top_k = sp.top_k, r.top_p = sp.top_p, r.min_p = sp.min_p;
      r.seed = 1234567, r.draw = uint64_t(i), r.draft = draft;
      r.adjust_begin = int32_t(all_adjust.size());
      all_adjust.insert(all_adjust.end(), adjust.begin(), adjust.end());
      r.adjust_end = int32_t(all_adjust.size());
    }
    const DeviceResult got = run_device(logits, V, params, all_adjust);
    std::vector<int64_t> counts(size_t(V), 0);
    int64_t accepted = 0;
    for (const RowSample& s : got.samples) {
      ASSERT_TRUE(s.token >= 0 && s.token < V) << c.name;
      ++counts[size_t(s.token)];
      accepted += s.accepted;
      if (s.accepted) {
        ASSERT_EQ(s.token, draft);
      }
    }
    const ChiSquare cs = chi_square(counts, p, N);
    std::printf("  %-34s chi2 %.1f (df %d, critical %.1f)", c.name, cs.stat, cs.df, cs.critical());
    EXPECT_EQ(cs.outside, 0) << c.name << ": draws of tokens the filters drop";
    EXPECT_LT(cs.stat, cs.critical()) << c.name;
    if (draft >= 0) {  // acceptance ~ Binomial(N, p(draft)): within 5 standard deviations
      const double pd = p[size_t(draft)], sd = std::sqrt(N * pd * (1 - pd));
      std::printf(", accepted %lld of %d (p(draft) %.4f)", (long long)accepted, N, pd);
      EXPECT_LE(std::fabs(double(accepted) - N * pd), 5 * sd + 1) << c.name;
    }
    std::printf("\n");
  }
}

// Drafts drawn from q (RowSampling::q_out) and verified against p with min(1, p / q), a refusal
// drawing from the residual max(p - q, 0) (RowSampling::draft_q): the tokens follow p whatever q
// is (lossless), and a draft is accepted with probability sum_t min(p_t, q_t). q's support differs
// from p's in the filtered cases, so drafts p never gives are drawn and must always be refused.
TEST(CudaSampling, DrawnDraftsKeepTheTargetDistribution) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 96, N = 200000;
  const std::vector<float> p_logits = random_logits(1, V, 2.f, 4242u), other = random_logits(1, V, 2.f, 777u);
  struct Case {
    const char* name;
    SamplingParams p, q;
    float mix;  // q's logits: mix * p's + (1 - mix) * other
  };
  std::vector<Case> cases(3);
  cases[0].name = "p t0.8, q t1 (mix 0.5)";
  cases[0].p.temperature = 0.8f, cases[0].q.temperature = 1.f, cases[0].mix = 0.5f;
  cases[1].name = "p t1 top_k10, q t0.9 top_p0.9";
  cases[1].p.temperature = 1.f, cases[1].p.top_k = 10;
  cases[1].q.temperature = 0.9f, cases[1].q.top_p = 0.9f, cases[1].mix = 0.7f;
  cases[2].name = "p t0.7 top_p0.8, q t1.2 (mix 0)";
  cases[2].p.temperature = 0.7f, cases[2].p.top_p = 0.8f, cases[2].q.temperature = 1.2f, cases[2].mix = 0.f;
  auto row = [](const SamplingParams& sp, uint64_t seed, uint64_t draw) {
    RowSampling r;
    r.temperature = sp.temperature, r.top_k = sp.top_k, r.top_p = sp.top_p, r.min_p = sp.min_p;
    r.seed = seed, r.draw = draw;
    return r;
  };
  for (const Case& c : cases) {
    std::vector<float> q_logits(static_cast<size_t>(V));
    for (int t = 0; t < V; ++t) q_logits[size_t(t)] = c.mix * p_logits[size_t(t)] + (1.f - c.mix) * other[size_t(t)];
    std::vector<float> logits(size_t(N) * V), q(size_t(N) * V, 0.f);
    std::vector<RowSampling> params(static_cast<size_t>(N));
    for (int i = 0; i < N; ++i) {
      std::copy(q_logits.begin(), q_logits.end(), logits.begin() + int64_t(i) * V);
      params[size_t(i)] = row(c.q, 99, uint64_t(i));
      params[size_t(i)].q_out = i;
    }
    const std::vector<RowSample> drafts = run_device_q(logits, V, params, q);
    for (int i = 0; i < N; ++i) {
      std::copy(p_logits.begin(), p_logits.end(), logits.begin() + int64_t(i) * V);
      params[size_t(i)] = row(c.p, 4321, uint64_t(i));
      params[size_t(i)].draft = drafts[size_t(i)].token, params[size_t(i)].draft_q = i;
    }
    const std::vector<RowSample> got = run_device_q(logits, V, params, q);
    const std::vector<double> p = target_distribution(p_logits.data(), V, c.p),
                              qd = target_distribution(q_logits.data(), V, c.q);
    std::vector<int64_t> counts(size_t(V), 0);
    int64_t accepted = 0;
    for (int i = 0; i < N; ++i) {
      const RowSample& s = got[size_t(i)];
      ASSERT_TRUE(s.token >= 0 && s.token < V) << c.name;
      ++counts[size_t(s.token)];
      accepted += s.accepted;
      if (s.accepted) {
        ASSERT_EQ(s.token, drafts[size_t(i)].token) << c.name;
      }
    }
    double pa = 0;  // the acceptance rate of drafts from q: sum_t min(p_t, q_t)
    for (int t = 0; t < V; ++t) pa += std::min(p[size_t(t)], qd[size_t(t)]);
    const ChiSquare cs = chi_square(counts, p, N);
    const double sd = std::sqrt(N * pa * (1 - pa));
    std::printf("  %-34s chi2 %.1f (df %d, critical %.1f), accepted %lld of %d (expected %.4f)\n", c.name, cs.stat,
                cs.df, cs.critical(), (long long)accepted, N, pa);
    EXPECT_EQ(cs.outside, 0) << c.name << ": draws of tokens p does not give";
    EXPECT_LT(cs.stat, cs.critical()) << c.name;
    EXPECT_LE(std::fabs(double(accepted) - N * pa), 5 * sd + 1) << c.name;
  }
}

// The top-k and top-p cut-offs by bins (two passes over the row) keep exactly the tokens that the
// bisection over keys keeps, on rows shaped to break them: broad, peaked and wide logits, ties
// that overflow a bin's shared memory (the bins fall back to bisection), a row of one value, rows
// mostly -inf, extreme temperatures; at a staged vocabulary and at Qwen3.5's. Rows draw a draft,
// so q (RowSampling::q_out) shows the kept set: q and the tokens must be equal bit for bit.
TEST(CudaSampling, CutoffsByBinsEqualTheBisection) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  struct Cut {
    float t;
    int k;
    float p, min_p;
  };
  const std::vector<Cut> cuts = {{0.7f, 0, 0.95f, 0.f}, {1.f, 20, 1.f, 0.f},    {0.6f, 20, 0.95f, 0.f},
                                 {0.05f, 0, 0.9f, 0.f}, {5.f, 1000, 0.5f, 0.f}, {1.f, 0, 0.99f, 0.05f},
                                 {1.f, 9000, 1.f, 0.f}};
  const int shapes = 6;
  for (const int V : {3000, 248320}) {
    const int rows = shapes * int(cuts.size());
    std::vector<float> logits(size_t(rows) * V);
    std::vector<RowSampling> params(static_cast<size_t>(rows));
    std::mt19937 g{static_cast<uint32_t>(V)};
    std::normal_distribution<float> n(0.f, 1.f);
    for (int r = 0; r < rows; ++r) {
      float* row = logits.data() + size_t(r) * V;
      const int shape = r % shapes;
      for (int i = 0; i < V; ++i) {
        const float z = n(g);
        row[i] = shape == 0 ? 2.f * z                           // broad
                 : shape == 1 ? z                               // peaked (below)
                 : shape == 2 ? std::round(4.f * z) / 2.f       // ties: a bin holds thousands of one value
                 : shape == 3 ? 0.f                             // one value
                 : shape == 4 ? -INFINITY                       // mostly -inf (below)
                              : 8.f * z;                        // wide
      }
      if (shape == 1) row[(r * 7919) % V] = 30.f;
      if (shape == 4)
        for (int j = 0; j < 50; ++j) row[g() % uint32_t(V)] = n(g);
      const Cut& c = cuts[size_t(r / shapes)];
      RowSampling& p = params[size_t(r)];
      p.temperature = c.t, p.top_k = c.k, p.top_p = c.p, p.min_p = c.min_p;
      p.seed = 99 + uint64_t(r), p.draw = uint64_t(r), p.q_out = r;
    }
    std::vector<float> q_bins(logits.size(), -1.f), q_bisect(logits.size(), -1.f);
    const DeviceResult bins = run_device(logits, V, params, {}, {}, false, &q_bins);
    cuda::set_sampling_cutoffs_by_bisection(true);
    const DeviceResult bisect = run_device(logits, V, params, {}, {}, false, &q_bisect);
    cuda::set_sampling_cutoffs_by_bisection(false);
    int cut_rows = 0;  // rows whose cut-off kept more than one token and less than all
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(bins.samples[size_t(r)].token, bisect.samples[size_t(r)].token) << "V " << V << " row " << r;
      const float* a = q_bins.data() + size_t(r) * V;
      const float* b = q_bisect.data() + size_t(r) * V;
      int differ = 0, kept = 0;
      for (int i = 0; i < V; ++i) differ += std::memcmp(a + i, b + i, 4) != 0, kept += b[i] > 0.f;
      EXPECT_EQ(differ, 0) << "V " << V << " row " << r << ": q differs at " << differ << " ids";
      cut_rows += kept > 1 && kept < V;
    }
    std::printf("  V %d: %d of %d rows cut between one token and all\n", V, cut_rows, rows);
    EXPECT_GE(cut_rows, rows / 2);
  }
}

// A seeded row gives the same token wherever it sits in the batch and whatever else runs beside
// it: the random numbers depend on (seed, draw) only.
TEST(CudaSampling, SeededRowsIndependentOfBatch) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 248320, rows = 16;
  const std::vector<float> logits = random_logits(rows, V, 1.f, 5u);
  std::vector<RowSampling> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[size_t(r)].temperature = 0.9f;
    params[size_t(r)].top_p = 0.9f;
    params[size_t(r)].top_k = r % 2 ? 50 : 0;
    params[size_t(r)].seed = 1000 + uint64_t(r);
    params[size_t(r)].draw = uint64_t(3 * r);
  }
  const DeviceResult a = run_device(logits, V, params, {});
  // The same rows reversed.
  std::vector<float> rl(logits.size());
  std::vector<RowSampling> rp(params.rbegin(), params.rend());
  for (int r = 0; r < rows; ++r)
    std::copy_n(logits.begin() + int64_t(rows - 1 - r) * V, V, rl.begin() + int64_t(r) * V);
  const DeviceResult b = run_device(rl, V, rp, {});
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(a.samples[size_t(r)].token, b.samples[size_t(rows - 1 - r)].token) << "row " << r;
    // The token is one the filters keep.
    SamplingParams sp;
    sp.temperature = params[size_t(r)].temperature, sp.top_p = params[size_t(r)].top_p, sp.top_k = params[size_t(r)].top_k;
    const std::vector<double> p = target_distribution(logits.data() + int64_t(r) * V, V, sp);
    EXPECT_GT(p[size_t(a.samples[size_t(r)].token)], 0.0) << "row " << r;
  }
}

// Structured output: with a row's token mask, greedy picks the CPU's argmax over the allowed
// tokens, a sampled row picks only allowed tokens (whatever the logits prefer), and a draft
// outside the mask is rejected.
TEST(CudaSampling, TokenMasksRestrictTheChoice) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 248320, rows = 32;
  const int64_t W = mask_words(V);
  const std::vector<float> logits = random_logits(rows, V, 2.f, 11u);
  std::vector<RowSampling> params(rows);
  std::vector<uint32_t> masks(size_t(rows / 2) * size_t(W), 0u);
  std::mt19937 g(3);
  int32_t next_mask = 0;
  for (int r = 0; r < rows; ++r) {
    RowSampling& p = params[size_t(r)];
    p.temperature = r % 2 ? 1.f : 0.f;
    p.seed = 77 + uint64_t(r);
    if (r % 4 < 2) {  // masked rows: a few allowed tokens, never the row's argmax
      p.mask_row = next_mask++;
      uint32_t* m = masks.data() + int64_t(p.mask_row) * W;
      const int32_t top = argmax(logits.data() + int64_t(r) * V, V);
      for (int k = 0; k < 5; ++k) {
        int32_t t = int32_t(g() % uint32_t(V));
        if (t == top) t = (t + 1) % V;
        m[t >> 5] |= 1u << (t & 31);
      }
      if (r % 8 == 0) p.draft = top;  // a draft the grammar refuses
    }
  }
  const DeviceResult got = run_device(logits, V, params, {}, masks);
  for (int r = 0; r < rows; ++r) {
    const RowSampling& p = params[size_t(r)];
    const int32_t token = got.samples[size_t(r)].token;
    if (p.mask_row < 0) continue;
    const uint32_t* m = masks.data() + int64_t(p.mask_row) * W;
    EXPECT_TRUE(m[token >> 5] >> (token & 31) & 1u) << "row " << r << " chose " << token;
    if (p.draft >= 0) EXPECT_EQ(got.samples[size_t(r)].accepted, 0) << "row " << r;
    if (p.temperature == 0.f) {
      std::vector<float> ref(logits.begin() + int64_t(r) * V, logits.begin() + int64_t(r + 1) * V);
      for (int t = 0; t < V; ++t)
        if (!(m[t >> 5] >> (t & 31) & 1u)) ref[size_t(t)] = -INFINITY;
      EXPECT_EQ(token, argmax(ref.data(), V)) << "row " << r;
    }
  }
}

// The CPU row sampler (kernels/cpu/row_sampler.h: the CPU engine's --sampler device) draws what
// the device draws: the same filters, fixed-point weights and random numbers, so tokens agree
// except where exp() rounds a weight differently at its last bit (and greedy rows always).
TEST(CudaSampling, CpuRowSamplerDrawsTheDevicesTokens) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 3000, rows = 512;
  const std::vector<float> logits = random_logits(rows, V, 2.5f, 77);
  std::vector<RowSampling> params(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    RowSampling& p = params[size_t(r)];
    p.temperature = r % 5 == 0 ? 0.f : 0.5f + 0.1f * float(r % 7);
    p.top_k = r % 3 == 0 ? 40 : 0;
    p.top_p = r % 4 == 1 ? 0.9f : 1.f;
    p.min_p = r % 6 == 2 ? 0.02f : 0.f;
    p.seed = 4242 + uint64_t(r % 11), p.draw = uint64_t(r);
    if (r % 2 == 1) {  // a draft: the row's second most likely token
      const float* row = logits.data() + size_t(r) * V;
      const int32_t first = argmax(row, V);
      int32_t second = first == 0 ? 1 : 0;
      for (int32_t t = 0; t < V; ++t)
        if (t != first && row[t] > row[second]) second = t;
      p.draft = second;
    }
  }
  const DeviceResult dev = run_device(logits, V, params, {});
  std::vector<float> work = logits;
  std::vector<RowSample> host(static_cast<size_t>(rows));
  cpu::sample_rows(work.data(), rows, V, params.data(), nullptr, host.data(), nullptr, nullptr);
  int same = 0;
  for (int r = 0; r < rows; ++r) {
    const bool eq = host[size_t(r)].token == dev.samples[size_t(r)].token &&
                    host[size_t(r)].accepted == dev.samples[size_t(r)].accepted;
    same += eq;
    if (params[size_t(r)].temperature <= 0.f) EXPECT_TRUE(eq) << "greedy row " << r;
  }
  std::printf("  %d of %d rows drew the same token on the CPU and the GPU\n", same, rows);
  EXPECT_GE(same, rows * 99 / 100);
}

// Drafts drawn from a distribution on the device (RowSampling::q_out, draft_q) against the CPU row
// sampler, its reference (tests/kernels/cpu/test_row_sampler.cpp checks the distributions): rows
// that draw a draft write the same q and draw the same token; rows that verify one against q
// accept and replace it as the CPU does.
TEST(CudaSampling, SampledDraftsMatchTheCpuRowSampler) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int V = 3000, rows = 256;
  const std::vector<float> q_logits = random_logits(rows, V, 2.f, 91), p_logits = random_logits(rows, V, 2.5f, 92);
  std::vector<RowSampling> draw(static_cast<size_t>(rows)), verify(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    RowSampling& d = draw[size_t(r)];
    d.temperature = r % 7 == 0 ? 0.f : 0.6f + 0.1f * float(r % 5);
    d.top_k = r % 3 == 0 ? 50 : 0;
    d.top_p = r % 4 == 1 ? 0.9f : 1.f;
    d.seed = 77 + uint64_t(r % 13), d.draw = uint64_t(r), d.q_out = r;
  }
  std::vector<float> q_dev(size_t(rows) * V, -1.f), q_cpu(size_t(rows) * V, -1.f);
  const std::vector<RowSample> drawn_dev = run_device_q(q_logits, V, draw, q_dev);
  std::vector<float> work = q_logits;
  std::vector<RowSample> drawn_cpu(static_cast<size_t>(rows));
  cpu::sample_rows(work.data(), rows, V, draw.data(), nullptr, drawn_cpu.data(), nullptr, nullptr, nullptr, q_cpu.data());
  int same_draft = 0;
  double worst = 0;
  for (int r = 0; r < rows; ++r) {
    same_draft += drawn_dev[size_t(r)].token == drawn_cpu[size_t(r)].token;
    for (int t = 0; t < V; ++t)
      worst = std::max(worst, double(std::fabs(q_dev[size_t(r) * V + t] - q_cpu[size_t(r) * V + t])));
  }
  EXPECT_LT(worst, 1e-5) << "largest difference of q between the GPU and the CPU";
  EXPECT_GE(same_draft, rows * 99 / 100);
  // Verify each row's CPU draft against the CPU q on both (the device reads its own q).
  for (int r = 0; r < rows; ++r) {
    RowSampling& v = verify[size_t(r)];
    v.temperature = r % 11 == 0 ? 0.f : 0.7f + 0.1f * float(r % 4);
    v.top_k = r % 5 == 0 ? 40 : 0;
    v.seed = 500 + uint64_t(r % 9), v.draw = uint64_t(r);
    v.draft = drawn_cpu[size_t(r)].token, v.draft_q = r;
  }
  std::vector<float> q_for_dev = q_cpu;
  const std::vector<RowSample> dev = run_device_q(p_logits, V, verify, q_for_dev);
  work = p_logits;
  std::vector<RowSample> host(static_cast<size_t>(rows));
  cpu::sample_rows(work.data(), rows, V, verify.data(), nullptr, host.data(), nullptr, nullptr, nullptr, q_cpu.data());
  int same = 0, accepted = 0;
  for (int r = 0; r < rows; ++r) {
    const bool eq = host[size_t(r)].token == dev[size_t(r)].token && host[size_t(r)].accepted == dev[size_t(r)].accepted;
    same += eq;
    accepted += host[size_t(r)].accepted;
    if (verify[size_t(r)].temperature <= 0.f) EXPECT_TRUE(eq) << "greedy row " << r;
  }
  std::printf("  sampled drafts: %d of %d drafts and %d of %d verified rows the same on the CPU and the GPU "
              "(%d accepted), q within %.2g\n", same_draft, rows, same, rows, accepted, worst);
  EXPECT_GE(same, rows * 99 / 100);
}

}  // namespace
}  // namespace fathom
