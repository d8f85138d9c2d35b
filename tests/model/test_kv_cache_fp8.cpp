// The CPU engine's FP8 (E4M3) KV cache (HybridModel::set_kv_cache_fp8), the oracle of the CUDA
// engine's --kv-cache-dtype fp8, on the tiny fixtures:
//  - the scales are read from the checkpoint (k_proj.k_scale 0-d, v_proj.v_scale [1]; 1 when absent);
//  - the cache holds exactly e4m3(x / scale) * scale of what the fp32 engine caches: checked
//    element by element for the first full-attention layer (whose K and V do not depend on
//    earlier caches), and for every layer (and the MTP layer's) that each value is such a
//    product;
//  - logits stay near the fp32 engine's with scales of 1 (bound below), and move far from them
//    with a scale that saturates K or flushes V, so the scales are in the arithmetic.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "golden_reader.h"
#include "io/checkpoint.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/hybrid_model.h"
#include "model/kv_scaled_checkpoint.h"
#include "model/model_runner.h"
#include "model/model_weights.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::fixtures_dir;
using testutil::KvScales;

// Row error: max |logit - logit_fp32| over the spread of the fp32 row. E4M3 keeps 3 mantissa
// bits (relative error up to 1/16 per cached value); averaged over the keys and values that an
// attention output mixes, the fixtures' worst rows move by 0.5% (qwen35_moe, 2 of 8 layers
// attention) to 6% (qwen3_dense, all attention) of their spread (measured).
constexpr double kFp8RowTolerance = 0.1;

double row_error(const std::vector<float>& got, const std::vector<float>& ref, int V) {
  double worst = 0;
  for (size_t r = 0; r < ref.size() / size_t(V); ++r) {
    auto [mn, mx] = std::minmax_element(ref.begin() + r * V, ref.begin() + (r + 1) * V);
    double e = 0;
    for (int v = 0; v < V; ++v) e = std::max(e, double(std::fabs(got[r * V + v] - ref[r * V + v])));
    worst = std::max(worst, e / double(*mx - *mn));
  }
  return worst;
}

float e4m3_round(float x, float scale) { return fp8_e4m3_to_f32(f32_to_fp8_e4m3(x / scale)) * scale; }

