// The serving engine's device-sampling path on the CPU engine (model/row_sampling_runner.h: the
// runner chooses each row's token, launches overlap, pending tokens are resolved by the runner):
// greedy outputs equal the host sampler's; seeded sampling gives the same tokens overlapped or
// not; with MTP one draft a round, fused rounds take sampled, penalised, min_tokens and logprobs
// requests, and give exactly what the unfused rounds give (the same drafts, verified with the
// same random numbers), greedy ones what plain decoding gives.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "runtime/cpu_fixtures.h"
#include "runtime/engine_test_util.h"

namespace fathom {
namespace {

using testing::expect_same;
using testing::Finished;
using testing::Job;
using testing::metric;
using testing::run_engine;

std::unique_ptr<CpuRunner> load_cpu(const std::string& name) { return testing::load_cpu_runner(name, true); }

std::unique_ptr<ModelRunner> load_row_sampling(const std::string& name) {
  auto cpu = load_cpu(name);
  return cpu ? std::make_unique<RowSamplingRunner>(std::move(cpu)) : nullptr;
}

Job job(int len, int vocab, uint32_t seed, int max_tokens) {
  std::mt19937 rng(seed);
  Job j;
  j.prompt.resize(size_t(len));
  for (auto& t : j.prompt) t = 2 + int32_t(rng() % uint32_t(vocab - 2));
  j.params.max_tokens = max_tokens;
  j.params.ignore_eos = true;
  return j;
}

// Greedy jobs with and without logits processing and logprobs; `sampled` adds temperature jobs.
std::vector<Job> jobs_for(int V, bool sampled) {
  std::vector<Job> jobs;
  jobs.push_back(job(5, V, 10, 20));
  jobs.push_back(job(23, V, 11, 31));
  Job pen = job(14, V, 12, 18);
  pen.params.sampling.repetition_penalty = 1.3f;
  pen.params.sampling.frequency_penalty = 0.3f;
  pen.params.sampling.logit_bias = {{7, 1.5f}};
  jobs.push_back(pen);
  Job lp = job(9, V, 13, 12);
  lp.params.logprobs = 3;
  jobs.push_back(lp);
  Job mt = job(30, V, 14, 16);
  mt.params.min_tokens = 10;
  mt.params.ignore_eos = false;
  jobs.push_back(mt);
  if (!sampled) return jobs;
  for (uint32_t i = 0; i < 4; ++i) {
    Job s = job(6 + 7 * int(i), V, 20 + i, 24);
    s.params.sampling.temperature = 0.6f + 0.3f * float(i);
    s.params.sampling.top_p = i % 2 ? 0.9f : 1.f;
    s.params.sampling.top_k = i == 2 ? 20 : 0;
    s.params.sampling.seed = 500 + i;
    if (i == 3) s.params.logprobs = 2, s.params.sampling.presence_penalty = 0.5f;
    jobs.push_back(s);
  }
  return jobs;
}

EngineConfig config(int64_t budget, bool overlap) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 512;
  c.eos_token_ids = {1};
  c.overlap_schedule = overlap;
  return c;
}

TEST(RowSamplingEngine, GreedyOutputsEqualTheHostSampler) {
  const char* fixture = "qwen35_moe";
  auto probe = load_cpu(fixture);
  ASSERT_TRUE(probe) << fixture << " missing";
  const std::vector<Job> jobs = jobs_for(probe->config().vocab_size, /*sampled=*/false);
  for (int64_t budget : {int64_t(2048), int64_t(13)}) {  // 13: chunked prefill
    const auto host = run_engine(load_cpu(fixture), config(budget, true), jobs);
    for (bool overlap : {true, false}) {
      Engine probe_engine(load_row_sampling(fixture), nullptr, config(budget, overlap));
      EXPECT_TRUE(probe_engine.samples_on_device());
      EXPECT_EQ(probe_engine.overlaps_steps(), overlap);
      const auto got = run_engine(load_row_sampling(fixture), config(budget, overlap), jobs);
      expect_same(got, host, std::string("budget ") + std::to_string(budget) + (overlap ? " overlapped" : ""), 2e-4);
    }
  }
}

TEST(RowSamplingEngine, SeededSamplingIsTheSameOverlappedOrNot) {
  const char* fixture = "qwen3_next";
  auto probe = load_cpu(fixture);
  ASSERT_TRUE(probe) << fixture << " missing";
  const std::vector<Job> jobs = jobs_for(probe->config().vocab_size, /*sampled=*/true);
  const auto plain = run_engine(load_row_sampling(fixture), config(2048, false), jobs);
  const auto overlapped = run_engine(load_row_sampling(fixture), config(2048, true), jobs);
  expect_same(overlapped, plain, "overlapped");
  const auto chunked = run_engine(load_row_sampling(fixture), config(13, true), jobs);
  expect_same(chunked, plain, "chunked prefill, overlapped");
  // The sampled jobs are not their greedy selves (the draws take effect).
  std::vector<Job> greedy = jobs;
  for (Job& j : greedy) j.params.sampling.temperature = 0.f;
  const auto g = run_engine(load_row_sampling(fixture), config(2048, true), greedy);
  int differ = 0;
  for (size_t i = 5; i < jobs.size(); ++i) differ += g[i].ids != plain[i].ids;
  EXPECT_GT(differ, 0);
}

// Preemption by recompute under a tight KV budget, with overlapped steps, and with MTP's fused
// rounds: greedy outputs are the same with room for everyone and without; so are seeded sampled
// ones without drafts (a preempted sequence recomputes its tokens, and a draw depends on seed and
// position alone). With drafts a position may be verified in one run and drawn in the other
// (other uses of the same random numbers): lossless in distribution, so only their lengths match.
TEST(RowSamplingEngine, PreemptionKeepsOutputs) {
  const char* fixture = "qwen35_moe_mtp_oracle";
  auto probe = load_cpu(fixture);
  ASSERT_TRUE(probe) << fixture << " missing";
  const int V = probe->config().vocab_size;
  std::vector<Job> jobs;
  for (uint32_t i = 0; i < 6; ++i) {
    Job j = job(20 + 7 * int(i), V, 300 + i, 40);
    if (i % 2) j.params.sampling.temperature = 0.8f, j.params.sampling.seed = 40 + i;
    jobs.push_back(j);
  }
  for (bool mtp : {false, true}) {
    EngineConfig roomy = config(64, true);
    roomy.max_model_len = 128;
    if (mtp) roomy.spec.algorithm = SpecAlgorithm::Mtp, roomy.spec.num_steps = 1;
    EngineConfig tight = roomy;
    tight.num_kv_blocks = 14;  // 224 tokens for 6 sequences of 60 to 95: preemptions
    const auto want = run_engine(load_row_sampling(fixture), roomy, jobs);
    std::string m;
    const auto got = run_engine(load_row_sampling(fixture), tight, jobs, &m);
    if (!mtp) expect_same(got, want, "plain");
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i % 2 == 0) EXPECT_EQ(got[i].ids, want[i].ids) << (mtp ? "MTP" : "plain") << " greedy job " << i;
      EXPECT_EQ(got[i].ids.size(), want[i].ids.size()) << (mtp ? "MTP" : "plain") << " job " << i;
    }
    std::printf("  %s: preemptions %.0f, fused rounds %.0f\n", mtp ? "MTP K=1" : "plain",
                metric(m, "fathom:num_preemptions_total"), metric(m, "fathom:spec_decode_fused_rounds_total"));
    EXPECT_GT(metric(m, "fathom:num_preemptions_total"), 0);
  }
}

