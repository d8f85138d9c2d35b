// The prefix-cache engine tests' helpers (test_prefix_cache*.cpp): fixtures on the CPU engine,
// jobs, engines driven one request at a time or in a burst, the exact-repeat workload and the
// comparison of finished requests.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "runtime/engine.h"
#include "runtime/cpu_fixtures.h"
#include "runtime/engine_test_util.h"

namespace fathom::prefix_test {

using testing::Job;
using testing::finished_of;
using testing::run_burst;

inline std::unique_ptr<CpuRunner> load_runner(const std::string& name, bool mtp = false) {
  return testing::load_cpu_runner(name, mtp);
}

inline std::vector<int32_t> random_tokens(int len, int vocab, uint32_t seed) {
  return testing::random_prompt(len, vocab, seed);
}

inline Job greedy(std::vector<int32_t> prompt, int max_tokens) {
  Job j;
  j.prompt = std::move(prompt);
  j.params.max_tokens = max_tokens;
  j.params.ignore_eos = true;
  return j;
}

inline EngineConfig config(int64_t budget, bool caching) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.max_model_len = 512;
  c.enable_prefix_caching = caching;
  c.prefix_cache_interval = 32;
  c.prefix_cache_min_shared = 16;  // the fixtures' prompts are short
  return c;
}

inline std::vector<int32_t> tokens_of(OutputChannel& ch) { return finished_of(ch).ids; }

// Submits one job to a running engine; its output arrives on the channel returned.
inline std::shared_ptr<OutputChannel> submit_job(Engine& engine, const Job& j) {
  auto ch = std::make_shared<OutputChannel>();
  RequestSpec s;
  s.group = engine.new_group_id();
  s.prompt = j.prompt;
  s.params = j.params;
  s.out = ch;
  EXPECT_EQ(engine.submit({s}), Engine::SubmitResult::Ok);
  return ch;
}

// Jobs one after another (each submitted when the one before has finished): the cache's inserts
// and evictions happen in a fixed order.
inline std::vector<testing::Finished> run_one_by_one_finished(std::unique_ptr<ModelRunner> runner,
                                                              const EngineConfig& cfg, const std::vector<Job>& jobs,
                                                              std::string* metrics) {
  Engine engine(std::move(runner), nullptr, cfg);
  engine.start();
  std::vector<testing::Finished> out;
  for (const Job& j : jobs) out.push_back(finished_of(*submit_job(engine, j)));
  engine.shutdown();
  if (metrics) *metrics = engine.render_metrics("fathom:", "m");
  return out;
}

inline std::vector<std::vector<int32_t>> run_one_by_one(std::unique_ptr<ModelRunner> runner, const EngineConfig& cfg,
                                                        const std::vector<Job>& jobs, std::string* metrics) {
  std::vector<std::vector<int32_t>> ids;
  for (testing::Finished& f : run_one_by_one_finished(std::move(runner), cfg, jobs, metrics))
    ids.push_back(std::move(f.ids));
  return ids;
}

// Exact repeats of any length (issue 37), one by one: where a prompt's prefill ended its state is
// cached with the last position's logits, so the same prompt again starts there with no forward
// (its first token chosen from those logits) and a longer prompt that begins with it prefills
// only the rest. Lengths around the 16-token block; repeats asking for logprobs, sampling with a
// seed, ending at their first token, and failing there (an injected sampling fault).
inline std::vector<Job> repeat_jobs(int vocab) {
  std::map<int, std::vector<int32_t>> prompt;
  int32_t first = 2;
  for (int len : {1, 5, 15, 16, 17, 40}) {
    prompt[len] = random_tokens(len, vocab, 60 + uint32_t(len));
    prompt[len][0] = first++;  // no prompt begins with another by chance
  }
  std::vector<Job> jobs;
  for (const auto& [len, p] : prompt) {
    jobs.push_back(greedy(p, 6));
    jobs.push_back(greedy(p, 6));
  }
  std::vector<int32_t> longer = prompt[17];
  for (int32_t t : random_tokens(6, vocab, 77)) longer.push_back(t);
  jobs.push_back(greedy(longer, 5));
  Job logprobs = greedy(prompt[40], 4);
  logprobs.params.logprobs = 3;
  jobs.push_back(logprobs);
  Job sampled = greedy(prompt[16], 8);
  sampled.params.sampling.temperature = 0.9f;
  sampled.params.sampling.top_k = 20;
  sampled.params.sampling.seed = 11;
  sampled.params.sampling.presence_penalty = 0.5f;
  jobs.push_back(sampled);
  jobs.push_back(sampled);
  jobs.push_back(greedy(prompt[5], 1));
  Job faulty = greedy(prompt[15], 4);
  faulty.params.fault = FaultInjection{FaultSite::Sample, 0};
  jobs.push_back(faulty);
  jobs.push_back(greedy(prompt[15], 3));
  return jobs;
}
// Tokens the jobs above find cached: each repeat whole, the longer prompt its 17, the later
// requests on prompts 40, 16, 16, 5, 15, 15 whole.
inline constexpr int kRepeatHits = (1 + 5 + 15 + 16 + 17 + 40) + 17 + 40 + 16 + 16 + 5 + 15 + 15;

using testing::expect_same;

}  // namespace fathom::prefix_test
