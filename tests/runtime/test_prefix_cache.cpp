// Prefix caching (issue 20) on the CPU engine: the cache's lookup and eviction, and greedy outputs
// with a cached prefix equal to those without caching, token for token, on hybrid fixtures (Gated
// DeltaNet + attention): prompts sharing no block, one block, many blocks and all but one token,
// with requests arriving while a shared prefix is still being prefilled, with chunked prefill,
// with MTP speculative decoding, under eviction pressure, and across the turns of a chat.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "runtime/engine_test_util.h"
#include "runtime/prefix_cache.h"
#include "runtime/prefix_cache_test_util.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::Job;
using testing::metric;
using testing::run_engine;
using namespace prefix_test;

std::vector<int32_t> seq_of(int n, int32_t first) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// The snapshots of entries the cache let go.
std::vector<int64_t> ids(const std::vector<PrefixCache::Removed>& removed) {
  std::vector<int64_t> out;
  for (const PrefixCache::Removed& e : removed) out.push_back(e.snapshot);
  return out;
}

TEST(PrefixCache, LongestCachedPrefixWins) {
  PrefixCache c(4, 1000);
  const std::vector<int32_t> t = seq_of(20, 1);
  EXPECT_TRUE(c.insert({t.data(), 8}, 1, 10).empty());
  EXPECT_TRUE(c.insert({t.data(), 16}, 2, 10).empty());
  EXPECT_EQ(c.lookup(t, 20).length, 16);
  EXPECT_EQ(c.lookup(t, 20).snapshot, 2);
  EXPECT_EQ(c.lookup(t, 15).length, 8);  // no longer than asked
  std::vector<int32_t> other = t;
  other[10] = 99;  // differs in the third block: only the 2-block prefix matches
  EXPECT_EQ(c.lookup(other, 20).length, 8);
  other[0] = 99;
  EXPECT_EQ(c.lookup(other, 20).length, 0);
  // A prefix already cached: the new snapshot comes back to be dropped.
  EXPECT_EQ(ids(c.insert({t.data(), 8}, 3, 10)), std::vector<int64_t>{3});
  EXPECT_THROW(c.insert({t.data(), 6}, 4, 10), std::exception);  // not whole blocks
}

TEST(PrefixCache, EvictsLeastRecentlyUsedWithinCapacity) {
  PrefixCache c(2, 100);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4}, d = {5, 6}, big = {7, 8};
  EXPECT_TRUE(c.insert(a, 1, 60).empty());
  EXPECT_TRUE(c.insert(b, 2, 30).empty());
  EXPECT_EQ(c.lookup(a, 2).snapshot, 1);  // a is now the most recently used
  EXPECT_EQ(ids(c.insert(d, 3, 30)), std::vector<int64_t>{2});  // b goes
  EXPECT_EQ(c.bytes(), 90);
  EXPECT_EQ(ids(c.insert(big, 4, 101)), std::vector<int64_t>{4});  // larger than the whole cache
  EXPECT_EQ(c.clear().size(), 2u);
  EXPECT_EQ(c.bytes(), 0);
}

TEST(PrefixCache, RemembersWherePromptsStopSharing) {
  PrefixCache c(4, 1000);
  const std::vector<int32_t> a = seq_of(16, 1);
  std::vector<int32_t> b = a;
  b[9] = 99;  // differs in the third block
  const std::vector<uint64_t> ha = c.block_hashes(a), hb = c.block_hashes(b);
  ASSERT_EQ(ha.size(), 4u);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[2], hb[2]);
  EXPECT_EQ(c.seen_blocks(hb), 0);
  c.remember(ha);
  EXPECT_EQ(c.seen_blocks(hb), 2);  // the first two blocks
  EXPECT_EQ(c.seen_blocks(ha), 4);
  EXPECT_EQ(c.find(ha, a).length, 0);  // remembered is not cached
  EXPECT_TRUE(c.insert({a.data(), 8}, 5, 10).empty());
  EXPECT_EQ(c.find(hb, b).length, 8);
  EXPECT_EQ(c.find({hb.data(), 1}, b).length, 0);  // no longer than the hashes given
}

