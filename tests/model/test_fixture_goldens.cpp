// The CPU reference engine against golden outputs of Hugging Face transformers (fp32) on the
// tiny random checkpoints in tests/fixtures (made by tools/make_fixtures.py on the GPU machine)
// and on the embedded default model, models/fathom-tiny-moe (trained; tools/make_default_goldens.py).
//
// Metric: max |logit_fathom - logit_hf| over a prompt must be below 1e-3 x the spread
// (max - min) of the golden logits for that prompt. Greedy continuations must match token for
// token until the first step whose golden top-1/top-2 margin is <= 1e-2 (past such a near-tie
// the two continuations may legitimately differ).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "io/safetensors.h"
#include "model/hybrid_model.h"
#include "runtime/generate.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-3;  // fraction of the golden logits' spread
constexpr float kMarginThreshold = 1e-2f;

struct Golden {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits, greedy_margin, mtp_logits;
};

using testing::fixtures_dir;
using testing::read_f32;
using testing::read_i32;

struct Fixture {
  std::string name;
  std::unique_ptr<HybridModel> model;
  std::vector<Golden> goldens;
};

// The default model lives with the models, not the fixtures; its test name has no '-'.
fs::path golden_dir(const std::string& name) {
  if (name == "fathom_tiny_moe") return fs::path(FATHOM_SOURCE_DIR) / "models" / "fathom-tiny-moe";
  return fixtures_dir() / name;
}

Fixture& fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  auto& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<Fixture>();
    slot->name = name;
    const fs::path dir = golden_dir(name);
    if (fs::exists(dir / "goldens.safetensors")) {
      slot->model = HybridModel::load(dir, /*with_mtp=*/true);
      auto g = SafetensorsFile::open(dir / "goldens.safetensors");
      for (int i = 0; g->find("prompt_" + std::to_string(i)); ++i) {
        std::string s = std::to_string(i);
        slot->goldens.push_back(Golden{read_i32(*g, "prompt_" + s), read_i32(*g, "greedy_" + s),
                                       read_f32(*g, "logits_" + s), read_f32(*g, "greedy_margin_" + s),
                                       read_f32(*g, "mtp_logits_" + s)});
      }
    }
  }
  return *slot;
}

// max |a - b| / spread(golden)
double relative_error(const std::vector<float>& got, const std::vector<float>& golden) {
  EXPECT_EQ(got.size(), golden.size());
  if (got.size() != golden.size() || golden.empty()) return 1e30;
  auto [mn, mx] = std::minmax_element(golden.begin(), golden.end());
  double err = 0;
  for (size_t i = 0; i < golden.size(); ++i) err = std::max(err, double(std::fabs(got[i] - golden[i])));
  return err / double(*mx - *mn);
}

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fixture(GetParam()).model) << "fixture " << GetParam() << " missing: " << golden_dir(GetParam());
  }
  Fixture& fx() { return fixture(GetParam()); }
};

TEST_P(FixtureTest, TeacherForcedLogitsMatchTransformers) {
  for (const Golden& g : fx().goldens) {
    SequenceState st = fx().model->new_sequence();
    auto out = prefill(*fx().model, st, g.prompt, 1 << 20, /*all_rows=*/true);
    double rel = relative_error(out.logits, g.logits);
    std::printf("  %s: prompt of %zu tokens: max|err|/spread = %.2e\n", fx().name.c_str(), g.prompt.size(), rel);
    EXPECT_LT(rel, kLogitTolerance) << "prompt of " << g.prompt.size() << " tokens";
  }
}

TEST_P(FixtureTest, ChunkedAndTokenByTokenPrefillAgree) {
  for (const Golden& g : fx().goldens) {
    SequenceState a = fx().model->new_sequence();
    auto whole = prefill(*fx().model, a, g.prompt, 1 << 20, true);
    for (int chunk : {1, 3, 7, 64}) {
      SequenceState b = fx().model->new_sequence();
      auto chunked = prefill(*fx().model, b, g.prompt, chunk, true);
      EXPECT_LT(relative_error(chunked.logits, whole.logits), 1e-5)
          << "chunk " << chunk << ", prompt of " << g.prompt.size();
      // The recurrent state after the prompt must agree too (it drives decoding).
      for (size_t l = 0; l < a.linear.size(); ++l)
        EXPECT_LT(relative_error(b.linear[l].recurrent, a.linear[l].recurrent), 1e-5);
    }
  }
}

TEST_P(FixtureTest, GreedyContinuationMatchesWhereMarginAllows) {
  for (const Golden& g : fx().goldens) {
    GenerateOptions opt;
    opt.max_new_tokens = int(g.greedy.size());  // no eos stop: goldens ignore eos
    GenerateResult r = generate(*fx().model, g.prompt, opt);
    ASSERT_EQ(r.token_ids.size(), g.greedy.size());
    size_t compared = 0;
    for (size_t i = 0; i < g.greedy.size(); ++i) {
      if (r.token_ids[i] != g.greedy[i]) {
        EXPECT_LE(g.greedy_margin[i], kMarginThreshold)
            << "step " << i << ": fathom " << r.token_ids[i] << " vs transformers " << g.greedy[i];
        break;
      }
      ++compared;
    }
    std::printf("  %s: greedy matched %zu of %zu tokens\n", fx().name.c_str(), compared, g.greedy.size());
    EXPECT_GT(compared, 0u);
  }
}

