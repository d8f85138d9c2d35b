// Speculative decoding (MTP / NEXTN drafts and n-gram prompt lookup) over the ModelRunner
// interface on the CPU engine: lossless greedy outputs on every fixture (alone and in ragged
// batches), exact target distribution under sampling (rejection sampling, chi-square), the
// oracle fixture's acceptance and step count, and the random fixture's (near 0) acceptance.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "runtime/spec_test_util.h"
#include "io/safetensors.h"
#include "model/cpu_runner.h"
#include "model/hybrid_model.h"
#include "runtime/generate.h"
#include "runtime/offline_generate.h"
#include "runtime/spec_drafter.h"
#include "runtime/spec_policy.h"
#include "runtime/spec_sampling.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

constexpr const char* kOracle = "qwen35_moe_mtp_oracle";


// FATHOM_FIXTURES_DIR in the environment overrides the checked-in fixtures; a fixture missing
// there is looked up in the checked-in folder.
fs::path fixture_path(const std::string& name) {
  if (const char* env = std::getenv("FATHOM_FIXTURES_DIR"); env && fs::exists(fs::path(env) / name))
    return fs::path(env) / name;
  return fs::path(FATHOM_FIXTURES_DIR) / name;
}

using testing::read_i32;

struct Fixture {
  std::unique_ptr<CpuRunner> runner;
  std::vector<std::vector<int32_t>> prompts;
};

// Runner with the MTP layer loaded when the checkpoint has one; prompts = the golden prompts
// (chosen by make_fixtures.py for clear greedy margins) or, without goldens, seeded random ones.
Fixture* fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const fs::path dir = fixture_path(name);
    if (!fs::exists(dir / "config.json")) return nullptr;
    slot = std::make_unique<Fixture>();
    slot->runner = std::make_unique<CpuRunner>(HybridModel::load(dir, /*with_mtp=*/true));
    if (fs::exists(dir / "goldens.safetensors")) {
      auto g = SafetensorsFile::open(dir / "goldens.safetensors");
      for (int i = 0; g->find("prompt_" + std::to_string(i)); ++i)
        slot->prompts.push_back(read_i32(*g, "prompt_" + std::to_string(i)));
    } else {
      std::mt19937 rng(1234);
      const int V = slot->runner->config().vocab_size;
      for (int len : {5, 24, 80}) {
        std::vector<int32_t> p(size_t(len), 0);
        for (auto& t : p) t = 2 + int32_t(rng() % uint32_t(V - 2));
        slot->prompts.push_back(p);
      }
    }
  }
  return slot.get();
}

