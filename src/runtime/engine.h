// The serving engine: a ModelRunner driven by the continuous-batching Scheduler on its own
// thread. Client threads submit requests and receive RequestOutput events through
// OutputChannels; abort() (client disconnect) removes a request and frees its slot and blocks
// at the next step boundary. Also collects the serving metrics exported at /metrics.
// With speculative decoding on, each decode step of a sequence verifies its drafts (proposed
// before scheduling) in the same batched forward as everyone else's tokens.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "model/model_runner.h"
#include "runtime/kv_cache_manager.h"
#include "runtime/prefix_cache.h"
#include "runtime/request.h"
#include "runtime/sampling_rows.h"
#include "runtime/scheduler.h"
#include "runtime/spec_batch_limit.h"
#include "runtime/spec_sampling.h"
#include "runtime/spec_stats.h"
#include "runtime/speculator.h"

namespace fathom::tok {
class Tokenizer;
}

namespace fathom {

struct EngineConfig {
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_prefill_tokens = 0;  // prefill tokens joining one step (0: max_num_batched_tokens)
  // Prompt tokens of one sequence in one step (0: no cap beyond the budgets); also bounds the MTP
  // layer's catch-up forwards. Offline generation's --prefill-chunk.
  int64_t max_chunk_tokens = 0;
  int64_t max_model_len = 4096;
  int max_queue_len = 1024;    // waiting requests (sequences) beyond this are refused
  int block_size = 16;
  int64_t num_kv_blocks = 0;   // 0: enough for max_num_seqs sequences of max_model_len
  std::vector<int32_t> eos_token_ids;
  SpecOptions spec;  // algorithm None: plain decoding
  // MTP with one draft a round: verify and draft in one launch where the runner can (engine_mtp_round.cpp;
  // also off with FATHOM_FUSED_MTP=0).
  bool fused_mtp_rounds = true;
  // With overlapped scheduling on a runner that can: the next fused round launched before this
  // one is read (Engine::step_chained_round; also off with FATHOM_CHAINED_ROUNDS=0).
  bool chained_mtp_rounds = true;
  // Choose tokens where the logits are when the runner can (only ids and the logprobs asked for
  // come back); false: copy every logits row to the host and sample there.
  bool device_sampling = true;
  // With device sampling: plan and launch the next step while the device runs this one
  // (SGLang's overlap scheduler; off: --disable-overlap-schedule). With speculative decoding,
  // for the steps in which nobody drafts (every sequence retired, or disable_by_batch_size
  // reached): a sequence that runs such a step drafts no more (Request::spec_off).
  bool overlap_schedule = true;
  // Prefix caching (runtime/prefix_cache.h), where the runner can snapshot sequences: snapshots
  // of prompts where a prefill chunk ends on a block boundary (and every `prefix_cache_interval`
  // tokens, 0: no extra chunk ends), where prompts stop sharing blocks, and of conversations at
  // their end; `prefix_cache_bytes` of them at most (LRU). A shared part shorter than
  // `prefix_cache_min_shared` tokens neither cuts a prefill chunk nor holds a request back (the
  // extra step would cost more than the tokens saved).
  bool enable_prefix_caching = true;
  int64_t prefix_cache_bytes = int64_t(2) << 30;
  int64_t prefix_cache_interval = 0;
  int64_t prefix_cache_min_shared = 256;
  // The host tier (runners with supports_host_snapshots()): entries the prefix cache evicts move
  // to host memory, up to this many bytes (least recently used dropped), and back on a hit (0: none).
  int64_t prefix_cache_host_bytes = 0;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus text lines for `name` with extra labels `labels` (e.g. model_name="x").
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct EngineMetrics {
  std::map<std::string, uint64_t> finished;  // by finish reason
  std::map<std::string, uint64_t> errors;    // sequences ended by an error, by stage
  uint64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0, requests_received = 0;
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}};
  Histogram e2e{{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120}};
  Histogram queue{{0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 1, 2.5, 5, 10, 20, 60}};
  SpecStats spec;  // speculative decoding, all sequences
  uint64_t spec_fused_rounds = 0;  // verification steps run with their MTP draft in one launch
  uint64_t spec_chained_rounds = 0;  // fused rounds launched before the round before them was read
  uint64_t spec_waiting_steps = 0;   // an overlapping engine's steps run one at a time (speculative, not chained)
  uint64_t prefix_queries = 0, prefix_hits = 0;  // prompt tokens looked up / found in the prefix cache
  // The host tier: prompt tokens looked up there / found there (vLLM's external_prefix_cache_*),
  // snapshots moved down (evicted from the device) and back up (hits).
  uint64_t prefix_host_queries = 0, prefix_host_hits = 0, prefix_offloads = 0, prefix_onloads = 0;
  // The engine thread's time inside the runner's moves (down / up, refused ones included): what a
  // move holds the next step back on the host.
  double prefix_offload_seconds = 0, prefix_onload_seconds = 0;
};

