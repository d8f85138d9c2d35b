// Request lifecycle for the serving engine: what a client asked for (prompt, sampling, stop
// conditions), what the engine tracks while it runs (tokens, cache accounting, detokenizer
// state), and the output events it streams back through a thread-safe channel.
//
//   Waiting --admit--> Running --stop/length/abort--> Finished
//      ^                  |
//      +----preempt-------+   (recompute: state dropped, prompt+generated tokens requeued)
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/model_runner.h"
#include "runtime/fault_injection.h"
#include "runtime/sampler.h"
#include "runtime/spec_stats.h"
#include "tokenizer/decode_stream.h"

namespace fathom::grammar {
class CompiledGrammar;
class Matcher;
}  // namespace fathom::grammar

namespace fathom {

using Clock = std::chrono::steady_clock;

struct RequestParams {
  SamplingParams sampling;
  int max_tokens = 16;
  int min_tokens = 0;                  // eos / stop ids are ignored before this many tokens
  std::vector<std::string> stop;       // stop strings (need a tokenizer)
  std::vector<int32_t> stop_token_ids; // in addition to the model's eos ids
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  int logprobs = -1;                   // -1: none; k >= 0: chosen token + k top alternatives
  bool skip_special_tokens = true;
  bool detokenize = true;
  FaultInjection fault;                // tests only
  // Structured output: only tokens this grammar allows (a mask before sampling); null: any.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;
};

// One event from the engine for one sequence: the tokens produced since the last event.
struct RequestOutput {
  int index = 0;                      // choice index inside the client request
  std::vector<int32_t> token_ids;
  std::string text;                   // newly released text (stop-string hold-back applied)
  std::vector<TokenLogprob> logprobs; // one per token, when requested
  bool finished = false;
  std::string finish_reason;          // "stop", "length", "abort", "error" (then `error` says why)
  std::string stop_str;               // the stop string that matched, if any
  std::optional<int32_t> stop_token;  // the stop token id that matched, if any (not eos)
  std::string error;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens the prefix cache served (usage's cached_tokens)
  // On the final event: the decode forwards the sequence took part in (its prefill not counted)
  // and, with speculative decoding, its drafts' acceptance.
  int64_t decode_steps = 0;
  SpecStats spec;
};

// Thread-safe queue of events for one client request (shared by its n sequences). A consumer
// either waits in pop(), or sets a notify callback (called by the producer after each push; it
// must be quick, e.g. posting work elsewhere) and drains with try_pop().
class OutputChannel {
 public:
  void set_notify(std::function<void()> fn) {
    std::lock_guard<std::mutex> l(m_);
    notify_ = std::move(fn);
  }
  void push(RequestOutput o) {
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> l(m_);
      q_.push_back(std::move(o));
      notify = notify_;
    }
    cv_.notify_one();
    if (notify) notify();
  }
  std::optional<RequestOutput> try_pop() {
    std::lock_guard<std::mutex> l(m_);
    if (q_.empty()) return std::nullopt;
    RequestOutput o = std::move(q_.front());
    q_.pop_front();
    return o;
  }
  // Waits up to `timeout` for an event.
  template <class Dur>
  std::optional<RequestOutput> pop(Dur timeout) {
    std::unique_lock<std::mutex> l(m_);
    if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    RequestOutput o = std::move(q_.front());
    q_.pop_front();
    return o;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<RequestOutput> q_;
  std::function<void()> notify_;
};

enum class RequestStatus { Waiting, Running, Finished };

// What a client submits for one sequence.
struct RequestSpec {
  uint64_t group = 0;  // client request id; abort(group) cancels all its sequences
  int index = 0;
  std::vector<int32_t> prompt;
  RequestParams params;
  std::shared_ptr<OutputChannel> out;
};

// Engine-side state of one sequence. Owned and touched only by the engine thread.
struct Request {
  RequestSpec spec;
  std::vector<int32_t> tokens;   // prompt + generated; the model has consumed num_computed of them
  int64_t num_prompt = 0;
  int64_t num_computed = 0;
  std::vector<int32_t> block_table;  // paged KV accounting (block ids)
  int state_slot = -1;               // linear-attention state slot
  std::vector<int32_t> drafts;       // speculative drafts to verify after the pending token this step
  std::vector<int32_t> step_tokens;  // [pending token, drafts...]: the tokens fed in a verify step
  // Fused MTP rounds (engine_mtp_round.cpp): the draft the last round's MTP row made for the
  // pending token's successor (-1: none; the next round then drafts through the speculator).
  int32_t next_draft = -1;
  // Ran a step without speculation's bookkeeping (an overlapped plain step: no hidden states for
  // the MTP layer, which is behind from then on): it never drafts again, nor is it snapshotted
  // with MTP (until a preemption starts it afresh).
  bool spec_off = false;
  SequenceId seq = 0;                // engine sequence, 0 when none
  RequestStatus status = RequestStatus::Waiting;
  int num_preemptions = 0;
  bool queue_observed = false;      // its queue time went into /metrics
  // Prefix caching (runtime/prefix_cache.h): the next position whose state goes into the cache
  // (prefill chunks stop there; -1: none), and the latest block-aligned snapshot of this
  // sequence's conversation so far, cached when it ends (the next turn of a chat starts there).
  // The positions wanted besides the interval's: where the prompt stops sharing blocks with an
  // earlier prompt, and where requests waiting for this one's prefill share its prompt.
  int64_t next_snapshot = -1;
  std::vector<int64_t> snapshot_targets;
  std::vector<uint64_t> block_hashes;  // of the tokens before the last (PrefixCache::block_hashes)
  int64_t turn_snapshot = 0, turn_snapshot_len = 0;
  int prefix_lookups = 0;  // admissions that looked the prompt up (one each, preemptions included)
  int64_t num_cached = 0;  // prompt tokens its first admission found in the prefix cache
  int64_t decode_steps = 0;  // RequestOutput::decode_steps
  SpecStats spec_stats;      // RequestOutput::spec

  Sampler sampler;
  std::shared_ptr<grammar::Matcher> matcher;  // with spec.params.grammar: the output so far
  std::unique_ptr<tok::DecodeStream> detok;
  std::string text;           // detokenized output so far (cut at a stop string)
  size_t text_released = 0;   // bytes of `text` already sent
  size_t stop_scan_from = 0;  // stop strings are searched from here
  RequestOutput pending;      // accumulates until the next flush

  Clock::time_point arrival, first_token, last_token;
  bool has_first_token = false;

  Request(RequestSpec s, Clock::time_point now)
      : spec(std::move(s)), sampler(spec.params.sampling), arrival(now) {
    tokens = spec.prompt;
    num_prompt = int64_t(tokens.size());
  }
  int64_t num_output() const { return int64_t(tokens.size()) - num_prompt; }
  // Tokens the next forward should consume: the unconsumed ones plus the drafts.
  int64_t num_wanted() const { return int64_t(tokens.size()) - num_computed + int64_t(drafts.size()); }
  std::span<const int32_t> prompt_span() const { return {tokens.data(), size_t(num_prompt)}; }
  std::span<const int32_t> output_span() const {
    return {tokens.data() + num_prompt, size_t(tokens.size() - num_prompt)};
  }
};

}  // namespace fathom