// The oracle's next-token map f, from its fathom_fixture.json ("next_token": [...]).
std::vector<int32_t> oracle_map() {
  std::FILE* f = std::fopen((fixture_path(kOracle) / "fathom_fixture.json").string().c_str(), "rb");
  if (!f) return {};
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  std::vector<int32_t> out;
  size_t at = text.find("\"next_token\"");
  if (at == std::string::npos) return {};
  at = text.find('[', at);
  const size_t end = text.find(']', at);
  for (const char* p = text.c_str() + at + 1; p < text.c_str() + end;) {
    char* next;
    long v = std::strtol(p, &next, 10);
    if (next == p) {
      ++p;
      continue;
    }
    out.push_back(int32_t(v));
    p = next;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Rejection sampling and n-gram lookup, no model.

TEST(SpecSampling, RejectionSamplingKeepsTargetDistribution) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> normal(0, 1.2);
  const int V = 8, N = 100000;
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> p(V), q(V);
    double sp = 0, sq = 0;
    for (int i = 0; i < V; ++i) {
      sp += p[i] = std::exp(normal(rng));
      sq += q[i] = std::exp(normal(rng));
    }
    if (trial == 3) q[2] = 0;  // a token the draft never proposes
    if (trial == 3) p[5] = 0;  // a token the target forbids (e.g. filtered by top-k)
    sp = sq = 0;
    for (int i = 0; i < V; ++i) sp += p[i], sq += q[i];
    for (int i = 0; i < V; ++i) p[i] /= sp, q[i] /= sq;
    double overlap = 0;
    for (int i = 0; i < V; ++i) overlap += std::min(p[i], q[i]);

    std::vector<int64_t> counts(V, 0), counts_det(V, 0);
    int64_t accepted = 0;
    std::discrete_distribution<int> draft_dist(q.begin(), q.end());
    const int32_t fixed_draft = int32_t(std::max_element(q.begin(), q.end()) - q.begin());
    for (int s = 0; s < N; ++s) {
      const int32_t d = draft_dist(rng);
      Acceptance a = rejection_sample(p, q, d, rng);
      accepted += a.accepted;
      ++counts[size_t(a.token)];
      ++counts_det[size_t(rejection_sample_deterministic(p, fixed_draft, rng).token)];
    }
    int dof = 0;
    const double chi = testing::chi_square(p, counts, N, &dof);
    int dof2 = 0;
    const double chi_det = testing::chi_square(p, counts_det, N, &dof2);
    const double rate = double(accepted) / N, sigma = std::sqrt(overlap * (1 - overlap) / N);
    std::printf("  trial %d: chi2 %.2f (q random), %.2f (q one-hot), dof %d, limit %.2f; acceptance %.4f vs "
                "sum min(p,q) %.4f\n", trial, chi, chi_det, dof, testing::chi2_999(dof), rate, overlap);
    EXPECT_LT(chi, testing::chi2_999(dof));
    EXPECT_LT(chi_det, testing::chi2_999(dof2));
    EXPECT_NEAR(rate, overlap, 5 * sigma);
  }
}

TEST(SpecSampling, TargetDistributionFilters) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};
  SamplingParams sp;
  auto g = target_distribution(logits.data(), 5, sp);  // temperature 0: one-hot argmax
  EXPECT_EQ(g[1], 1.0);
  sp.temperature = 1.0f;
  sp.top_k = 3;
  auto p = target_distribution(logits.data(), 5, sp);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[3], 0.0);
  EXPECT_NEAR(p[1] + p[2] + p[4], 1.0, 1e-12);
  EXPECT_NEAR(p[1] / p[2], std::exp(1.0), 1e-9);
  sp.top_k = 0;
  sp.top_p = 0.5f;
  auto t = target_distribution(logits.data(), 5, sp);
  EXPECT_GT(t[1], 0.0);
  EXPECT_GT(t[4], 0.0);
  EXPECT_EQ(t[2], 0.0);
}

TEST(SpecNgram, PromptLookupConventions) {
  // vLLM's docstring example: [1,2,3,4,2,3], n in 2..3, k = 4 -> [4,2,3].
  std::vector<int32_t> a = {1, 2, 3, 4, 2, 3};
  EXPECT_EQ(ngram_propose(a, 2, 3, 4), (std::vector<int32_t>{4, 2, 3}));
  EXPECT_EQ(ngram_propose(a, 2, 3, 2), (std::vector<int32_t>{4, 2}));
  // No earlier occurrence of any suffix n-gram.
  std::vector<int32_t> b = {1, 2, 3, 4, 5};
  EXPECT_TRUE(ngram_propose(b, 1, 3, 4).empty());
  // The longest match wins over an earlier shorter one; min_n excludes short matches.
  std::vector<int32_t> c = {7, 9, 1, 8, 7, 9, 2, 8, 7, 9};
  EXPECT_EQ(ngram_propose(c, 1, 3, 2), (std::vector<int32_t>{2, 8}));  // "8 7 9" at 3
  EXPECT_EQ(ngram_propose(c, 2, 2, 3), (std::vector<int32_t>{1, 8, 7}));  // "7 9": earliest (0)
  std::vector<int32_t> d = {5, 6, 7, 6};
  EXPECT_TRUE(ngram_propose(d, 2, 4, 3).empty());
  EXPECT_EQ(ngram_propose(d, 1, 4, 3), (std::vector<int32_t>{7, 6}));  // fewer than k follow
  EXPECT_TRUE(ngram_propose(d, 1, 4, 0).empty());
}

