// The shape sweep's random checkpoints (tests/model/random_checkpoint.h) on the fp32 CPU engine,
// the reference the GPU sweep compares the CUDA engine with.
//
// Every fixed config and the draws of seeds 1..40 are written, loaded and run on a 20-token
// prompt in one forward and in chunks of 7: the logits must be finite, the first row's spread
// (max - min) between 0.5 and 200 (weights scaled so activations stay O(1)), and the chunked rows
// within 1e-4 of that spread of the whole run's; another first token must still move the last
// row. The NVFP4 tensors must be exactly the modules the quantization config says are NVFP4, and
// the engine must read back the config that was drawn. 300 draws must cover the space.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/model_runner.h"
#include "model/random_checkpoint.h"

namespace fathom::testutil {
// Names a config in gtest's messages instead of dumping its bytes.
void PrintTo(const SweepConfig& c, std::ostream* os) { *os << c.describe(); }
}  // namespace fathom::testutil

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testutil::SweepArch;
using testutil::SweepConfig;
using testutil::SweepQuant;

constexpr double kChunkTolerance = 1e-4;  // of the logits spread
constexpr double kMinSpread = 0.5, kMaxSpread = 200;
constexpr double kMinContextEffect = 1e-3;  // of the spread (measured: 3e-2 to 0.7)
constexpr int kPromptTokens = 20, kChunk = 7;
constexpr int kDrawnSeeds = 40, kCoverageDraws = 300;

// A fresh folder from mkdtemp, removed with its contents at the end of the scope.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "fathom_sweep_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<int32_t> prompt_for(const SweepConfig& c) {
  std::vector<int32_t> p;
  for (int i = 0; i < kPromptTokens; ++i) p.push_back(int32_t(2 + (i * 97 + int(c.seed % 1000) * 31) % (c.vocab - 2)));
  return p;
}

// Every row's logits (and hidden states) of `prompt` run in chunks of `chunk` tokens.
ForwardOutput run_prompt(ModelRunner& r, const std::vector<int32_t>& prompt, int chunk) {
  const SequenceId s = r.add_sequence();
  ForwardOutput all;
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk)) {
    const size_t n = std::min(prompt.size() - b, size_t(chunk));
    const ForwardStep step{s, std::span<const int32_t>(prompt.data() + b, n), true};
    ForwardOutput o = r.forward(std::span<const ForwardStep>(&step, 1));
    all.logits.insert(all.logits.end(), o.logits.begin(), o.logits.end());
    all.hidden.insert(all.hidden.end(), o.hidden.begin(), o.hidden.end());
    all.rows += o.rows;
  }
  r.remove_sequence(s);
  return all;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// How many linears the config puts in NVFP4 (what the writer must have stored as U8).
int expected_nvfp4_linears(const SweepConfig& c) {
  if (c.quant == SweepQuant::Bf16) return 0;
  const bool all = c.quant == SweepQuant::Nvfp4All;
  const int moe = 3 * c.experts + (c.shared_intermediate > 0 ? 3 : 0);
  const int attention = 4, delta_net = c.arch == SweepArch::Qwen3Next ? 3 : 5;
  int n = 0;
  for (int l = 0; l < c.layers(); ++l) {
    if (all) n += c.layer_pattern[size_t(l)] == 'F' ? attention : delta_net;
    const bool mlp_only = std::count(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) > 0;
    n += c.moe() && !mlp_only ? moe : 3;
  }
  if (c.mtp && all) n += attention + moe;
  return n;
}

// The U8 weights are exactly the modules the quantization config expects in NVFP4: engines that
// go by the exclude list (vLLM, SGLang) and Fathom's loaders, which go by storage, agree.
void expect_storage_matches_quant_config(const SweepConfig& c, const fs::path& dir) {
  const auto ckpt = Checkpoint::open(dir);
  const QuantConfig q = QuantConfig::load(dir, read_text_file(dir / "config.json"));
  EXPECT_EQ(q.algo, c.quant == SweepQuant::Bf16 ? QuantAlgo::None : QuantAlgo::NVFP4);
  int nvfp4 = 0;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo& t = ckpt->info(name);
    // A linear: a 2-D `.weight` that is not an embedding table.
    if (!name.ends_with(".weight") || t.shape.size() != 2 || name.find("embed") != std::string::npos) continue;
    const std::string module = name.substr(0, name.size() - 7);
    const bool stored_nvfp4 = t.dtype == DType::U8;
    EXPECT_EQ(q.expects_quantized(module), stored_nvfp4) << name << " is " << dtype_name(t.dtype);
    nvfp4 += stored_nvfp4;
  }
  EXPECT_EQ(nvfp4, expected_nvfp4_linears(c));
}

