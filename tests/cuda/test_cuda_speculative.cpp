// Speculative decoding on the CUDA engine: greedy outputs equal plain decoding's with drafts of
// every kind, fused MTP rounds (greedy and sampled, chained and unchained) equal unfused ones, and
// sampled drafts drawn from the MTP layer's distribution (run on a GPU machine).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine_compare.h"
#include "model/cuda/cuda_runner.h"
#include "model/model_runner.h"
#include "runtime/engine_test_util.h"
#include "runtime/offline_generate.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using namespace engine_compare;
// Speculative decoding on the CUDA engine (MTP drafts on the MTP fixtures, n-grams elsewhere):
// greedy outputs equal plain greedy outputs of the same engine token for token, in a batch of
// mixed lengths, and the oracle fixture accepts nearly every MTP draft.
TEST(CudaSpeculative, LosslessInRaggedBatches) {
  struct Case {
    const char* fixture;
    SpecAlgorithm algorithm;
  };
  for (const Case& c : {Case{"qwen35_moe", SpecAlgorithm::Mtp}, Case{"qwen35_moe_nvfp4", SpecAlgorithm::Mtp},
                        Case{"qwen35_moe_mtp_oracle", SpecAlgorithm::Mtp}, Case{"qwen3_next", SpecAlgorithm::Ngram},
                        Case{"qwen3_dense", SpecAlgorithm::Ngram}}) {
    const fs::path dir = fixtures_dir() / c.fixture;
    auto runner = open_model(dir.string(), "cuda", c.algorithm == SpecAlgorithm::Mtp);
    const int V = runner->config().vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {random_prompt(5, V, 11), random_prompt(17, V, 12),
                                                       random_prompt(40, V, 13)};
    GenerateOptions opt;
    opt.max_new_tokens = 24;
    const auto plain = generate_batch(*runner, prompts, opt);
    for (int k = 1; k <= 4; ++k) {
      SpecOptions spec;
      spec.algorithm = c.algorithm;
      spec.num_steps = k;
      const auto got = generate_batch(*runner, prompts, opt, spec);
      int64_t drafted = 0, accepted = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].token_ids, plain[i].token_ids) << c.fixture << " K=" << k << " prompt " << i;
        drafted += got[i].spec.draft_tokens;
        accepted += got[i].spec.accepted_tokens;
      }
      const double rate = drafted ? double(accepted) / double(drafted) : 0.0;
      std::printf("  %s %s K=%d: acceptance %.3f (%lld of %lld drafts)\n", c.fixture,
                  spec_algorithm_name(c.algorithm), k, rate, static_cast<long long>(accepted),
                  static_cast<long long>(drafted));
      if (std::string(c.fixture) == "qwen35_moe_mtp_oracle") {
        EXPECT_GE(rate, 0.9);
      }
    }
  }
}

// A long greedy run on a random-weight fixture (near-tied logits every few tokens): fixed-K
// MTP speculation must still equal plain decoding token for token, which needs every op to give
// a token the same bits in a verify step (K + 1 tokens) as in a decode step (1 token).
TEST(CudaSpeculative, LongRandomRunLossless) {
  const fs::path dir = fixtures_dir() / "qwen35_moe";
  auto runner = open_model(dir.string(), "cuda", /*with_mtp=*/true);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(16, runner->config().vocab_size, 21)};
  GenerateOptions opt;
  opt.max_new_tokens = 256;
  const auto plain = generate_batch(*runner, prompts, opt);
  for (int k : {1, 3}) {
    SpecOptions spec;
    spec.algorithm = SpecAlgorithm::Mtp;
    spec.num_steps = k;
    spec.adaptive = false;
    const auto got = generate_batch(*runner, prompts, opt, spec);
    size_t same = 0;
    while (same < got[0].token_ids.size() && got[0].token_ids[same] == plain[0].token_ids[same]) ++same;
    std::printf("  qwen35_moe K=%d, 256 tokens: %zu equal before the first difference\n", k, same);
    EXPECT_EQ(got[0].token_ids, plain[0].token_ids) << "K=" << k;
  }
}

