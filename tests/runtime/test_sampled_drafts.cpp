// Drafts drawn from the MTP layer's distribution (--speculative-sampled-drafts) in fused MTP
// rounds, where the runner chooses tokens (RowSamplingRunner: the GPU's path on the CPU engine):
// the draft of a sampled request is drawn from q (the MTP layer's row with the request's
// parameters) and verified with min(1, p / q), the residual max(p - q, 0) on refusal. The first
// three tokens of 2,000 seeded sequences keep the exact target distribution, in unchained and
// chained rounds; drafts are accepted at least as often as the MTP argmax (on the oracle fixture,
// whose MTP layer is close to the model, much more); greedy requests beside them are unchanged;
// and engines that cannot draw sampled drafts refuse the option by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "runtime/cpu_fixtures.h"
#include "runtime/engine_test_util.h"
#include "runtime/generate.h"
#include "runtime/spec_sampling.h"
#include "runtime/spec_test_util.h"

namespace fathom {
namespace {

using testing::Finished;
using testing::Job;
using testing::metric;
using testing::run_burst;

using testing::random_prompt;

std::unique_ptr<CpuRunner> load_runner(const std::string& name) { return testing::load_cpu_runner(name, true); }

// MTP K = 1 in fused rounds under device sampling; chained rounds need the adaptive length off.
// All `n` sequences run at once: after their prefills every step decodes, so rounds fuse (and
// chain, nobody waiting).
EngineConfig mtp_config(bool sampled_drafts, bool chained, int n) {
  EngineConfig c;
  c.max_num_seqs = n;
  c.max_num_batched_tokens = 2048;
  c.max_model_len = 512;
  c.max_queue_len = n;
  c.spec.algorithm = SpecAlgorithm::Mtp;
  c.spec.num_steps = 1;
  c.spec.adaptive = false;
  c.spec.sampled_drafts = sampled_drafts;
  c.chained_mtp_rounds = chained;
  return c;
}

struct RunStats {
  double chi = 0, limit = 0, acceptance = 0, fused = 0, chained = 0;
};

// N seeded sequences of 12 tokens after one prompt through the engine; each token from the
// second on (the ones fused rounds verify) mapped to u = F(x - 1) + U p(x) under the exact
// target distribution p of its position (teacher forcing on the CPU model; F by token id, U a
// fixed-seed uniform): u is uniform on [0, 1) exactly when the tokens follow p (the randomized
// probability integral transform), checked by chi-square over 20 bins.
RunStats sample_run(const char* fixture, const SamplingParams& sp, bool sampled_drafts, bool chained) {
  auto probe = load_runner(fixture);
  const int64_t V = probe->config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(9, int(V), 77);
  const int N = 400, T = 40, kBins = 20;
  std::vector<Job> jobs(N);
  for (int i = 0; i < N; ++i) {
    jobs[size_t(i)].prompt = prompt;
    jobs[size_t(i)].params.max_tokens = T;
    jobs[size_t(i)].params.ignore_eos = true;
    jobs[size_t(i)].params.sampling = sp;
    jobs[size_t(i)].params.sampling.seed = 9000 + uint64_t(i);
  }
  std::string m;
  const auto got = run_burst(std::make_unique<RowSamplingRunner>(load_runner(fixture)),
                             mtp_config(sampled_drafts, chained, N), jobs, &m);
  std::vector<int64_t> bins(kBins, 0);
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  int64_t n = 0;
  for (const Finished& f : got) {
    EXPECT_EQ(f.ids.size(), size_t(T));
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), f.ids.begin(), f.ids.end());
    SequenceState st = probe->model().new_sequence();
    const HybridModel::Output out = prefill(probe->model(), st, seq, 1 << 20, /*all_rows=*/true);
    for (size_t t = 1; t < f.ids.size(); ++t) {
      const std::vector<double> p =
          target_distribution(out.logits.data() + (int64_t(prompt.size()) - 1 + int64_t(t)) * V, V, sp);
      const int32_t x = f.ids[t];
      EXPECT_GT(p[size_t(x)], 0.0) << "token " << x << " has probability 0";
      double below = 0;
      for (int32_t i = 0; i < x; ++i) below += p[size_t(i)];
      const double u = std::clamp(below + unif(rng) * p[size_t(x)], 0.0, std::nextafter(1.0, 0.0));
      ++bins[size_t(u * kBins)];
      ++n;
    }
  }
  int dof = 0;
  RunStats r;
  r.chi = testing::chi_square(std::vector<double>(kBins, 1.0 / kBins), bins, n, &dof);
  r.limit = testing::chi2_999(dof);
  r.acceptance = metric(m, "fathom:spec_decode_draft_acceptance_rate");
  r.fused = metric(m, "fathom:spec_decode_fused_rounds_total");
  r.chained = metric(m, "fathom:spec_decode_chained_rounds_total");
  std::printf("  %s T=%.1f top-k %d, %s drafts, %s: chi2 %.2f (99.9%% limit %.2f), acceptance %.3f, "
              "%.0f fused rounds (%.0f chained)\n",
              fixture, sp.temperature, sp.top_k, sampled_drafts ? "sampled" : "argmax",
              chained ? "chained" : "unchained", r.chi, r.limit, r.acceptance, r.fused, r.chained);
  return r;
}

