// RowSamplingRunner's contract, as the CUDA runner's (model/model_runner.h): a launched step's
// choices come back from finish_sampled in launch order; a pending token takes the value the
// sequence's last sampled row chose; at most two launches are in flight, and one waiting for its
// token masks holds the next back until supply_masks; the raw rows asked for come back with the
// choices; a pending token with no sampled row before it is refused, as is a chained MTP round
// with no round before it (the rounds themselves: tests/runtime/test_engine_row_sampling.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"

namespace fathom {
namespace {

std::unique_ptr<RowSamplingRunner> open_runner() {
  const auto dir = testing::fixtures_dir() / "qwen3_dense";
  if (!std::filesystem::exists(dir / "config.json")) return nullptr;
  return std::make_unique<RowSamplingRunner>(std::make_unique<CpuRunner>(HybridModel::load(dir, false)));
}

int32_t argmax_of(const std::vector<float>& logits, int64_t row, int64_t vocab) {
  const float* r = logits.data() + row * vocab;
  return int32_t(std::max_element(r, r + vocab) - r);
}

TEST(RowSamplingRunner, PendingTokensAndLaunchOrder) {
  auto runner = open_runner();
  ASSERT_TRUE(runner) << "qwen3_dense missing";
  auto reference = open_runner();
  const int64_t V = runner->config().vocab_size;
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 7};
  const RowSampling greedy;

  // The reference: the prompt, then its greedy token fed back by the host.
  const SequenceId r = reference->add_sequence();
  const ForwardOutput a = reference->forward(std::vector<ForwardStep>{{r, prompt}});
  const int32_t first = argmax_of(a.logits, 0, V);
  const std::vector<int32_t> next = {first};
  const ForwardOutput b = reference->forward(std::vector<ForwardStep>{{r, next}});
  const int32_t second = argmax_of(b.logits, 0, V);

  // The same two steps overlapped: the second launched before the first is read, its token pending.
  const SequenceId s = runner->add_sequence();
  RowSampling keep = greedy;
  keep.keep_logits = 1;
  runner->launch_sampled(std::vector<ForwardStep>{{s, prompt}}, std::vector<RowSampling>{keep}, {});
  const std::vector<int32_t> pending = {kPendingToken};
  runner->launch_sampled(std::vector<ForwardStep>{{s, pending}}, std::vector<RowSampling>{greedy}, {});
  EXPECT_THROW(runner->launch_sampled(std::vector<ForwardStep>{{s, pending}}, std::vector<RowSampling>{greedy}, {}),
               Error);  // a third in flight
  const SampledOutput o1 = runner->finish_sampled();
  const SampledOutput o2 = runner->finish_sampled();
  ASSERT_EQ(o1.samples.size(), 1u);
  EXPECT_EQ(o1.samples[0].token, first);
  EXPECT_EQ(o2.samples[0].token, second);
  ASSERT_EQ(o1.kept_rows, std::vector<int64_t>{0});  // the raw row asked for, equal to the reference's
  EXPECT_TRUE(std::equal(a.logits.begin(), a.logits.begin() + V, o1.kept_logits.begin()));
  EXPECT_TRUE(o2.kept_rows.empty());
  EXPECT_THROW(runner->finish_sampled(), Error);  // nothing in flight

  // A pending token needs a sampled row before it.
  const SequenceId fresh = runner->add_sequence();
  EXPECT_THROW(runner->launch_sampled(std::vector<ForwardStep>{{fresh, pending}}, std::vector<RowSampling>{greedy}, {}),
               Error);
}

TEST(RowSamplingRunner, DeferredMasksHoldTheNextLaunch) {
  auto runner = open_runner();
  ASSERT_TRUE(runner) << "qwen3_dense missing";
  const int64_t V = runner->config().vocab_size;
  const SequenceId s = runner->add_sequence();
  const std::vector<int32_t> prompt = {4, 8, 15};
  RowSampling masked;
  masked.mask_row = 0;
  runner->launch_sampled(std::vector<ForwardStep>{{s, prompt}}, std::vector<RowSampling>{masked}, {}, {},
                         /*defer_masks=*/true);
  const std::vector<int32_t> pending = {kPendingToken};
  const std::vector<RowSampling> plain_row(1);
  EXPECT_THROW(runner->launch_sampled(std::vector<ForwardStep>{{s, pending}}, plain_row, {}), Error);
  EXPECT_THROW(runner->finish_sampled(), Error);  // its sampler still waits
  std::vector<uint32_t> mask(size_t(mask_words(V)), 0u);
  mask[0] = 1u << 6;  // token 6 alone
  runner->supply_masks(mask);
  EXPECT_EQ(runner->finish_sampled().samples[0].token, 6);
  // The next step's pending token is that choice.
  runner->launch_sampled(std::vector<ForwardStep>{{s, pending}}, std::vector<RowSampling>{RowSampling{}}, {});
  EXPECT_EQ(runner->length(s), 4);
  runner->finish_sampled();
}

// A chained round's step (two pending tokens) continues the sequence's round in flight: without
// one it is refused before anything runs, and so is a step mixing a pending token with a known one.
TEST(RowSamplingRunner, ChainedRoundNeedsARoundInFlight) {
  auto runner = open_runner();
  ASSERT_TRUE(runner) << "qwen3_dense missing";
  const SequenceId s = runner->add_sequence();
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 7};
  runner->forward(std::vector<ForwardStep>{{s, prompt}});
  const std::vector<int32_t> chained = {kPendingToken, kPendingToken}, mixed = {kPendingToken, 4};
  EXPECT_THROW(runner->launch_verify_draft(std::vector<ForwardStep>{{s, chained, true, true}}), Error);
  EXPECT_THROW(runner->launch_verify_draft(std::vector<ForwardStep>{{s, mixed, true, true}}), Error);
  EXPECT_EQ(runner->length(s), int64_t(prompt.size()));  // nothing ran
  EXPECT_THROW(runner->finish_verify_draft(), Error);    // nothing in flight
}

}  // namespace
}  // namespace fathom
