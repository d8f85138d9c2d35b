// The serving engine's metrics (Engine, engine.h): the histograms and counters a step updates,
// the load gauges, and their Prometheus text at /metrics.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "runtime/engine.h"

namespace fathom {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fmt_double(double v) {
  if (std::isinf(v)) return "+Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help, const std::string& labels) const {
  std::ostringstream os;
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    os << name << "_bucket{" << labels << ",le=\""
       << (i < bounds_.size() ? fmt_double(bounds_[i]) : std::string("+Inf")) << "\"} " << cum << "\n";
  }
  os << name << "_sum{" << labels << "} " << fmt_double(sum_) << "\n";
  os << name << "_count{" << labels << "} " << count_ << "\n";
  return os.str();
}

Engine::Stats Engine::stats() const {
  Stats s;
  s.running = stat_running_;
  s.waiting = stat_waiting_;
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_free = stat_blocks_free_;
  s.kv_usage = s.kv_blocks_total ? double(s.kv_blocks_total - s.kv_blocks_free) / double(s.kv_blocks_total) : 0.0;
  return s;
}

void Engine::observe_queue(Request& r) {
  if (r.queue_observed) return;
  r.queue_observed = true;
  std::lock_guard<std::mutex> l(metrics_mu_);
  metrics_.queue.observe(seconds(Clock::now() - r.arrival));
}

std::string Engine::render_load_gauges(const std::string& prefix, const std::string& model_name) const {
  std::ostringstream os;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " gauge\n"
       << prefix << name << "{model_name=\"" << model_name << "\"} " << fmt_double(v) << "\n";
  };
  const Stats s = stats();
  gauge("num_requests_running", "Number of sequences in model execution batches.", s.running);
  gauge("num_requests_waiting", "Number of sequences waiting to be processed.", s.waiting);
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  return os.str();
}

