// The continuous-batching scheduler and KV-block accounting, without a model: admission order
// and limits, the token budget (prefill chunks, decode tokens, speculative drafts, cut chunks),
// block growth and release, and preemption by recompute of the most recently admitted sequence.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/kv_cache_manager.h"
#include "runtime/scheduler.h"

namespace fathom {
namespace {

std::unique_ptr<Request> make_request(int prompt_len) {
  RequestSpec s;
  s.prompt.assign(size_t(prompt_len), 7);
  return std::make_unique<Request>(std::move(s), Clock::now());
}

// A scheduler over its own block manager and state slots.
struct SchedulerRig {
  BlockManager blocks;
  StateSlotPool slots;
  Scheduler sched;
  SchedulerRig(int64_t num_blocks, int block_size, int num_slots, SchedulerConfig cfg)
      : blocks(num_blocks, block_size), slots(num_slots), sched(cfg, blocks, slots) {}
};

// Applies a plan as the engine does after a forward: the chunk's tokens are consumed and a
// sequence whose tokens are all consumed gets one new token.
void run_plan(const SchedulerOutput& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.req;
    const int64_t pending = int64_t(r.tokens.size()) - r.num_computed;
    r.num_computed += std::min(c.num_tokens, pending);
    if (r.num_computed == int64_t(r.tokens.size())) r.tokens.push_back(1);
    r.drafts.clear();
  }
}

TEST(BlockManager, GrowShrinkRelease) {
  BlockManager b(4, 16);
  std::vector<int32_t> t;
  EXPECT_TRUE(b.grow(t, 17));  // 2 blocks
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(b.num_free(), 2);
  EXPECT_FALSE(b.grow(t, 65));  // needs 5: nothing changes
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(b.num_free(), 2);
  EXPECT_TRUE(b.grow(t, 64));
  b.shrink(t, 20);  // rejected draft tokens past 20: back to 2 blocks
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(b.num_free(), 2);
  b.release(t);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(b.num_free(), 4);
}

TEST(Scheduler, PrefillChunksUnderTheBudgetThenDecode) {
  SchedulerRig u(64, 16, 4, SchedulerConfig{4, 32});
  Scheduler& s = u.sched;
  auto a = make_request(50), b = make_request(10);
  s.add(a.get());
  s.add(b.get());
  SchedulerOutput p = s.schedule();  // a's first 32 tokens fill the budget; b waits
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].req, a.get());
  EXPECT_EQ(p.chunks[0].num_tokens, 32);
  EXPECT_EQ(s.num_running(), 1u);
  EXPECT_EQ(s.num_waiting(), 1u);
  run_plan(p);
  p = s.schedule();  // running first: a's remaining 18, then b's 10 (admitted)
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].req, a.get());
  EXPECT_EQ(p.chunks[0].num_tokens, 18);
  EXPECT_EQ(p.chunks[1].req, b.get());
  EXPECT_EQ(p.chunks[1].num_tokens, 10);
  EXPECT_EQ(p.num_tokens, 28);
  run_plan(p);
  p = s.schedule();  // both decode: one token each
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].num_tokens, 1);
  EXPECT_EQ(p.chunks[1].num_tokens, 1);
  EXPECT_EQ(int64_t(a->block_table.size()), u.blocks.blocks_for(51));
}

TEST(Scheduler, SlotsAndMaxSeqsLimitAdmission) {
  SchedulerRig u(64, 16, 2, SchedulerConfig{8, 1000});
  Scheduler& s = u.sched;
  std::vector<std::unique_ptr<Request>> rs;
  for (int i = 0; i < 3; ++i) {
    rs.push_back(make_request(5));
    s.add(rs.back().get());
  }
  SchedulerOutput p = s.schedule();
  EXPECT_EQ(p.chunks.size(), 2u);  // two state slots
  EXPECT_EQ(s.num_waiting(), 1u);
  s.remove(rs[0].get());  // a finished sequence frees its slot and blocks
  EXPECT_EQ(u.slots.num_free(), 1);
  run_plan(p);
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[1].req, rs[2].get());
  EXPECT_EQ(p.chunks[1].num_tokens, 5);
}

TEST(Scheduler, DraftsCountInTheBudgetAndAreCut) {
  SchedulerRig u(64, 16, 4, SchedulerConfig{4, 6});
  Scheduler& s = u.sched;
  auto a = make_request(3), b = make_request(3);
  s.add(a.get());
  s.add(b.get());
  run_plan(s.schedule());  // both prefilled (6 tokens)
  a->drafts = {4, 5, 6};   // 1 pending + 3 drafts
  b->drafts = {8, 9, 10};
  EXPECT_EQ(a->num_wanted(), 4);
  SchedulerOutput p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].num_tokens, 4);
  EXPECT_EQ(p.chunks[1].num_tokens, 2);  // the budget leaves b one draft
  // Blocks cover the verified positions: 3 prompt + 1 pending + 3 drafts = 7 tokens for a.
  EXPECT_EQ(int64_t(a->block_table.size()), u.blocks.blocks_for(7));
}

