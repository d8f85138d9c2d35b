#include "server/bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "server/conversation_queue.h"

namespace fathom::server {
namespace {

using json = nlohmann::json;
using BClock = std::chrono::steady_clock;

struct Result {
  bool ok = false;
  std::string error;
  int prompt_len = 0, output_tokens = 0;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  std::vector<int> output_ids;  // the answer (multi-turn: the next turn's prompt holds it)
};

double sec(BClock::duration d) { return std::chrono::duration<double>(d).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double k = (v.size() - 1) * p / 100.0;
  size_t f = size_t(std::floor(k)), c = std::min(v.size() - 1, f + 1);
  return v[f] + (v[c] - v[f]) * (k - double(f));
}
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

// One request of a run: its prompt, output length, whether it asks for logprobs, and (with a
// request rate) its arrival time after the start.
struct Job {
  std::vector<int> prompt;  // multi-turn: this turn's new message only
  int output_len = 0;
  bool logprobs = false;
  double arrival = 0;
  int turn = 0;             // multi-turn: jobs of one conversation are num_turns consecutive ones
};

Result one_request(httplib::Client& cli, const BenchConfig& cfg, const std::string& model, const Job& job) {
  Result r;
  r.prompt_len = int(job.prompt.size());
  json body = {{"model", model}, {"prompt", job.prompt}, {"max_tokens", job.output_len},
               {"temperature", cfg.temperature}, {"ignore_eos", true}, {"stream", true}, {"return_token_ids", true},
               {"stream_options", {{"include_usage", true}}}};
  if (cfg.top_p < 1) body["top_p"] = cfg.top_p;
  if (cfg.top_k > 0) body["top_k"] = cfg.top_k;
  if (job.logprobs) body["logprobs"] = cfg.logprobs;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!cfg.api_key.empty()) req.set_header("Authorization", "Bearer " + cfg.api_key);
  std::string buf;
  const auto t0 = BClock::now();
  auto last = t0;
  bool first = true, done = false;
  int usage_tokens = -1;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) usage_tokens = j["usage"].value("completion_tokens", -1);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      int ntok = c.contains("token_ids") && c["token_ids"].is_array() ? int(c["token_ids"].size()) : 1;
      if (ntok == 0) continue;
      if (c.contains("token_ids") && c["token_ids"].is_array())
        for (const json& id : c["token_ids"]) r.output_ids.push_back(id.get<int>());
      const auto now = BClock::now();
      if (first) {
        r.ttft = sec(now - t0);
        first = false;
      } else {
        r.itl.push_back(sec(now - last));
      }
      last = now;
      r.output_tokens += ntok;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool sent = cli.send(req, res, err);
  r.e2e = sec(BClock::now() - t0);
  if (usage_tokens >= 0) r.output_tokens = usage_tokens;
  if (!sent) {
    r.error = httplib::to_string(err);
  } else if (res.status != 200) {
    r.error = "HTTP " + std::to_string(res.status) + " " + res.body.substr(0, 200);
  } else if (!done) {
    r.error = "stream ended without [DONE]";
  } else {
    r.ok = true;
  }
  return r;
}

std::string first_model(const BenchConfig& cfg) {
  httplib::Client cli(cfg.url);
  httplib::Headers h;
  if (!cfg.api_key.empty()) h.emplace("Authorization", "Bearer " + cfg.api_key);
  auto res = cli.Get("/v1/models", h);
  if (!res || res->status != 200) fail("cannot list models at ", cfg.url, "/v1/models");
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].empty()) fail("no models at ", cfg.url);
  return j["data"][0]["id"].get<std::string>();
}

// The server's speculative-decoding counters from /metrics (vLLM's spec_decode_* names under any
// prefix; `found` is false when the server exports none), and its prefix-cache counters (tokens).
struct SpecCounters {
  bool found = false;
  double drafts = 0, draft_tokens = 0, accepted = 0;
  std::vector<double> accepted_at;  // by draft position
  double prefix_hits = 0, prefix_queries = 0;
  double host_hits = -1;  // of them, from the host tier (external_prefix_cache_hits_total; -1: no tier)
};

