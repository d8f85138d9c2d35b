// The prefix cache's host tier (issue 37) on the CPU engine: entries the device's room evicts
// move to host memory and come back on a hit; conversations taking turns keep their hits with a
// room too small for them, outputs equal no caching (also over tensor-parallel ranks and with
// MTP).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/prefix_cache_test_util.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using namespace prefix_test;
using testing::metric;

class PrefixCacheHostTier : public ::testing::TestWithParam<const char*> {};

// The host tier (issue 37): conversations taking turns, one request at a time, with a device
// cache too small to keep one conversation's snapshot until its next turn. Without the tier the
// later turns start over; with it each finds its conversation in host memory, moved back: the
// same hits as a device cache large enough for everything, and the same outputs as no caching.
// `at_once` conversations' turns are sent together (the next group's after their answers).
std::vector<std::vector<int32_t>> converse_in_turns(std::unique_ptr<ModelRunner> runner, const EngineConfig& cfg,
                                                    int vocab, std::string* metrics, size_t conversations_n = 3,
                                                    size_t at_once = 1, size_t system_len = 0) {
  Engine engine(std::move(runner), nullptr, cfg);
  engine.start();
  // Every conversation starts with the same system prompt of system_len tokens.
  std::vector<std::vector<int32_t>> conversations(conversations_n, random_tokens(system_len, vocab, 99)), answers;
  for (int turn = 0; turn < 3; ++turn)
    for (size_t first = 0; first < conversations.size(); first += at_once) {
      std::vector<std::shared_ptr<OutputChannel>> channels;
      for (size_t c = first; c < std::min(first + at_once, conversations.size()); ++c) {
        const std::vector<int32_t> message =
            random_tokens(20 + 3 * turn, vocab, 300 + uint32_t(10 * c) + uint32_t(turn));
        std::vector<int32_t>& conv = conversations[c];
        conv.insert(conv.end(), message.begin(), message.end());
        channels.push_back(std::make_shared<OutputChannel>());
        RequestSpec s;
        s.group = engine.new_group_id();
        s.prompt = conv;
        s.params = greedy({}, 21).params;
        s.out = channels.back();
        EXPECT_EQ(engine.submit({s}), Engine::SubmitResult::Ok);
      }
      for (size_t c = first; c < std::min(first + at_once, conversations.size()); ++c) {
        answers.push_back(tokens_of(*channels[c - first]));
        conversations[c].insert(conversations[c].end(), answers.back().begin(), answers.back().end());
      }
    }
  engine.shutdown();
  if (metrics) *metrics = engine.render_metrics("fathom:", "m");
  return answers;
}

void host_tier_check(const std::function<std::unique_ptr<ModelRunner>()>& runner, EngineConfig base,
                     const std::string& what) {
  const int V = runner()->config().vocab_size;
  // One snapshot of a conversation's first turn (20 + 21 tokens), measured: the device's room.
  int64_t one = 0;
  {
    auto r = runner();
    const SequenceId s = r->add_sequence();
    const std::vector<int32_t> p = random_tokens(41, V, 5);
    r->forward(std::vector<ForwardStep>{{s, p}});
    one = r->snapshot_bytes(r->save_snapshot(s));
  }
  base.enable_prefix_caching = false;
  const auto plain = converse_in_turns(runner(), base, V, nullptr);
  std::string big_m, tiny_m, tier_m;
  base.enable_prefix_caching = true;
  base.prefix_cache_bytes = int64_t(1) << 30;
  EXPECT_EQ(converse_in_turns(runner(), base, V, &big_m), plain) << what << ": a large device cache";
  base.prefix_cache_bytes = one + one / 2;
  EXPECT_EQ(converse_in_turns(runner(), base, V, &tiny_m), plain) << what << ": a small device cache";
  base.prefix_cache_host_bytes = int64_t(1) << 30;
  EXPECT_EQ(converse_in_turns(runner(), base, V, &tier_m), plain) << what << ": a small device cache and the host tier";
  const double big = metric(big_m, "fathom:prefix_cache_hits_total");
  const double tiny = metric(tiny_m, "fathom:prefix_cache_hits_total");
  std::printf("  %s: %.0f prompt tokens cached with a large device cache, %.0f with a small one, %.0f with "
              "the host tier (%.0f from it; %.0f snapshots moved down, %.0f up)\n",
              what.c_str(), big, tiny, metric(tier_m, "fathom:prefix_cache_hits_total"),
              metric(tier_m, "fathom:external_prefix_cache_hits_total"),
              metric(tier_m, "fathom:prefix_cache_offloaded_snapshots_total"),
              metric(tier_m, "fathom:prefix_cache_onloaded_snapshots_total"));
  EXPECT_LT(tiny, big) << what << ": the small cache must lose conversations between turns";
  EXPECT_EQ(metric(tier_m, "fathom:prefix_cache_hits_total"), big) << what;
  EXPECT_GT(metric(tier_m, "fathom:external_prefix_cache_hits_total"), 0) << what;
  EXPECT_GT(metric(tier_m, "fathom:prefix_cache_onloaded_snapshots_total"), 0) << what;
  EXPECT_GT(metric(tier_m, "fathom:prefix_cache_host_bytes"), 0) << what;
  // The moves' time on the engine thread is reported with a tier (metric() gives -1 for a missing
  // one; a CPU move only changes the map holding the snapshot, so its time may round to nothing),
  // and not without one.
  EXPECT_GE(metric(tier_m, "fathom:prefix_cache_offload_host_seconds_total"), 0) << what;
  EXPECT_GE(metric(tier_m, "fathom:prefix_cache_onload_host_seconds_total"), 0) << what;
  EXPECT_EQ(tiny_m.find("prefix_cache_offload_host_seconds_total"), std::string::npos) << what << ": no tier";
}

