// Prefix caching in the serving engine (issue 20; runtime/prefix_cache.h has the cache). A
// request's prompt is looked up when it is admitted: with a hit its sequence starts as a copy of
// the cached snapshot and only the rest of the prompt is prefilled. Snapshots are taken where a
// prefill chunk ends on a block boundary (the scheduler rounds chunks the budget cuts down to one,
// so a long prompt, such as a shared system prompt, leaves snapshots without extra steps), every
// `prefix_cache_interval` tokens when set (chunks then end there: Request::next_snapshot), and,
// for the next turn of a chat, at the last block boundary a sequence reached when it ends. With
// MTP the draft layer catches up first, so a snapshot holds the MTP layer's KV for the same
// positions as the main model's.
#include "runtime/engine.h"

namespace fathom {

void Engine::admit(Request& r) {
  if (!prefix_cache_ || r.seq || r.num_computed != 0 || r.prefix_lookups > r.num_preemptions) return;
  r.prefix_lookups = r.num_preemptions + 1;
  const int64_t len = int64_t(r.tokens.size());
  // At least the last token is fed: its logits choose the first new token.
  const PrefixCache::Hit hit = prefix_cache_->lookup(r.tokens, len - 1);
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.prefix_queries += uint64_t(len);
    metrics_.prefix_hits += uint64_t(hit.length);
  }
  if (hit.length > 0) {
    r.seq = runner_->add_sequence_from(hit.snapshot);
    r.num_computed = hit.length;
    observe_queue(r);
  }
  r.next_snapshot = next_snapshot_at(r);
}

int64_t Engine::next_snapshot_at(const Request& r) const {
  const int64_t B = cfg_.block_size;
  const int64_t end = (int64_t(r.tokens.size()) - 1) / B * B;  // the last block boundary before the last token
  const int64_t every = (cfg_.prefix_cache_interval + B - 1) / B * B;
  if (every > 0)
    for (int64_t p = (r.num_computed / every + 1) * every; p <= end; p += every)
      if (!prefix_cache_->contains({r.tokens.data(), size_t(p)})) return p;
  return -1;
}

// With MTP drafting, a snapshot must hold the draft layer's KV for every position: the layer runs
// over the sequence's backlog first, and a sequence whose drafting was retired (no backlog kept)
// is not snapshotted.
bool Engine::snapshot_ready(Request& r) {
  if (!spec_ || !spec_->needs_hidden()) return true;
  spec_->catch_up(r.seq);
  return runner_->mtp_length(r.seq) == r.num_computed;
}

// Called before a step is planned (so that the plan sees the next snapshot position), before any
// forward that extends `r`: the runner's state is that of its first num_computed tokens (engines
// that queue work run the copies after the forwards already queued).
void Engine::take_snapshots() {
  if (!prefix_cache_) return;
  for (auto& [r, owned] : live_)
    if (r->status == RequestStatus::Running) take_snapshots(*r);
}

void Engine::take_snapshots(Request& r) {
  if (!prefix_cache_ || !r.seq) return;
  const int64_t B = cfg_.block_size, at = r.num_computed;
  if (at == 0 || at % B != 0) return;
  if (at < r.num_prompt) {  // a prefill chunk ended on a block boundary: into the cache
    if ((at == r.next_snapshot || !prefix_cache_->contains({r.tokens.data(), size_t(at)})) && snapshot_ready(r))
      if (const int64_t snap = save_snapshot(r))
        drop_snapshots(prefix_cache_->insert({r.tokens.data(), size_t(at)}, snap, runner_->snapshot_bytes(snap)));
    if (at == r.next_snapshot) r.next_snapshot = next_snapshot_at(r);
  } else if (at > r.turn_snapshot_len && snapshot_ready(r)) {  // the conversation so far
    if (r.turn_snapshot) runner_->drop_snapshot(r.turn_snapshot);
    r.turn_snapshot = save_snapshot(r);
    r.turn_snapshot_len = r.turn_snapshot ? at : 0;
  }
}

// A snapshot of r's sequence; when the runner's room for them is full, the least recently used
// cache entries go first. 0: no room even so.
int64_t Engine::save_snapshot(Request& r) {
  for (;;) {
    if (const int64_t snap = runner_->save_snapshot(r.seq)) return snap;
    const int64_t victim = prefix_cache_->evict_lru();
    if (!victim) return 0;
    runner_->drop_snapshot(victim);
  }
}

void Engine::retire_turn_snapshot(Request& r) {
  if (!r.turn_snapshot) return;
  if (prefix_cache_)
    drop_snapshots(prefix_cache_->insert({r.tokens.data(), size_t(r.turn_snapshot_len)}, r.turn_snapshot,
                                         runner_->snapshot_bytes(r.turn_snapshot)));
  else runner_->drop_snapshot(r.turn_snapshot);
  r.turn_snapshot = 0;
}

void Engine::drop_snapshots(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) runner_->drop_snapshot(id);
}

}  // namespace fathom
