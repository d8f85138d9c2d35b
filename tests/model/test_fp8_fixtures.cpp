// The CPU reference engine on the FP8 fixtures (tools/make_fixtures.py --only ...): tiny
// checkpoints in the layouts of NVIDIA's MIXED_PRECISION release (NVFP4 experts, FP8 W8A8
// attention / DeltaNet / shared expert) and of Qwen's block-FP8 release, against transformers
// fp32 run on the dequantized weights (goldens logits_i), and, for the W8A8 layout, against
// transformers with every FP8 module's input quantized as the checkpoint says (w8a8_logits_i).
//
// Bounds: weight-only logits within 1e-4 of the golden spread (the dequantization is exact; what
// is left is fp32 summation order). W8A8 logits within 1e-4 of the W8A8 goldens (the same
// emulation: measured ~4e-7), at least 10x nearer them than the weight-only goldens (the quantization error: ~0.3 of
// the spread on these random weights, w8a8_vs_logits_max_rel in fathom_fixture.json), and the
// same top-1 wherever the golden margin exceeds 1e-2. Greedy continuations (weight-only) equal
// transformers' until the first golden margin at or below 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "io/safetensors.h"
#include "model/hybrid_model.h"
#include "runtime/generate.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::fixtures_dir;
using testing::read_f32;
using testing::read_i32;

constexpr double kExact = 1e-4;      // weight-only vs transformers on the same dequantized weights
constexpr double kEmulation = 1e-4;  // W8A8: the same emulation (measured ~4e-7)
constexpr float kMargin = 1e-2f;

double spread(const std::vector<float>& v) {
  auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  return double(*mx - *mn);
}

double relative_error(const std::vector<float>& got, const std::vector<float>& golden) {
  EXPECT_EQ(got.size(), golden.size());
  if (got.size() != golden.size() || golden.empty()) return 1e30;
  double err = 0;
  for (size_t i = 0; i < golden.size(); ++i)
    err = std::max(err, std::isfinite(got[i]) ? double(std::fabs(got[i] - golden[i])) : 1e30);
  return err / spread(golden);
}

struct Fp8Fixture {
  fs::path dir;
  std::unique_ptr<HybridModel> model;
  std::unique_ptr<SafetensorsFile> goldens;
  nlohmann::json info;
  int prompts = 0;
};

Fp8Fixture open_fixture(const std::string& name) {
  Fp8Fixture f;
  f.dir = fixtures_dir() / name;
  f.model = HybridModel::load(f.dir, /*with_mtp=*/true);
  f.goldens = SafetensorsFile::open(f.dir / "goldens.safetensors");
  std::ifstream in(f.dir / "fathom_fixture.json");
  f.info = nlohmann::json::parse(in, nullptr, false);
  while (f.goldens->find("prompt_" + std::to_string(f.prompts))) ++f.prompts;
  return f;
}

std::vector<float> teacher_forced(const HybridModel& m, const std::vector<int32_t>& prompt) {
  SequenceState st = m.new_sequence();
  return prefill(m, st, prompt, 1 << 20, /*all_rows=*/true).logits;
}

class Fp8FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8FixtureTest, WeightOnlyLogitsMatchTransformers) {
  Fp8Fixture f = open_fixture(GetParam());
  ASSERT_GT(f.prompts, 0);
  f.model->set_fp8_activation_quantization(false);
  for (int i = 0; i < f.prompts; ++i) {
    const std::string s = std::to_string(i);
    const double rel = relative_error(teacher_forced(*f.model, read_i32(*f.goldens, "prompt_" + s)),
                                      read_f32(*f.goldens, "logits_" + s));
    std::printf("  %s weight-only, prompt %d: max|err|/spread = %.2e\n", GetParam().c_str(), i, rel);
    EXPECT_LT(rel, kExact);
  }
}

