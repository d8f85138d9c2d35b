// Tensor and expert parallelism on the CPU reference engine (issue 15): the model split over N
// ranks (threads joined by a LocalGroup) against the same model whole.
//
// Metric: every logits row of a ragged, chunked, batched run within 1e-4 of the whole model's
// logits spread (max - min); the greedy token of every row identical; MTP speculative decoding on
// the split model gives the whole model's plain greedy output, with the same drafts accepted.
// The fixtures allow N = 2 and 4 (4 attention heads); a random model with 8 heads, replicated
// DeltaNet key heads and a vocabulary that 8 does not divide covers N = 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "model/cpu_runner.h"
#include "model/tensor_split.h"
#include "runtime/offline_generate.h"

namespace fathom {
namespace {

constexpr double kLogitTolerance = 1e-4;  // fraction of the whole model's logits spread

std::string fixture(const std::string& name) { return std::string(FATHOM_FIXTURES_DIR) + "/" + name; }

std::vector<int32_t> prompt_of(int length, int salt, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 11) % vocab));
  return p;
}

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// Logits of a ragged run: two prompts prefilled together (one in two chunks, every row kept),
// then batched decode steps. The decode inputs are `forced` where given (so a split model sees
// exactly the whole model's inputs), else each row's argmax.
struct Trace {
  std::vector<float> logits;     // every row, in order
  std::vector<int32_t> argmaxes;  // of every row
  std::vector<int32_t> fed;       // decode inputs
};

Trace drive(ModelRunner& r, const std::vector<int32_t>* forced) {
  const int V = r.config().vocab_size;
  Trace t;
  auto keep = [&](const ForwardOutput& out) {
    t.logits.insert(t.logits.end(), out.logits.begin(), out.logits.end());
    for (int64_t row = 0; row < out.rows; ++row) t.argmaxes.push_back(argmax(out.logits.data() + row * V, V));
  };
  const std::vector<int32_t> a = prompt_of(13, 1, V), b = prompt_of(7, 2, V);
  const SequenceId sa = r.add_sequence(), sb = r.add_sequence();
  std::vector<ForwardStep> steps = {{sa, std::span(a).first(8), true}, {sb, std::span(b), true}};
  keep(r.forward(steps));
  steps = {{sa, std::span(a).subspan(8), true}};
  ForwardOutput last = r.forward(steps);
  keep(last);
  int32_t next[2] = {argmax(last.logits.data() + (last.rows - 1) * V, V), t.argmaxes[8 + 7 - 1] /* b's last row */};
  for (int step = 0; step < 6; ++step) {
    for (int i = 0; i < 2; ++i) {
      if (forced) next[i] = (*forced)[t.fed.size()];
      t.fed.push_back(next[i]);
    }
    steps = {{sa, std::span(&next[0], 1)}, {sb, std::span(&next[1], 1)}};
    ForwardOutput out = r.forward(steps);
    keep(out);
    for (int i = 0; i < 2; ++i) next[i] = t.argmaxes[t.argmaxes.size() - 2 + i];
  }
  r.remove_sequence(sa);
  r.remove_sequence(sb);
  return t;
}

void expect_same_run(ModelRunner& whole, ModelRunner& split, const std::string& what) {
  const Trace want = drive(whole, nullptr);
  const Trace got = drive(split, &want.fed);
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  const auto [lo, hi] = std::minmax_element(want.logits.begin(), want.logits.end());
  const double spread = double(*hi) - double(*lo);
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i)
    worst = std::max(worst, std::abs(double(got.logits[i]) - double(want.logits[i])));
  EXPECT_LE(worst, kLogitTolerance * spread) << what << ": max |split - whole| " << worst << ", spread " << spread;
  EXPECT_EQ(got.argmaxes, want.argmaxes) << what;
  // The whole engine loop (prefill chunks, batched decode) gives the same greedy tokens.
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.prefill_chunk = 5;
  const int V = whole.config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(9, 3, V), prompt_of(17, 4, V), prompt_of(3, 5, V)};
  const auto w = generate_batch(whole, prompts, opt), s = generate_batch(split, prompts, opt);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(s[i].token_ids, w[i].token_ids) << what << ", prompt " << i;
}

// ---------------------------------------------------------------------------------------------
// Every fixture at N = 2 and 4, routed experts by columns and by expert, loaded rank by rank.

using SplitCase = std::tuple<std::string, int, bool>;

class FixtureSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(FixtureSplit, LogitsAndGreedyMatchTheWholeModel) {
  const auto& [name, n, ep] = GetParam();
  static std::map<std::string, std::unique_ptr<CpuRunner>> wholes;
  auto& whole = wholes[name];
  if (!whole) whole = CpuRunner::open(fixture(name), /*with_mtp=*/false);
  auto split = CpuRunner::open(fixture(name), /*with_mtp=*/false, n, ep);
  EXPECT_EQ(split->tensor_parallel_size(), n);
  expect_same_run(*whole, *split, name + " N=" + std::to_string(n) + (ep ? " EP" : ""));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureSplit,
                         ::testing::Combine(::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next",
                                                              "qwen3_dense", "qwen35_moe_mtp_oracle"),
                                            ::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_N" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_EP" : "_TP");
                         });

// ---------------------------------------------------------------------------------------------
// MTP speculative decoding on the split model is lossless: its output is the whole model's plain
// greedy output, and the drafts (from the split MTP layer) are accepted exactly as on the whole.

TEST(TensorParallelMtp, SpeculativeIsLosslessAtTwoRanks) {
  for (const std::string name : {"qwen35_moe_mtp_oracle", "qwen35_moe"}) {
    auto whole = CpuRunner::open(fixture(name), /*with_mtp=*/true);
    const int V = whole->config().vocab_size;
    GenerateOptions opt;
    opt.max_new_tokens = 16;
    std::vector<std::vector<int32_t>> prompts = {prompt_of(11, 6, V), prompt_of(24, 7, V)};
    std::vector<int32_t> rep = prompts[0];
    rep.insert(rep.end(), prompts[0].begin(), prompts[0].end());  // repeats: drafts that get accepted
    prompts.push_back(rep);
    const auto plain = generate_batch(*whole, prompts, opt);
    for (bool ep : {false, true}) {
      auto split = CpuRunner::open(fixture(name), /*with_mtp=*/true, 2, ep);
      for (int k : {1, 3}) {
        SpecOptions spec;
        spec.algorithm = SpecAlgorithm::Mtp;
        spec.num_steps = k;
        const auto on_whole = generate_batch(*whole, prompts, opt, spec);
        const auto on_split = generate_batch(*split, prompts, opt, spec);
        int64_t accepted = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
          const std::string what = name + (ep ? " EP" : " TP") + " K=" + std::to_string(k) + " prompt " +
                                   std::to_string(i);
          EXPECT_EQ(on_split[i].token_ids, plain[i].token_ids) << what;
          EXPECT_EQ(on_split[i].spec.draft_tokens, on_whole[i].spec.draft_tokens) << what;
          EXPECT_EQ(on_split[i].spec.accepted_tokens, on_whole[i].spec.accepted_tokens) << what;
          accepted += on_split[i].spec.accepted_tokens;
        }
        if (name == "qwen35_moe_mtp_oracle") {
          EXPECT_GT(accepted, 0) << "the trained MTP head drafts nothing accepted";
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// N = 8 on a random model shaped so 8 splits it: 8 q heads over 2 K/V heads and 4 DeltaNet key
// heads (both replicated past their count), 8 value heads, 16 experts, a vocabulary of 500
// (63 rows a rank, the last padded), MTP layer included.

struct Lcg {
  uint64_t s;
  float next(float scale) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return scale * (float((s >> 40) & 0xffffff) / float(0x800000) - 1.f);
  }
};

LinearWeight random_linear(Lcg& g, int out, int in) {
  LinearWeight w;
  w.out = out;
  w.in = in;
  for (int64_t i = 0; i < int64_t(out) * in; ++i) w.w.push_back(g.next(1.f / std::sqrt(float(in))));
  return w;
}

std::vector<float> random_vec(Lcg& g, int n, float center, float scale) {
  std::vector<float> v;
  for (int i = 0; i < n; ++i) v.push_back(center + g.next(scale));
  return v;
}

MlpWeights random_mlp(Lcg& g, int h, int inter) {
  return {random_linear(g, inter, h), random_linear(g, inter, h), random_linear(g, h, inter)};
}

LayerWeights random_layer(Lcg& g, const ModelConfig& c, LayerType type) {
  const int h = c.hidden_size, d = c.head_dim;
  LayerWeights l;
  l.type = type;
  l.input_norm = random_vec(g, h, 0.f, 0.1f);  // zero-centred norms: scale 1 + w
  l.post_attention_norm = random_vec(g, h, 0.f, 0.1f);
  if (type == LayerType::FullAttention) {
    l.attn.q = random_linear(g, c.num_attention_heads * d * 2, h);
    l.attn.k = random_linear(g, c.num_key_value_heads * d, h);
    l.attn.v = random_linear(g, c.num_key_value_heads * d, h);
    l.attn.o = random_linear(g, h, c.num_attention_heads * d);
    l.attn.q_norm = random_vec(g, d, 0.f, 0.1f);
    l.attn.k_norm = random_vec(g, d, 0.f, 0.1f);
  } else {
    const int hk = c.linear_num_key_heads, hv = c.linear_num_value_heads;
    const int conv_dim = 2 * hk * c.linear_key_head_dim + hv * c.linear_value_head_dim;
    l.gdn.qkv = random_linear(g, conv_dim, h);
    l.gdn.z = random_linear(g, hv * c.linear_value_head_dim, h);
    l.gdn.b = random_linear(g, hv, h);
    l.gdn.a = random_linear(g, hv, h);
    l.gdn.out = random_linear(g, h, hv * c.linear_value_head_dim);
    l.gdn.conv = random_vec(g, conv_dim * c.linear_conv_kernel_dim, 0.f, 0.5f);
    l.gdn.dt_bias = random_vec(g, hv, 0.f, 0.5f);
    l.gdn.a_log = random_vec(g, hv, 0.f, 0.5f);
    l.gdn.norm = random_vec(g, c.linear_value_head_dim, 1.f, 0.1f);
  }
  l.is_moe = true;
  l.moe.router = random_linear(g, c.num_experts, h);
  for (int e = 0; e < c.num_experts; ++e) l.moe.experts.push_back(random_mlp(g, h, c.moe_intermediate_size));
  l.moe.shared = random_mlp(g, h, c.shared_expert_intermediate_size);
  l.moe.shared_gate = random_linear(g, 1, h);
  return l;
}

TEST(TensorParallelRandomModel, EightRanksMatchTheWholeModel) {
  ModelConfig c = ModelConfig::load(fixture("qwen35_moe"));
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.linear_num_key_heads = 4;
  c.linear_num_value_heads = 8;
  c.linear_key_head_dim = c.linear_value_head_dim = 16;
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.vocab_size = 500;
  ASSERT_TRUE(c.attn_output_gate && c.norm_zero_centered && c.mtp_num_hidden_layers == 1);
  Lcg g{42};
  ModelWeights w;
  w.embed = random_vec(g, c.vocab_size * c.hidden_size, 0.f, 1.f);
  w.final_norm = random_vec(g, c.hidden_size, 0.f, 0.1f);
  w.lm_head = random_linear(g, c.vocab_size, c.hidden_size);
  for (LayerType t : c.layer_types) w.layers.push_back(random_layer(g, c, t));
  MtpWeights m;
  m.fc = random_linear(g, c.hidden_size, 2 * c.hidden_size);
  m.pre_fc_norm_embedding = random_vec(g, c.hidden_size, 0.f, 0.1f);
  m.pre_fc_norm_hidden = random_vec(g, c.hidden_size, 0.f, 0.1f);
  m.norm = random_vec(g, c.hidden_size, 0.f, 0.1f);
  m.layer = random_layer(g, c, LayerType::FullAttention);
  w.mtp = std::move(m);

  const TensorSplit last = TensorSplit::make(c, 7, 8, false);
  EXPECT_EQ(last.vocab_rows, 63);
  EXPECT_EQ(last.vocab.size(), 500 - 7 * 63);
  EXPECT_EQ(last.kv_heads.begin, 1);
  EXPECT_EQ(last.linear_key_heads.begin, 3);

  CpuRunner whole(std::make_unique<HybridModel>(c, w));
  for (int n : {2, 4, 8})
    for (bool ep : {false, true}) {
      auto split = CpuRunner::split(c, w, n, ep);
      expect_same_run(whole, *split, "random N=" + std::to_string(n) + (ep ? " EP" : ""));
    }
  // MTP over 8 ranks, lossless too.
  auto split = CpuRunner::split(c, w, 8, true);
  GenerateOptions opt;
  opt.max_new_tokens = 10;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(12, 8, 500), prompt_of(5, 9, 500)};
  SpecOptions spec;
  spec.algorithm = SpecAlgorithm::Mtp;
  spec.num_steps = 2;
  const auto plain = generate_batch(whole, prompts, opt), spec_split = generate_batch(*split, prompts, opt, spec);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(spec_split[i].token_ids, plain[i].token_ids) << "prompt " << i;
}

// A size that does not divide the heads is refused, naming the counts.
TEST(TensorSplit, RefusesSizesThatDoNotDivide) {
  const ModelConfig c = ModelConfig::load(fixture("qwen35_moe"));
  try {
    TensorSplit::make(c, 0, 8, false);
    FAIL() << "8 ranks accepted for 4 attention heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention heads (4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CpuRunner::open(fixture("qwen35_moe"), false, 3, false), Error);
}

}  // namespace
}  // namespace fathom