// Whether fused greedy MTP rounds may run (FATHOM_FUSED_MTP=0: never; engine_mtp_round.cpp).
bool fused_mtp_rounds_enabled();
// Whether fused rounds may chain (FATHOM_CHAINED_ROUNDS=0: never).
bool chained_rounds_enabled();

class Engine {
 public:
  // `tokenizer` may be null (skip-tokenizer-init): then no text and no stop strings.
  Engine(std::unique_ptr<ModelRunner> runner, const tok::Tokenizer* tokenizer, EngineConfig cfg);
  // Borrows `runner` (offline generation: the caller keeps it, and gets it back with no sequences).
  Engine(ModelRunner& runner, const tok::Tokenizer* tokenizer, EngineConfig cfg);
  ~Engine();

  void start();
  // Offline use, instead of start(): runs steps on the calling thread until every submitted
  // request has finished (any that cannot be scheduled end with "abort"); `after_step` runs after
  // each step (to read the output channels).
  void run_until_done(const std::function<void()>& after_step = {});
  // Stops the loop; pending requests finish with reason "abort".
  void shutdown();
  bool accepting() const { return !stopping_.load(); }

  enum class SubmitResult { Ok, QueueFull, ShuttingDown };
  // Submits all sequences of one client request (all or none).
  SubmitResult submit(std::vector<RequestSpec> specs);
  void abort(uint64_t group);
  uint64_t new_group_id() { return next_group_.fetch_add(1); }

  const EngineConfig& config() const { return cfg_; }
  const ModelConfig& model_config() const { return runner_->config(); }
  std::string device_name() const { return runner_->device_name(); }
  bool samples_on_device() const { return device_sampling_; }
  bool overlaps_steps() const { return overlap_; }
  bool caches_prefixes() const { return prefix_cache_ != nullptr; }

  struct Stats {
    int running = 0, waiting = 0;
    double kv_usage = 0;
    int64_t kv_blocks_total = 0, kv_blocks_free = 0;
  };
  Stats stats() const;
  // Prometheus text for all engine metrics, names prefixed `prefix` ("fathom:").
  std::string render_metrics(const std::string& prefix, const std::string& model_name) const;
  // The load gauges alone (running, waiting, KV usage), for a second prefix ("vllm:").
  std::string render_load_gauges(const std::string& prefix, const std::string& model_name) const;