// The serving engine on the CUDA runner with speculative decoding: requests arriving while
// others decode, drafts verified in the shared forward (decode steps without drafts still replay
// CUDA graphs); greedy outputs equal the plain engine's.
TEST(CudaSpeculative, EngineContinuousBatchingLossless) {
  struct Case {
    const char* fixture;
    SpecAlgorithm algorithm;
  };
  for (const Case& c : {Case{"qwen35_moe", SpecAlgorithm::Mtp}, Case{"qwen35_moe_mtp_oracle", SpecAlgorithm::Mtp},
                        Case{"qwen3_dense", SpecAlgorithm::Ngram}}) {
    const fs::path dir = fixtures_dir() / c.fixture;
    EngineOptions eo;
    eo.max_seqs = 8;
    eo.max_model_len = 512;
    auto open = [&] { return open_model(dir.string(), "cuda", c.algorithm == SpecAlgorithm::Mtp, eo); };
    const int V = open()->config().vocab_size;
    std::vector<testing::Job> jobs;
    const int lens[] = {5, 17, 40, 3, 24, 9};
    const int max_tokens[] = {20, 33, 7, 1, 25, 18};
    for (int i = 0; i < 6; ++i) {
      testing::Job j;
      j.prompt = random_prompt(lens[i], V, 100 + uint32_t(i));
      j.prompt.insert(j.prompt.end(), j.prompt.begin(), j.prompt.end());  // repeats: n-gram drafts too
      j.params.max_tokens = max_tokens[i];
      j.params.ignore_eos = true;
      jobs.push_back(j);
    }
    EngineConfig cfg;
    cfg.max_num_seqs = 8;
    cfg.max_model_len = 512;
    const auto plain = testing::run_engine(open(), cfg, jobs);
    for (int k : {1, 3}) {
      cfg.spec.algorithm = c.algorithm;
      cfg.spec.num_steps = k;
      cfg.spec.adaptive = false;
      std::string m;
      const auto got = testing::run_engine(open(), cfg, jobs, &m);
      for (size_t i = 0; i < jobs.size(); ++i)
        EXPECT_EQ(got[i].ids, plain[i].ids) << c.fixture << " K=" << k << " job " << i;
      std::printf("  engine %s %s K=%d: acceptance %.3f, accept length %.2f\n", c.fixture,
                  spec_algorithm_name(c.algorithm), k, testing::metric(m, "fathom:spec_decode_draft_acceptance_rate"),
                  testing::metric(m, "fathom:spec_decode_mean_accepted_length"));
    }
    // At disable_by_batch_size the steps run overlapped without drafts (a sequence that runs one
    // drafts no more); below it, speculative steps again, and arrivals draft: the first three
    // jobs draft until the fourth arrives, the fifth after the fourth (one token) has ended.
    // Still the plain engine's outputs.
    // The automatic limit (-1) starts at 2: the first arrivals draft only while alone.
    cfg.spec.num_steps = 1;
    cfg.spec.adaptive = true;
    for (int limit : {4, -1}) {
      cfg.spec.disable_by_batch_size = limit;
      std::string m;
      const auto limited = testing::run_engine(open(), cfg, jobs, &m);
      for (size_t i = 0; i < jobs.size(); ++i)
        EXPECT_EQ(limited[i].ids, plain[i].ids) << c.fixture << " disable_by_batch_size " << limit << ", job " << i;
      std::printf("  engine %s %s K=1, disable_by_batch_size %d: %.0f drafts\n", c.fixture,
                  spec_algorithm_name(c.algorithm), limit, testing::metric(m, "fathom:spec_decode_num_draft_tokens_total"));
    }
    cfg.spec.disable_by_batch_size = 0;
  }
}