// Rows whose golden top-1 beats top-2 by more than kMargin must agree on the top-1.
size_t argmax_disagreements(const std::vector<float>& got, const std::vector<float>& golden, int V, size_t* compared) {
  size_t bad = 0;
  for (size_t r = 0; r < golden.size() / size_t(V); ++r) {
    const float* g = golden.data() + r * V;
    const float* o = got.data() + r * V;
    const int best = int(std::max_element(g, g + V) - g);
    float second = -1e30f;
    for (int v = 0; v < V; ++v)
      if (v != best) second = std::max(second, g[v]);
    if (g[best] - second <= kMargin) continue;
    ++*compared;
    bad += int(std::max_element(o, o + V) - o) != best;
  }
  return bad;
}

TEST_P(Fp8FixtureTest, W8A8LogitsMatchTheEmulation) {
  Fp8Fixture f = open_fixture(GetParam());
  if (!f.goldens->find("w8a8_logits_0")) {
    // Weight-only layouts (dynamic activations): the default run is the weight-only one.
    EXPECT_FALSE(f.info.contains("w8a8_vs_logits_max_rel")) << "the fixture has W8A8 errors but no W8A8 goldens";
    for (int i = 0; i < f.prompts; ++i) {
      const std::string s = std::to_string(i);
      EXPECT_LT(relative_error(teacher_forced(*f.model, read_i32(*f.goldens, "prompt_" + s)),
                               read_f32(*f.goldens, "logits_" + s)),
                kExact);
    }
    return;
  }
  const int V = f.model->config().vocab_size;
  for (int i = 0; i < f.prompts; ++i) {
    const std::string s = std::to_string(i);
    const auto got = teacher_forced(*f.model, read_i32(*f.goldens, "prompt_" + s));
    const auto w8a8 = read_f32(*f.goldens, "w8a8_logits_" + s);
    const double vs_emulation = relative_error(got, w8a8);
    const double vs_weight_only = relative_error(got, read_f32(*f.goldens, "logits_" + s));
    size_t compared = 0;
    const size_t bad = argmax_disagreements(got, w8a8, V, &compared);
    std::printf("  %s W8A8, prompt %d: vs transformers W8A8 %.2e, vs weight-only %.2e (the quantization error); "
                "top-1 agrees on %zu of %zu rows with a margin\n",
                GetParam().c_str(), i, vs_emulation, vs_weight_only, compared - bad, compared);
    EXPECT_LT(vs_emulation, kEmulation);
    // The activations really are quantized: far nearer the W8A8 goldens than the weight-only ones.
    EXPECT_LT(10 * vs_emulation, vs_weight_only);
    EXPECT_EQ(bad, 0u);
  }
}

// Cached greedy decoding (weight-only, as the goldens were made) equals transformers' until a
// near-tie.
TEST_P(Fp8FixtureTest, GreedyMatchesWhereTheMarginAllows) {
  Fp8Fixture f = open_fixture(GetParam());
  f.model->set_fp8_activation_quantization(false);
  for (int i = 0; i < f.prompts; ++i) {
    const std::string s = std::to_string(i);
    const auto prompt = read_i32(*f.goldens, "prompt_" + s), want = read_i32(*f.goldens, "greedy_" + s);
    const auto margin = read_f32(*f.goldens, "greedy_margin_" + s);
    GenerateOptions opt;
    opt.max_new_tokens = int(want.size());
    const GenerateResult r = generate(*f.model, prompt, opt);
    ASSERT_EQ(r.token_ids.size(), want.size());
    size_t same = 0;
    for (; same < want.size() && r.token_ids[same] == want[same]; ++same) {}
    if (same < want.size()) {
      EXPECT_LE(margin[same], kMargin) << "greedy diverged at step " << same;
    }
    std::printf("  %s: greedy matched %zu of %zu tokens\n", GetParam().c_str(), same, want.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8FixtureTest, ::testing::Values("qwen35_moe_fp8_mixed", "qwen35_moe_fp8_mixed_w4a16_head",
                                                            "qwen35_moe_fp8_block"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fathom
