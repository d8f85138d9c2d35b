// Speculative decoding inside the serving engine (continuous batching) on the CPU engine:
// greedy outputs equal the plain engine's token for token, with requests arriving while others
// decode, chunked prefill, budget-cut drafts, penalties, stop tokens, min_tokens and preemption,
// also in fused greedy MTP rounds, and where the runner chooses tokens (device sampling);
// sampled outputs keep the exact target distribution; /metrics reports the acceptance.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "runtime/cpu_fixtures.h"
#include "runtime/engine_test_util.h"
#include "runtime/spec_test_util.h"

namespace fathom {
namespace {

using testing::Finished;
using testing::Job;
using testing::metric;
using testing::run_engine;

using testing::random_prompt;

std::unique_ptr<CpuRunner> load_runner(const std::string& name) { return testing::load_cpu_runner(name, true); }

// A greedy request for `max_tokens` tokens (eos ignored) after a random prompt.
Job greedy_job(int len, int vocab, uint32_t seed, int max_tokens) {
  Job j;
  j.prompt = random_prompt(len, vocab, seed);
  j.params.max_tokens = max_tokens;
  j.params.ignore_eos = true;
  return j;
}

// Six greedy requests of mixed prompt lengths and budgets (one of a single token), seeded from
// `seed`.
std::vector<Job> mixed_greedy_jobs(int vocab, uint32_t seed) {
  const int lens[] = {5, 17, 40, 3, 24, 9};
  const int max_tokens[] = {20, 33, 7, 1, 25, 18};
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(greedy_job(lens[i], vocab, seed + uint32_t(i), max_tokens[i]));
  return jobs;
}

// `base` with a repetition penalty (and `frequency`) for 24 tokens: the target distribution at
// each draft row includes the drafts accepted before it.
Job penalized(Job base, float frequency) {
  base.params.max_tokens = 24;
  base.params.sampling.repetition_penalty = 1.3f;
  base.params.sampling.frequency_penalty = frequency;
  return base;
}

// `base` with min_tokens 6 (stop ids before it are masked).
Job with_min_tokens(Job base) {
  base.params.min_tokens = 6;
  return base;
}

EngineConfig base_config(int64_t budget) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 512;
  return c;
}

struct Case {
  const char* fixture;
  SpecAlgorithm algorithm;
  bool device_sampling = false;  // the runner chooses tokens (RowSamplingRunner: the GPU's path)
};

std::unique_ptr<ModelRunner> load_case(const Case& c) {
  auto cpu = load_runner(c.fixture);
  if (cpu && c.device_sampling) return std::make_unique<RowSamplingRunner>(std::move(cpu));
  return cpu;
}

class EngineSpecTest : public ::testing::TestWithParam<Case> {};

TEST_P(EngineSpecTest, GreedyLosslessInContinuousBatching) {
  const Case c = GetParam();
  auto probe = load_runner(c.fixture);
  ASSERT_TRUE(probe) << c.fixture << " missing";
  const int V = probe->config().vocab_size;
  std::vector<Job> jobs = mixed_greedy_jobs(V, 100);
  // A prompt that repeats itself, so n-gram drafts are proposed and partly accepted.
  Job rep = jobs[1];
  rep.prompt.insert(rep.prompt.end(), jobs[1].prompt.begin(), jobs[1].prompt.end());
  jobs.push_back(rep);
  jobs.push_back(penalized(jobs[2], 0.4f));
  // min_tokens with stop ids taken from the plain run below.
  jobs.push_back(with_min_tokens(jobs[4]));

  for (int64_t budget : {int64_t(2048), int64_t(13)}) {  // 13: chunked prefill and budget-cut drafts
    const auto plain = run_engine(load_case(c), base_config(budget), jobs);
    // Stop at the 4th token of job 0 and (ignored before min_tokens) at the 3rd of job 8.
    std::vector<Job> jobs2 = jobs;
    jobs2[0].params.stop_token_ids = {plain[0].ids[3]};
    jobs2[8].params.stop_token_ids = {plain[8].ids[2]};
    const auto plain2 = run_engine(load_case(c), base_config(budget), jobs2);
    EXPECT_EQ(plain2[0].reason, "stop");
    for (int k = 1; k <= 4; ++k) {
      for (bool adaptive : {false, true}) {
        if (adaptive && k != 3) continue;
        EngineConfig cfg = base_config(budget);
        cfg.spec.algorithm = c.algorithm;
        cfg.spec.num_steps = k;
        cfg.spec.adaptive = adaptive;
        std::string m;
        const auto got = run_engine(load_case(c), cfg, jobs2, &m);
        for (size_t i = 0; i < jobs.size(); ++i) {
          EXPECT_EQ(got[i].ids, plain2[i].ids) << c.fixture << " K=" << k << (adaptive ? " adaptive" : "")
                                               << " budget " << budget << " job " << i;
          EXPECT_EQ(got[i].reason, plain2[i].reason) << c.fixture << " K=" << k << " job " << i;
        }
        const double drafts = metric(m, "fathom:spec_decode_num_draft_tokens_total");
        const double acc = metric(m, "fathom:spec_decode_num_accepted_tokens_total");
        std::printf("  %s %s K=%d%s budget %lld: %.0f drafts, %.0f accepted, mean accepted length %.2f\n", c.fixture,
                    spec_algorithm_name(c.algorithm), k, adaptive ? " adaptive" : "", (long long)budget, drafts, acc,
                    metric(m, "fathom:spec_decode_mean_accepted_length"));
        EXPECT_GT(drafts, 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineSpecTest,
                         ::testing::Values(Case{"qwen35_moe", SpecAlgorithm::Mtp},
                                           Case{"qwen35_moe_mtp_oracle", SpecAlgorithm::Mtp},
                                           Case{"qwen3_next", SpecAlgorithm::Ngram},
                                           Case{"qwen3_dense", SpecAlgorithm::Ngram},
                                           Case{"qwen35_moe_mtp_oracle", SpecAlgorithm::Mtp, true},
                                           Case{"qwen3_next", SpecAlgorithm::Ngram, true}),
                         [](const auto& info) {
                           return std::string(info.param.fixture) + "_" + spec_algorithm_name(info.param.algorithm) +
                                  (info.param.device_sampling ? "_device_sampling" : "");
                         });

// Preemption by recompute under a tight KV budget drops a sequence's drafts and MTP state (at
// K = 1 also its fused round's next draft); the outputs stay those of the plain engine.
TEST(EngineSpec, PreemptionKeepsOutputs) {
  auto probe = load_runner("qwen35_moe_mtp_oracle");
  ASSERT_TRUE(probe);
  const int V = probe->config().vocab_size;
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(greedy_job(20 + 7 * i, V, 300 + uint32_t(i), 40));
  EngineConfig cfg = base_config(64);
  cfg.max_model_len = 128;
  cfg.num_kv_blocks = 14;  // 224 tokens for 6 sequences of 60 to 95: preemptions
  const auto plain = run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs);
  for (int k : {1, 3}) {
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    cfg.spec.num_steps = k;
    std::string m;
    const auto got = run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs, &m);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(got[i].ids, plain[i].ids) << "K=" << k << " job " << i;
    const double preemptions = metric(m, "fathom:num_preemptions_total");
    std::printf("  K=%d: preemptions %.0f, acceptance %.3f, fused rounds %.0f\n", k, preemptions,
                metric(m, "fathom:spec_decode_draft_acceptance_rate"), metric(m, "fathom:spec_decode_fused_rounds_total"));
    EXPECT_GT(preemptions, 0) << "K=" << k;
    if (k == 1) EXPECT_GT(metric(m, "fathom:spec_decode_fused_rounds_total"), 0);
  }
}

// Fused greedy MTP rounds (runtime/engine_mtp_round.cpp: one draft a round, every sequence of
// the step a plain greedy decode): outputs equal the plain engine's token for token while fused
// rounds run, for greedy jobs alone and beside jobs the fused round cannot take (penalties,
// min_tokens before it is reached: those steps run unfused), with a stop token inside the run,
// chunked prefill and budget-cut drafts, at a fixed and the adaptive draft length.
class FusedMtpTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedMtpTest, GreedyLosslessWhileRoundsFuse) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe && probe->has_mtp()) << GetParam() << " with its MTP layer missing";
  ASSERT_TRUE(probe->supports_fused_mtp_round());
  const int V = probe->config().vocab_size;
  std::vector<Job> greedy = mixed_greedy_jobs(V, 900);
  // Prompts of their own: a repeat of a greedy job's would start from its cached prompt end right
  // away and decode beside every fusable request (no round could fuse).
  std::vector<Job> mixed = greedy;
  mixed.push_back(penalized(greedy_job(40, V, 950, 7), 0.f));
  mixed.push_back(with_min_tokens(greedy_job(24, V, 951, 25)));