// ---------------------------------------------------------------------------------------------
// Lossless greedy decoding on every fixture.

// Fixed K (every round drafts K, the most verification and rollback) unless `adaptive`.
struct Mode {
  SpecAlgorithm algo;
  int k;
  bool adaptive = false;
  SpecOptions options() const {
    SpecOptions o;
    o.algorithm = algo;
    o.num_steps = k;
    o.adaptive = adaptive;
    return o;
  }
};

std::string mode_name(const Mode& m) {
  return std::string(spec_algorithm_name(m.algo)) + " K=" + std::to_string(m.k) + (m.adaptive ? " adaptive" : "");
}

class SpecFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fx_ = fixture(GetParam());
    ASSERT_TRUE(fx_) << "fixture " << GetParam() << " missing under " << fixture_path(GetParam());
  }
  std::vector<Mode> modes() const {
    std::vector<Mode> m;
    if (fx_->runner->has_mtp()) {
      for (int k = 1; k <= 4; ++k) m.push_back({SpecAlgorithm::Mtp, k});
      m.push_back({SpecAlgorithm::Mtp, 3, true});
    }
    m.push_back({SpecAlgorithm::Ngram, 1});
    m.push_back({SpecAlgorithm::Ngram, 3});
    m.push_back({SpecAlgorithm::Ngram, 3, true});
    return m;
  }
  Fixture* fx_ = nullptr;
};

TEST_P(SpecFixtureTest, GreedyIsLosslessAloneAndBatched) {
  CpuRunner& runner = *fx_->runner;
  GenerateOptions opt;
  opt.max_new_tokens = 16;  // the goldens' horizon; no eos stop (goldens ignore eos)
  // Golden prompts, plus a prompt that repeats itself so n-gram drafts are proposed and partly
  // accepted.
  std::vector<std::vector<int32_t>> prompts = fx_->prompts;
  std::vector<int32_t> rep = prompts[1];
  rep.insert(rep.end(), prompts[1].begin(), prompts[1].begin() + 12);
  prompts.push_back(rep);
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(generate(runner.model(), p, opt).token_ids);
  // The ModelRunner path without speculation.
  auto plain = generate_batch(runner, prompts, opt);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(plain[i].token_ids, want[i]) << "plain batch, prompt " << i;

  for (const Mode& m : modes()) {
    const SpecOptions spec = m.options();
    SpecStats total;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateResult r = generate(runner, prompts[i], opt, spec);
      EXPECT_EQ(r.token_ids, want[i]) << mode_name(m) << ", prompt " << i << " alone";
      EXPECT_EQ(r.target_forward_steps, r.spec.steps);
      EXPECT_EQ(int64_t(r.token_ids.size()), 1 + r.spec.steps + r.spec.accepted_tokens);
      total.merge(r.spec);
    }
    // Ragged batch: mixed lengths, each prompt twice (different slots, same outputs).
    std::vector<std::vector<int32_t>> batch = prompts;
    batch.insert(batch.end(), prompts.rbegin(), prompts.rend());
    auto rs = generate_batch(runner, batch, opt, spec);
    ASSERT_EQ(rs.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i)
      EXPECT_EQ(rs[i].token_ids, want[i < prompts.size() ? i : 2 * prompts.size() - 1 - i])
          << mode_name(m) << ", batch slot " << i;
    std::printf("  %s %s: %lld steps, %lld drafts, %lld accepted (%.1f%%)\n", GetParam().c_str(),
                mode_name(m).c_str(), (long long)total.steps, (long long)total.draft_tokens,
                (long long)total.accepted_tokens, 100 * total.acceptance_rate());
  }
}

