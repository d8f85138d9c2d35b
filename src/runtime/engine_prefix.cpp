// Prefix caching in the serving engine (issue 20; runtime/prefix_cache.h has the cache). A
// request's prompt is looked up when it is admitted: with a hit its sequence starts as a copy of
// the cached snapshot and only the rest of the prompt is prefilled. Snapshots are taken where:
// - the prompt stops sharing blocks with an earlier prompt (the cache remembers prompts' block
//   hashes): a shared system prompt's end, learned from the second request that has it;
// - a request waiting at admission shares the prompt another is prefilling: the waiter is held
//   back until that request has snapshotted the shared part, then starts from it, instead of
//   prefilling the same tokens beside it (a burst of requests with one system prompt);
// - a prefill chunk ends on a block boundary (the scheduler rounds chunks the budget cuts down to
//   one), and every `prefix_cache_interval` tokens when set (chunks then end there);
// - for the next turn of a chat, the last block boundary a sequence reached, cached when it ends.
//   These live snapshots take at most half of the runner's room, so that the cache keeps the
//   other half when many long requests run at once;
// - where a prompt's prefill ends (issue 37), at any length, with the last row's logits (and its
//   hidden state for MTP): an exact repeat takes its first token from them at admission, with no
//   forward, and a longer prompt prefills only the rest (engines that bring logits to the host).
// With a host tier (--prefix-cache-host-gb) what the cache evicts moves to host memory and comes
// back on a hit (spill, onload).
// With MTP the draft layer catches up first, so a snapshot holds the MTP layer's KV for the same
// positions as the main model's (a prompt end's: all but the last, whose row it keeps). A request
// that drafts no more (spec_off: it ran an overlapped step, past the batch limit; or retired) has
// no MTP state to keep, and is snapshotted without it: under load, where drafting is off, MTP
// must not cost the cache its hits. A request that starts from such an entry drafts no more either
// (mtp_state_behind).
#include <algorithm>

#include "runtime/engine.h"

namespace fathom {

bool Engine::admit(Request& r) {
  if (!prefix_cache_ || r.seq || r.num_computed != 0 || r.prefix_lookups > r.num_preemptions) return true;
  const int64_t B = cfg_.block_size, len = int64_t(r.tokens.size());
  // At least the last token is fed: its logits choose the first new token. Tokens only grow (a
  // preempted request comes back with its output), so the hashes of whole blocks stay valid.
  if (const size_t blocks = size_t((len - 1) / B); r.block_hashes.size() != blocks)
    r.block_hashes = prefix_cache_->block_hashes({r.tokens.data(), blocks * size_t(B)});
  PrefixCache::Hit hit = prefix_cache_->find(r.block_hashes, r.tokens);
  PrefixCache::Hit host_hit;  // a longer prefix in the host tier
  if (host_cache_)
    if (const PrefixCache::Hit h = host_cache_->find(r.block_hashes, r.tokens); h.length > hit.length) host_hit = h;
  if (wait_for_shared_prefill(r, std::max(hit.length, host_hit.length))) return false;
  r.prefix_lookups = r.num_preemptions + 1;
  PrefixCache::Removed onloaded;
  if (host_hit.length > 0) onloaded = onload(host_hit);
  if (onloaded.snapshot) {
    hit = PrefixCache::Hit{onloaded.snapshot, host_hit.length, 0, onloaded.end};
  } else {
    prefix_cache_->touch(hit);
    host_hit = {};
  }
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.prefix_queries += uint64_t(len);
    metrics_.prefix_hits += uint64_t(hit.length);
    if (host_cache_) metrics_.prefix_host_queries += uint64_t(len);
    metrics_.prefix_host_hits += uint64_t(host_hit.length);
  }
  if (const int64_t shared = prefix_cache_->seen_blocks(r.block_hashes) * B;
      shared > hit.length && shared >= cfg_.prefix_cache_min_shared)
    add_snapshot_target(r, shared);
  prefix_cache_->remember(r.block_hashes);
  if (hit.length > 0) {
    r.seq = runner_->add_sequence_from(hit.snapshot);
    if (onloaded.snapshot) {  // back in the device's cache (or dropped, if there is no room: r has its copy)
      const int64_t snap = onloaded.snapshot;
      spill(prefix_cache_->insert(std::move(onloaded), snap));
    }
    r.num_computed = hit.length;
    if (r.num_preemptions == 0) r.num_cached = hit.length;
    if (mtp_state_behind(r, hit)) r.spec_off = true;
    observe_queue(r);
    if (hit.end && !resume_at_prompt_end(r, *hit.end, hit.length)) return false;
  }
  r.next_snapshot = next_snapshot_at(r);
  return true;
}