// Prompt ends (issue 37): the state where a prompt ended, at any length, serves an exact repeat
// and any longer prompt that begins with it; the longest cached prefix still wins.
TEST(PrefixCache, PromptEndsServeExactRepeatsAndLongerPrompts) {
  PrefixCache c(4, 1 << 20);
  auto end = std::make_shared<PromptEnd>();
  end->logits = {1.f, 2.f};
  const std::vector<int32_t> t = seq_of(12, 1);
  auto find = [&](std::span<const int32_t> p) {  // as the engine looks up: whole blocks before the last token
    return c.find(c.block_hashes(p.first((p.size() - 1) / 4 * 4)), p);
  };
  const std::vector<int> lengths = {1, 3, 4, 5, 8};
  for (int len : lengths) EXPECT_TRUE(c.insert_prompt_end({t.data(), size_t(len)}, 100 + len, 10, end).empty());
  for (int len : lengths) {
    const PrefixCache::Hit hit = find({t.data(), size_t(len)});
    EXPECT_EQ(hit.length, len);
    EXPECT_EQ(hit.snapshot, 100 + len);
    EXPECT_EQ(hit.end, end);
  }
  EXPECT_EQ(find({t.data(), 2}).length, 1);  // a longer prompt: the longest end it begins with
  EXPECT_EQ(find({t.data(), 7}).length, 5);
  EXPECT_EQ(find(t).length, 8);
  std::vector<int32_t> other = t;
  other[2] = 99;
  EXPECT_EQ(find({other.data(), 3}).length, 1);  // its last token differs: only the 1-token end
  EXPECT_EQ(find({other.data(), 6}).length, 1);
  EXPECT_TRUE(c.insert({t.data(), 8}, 7, 10).empty());  // a block snapshot beside the end of the same 8 tokens
  EXPECT_EQ(find(t).length, 8);
  EXPECT_EQ(ids(c.insert_prompt_end({t.data(), 3}, 200, 10, end)), std::vector<int64_t>{200});  // already cached
  EXPECT_TRUE(c.contains_prompt_end({t.data(), 5}));
  EXPECT_FALSE(c.contains_prompt_end({t.data(), 6}));
  EXPECT_EQ(c.bytes(), 6 * 10 + 5 * end->bytes());
  EXPECT_EQ(c.clear().size(), 6u);
  EXPECT_EQ(find({t.data(), 5}).length, 0);
  EXPECT_EQ(c.bytes(), 0);
}

// Many prompt ends under the same whole blocks (one system prompt, short questions): each is found
// as itself, a longer prompt finds the longest it begins with, and evictions keep the index right.
TEST(PrefixCache, ManyPromptEndsUnderOneBlock) {
  PrefixCache c(4, 300 * 10);
  auto end = std::make_shared<const PromptEnd>();
  auto prompt = [](int i) {  // 4 shared tokens, then 1-4 of its own
    std::vector<int32_t> p = {1, 2, 3, 4};
    for (int k = 0; k <= i % 4; ++k) p.push_back(100 + i * 7 + k);
    return p;
  };
  auto find = [&](const std::vector<int32_t>& p) {
    return c.find(c.block_hashes({p.data(), (p.size() - 1) / 4 * 4}), p);
  };
  for (int i = 0; i < 400; ++i) c.insert_prompt_end(prompt(i), 1000 + i, 10, end);  // room for the newest 300
  for (int i = 0; i < 400; ++i) EXPECT_EQ(find(prompt(i)).snapshot, i < 100 ? 0 : 1000 + i) << i;
  std::vector<int32_t> longer = prompt(399);
  longer.push_back(9);
  EXPECT_EQ(find(longer).snapshot, 1399);
  EXPECT_EQ(c.clear().size(), 300u);
  EXPECT_EQ(find(prompt(399)).length, 0);
}

// Prompts never repeated must not push out the snapshots of shared prefixes (nor the other way
// round): each kind may evict either kind while it holds at most half of the capacity.
TEST(PrefixCache, PromptEndsAndBlockSnapshotsEachKeepHalfTheCapacity) {
  PrefixCache c(2, 100);
  const auto end = std::make_shared<const PromptEnd>();
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  auto prompt = [](int32_t t) { return std::vector<int32_t>{t}; };
  EXPECT_TRUE(c.insert(a, 1, 40).empty());
  EXPECT_TRUE(c.insert(b, 2, 40).empty());
  EXPECT_EQ(ids(c.insert_prompt_end(prompt(5), 3, 30, end)), std::vector<int64_t>{1});  // under its half: the LRU entry
  EXPECT_EQ(ids(c.insert_prompt_end(prompt(6), 4, 40, end)), std::vector<int64_t>{3});  // past it: its own kind's
  EXPECT_EQ(ids(c.insert_prompt_end(prompt(7), 5, 70, end)), std::vector<int64_t>{5});  // only with a block's room
  EXPECT_EQ(c.bytes(), 80);
  EXPECT_EQ(ids(c.insert(a, 6, 40)), std::vector<int64_t>{2});  // blocks past their half: a block
  EXPECT_EQ(c.lookup(prompt(6), 1).snapshot, 4);
}