void expect_config_read_back(const SweepConfig& c, const ModelConfig& m) {
  EXPECT_EQ(m.hidden_size, c.hidden);
  EXPECT_EQ(m.vocab_size, c.vocab);
  EXPECT_EQ(m.num_hidden_layers, c.layers());
  EXPECT_EQ(m.num_attention_heads, c.heads);
  EXPECT_EQ(m.num_key_value_heads, c.kv_heads);
  EXPECT_EQ(m.head_dim, c.head_dim);
  EXPECT_EQ(m.attn_output_gate, c.attn_output_gate);
  EXPECT_EQ(m.partial_rotary_factor, c.partial_rotary_factor);
  EXPECT_EQ(m.tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_EQ(m.mtp_num_hidden_layers, c.mtp ? 1 : 0);
  for (int l = 0; l < c.layers(); ++l)
    EXPECT_EQ(m.layer_types[size_t(l)] == LayerType::FullAttention, c.layer_pattern[size_t(l)] == 'F') << l;
  if (!c.moe()) {
    EXPECT_EQ(m.num_experts, 0);
    EXPECT_EQ(m.intermediate_size, c.intermediate);
    return;
  }
  EXPECT_EQ(m.linear_num_key_heads, c.linear_key_heads);
  EXPECT_EQ(m.linear_num_value_heads, c.linear_value_heads);
  EXPECT_EQ(m.linear_key_head_dim, c.linear_key_dim);
  EXPECT_EQ(m.linear_value_head_dim, c.linear_value_dim);
  EXPECT_EQ(m.num_experts, c.experts);
  EXPECT_EQ(m.num_experts_per_tok, c.top_k);
  EXPECT_EQ(m.moe_intermediate_size, c.moe_intermediate);
  EXPECT_EQ(m.shared_expert_intermediate_size, c.shared_intermediate);
  EXPECT_EQ(m.norm_topk_prob, c.norm_topk_prob);
  EXPECT_EQ(m.mlp_only_layers, c.mlp_only_layers);
}

void check_on_cpu_engine(const SweepConfig& c) {
  ASSERT_EQ(testutil::sweep_config_problem(c), "");
  ScratchDir dir;
  testutil::write_random_checkpoint(c, dir.path());
  expect_storage_matches_quant_config(c, dir.path());
  auto runner = open_model(dir.path().string(), "cpu", c.mtp);
  expect_config_read_back(c, runner->config());
  ASSERT_EQ(runner->has_mtp(), c.mtp);

  const int V = c.vocab, H = c.hidden;
  const std::vector<int32_t> prompt = prompt_for(c);
  const ForwardOutput whole = run_prompt(*runner, prompt, kPromptTokens);
  const ForwardOutput chunked = run_prompt(*runner, prompt, kChunk);
  ASSERT_EQ(whole.rows, kPromptTokens);
  ASSERT_EQ(chunked.logits.size(), whole.logits.size());
  ASSERT_TRUE(all_finite(whole.logits));
  ASSERT_TRUE(all_finite(chunked.logits));
  const auto [lo, hi] = std::minmax_element(whole.logits.begin(), whole.logits.begin() + V);
  const double spread = double(*hi - *lo);
  EXPECT_GE(spread, kMinSpread);
  EXPECT_LE(spread, kMaxSpread);
  double worst = 0;
  for (size_t i = 0; i < whole.logits.size(); ++i)
    worst = std::max(worst, double(std::fabs(chunked.logits[i] - whole.logits[i])));
  EXPECT_LE(worst, kChunkTolerance * spread) << "chunks of " << kChunk << " vs one forward, spread " << spread;

  // The weights carry context: another first token still moves the last row (19 tokens on), so a
  // GPU engine that loses attention or DeltaNet state cannot match these logits by accident.
  std::vector<int32_t> other = prompt;
  other[0] = other[0] == 2 ? 3 : 2;
  const ForwardOutput moved = run_prompt(*runner, other, kPromptTokens);
  const size_t last = size_t(kPromptTokens - 1) * size_t(V);
  double moved_by = 0;
  for (int v = 0; v < V; ++v)
    moved_by = std::max(moved_by, double(std::fabs(moved.logits[last + v] - whole.logits[last + v])));
  EXPECT_GE(moved_by, kMinContextEffect * spread);

  if (c.mtp) {  // the MTP layer loads and runs: each position's hidden state with the next token
    ASSERT_EQ(whole.hidden.size(), size_t(kPromptTokens) * H);
    const SequenceId s = runner->add_sequence();
    const ForwardStep step{s, prompt, true};
    const ForwardOutput main = runner->forward(std::span<const ForwardStep>(&step, 1));
    const size_t n = prompt.size() - 1;
    const MtpStep draft{s, std::span<const float>(main.hidden.data(), n * size_t(H)),
                        std::span<const int32_t>(prompt.data() + 1, n), true};
    const ForwardOutput mtp = runner->mtp_forward(std::span<const MtpStep>(&draft, 1));
    ASSERT_EQ(mtp.rows, int64_t(n));
    EXPECT_TRUE(all_finite(mtp.logits));
    const auto [mlo, mhi] = std::minmax_element(mtp.logits.begin(), mtp.logits.begin() + V);
    EXPECT_GE(double(*mhi - *mlo), kMinSpread);
    runner->remove_sequence(s);
  }
}

class SweepCheckpoint : public ::testing::TestWithParam<SweepConfig> {};

TEST_P(SweepCheckpoint, RunsOnTheCpuEngineChunkedAsWhole) { check_on_cpu_engine(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Fixed, SweepCheckpoint, ::testing::ValuesIn(testutil::fixed_sweep_configs()),
                         [](const auto& info) { return "fixed" + std::to_string(info.index); });

std::vector<SweepConfig> drawn_configs() {
  std::vector<SweepConfig> out;
  for (int seed = 1; seed <= kDrawnSeeds; ++seed) out.push_back(testutil::draw_sweep_config(uint64_t(seed)));
  return out;
}

INSTANTIATE_TEST_SUITE_P(Drawn, SweepCheckpoint, ::testing::ValuesIn(drawn_configs()),
                         [](const auto& info) { return "seed" + std::to_string(info.param.seed); });

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SweepDraws, AreDeterministicInTheSeed) {
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const std::string d = testutil::draw_sweep_config(seed).describe();
    EXPECT_EQ(testutil::draw_sweep_config(seed).describe(), d);
    seen.insert(d);
  }
  EXPECT_EQ(seen.size(), 50u);
  // The same config writes the same bytes.
  const SweepConfig c = testutil::fixed_sweep_configs()[0];
  ScratchDir a, b;
  testutil::write_random_checkpoint(c, a.path());
  testutil::write_random_checkpoint(c, b.path());
  int files = 0;
  for (const auto& e : fs::directory_iterator(a.path())) {
    EXPECT_EQ(file_bytes(e.path()), file_bytes(b.path() / e.path().filename())) << e.path().filename();
    ++files;
  }
  EXPECT_GE(files, 6);  // config, generation config, hf_quant_config, 3 shards, mtp, index
}