bool Engine::resume_at_prompt_end(Request& r, const PromptEnd& end, int64_t length) {
  const bool mtp = spec_ && spec_->needs_hidden() && !r.spec_off;
  const int64_t len = int64_t(r.tokens.size());
  if (length < len) {  // a longer prompt: the MTP layer's last row waits for the token after it
    if (mtp) spec_->observe(r.seq, length - 1, end.hidden, {r.tokens.data() + length, 1});
    return true;
  }
  EndedAtAdmission ended{&r, "", "", ""};
  try {
    TokenLogprob lp;
    const int32_t token = device_sampling_ ? pick_like_device(r, end.logits.data(), lp).token
                                           : pick_from_row(r, end.logits.data(), nullptr, lp).token;
    ended.reason = process_token(r, len, token, r.spec.params.logprobs >= 0 ? &lp : nullptr, Clock::now());
    if (ended.reason.empty() && mtp) spec_->observe(r.seq, len - 1, end.hidden, {r.tokens.data() + len, 1});
  } catch (const RequestError& e) {
    ended = {&r, "error", e.stage(), e.what()};
  } catch (const std::exception& e) {
    ended = {&r, "error", "sample", e.what()};
  }
  if (ended.reason.empty()) return true;
  ended_at_admission_.push_back(std::move(ended));
  return false;
}

// Requests whose first token, chosen at admission from a cached prompt end, ended them (outside
// the scheduler's pass over its queues).
void Engine::finish_ended_at_admission() {
  std::vector<EndedAtAdmission> ended;
  ended.swap(ended_at_admission_);
  for (const EndedAtAdmission& e : ended) {
    if (e.reason == "error") fail_request(*e.req, e.stage, e.what);
    else finish(*e.req, e.reason);
  }
}

// True when a running request is prefilling a longer prefix of r's prompt than the cache holds
// and has not passed its end: that request is told to snapshot there, and r waits for it.
bool Engine::wait_for_shared_prefill(const Request& r, int64_t cached) {
  const int64_t B = cfg_.block_size, len = int64_t(r.tokens.size());
  // Requests whose prompt an overlapped step in flight ends: their ends are cached when it is read.
  std::vector<const Request*> ends_in_flight;
  for (const InflightChunk& c : inflight_.chunks)
    if (inflight_.active && c.end_snapshot && live_.count(c.req) && c.req->seq == c.seq)
      ends_in_flight.push_back(c.req);
  for (auto& [p, owned] : live_) {
    const bool prefilling = p->num_computed < p->num_prompt;
    const bool end_in_flight = std::find(ends_in_flight.begin(), ends_in_flight.end(), p) != ends_in_flight.end();
    if (p == &r || p->status != RequestStatus::Running || !(prefilling || end_in_flight)) continue;
    // The same prompt (n > 1, or a burst of one question): its end is worth the wait.
    if (prompt_end_snapshots_ && cached < len && (end_in_flight || p->num_output() == 0) && p->num_prompt == len &&
        std::equal(r.tokens.begin(), r.tokens.end(), p->tokens.begin()))
      return true;
    if (!prefilling) continue;
    // Blocks in common: the hashes are chained, so they agree up to a point and differ after it.
    size_t lo = 0, hi = std::min(r.block_hashes.size(), p->block_hashes.size());
    while (lo < hi) {
      const size_t mid = (lo + hi + 1) / 2;
      if (r.block_hashes[mid - 1] == p->block_hashes[mid - 1]) lo = mid;
      else hi = mid - 1;
    }
    const int64_t at = int64_t(lo) * B;
    if (at <= cached || at < cfg_.prefix_cache_min_shared || at >= p->num_prompt || p->num_computed >= at) continue;
    add_snapshot_target(*p, at);
    if (p->next_snapshot <= p->num_computed || p->next_snapshot > at) p->next_snapshot = at;
    return true;
  }
  return false;
}

void Engine::add_snapshot_target(Request& r, int64_t at) {
  auto it = std::lower_bound(r.snapshot_targets.begin(), r.snapshot_targets.end(), at);
  if (it == r.snapshot_targets.end() || *it != at) r.snapshot_targets.insert(it, at);
}

