// Error isolation in the serving engine: an error raised while handling one sequence (its
// sampling, detokenizing, stop handling, or a forward error raised for it) ends that sequence
// alone with finish reason "error"; the other sequences of the same steps produce exactly what
// they produce without the fault, and /metrics counts the error by stage. Faults come from the
// test-only fault injection of RequestParams (serve --enable-fault-injection). Also where the
// runner chooses tokens (device sampling, RowSamplingRunner: overlapped steps, fused MTP rounds).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
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
using testing::Job;
using testing::metric;
using testing::run_engine;

std::unique_ptr<ModelRunner> load_runner(bool device_sampling = false) {
  const fs::path dir = testing::fixtures_dir() / "qwen35_moe";
  auto cpu = std::make_unique<CpuRunner>(HybridModel::load(dir, /*with_mtp=*/true));
  if (device_sampling) return std::make_unique<RowSamplingRunner>(std::move(cpu));
  return cpu;
}

std::vector<Job> greedy_jobs(int count, int vocab) {
  std::mt19937 rng(21);
  std::vector<Job> jobs(static_cast<size_t>(count));
  for (auto& j : jobs) {
    j.prompt.resize(3 + rng() % 20);
    for (auto& t : j.prompt) t = 2 + int32_t(rng() % uint32_t(vocab - 2));
    j.params.max_tokens = 10;
    j.params.ignore_eos = true;
  }
  return jobs;
}

struct FaultCase {
  FaultSite site;
  SpecAlgorithm spec;
  bool device_sampling = false;
};

class EngineFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(EngineFaults, OneFailingSequenceLeavesTheOthersExact) {
  const FaultCase fc = GetParam();
  EngineConfig cfg;
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 64;  // prefill in chunks: faults meet sequences mid-prompt too
  cfg.max_model_len = 256;
  cfg.spec.algorithm = fc.spec;
  cfg.spec.num_steps = 2;
  cfg.spec.adaptive = false;
  auto probe = load_runner();
  const std::vector<Job> jobs = greedy_jobs(8, int(probe->config().vocab_size));
  const auto want = run_engine(load_runner(fc.device_sampling), cfg, jobs);
  for (size_t faulty : {size_t(0), size_t(5)}) {
    std::vector<Job> with_fault = jobs;
    with_fault[faulty].params.fault = FaultInjection{fc.site, 3};
    std::string m;
    const auto got = run_engine(load_runner(fc.device_sampling), cfg, with_fault, &m);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i == faulty) {
        EXPECT_EQ(got[i].reason, "error") << "faulty request " << i;
        EXPECT_LE(got[i].ids.size(), 4u + size_t(cfg.spec.num_steps)) << "it ran on after its fault";
      } else {
        EXPECT_EQ(got[i].reason, "length") << "request " << i;
        EXPECT_EQ(got[i].ids, want[i].ids) << "request " << i << " changed by another's fault";
      }
    }
    EXPECT_EQ(metric(m, "fathom:request_errors_total", std::string("stage=\"") + fault_site_name(fc.site) + "\""), 1);
    EXPECT_EQ(metric(m, "fathom:request_success_total", "finished_reason=\"error\""), 1);
    EXPECT_EQ(metric(m, "fathom:kv_cache_usage_perc"), 0) << "blocks leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Sites, EngineFaults,
                         ::testing::Values(FaultCase{FaultSite::Sample, SpecAlgorithm::None},
                                           FaultCase{FaultSite::Stop, SpecAlgorithm::None},
                                           FaultCase{FaultSite::Forward, SpecAlgorithm::None},
                                           FaultCase{FaultSite::Sample, SpecAlgorithm::Mtp},
                                           FaultCase{FaultSite::Forward, SpecAlgorithm::Mtp},
                                           FaultCase{FaultSite::Forward, SpecAlgorithm::Ngram},
                                           FaultCase{FaultSite::Sample, SpecAlgorithm::None, true},
                                           FaultCase{FaultSite::Stop, SpecAlgorithm::None, true},
                                           FaultCase{FaultSite::Forward, SpecAlgorithm::None, true},
                                           FaultCase{FaultSite::Sample, SpecAlgorithm::Mtp, true},
                                           FaultCase{FaultSite::Forward, SpecAlgorithm::Mtp, true}),
                         [](const auto& info) {
                           const char* spec = info.param.spec == SpecAlgorithm::None  ? "plain"
                                              : info.param.spec == SpecAlgorithm::Mtp ? "mtp"
                                                                                      : "ngram";
                           return std::string(fault_site_name(info.param.site)) + "_" + spec +
                                  (info.param.device_sampling ? "_device_sampling" : "");
                         });

// A token outside the vocabulary is refused by the runner for that sequence alone, before any
// state changes (SequenceError), and the engine finishes it with an error.
TEST(EngineErrors, BadTokenFailsItsSequenceOnly) {
  auto probe = load_runner();
  const int vocab = int(probe->config().vocab_size);
  std::vector<Job> jobs = greedy_jobs(4, vocab);
  EngineConfig cfg;
  cfg.max_num_seqs = 4;
  cfg.max_model_len = 256;
  const auto want = run_engine(load_runner(), cfg, jobs);
  jobs[1].prompt.push_back(vocab + 5);
  std::string m;
  const auto got = run_engine(load_runner(), cfg, jobs, &m);
  EXPECT_EQ(got[1].reason, "error");
  for (size_t i : {size_t(0), size_t(2), size_t(3)}) EXPECT_EQ(got[i].ids, want[i].ids) << i;
  EXPECT_EQ(metric(m, "fathom:request_errors_total", "stage=\"forward\""), 1);
}

}  // namespace
}  // namespace fathom