// The host tier's moves: an entry taken out of one cache goes into another as it was (a block
// snapshot or a prompt end with its logits), under the other tier's snapshot id.
TEST(PrefixCache, EntriesMoveBetweenTiersAsTheyWere) {
  PrefixCache device(4, 100), host(4, 1000);
  auto end = std::make_shared<PromptEnd>();
  end->logits = {0.5f};
  const std::vector<int32_t> t = seq_of(10, 1);
  EXPECT_TRUE(device.insert({t.data(), 8}, 1, 40).empty());
  EXPECT_TRUE(device.insert_prompt_end({t.data(), 10}, 2, 40, end).empty());
  // No room for a third: the least recently used (the block snapshot) comes out whole.
  const std::vector<PrefixCache::Removed> out = device.insert({t.data(), 4}, 3, 40);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].snapshot, 1);
  EXPECT_EQ(out[0].snapshot_bytes, 40);
  EXPECT_EQ(out[0].tokens, std::vector<int32_t>(t.begin(), t.begin() + 8));
  EXPECT_FALSE(out[0].duplicate);
  EXPECT_TRUE(host.insert(out[0], 11).empty());
  EXPECT_EQ(host.lookup(t, 9).snapshot, 11);
  // A prompt end taken back from the device keeps its logits.
  const PrefixCache::Hit hit = device.lookup(t, 10);
  ASSERT_EQ(hit.length, 10);
  PrefixCache::Removed taken = device.take(hit);
  EXPECT_EQ(taken.snapshot, 2);
  EXPECT_EQ(device.lookup(t, 10).length, 4);
  EXPECT_TRUE(host.insert(std::move(taken), 12).empty());
  EXPECT_EQ(host.lookup(t, 10).end, end);
  EXPECT_EQ(host.bytes(), 40 + 40 + end->bytes());
  EXPECT_EQ(host.take(PrefixCache::Hit{99, 10, 0, nullptr}).snapshot, 0);  // not an entry
  // Offered with no room at all (larger than the cache): handed back, not as a duplicate.
  const std::vector<PrefixCache::Removed> big = device.insert({t.data(), 8}, 4, 101);
  ASSERT_EQ(big.size(), 1u);
  EXPECT_FALSE(big[0].duplicate);
  EXPECT_TRUE(device.insert({t.data(), 4}, 5, 10)[0].duplicate);
}

// A base prompt of 65 tokens and prompts sharing 0, 1, 4 blocks (16 tokens each) and all but its
// last token with it; the first half arrive together (sharing a prefix still being prefilled),
// the rest while those decode (the base prompt's snapshots exist by then), then the base again.
std::vector<Job> sharing_jobs(int vocab) {
  const std::vector<int32_t> base = random_tokens(65, vocab, 7);
  auto with_tail = [&](int shared, int tail, uint32_t seed) {
    std::vector<int32_t> p(base.begin(), base.begin() + shared);
    const std::vector<int32_t> t = random_tokens(tail, vocab, seed);
    p.insert(p.end(), t.begin(), t.end());
    return p;
  };
  return {greedy(base, 12),
          greedy(with_tail(40, 9, 21), 10),
          greedy(with_tail(0, 30, 22), 11),
          greedy(with_tail(16, 20, 23), 9),
          greedy(with_tail(64, 1, 24), 13),
          greedy(with_tail(64, 30, 25), 8),
          greedy(base, 10)};
}

class PrefixCacheEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheEngine, GreedyOutputsEqualWithoutCaching) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  const std::vector<Job> jobs = sharing_jobs(probe->config().vocab_size);
  for (const int64_t budget : {int64_t(2048), int64_t(13)}) {  // 13: chunked prefill
    const auto plain = run_engine(load_runner(GetParam()), config(budget, false), jobs);
    std::string m;
    const auto cached = run_engine(load_runner(GetParam()), config(budget, true), jobs, &m);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_EQ(cached[i].ids, plain[i].ids) << GetParam() << " budget " << budget << " job " << i;
    const double hits = metric(m, "fathom:prefix_cache_hits_total");
    EXPECT_GE(hits, 64 + 64 + 16) << "the later prompts sharing 4 blocks and 1 block must hit";
    EXPECT_GT(metric(m, "fathom:prefix_cache_queries_total"), hits);
    std::printf("  %s budget %lld: %.0f of %.0f prompt tokens from the prefix cache\n", GetParam(),
                (long long)budget, hits, metric(m, "fathom:prefix_cache_queries_total"));
  }
}