// Whether the cache holds r's first `at` tokens (whole blocks), by the hashes of its admission.
bool Engine::cached(const Request& r, int64_t at) const {
  const std::span<const int32_t> prefix(r.tokens.data(), size_t(at));
  const size_t blocks = size_t(at / cfg_.block_size);
  return blocks > 0 && blocks <= r.block_hashes.size() ? prefix_cache_->contains(prefix, r.block_hashes[blocks - 1])
                                                       : prefix_cache_->contains(prefix);
}

int64_t Engine::next_snapshot_at(const Request& r) const {
  const int64_t B = cfg_.block_size;
  const int64_t end = (int64_t(r.tokens.size()) - 1) / B * B;  // the last block boundary before the last token
  const int64_t every = (cfg_.prefix_cache_interval + B - 1) / B * B;
  auto wanted = [&](int64_t p) { return !cached(r, p); };
  int64_t next = -1;
  if (every > 0)
    for (int64_t p = (r.num_computed / every + 1) * every; p <= end; p += every)
      if (wanted(p)) {
        next = p;
        break;
      }
  for (int64_t p : r.snapshot_targets)  // ascending
    if (p > r.num_computed && p <= end && (next < 0 || p < next) && wanted(p)) {
      next = p;
      break;
    }
  return next;
}

// With MTP drafting, a snapshot holds the draft layer's KV for every position: the layer runs over
// the sequence's backlog first. A sequence that drafts no more is snapshotted as it is.
bool Engine::snapshot_ready(Request& r) {
  if (!spec_ || !spec_->needs_hidden() || drafts_no_more(r)) return true;
  spec_->catch_up(r.seq);
  return runner_->mtp_length(r.seq) == r.num_computed;
}

bool Engine::drafts_no_more(const Request& r) const {
  return r.spec_off || (r.seq && spec_ && spec_->retired(r.seq));
}

// Whether the entry r started from lacks the MTP layer's state for its tokens (made by a request
// that drafted no more): then r cannot draft either.
bool Engine::mtp_state_behind(const Request& r, const PrefixCache::Hit& hit) const {
  if (!spec_ || !spec_->needs_hidden() || r.spec_off) return false;
  if (hit.end) return hit.end->hidden.empty();
  return runner_->mtp_length(r.seq) < hit.length;
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
    if (!cached(r, at) && snapshot_ready(r))
      if (const int64_t snap = save_snapshot(r))
        spill(prefix_cache_->insert({r.tokens.data(), size_t(at)}, snap, runner_->snapshot_bytes(snap)));
    if (r.next_snapshot >= 0 && at >= r.next_snapshot) r.next_snapshot = next_snapshot_at(r);
  } else if (at > r.turn_snapshot_len && turn_room_for(r, at) && snapshot_ready(r)) {  // the conversation so far
    release_turn_snapshot(r);
    if ((r.turn_snapshot = save_snapshot(r))) {
      r.turn_snapshot_len = at;
      ++turn_snapshots_;
      turn_snapshot_tokens_ += at;
    }
  }
}

// Whether r's conversation snapshot may grow to `at` tokens. Without a host tier the live ones
// take at most half of the runner's room (in snapshots and in KV tokens): the cache keeps the
// other half. With one, what they push out of the room moves down instead of being lost, so they
// may take all of it but the room for one more snapshot of this size, which keeps a cached entry
// able to come back up.
bool Engine::turn_room_for(const Request& r, int64_t at) const {
  const ModelRunner::SnapshotRoom room = runner_->snapshot_room();
  const int64_t snapshots = turn_snapshots_ - (r.turn_snapshot ? 1 : 0) + 1;
  const int64_t tokens = turn_snapshot_tokens_ - r.turn_snapshot_len + at;
  if (!host_cache_)
    return (room.snapshots == 0 || 2 * snapshots <= room.snapshots) && (room.tokens == 0 || 2 * tokens <= room.tokens);
  return (room.snapshots == 0 || snapshots + 1 <= room.snapshots) && (room.tokens == 0 || tokens + at <= room.tokens);
}

void Engine::release_turn_snapshot(Request& r) {
  if (!r.turn_snapshot) return;
  runner_->drop_snapshot(r.turn_snapshot);
  forget_turn_snapshot(r);
}

void Engine::forget_turn_snapshot(Request& r) {
  --turn_snapshots_;
  turn_snapshot_tokens_ -= r.turn_snapshot_len;
  r.turn_snapshot = 0;
  r.turn_snapshot_len = 0;
}

