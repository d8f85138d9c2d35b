// Continuous batching: each step mixes decode tokens of running sequences with prefill chunks
// under a token budget (max-num-batched-tokens), decode first: every decoding sequence gets its
// token (and drafts) before any prefill, and prefill tokens in one step are capped by
// max_prefill_tokens (SGLang's --chunked-prefill-size), so a long prompt arriving costs the
// running streams at most that much extra step time. Prefills of running sequences (a chunked
// prompt's rest) come before new admissions, which are taken while a state slot, budget and KV
// blocks are free. When a running sequence needs a block and none is free, the most recently admitted
// sequence is preempted by recompute: its blocks and slot are freed and it goes back to the
// front of the waiting queue with prompt + generated tokens, to be prefilled again.
//
// A prefill chunk ends at the request's next_snapshot position (prefix caching saves the state
// there; an admission may move it, so chunks are cut to it once all are planned), and with
// align_chunks a chunk the budget cuts ends on a block boundary. A step entry
// carries any number of tokens per sequence (Request::num_wanted: the unconsumed
// tokens plus any speculative drafts), so verification of drafts fits the same plan; a chunk
// shorter than that verifies fewer drafts.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "runtime/kv_cache_manager.h"
#include "runtime/request.h"

namespace fathom {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_prefill_tokens = 0;  // prefill tokens in one step (0: max_num_batched_tokens)
  // A prefill chunk cut by the budget ends on a block boundary (prefix caching snapshots the state
  // there at no extra step).
  bool align_chunks = false;
  int64_t max_chunk_tokens = 0;  // prompt tokens of one sequence in one step (0: no cap beyond the budgets)
};

struct ScheduledChunk {
  Request* req;
  int64_t num_tokens;  // tokens fed this step, starting at req->num_computed
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Request*> preempted;  // the engine must drop their sequences
  int64_t num_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, BlockManager& blocks, StateSlotPool& slots)
      : cfg_(cfg), blocks_(blocks), slots_(slots) {}

  void add(Request* r);           // to the back of the waiting queue
  // Called for a waiting request each time it is about to be admitted, before its chunk is
  // sized: prefix caching starts it from a cached prefix there (num_computed > 0). False: not
  // this step (its shared prefix is still being prefilled by another request); the requests
  // behind it may go.
  void set_admit_hook(std::function<bool(Request&)> hook) { admit_hook_ = std::move(hook); }
  void set_align_chunks(bool on) { cfg_.align_chunks = on; }
  // Without preemption (the overlapped engine while a step is in flight), a sequence that needs a
  // block none can give waits.
  SchedulerOutput schedule(bool allow_preemption = true);
  // Removes a request wherever it is and frees its blocks and slot (finish or abort).
  void remove(Request* r);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  void preempt(Request* r);
  // Grows r's blocks to `tokens`, preempting from the back of the running list while none are
  // free; false when r itself was preempted or the next victim is already in this step.
  bool grow(Request* r, int64_t tokens, SchedulerOutput& out, bool allow_preemption);

  SchedulerConfig cfg_;
  BlockManager& blocks_;
  StateSlotPool& slots_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order
  int64_t num_preemptions_ = 0;
  std::function<bool(Request&)> admit_hook_;
};

}  // namespace fathom
