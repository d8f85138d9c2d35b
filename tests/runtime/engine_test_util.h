// Driving a serving Engine in tests: submit jobs (half at once, the rest while the first
// decodes; or all before the first step), collect each one's tokens and finish reason, and read
// values from /metrics text.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace fathom::testing {

struct Job {
  std::vector<int32_t> prompt;
  RequestParams params;
};

struct Finished {
  std::vector<int32_t> ids;
  std::string reason;
  std::vector<TokenLogprob> logprobs;
};

// Runs `jobs` through an engine over `runner`: the first half is submitted at once, the rest
// one by one after the engine has produced some tokens (arrivals while others decode).
inline std::vector<Finished> run_engine(std::unique_ptr<ModelRunner> runner, EngineConfig cfg,
                                        const std::vector<Job>& jobs,
                                        std::string* metrics = nullptr) {
  Engine engine(std::move(runner), nullptr, cfg);
  engine.start();
  std::vector<std::shared_ptr<OutputChannel>> chans;
  auto submit = [&](size_t i) {
    auto ch = std::make_shared<OutputChannel>();
    RequestSpec s;
    s.group = engine.new_group_id();
    s.prompt = jobs[i].prompt;
    s.params = jobs[i].params;
    s.out = ch;
    EXPECT_EQ(engine.submit({s}), Engine::SubmitResult::Ok);
    chans.push_back(ch);
  };
  std::vector<Finished> out(jobs.size());
  std::vector<bool> done(jobs.size(), false);
  auto drain = [&](size_t i, bool wait) {
    while (!done[i]) {
      auto ev = chans[i]->pop(std::chrono::milliseconds(wait ? 60000 : 0));
      if (!ev) {
        EXPECT_FALSE(wait) << "request " << i << " timed out";
        return;
      }
      out[i].ids.insert(out[i].ids.end(), ev->token_ids.begin(), ev->token_ids.end());
      out[i].logprobs.insert(out[i].logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
      if (ev->finished) {
        out[i].reason = ev->finish_reason;
        done[i] = true;
      }
    }
  };
  const size_t first = (jobs.size() + 1) / 2;
  for (size_t i = 0; i < first; ++i) submit(i);
  for (size_t i = first; i < jobs.size(); ++i) {
    // Wait for one more token of the first request (or its end) before each later arrival.
    auto ev = chans[0]->pop(std::chrono::milliseconds(done[0] ? 0 : 60000));
    if (ev) {
      out[0].ids.insert(out[0].ids.end(), ev->token_ids.begin(), ev->token_ids.end());
      out[0].logprobs.insert(out[0].logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
      if (ev->finished) out[0].reason = ev->finish_reason, done[0] = true;
    }
    submit(i);
  }
  for (size_t i = 0; i < jobs.size(); ++i) drain(i, true);
  engine.shutdown();  // every request has ended: the metrics are final
  if (metrics) *metrics = engine.render_metrics("fathom:", "m");
  return out;
}

// A request's tokens, logprobs and finish reason, once it has finished (a minute at most).
inline Finished finished_of(OutputChannel& ch) {
  Finished f;
  for (bool done = false; !done;) {
    auto ev = ch.pop(std::chrono::milliseconds(60000));
    if (!ev) break;
    f.ids.insert(f.ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    f.logprobs.insert(f.logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
    done = ev->finished;
    if (done) f.reason = ev->finish_reason;
  }
  return f;
}

// Jobs all submitted before the engine's first step (they arrive together).
inline std::vector<Finished> run_burst(std::unique_ptr<ModelRunner> runner, const EngineConfig& cfg,
                                       const std::vector<Job>& jobs, std::string* metrics) {
  Engine engine(std::move(runner), nullptr, cfg);
  std::vector<std::shared_ptr<OutputChannel>> chans;
  for (const Job& j : jobs) {
    chans.push_back(std::make_shared<OutputChannel>());
    RequestSpec s;
    s.group = engine.new_group_id();
    s.prompt = j.prompt;
    s.params = j.params;
    s.out = chans.back();
    EXPECT_EQ(engine.submit({s}), Engine::SubmitResult::Ok);
  }
  engine.start();
  std::vector<Finished> out;
  for (auto& ch : chans) out.push_back(finished_of(*ch));
  engine.shutdown();
  if (metrics) *metrics = engine.render_metrics("fathom:", "m");
  return out;
}

// Finished requests equal one by one: tokens, finish reasons, and logprobs (the chosen token's
// and the top alternatives') exactly, or within `logprob_tolerance` when it is positive.
inline void expect_same(const std::vector<Finished>& got, const std::vector<Finished>& want, const std::string& what,
                        double logprob_tolerance = 0) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << what << " job " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " job " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << " job " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      const TokenLogprob &a = got[i].logprobs[t], &b = want[i].logprobs[t];
      EXPECT_EQ(a.token, b.token) << what << " job " << i << " token " << t;
      if (logprob_tolerance <= 0) {
        EXPECT_EQ(a.logprob, b.logprob) << what << " job " << i << " token " << t;
        EXPECT_EQ(a.top, b.top) << what << " job " << i << " token " << t;
        continue;
      }
      EXPECT_NEAR(a.logprob, b.logprob, logprob_tolerance) << what << " job " << i << " token " << t;
      ASSERT_EQ(a.top.size(), b.top.size()) << what << " job " << i << " token " << t;
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_EQ(a.top[k].first, b.top[k].first) << what << " job " << i << " token " << t;
        EXPECT_NEAR(a.top[k].second, b.top[k].second, logprob_tolerance) << what << " job " << i << " token " << t;
      }
    }
  }
}

// A metric's value from Prometheus text (first sample whose line starts with `name{` and
// contains `label`), or -1.
inline double metric(const std::string& text, const std::string& name, const std::string& label = "") {
  size_t at = 0;
  while ((at = text.find(name + "{", at)) != std::string::npos) {
    const size_t eol = text.find('\n', at);
    const std::string line = text.substr(at, eol - at);
    at = eol;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace fathom::testing