SpecCounters scrape_spec(const BenchConfig& cfg) {
  SpecCounters c;
  httplib::Client cli(cfg.url);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return c;
  size_t at = 0;
  const std::string& t = res->body;
  while (at < t.size()) {
    size_t eol = t.find('\n', at);
    if (eol == std::string::npos) eol = t.size();
    const std::string line = t.substr(at, eol - at);
    at = eol + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t space = line.rfind(' ');
    if (name_end == std::string::npos || space == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    const double v = std::strtod(line.c_str() + space + 1, nullptr);
    auto is = [&](const char* suffix) {
      const std::string s = std::string(":") + suffix;
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (is("spec_decode_num_drafts_total")) c.drafts = v, c.found = true;
    else if (is("spec_decode_num_draft_tokens_total")) c.draft_tokens = v;
    else if (is("spec_decode_num_accepted_tokens_total")) c.accepted = v;
    else if (is("prefix_cache_hits_total")) c.prefix_hits = v;
    else if (is("prefix_cache_queries_total")) c.prefix_queries = v;
    else if (is("external_prefix_cache_hits_total")) c.host_hits = v;
    else if (is("spec_decode_num_accepted_tokens_per_pos_total")) {
      const size_t p = line.find("position=\"");
      if (p == std::string::npos) continue;
      const size_t pos = size_t(std::strtoul(line.c_str() + p + 10, nullptr, 10));
      if (c.accepted_at.size() <= pos) c.accepted_at.resize(pos + 1, 0);
      c.accepted_at[pos] = v;
    }
  }
  return c;
}

void progress(int done, int total) {
  const int width = 40;
  int fill = total ? done * width / total : width;
  std::fprintf(stderr, "\r[%s%s] %d/%d", std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(), done, total);
  std::fflush(stderr);
}

}  // namespace

void parse_goodput(BenchConfig& cfg, const std::vector<std::string>& entries) {
  for (const std::string& e : entries) {
    const size_t colon = e.find(':');
    FATHOM_CHECK(colon != std::string::npos, "--goodput: '", e, "' is not NAME:MILLISECONDS (ttft, tpot, e2el)");
    const std::string name = e.substr(0, colon);
    char* end = nullptr;
    const double ms = std::strtod(e.c_str() + colon + 1, &end);
    FATHOM_CHECK(end && *end == '\0' && ms > 0, "--goodput: '", e, "' needs a positive number of milliseconds");
    if (name == "ttft") cfg.slo_ttft_ms = ms;
    else if (name == "tpot") cfg.slo_tpot_ms = ms;
    else if (name == "e2el") cfg.slo_e2el_ms = ms;
    else fail("--goodput: unknown metric '", name, "' (ttft, tpot, e2el)");
  }
}

namespace {

// The jobs of one run: random token-id prompts, lengths uniform around their means, a share
// asking for logprobs, Poisson arrival times when a request rate is set.
std::vector<Job> make_jobs(const BenchConfig& cfg) {
  std::mt19937_64 gen(cfg.seed);
  std::uniform_int_distribution<int> token(0, cfg.vocab_size - 17);
  auto length = [&](int mean) {
    if (mean <= 0) return 0;  // prefix-repeat with --input-len 0: the prefix alone, repeated exactly
    const int lo = std::max(1, int(std::floor(mean * (1 - cfg.range_ratio))));
    const int hi = std::max(lo, int(std::ceil(mean * (1 + cfg.range_ratio))));
    return std::uniform_int_distribution<int>(lo, hi)(gen);
  };
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<int> prefix(size_t(cfg.dataset == "prefix-repeat" ? cfg.prefix_len : 0));
  for (int& x : prefix) x = token(gen);
  std::vector<Job> jobs(size_t(cfg.num_prompts));
  double t = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    j.prompt = prefix;
    j.prompt.resize(prefix.size() + size_t(length(cfg.input_len)));
    for (size_t k = prefix.size(); k < j.prompt.size(); ++k) j.prompt[k] = token(gen);
    if (cfg.dataset == "multi-turn") j.turn = int(i % size_t(cfg.num_turns));
    j.output_len = length(cfg.output_len);
    // Every 1/fraction-th request, spread evenly (the same requests in every run).
    j.logprobs = cfg.logprobs >= 0 && std::floor(double(i + 1) * cfg.logprobs_fraction) > std::floor(double(i) * cfg.logprobs_fraction);
    if (cfg.request_rate > 0) {
      t += -std::log(1 - unit(gen)) / cfg.request_rate;
      j.arrival = t;
    }
  }
  return jobs;
}

// Runs the jobs with `workers` clients (each sends its next job once it has arrived) and prints
// the result table; returns the failed requests.
int run_level(const BenchConfig& cfg, const std::string& model, const std::vector<Job>& jobs, int workers,
              const std::string& level_line) {
  std::vector<Result> results(jobs.size());
  std::atomic<size_t> next{0};
  std::atomic<int> finished{0};
  std::mutex pm;
  const SpecCounters spec0 = scrape_spec(cfg);
  const auto t0 = BClock::now();
  std::vector<std::thread> threads;
  auto run = [&](httplib::Client& cli, size_t i, std::vector<int>* conversation) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<BClock::duration>(
                                           std::chrono::duration<double>(jobs[i].arrival)));
    Job job = jobs[i];
    if (conversation) {  // the conversation so far, then this turn's message
      conversation->insert(conversation->end(), job.prompt.begin(), job.prompt.end());
      job.prompt = *conversation;
    }
    results[i] = one_request(cli, cfg, model, job);
    if (conversation)
      conversation->insert(conversation->end(), results[i].output_ids.begin(), results[i].output_ids.end());
    int d = ++finished;
    if (cfg.progress) {
      std::lock_guard<std::mutex> l(pm);
      progress(d, int(jobs.size()));
    }
  };
  const bool multi_turn = cfg.dataset == "multi-turn";
  ConversationQueue conversations(multi_turn ? jobs.size() : 0, size_t(cfg.num_turns),
                                  size_t(cfg.max_active_conversations > 0 ? cfg.max_active_conversations : workers));
  for (int w = 0; w < std::min<int>(workers, int(jobs.size())); ++w)
    threads.emplace_back([&] {
      httplib::Client cli(cfg.url);
      cli.set_read_timeout(600);
      cli.set_write_timeout(60);
      cli.set_connection_timeout(30);
      if (!multi_turn) {
        for (size_t i; (i = next.fetch_add(1)) < jobs.size();) run(cli, i, nullptr);
        return;
      }
      for (ConversationQueue::Turn t; conversations.next(t);) {
        run(cli, t.job, t.history);
        conversations.done(t);
      }
    });
  for (auto& t : threads) t.join();
  const double dur = sec(BClock::now() - t0);
  if (cfg.progress) std::fprintf(stderr, "\n");
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t in_tok = 0, out_tok = 0;
  int ok = 0, good = 0;
  std::string first_error;
  for (const auto& r : results) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    in_tok += r.prompt_len;
    out_tok += r.output_tokens;
    ttft.push_back(r.ttft * 1e3);
    e2e.push_back(r.e2e * 1e3);
    const double tp = r.output_tokens > 1 ? (r.e2e - r.ttft) * 1e3 / (r.output_tokens - 1) : 0;
    if (r.output_tokens > 1) tpot.push_back(tp);
    for (double x : r.itl) itl.push_back(x * 1e3);
    good += (cfg.slo_ttft_ms <= 0 || r.ttft * 1e3 <= cfg.slo_ttft_ms) && (cfg.slo_tpot_ms <= 0 || tp <= cfg.slo_tpot_ms) &&
            (cfg.slo_e2el_ms <= 0 || r.e2e * 1e3 <= cfg.slo_e2el_ms);
  }
  auto line = [](const std::string& k, const std::string& v) { std::printf("%-40s %s\n", k.c_str(), v.c_str()); };
  auto f2 = [](double v) { char b[32]; std::snprintf(b, sizeof b, "%.2f", v); return std::string(b); };
  auto pname = [](double p) { char b[32]; std::snprintf(b, sizeof b, "P%g", p); return std::string(b); };
  std::printf("============ Serving Benchmark Result ============\n");
  line("Successful requests:", std::to_string(ok));
  line("Failed requests:", std::to_string(results.size() - size_t(ok)));
  std::printf("%s", level_line.c_str());
  line("Benchmark duration (s):", f2(dur));
  line("Total input tokens:", std::to_string(in_tok));
  line("Total generated tokens:", std::to_string(out_tok));
  line("Request throughput (req/s):", f2(ok / dur));
  if (cfg.slo_ttft_ms > 0 || cfg.slo_tpot_ms > 0 || cfg.slo_e2el_ms > 0) line("Request goodput (req/s):", f2(good / dur));
  line("Output token throughput (tok/s):", f2(out_tok / dur));
  line("Total Token throughput (tok/s):", f2((in_tok + out_tok) / dur));
  auto block = [&](const char* title, const char* key, const std::vector<double>& v) {
    std::printf("%s\n", title);
    line(std::string("Mean ") + key + " (ms):", f2(mean(v)));
    line(std::string("Median ") + key + " (ms):", f2(percentile(v, 50)));
    for (double p : cfg.percentiles)
      if (p != 50) line(pname(p) + " " + key + " (ms):", f2(percentile(v, p)));
  };
  block("---------------Time to First Token----------------", "TTFT", ttft);
  block("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot);
  block("---------------Inter-token Latency----------------", "ITL", itl);
  block("----------------End-to-end Latency----------------", "E2EL", e2e);
  if (cfg.dataset == "multi-turn") {  // does TTFT grow with the conversation?
    std::printf("-----------Time to First Token by Turn------------\n");
    for (int turn = 0; turn < cfg.num_turns; ++turn) {
      std::vector<double> v;
      for (size_t i = 0; i < results.size(); ++i)
        if (results[i].ok && jobs[i].turn == turn) v.push_back(results[i].ttft * 1e3);
      line("Median TTFT turn " + std::to_string(turn + 1) + " (ms):", f2(percentile(v, 50)));
    }
  }
  const SpecCounters spec1 = scrape_spec(cfg);
  if (const double queries = spec1.prefix_queries - spec0.prefix_queries; queries > 0) {  // this level's
    std::printf("-------------------Prefix Cache-------------------\n");
    line("Prefix cache hit rate (%, prompt tokens):", f2(100 * (spec1.prefix_hits - spec0.prefix_hits) / queries));
    if (spec1.host_hits >= 0) {  // the hits by tier
      const double host = spec1.host_hits - std::max(0.0, spec0.host_hits);
      line("  from the device (%):", f2(100 * (spec1.prefix_hits - spec0.prefix_hits - host) / queries));
      line("  from the host tier (%):", f2(100 * host / queries));
    }
  }
  if (spec1.found) {  // this level's share of the counters
    const double rounds = spec1.drafts - spec0.drafts, drafted = spec1.draft_tokens - spec0.draft_tokens;
    const double accepted = spec1.accepted - spec0.accepted;
    std::printf("---------------Speculative Decoding---------------\n");
    line("Acceptance rate (%):", f2(drafted > 0 ? 100 * accepted / drafted : 0));
    line("Acceptance length:", f2(rounds > 0 ? 1 + accepted / rounds : 0));
    line("Drafts:", std::to_string(int64_t(rounds)));
    line("Draft tokens:", std::to_string(int64_t(drafted)));
    line("Accepted tokens:", std::to_string(int64_t(accepted)));
    std::string per_pos;
    for (size_t i = 0; i < spec1.accepted_at.size(); ++i) {
      const double before = i < spec0.accepted_at.size() ? spec0.accepted_at[i] : 0;
      per_pos += (i ? " " : "") + f2(rounds > 0 ? 100 * (spec1.accepted_at[i] - before) / rounds : 0);
    }
    line("Per-position acceptance (%):", per_pos);
  }
  std::printf("==================================================\n");
  if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  std::fflush(stdout);
  return int(results.size()) - ok;
}

}  // namespace