// Called with the forward that consumed the prompt's last token, before that row's token is
// chosen: r's state is the prompt's, and with MTP the layer has caught up to the last position
// (whose row waits for the token chosen next).
void Engine::snapshot_prompt_end(Request& r, const float* logits, const float* hidden) {
  const bool mtp = spec_ && spec_->needs_hidden() && !drafts_no_more(r);
  if (mtp && (!hidden || runner_->mtp_length(r.seq) != r.num_prompt - 1)) return;
  if (!mtp) hidden = nullptr;  // an entry without MTP state
  if (const int64_t snap = save_snapshot(r)) cache_prompt_end(r, snap, logits, hidden);
}

void Engine::cache_prompt_end(Request& r, int64_t snap, const float* logits, const float* hidden) {
  const std::span<const int32_t> prompt = r.prompt_span();
  const bool mtp = spec_ && spec_->needs_hidden() && !drafts_no_more(r);
  if (mtp && !hidden) {  // the MTP layer could not resume there
    runner_->drop_snapshot(snap);
    return;
  }
  auto end = std::make_shared<PromptEnd>();
  end->logits.assign(logits, logits + runner_->config().vocab_size);
  if (mtp) end->hidden.assign(hidden, hidden + runner_->config().hidden_size);
  spill(prefix_cache_->insert_prompt_end(prompt, snap, runner_->snapshot_bytes(snap), std::move(end),
                                         prompt_blocks_hash(r)));
}

bool Engine::wants_prompt_end(const Request& r) const {
  if (!prompt_end_snapshots_ || r.num_output() > 0) return false;
  return !prefix_cache_->contains_prompt_end(r.prompt_span(), prompt_blocks_hash(r));
}

// The hash r's prompt end is listed under, from the block hashes of its admission (which cover the
// whole blocks before the prompt's last token), so that the prompt is not hashed again.
std::optional<uint64_t> Engine::prompt_blocks_hash(const Request& r) const {
  if (r.block_hashes.size() != size_t((r.num_prompt - 1) / cfg_.block_size)) return std::nullopt;
  return PrefixCache::prompt_blocks_hash(r.block_hashes);
}

// A snapshot of r's sequence; when the runner's room for them is full, the least recently used
// cache entries go first (to the host tier, if any). 0: no room even so.
int64_t Engine::save_snapshot(Request& r) {
  return with_snapshot_room([&] { return runner_->save_snapshot(r.seq); });
}

int64_t Engine::with_snapshot_room(const std::function<int64_t()>& make) {
  for (;;) {
    if (const int64_t snap = make()) return snap;
    PrefixCache::Removed victim = prefix_cache_->evict_lru();
    if (!victim.snapshot) return 0;
    spill({std::move(victim)});
  }
}

PrefixCache::Removed Engine::onload(const PrefixCache::Hit& host_hit) {
  PrefixCache::Removed e = host_cache_->take(host_hit);  // out of the host cache: no eviction below can drop it
  if (!e.snapshot) return e;
  const int64_t host = e.snapshot;
  double seconds = 0;
  const int64_t snap = with_snapshot_room([&] {
    const auto t0 = Clock::now();
    const int64_t s = runner_->move_snapshot_from_host(host);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
  });
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.prefix_onload_seconds += seconds;
    metrics_.prefix_onloads += snap ? 1 : 0;
  }
  if (snap) {
    e.snapshot = snap;
    return e;
  }
  for (const PrefixCache::Removed& h : host_cache_->insert(std::move(e), host)) runner_->drop_host_snapshot(h.snapshot);
  return {};
}

void Engine::retire_turn_snapshot(Request& r) {
  if (!r.turn_snapshot) return;
  if (prefix_cache_)
    spill(prefix_cache_->insert({r.tokens.data(), size_t(r.turn_snapshot_len)}, r.turn_snapshot,
                                runner_->snapshot_bytes(r.turn_snapshot)));
  else runner_->drop_snapshot(r.turn_snapshot);
  forget_turn_snapshot(r);
}

void Engine::spill(std::vector<PrefixCache::Removed> removed) {
  for (PrefixCache::Removed& e : removed) {
    int64_t host = 0;
    if (host_cache_ && !e.duplicate) {
      const auto t0 = Clock::now();
      host = runner_->move_snapshot_to_host(e.snapshot);
      std::lock_guard<std::mutex> l(metrics_mu_);
      metrics_.prefix_offload_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      metrics_.prefix_offloads += host ? 1 : 0;
    }
    if (!host) {
      runner_->drop_snapshot(e.snapshot);
      continue;
    }
    for (const PrefixCache::Removed& h : host_cache_->insert(std::move(e), host))
      runner_->drop_host_snapshot(h.snapshot);
  }
}

}  // namespace fathom