// Over tensor-parallel CPU ranks (issue 37): a snapshot holds every rank's slice of the state,
// and a hit is decided once for all ranks; outputs equal those of the same ranks uncached.
TEST_P(PrefixCacheEngine, GreedyOutputsEqualWithoutCachingOverTensorParallelRanks) {
  const fs::path dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "config.json")) << GetParam() << " missing";
  auto ranks = [&] { return CpuRunner::open(dir, /*with_mtp=*/false, /*tensor_parallel_size=*/2); };
  ASSERT_EQ(ranks()->tensor_parallel_size(), 2);
  const std::vector<Job> jobs = sharing_jobs(ranks()->config().vocab_size);
  const auto plain = run_engine(ranks(), config(13, false), jobs);
  std::string m;
  const auto cached = run_engine(ranks(), config(13, true), jobs, &m);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(cached[i].ids, plain[i].ids) << GetParam() << " job " << i;
  EXPECT_GE(metric(m, "fathom:prefix_cache_hits_total"), 64 + 64 + 16);
}

// MTP speculative decoding from a cached prefix (the fixture with an MTP layer): the snapshot
// holds the MTP layer's KV too. One draft a round runs fused rounds (engine_mtp_round.cpp),
// whose MTP layer is always caught up; two drafts the speculator's draft steps.
TEST(PrefixCacheMtp, GreedyOutputsEqualWithoutCaching) {
  const char* fixture = "qwen35_moe";
  auto probe = load_runner(fixture, true);
  ASSERT_TRUE(probe && probe->has_mtp()) << fixture << " with its MTP layer missing";
  const std::vector<Job> jobs = sharing_jobs(probe->config().vocab_size);
  const auto plain = run_engine(load_runner(fixture), config(2048, false), jobs);
  for (int k : {1, 2}) {
    EngineConfig c = config(2048, true);
    c.spec.algorithm = SpecAlgorithm::Mtp;
    c.spec.num_steps = k;
    std::string m;
    const auto cached = run_engine(load_runner(fixture, true), c, jobs, &m);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_EQ(cached[i].ids, plain[i].ids) << fixture << " K=" << k << " job " << i;
    EXPECT_GT(metric(m, "fathom:prefix_cache_hits_total"), 0) << "K=" << k;
    EXPECT_GT(metric(m, "fathom:spec_decode_num_draft_tokens_total"), 0) << "K=" << k;
    if (k == 1) EXPECT_GT(metric(m, "fathom:spec_decode_fused_rounds_total"), 0);
  }
}

// `n` prompts: one 64-token prefix (from `seed`), then tails of their own of tail + i * step tokens.
std::vector<Job> prefix_and_tails(int vocab, uint32_t seed, int n, int tail, int step, int max_tokens) {
  const std::vector<int32_t> shared = random_tokens(64, vocab, seed);
  std::vector<Job> jobs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> t = random_tokens(tail + i * step, vocab, seed * 10 + uint32_t(i));
    p.insert(p.end(), t.begin(), t.end());
    jobs.push_back(greedy(p, max_tokens));
  }
  return jobs;
}

// Requests sharing a 64-token prefix, all arriving before the engine's first step: the first
// prefills it and snapshots its end, the others wait for that snapshot instead of prefilling the
// same tokens beside it, and start from it.
TEST_P(PrefixCacheEngine, BurstSharingAPrefixWaitsForItsPrefill) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  const std::vector<Job> jobs = prefix_and_tails(probe->config().vocab_size, 8, 6, 9, 1, 7);
  auto burst = [&](bool caching, std::string* m) {
    EngineConfig c = config(2048, caching);
    c.prefix_cache_interval = 0;  // the shared part's end is the only position worth a snapshot
    std::vector<std::vector<int32_t>> ids;
    for (testing::Finished& f : run_burst(load_runner(GetParam()), c, jobs, m)) ids.push_back(std::move(f.ids));
    return ids;
  };
  std::string m;
  const auto plain = burst(false, nullptr);
  const auto cached = burst(true, &m);
  EXPECT_EQ(cached, plain);
  EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), 5 * 64);
}

// One after another: the second prompt sharing 64 tokens with the first finds no snapshot there
// (the first one's chunk did not end there) but learns where the sharing ends and snapshots it;
// the third starts from that snapshot.
TEST_P(PrefixCacheEngine, LearnsWhereAPrefixIsShared) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  const std::vector<Job> jobs = prefix_and_tails(probe->config().vocab_size, 9, 3, 20, 0, 6);
  EngineConfig c = config(2048, true);
  c.prefix_cache_interval = 0;
  std::string m;
  const auto cached = run_one_by_one(load_runner(GetParam()), c, jobs, &m);
  EXPECT_EQ(cached, run_one_by_one(load_runner(GetParam()), config(2048, false), jobs, nullptr));
  EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), 64);
}

