// Prompt ends under device sampling on the CUDA engine (issue 37): rows marked
// RowSampling::keep_logits come back raw (as forward() returns them, before the sampler adjusts
// them in place), and the engine caches a snapshot where each prompt ends, so exact repeats of
// any length hit and decode what they decode uncached.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_compare.h"
#include "model/model_runner.h"
#include "runtime/engine_test_util.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using engine_compare::fixtures_dir;
using engine_compare::random_prompt;

TEST(CudaPromptEnds, KeptRowsAreTheRawLogits) {
  const fs::path dir = fixtures_dir() / "qwen35_moe";
  ASSERT_TRUE(fs::exists(dir / "config.json")) << dir;
  auto runner = open_model(dir.string(), "cuda", false);
  ASSERT_TRUE(runner->samples_on_device());
  const int V = runner->config().vocab_size;
  const std::vector<int32_t> a = random_prompt(9, V, 11), b = random_prompt(37, V, 12), c = random_prompt(3, V, 13);
  auto steps_of = [&](SequenceId s0, SequenceId s1, SequenceId s2) {
    return std::vector<ForwardStep>{{s0, a}, {s1, b}, {s2, c}};
  };
  std::vector<SequenceId> ref_seqs = {runner->add_sequence(), runner->add_sequence(), runner->add_sequence()};
  const ForwardOutput ref = runner->forward(steps_of(ref_seqs[0], ref_seqs[1], ref_seqs[2]));
  ASSERT_EQ(ref.rows, 3);
  // Rows 0 and 2 kept; row 0 greedy with a penalty and a bias (the sampler rewrites those logits
  // in place), row 2 sampled.
  std::vector<RowSampling> rows(3);
  std::vector<LogitAdjustment> adjust(2);
  adjust[0].token = a[0], adjust[0].rep = 1.5f;
  adjust[1].token = 5, adjust[1].bias = 4.f;
  rows[0].keep_logits = 1;
  rows[0].adjust_begin = 0, rows[0].adjust_end = 2;
  rows[2].keep_logits = 1;
  rows[2].temperature = 0.9f;
  rows[2].seed = 77;
  std::vector<SequenceId> seqs = {runner->add_sequence(), runner->add_sequence(), runner->add_sequence()};
  runner->launch_sampled(steps_of(seqs[0], seqs[1], seqs[2]), rows, adjust, {}, false);
  const SampledOutput out = runner->finish_sampled();
  ASSERT_EQ(out.kept_rows, (std::vector<int64_t>{0, 2}));
  ASSERT_EQ(out.kept_logits.size(), size_t(2) * V);
  for (int k = 0; k < 2; ++k) {
    const int64_t row = out.kept_rows[size_t(k)];
    const float* got = out.kept_row_logits(row, V);
    ASSERT_NE(got, nullptr);
    int mismatches = 0;
    for (int v = 0; v < V; ++v) mismatches += got[v] != ref.logits[size_t(row) * V + v];
    EXPECT_EQ(mismatches, 0) << "kept row " << row << ": the same step through forward() gives other bits";
  }
  EXPECT_EQ(out.kept_row_logits(1, V), nullptr);
  for (SequenceId s : ref_seqs) runner->remove_sequence(s);
  for (SequenceId s : seqs) runner->remove_sequence(s);
}

// Exact repeats of short and long prompts, greedy and seeded, arriving while the first ones decode:
// outputs equal to the engine's without caching, and tokens served from the cache (the default:
// the test clears FATHOM_DEVICE_PROMPT_ENDS, which turns them off at 0).
TEST(CudaPromptEnds, ExactRepeatsHitUnderDeviceSampling) {
  const fs::path dir = fixtures_dir() / "qwen35_moe";
  ASSERT_TRUE(fs::exists(dir / "config.json")) << dir;
  EngineOptions eo;
  eo.max_seqs = 8;
  eo.max_model_len = 512;
  eo.prefix_cache_mb = 64;  // room for snapshots (none by default on the GPU: no prefix cache at all)
  eo.num_kv_blocks = 512;
  auto open = [&] { return open_model(dir.string(), "cuda", false, eo); };
  // Read when an engine is built; restored at the end.
  const char* before = std::getenv("FATHOM_DEVICE_PROMPT_ENDS");
  const std::string saved = before ? before : "";
  unsetenv("FATHOM_DEVICE_PROMPT_ENDS");
  struct Restore {
    bool had;
    std::string value;
    ~Restore() { had ? setenv("FATHOM_DEVICE_PROMPT_ENDS", value.c_str(), 1) : unsetenv("FATHOM_DEVICE_PROMPT_ENDS"); }
  } restore{before != nullptr, saved};
  auto probe = open();
  ASSERT_TRUE(probe->returns_kept_logits());
  const int V = probe->config().vocab_size;
  probe.reset();
  std::vector<testing::Job> jobs(3);
  jobs[0].prompt = random_prompt(7, V, 21);   // under one block: only a prompt end can serve it
  jobs[1].prompt = random_prompt(45, V, 22);  // a block and a part
  jobs[2].prompt = random_prompt(20, V, 23);
  jobs[2].params.sampling.temperature = 0.8f;
  jobs[2].params.sampling.seed = 5;
  for (testing::Job& j : jobs) j.params.max_tokens = 6, j.params.ignore_eos = true;
  for (int i = 0; i < 3; ++i) jobs.push_back(jobs[size_t(i)]);  // the repeats arrive while the first decode
  EngineConfig cfg;
  cfg.max_num_seqs = 8;
  cfg.max_model_len = 512;
  cfg.device_sampling = true;
  cfg.enable_prefix_caching = false;
  const auto uncached = testing::run_engine(open(), cfg, jobs);
  cfg.enable_prefix_caching = true;
  std::string m;
  const auto cached = testing::run_engine(open(), cfg, jobs, &m);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(cached[i].ids, uncached[i].ids) << "job " << i;
    EXPECT_EQ(cached[i].reason, uncached[i].reason) << "job " << i;
  }
  const double hits = testing::metric(m, "fathom:prefix_cache_hits_total");
  std::printf("  %.0f prompt tokens served from the cache\n", hits);
  EXPECT_GE(hits, 7 + 45 + 20 - 3);  // each repeat resumes at its prompt's end (its last token recomputed at most)
}

}  // namespace
}  // namespace fathom