TEST(SampledDrafts, EveryTokenFollowsTheTargetAndDraftsAreAcceptedMoreOften) {
  for (const char* fixture : {"qwen35_moe_mtp_oracle", "qwen35_moe"}) {
    ASSERT_TRUE(load_runner(fixture)) << fixture << " missing";
    SamplingParams sp;
    sp.temperature = 3.0f;
    sp.top_k = 8;
    const RunStats by_argmax = sample_run(fixture, sp, false, true);
    EXPECT_LT(by_argmax.chi, by_argmax.limit) << fixture;
    for (bool chained : {false, true}) {
      const RunStats drawn = sample_run(fixture, sp, true, chained);
      EXPECT_LT(drawn.chi, drawn.limit) << fixture << (chained ? " chained" : "");
      EXPECT_GT(drawn.fused, 0) << fixture;
      if (chained) EXPECT_GT(drawn.chained, 0) << fixture;
      EXPECT_GE(drawn.acceptance, by_argmax.acceptance - 0.02) << fixture << (chained ? " chained" : "");
      // The oracle's MTP layer is close to the model: sum min(p, q) near 1, against p(argmax q).
      if (std::string(fixture) == "qwen35_moe_mtp_oracle")
        EXPECT_GT(drawn.acceptance, by_argmax.acceptance + 0.15) << (chained ? "chained" : "unchained");
    }
  }
}

// The runner keeps, for each sequence, the distribution its next draft was drawn from: the MTP
// layer's row after the last accepted token, processed with the round's sampling parameters
// (checked against the same round computed step by step on a second CPU engine), at the next
// position, with that draft; an argmax round keeps none.
class SampledDraftsRunner : public ::testing::TestWithParam<const char*> {};