// Every prompt in one ragged batch, then batched decode steps, must equal the lone runs.
TEST_P(FixtureTest, RaggedBatchMatchesSingleSequences) {
  const auto& gs = fx().goldens;
  std::vector<SequenceState> states;
  for (size_t i = 0; i < gs.size(); ++i) states.push_back(fx().model->new_sequence());
  std::vector<HybridModel::Segment> batch;
  for (size_t i = 0; i < gs.size(); ++i) batch.push_back({&states[i], gs[i].prompt});
  auto out = fx().model->forward(batch, /*all_rows=*/true);
  const int64_t V = fx().model->config().vocab_size;
  size_t row = 0;
  for (const Golden& g : gs) {
    std::vector<float> part(out.logits.begin() + row * V, out.logits.begin() + (row + g.prompt.size()) * V);
    EXPECT_LT(relative_error(part, g.logits), kLogitTolerance);
    row += g.prompt.size();
  }
  // Decode the golden greedy tokens for all sequences together (teacher forcing), comparing
  // against the same sequences decoded alone.
  for (size_t step = 0; step + 1 < 4; ++step) {
    std::vector<HybridModel::Segment> dec;
    for (size_t i = 0; i < gs.size(); ++i) dec.push_back({&states[i], std::span<const int32_t>(&gs[i].greedy[step], 1)});
    auto batched = fx().model->forward(dec, false);
    for (size_t i = 0; i < gs.size(); ++i) {
      SequenceState alone = fx().model->new_sequence();
      std::vector<int32_t> seq = gs[i].prompt;
      seq.insert(seq.end(), gs[i].greedy.begin(), gs[i].greedy.begin() + step + 1);
      auto ref = prefill(*fx().model, alone, seq, 1 << 20, false);
      std::vector<float> part(batched.logits.begin() + i * V, batched.logits.begin() + (i + 1) * V);
      EXPECT_LT(relative_error(part, ref.logits), 1e-5) << "sequence " << i << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next", "qwen3_dense",
                                           "fathom_tiny_moe", "qwen35_moe_fp8_block"),
                         [](const auto& info) { return info.param; });

// The fixtures whose checkpoints carry `mtp.*` tensors.
class MtpFixtureTest : public FixtureTest {};

TEST_P(MtpFixtureTest, MtpLogitsMatchReference) {
  ASSERT_TRUE(fx().model->has_mtp()) << "fixture " << GetParam() << " should carry an MTP layer";
  for (const Golden& g : fx().goldens) {
    ASSERT_FALSE(g.mtp_logits.empty()) << "fixture has an MTP layer but no mtp_logits golden";
    SequenceState st = fx().model->new_sequence();
    auto out = prefill(*fx().model, st, g.prompt, 1 << 20, true);
    const int H = fx().model->config().hidden_size;
    const size_t n = g.prompt.size() - 1;
    HybridModel::MtpSegment seg{&st, std::span<const float>(out.hidden.data(), n * H),
                                std::span<const int32_t>(g.prompt.data() + 1, n)};
    auto mtp = fx().model->mtp_forward(std::span<const HybridModel::MtpSegment>(&seg, 1), true);
    double rel = relative_error(mtp.logits, g.mtp_logits);
    std::printf("  %s: MTP over %zu rows: max|err|/spread = %.2e\n", fx().name.c_str(), n, rel);
    EXPECT_LT(rel, kLogitTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpFixtureTest,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "fathom_tiny_moe", "qwen35_moe_fp8_block"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// Drafts are verified in one forward with history; rolling back to any accepted length must
// leave the sequence exactly as if only the accepted tokens had been fed.
TEST_P(FixtureTest, RollbackRestoresLinearAttentionState) {
  const Golden& g = fx().goldens[1];
  const HybridModel& m = *fx().model;
  std::vector<int32_t> prefix(g.prompt.begin(), g.prompt.begin() + 10);
  std::vector<int32_t> draft(g.prompt.begin() + 10, g.prompt.begin() + 15);
  for (int keep = 0; keep <= int(draft.size()); ++keep) {
    SequenceState st = m.new_sequence();
    prefill(m, st, prefix, 1 << 20, false);
    HybridModel::Segment verify{&st, draft, /*keep_history=*/true};
    m.forward(std::span<const HybridModel::Segment>(&verify, 1), true);
    m.rollback(st, int64_t(prefix.size()) + keep);
    const int32_t next = g.prompt[15];
    HybridModel::Segment step{&st, std::span<const int32_t>(&next, 1)};
    auto got = m.forward(std::span<const HybridModel::Segment>(&step, 1), false);

    SequenceState ref = m.new_sequence();
    std::vector<int32_t> seq = prefix;
    seq.insert(seq.end(), draft.begin(), draft.begin() + keep);
    seq.push_back(next);
    auto want = prefill(m, ref, seq, 1 << 20, false);
    EXPECT_LT(relative_error(got.logits, want.logits), 1e-5) << "kept " << keep << " of " << draft.size();
  }
}

}  // namespace
}  // namespace fathom
