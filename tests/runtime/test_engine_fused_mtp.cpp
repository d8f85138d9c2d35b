// Fused greedy MTP rounds in the serving engine (runtime/engine_mtp_round.cpp) on the CPU engine:
// with one draft a round, greedy outputs equal the plain engine's token for token while fused
// rounds run (the /metrics counter), including with requests the fused round cannot take beside
// them in the batch (penalties, min_tokens before it is reached: those steps run unfused), stop
// tokens inside accepted drafts, chunked prefill with budget-cut drafts, the adaptive draft
// length, and preemption.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/cpu_runner.h"
#include "runtime/engine.h"
#include "golden_reader.h"
#include "runtime/engine_test_util.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::Job;
using testing::metric;
using testing::run_engine;

std::unique_ptr<CpuRunner> load_runner(const std::string& name) {
  const fs::path dir = testing::fixtures_dir() / name;
  if (!fs::exists(dir / "config.json")) return nullptr;
  return std::make_unique<CpuRunner>(HybridModel::load(dir, /*with_mtp=*/true));
}

Job greedy_job(int len, int vocab, uint32_t seed, int max_tokens) {
  std::mt19937 rng(seed);
  Job j;
  for (int i = 0; i < len; ++i) j.prompt.push_back(2 + int32_t(rng() % uint32_t(vocab - 2)));
  j.params.max_tokens = max_tokens;
  j.params.ignore_eos = true;
  return j;
}

EngineConfig base_config(int64_t budget) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 512;
  return c;
}

EngineConfig mtp_config(int64_t budget, bool adaptive) {
  EngineConfig c = base_config(budget);
  c.spec.algorithm = SpecAlgorithm::Mtp;
  c.spec.num_steps = 1;
  c.spec.adaptive = adaptive;
  return c;
}

class FusedMtpTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FusedMtpTest, GreedyLosslessWhileRoundsFuse) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe && probe->has_mtp()) << GetParam() << " with its MTP layer missing";
  ASSERT_TRUE(probe->supports_fused_mtp_round());
  const int V = probe->config().vocab_size;
  const int lens[] = {5, 17, 40, 3, 24, 9};
  const int max_tokens[] = {20, 33, 7, 1, 25, 18};
  std::vector<Job> greedy;
  for (int i = 0; i < 6; ++i) greedy.push_back(greedy_job(lens[i], V, 900 + uint32_t(i), max_tokens[i]));
  // The same greedy jobs beside two the fused round cannot take: penalties, and min_tokens with
  // stop ids (masked before its 6th token).
  std::vector<Job> mixed = greedy;
  Job pen = greedy[2];
  pen.params.max_tokens = 24;
  pen.params.sampling.repetition_penalty = 1.3f;
  mixed.push_back(pen);
  Job mt = greedy[4];
  mt.params.min_tokens = 6;
  mixed.push_back(mt);

  for (int64_t budget : {int64_t(2048), int64_t(13)}) {  // 13: chunked prefill and budget-cut drafts
    for (std::vector<Job>* jobs : {&greedy, &mixed}) {
      const bool is_mixed = jobs == &mixed;
      const auto plain0 = run_engine(load_runner(GetParam()), base_config(budget), *jobs);
      // A stop token inside the run: job 0 stops at its 4th token; the min_tokens job at its 3rd
      // would, but that is before its min_tokens.
      std::vector<Job> run = *jobs;
      run[0].params.stop_token_ids = {plain0[0].ids[3]};
      if (is_mixed) run.back().params.stop_token_ids = {plain0.back().ids[2]};
      const auto plain = run_engine(load_runner(GetParam()), base_config(budget), run);
      ASSERT_EQ(plain[0].reason, "stop");
      for (bool adaptive : {false, true}) {
        std::string m;
        const auto got = run_engine(load_runner(GetParam()), mtp_config(budget, adaptive), run, &m);
        const std::string what = std::string(GetParam()) + (is_mixed ? " mixed" : " greedy") + " budget " +
                                 std::to_string(budget) + (adaptive ? " adaptive" : "");
        for (size_t i = 0; i < run.size(); ++i) {
          EXPECT_EQ(got[i].ids, plain[i].ids) << what << " job " << i;
          EXPECT_EQ(got[i].reason, plain[i].reason) << what << " job " << i;
        }
        const double fused = metric(m, "fathom:spec_decode_fused_rounds_total");
        const double drafts = metric(m, "fathom:spec_decode_num_draft_tokens_total");
        std::printf("  %s: %.0f fused rounds, %.0f drafts, %.0f accepted\n", what.c_str(), fused, drafts,
                    metric(m, "fathom:spec_decode_num_accepted_tokens_total"));
        // Adaptive: a model whose drafts fail (the random fixture) retires its sequences' drafting,
        // fused rounds included, so only the fixed length must have fused.
        if (!adaptive) EXPECT_GT(fused, 0) << what;
        EXPECT_GT(drafts, 0) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FusedMtpTest, ::testing::Values("qwen35_moe", "qwen35_moe_mtp_oracle"),
                         [](const auto& info) { return std::string(info.param); });

// Preemption by recompute under a tight KV budget: a preempted sequence loses its MTP state and
// its next draft, and comes back through the speculator; outputs stay the plain engine's.
TEST(FusedMtp, PreemptionKeepsOutputs) {
  auto probe = load_runner("qwen35_moe_mtp_oracle");
  ASSERT_TRUE(probe);
  const int V = probe->config().vocab_size;
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(greedy_job(20 + 7 * i, V, 300 + uint32_t(i), 40));
  EngineConfig cfg = base_config(64);
  cfg.max_model_len = 128;
  cfg.num_kv_blocks = 14;  // 224 tokens for 6 sequences of 60 to 95: preemptions
  const auto plain = run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs);
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 1;
  std::string m;
  const auto got = run_engine(load_runner("qwen35_moe_mtp_oracle"), cfg, jobs, &m);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(got[i].ids, plain[i].ids) << "job " << i;
  EXPECT_GT(metric(m, "fathom:num_preemptions_total"), 0);
  EXPECT_GT(metric(m, "fathom:spec_decode_fused_rounds_total"), 0);
}

}  // namespace
}  // namespace fathom
