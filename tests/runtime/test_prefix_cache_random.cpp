// Prefix caching under random workloads (issue 37): prompts drawn from a pool that grows as it
// goes (exact repeats, extensions, truncations, one token changed, unrelated prompts), lengths
// around the 16-token block, greedy and seeded sampling, logprobs, random max_tokens; random
// engine configurations (token budget, cache room from about one snapshot to plenty, the host
// tier, the snapshot interval, MTP, tensor-parallel CPU ranks, the runner choosing tokens as on
// the GPU: RowSamplingRunner, overlapped steps). Half the requests arrive together, the rest while
// the first decodes. Every output, finish reason and logprob equals the uncached engine's; with MTP the
// requests are greedy without logprobs (its sampled outputs are lossless in distribution, not
// draw for draw, and its verify rows are not computed as plain decoding's) and equal plain
// decoding's.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "runtime/engine_test_util.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::Finished;
using testing::Job;
using testing::metric;
using testing::run_engine;

struct Scenario {
  EngineConfig cfg;
  std::vector<Job> jobs;
  std::string what;
};

// A scenario from `seed`; `snapshot_bytes`: one snapshot of a 64-token prefix (sizes the cache).
Scenario random_scenario(uint32_t seed, int vocab, int64_t snapshot_bytes, bool mtp) {
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto tokens = [&](int n) {
    std::vector<int32_t> t(size_t(n), 0);
    for (int32_t& x : t) x = 2 + int32_t(rng() % uint32_t(vocab - 2));
    return t;
  };
  Scenario s;
  EngineConfig& c = s.cfg;
  c.max_num_seqs = 8;
  c.max_model_len = 512;
  c.max_num_batched_tokens = std::vector<int64_t>{7, 13, 2048}[size_t(uni(0, 2))];
  c.prefix_cache_interval = std::vector<int64_t>{0, 16, 32}[size_t(uni(0, 2))];
  c.prefix_cache_min_shared = std::vector<int64_t>{16, 256}[size_t(uni(0, 1))];
  c.prefix_cache_bytes = int64_t(double(snapshot_bytes) * std::vector<double>{1.5, 4, 1000}[size_t(uni(0, 2))]);
  c.prefix_cache_host_bytes = uni(0, 1) ? snapshot_bytes * 1000 : 0;
  if (mtp) {
    c.spec.algorithm = SpecAlgorithm::Mtp;
    c.spec.num_steps = uni(1, 2);
  }
  std::vector<std::vector<int32_t>> pool;
  for (int i = 0; i < 3; ++i) pool.push_back(tokens(uni(1, 70)));
  for (int j = 0; j < 12; ++j) {
    std::vector<int32_t> p = pool[size_t(uni(0, int(pool.size()) - 1))];
    switch (uni(0, 4)) {
      case 0: break;  // an exact repeat
      case 1: {       // longer
        const std::vector<int32_t> more = tokens(uni(1, 40));
        p.insert(p.end(), more.begin(), more.end());
        break;
      }
      case 2: p.resize(size_t(uni(1, int(p.size())))); break;  // a prefix of it
      case 3: p[size_t(uni(0, int(p.size()) - 1))] = 2 + int32_t(rng() % uint32_t(vocab - 2)); break;
      default: p = tokens(uni(1, 90));  // unrelated
    }
    if (uni(0, 2) == 0) pool.push_back(p);
    Job job;
    job.prompt = p;
    job.params.max_tokens = uni(1, 10);
    job.params.ignore_eos = true;
    if (!mtp && uni(0, 3) == 0) job.params.logprobs = uni(0, 3);
    if (!mtp && uni(0, 3) == 0) {
      job.params.sampling.temperature = 0.8f;
      job.params.sampling.seed = uint64_t(uni(1, 1000));
    }
    s.jobs.push_back(std::move(job));
  }
  s.what = "seed " + std::to_string(seed) + " budget " + std::to_string(c.max_num_batched_tokens) + " interval " +
           std::to_string(c.prefix_cache_interval) + " min shared " + std::to_string(c.prefix_cache_min_shared) +
           " cache " + std::to_string(c.prefix_cache_bytes) + " host " + std::to_string(c.prefix_cache_host_bytes) +
           (mtp ? " MTP K=" + std::to_string(c.spec.num_steps) : "");
  return s;
}

int64_t one_snapshot_bytes(CpuRunner& runner) {
  const SequenceId s = runner.add_sequence();
  std::vector<int32_t> p(64, 5);
  runner.forward(std::vector<ForwardStep>{{s, p}});
  const int64_t snap = runner.save_snapshot(s);
  const int64_t bytes = runner.snapshot_bytes(snap);
  runner.drop_snapshot(snap);
  runner.remove_sequence(s);
  return bytes;
}

class PrefixCacheRandom : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheRandom, OutputsEqualWithoutCaching) {
  const fs::path dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "config.json")) << GetParam() << " missing";
  const bool has_mtp = CpuRunner::open(dir, true)->has_mtp();
  auto probe = CpuRunner::open(dir, false);
  const int vocab = probe->config().vocab_size;
  const int64_t one = one_snapshot_bytes(*probe);
  double hits = 0, host_hits = 0;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    const bool mtp = has_mtp && seed % 3 == 0;
    const int ranks = seed % 4 == 1 ? 2 : 1;  // tensor-parallel CPU ranks, both runs alike
    const bool device = seed % 2 == 0;        // device sampling, both runs alike
    auto open = [&](bool with_mtp) -> std::unique_ptr<ModelRunner> {
      auto cpu = CpuRunner::open(dir, with_mtp, ranks);
      if (device) return std::make_unique<RowSamplingRunner>(std::move(cpu));
      return cpu;
    };
    Scenario s = random_scenario(seed, vocab, one, mtp);
    s.what += " ranks " + std::to_string(ranks) + (device ? " device sampling" : "");
    EngineConfig uncached = s.cfg;
    uncached.enable_prefix_caching = false;
    uncached.spec = {};
    const std::vector<Finished> plain = run_engine(open(false), uncached, s.jobs);
    std::string m;
    const std::vector<Finished> got = run_engine(open(mtp), s.cfg, s.jobs, &m);
    for (size_t i = 0; i < s.jobs.size(); ++i) {
      EXPECT_EQ(got[i].ids, plain[i].ids) << GetParam() << " " << s.what << " job " << i;
      EXPECT_EQ(got[i].reason, plain[i].reason) << GetParam() << " " << s.what << " job " << i;
      ASSERT_EQ(got[i].logprobs.size(), plain[i].logprobs.size()) << s.what << " job " << i;
      for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
        EXPECT_EQ(got[i].logprobs[t].logprob, plain[i].logprobs[t].logprob) << s.what << " job " << i;
        EXPECT_EQ(got[i].logprobs[t].top, plain[i].logprobs[t].top) << s.what << " job " << i;
      }
    }
    hits += metric(m, "fathom:prefix_cache_hits_total");
    host_hits += std::max(0.0, metric(m, "fathom:external_prefix_cache_hits_total"));
  }
  std::printf("  %s: %.0f prompt tokens from the cache over the scenarios, %.0f of them from the host tier\n",
              GetParam(), hits, host_hits);
  EXPECT_GT(hits, 0);  // the scenarios do exercise the cache
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheRandom, ::testing::Values("qwen35_moe", "qwen3_next", "qwen3_dense"));

}  // namespace
}  // namespace fathom