// MTP with one draft a round: fused rounds take every request the device sampler takes.
class FusedSampledMtpTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedSampledMtpTest, OutputsEqualUnfusedRounds) {
  auto probe = load_cpu(GetParam());
  ASSERT_TRUE(probe && probe->has_mtp()) << GetParam() << " with its MTP layer missing";
  const std::vector<Job> jobs = jobs_for(probe->config().vocab_size, /*sampled=*/true);
  const auto plain = run_engine(load_row_sampling(GetParam()), config(2048, true), jobs);
  for (int64_t budget : {int64_t(2048), int64_t(13)}) {
    EngineConfig cfg = config(budget, true);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    cfg.spec.num_steps = 1;
    // Unchained: a chained round takes its draft budget before the round it follows is recorded
    // (with the adaptive length, one more draft where that round retires or backs the sequence
    // off), and whether rounds chain depends on the timing of arrivals (ChainedRoundsTest).
    cfg.chained_mtp_rounds = false;
    std::string fused_metrics, unfused_metrics;
    const auto fused = run_engine(load_row_sampling(GetParam()), cfg, jobs, &fused_metrics);
    cfg.fused_mtp_rounds = false;
    const auto unfused = run_engine(load_row_sampling(GetParam()), cfg, jobs, &unfused_metrics);
    const std::string what = std::string(GetParam()) + " budget " + std::to_string(budget);
    expect_same(fused, unfused, what + ": fused against unfused rounds");
    for (size_t i = 0; i < 4; ++i)  // greedy jobs: lossless against plain decoding, token for token
      EXPECT_EQ(fused[i].ids, plain[i].ids) << what << " job " << i;
    const double rounds = metric(fused_metrics, "fathom:spec_decode_fused_rounds_total");
    const double drafts = metric(fused_metrics, "fathom:spec_decode_num_draft_tokens_total");
    std::printf("  %s: %.0f fused rounds, %.0f drafts, %.0f accepted (unfused: %.0f drafts, %.0f accepted)\n",
                what.c_str(), rounds, drafts, metric(fused_metrics, "fathom:spec_decode_num_accepted_tokens_total"),
                metric(unfused_metrics, "fathom:spec_decode_num_draft_tokens_total"),
                metric(unfused_metrics, "fathom:spec_decode_num_accepted_tokens_total"));
    if (budget == 2048) EXPECT_GT(rounds, 0) << what;  // 13 tokens a step: rounds beside prefill chunks
    EXPECT_EQ(metric(unfused_metrics, "fathom:spec_decode_fused_rounds_total"), 0) << what;
    EXPECT_EQ(drafts, metric(unfused_metrics, "fathom:spec_decode_num_draft_tokens_total")) << what;
  }
  // Sampled requests alone (temperature, top-p / top-k, logprobs, a penalty): their rounds fuse.
  const std::vector<Job> sampled(jobs.begin() + 5, jobs.end());
  EngineConfig cfg = config(2048, true);
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 1;
  std::string m;
  const auto fused = run_engine(load_row_sampling(GetParam()), cfg, sampled, &m);
  cfg.fused_mtp_rounds = false;
  expect_same(fused, run_engine(load_row_sampling(GetParam()), cfg, sampled), "sampled jobs alone");
  EXPECT_GT(metric(m, "fathom:spec_decode_fused_rounds_total"), 0);
}