 private:
  void loop();
  bool step();  // one scheduled forward; false when idle
  void drain_inbox();
  void propose_drafts();
  // With speculative decoding and overlap: whether this step is a speculative one (planned after
  // the previous step's tokens are read), else an overlapped plain one.
  bool speculative_step() const;
  void forget_sequence(Request& r);  // a preempted request's sequence
  // The automatic batch limit's measurements (disable_by_batch_size -1): a speculative step of
  // `batch` decodes with drafts that took `seconds` and emitted `tokens`; an overlapped plain one
  // just finished (timed from the previous finish).
  bool auto_batch_limit() const { return spec_ && overlap_ && spec_->options().disable_by_batch_size < 0; }
  struct StepTiming {
    Clock::time_point start;
    uint64_t tokens_before = 0;  // generation tokens counted before the step
    int batch = 0;
    bool timed = false;
  };
  StepTiming begin_speculative_timing(const SchedulerOutput& plan, Clock::time_point start);
  void end_speculative_timing(const StepTiming& t);
  void time_plain_step(bool decode_only, int batch);
  // Fused MTP rounds (engine_mtp_round.cpp): a step whose sequences all decode with their MTP
  // layer caught up (plain greedy, or anything the device sampler takes) runs the verify and the
  // next draft in one launch (ModelRunner::forward_verify_draft), with no draft step of its own.
  bool plain_greedy(const Request& r) const;  // the argmax of the raw logits (no processing, no logprobs)
  // Fault injection aside, any decode with device sampling, else a plain greedy one.
  bool fused_round_eligible(const Request& r) const;
  bool fused_round_possible(const SchedulerOutput& plan) const;
  void run_fused_round(const SchedulerOutput& plan, const StepTiming& timing);
  // A fused round launched (chained rounds) or run (its output kept), not read yet.
  struct InflightRound {
    bool active = false;
    std::vector<ScheduledChunk> chunks;
    std::vector<SequenceId> seqs;  // to tell a request that ended meanwhile
    StepTiming timing;
    bool has_out = false;          // run at once: the output is here
    VerifyDraftOutput out;
  };
  // Chained rounds (runners with supports_chained_rounds, overlapped scheduling on): while round
  // N runs, round N + 1 of the same sequences is launched from N's outcome on the device, then N
  // is read; the host's work for N overlaps N + 1 as plain overlapped steps' does. The chain
  // breaks (N is read first) when a request arrives or waits, or one of N's may not continue.
  InflightRound launch_round(const std::vector<ScheduledChunk>& chunks, bool chained, const StepTiming& timing);
  bool step_chained_round();
  bool chain_eligible(Request& r);  // may r's next round launch before this one is read
  void finish_round(InflightRound& in, bool next_chained);
  void finish_fused_round(Request& r, const VerifyDraftOutput& out, size_t i, Clock::time_point now,
                          bool next_chained);
  // Output processing (engine_output.cpp).
  // The token the request's sampler picks from `row` (min_tokens masking and penalties applied);
  // with a draft, whether it is accepted (greedy: equal to that pick; else rejection sampling).
  Acceptance choose(Request& r, const float* row, int64_t vocab, const int32_t* draft);
  // Appends a token (with its logprobs when the request asks) and streams its text; returns the
  // finish reason ("" to go on), after which the caller must finish(r, reason).
  // `out_pos` is the token's index in r.tokens: the end, or a placeholder (overlapped steps).
  std::string process_token(Request& r, int64_t out_pos, int32_t token, TokenLogprob* logprob, Clock::time_point now);
  // One forward's results, from either path: host logits (fo) or device choices (so).
  struct StepResult {
    const ForwardOutput* fo = nullptr;
    const SampledOutput* so = nullptr;
    const std::vector<int64_t>& row_begin() const { return fo ? fo->row_begin : so->row_begin; }
    const std::vector<float>& hidden() const { return fo ? fo->hidden : so->hidden; }
    const std::vector<int64_t>& hidden_row_begin() const { return fo ? fo->hidden_row_begin : so->hidden_row_begin; }
  };
  // The sampler rows of a planned step (device sampling): the rows forward() would return.
  // With defer_masks, grammar rows get an all-allowed placeholder mask (supply_deferred_masks()).
  void add_sampling_rows(const std::vector<ScheduledChunk>& chunks, const std::vector<ForwardStep>& steps,
                         bool defer_masks = false);
  // The token chosen from logits row `row` (and whether `draft` was accepted); fills `lp` when the
  // request asks for logprobs.
  Acceptance pick(Request& r, const StepResult& res, int64_t row, const int32_t* draft, TokenLogprob& lp);
  Acceptance pick_from_row(Request& r, const float* logits, const int32_t* draft, TokenLogprob& lp);  // host logits
  // A row's logprobs as the device reported them: the chosen token's and the top n.
  static TokenLogprob device_logprob(const RowSample& s, const std::vector<int32_t>& top_ids,
                                     const std::vector<float>& top_logprobs, int64_t row, int n);
  // The rest of a step for one sequence: sampling, draft verification, streaming, bookkeeping.
  void finish_chunk(Request& r, const ForwardStep& step, const StepResult& res, size_t i, int64_t pos,
                    Clock::time_point now);
  void record_round(Request& r, int drafted, int accepted);  // a decode round's statistics
  // Ends `r` alone with finish reason "error" (counted by `stage` in /metrics).
  void fail_request(Request& r, const std::string& stage, const std::string& what);
  void flush(Request& r, bool finished, const std::string& reason);  // streams r.pending
  void finish(Request& r, const std::string& reason);