// Stop tokens end generation inside an accepted run of drafts exactly as plain decoding does.
TEST_P(SpecFixtureTest, StopTokenInsideAcceptedDrafts) {
  CpuRunner& runner = *fx_->runner;
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  const auto& prompt = fx_->prompts[1];
  GenerateResult ref = generate(runner.model(), prompt, opt);
  opt.stop_token_ids = {ref.token_ids[6]};
  ref = generate(runner.model(), prompt, opt);
  ASSERT_EQ(ref.finish_reason, "stop");
  for (const Mode& m : modes()) {
    GenerateResult r = generate(runner, prompt, opt, m.options());
    EXPECT_EQ(r.token_ids, ref.token_ids) << mode_name(m);
    EXPECT_EQ(r.finish_reason, "stop") << mode_name(m);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecFixtureTest,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next", "qwen3_dense", kOracle),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// MTP draft extend: every first draft equals the MTP run over the final sequence in one pass
// (target hidden states from a plain prefill), i.e. the MTP cache holds what the true hidden
// states produce after any mix of acceptances and rollbacks.

TEST(SpecMtp, DraftExtendMatchesOnePassMtp) {
  Fixture* fx = fixture("qwen35_moe");
  ASSERT_TRUE(fx && fx->runner->has_mtp());
  CpuRunner& runner = *fx->runner;
  const HybridModel& m = runner.model();
  const int64_t V = runner.config().vocab_size, H = runner.config().hidden_size;
  for (int k : {1, 3}) {
    std::vector<MtpDrafter::Trace> trace;
    SpecOptions spec{SpecAlgorithm::Mtp, k};
    spec.adaptive = false;  // draft every round: the most extends and rollbacks
    spec.mtp_trace = &trace;
    GenerateOptions opt;
    opt.max_new_tokens = 16;
    opt.prefill_chunk = 7;  // several prefill extends too
    const auto& prompt = fx->prompts[1];
    GenerateResult r = generate(runner, prompt, opt, spec);
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), r.token_ids.begin(), r.token_ids.end());
    SequenceState st = m.new_sequence();
    auto out = prefill(m, st, seq, 1 << 20, true);
    const size_t n = seq.size() - 1;
    HybridModel::MtpSegment seg{&st, std::span<const float>(out.hidden.data(), n * H),
                                std::span<const int32_t>(seq.data() + 1, n)};
    auto ref = m.mtp_forward(std::span<const HybridModel::MtpSegment>(&seg, 1), true);
    int checked = 0;
    for (const auto& t : trace) {
      ASSERT_LT(size_t(t.pos), n);
      const float* row = ref.logits.data() + t.pos * V;
      std::vector<float> sorted(row, row + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] < 1e-3f) continue;
      EXPECT_EQ(t.draft, argmax(row, V)) << "K=" << k << ", MTP position " << t.pos;
      ++checked;
    }
    std::printf("  K=%d: %d first drafts checked against a one-pass MTP (%zu traced)\n", k, checked, trace.size());
    EXPECT_GT(checked, 8);
  }
}

// A chain proposed but never verified (the serving engine could not schedule its sequence)
// leaves rows in the MTP cache; proposing again must start from the extend again and give the
// same drafts.
TEST(SpecMtp, ReproposingAfterAnUnverifiedChainGivesTheSameDrafts) {
  Fixture* fx = fixture("qwen35_moe");
  ASSERT_TRUE(fx && fx->runner->has_mtp());
  CpuRunner& runner = *fx->runner;
  const int64_t H = runner.config().hidden_size;
  const std::vector<int32_t>& prompt = fx->prompts[1];
  const SequenceId id = runner.add_sequence();
  ForwardStep st{id, prompt, /*all_rows=*/false, /*keep_history=*/false, /*all_hidden=*/true};
  ForwardOutput out = runner.forward(std::span<const ForwardStep>(&st, 1));
  ASSERT_EQ(int64_t(out.hidden.size()), int64_t(prompt.size()) * H);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(argmax(out.logits.data(), runner.config().vocab_size));
  MtpDrafter drafter(runner);
  DraftExtend e{id, 0, out.hidden, next};
  drafter.extend(std::span<const DraftExtend>(&e, 1));
  std::vector<int32_t> ctx = prompt;
  ctx.push_back(next.back());
  DraftRequest a{id, ctx, 3, {}}, b{id, ctx, 3, {}};
  drafter.propose(std::span<DraftRequest>(&a, 1));
  const int64_t after_first = runner.mtp_length(id);
  drafter.propose(std::span<DraftRequest>(&b, 1));
  EXPECT_EQ(a.drafts.size(), 3u);
  EXPECT_EQ(b.drafts, a.drafts);
  EXPECT_EQ(runner.mtp_length(id), after_first);
  drafter.release(id);
  runner.remove_sequence(id);
}