// A cache with room for one and a half snapshots of 64 tokens: entries come and go, outputs do
// not change. One by one, the prompt sharing all but one token with the base comes right after
// it and finds its 64-token snapshot.
TEST_P(PrefixCacheEngine, EvictionPressureKeepsOutputs) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  std::vector<Job> jobs = sharing_jobs(probe->config().vocab_size);
  std::swap(jobs[1], jobs[4]);
  const auto plain = run_one_by_one(load_runner(GetParam()), config(2048, false), jobs, nullptr);
  // One snapshot of the base prompt's first 64 tokens, measured, is the whole budget.
  auto runner = load_runner(GetParam());
  const SequenceId s = runner->add_sequence();
  runner->forward(std::vector<ForwardStep>{{s, std::span<const int32_t>(jobs[0].prompt.data(), 64)}});
  const int64_t one = runner->snapshot_bytes(runner->save_snapshot(s));
  EngineConfig c = config(2048, true);
  c.prefix_cache_bytes = one + one / 2;
  std::string m;
  const auto cached = run_one_by_one(load_runner(GetParam()), c, jobs, &m);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(cached[i], plain[i]) << GetParam() << " job " << i;
  EXPECT_GE(metric(m, "fathom:prefix_cache_hits_total"), 64);
}

// Three turns of a chat: each prompt is the conversation so far (prompt and answer) plus a new
// message; from the second turn on the conversation's snapshot serves the shared part.
TEST_P(PrefixCacheEngine, ChatTurnsStartFromTheConversationSoFar) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  const int V = probe->config().vocab_size;
  auto converse = [&](bool caching, std::string* m) {
    Engine engine(load_runner(GetParam()), nullptr, config(2048, caching));
    engine.start();
    std::vector<int32_t> conversation;
    std::vector<std::vector<int32_t>> answers;
    for (int turn = 0; turn < 3; ++turn) {
      const std::vector<int32_t> message = random_tokens(11 + 5 * turn, V, 40 + uint32_t(turn));
      conversation.insert(conversation.end(), message.begin(), message.end());
      auto ch = std::make_shared<OutputChannel>();
      RequestSpec s;
      s.group = engine.new_group_id();
      s.prompt = conversation;
      s.params = greedy({}, 37).params;
      s.out = ch;
      EXPECT_EQ(engine.submit({s}), Engine::SubmitResult::Ok);
      const std::vector<int32_t> answer = tokens_of(*ch);
      conversation.insert(conversation.end(), answer.begin(), answer.end());
      answers.push_back(answer);
    }
    engine.shutdown();
    if (m) *m = engine.render_metrics("fathom:", "m");
    return answers;
  };
  std::string m;
  const auto plain = converse(false, nullptr);
  const auto cached = converse(true, &m);
  EXPECT_EQ(cached, plain);
  // A conversation's snapshot is at the last block boundary its sequence reached (the last answer
  // token is never fed): turn 1 consumed 11 + 36 tokens (snapshot at 32), turn 2 64 + 36 (at 96).
  EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), 32 + 96);
}

TEST_P(PrefixCacheEngine, ExactRepeatsOfAnyLengthHitFromTheSecondRequest) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  const std::vector<Job> jobs = repeat_jobs(probe->config().vocab_size);
  const auto plain = run_one_by_one_finished(load_runner(GetParam()), config(2048, false), jobs, nullptr);
  std::string m;
  const auto cached = run_one_by_one_finished(load_runner(GetParam()), config(2048, true), jobs, &m);
  expect_same(cached, plain, GetParam());
  EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), kRepeatHits);
  EXPECT_EQ(plain[jobs.size() - 2].reason, "error");  // the injected fault ended its request alone
  EXPECT_EQ(plain[jobs.size() - 3].ids.size(), 1u);
  EXPECT_EQ(plain[jobs.size() - 4].ids, plain[jobs.size() - 5].ids);  // one seed, one sample
}

// The same with tensor-parallel CPU ranks (host and device sampling), and with chunked prefill
// (a 13-token budget: the prompt's end is the last chunk's).
TEST_P(PrefixCacheEngine, ExactRepeatsHitOverTensorParallelRanksAndChunks) {
  const fs::path dir = testing::fixtures_dir() / GetParam();
  ASSERT_TRUE(fs::exists(dir / "config.json")) << GetParam() << " missing";
  auto ranks = [&] { return CpuRunner::open(dir, /*with_mtp=*/false, /*tensor_parallel_size=*/2); };
  const std::vector<Job> jobs = repeat_jobs(ranks()->config().vocab_size);
  for (bool device : {false, true}) {  // host sampling; the runner choosing tokens over the ranks
    auto runner = [&]() -> std::unique_ptr<ModelRunner> {
      if (device) return std::make_unique<RowSamplingRunner>(ranks());
      return ranks();
    };
    const std::string what = std::string(GetParam()) + (device ? " device sampling" : "");
    const auto plain = run_one_by_one_finished(runner(), config(13, false), jobs, nullptr);
    std::string m;
    const auto cached = run_one_by_one_finished(runner(), config(13, true), jobs, &m);
    expect_same(cached, plain, what);
    EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), kRepeatHits) << what;
  }
}