  for (int64_t budget : {int64_t(2048), int64_t(13)}) {  // 13: chunked prefill and budget-cut drafts
    for (const std::vector<Job>* jobs : {&greedy, &mixed}) {
      const bool is_mixed = jobs == &mixed;
      const auto first = run_engine(load_runner(GetParam()), base_config(budget), *jobs);
      // Job 0 stops at its 4th token; the min_tokens job's 3rd token is a stop id it must ignore.
      std::vector<Job> run = *jobs;
      run[0].params.stop_token_ids = {first[0].ids[3]};
      if (is_mixed) run.back().params.stop_token_ids = {first.back().ids[2]};
      const auto plain = run_engine(load_runner(GetParam()), base_config(budget), run);
      ASSERT_EQ(plain[0].reason, "stop");
      for (bool adaptive : {false, true}) {
        EngineConfig cfg = base_config(budget);
        cfg.spec.algorithm = SpecAlgorithm::Mtp;
        cfg.spec.num_steps = 1;
        cfg.spec.adaptive = adaptive;
        std::string m;
        const auto got = run_engine(load_runner(GetParam()), cfg, run, &m);
        const std::string what = std::string(GetParam()) + (is_mixed ? " mixed" : " greedy") + " budget " +
                                 std::to_string(budget) + (adaptive ? " adaptive" : "");
        for (size_t i = 0; i < run.size(); ++i) {
          EXPECT_EQ(got[i].ids, plain[i].ids) << what << " job " << i;
          EXPECT_EQ(got[i].reason, plain[i].reason) << what << " job " << i;
        }
        const double fused = metric(m, "fathom:spec_decode_fused_rounds_total");
        std::printf("  %s: %.0f fused rounds, %.0f drafts, %.0f accepted\n", what.c_str(), fused,
                    metric(m, "fathom:spec_decode_num_draft_tokens_total"),
                    metric(m, "fathom:spec_decode_num_accepted_tokens_total"));
        // Adaptive: where drafts fail (the random fixture) sequences retire their drafting, fused
        // rounds included, so only the fixed length must have fused.
        if (!adaptive) EXPECT_GT(fused, 0) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedMtpTest, ::testing::Values("qwen35_moe", "qwen35_moe_mtp_oracle"),
                         [](const auto& info) { return std::string(info.param); });

// --speculative-disable-by-batch-size: steps with that many decoding sequences verify no drafts
// (outputs unchanged); below it, drafting goes on.
TEST(EngineSpec, DisableByBatchSize) {
  auto probe = load_runner("qwen35_moe_mtp_oracle");
  ASSERT_TRUE(probe);
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i) jobs.push_back(greedy_job(10 + i, probe->config().vocab_size, 700 + uint32_t(i), 20));
  const auto plain = run_engine(load_runner("qwen35_moe_mtp_oracle"), base_config(2048), jobs);
  for (int k : {1, 2})  // K = 1: fused rounds, which stop too
    for (int limit : {1, 64}) {
      EngineConfig cfg = base_config(2048);
      cfg.spec.algorithm = SpecAlgorithm::Mtp;
      cfg.spec.num_steps = k;
      cfg.spec.disable_by_batch_size = limit;
      std::string m;
      const auto got = run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs, &m);
      for (size_t i = 0; i < jobs.size(); ++i)
        EXPECT_EQ(got[i].ids, plain[i].ids) << "K=" << k << " limit " << limit << " job " << i;
      const double drafts = metric(m, "fathom:spec_decode_num_draft_tokens_total");
      const double fused = metric(m, "fathom:spec_decode_fused_rounds_total");
      EXPECT_EQ(metric(m, "fathom:spec_decode_batch_limit"), limit) << "K=" << k;
      EXPECT_EQ(metric(m, "fathom:spec_decode_waiting_steps_total"), 0) << "K=" << k << ": this engine never overlaps";
      if (limit == 1) {
        EXPECT_EQ(drafts, 0) << "K=" << k;
        EXPECT_EQ(fused, 0) << "K=" << k;
      } else {
        EXPECT_GT(drafts, 0) << "K=" << k;
        if (k == 1) EXPECT_GT(fused, 0);
      }
    }
  // The runner choosing tokens, so steps overlap: speculative steps run one at a time below the
  // limit (counted), none from it on.
  for (int limit : {1, 64}) {
    EngineConfig cfg = base_config(2048);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    cfg.spec.num_steps = 2;
    cfg.spec.disable_by_batch_size = limit;
    std::string m;
    const auto got = run_engine(load_case({"qwen35_moe_mtp_oracle", SpecAlgorithm::Mtp, true}), cfg, jobs, &m);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(got[i].ids, plain[i].ids) << "limit " << limit << " job " << i;
    const double waiting = metric(m, "fathom:spec_decode_waiting_steps_total");
    if (limit == 1) EXPECT_EQ(waiting, 0);
    else EXPECT_GT(waiting, 0);
  }
}

// /metrics on the oracle (drafts always right): per-position acceptance 1, mean accepted
// length K + 1, counters consistent.
TEST(EngineSpec, MetricsReportAcceptance) {
  auto probe = load_runner("qwen35_moe_mtp_oracle");
  ASSERT_TRUE(probe);
  std::vector<Job> jobs;
  for (int i = 0; i < 4; ++i)  // 41 tokens: the first, then 10 rounds of 4
    jobs.push_back(greedy_job(12 + i, probe->config().vocab_size, 500 + uint32_t(i), 41));
  EngineConfig cfg = base_config(2048);
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 3;
  std::string m;
  run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs, &m);
  const double rounds = metric(m, "fathom:spec_decode_num_drafts_total");
  const double drafts = metric(m, "fathom:spec_decode_num_draft_tokens_total");
  const double accepted = metric(m, "fathom:spec_decode_num_accepted_tokens_total");
  EXPECT_EQ(rounds, 40);
  EXPECT_EQ(drafts, 120);
  EXPECT_EQ(accepted, 120);
  for (int pos = 0; pos < 3; ++pos) {
    const std::string label = "position=\"" + std::to_string(pos) + "\"";
    EXPECT_EQ(metric(m, "fathom:spec_decode_num_accepted_tokens_per_pos_total", label), 40) << label;
    EXPECT_DOUBLE_EQ(metric(m, "fathom:spec_decode_acceptance_rate_per_pos", label), 1.0) << label;
  }
  EXPECT_DOUBLE_EQ(metric(m, "fathom:spec_decode_mean_accepted_length"), 4.0);
  EXPECT_DOUBLE_EQ(metric(m, "fathom:spec_decode_draft_acceptance_rate"), 1.0);
}