// ---------------------------------------------------------------------------------------------
// The oracle fixture: next token = f(current), MTP always right.

TEST(SpecOracle, AcceptanceAndStepCount) {
  Fixture* fx = fixture(kOracle);
  ASSERT_TRUE(fx) << "run tools/make_mtp_fixture.py";
  CpuRunner& runner = *fx->runner;
  const std::vector<int32_t> f = oracle_map();
  ASSERT_EQ(int64_t(f.size()), runner.config().vocab_size);
  GenerateOptions opt;
  opt.max_new_tokens = 32;
  const auto& prompt = fx->prompts[1];
  GenerateResult plain = generate(runner, prompt, opt);
  // The oracle really is f.
  int32_t x = prompt.back();
  for (int32_t t : plain.token_ids) {
    EXPECT_EQ(t, f[size_t(x)]);
    x = t;
  }
  EXPECT_EQ(plain.target_forward_steps, opt.max_new_tokens - 1);
  for (int k = 1; k <= 4; ++k) {
    GenerateResult r = generate(runner, prompt, opt, SpecOptions{SpecAlgorithm::Mtp, k});
    EXPECT_EQ(r.token_ids, plain.token_ids);
    const double ratio = double(r.target_forward_steps) / double(plain.target_forward_steps);
    std::printf("  oracle mtp K=%d: acceptance %.3f, %lld target steps vs %lld plain (%.2fx), %.2f tokens/step\n",
                k, r.spec.acceptance_rate(), (long long)r.target_forward_steps,
                (long long)plain.target_forward_steps, ratio, r.spec.tokens_per_step());
    EXPECT_GE(r.spec.acceptance_rate(), 0.9);
    // Each round emits k + 1 tokens: about 1 / (k + 1) of the plain step count.
    EXPECT_LE(ratio, 1.0 / (k + 1) + 0.1);
  }
  // n-grams on a prompt that already contains the chain: prompt lookup finds it every round.
  std::vector<int32_t> chain = {prompt[0]};
  for (int i = 0; i < 40; ++i) chain.push_back(f[size_t(chain.back())]);
  std::vector<int32_t> p2 = chain;
  p2.push_back(chain[0]);
  GenerateResult ng_ref = generate(runner, p2, opt);
  GenerateResult ng = generate(runner, p2, opt, SpecOptions{SpecAlgorithm::Ngram, 4});
  EXPECT_EQ(ng.token_ids, ng_ref.token_ids);
  std::printf("  oracle ngram K=4 on a repeated chain: acceptance %.3f, %lld target steps vs %lld\n",
              ng.spec.acceptance_rate(), (long long)ng.target_forward_steps, (long long)ng_ref.target_forward_steps);
  EXPECT_GE(ng.spec.acceptance_rate(), 0.9);
  EXPECT_LE(ng.target_forward_steps, ng_ref.target_forward_steps / 4 + 2);
}