// The same where the runner chooses tokens (device sampling, model/row_sampling_runner.h: the
// GPU's path, overlapped steps included): the prompt's last row comes back with its raw logits
// (RowSampling::keep_logits), the state is snapshotted as the step is launched, and an exact
// repeat's first token is the device sampler's choice from the cached row (the same semantics and
// random numbers): outputs and logprobs equal the uncached engine's, every repeat hits whole.
TEST_P(PrefixCacheEngine, ExactRepeatsHitWithDeviceSampling) {
  auto probe = load_runner(GetParam());
  ASSERT_TRUE(probe) << GetParam() << " missing";
  auto device = [&] { return std::make_unique<RowSamplingRunner>(load_runner(GetParam())); };
  const std::vector<Job> jobs = repeat_jobs(probe->config().vocab_size);
  for (int64_t budget : {int64_t(2048), int64_t(13)})
    for (bool overlap : {true, false}) {
      EngineConfig off = config(budget, false), on = config(budget, true);
      off.overlap_schedule = on.overlap_schedule = overlap;
      const std::string what =
          std::string(GetParam()) + " budget " + std::to_string(budget) + (overlap ? " overlapped" : "");
      const auto plain = run_one_by_one_finished(device(), off, jobs, nullptr);
      std::string m;
      const auto cached = run_one_by_one_finished(device(), on, jobs, &m);
      expect_same(cached, plain, what);
      EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), kRepeatHits) << what;
      EXPECT_EQ(plain[jobs.size() - 2].reason, "error") << what;
    }
}

// Requests with one prompt arriving together over the runners `open` makes: the first prefills
// it, the others wait for its end and start there (no prefill of their own).
void expect_burst_of_one_prompt_prefilled_once(const std::function<std::unique_ptr<ModelRunner>()>& open,
                                              const std::string& what) {
  std::vector<Job> jobs(4, greedy(random_tokens(21, open()->config().vocab_size, 91), 5));
  jobs[1].params.logprobs = 2;
  jobs[2].params.sampling.temperature = 0.7f;
  jobs[2].params.sampling.seed = 3;
  std::string m;
  const auto plain = run_burst(open(), config(2048, false), jobs, nullptr);
  expect_same(run_burst(open(), config(2048, true), jobs, &m), plain, what);
  EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), 3 * 21) << what;
}

TEST_P(PrefixCacheEngine, BurstOfOnePromptPrefillsItOnce) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  expect_burst_of_one_prompt_prefilled_once([&] { return load_runner(GetParam()); }, GetParam());
}

// The same with device sampling (overlapped steps): the others wait for the first's prompt end,
// cached once its step is read.
TEST_P(PrefixCacheEngine, BurstOfOnePromptPrefillsItOnceWithDeviceSampling) {
  ASSERT_TRUE(load_runner(GetParam())) << GetParam() << " missing";
  expect_burst_of_one_prompt_prefilled_once(
      [&] { return std::make_unique<RowSamplingRunner>(load_runner(GetParam())); }, GetParam());
}

// Exact repeats with MTP: a prompt end holds the MTP layer's KV up to the position before the
// last and that position's hidden state (its row waits for the first token). Greedy outputs equal
// plain decoding's and the speculative engine's without caching. Sampled ones are lossless in
// distribution only: an exact repeat decodes in the step that admits it, before it has a draft,
// so its random numbers go to other draws than without caching; their first token (from the
// cached logits, one seed) is the same.
TEST(PrefixCacheMtp, ExactRepeatsOfAnyLengthHitFromTheSecondRequest) {
  const char* fixture = "qwen35_moe";
  auto probe = load_runner(fixture, true);
  ASSERT_TRUE(probe && probe->has_mtp()) << fixture << " with its MTP layer missing";
  const std::vector<Job> jobs = repeat_jobs(probe->config().vocab_size);
  const auto plain = run_one_by_one_finished(load_runner(fixture), config(2048, false), jobs, nullptr);
  // Host sampling, and device sampling (the runner choosing tokens: prompt ends come back as kept rows).
  for (bool device : {false, true})
  for (int k : {1, 2}) {
    auto runner = [&]() -> std::unique_ptr<ModelRunner> {
      if (device) return std::make_unique<RowSamplingRunner>(load_runner(fixture, true));
      return load_runner(fixture, true);
    };
    EngineConfig c = config(2048, false);
    c.spec.algorithm = SpecAlgorithm::Mtp;
    c.spec.num_steps = k;
    const auto uncached = run_one_by_one_finished(runner(), c, jobs, nullptr);
    c.enable_prefix_caching = true;
    std::string m;
    const auto cached = run_one_by_one_finished(runner(), c, jobs, &m);
    SCOPED_TRACE(device ? "device sampling" : "host sampling");
    std::vector<testing::Finished> greedy_cached, greedy_uncached;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].params.sampling.temperature == 0.f) {
        EXPECT_EQ(cached[i].ids, plain[i].ids) << "K=" << k << " job " << i;
        greedy_cached.push_back(cached[i]);
        greedy_uncached.push_back(uncached[i]);
      } else {
        ASSERT_FALSE(cached[i].ids.empty());
        EXPECT_EQ(cached[i].ids[0], uncached[i].ids[0]) << "K=" << k << " job " << i;
        EXPECT_EQ(cached[i].ids.size(), uncached[i].ids.size()) << "K=" << k << " job " << i;
      }
    }
    expect_same(greedy_cached, greedy_uncached, "K=" + std::to_string(k));
    EXPECT_EQ(metric(m, "fathom:prefix_cache_hits_total"), kRepeatHits) << "K=" << k;
    EXPECT_GT(metric(m, "fathom:spec_decode_num_draft_tokens_total"), 0) << "K=" << k;
  }
}