std::string Engine::render_metrics(const std::string& prefix, const std::string& model_name) const {
  const std::string labels = "model_name=\"" + model_name + "\"";
  std::ostringstream os;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " gauge\n"
       << prefix << name << "{" << labels << "} " << fmt_double(v) << "\n";
  };
  auto counter = [&](const std::string& name, const std::string& help, uint64_t v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " counter\n"
       << prefix << name << "{" << labels << "} " << v << "\n";
  };
  auto seconds_counter = [&](const std::string& name, const std::string& help, double v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " counter\n"
       << prefix << name << "{" << labels << "} " << fmt_double(v) << "\n";
  };
  os << render_load_gauges(prefix, model_name);
  const Stats s = stats();
  gauge("kv_cache_blocks_total", "KV-cache blocks (16 tokens each).", double(s.kv_blocks_total));
  std::lock_guard<std::mutex> l(metrics_mu_);
  counter("num_preemptions_total", "Cumulative number of preemptions (recompute).", metrics_.preemptions);
  counter("prompt_tokens_total", "Number of prefill tokens processed.", metrics_.prompt_tokens);
  counter("generation_tokens_total", "Number of generation tokens processed.", metrics_.generation_tokens);
  counter("requests_received_total", "Number of client requests accepted.", metrics_.requests_received);
  if (prefix_cache_) {  // vLLM's names: tokens looked up, tokens found
    counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", metrics_.prefix_queries);
    counter("prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", metrics_.prefix_hits);
    gauge("prefix_cache_hit_rate", "Prefix cache hits / queries (tokens).",
          metrics_.prefix_queries ? double(metrics_.prefix_hits) / double(metrics_.prefix_queries) : 0.0);
    gauge("prefix_cache_bytes", "Bytes of prefix snapshots held on the device.", double(stat_prefix_bytes_.load()));
  }
  if (host_cache_) {  // vLLM's names for a cache outside the device's (its KV connectors')
    counter("external_prefix_cache_queries_total", "Prompt tokens looked up in the host tier of the prefix cache.",
            metrics_.prefix_host_queries);
    counter("external_prefix_cache_hits_total",
            "Prompt tokens served from the host tier (included in prefix_cache_hits_total).", metrics_.prefix_host_hits);
    counter("prefix_cache_offloaded_snapshots_total", "Snapshots moved from the device to the host tier on eviction.",
            metrics_.prefix_offloads);
    counter("prefix_cache_onloaded_snapshots_total", "Snapshots moved back from the host tier on a hit.", metrics_.prefix_onloads);
    seconds_counter("prefix_cache_offload_host_seconds_total",
            "Seconds the engine thread spent in moves to the host tier (refused ones included).",
            metrics_.prefix_offload_seconds);
    seconds_counter("prefix_cache_onload_host_seconds_total",
            "Seconds the engine thread spent in moves back from the host tier (refused ones included).",
            metrics_.prefix_onload_seconds);
    gauge("prefix_cache_host_bytes", "Bytes of prefix snapshots held in the host tier.", double(stat_prefix_host_bytes_.load()));
  }
  os << "# HELP " << prefix << "request_errors_total Sequences ended by an error, by where it was raised.\n"
     << "# TYPE " << prefix << "request_errors_total counter\n";
  for (const auto& [stage, n] : metrics_.errors)
    os << prefix << "request_errors_total{" << labels << ",stage=\"" << stage << "\"} " << n << "\n";
  os << "# HELP " << prefix << "request_success_total Count of finished sequences by finish reason.\n"
     << "# TYPE " << prefix << "request_success_total counter\n";
  for (const auto& [reason, n] : metrics_.finished)
    os << prefix << "request_success_total{" << labels << ",finished_reason=\"" << reason << "\"} " << n << "\n";
  os << metrics_.ttft.render(prefix + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels);
  os << metrics_.itl.render(prefix + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels);
  os << metrics_.e2e.render(prefix + "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", labels);
  os << metrics_.queue.render(prefix + "request_queue_time_seconds", "Histogram of time spent waiting before the first forward.", labels);
  if (spec_) {  // vLLM's spec_decode_* names, plus the derived rates
    const SpecStats& sp = metrics_.spec;
    counter("spec_decode_num_drafts_total", "Verification rounds that had at least one draft.", uint64_t(sp.draft_rounds));
    counter("spec_decode_num_draft_tokens_total", "Draft tokens verified.", uint64_t(sp.draft_tokens));
    counter("spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", uint64_t(sp.accepted_tokens));
    counter("spec_decode_fused_rounds_total",
            "Verification steps that ran the next MTP draft in the same launch (greedy, one draft a round).",
            metrics_.spec_fused_rounds);
    counter("spec_decode_chained_rounds_total",
            "Fused rounds launched before the round before them was read (overlapped speculative rounds).",
            metrics_.spec_chained_rounds);
    counter("spec_decode_waiting_steps_total",
            "Steps run one at a time in an engine that overlaps steps, because a sequence could draft (outside "
            "chained rounds).",
            metrics_.spec_waiting_steps);
    gauge("spec_decode_batch_limit",
          "Sequences (running or waiting) from which steps run plain (disable-by-batch-size, auto as settled; "
          "0: none).",
          double(auto_batch_limit() ? stat_auto_limit_.load() : std::max(0, spec_->options().disable_by_batch_size)));
    auto per_pos = [&](const std::string& name, const std::string& type, const std::string& help, auto value) {
      os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " " << type << "\n";
      for (size_t i = 0; i < sp.drafted_at.size(); ++i)
        os << prefix << name << "{" << labels << ",position=\"" << i << "\"} " << value(i) << "\n";
    };
    per_pos("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted draft tokens by draft position.",
            [&](size_t i) { return std::to_string(sp.accepted_at[i]); });
    per_pos("spec_decode_num_draft_tokens_per_pos_total", "counter", "Verified draft tokens by draft position.",
            [&](size_t i) { return std::to_string(sp.drafted_at[i]); });
    const std::vector<double> rate = sp.acceptance_by_position();
    per_pos("spec_decode_acceptance_rate_per_pos", "gauge", "Accepted / verified drafts by draft position.",
            [&](size_t i) { return fmt_double(rate[i]); });
    gauge("spec_decode_draft_acceptance_rate", "Accepted / verified draft tokens.", sp.acceptance_rate());
    gauge("spec_decode_mean_accepted_length",
          "Tokens emitted per verification round with drafts (accepted drafts + 1).", sp.mean_accepted_length());
  }
  return os.str();
}

}  // namespace fathom