// Temperature sampling on the oracle: the joint distribution of the first three generated
// tokens with MTP speculation (K = 2, so tokens 2 and 3 come from one verification round with
// accepts and rejections) matches the exact target distribution, computed by teacher forcing.
TEST(SpecOracle, SamplingMatchesTargetDistribution) {
  Fixture* fx = fixture(kOracle);
  ASSERT_TRUE(fx);
  CpuRunner& runner = *fx->runner;
  const HybridModel& m = runner.model();
  SamplingParams sp;
  sp.temperature = 4.0f;  // p(f(x)) about 0.7: both acceptance and rejection are common
  sp.top_k = 4;
  const std::vector<int32_t> prompt = fx->prompts[0];

  const testing::Joint3 joint = testing::exact_joint3(m, prompt, sp);
  const char* runs_env = std::getenv("FATHOM_SPEC_SAMPLING_RUNS");  // for debugging runs
  const int N = runs_env ? std::atoi(runs_env) : 3000;
  GenerateOptions opt;
  opt.max_new_tokens = 4;
  opt.sampling = sp;
  std::vector<int64_t> spec_counts(joint.cells.size(), 0), plain_counts(joint.cells.size(), 0);
  SpecStats stats;
  for (int i = 0; i < N; ++i) {
    opt.sampling.seed = 1000 + uint64_t(i);
    GenerateResult r = generate(runner, prompt, opt, SpecOptions{SpecAlgorithm::Mtp, 2});
    stats.merge(r.spec);
    const int64_t c = joint.cell_of(r.token_ids);
    ASSERT_GE(c, 0) << "sampled a sequence of probability 0";
    ++spec_counts[size_t(c)];
    const int64_t c2 = joint.cell_of(generate(m, prompt, opt).token_ids);  // control: plain Sampler
    ASSERT_GE(c2, 0);
    ++plain_counts[size_t(c2)];
  }
  int dof = 0, dof2 = 0;
  const double chi = testing::chi_square(joint.p, spec_counts, N, &dof),
               chi_plain = testing::chi_square(joint.p, plain_counts, N, &dof2);
  std::printf("  oracle T=%.1f top-k %d, %d runs: chi2 speculative %.2f, plain %.2f (dof %d, 99.9%% limit %.2f); "
              "acceptance %.3f by position [%.3f, %.3f]\n", sp.temperature, sp.top_k, N, chi, chi_plain, dof,
              testing::chi2_999(dof), stats.acceptance_rate(), stats.acceptance_by_position()[0],
              stats.acceptance_by_position().size() > 1 ? stats.acceptance_by_position()[1] : 0.0);
  EXPECT_LT(chi, testing::chi2_999(dof));
  EXPECT_LT(chi_plain, testing::chi2_999(dof2));
  // Acceptance must be well away from 0 and 1 for this to test both branches.
  EXPECT_GT(stats.acceptance_rate(), 0.3);
  EXPECT_LT(stats.acceptance_rate(), 0.95);
}

// ---------------------------------------------------------------------------------------------
// The adaptive draft length: grows back after full acceptance, backs off on misses at 1 draft.