// Chained rounds (Engine::step_chained_round): round N + 1 launched from N's outcome before N is
// read. Jobs a chain takes (greedy, logprobs, a logit bias, min_tokens, seeded sampling with
// top-p / top-k) give exactly what unchained rounds give with the same draft decisions (the
// adaptive length off: a chained round's draft budget is taken before the round it follows is
// recorded), greedy ones plain decoding's; with the adaptive length on, greedy stays lossless.
// Penalised jobs among them break the chain while they run; a stop id ends a job inside a chain.
class ChainedRoundsTest : public ::testing::TestWithParam<const char*> {};

std::vector<Job> chain_jobs(int V) {
  std::vector<Job> jobs;
  jobs.push_back(job(5, V, 40, 27));
  jobs.push_back(job(23, V, 41, 40));
  Job bias = job(12, V, 42, 22);
  bias.params.sampling.logit_bias = {{7, 1.5f}, {9, -2.f}};
  jobs.push_back(bias);
  Job lp = job(9, V, 43, 19);
  lp.params.logprobs = 3;
  jobs.push_back(lp);
  Job mt = job(30, V, 44, 25);
  mt.params.min_tokens = 10;
  mt.params.ignore_eos = false;
  jobs.push_back(mt);
  for (uint32_t i = 0; i < 3; ++i) {
    Job sj = job(6 + 9 * int(i), V, 45 + i, 30);
    sj.params.sampling.temperature = 0.7f + 0.2f * float(i);
    sj.params.sampling.top_p = i == 1 ? 0.9f : 1.f;
    sj.params.sampling.top_k = i == 2 ? 20 : 0;
    sj.params.sampling.seed = 700 + i;
    if (i == 0) sj.params.logprobs = 2;
    jobs.push_back(sj);
  }
  return jobs;
}