// The CUDA engine over an MTP fixture as the fused-round tests open it: 8 sequences of up to 512
// tokens, decode-side kernels that keep a token's bits in verify steps of any size; with
// sampled_drafts, the drafts' distributions set aside at start (else at the first such round).
std::unique_ptr<ModelRunner> open_fused_round_engine(const char* fixture, bool sampled_drafts = false) {
  EngineOptions eo;
  eo.max_seqs = 8;
  eo.max_model_len = 512;
  eo.backends.speculative = true;
  eo.sampled_drafts = sampled_drafts;
  return open_model((fixtures_dir() / fixture).string(), "cuda", true, eo);
}

// The engine the fused-round tests run over open_fused_round_engine: as many sequences at once,
// MTP K = 1 with the adaptive length off (so that sampled rounds chain).
EngineConfig fused_round_config() {
  EngineConfig cfg;
  cfg.max_num_seqs = 8;
  cfg.max_model_len = 512;
  cfg.spec.algorithm = SpecAlgorithm::Mtp;
  cfg.spec.num_steps = 1;
  cfg.spec.adaptive = false;
  return cfg;
}

// n greedy jobs, ignoring eos: job i has a random prompt of len0 + len_step * i tokens (seed
// seed0 + i) and max_tokens max0 + max_step * i.
std::vector<testing::Job> random_jobs(int n, int V, int len0, int len_step, uint32_t seed0, int max0, int max_step) {
  std::vector<testing::Job> jobs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    jobs[size_t(i)].prompt = random_prompt(len0 + len_step * i, V, seed0 + uint32_t(i));
    jobs[size_t(i)].params.max_tokens = max0 + max_step * i;
    jobs[size_t(i)].params.ignore_eos = true;
  }
  return jobs;
}

// Fused MTP rounds with device sampling: sampled requests (temperature, top-p, top-k, logprobs, a
// penalty) fuse too, their drafts verified by the device sampler inside the round. Greedy jobs stay
// lossless against plain decoding; every job's output equals the unfused rounds' (the same drafts,
// verified with the same random numbers, as decode-side kernels keep a row's bits in verify steps
// of any size); sampled jobs alone run fused rounds, chained, with the unfused rounds' tokens.
TEST(CudaSpeculative, SampledFusedRoundsEqualUnfusedRounds) {
  for (const char* fixture : {"qwen35_moe", "qwen35_moe_mtp_oracle"}) {
    auto open = [&] { return open_fused_round_engine(fixture); };
    const int V = open()->config().vocab_size;
    std::vector<testing::Job> jobs = random_jobs(6, V, 6, 9, 800, 20, 1);
    for (size_t i = 3; i < jobs.size(); ++i) {
      SamplingParams& sp = jobs[i].params.sampling;
      sp.temperature = 0.7f + 0.2f * float(i - 3);
      sp.top_p = i == 4 ? 0.9f : 1.f;
      sp.top_k = i == 5 ? 30 : 0;
      sp.seed = 60 + i;
    }
    jobs[2].params.logprobs = 3;
    jobs[5].params.logprobs = 2;
    jobs[5].params.sampling.presence_penalty = 0.5f;
    EngineConfig cfg = fused_round_config();
    cfg.spec.algorithm = SpecAlgorithm::None;
    const auto plain = testing::run_engine(open(), cfg, jobs);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    std::string m;
    const auto fused = testing::run_engine(open(), cfg, jobs, &m);
    cfg.fused_mtp_rounds = false;
    const auto unfused = testing::run_engine(open(), cfg, jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i < 3) EXPECT_EQ(fused[i].ids, plain[i].ids) << fixture << " greedy job " << i;
      EXPECT_EQ(fused[i].ids, unfused[i].ids) << fixture << " job " << i;
      EXPECT_EQ(fused[i].logprobs.size(), fused[i].ids.size() * (jobs[i].params.logprobs >= 0)) << fixture << " job " << i;
    }
    // Sampled jobs alone, all there from the start and without the penalty (which holds chains):
    // their rounds chain, and give the unfused rounds' tokens.
    std::vector<testing::Job> sampled(jobs.begin() + 3, jobs.end());
    sampled.back().params.sampling.presence_penalty = 0.f;
    const auto sampled_unfused = testing::run_burst(open(), cfg, sampled, nullptr);
    cfg.fused_mtp_rounds = true;
    std::string ms;
    const auto sampled_chained = testing::run_burst(open(), cfg, sampled, &ms);
    for (size_t i = 0; i < sampled.size(); ++i)
      EXPECT_EQ(sampled_chained[i].ids, sampled_unfused[i].ids) << fixture << " sampled job " << i << " alone";
    const double rounds = testing::metric(ms, "fathom:spec_decode_fused_rounds_total"),
                 chained = testing::metric(ms, "fathom:spec_decode_chained_rounds_total");
    std::printf("  %s: %.0f fused rounds with greedy and sampled jobs, %.0f with sampled jobs alone (%.0f chained), "
                "acceptance %.3f\n",
                fixture, testing::metric(m, "fathom:spec_decode_fused_rounds_total"), rounds, chained,
                testing::metric(ms, "fathom:spec_decode_draft_acceptance_rate"));
    EXPECT_GT(rounds, 0) << fixture;
    EXPECT_GT(chained, 0) << fixture << ": sampled rounds chain (the adaptive length is off)";
  }
}