TEST(SpecPolicy, DraftLengthBackoffAndRetirement) {
  DraftLengthPolicy p(3, /*adaptive=*/true, /*retire=*/false);
  DraftLengthState s = p.start();
  EXPECT_EQ(p.next(s), 3);
  p.update(s, 3, 3);
  EXPECT_EQ(p.next(s), 3);  // capped at K
  p.update(s, 3, 1);
  EXPECT_EQ(p.next(s), 2);  // accepted + 1
  p.update(s, 2, 0);
  EXPECT_EQ(p.next(s), 1);
  // 8 drafts so far (4 accepted): misses at 1 draft now back off 2, 4, 8, ... 64 plain rounds.
  std::vector<int> plain_runs;
  for (int probe = 0; probe < 8; ++probe) {
    p.update(s, 1, 0);
    int plain = 0;
    while (p.next(s) == 0) ++plain;
    plain_runs.push_back(plain);
  }
  EXPECT_EQ(plain_runs, (std::vector<int>{2, 4, 8, 16, 32, 64, 64, 64}));
  p.update(s, 1, 1);  // an acceptance ends the back-off and grows the length
  EXPECT_EQ(p.next(s), 2);
  p.update(s, 2, 0);
  EXPECT_EQ(p.next(s), 1);
  p.update(s, 1, 0);  // the first miss after a hit: back to the shortest back-off
  EXPECT_EQ(p.next(s), 0);
  EXPECT_EQ(p.next(s), 0);
  EXPECT_EQ(p.next(s), 1);
  EXPECT_FALSE(s.retired);  // n-gram style: never retires

  // Before kEvidence drafts a miss does not back off; with `retire`, a sequence that has
  // accepted under 10% of 8 drafts stops drafting.
  DraftLengthPolicy r(3, true, /*retire=*/true);
  DraftLengthState t = r.start();
  int rounds = 0;
  for (int k; (k = r.next(t)) > 0; ++rounds) r.update(t, k, 0);
  EXPECT_TRUE(t.retired);
  EXPECT_EQ(t.drafted, 8);  // 3, then 1 x 5
  EXPECT_EQ(rounds, 6);
  DraftLengthState u = r.start();
  r.update(u, 3, 2);  // 2 of 3
  for (int i = 0; i < 5; ++i) r.update(u, 1, 0);
  EXPECT_FALSE(u.retired);  // 2 of 8 = 25%
  // Not adaptive: always K.
  DraftLengthPolicy fixed(4, false, true);
  DraftLengthState f = fixed.start();
  for (int i = 0; i < 5; ++i) {
    fixed.update(f, 4, 0);
    EXPECT_EQ(fixed.next(f), 4);
  }
}

// ---------------------------------------------------------------------------------------------
// The random fixture: MTP drafts are almost never right. Adaptive drafting keeps the extra
// target work small (asserted on token counts, which are deterministic); the wall-clock slowdown
// is printed here and measured as a benchmark in docs/perf.md.

TEST(SpecRandom, AcceptanceNearZeroAndOverheadBounded) {
  Fixture* fx = fixture("qwen35_moe");
  ASSERT_TRUE(fx);
  CpuRunner& runner = *fx->runner;
  GenerateOptions opt;
  opt.max_new_tokens = 128;
  const auto& prompt = fx->prompts[1];
  using clock = std::chrono::steady_clock;
  auto time_it = [&](const SpecOptions& spec, GenerateResult* out) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = clock::now();
      *out = generate(runner, prompt, opt, spec);
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    return best;
  };
  GenerateResult plain, mtp;
  const double t_plain = time_it(SpecOptions{}, &plain);
  for (bool adaptive : {false, true}) {
    for (int k : {1, 3}) {
      SpecOptions spec{SpecAlgorithm::Mtp, k};
      spec.adaptive = adaptive;
      const double t_mtp = time_it(spec, &mtp);
      EXPECT_EQ(mtp.token_ids, plain.token_ids);
      const double extra = double(mtp.spec.draft_tokens) / double(mtp.token_ids.size());
      std::printf("  random qwen35_moe mtp K=%d%s: acceptance %.3f (%lld/%lld), %lld target steps vs %lld, "
                  "%.3f extra target tokens per output token; wall %.2f ms vs %.2f ms plain = %.2fx\n", k,
                  adaptive ? " adaptive" : "", mtp.spec.acceptance_rate(), (long long)mtp.spec.accepted_tokens,
                  (long long)mtp.spec.draft_tokens, (long long)mtp.target_forward_steps,
                  (long long)plain.target_forward_steps, extra, 1e3 * t_mtp, 1e3 * t_plain, t_mtp / t_plain);
      EXPECT_LT(mtp.spec.acceptance_rate(), 0.2);
      if (adaptive) {
        EXPECT_LT(extra, 0.1) << "adaptive drafting should back off at acceptance near 0";
      }
    }
  }
}

}  // namespace
}  // namespace fathom