  // Overlapped scheduling (engine_overlap.cpp): a launched step whose results are not read yet.
  struct InflightChunk {
    Request* req;
    SequenceId seq;    // to tell a request that ended meanwhile (and a new one at its address)
    int64_t out_pos;   // where its token goes in req->tokens; -1: a chunk before the prompt's end
    int32_t mask_row;  // its row's grammar mask in sampling_rows_, or -1
    int64_t end_snapshot = 0;  // the state where its prompt ends, cached with the row's logits once read
  };
  struct InflightStep {
    bool active = false;
    bool masks_deferred = false;  // launched with placeholder masks, its sampler waiting for them
    bool decode_only = false;     // every chunk a decode (its time measures a plain decode step)
    std::vector<InflightChunk> chunks;
  };
  bool step_overlapped();
  void start_sequence(Request& r);
  bool guarded_forward(const std::vector<ScheduledChunk>& chunks, const std::function<void()>& forward);
  InflightStep launch_overlapped(const SchedulerOutput& plan, bool defer_masks);
  void supply_deferred_masks(const InflightStep& in);
  void finish_overlapped(InflightStep& in);
  // The token at out_pos ends the request whatever it is (max_tokens, max_model_len).
  bool decodes_certainly_end(const Request& r, int64_t out_pos) const;
  bool penalties_running() const;  // output-dependent penalties need each step's tokens first
  void observe_queue(Request& r);  // engine_metrics.cpp
  // Prefix caching (engine_prefix.cpp): the admission hook that starts a request from its longest
  // cached prefix, the next position to snapshot, the snapshots after a forward, and the
  // conversation's snapshot going into the cache when the request ends.
  bool admit(Request& r);  // false: r waits for another request's prefill of its prefix
  // A hit on a prompt end: the MTP layer gets the last cached position's row, and an exact repeat
  // its first token from the cached logits (false: that token ended the request, finished after
  // the scheduler's pass by finish_ended_at_admission()).
  bool resume_at_prompt_end(Request& r, const PromptEnd& end, int64_t length);
  void finish_ended_at_admission();
  // The state where r's prompt ends, with its last row's logits and hidden state (null without
  // MTP), into the cache.
  void snapshot_prompt_end(Request& r, const float* logits, const float* hidden);
  // A request that drafts no more (spec_off or retired): snapshotted without MTP state.
  bool drafts_no_more(const Request& r) const;
  bool mtp_state_behind(const Request& r, const PrefixCache::Hit& hit) const;
  // A snapshot saved at r's prompt end (`snap`), into the cache with that row's logits.
  void cache_prompt_end(Request& r, int64_t snap, const float* logits, const float* hidden);
  // Whether the row ending r's prompt (r has no output yet) is to be cached as a prompt end: its
  // runner returns that row's logits with device sampling.
  bool wants_prompt_end(const Request& r) const;
  // The device sampler's choice of r's next token from host logits, by the CPU row sampler (its
  // semantics and random numbers): an exact repeat's first token from a cached prompt end.
  Acceptance pick_like_device(Request& r, const float* logits, TokenLogprob& lp);
  std::optional<uint64_t> prompt_blocks_hash(const Request& r) const;  // (nullopt: hash the prompt)
  bool wait_for_shared_prefill(const Request& r, int64_t cached);
  void add_snapshot_target(Request& r, int64_t at);
  bool cached(const Request& r, int64_t at) const;
  int64_t next_snapshot_at(const Request& r) const;
  void take_snapshots();  // of every running sequence, before a step is planned
  void take_snapshots(Request& r);
  bool snapshot_ready(Request& r);
  int64_t save_snapshot(Request& r);
  // `make()`'s snapshot id, evicting the least recently used entries (to the host tier, if any)
  // while the runner's room for snapshots is full; 0: no room even so.
  int64_t with_snapshot_room(const std::function<int64_t()>& make);
  // A cache hit on the host tier, moved back to the device: the entry (snapshot: the device one),
  // out of the host cache; snapshot 0: it could not come back (left where it was).
  PrefixCache::Removed onload(const PrefixCache::Hit& host_hit);
  bool turn_room_for(const Request& r, int64_t at) const;
  void release_turn_snapshot(Request& r);  // dropped
  void forget_turn_snapshot(Request& r);   // its snapshot went elsewhere (the cache)
  void retire_turn_snapshot(Request& r);
  // Entries the device cache let go (evicted, or offered with no room for them): to the host tier
  // when there is one (its own evictions dropped), else dropped; duplicates are dropped.
  void spill(std::vector<PrefixCache::Removed> removed);
  void drop(Request* r);
  void abort_all();  // after the last step: every request left ends with "abort"