// The MTP layer's state at a prompt end, checked through its drafts (greedy outputs cannot show
// it: a wrong draft is only rejected). The greedy jobs above, each drafting: at every position
// where a request drafted both with and without caching, the draft is the same.
TEST(PrefixCacheMtp, DraftsAfterAnExactRepeatEqualThoseWithoutCaching) {
  const char* fixture = "qwen35_moe";
  auto probe = load_runner(fixture, true);
  ASSERT_TRUE(probe && probe->has_mtp()) << fixture << " with its MTP layer missing";
  std::vector<Job> jobs;
  for (const Job& j : repeat_jobs(probe->config().vocab_size))
    if (j.params.sampling.temperature == 0.f && j.params.max_tokens > 1 && j.params.fault.site == FaultSite::None)
      jobs.push_back(j);
  for (int k : {1, 2}) {
    // Per request (in order of their first draft), the draft made at each position.
    auto drafts = [&](bool caching) {
      std::vector<MtpDrafter::Trace> trace;
      EngineConfig c = config(2048, caching);
      c.spec.algorithm = SpecAlgorithm::Mtp;
      c.spec.num_steps = k;
      c.spec.mtp_trace = &trace;
      run_one_by_one_finished(load_runner(fixture, true), c, jobs, nullptr);
      std::vector<SequenceId> order;
      std::map<SequenceId, std::map<int64_t, int32_t>> by_seq;
      for (const MtpDrafter::Trace& t : trace) {
        if (!by_seq.count(t.seq)) order.push_back(t.seq);
        by_seq[t.seq][t.pos] = t.draft;
      }
      std::vector<std::map<int64_t, int32_t>> out;
      for (SequenceId s : order) out.push_back(by_seq[s]);
      return out;
    };
    const auto uncached = drafts(false), cached = drafts(true);
    ASSERT_EQ(cached.size(), jobs.size()) << "K=" << k;
    ASSERT_EQ(uncached.size(), jobs.size()) << "K=" << k;
    int compared = 0;
    for (size_t i = 0; i < jobs.size(); ++i)
      for (const auto& [pos, draft] : cached[i])
        if (auto it = uncached[i].find(pos); it != uncached[i].end()) {
          EXPECT_EQ(draft, it->second) << "K=" << k << " job " << i << " position " << pos;
          ++compared;
        }
    EXPECT_GE(compared, int(jobs.size())) << "K=" << k;
  }
}