int run_bench_serve(const BenchConfig& cfg) {
  FATHOM_CHECK(cfg.num_prompts > 0 && cfg.input_len >= 0 && cfg.output_len > 0,
               "--num-prompts and --output-len must be positive, --input-len not negative");
  FATHOM_CHECK(cfg.vocab_size > 16, "--vocab-size must be > 16");
  FATHOM_CHECK(cfg.range_ratio >= 0 && cfg.range_ratio < 1, "--random-range-ratio must be in [0, 1)");
  FATHOM_CHECK(cfg.logprobs <= 20, "--logprobs must be at most 20");
  FATHOM_CHECK(cfg.logprobs_fraction >= 0 && cfg.logprobs_fraction <= 1, "--logprobs-fraction must be in [0, 1]");
  FATHOM_CHECK(cfg.dataset == "random" || cfg.dataset == "prefix-repeat" || cfg.dataset == "multi-turn",
               "--dataset-name must be random, prefix-repeat or multi-turn");
  FATHOM_CHECK(cfg.dataset != "prefix-repeat" || cfg.prefix_len > 0, "--dataset-name prefix-repeat needs --prefix-len > 0");
  FATHOM_CHECK(cfg.input_len > 0 || cfg.dataset == "prefix-repeat",
               "--input-len must be positive (0 only with --dataset-name prefix-repeat: exact repeats)");
  FATHOM_CHECK(cfg.num_turns >= 1, "--num-turns must be at least 1");
  const std::string model = cfg.model.empty() ? first_model(cfg) : cfg.model;
  const std::vector<Job> jobs = make_jobs(cfg);
  auto pad = [](const std::string& k, const std::string& v) {
    char b[128];
    std::snprintf(b, sizeof b, "%-40s %s\n", k.c_str(), v.c_str());
    return std::string(b);
  };
  if (cfg.request_rate > 0) {
    const int workers = cfg.max_concurrency > 0 ? cfg.max_concurrency : cfg.num_prompts;
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.2f", cfg.request_rate);
    return run_level(cfg, model, jobs, workers,
                     pad("Request rate configured (RPS):", rate) +
                         pad("Maximum request concurrency:", cfg.max_concurrency > 0 ? std::to_string(cfg.max_concurrency) : "none"))
               ? 1 : 0;
  }
  int failures = 0;
  for (int conc : cfg.concurrency) {
    FATHOM_CHECK(conc > 0, "--concurrency values must be positive");
    failures += run_level(cfg, model, jobs, conc, pad("Maximum request concurrency:", std::to_string(conc)));
  }
  return failures ? 1 : 0;
}

}  // namespace fathom::server