  std::unique_ptr<ModelRunner> owned_runner_;  // null when borrowed
  ModelRunner* runner_;
  const tok::Tokenizer* tok_;
  EngineConfig cfg_;
  BlockManager blocks_;
  StateSlotPool slots_;
  Scheduler sched_;
  std::unique_ptr<Speculator> spec_;
  std::unique_ptr<PrefixCache> prefix_cache_;
  std::unique_ptr<PrefixCache> host_cache_;  // the host tier's entries (EngineConfig::prefix_cache_host_bytes)
  // Snapshots where prompts end, with their last row's logits on the host: host sampling has them;
  // with device sampling, runners that return kept rows (RowSampling::keep_logits: the CPU
  // engine's RowSamplingRunner; the CUDA runner unless FATHOM_DEVICE_PROMPT_ENDS=0).
  bool prompt_end_snapshots_ = false;
  struct EndedAtAdmission {
    Request* req;
    std::string reason, stage, what;  // finish reason; for "error", where and what
  };
  std::vector<EndedAtAdmission> ended_at_admission_;
  int64_t turn_snapshots_ = 0, turn_snapshot_tokens_ = 0;  // live conversation snapshots
  std::set<int32_t> eos_;
  size_t max_stop_len_ = 0;

  // Engine-thread state.
  std::unordered_map<Request*, std::unique_ptr<Request>> live_;
  std::vector<float> logits_scratch_;  // a masked / penalised copy of one logits row (choose())
  bool device_sampling_ = false;
  std::vector<uint32_t> grammar_words_;  // one row's grammar mask (bit t: token t allowed)
  std::vector<uint32_t> all_allowed_;    // the placeholder of a mask that comes later
  // A structured-output row's mask after the output so far (and any drafts the matcher holds for
  // the moment), in grammar_words_; null without a grammar.
  const uint32_t* grammar_mask(const Request& r, int64_t vocab);
  SamplingRows sampling_rows_;
  bool overlap_ = false;
  bool fused_rounds_ = false;  // MTP with one draft a round on a runner that fuses the round
  bool chained_rounds_ = false;  // ... and launches the next round before this one is read
  bool draw_drafts_ = false;     // ... drawing sampled requests' drafts from q (SpecOptions::sampled_drafts)
  InflightStep inflight_;
  InflightRound round_;
  SpecBatchLimit batch_limit_;                 // disable_by_batch_size -1
  bool plain_timed_ = false;                   // last_plain_finish_ starts the next plain step's time
  Clock::time_point last_plain_finish_{};
  std::unordered_multimap<uint64_t, Request*> by_group_;

  // Shared with client threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> aborts_;
  int queued_ = 0;  // inbox + waiting, for admission control
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_group_{1};
  std::thread thread_;

  mutable std::mutex metrics_mu_;
  EngineMetrics metrics_;
  std::atomic<int> stat_running_{0}, stat_waiting_{0};
  std::atomic<int> stat_auto_limit_{SpecBatchLimit::kStart};  // batch_limit_.settled(), for /metrics
  std::atomic<int64_t> stat_blocks_free_{0};
  std::atomic<int64_t> stat_prefix_bytes_{0}, stat_prefix_host_bytes_{0};  // snapshot bytes held per tier
};

}  // namespace fathom