// On the random fixture most drafts are refused (the kept row is the first), on the oracle most
// are accepted (the second).
TEST_P(SampledDraftsRunner, KeepsTheDistributionItsDraftCameFrom) {
  const char* fixture = GetParam();
  ASSERT_TRUE(load_runner(fixture)) << fixture << " missing";
  RowSamplingRunner runner(load_runner(fixture));
  auto ref = load_runner(fixture);
  const int64_t V = runner.config().vocab_size;
  const std::vector<int32_t> prompt = random_prompt(11, int(V), 5);
  // Prompt, then the MTP layer over it (the first generated token after its last row): both
  // lengths at the prompt's, as the engine leaves them.
  const int32_t first = 7;
  auto prefill_both = [&](ModelRunner& m) {
    const SequenceId seq = m.add_sequence();
    const ForwardOutput fo = m.forward(std::vector<ForwardStep>{{seq, prompt, true, false, true}});
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(first);
    m.mtp_forward(std::vector<MtpStep>{{seq, fo.hidden, next, true}});
    return seq;
  };
  const SequenceId seq = prefill_both(runner), rseq = prefill_both(*ref);
  SamplingParams sp;
  sp.temperature = 1.3f;
  sp.top_k = 12;
  sp.top_p = 0.9f;
  int32_t last = first, draft = 3;
  uint64_t draw = 1;  // the output index of the round's first row (the first token was index 0)
  int kept_checked = 0, drawn_verified = 0, accepted_rounds = 0;
  for (int round = 0; round < 8; ++round) {
    std::vector<RowSampling> rows(2);
    for (int r = 0; r < 2; ++r) {
      RowSampling& p = rows[size_t(r)];
      p.temperature = sp.temperature, p.top_k = sp.top_k, p.top_p = sp.top_p, p.seed = 31;
      p.draw = draw + uint64_t(r);
      p.draw_draft = round % 4 != 3;  // every fourth round argmax drafts
    }
    rows[0].draft = draft;
    if (round > 0) rows[0].draft_q = kDraftQKept;
    drawn_verified += round > 0 && runner.kept_draft(seq) != nullptr;
    const std::vector<int32_t> tokens = {last, draft};
    const int64_t len = runner.length(seq);
    const VerifyDraftOutput out =
        runner.forward_verify_draft(std::vector<ForwardStep>{{seq, tokens, true, true}}, rows);
    const int a = out.samples[0].accepted;
    accepted_rounds += a;
    // The same round on the reference engine, step by step: the MTP rows' logits after the
    // round's targets.
    const ForwardOutput fo = ref->forward(std::vector<ForwardStep>{{rseq, tokens, true, true}});
    const ForwardOutput mo = ref->mtp_forward(std::vector<MtpStep>{{rseq, fo.hidden, out.target, true}});
    ASSERT_EQ(mo.rows, 2);
    const RowSamplingRunner::KeptDraft* kept = runner.kept_draft(seq);
    if (rows[size_t(a)].draw_draft) {
      ASSERT_NE(kept, nullptr) << "round " << round;
      EXPECT_EQ(kept->draw, rows[size_t(a)].draw + 1) << "round " << round;
      EXPECT_EQ(kept->token, out.draft[size_t(a)]) << "round " << round;
      const std::vector<double> q = target_distribution(mo.logits.data() + a * V, V, sp);
      ASSERT_EQ(kept->q.size(), size_t(V));
      for (int64_t t = 0; t < V; ++t) ASSERT_NEAR(kept->q[size_t(t)], q[size_t(t)], 1e-5) << "round " << round;
      EXPECT_GT(q[size_t(kept->token)], 0.0) << "round " << round << ": a draft q cannot draw";
      ++kept_checked;
    } else {
      EXPECT_EQ(kept, nullptr) << "round " << round << ": an argmax draft keeps no q";
    }
    for (ModelRunner* m : {static_cast<ModelRunner*>(&runner), static_cast<ModelRunner*>(ref.get())}) {
      const SequenceId s = m == &runner ? seq : rseq;
      m->rollback(s, len + 1 + a);
      m->mtp_rollback(s, len + 1 + a);
    }
    last = out.target[size_t(a)];
    draft = out.draft[size_t(a)];
    draw += uint64_t(1 + a);
  }
  EXPECT_GE(kept_checked, 5);
  EXPECT_GE(drawn_verified, 4);
  std::printf("  %s: %d accepted of 8 rounds\n", fixture, accepted_rounds);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SampledDraftsRunner, ::testing::Values("qwen35_moe", "qwen35_moe_mtp_oracle"));

}  // namespace
}  // namespace fathom