// Sampled drafts (--speculative-sampled-drafts) in the GPU's fused rounds: a sampled request's
// MTP draft drawn on the device from the MTP layer's distribution, its q kept in its state slot
// and the next round's verify reading it (chained: found on the device; unchained: by the draft's
// position and token, the same q). Greedy jobs stay lossless; seeded sampled jobs repeat
// exactly when their rounds run alike (all jobs submitted before the engine starts: one prefill,
// then fused rounds only; a draft made outside a fused round is the MTP argmax, verified by the
// deterministic rule, so with arrivals mid-run the tokens depend on the batch); on the oracle
// fixture (its MTP layer close to the model) drafts are accepted far more often than the argmax
// drafts (the CPU engine: 0.984 against 0.684 at temperature 3, top-k 8).
TEST(CudaSpeculative, SampledDraftsAreAcceptedMoreOften) {
  for (const char* fixture : {"qwen35_moe", "qwen35_moe_mtp_oracle"}) {
    auto open = [&] { return open_fused_round_engine(fixture); };
    const int V = open()->config().vocab_size;
    std::vector<testing::Job> jobs = random_jobs(8, V, 6, 9, 810, 32, 1);
    for (size_t i = 2; i < jobs.size(); ++i) {
      SamplingParams& sp = jobs[i].params.sampling;
      sp.temperature = 3.f;
      sp.top_k = 8;
      sp.seed = 90 + i;
    }
    EngineConfig cfg = fused_round_config();
    cfg.spec.algorithm = SpecAlgorithm::None;
    const auto plain = testing::run_engine(open(), cfg, jobs);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    std::string m_argmax, m_drawn, m_again;
    testing::run_burst(open(), cfg, jobs, &m_argmax);
    cfg.spec.sampled_drafts = true;
    const auto drawn = testing::run_burst(open(), cfg, jobs, &m_drawn);
    // Again with the q buffers set aside when the engine opens: 2 rows a sequence and a q per
    // state slot (8 sequences + the pad slot), the same tokens.
    std::unique_ptr<ModelRunner> reserved = open_fused_round_engine(fixture, /*sampled_drafts=*/true);
    const auto* cuda_runner = dynamic_cast<const cuda::CudaRunner*>(reserved.get());
    ASSERT_NE(cuda_runner, nullptr) << fixture;
    EXPECT_EQ(cuda_runner->footprint().draft_bytes, int64_t(2 * 8 + 9) * V * 4) << fixture;
    const auto again = testing::run_burst(std::move(reserved), cfg, jobs, &m_again);
    cfg.chained_mtp_rounds = false;
    std::string m_unchained;
    const auto unchained = testing::run_burst(open(), cfg, jobs, &m_unchained);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i < 2) EXPECT_EQ(drawn[i].ids, plain[i].ids) << fixture << " greedy job " << i;
      EXPECT_EQ(drawn[i].ids, again[i].ids) << fixture << " job " << i;
      EXPECT_EQ(drawn[i].ids, unchained[i].ids) << fixture << " job " << i << ", unchained rounds";
      EXPECT_EQ(drawn[i].ids.size(), size_t(jobs[i].params.max_tokens)) << fixture << " job " << i;
    }
    const double a0 = testing::metric(m_argmax, "fathom:spec_decode_draft_acceptance_rate"),
                 a1 = testing::metric(m_drawn, "fathom:spec_decode_draft_acceptance_rate");
    std::printf("  %s: acceptance argmax drafts %.3f, drawn %.3f (%.0f fused rounds, %.0f chained; unchained: %.3f)\n",
                fixture, a0, a1, testing::metric(m_drawn, "fathom:spec_decode_fused_rounds_total"),
                testing::metric(m_drawn, "fathom:spec_decode_chained_rounds_total"),
                testing::metric(m_unchained, "fathom:spec_decode_draft_acceptance_rate"));
    EXPECT_GT(testing::metric(m_drawn, "fathom:spec_decode_fused_rounds_total"), 0) << fixture;
    EXPECT_GT(testing::metric(m_drawn, "fathom:spec_decode_chained_rounds_total"), 0) << fixture;
    if (std::string(fixture) == "qwen35_moe_mtp_oracle") EXPECT_GT(a1, a0 + 0.1) << fixture;
  }
}