std::vector<int32_t> prompt_of(int n, int vocab) {
  std::mt19937 rng(uint32_t(n * 7 + 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(2 + rng() % uint32_t(vocab - 2));
  return p;
}

struct Loaded {
  ModelConfig cfg;
  ModelWeights w;
};

Loaded load(const fs::path& dir, bool mtp) {
  Loaded l{ModelConfig::load(dir), {}};
  const QuantConfig quant = QuantConfig::load(dir, read_text_file(dir / "config.json"));
  l.w = load_model_weights(*Checkpoint::open(dir), l.cfg, quant, mtp);
  return l;
}

// All-row logits of `prompt` (prefill in chunks of 9, so later chunks read cached positions).
HybridModel::Output run(const HybridModel& m, SequenceState& st, const std::vector<int32_t>& prompt) {
  HybridModel::Output all;
  for (size_t b = 0; b < prompt.size(); b += 9) {
    const std::vector<int32_t> part(prompt.begin() + b, prompt.begin() + std::min(prompt.size(), b + 9));
    const HybridModel::Segment seg{&st, part};
    HybridModel::Output o = m.forward(std::span<const HybridModel::Segment>(&seg, 1), true);
    all.logits.insert(all.logits.end(), o.logits.begin(), o.logits.end());
    all.hidden.insert(all.hidden.end(), o.hidden.begin(), o.hidden.end());
    all.rows += o.rows;
  }
  return all;
}

KvScales scales_of(int i) { return {0.011f * float(i + 1) + 0.003f, 0.0017f * float(i + 2)}; }

class KvCacheFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheFp8, ScalesLoadAndCacheIsScaledE4m3) {
  const fs::path src = fixtures_dir() / GetParam();
  const fs::path dir = testutil::make_kv_scaled_checkpoint(src, "kv_scales_" + GetParam(), scales_of);
  const bool mtp = ModelConfig::load(src).mtp_num_hidden_layers > 0;
  Loaded scaled = load(dir, mtp), plain = load(src, mtp);
  // The loader's scales: the checkpoint's where present, 1 where not.
  int attn = 0;
  for (size_t li = 0; li < scaled.w.layers.size(); ++li) {
    if (scaled.w.layers[li].type != LayerType::FullAttention) continue;
    EXPECT_EQ(scaled.w.layers[li].attn.k_scale, scales_of(attn).k) << "layer " << li;
    EXPECT_EQ(scaled.w.layers[li].attn.v_scale, scales_of(attn).v) << "layer " << li;
    EXPECT_EQ(plain.w.layers[li].attn.k_scale, 1.f);
    EXPECT_EQ(plain.w.layers[li].attn.v_scale, 1.f);
    ++attn;
  }
  ASSERT_GT(attn, 0);
  if (mtp) {
    EXPECT_EQ(scaled.w.mtp->layer.attn.k_scale, scales_of(attn).k);
    EXPECT_EQ(scaled.w.mtp->layer.attn.v_scale, scales_of(attn).v);
  }
  std::vector<KvScales> layer_scales;
  for (const LayerWeights& l : scaled.w.layers)
    if (l.type == LayerType::FullAttention) layer_scales.push_back({l.attn.k_scale, l.attn.v_scale});

  HybridModel fp8(scaled.cfg, std::move(scaled.w)), fp32(plain.cfg, std::move(plain.w));
  fp8.set_kv_cache_fp8(true);
  const std::vector<int32_t> prompt = prompt_of(30, fp8.config().vocab_size);
  SequenceState s8 = fp8.new_sequence(), s32 = fp32.new_sequence();
  const HybridModel::Output o8 = run(fp8, s8, prompt);
  run(fp32, s32, prompt);

  // The first full-attention layer: the fp32 engine's cache, rounded, element for element.
  const KvCache &c8 = s8.kv[0], &c32 = s32.kv[0];
  ASSERT_EQ(c8.k.size(), c32.k.size());
  size_t changed = 0;
  for (size_t i = 0; i < c8.k.size(); ++i) {
    ASSERT_EQ(c8.k[i], e4m3_round(c32.k[i], layer_scales[0].k)) << "k " << i << " of " << c32.k[i];
    ASSERT_EQ(c8.v[i], e4m3_round(c32.v[i], layer_scales[0].v)) << "v " << i << " of " << c32.v[i];
    changed += c8.k[i] != c32.k[i];
  }
  EXPECT_GT(changed, c8.k.size() / 2);  // the rounding did happen
  // Every layer: each cached value is a code times the layer's scale (rounding it again is exact).
  for (size_t l = 0; l < s8.kv.size(); ++l)
    for (size_t i = 0; i < s8.kv[l].k.size(); ++i) {
      ASSERT_EQ(s8.kv[l].k[i], e4m3_round(s8.kv[l].k[i], layer_scales[l].k)) << "layer " << l;
      ASSERT_EQ(s8.kv[l].v[i], e4m3_round(s8.kv[l].v[i], layer_scales[l].v)) << "layer " << l;
    }
  if (mtp) {
    const int64_t n = int64_t(prompt.size()) - 1;
    const int H = fp8.config().hidden_size;
    const std::vector<float> hidden(o8.hidden.begin(), o8.hidden.begin() + n * H);
    const std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    const HybridModel::MtpSegment seg{&s8, hidden, next};
    fp8.mtp_forward(std::span<const HybridModel::MtpSegment>(&seg, 1), false);
    ASSERT_EQ(s8.mtp_kv.length(), n);
    const KvScales ms = scales_of(attn);
    for (size_t i = 0; i < s8.mtp_kv.k.size(); ++i) {
      ASSERT_EQ(s8.mtp_kv.k[i], e4m3_round(s8.mtp_kv.k[i], ms.k)) << "mtp k " << i;
      ASSERT_EQ(s8.mtp_kv.v[i], e4m3_round(s8.mtp_kv.v[i], ms.v)) << "mtp v " << i;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_P(KvCacheFp8, LogitsNearFp32AndScalesMatter) {
  const fs::path src = fixtures_dir() / GetParam();
  Loaded base = load(src, false);
  const int V = base.cfg.vocab_size;
  const std::vector<int32_t> prompt = prompt_of(40, V);
  auto logits = [&](bool fp8, float k_scale, float v_scale) {
    ModelWeights w = base.w;
    for (LayerWeights& l : w.layers) l.attn.k_scale = k_scale, l.attn.v_scale = v_scale;
    HybridModel m(base.cfg, std::move(w));
    m.set_kv_cache_fp8(fp8);
    SequenceState st = m.new_sequence();
    return run(m, st, prompt).logits;
  };
  const std::vector<float> ref = logits(false, 1.f, 1.f);
  const double unit = row_error(logits(true, 1.f, 1.f), ref, V);
  // Scales that keep the fixtures' values (|k| ~ 1 after k_norm) in range change little.
  const double fitted = row_error(logits(true, 0.03f, 0.03f), ref, V);
  // K saturated at +-448 * 1e-4 (softmax nearly uniform), V flushed to zero under 1e4: far off.
  const double saturated = row_error(logits(true, 1e-4f, 1.f), ref, V);
  const double flushed = row_error(logits(true, 1.f, 1e4f), ref, V);
  std::printf("  %s: fp8 KV vs fp32 KV, worst row error: scales 1 %.3e, 0.03 %.3e, k 1e-4 %.3e, v 1e4 %.3e\n",
              GetParam().c_str(), unit, fitted, saturated, flushed);
  EXPECT_GT(unit, 0.0);  // the cache was rounded
  EXPECT_LT(unit, kFp8RowTolerance);
  EXPECT_LT(fitted, kFp8RowTolerance);
  EXPECT_GT(saturated, 3 * std::max(unit, fitted));
  EXPECT_GT(flushed, 3 * std::max(unit, fitted));
}

// --kv-cache-dtype auto follows the checkpoint: fp8 where hf_quant_config.json says
// kv_cache_quant_algo FP8 (the NVFP4 fixture with that one field changed), bf16 where it says
// nothing; an explicit value wins.
TEST(KvCacheFp8Engine, AutoFollowsTheQuantConfig) {
  const fs::path src = fixtures_dir() / "qwen35_moe_nvfp4";
  const fs::path dir = fs::temp_directory_path() / ("fathom_kv_auto_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "hf_quant_config.json") fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
  std::string hf = read_text_file(src / "hf_quant_config.json");
  const std::string field = "\"kv_cache_quant_algo\": null";
  ASSERT_NE(hf.find(field), std::string::npos);
  hf.replace(hf.find(field), field.size(), "\"kv_cache_quant_algo\": \"FP8\"");
  std::ofstream(dir / "hf_quant_config.json") << hf;
  EngineOptions o;
  EXPECT_EQ(open_model(dir.string(), "cpu", false, o)->kv_cache_dtype(), KvCacheDtype::Fp8E4M3);
  EXPECT_EQ(open_model(src.string(), "cpu", false, o)->kv_cache_dtype(), KvCacheDtype::Bf16);
  o.kv_cache_dtype = "bf16";
  EXPECT_EQ(open_model(dir.string(), "cpu", false, o)->kv_cache_dtype(), KvCacheDtype::Bf16);
  o.kv_cache_dtype = "fp8";
  EXPECT_EQ(open_model(src.string(), "cpu", false, o)->kv_cache_dtype(), KvCacheDtype::Fp8E4M3);
  o.kv_cache_dtype = "fp16";
  EXPECT_THROW(open_model(src.string(), "cpu", false, o), std::runtime_error);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvCacheFp8, ::testing::Values("qwen35_moe", "qwen3_dense"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fathom