TEST_P(ChainedRoundsTest, OutputsEqualUnchainedRounds) {
  auto probe = load_cpu(GetParam());
  ASSERT_TRUE(probe && probe->has_mtp()) << GetParam() << " with its MTP layer missing";
  const int V = probe->config().vocab_size;
  const std::vector<Job> jobs = chain_jobs(V);
  const auto plain = run_engine(load_row_sampling(GetParam()), config(2048, true), jobs);
  for (int64_t budget : {int64_t(2048), int64_t(13)}) {
    EngineConfig cfg = config(budget, true);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    cfg.spec.num_steps = 1;
    cfg.spec.adaptive = false;
    std::string chained_metrics, unchained_metrics;
    const auto chained = run_engine(load_row_sampling(GetParam()), cfg, jobs, &chained_metrics);
    cfg.chained_mtp_rounds = false;
    const auto unchained = run_engine(load_row_sampling(GetParam()), cfg, jobs, &unchained_metrics);
    const std::string what = std::string(GetParam()) + " budget " + std::to_string(budget);
    expect_same(chained, unchained, what + ": chained against unchained rounds");
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(chained[i].ids, plain[i].ids) << what << " greedy job " << i;
    const double rounds = metric(chained_metrics, "fathom:spec_decode_chained_rounds_total");
    std::printf("  %s: %.0f chained of %.0f fused rounds, %.0f drafts, %.0f accepted\n", what.c_str(), rounds,
                metric(chained_metrics, "fathom:spec_decode_fused_rounds_total"),
                metric(chained_metrics, "fathom:spec_decode_num_draft_tokens_total"),
                metric(chained_metrics, "fathom:spec_decode_num_accepted_tokens_total"));
    EXPECT_GT(rounds, 0) << what;
    EXPECT_EQ(metric(unchained_metrics, "fathom:spec_decode_chained_rounds_total"), 0) << what;
    EXPECT_EQ(metric(chained_metrics, "fathom:spec_decode_num_draft_tokens_total"),
              metric(unchained_metrics, "fathom:spec_decode_num_draft_tokens_total"))
        << what;
  }
  // The adaptive length on (sampled rows then do not chain: a chained round's draft budget is
  // taken a round early, which would move a seeded request's draws with the timing of arrivals),
  // greedy jobs with a penalised one and stop ids beside them: lossless.
  Job pen = job(14, V, 50, 9);
  pen.params.sampling.repetition_penalty = 1.3f;
  std::vector<Job> mixed{pen, jobs[0], jobs[1], jobs[4]};
  for (Job& j : mixed) j.params.stop_token_ids = {plain[1].ids[size_t(j.params.max_tokens) / 2 % plain[1].ids.size()]};
  const auto mixed_plain = run_engine(load_row_sampling(GetParam()), config(2048, true), mixed);
  EngineConfig cfg = config(2048, true);
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 1;
  std::string m;
  const auto got = run_engine(load_row_sampling(GetParam()), cfg, mixed, &m);
  int stopped = 0;
  for (size_t i = 0; i < mixed.size(); ++i) {  // the penalised job, then the greedy ones
    EXPECT_EQ(got[i].ids, mixed_plain[i].ids) << GetParam() << " adaptive, greedy job " << i;
    EXPECT_EQ(got[i].reason, mixed_plain[i].reason) << GetParam() << " adaptive, greedy job " << i;
    stopped += got[i].reason == "stop";
  }
  std::printf("  %s adaptive with a penalised job: %.0f chained rounds, %d greedy jobs stopped by a stop id\n",
              GetParam(), metric(m, "fathom:spec_decode_chained_rounds_total"), stopped);
  // Where drafts are accepted (the oracle fixture) the chain runs with the adaptive length too; on
  // the random one MTP retires every sequence after 8 drafts, and retired sequences do not chain.
  if (std::string(GetParam()) == "qwen35_moe_mtp_oracle") {
    EXPECT_GT(metric(m, "fathom:spec_decode_chained_rounds_total"), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChainedRoundsTest, ::testing::Values("qwen35_moe", "qwen35_moe_mtp_oracle"),
                         [](const auto& info) { return std::string(info.param); });

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedSampledMtpTest, ::testing::Values("qwen35_moe", "qwen35_moe_mtp_oracle"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace fathom