// Chained rounds (greedy): round N + 1 queued from round N's outcome on the device (tokens,
// positions, KV slots, the linear-attention state where N's draft was refused) before N is read.
// Outputs equal plain decoding's and the unchained rounds', with the adaptive length off and on,
// arrivals and ends breaking chains, and a logprobs job (not chained on the GPU) among them.
TEST(CudaSpeculative, ChainedRoundsEqualUnchainedRounds) {
  for (const char* fixture : {"qwen35_moe", "qwen35_moe_mtp_oracle"}) {
    auto open = [&] { return open_fused_round_engine(fixture); };
    const int V = open()->config().vocab_size;
    std::vector<testing::Job> jobs = random_jobs(7, V, 4, 11, 900, 9, 7);
    jobs[6].params.logprobs = 2;  // sampling rows: no chain while it runs (short, so the others chain after it)
    jobs[6].params.max_tokens = 5;
    EngineConfig cfg;
    cfg.max_num_seqs = 8;
    cfg.max_model_len = 512;
    const auto plain = testing::run_engine(open(), cfg, jobs);
    cfg.spec.algorithm = SpecAlgorithm::Mtp;
    cfg.spec.num_steps = 1;
    for (bool adaptive : {false, true}) {
      cfg.spec.adaptive = adaptive;
      cfg.chained_mtp_rounds = true;
      std::string m, mu;
      const auto chained = testing::run_engine(open(), cfg, jobs, &m);
      cfg.chained_mtp_rounds = false;
      const auto unchained = testing::run_engine(open(), cfg, jobs, &mu);
      for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(chained[i].ids, plain[i].ids) << fixture << (adaptive ? " adaptive" : "") << " job " << i;
        EXPECT_EQ(unchained[i].ids, plain[i].ids) << fixture << (adaptive ? " adaptive" : "") << " job " << i;
      }
      const double rounds = testing::metric(m, "fathom:spec_decode_chained_rounds_total");
      std::printf("  %s%s: %.0f chained of %.0f fused rounds, acceptance %.3f (unchained: %.0f fused rounds)\n", fixture,
                  adaptive ? " adaptive" : "", rounds, testing::metric(m, "fathom:spec_decode_fused_rounds_total"),
                  testing::metric(m, "fathom:spec_decode_draft_acceptance_rate"),
                  testing::metric(mu, "fathom:spec_decode_fused_rounds_total"));
      if (!adaptive) {
        EXPECT_GT(rounds, 0) << fixture;
      }
      EXPECT_EQ(testing::metric(mu, "fathom:spec_decode_chained_rounds_total"), 0) << fixture;
    }
  }
}

}  // namespace
}  // namespace fathom
