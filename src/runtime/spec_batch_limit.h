// The automatic --speculative-disable-by-batch-size (`auto`): the batch size from which a
// serving engine with overlapped steps stops drafting, chosen from the token rates it measures.
//
// Below the limit steps are speculative (drafts verified; the step waits for the previous one's
// tokens); from it on they are plain and overlapped, and a sequence that runs such a step drafts
// no more (Engine::speculative_step). Each step's rate (tokens emitted per second of wall time)
// is kept per mode and batch size, decayed so that recent steps count most. Plain steps at or
// above the limit are measured all the time; speculative ones there in probes: every kProbeEvery
// plain steps, the limit is lifted above the current batch for kProbeSteps speculative steps (a
// newcomer then drafts at that batch). A probe's steps run one at a time, not overlapped: a probe
// that leaves the limit where it was doubles the wait before the next (up to kProbeEveryMax), and
// a move of the limit brings it back to kProbeEvery (at 16 clients on the default model, probes
// every 4,096 steps cost 0.5% of the served rate, docs/perf.md). Where speculative steps at a
// batch at or above the limit measured faster than plain ones, the limit moves above it; where
// plain steps below the limit (steps run plain there once nobody can draft) measured faster, it
// moves down to them. Trying plain steps never costs drafting below the limit. Starts at kStart:
// drafting alone pays for any model whose drafts are accepted at all (a sequence whose drafts
// fail retires by itself); with more at once it depends on how far the model is from the memory
// roofline: the measurements say.
// (A probe at a steady full batch measures mostly sequences that no longer draft, so there the
// limit rarely climbs: opt-in, docs/perf.md.)
#pragma once
#include <algorithm>
#include <array>

namespace fathom {

class SpecBatchLimit {
 public:
  static constexpr int kStart = 2, kMin = 2, kMaxBatch = 256;
  static constexpr int kProbeEvery = 4096, kProbeEveryMax = 65536, kProbeSteps = 16;
  static constexpr int kEvidence = 16;        // steps of each mode at a batch size before a move
  static constexpr double kMargin = 1.03;     // how much faster a mode must be to move the limit
  static constexpr double kDecay = 0.97;      // per step of the same mode and batch size

  // Steps with this many running sequences or more run plain.
  int limit() const { return probe_left_ > 0 ? std::max(limit_, probe_batch_ + 1) : limit_; }
  int settled() const { return limit_; }  // the limit outside probe windows

  // One step's measurement: `tokens` emitted by `batch` sequences in `seconds` (pure decode steps:
  // speculative ones with drafts, or overlapped plain ones, wall time from the previous step).
  void record(bool speculative, int batch, double tokens, double seconds) {
    if (batch <= 0 || seconds <= 0 || tokens <= 0) return;
    batch = std::min(batch, kMaxBatch);
    (speculative ? spec_ : plain_)[size_t(batch)].add(tokens, seconds);
    if (speculative && probe_left_ > 0 && batch >= limit_ && --probe_left_ == 0)  // the probe moved nothing
      probe_every_ = std::min(2 * probe_every_, kProbeEveryMax);
    if (!speculative && batch >= limit_ && probe_left_ == 0 && ++plain_steps_ >= probe_every_) {
      plain_steps_ = 0;
      probe_left_ = kProbeSteps;
      probe_batch_ = batch;
    }
    const Rate &s = spec_[size_t(batch)], &p = plain_[size_t(batch)];
    if (!s.enough() || !p.enough()) return;
    if (batch >= limit_ && s.per_s() > p.per_s() * kMargin) {
      limit_ = std::min(batch + 1, kMaxBatch + 1);
      probe_left_ = 0;
      probe_every_ = kProbeEvery;
    } else if (batch < limit_ && p.per_s() > s.per_s() * kMargin) {
      limit_ = std::max(batch, kMin);
      probe_left_ = 0;
      probe_every_ = kProbeEvery;
    }
  }

 private:
  struct Rate {
    double tokens = 0, seconds = 0;
    int steps = 0;
    void add(double t, double s) {
      tokens = tokens * kDecay + t;
      seconds = seconds * kDecay + s;
      ++steps;
    }
    bool enough() const { return steps >= kEvidence; }
    double per_s() const { return seconds > 0 ? tokens / seconds : 0; }
  };
  int limit_ = kStart;
  int plain_steps_ = 0, probe_left_ = 0, probe_batch_ = 0, probe_every_ = kProbeEvery;
  std::array<Rate, kMaxBatch + 1> spec_{}, plain_{};
};

}  // namespace fathom