TEST(Scheduler, PreemptsTheLastAdmittedWhenBlocksRunOut) {
  SchedulerRig u(3, 4, 4, SchedulerConfig{4, 100});  // 12 tokens in all
  Scheduler& s = u.sched;
  auto a = make_request(4), b = make_request(4);
  s.add(a.get());
  s.add(b.get());
  run_plan(s.schedule());  // a: 1 block, b: 1 block, both get a token (5 tokens each)
  SchedulerOutput p = s.schedule();  // a needs its 2nd block (the last free one); b then has none
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], b.get());
  EXPECT_EQ(b->status, RequestStatus::Waiting);
  EXPECT_EQ(b->num_computed, 0);  // recompute prompt + generated tokens later
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(b->state_slot, -1);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(s.num_preemptions(), 1);
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].req, a.get());
  EXPECT_EQ(s.num_waiting(), 1u);
  // Nothing is admitted in a step that preempted; once a finishes, b comes back first with its
  // 5 tokens (prompt + the one generated).
  run_plan(p);
  s.remove(a.get());
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].req, b.get());
  EXPECT_EQ(p.chunks[0].num_tokens, 5);
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// Decode first: a decoding sequence gets its token, and a long prompt's chunks (first at
// admission, then as a running sequence) take what the budget leaves after it.
TEST(Scheduler, DecodingSequencesComeBeforePrefillChunks) {
  SchedulerRig rig(1000, 16, 4, SchedulerConfig{4, 64});
  auto a = make_request(200), b = make_request(3);
  rig.sched.add(b.get());
  SchedulerOutput p1 = rig.sched.schedule();  // b's prompt
  run_plan(p1);
  rig.sched.add(a.get());
  SchedulerOutput p2 = rig.sched.schedule();  // b decodes; a's first chunk
  ASSERT_EQ(p2.chunks.size(), 2u);
  EXPECT_EQ(p2.chunks[0].req, b.get());
  EXPECT_EQ(p2.chunks[0].num_tokens, 1);
  EXPECT_EQ(p2.chunks[1].req, a.get());
  EXPECT_EQ(p2.chunks[1].num_tokens, 63);
  run_plan(p2);
  // a is now running mid-prompt and admitted after b; b still comes first.
  SchedulerOutput p3 = rig.sched.schedule();
  ASSERT_EQ(p3.chunks.size(), 2u);
  EXPECT_EQ(p3.chunks[0].req, b.get());
  EXPECT_EQ(p3.chunks[1].num_tokens, 63);
}

// --chunked-prefill-size: prefill tokens in one step stop at the cap, however large the budget;
// decode tokens do not count against it.
TEST(Scheduler, PrefillTokensPerStepAreCapped) {
  SchedulerRig rig(1000, 16, 8, SchedulerConfig{8, 2048, /*max_prefill_tokens=*/96});
  auto d = make_request(4);
  rig.sched.add(d.get());
  run_plan(rig.sched.schedule());
  std::vector<std::unique_ptr<Request>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(make_request(80));
    rig.sched.add(prompts.back().get());
  }
  SchedulerOutput p = rig.sched.schedule();
  int64_t prefill = 0, decode = 0;
  for (const ScheduledChunk& c : p.chunks) (c.req == d.get() ? decode : prefill) += c.num_tokens;
  EXPECT_EQ(decode, 1);
  EXPECT_EQ(prefill, 96);  // 80 + the first 16 of the second prompt
  run_plan(p);
  SchedulerOutput q = rig.sched.schedule();  // d and the first prompt decode
  prefill = 0;
  for (const ScheduledChunk& c : q.chunks)
    if (c.req == prompts[1].get() || c.req == prompts[2].get()) prefill += c.num_tokens;
  EXPECT_EQ(prefill, 96);  // the second prompt's rest (64) and 32 of the third
  EXPECT_EQ(q.num_tokens, 98);
}

// Without preemption (a step in flight), a sequence that needs a block none can give waits and
// nobody is preempted.
TEST(Scheduler, NoPreemptionWhenNotAllowed) {
  SchedulerRig rig(2, 16, 4, SchedulerConfig{4, 64});
  auto a = make_request(16), b = make_request(15);
  rig.sched.add(a.get());
  rig.sched.add(b.get());
  run_plan(rig.sched.schedule());  // both prompts: one block each, pool empty
  // a needs a second block for its next token; none is free.
  SchedulerOutput p = rig.sched.schedule(/*allow_preemption=*/false);
  EXPECT_TRUE(p.preempted.empty());
  for (const ScheduledChunk& c : p.chunks) EXPECT_NE(c.req, a.get());
  EXPECT_EQ(rig.sched.num_running(), 2u);
  SchedulerOutput q = rig.sched.schedule(/*allow_preemption=*/true);  // now b (admitted last) goes
  ASSERT_EQ(q.preempted.size(), 1u);
  EXPECT_EQ(q.preempted[0], b.get());
}

}  // namespace
}  // namespace fathom