TEST(SweepDraws, AreValidAndSmall) {
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    const SweepConfig c = testutil::draw_sweep_config(seed);
    EXPECT_EQ(testutil::sweep_config_problem(c), "") << c.describe();
    EXPECT_LE(c.parameters(), testutil::kSweepMaxParameters) << c.describe();
    EXPECT_TRUE(c.layers() >= 2 && c.layers() <= 4) << c.describe();
    EXPECT_TRUE(c.hidden >= 64 && c.hidden <= 640 && c.hidden % 16 == 0) << c.describe();
    EXPECT_TRUE(c.vocab >= 256 && c.vocab <= 512) << c.describe();
    EXPECT_TRUE(c.heads >= 1 && c.heads <= 16) << c.describe();
    if (c.moe()) {
      EXPECT_TRUE(c.experts >= 3 && c.experts <= 70 && c.top_k <= 10) << c.describe();
    }
  }
}

// What the issue asks the sweep to reach, as a list of named properties.
struct Coverage {
  std::set<std::string> hit;
  void add(const SweepConfig& c) {
    hit.insert(std::string("arch ") + testutil::sweep_arch_name(c.arch));
    hit.insert(std::string("quant ") + testutil::sweep_quant_name(c.quant));
    hit.insert(c.mtp ? "mtp on" : "mtp off");
    hit.insert("head_dim " + std::to_string(c.head_dim));
    if (c.hybrid()) hit.insert("linear key dim " + std::to_string(c.linear_key_dim));
    if (c.moe()) {
      if (c.moe_intermediate == 48) hit.insert("moe intermediate 48");
      if (c.top_k == 1) hit.insert("top_k 1");
      if (c.top_k >= 8) hit.insert("top_k >= 8");
      if (c.experts <= 4) hit.insert("experts <= 4");
      if (c.experts >= 64) hit.insert("experts >= 64");
      if (c.shared_intermediate == 0) hit.insert("no shared expert");
      if (c.hybrid() && c.layer_pattern.find('F') != std::string::npos &&
          c.layer_pattern.find('L') != std::string::npos)
        hit.insert("mixed layers");
    }
    if (c.hidden >= 512) hit.insert("hidden >= 512");
    if (c.heads >= 9) hit.insert("heads >= 9");
  }
  std::vector<std::string> missing(const std::vector<std::string>& wanted) const {
    std::vector<std::string> out;
    for (const auto& w : wanted)
      if (!hit.count(w)) out.push_back(w);
    return out;
  }
};