// MTP past its batch limit (the "prefix-cache hits falling to zero with MTP"): a request
// that runs an overlapped step drafts no more (Request::spec_off) and has no MTP state to keep, and
// it used to be snapshotted not at all, so under load, where drafting is off, the cache missed
// everything. The exact-repeat jobs one by one while a long request keeps the batch at the limit
// (--speculative-disable-by-batch-size 1, device sampling: overlapped steps): as many tokens
// cached as without MTP, greedy outputs equal plain decoding's. Then the entries those requests
// left (no MTP state) serve requests that would draft: they start from them and draft no more.
TEST(PrefixCacheMtp, HitsPastTheBatchLimitAsWithoutMtp) {
  const char* fixture = "qwen35_moe";
  auto probe = load_runner(fixture, true);
  ASSERT_TRUE(probe && probe->has_mtp()) << fixture << " with its MTP layer missing";
  const int V = probe->config().vocab_size;
  const std::vector<Job> jobs = repeat_jobs(V);
  Job background = greedy(random_tokens(9, V, 99), 460);  // outlasts the jobs one by one
  background.prompt[0] = 100;                              // shares no prefix with them
  // The background request first, then the jobs one at a time beside it; metrics at the end.
  auto run = [&](bool mtp, int limit, std::string* metrics) {
    EngineConfig c = config(2048, true);
    if (mtp) {
      c.spec.algorithm = SpecAlgorithm::Mtp;
      c.spec.num_steps = 1;
      c.spec.disable_by_batch_size = limit;
    }
    Engine engine(std::make_unique<RowSamplingRunner>(load_runner(fixture, mtp)), nullptr, c);
    engine.start();
    auto submit = [&](const Job& j) { return submit_job(engine, j); };
    auto bg = submit(background);
    EXPECT_TRUE(bg->pop(std::chrono::milliseconds(60000)));  // running: the jobs come past the limit
    std::vector<testing::Finished> out;
    for (const Job& j : jobs) out.push_back(finished_of(*submit(j)));
    EXPECT_FALSE(finished_of(*bg).ids.empty());
    engine.shutdown();
    *metrics = engine.render_metrics("fathom:", "m");
    return out;
  };
  std::string plain_m, mtp_m;
  const auto plain = run(false, 0, &plain_m);
  const auto limited = run(true, 1, &mtp_m);
  const double plain_hits = metric(plain_m, "fathom:prefix_cache_hits_total");
  EXPECT_GE(plain_hits, kRepeatHits);  // the repeats, and what the background's turn snapshots give
  EXPECT_EQ(metric(mtp_m, "fathom:prefix_cache_hits_total"), plain_hits);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].params.sampling.temperature == 0.f && jobs[i].params.fault.site == FaultSite::None) {
      EXPECT_EQ(limited[i].ids, plain[i].ids) << "job " << i;
    }
  }
}

// Entries without MTP state (made by requests past the limit) start requests that would draft:
// they draft no more, and their greedy outputs equal plain decoding's. One engine with a limit of
// 2: three prompts while two long requests run (past the limit: no drafting, no MTP state), then
// each again alone, where a request drafts (below the limit): the repeats start from the entries
// and do not draft, a new prompt alone does.
TEST(PrefixCacheMtp, EntriesWithoutMtpStateStartRequestsThatDraftNoMore) {
  const char* fixture = "qwen35_moe";
  auto probe = load_runner(fixture, true);
  ASSERT_TRUE(probe && probe->has_mtp()) << fixture << " with its MTP layer missing";
  const int V = probe->config().vocab_size;
  std::vector<Job> firsts;
  for (int len : {5, 17, 40}) firsts.push_back(greedy(random_tokens(len, V, 200 + uint32_t(len)), 6));
  Job background = greedy(random_tokens(9, V, 98), 120);
  background.prompt[0] = 101;
  Job background2 = background;
  background2.prompt[0] = 102;
  const auto plain = run_one_by_one_finished(load_runner(fixture), config(2048, false), firsts, nullptr);
  EngineConfig c = config(2048, true);
  c.spec.algorithm = SpecAlgorithm::Mtp;
  c.spec.num_steps = 1;
  c.spec.disable_by_batch_size = 2;
  Engine engine(std::make_unique<RowSamplingRunner>(load_runner(fixture, true)), nullptr, c);
  engine.start();
  auto submit = [&](const Job& j) { return submit_job(engine, j); };
  auto bg = submit(background), bg2 = submit(background2);
  for (auto* ch : {bg.get(), bg2.get()})  // both running: the prompts below come past the limit
    ASSERT_TRUE(ch->pop(std::chrono::milliseconds(60000)));
  for (size_t i = 0; i < firsts.size(); ++i) EXPECT_EQ(finished_of(*submit(firsts[i])).ids, plain[i].ids) << i;
  finished_of(*bg);
  finished_of(*bg2);
  const double drafted_before = metric(engine.render_metrics("fathom:", "m"), "fathom:spec_decode_num_draft_tokens_total");
  // Alone now: each repeat starts from its prompt end (no MTP state) and must not draft.
  for (size_t i = 0; i < firsts.size(); ++i) EXPECT_EQ(finished_of(*submit(firsts[i])).ids, plain[i].ids) << i;
  const std::string m = engine.render_metrics("fathom:", "m");
  EXPECT_EQ(metric(m, "fathom:spec_decode_num_draft_tokens_total"), drafted_before);
  // A new prompt alone drafts: the limit lets it.
  EXPECT_EQ(finished_of(*submit(greedy(random_tokens(20, V, 300), 8))).ids.size(), 8u);
  EXPECT_GT(metric(engine.render_metrics("fathom:", "m"), "fathom:spec_decode_num_draft_tokens_total"), drafted_before);
  engine.shutdown();
  EXPECT_GE(metric(m, "fathom:prefix_cache_hits_total"), 5 + 17 + 40);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheEngine, ::testing::Values("qwen35_moe", "qwen3_next", "qwen3_dense"));

}  // namespace
}  // namespace fathom