// Temperature sampling through the engine on the oracle: the joint distribution of the first
// three tokens of 2,000 sequences (one prompt, different seeds, batched by the scheduler) with
// MTP K = 2 matches the exact target distribution.
TEST(EngineSpec, SamplingMatchesTargetDistribution) {
  auto runner = load_runner("qwen35_moe_mtp_oracle");
  ASSERT_TRUE(runner);
  SamplingParams sp;
  sp.temperature = 4.0f;
  sp.top_k = 4;
  const std::vector<int32_t> prompt = random_prompt(9, runner->config().vocab_size, 77);
  const testing::Joint3 joint = testing::exact_joint3(runner->model(), prompt, sp);
  const int N = 2000;
  std::vector<Job> jobs(N);
  for (int i = 0; i < N; ++i) {
    jobs[size_t(i)].prompt = prompt;
    jobs[size_t(i)].params.max_tokens = 4;
    jobs[size_t(i)].params.ignore_eos = true;
    jobs[size_t(i)].params.sampling = sp;
    jobs[size_t(i)].params.sampling.seed = 9000 + uint64_t(i);
  }
  EngineConfig cfg = base_config(2048);
  cfg.max_num_seqs = 64;
  cfg.max_queue_len = N;
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 2;
  cfg.spec.adaptive = false;
  std::string m;
  const auto got = run_engine(std::move(runner), cfg, jobs, &m);
  std::vector<int64_t> counts(joint.cells.size(), 0);
  for (const Finished& f : got) {
    const int64_t cell = joint.cell_of(f.ids);
    ASSERT_GE(cell, 0) << "sampled a sequence of probability 0";
    ++counts[size_t(cell)];
  }
  int dof = 0;
  const double chi = testing::chi_square(joint.p, counts, N, &dof);
  const double rate = metric(m, "fathom:spec_decode_draft_acceptance_rate");
  std::printf("  engine, oracle T=4 top-k 4, %d sequences: chi2 %.2f (dof %d, 99.9%% limit %.2f), acceptance %.3f\n",
              N, chi, dof, testing::chi2_999(dof), rate);
  EXPECT_LT(chi, testing::chi2_999(dof));
  EXPECT_GT(rate, 0.3);
  EXPECT_LT(rate, 0.95);
}

}  // namespace
}  // namespace fathom