// The room bounded in the runner, as on the GPU (two snapshots at once), the cache's bytes not:
// saves fail and evict, live conversation snapshots get their share of the room, moves up find
// no room and evict. Outputs equal no caching; the tier keeps conversations the room loses.
void bounded_room_check(const std::function<std::unique_ptr<CpuRunner>()>& runner, EngineConfig base,
                        const std::string& what, size_t conversations = 3, size_t at_once = 1,
                        ModelRunner::SnapshotRoom room_size = {2, 0}, size_t system_len = 0) {
  auto bounded = [&] {
    auto r = runner();
    r->set_snapshot_room(room_size, int(base.block_size));
    return r;
  };
  const int V = runner()->config().vocab_size;
  base.enable_prefix_caching = false;
  const auto plain = converse_in_turns(runner(), base, V, nullptr, conversations, at_once, system_len);
  std::string big_m, room_m, tier_m;
  base.enable_prefix_caching = true;
  base.prefix_cache_bytes = int64_t(1) << 30;
  EXPECT_EQ(converse_in_turns(runner(), base, V, &big_m, conversations, at_once, system_len), plain) << what << ": unbounded";
  EXPECT_EQ(converse_in_turns(bounded(), base, V, &room_m, conversations, at_once, system_len), plain) << what << ": bounded";
  base.prefix_cache_host_bytes = int64_t(1) << 30;
  EXPECT_EQ(converse_in_turns(bounded(), base, V, &tier_m, conversations, at_once, system_len), plain)
      << what << ": bounded, and the host tier";
  const double room = metric(room_m, "fathom:prefix_cache_hits_total");
  const double tier = metric(tier_m, "fathom:prefix_cache_hits_total");
  std::printf("  %s, a room of %lld snapshots and %lld tokens (0: any): %.0f prompt tokens cached (%.0f unbounded), "
              "%.0f with the host tier (%.0f from it; %.0f snapshots moved down, %.0f up)\n",
              what.c_str(), (long long)room_size.snapshots, (long long)room_size.tokens, room, metric(big_m, "fathom:prefix_cache_hits_total"), tier,
              metric(tier_m, "fathom:external_prefix_cache_hits_total"),
              metric(tier_m, "fathom:prefix_cache_offloaded_snapshots_total"),
              metric(tier_m, "fathom:prefix_cache_onloaded_snapshots_total"));
  EXPECT_LT(room, metric(big_m, "fathom:prefix_cache_hits_total")) << what << ": the room must lose conversations";
  if (at_once == 1)  // one at a time, nothing crowds the room but the cache's own entries
    EXPECT_EQ(tier, metric(big_m, "fathom:prefix_cache_hits_total")) << what << ": the tier keeps what the room loses";
  else
    EXPECT_GT(tier, room) << what << ": the tier keeps conversations the room loses";
  EXPECT_GT(metric(tier_m, "fathom:prefix_cache_onloaded_snapshots_total"), 0) << what;
}

TEST_P(PrefixCacheHostTier, HostTierWithTheRoomBoundedInTheRunner) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  bounded_room_check([&] { return load_runner(GetParam()); }, config(2048, true), GetParam());
}

// Eight conversations, four at a time, in a room of four snapshots and 400 tokens (a third turn's
// snapshot is about 140): with the tier, live conversation snapshots take the room but one
// snapshot's worth while the others' entries move down and come back.
TEST_P(PrefixCacheHostTier, HostTierWithTheRoomBoundedAndConversationsAtOnce) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  bounded_room_check([&] { return load_runner(GetParam()); }, config(2048, true), GetParam(), 8, 4, {4, 400});
}

// The same with a 48-token system prompt that every conversation starts with: the live
// conversation snapshots leave room for the shared prefix's entry to come back up.
TEST_P(PrefixCacheHostTier, HostTierWithTheRoomBoundedAndASharedSystemPrompt) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  bounded_room_check([&] { return load_runner(GetParam()); }, config(2048, true), GetParam(), 8, 4, {4, 600}, 48);
}

TEST_P(PrefixCacheHostTier, HostTierKeepsWhatTheDeviceEvicts) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  host_tier_check([&] { return load_runner(GetParam()); }, config(2048, true), GetParam());
}

TEST_P(PrefixCacheHostTier, HostTierOverTensorParallelRanks) {
  const fs::path dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "config.json")) << GetParam() << " missing";
  host_tier_check([&] { return CpuRunner::open(dir, /*with_mtp=*/false, /*tensor_parallel_size=*/2); },
                  config(13, true), std::string(GetParam()) + " over 2 ranks");
}

TEST(PrefixCacheMtp, HostTierKeepsWhatTheDeviceEvicts) {
  ASSERT_TRUE(load_runner("qwen35_moe", true)) << "qwen35_moe missing";
  for (int k : {1, 2}) {
    EngineConfig c = config(2048, true);
    c.spec.algorithm = SpecAlgorithm::Mtp;
    c.spec.num_steps = k;
    host_tier_check([] { return load_runner("qwen35_moe", true); }, c, "qwen35_moe MTP K=" + std::to_string(k));
  }
}


INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheHostTier, ::testing::Values("qwen35_moe", "qwen3_next", "qwen3_dense"));

}  // namespace
}  // namespace fathom