const std::vector<std::string> kWanted = {
    "arch qwen35_moe", "arch qwen3_next", "arch qwen3", "quant bf16", "quant nvfp4-experts", "quant nvfp4-all",
    "mtp on", "mtp off", "head_dim 24", "head_dim 256", "linear key dim 24", "moe intermediate 48", "top_k 1",
    "top_k >= 8", "experts <= 4", "experts >= 64", "no shared expert", "mixed layers", "hidden >= 512", "heads >= 9"};

TEST(SweepDraws, CoverTheSpace) {
  Coverage cov;
  for (uint64_t seed = 1; seed <= kCoverageDraws; ++seed) cov.add(testutil::draw_sweep_config(seed));
  EXPECT_EQ(cov.missing(kWanted), std::vector<std::string>{});
}

TEST(FixedSweepConfigs, HoldTheNamedCasesAndTheEdges) {
  const auto fixed = testutil::fixed_sweep_configs();
  EXPECT_GE(fixed.size(), 20u);
  Coverage cov;
  std::set<std::pair<SweepArch, SweepQuant>> combos;
  for (const auto& c : fixed) {
    EXPECT_EQ(testutil::sweep_config_problem(c), "") << c.describe();
    cov.add(c);
    combos.insert({c.arch, c.quant});
  }
  std::vector<std::string> wanted = kWanted;
  for (const char* d : {"head_dim 48", "head_dim 80", "head_dim 96"}) wanted.push_back(d);
  EXPECT_EQ(cov.missing(wanted), std::vector<std::string>{});
  EXPECT_EQ(combos.size(), 8u);  // 3 x 3 less dense Qwen3 with NVFP4 experts
  auto has = [&](auto pred) { return std::any_of(fixed.begin(), fixed.end(), pred); };
  EXPECT_TRUE(has([](const SweepConfig& c) { return c.moe() && c.top_k == 10; }));
  EXPECT_TRUE(has([](const SweepConfig& c) { return c.moe() && c.experts == 3; }));
  EXPECT_TRUE(has([](const SweepConfig& c) { return c.moe() && c.experts == 70; }));
  // Issue case 1: Qwen3.5-MoE with NVFP4 on every linear at these dims (the GPU sweep runs every
  // prefill length of the named cases).
  EXPECT_TRUE(has([](const SweepConfig& c) {
    return c.every_token_count &&
           c.describe().starts_with("qwen35_moe nvfp4-all H96 L4 q6/kv2x32 lin2/4 k32 v32 E12k3 I48 S48 mtp");
  }));
  // Issue case 2: Qwen3-Next with linear_key_head_dim 24.
  EXPECT_TRUE(has([](const SweepConfig& c) {
    return c.every_token_count && c.arch == SweepArch::Qwen3Next && c.linear_key_dim == 24;
  }));
}

}  // namespace
}  // namespace fathom
