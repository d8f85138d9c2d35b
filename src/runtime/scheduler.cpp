#include "runtime/scheduler.h"

#include <algorithm>

namespace fathom {

void Scheduler::add(Request* r) {
  r->status = RequestStatus::Waiting;
  waiting_.push_back(r);
}

void Scheduler::preempt(Request* r) {
  blocks_.release(r->block_table);
  slots_.release(r->state_slot);
  r->state_slot = -1;
  r->num_computed = 0;  // recompute prompt + generated tokens on re-admission
  r->drafts.clear();
  r->status = RequestStatus::Waiting;
  ++r->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  waiting_.push_front(r);
}

void Scheduler::remove(Request* r) {
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), r); it != waiting_.end()) waiting_.erase(it);
  blocks_.release(r->block_table);
  slots_.release(r->state_slot);
  r->state_slot = -1;
  r->status = RequestStatus::Finished;
}

bool Scheduler::grow(Request* r, int64_t tokens, SchedulerOutput& out, bool allow_preemption) {
  while (!blocks_.grow(r->block_table, tokens)) {
    if (!allow_preemption) return false;
    Request* victim = running_.back();  // lowest priority: admitted last
    for (const ScheduledChunk& c : out.chunks)
      if (c.req == victim) return false;  // never undo what this step already holds
    out.preempted.push_back(victim);
    preempt(victim);
    if (victim == r) return false;
  }
  return true;
}

SchedulerOutput Scheduler::schedule(bool allow_preemption) {
  SchedulerOutput out;
  int64_t budget = cfg_.max_num_batched_tokens;
  int64_t prefill_budget = cfg_.max_prefill_tokens > 0 ? cfg_.max_prefill_tokens : budget;
  auto decoding = [](const Request* r) { return int64_t(r->tokens.size()) - r->num_computed <= 1; };

  // 1. Decoding sequences: their pending token and drafts, in admission order.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int64_t n = std::min(r->num_wanted(), budget);
    if (!decoding(r) || n <= 0) {
      ++i;
      continue;
    }
    if (!grow(r, r->num_computed + n, out, allow_preemption)) {
      if (std::find(running_.begin(), running_.end(), r) == running_.end()) break;  // r was the last one
      ++i;
      continue;
    }
    out.chunks.push_back({r, n});
    out.num_tokens += n;
    budget -= n;
    ++i;
  }
  // 2. The rest of chunked prompts, then 3. new admissions, within the prefill cap.
  auto prefill_tokens = [&](const Request* r) {  // a chunk ends where prefix caching takes a snapshot
    int64_t n = std::min({r->num_wanted(), budget, prefill_budget});
    if (cfg_.max_chunk_tokens > 0) n = std::min(n, cfg_.max_chunk_tokens);
    if (r->next_snapshot > r->num_computed) n = std::min(n, r->next_snapshot - r->num_computed);
    if (cfg_.align_chunks && n < r->num_wanted()) {
      const int64_t B = blocks_.block_size(), aligned = (r->num_computed + n) / B * B - r->num_computed;
      if (aligned > 0) n = aligned;
    }
    return n;
  };
  for (size_t i = 0; i < running_.size() && budget > 0 && prefill_budget > 0; ++i) {
    Request* r = running_[i];
    if (decoding(r)) continue;
    const int64_t n = prefill_tokens(r);
    if (n <= 0 || !grow(r, r->num_computed + n, out, allow_preemption)) continue;
    out.chunks.push_back({r, n});
    out.num_tokens += n;
    budget -= n;
    prefill_budget -= n;
  }
  if (out.preempted.empty()) {
    for (size_t i = 0; i < waiting_.size() && budget > 0 && prefill_budget > 0 &&
                       int(running_.size()) < cfg_.max_num_seqs && slots_.num_free() > 0;) {
      Request* r = waiting_[i];
      if (admit_hook_ && !admit_hook_(*r)) {
        ++i;
        continue;
      }
      const int64_t n = prefill_tokens(r);
      if (!blocks_.grow(r->block_table, r->num_computed + n)) break;  // wait for blocks to free up
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      r->state_slot = *slots_.acquire();
      r->status = RequestStatus::Running;
      running_.push_back(r);
      out.chunks.push_back({r, n});
      out.num_tokens += n;
      budget -= n;
      prefill_budget -= n;
    }
  }
  // An admission may have asked a request planned above to stop its prefill at a snapshot (a
  // waiter sharing its prompt): its chunk ends there (blocks grown past it are used later).
  for (ScheduledChunk& c : out.chunks)
    if (const Request* r = c.req; r->next_snapshot > r->num_computed && r->num_computed + c.num_tokens > r->next_snapshot) {
      out.num_tokens -= c.num_tokens - (r->next_snapshot - r->num_computed);
      c.num_tokens = r->next_snapshot - r->num_computed;
    }
  return out;
}

}  // namespace fathom
