#include "core/backend_selection.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "core/error.h"
#include "core/isolated_run.h"

namespace fathom {

namespace {

// A check as one line for the pipe: bucket, passed, numbers, fingerprint, then the failure text.
std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n') c = ' ';
  return s;
}

}  // namespace

std::string serialize_checks(const std::vector<BackendCheck>& checks) {
  std::string text;
  char buf[160];
  for (const BackendCheck& c : checks) {
    std::snprintf(buf, sizeof buf, "%s\t%d\t%d\t%.9g\t%.9g\t%.9g\t", clean(c.candidate).c_str(), c.bucket,
                  c.passed ? 1 : 0, c.max_error, c.bound, c.ms);
    text += buf + clean(c.fingerprint) + "\t" + clean(c.failure) + "\n";
  }
  return text;
}

std::vector<BackendCheck> parse_checks(const std::string& text) {
  std::vector<BackendCheck> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    std::vector<std::string> f;  // candidate, bucket, passed, max error, bound, ms, fingerprint, failure
    for (size_t p = 0;;) {
      const size_t tab = line.find('\t', p);
      f.push_back(line.substr(p, tab == std::string::npos ? std::string::npos : tab - p));
      if (tab == std::string::npos || f.size() == 8) break;
      p = tab + 1;
    }
    if (f.size() < 8) continue;
    BackendCheck c;
    c.candidate = f[0];
    c.bucket = std::atoi(f[1].c_str());
    c.passed = f[2] == "1";
    c.max_error = std::atof(f[3].c_str());
    c.bound = std::atof(f[4].c_str());
    c.ms = std::atof(f[5].c_str());
    c.fingerprint = f[6];
    c.failure = f[7];
    out.push_back(c);
  }
  return out;
}

std::vector<BackendCheck> verify_isolated(
    const std::vector<std::string>& candidates, const std::vector<int>& buckets,
    const std::function<std::vector<BackendCheck>(const std::string& candidate)>& check, double timeout_s) {
  // Every bucket of every candidate gets a check: those a child did not report fail with `why`.
  auto complete = [&](std::vector<BackendCheck> got, const std::vector<std::string>& cands, const std::string& why) {
    for (const std::string& cand : cands)
      for (int bucket : buckets) {
        if (std::any_of(got.begin(), got.end(),
                        [&](const BackendCheck& c) { return c.candidate == cand && c.bucket == bucket; }))
          continue;
        BackendCheck c;
        c.candidate = cand;
        c.bucket = bucket;
        c.failure = why;
        got.push_back(c);
      }
    return got;
  };
  // Candidates share a child (setup shared, one context). One that throws (a CUDA error may have
  // poisoned the context) ends that child: it fails, and the candidates after it go on in a new
  // child. A child that crashes or hangs leaves the rest to a child each.
  std::vector<BackendCheck> shared;
  std::vector<std::string> remaining = candidates;
  while (!remaining.empty()) {
    const IsolatedResult r = run_isolated(
        [&] {
          std::string text;
          for (const std::string& cand : remaining) {
            std::vector<BackendCheck> checks;
            try {
              checks = check(cand);
            } catch (const std::exception& e) {
              return text + "!" + clean(cand) + "\t" + clean(e.what()) + "\n";
            }
            for (BackendCheck& c : checks) c.candidate = cand;
            text += serialize_checks(checks);
          }
          return text;
        },
        timeout_s * double(remaining.size()));
    if (!r.ok()) break;
    std::vector<BackendCheck> got = parse_checks(r.output);
    std::vector<std::string> done;
    for (const BackendCheck& c : got)
      if (std::find(done.begin(), done.end(), c.candidate) == done.end()) done.push_back(c.candidate);
    // The last line, when it starts with '!', names the candidate that threw.
    const size_t last = r.output.size() > 1 ? r.output.rfind('\n', r.output.size() - 2) : std::string::npos;
    const size_t bang = last == std::string::npos ? 0 : last + 1;
    if (bang < r.output.size() && r.output[bang] == '!') {
      const size_t tab = r.output.find('\t', bang);
      const std::string cand = r.output.substr(bang + 1, tab - bang - 1);
      const std::string msg = tab == std::string::npos ? "" : r.output.substr(tab + 1, r.output.find('\n', tab) - tab - 1);
      got = complete(std::move(got), {cand}, "failed: " + msg);
      done.push_back(cand);
    }
    shared.insert(shared.end(), got.begin(), got.end());
    std::erase_if(remaining, [&](const std::string& c) { return std::find(done.begin(), done.end(), c) != done.end(); });
    if (done.empty()) break;  // no progress: isolate
  }
  if (remaining.empty()) return complete(std::move(shared), candidates, "no report for this bucket");
  std::vector<BackendCheck> out = std::move(shared);
  for (const std::string& cand : remaining) {
    const IsolatedResult r = run_isolated(
        [&] {
          std::vector<BackendCheck> checks = check(cand);
          for (BackendCheck& c : checks) c.candidate = cand;
          return serialize_checks(checks);
        },
        timeout_s);
    std::vector<BackendCheck> got = r.ok() ? parse_checks(r.output) : std::vector<BackendCheck>{};
    got = complete(std::move(got), {cand}, r.ok() ? "no report for this bucket" : r.describe());
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

BackendPolicy parse_backend_policy(const std::string& s) {
  if (s == "verified-fastest") return BackendPolicy::VerifiedFastest;
  if (s == "fixed") return BackendPolicy::Fixed;
  fail("--backend-policy must be verified-fastest or fixed, got '", s, "'");
}

std::vector<BackendChoice> select_backends(const std::string& op, const std::vector<BackendCheck>& checks,
                                           BackendPolicy policy, const std::string& pinned,
                                           const std::function<std::string(int bucket)>& fixed) {
  std::map<int, std::vector<const BackendCheck*>> by_bucket;
  for (const BackendCheck& c : checks) by_bucket[c.bucket].push_back(&c);
  std::vector<BackendChoice> out;
  for (const auto& [bucket, cands] : by_bucket) {
    BackendChoice ch{op, bucket, "", ""};
    std::vector<const BackendCheck*> passed;
    for (const BackendCheck* c : cands)
      if (c->passed) passed.push_back(c);
    if (!pinned.empty()) {
      auto it = std::find_if(cands.begin(), cands.end(), [&](const BackendCheck* c) { return c->candidate == pinned; });
      FATHOM_CHECK(it != cands.end(), op, ": no candidate '", pinned, "' at ", bucket, " tokens");
      FATHOM_CHECK((*it)->passed, op, ": the pinned candidate '", pinned, "' failed verification at ", bucket,
                   " tokens: ", (*it)->failure);
      ch.candidate = pinned;
      ch.why = "pinned";
    } else if (!passed.empty()) {
      const BackendCheck* fastest = *std::min_element(
          passed.begin(), passed.end(), [](const BackendCheck* a, const BackendCheck* b) { return a->ms < b->ms; });
      const std::string rule = fixed ? fixed(bucket) : "";
      auto ruled = std::find_if(passed.begin(), passed.end(), [&](const BackendCheck* c) { return c->candidate == rule; });
      char buf[96];
      if (policy == BackendPolicy::Fixed && ruled != passed.end()) {
        ch.candidate = rule;
        ch.why = "fixed rule";
      } else {
        ch.candidate = fastest->candidate;
        std::snprintf(buf, sizeof buf, "fastest of %zu verified (%.3f ms)", passed.size(), fastest->ms);
        ch.why = buf;
        if (policy == BackendPolicy::Fixed) ch.why += "; the fixed rule's '" + rule + "' did not pass";
      }
    } else {
      ch.why = "no candidate passed";
    }
    out.push_back(ch);
  }
  return out;
}

std::vector<BackendChoice> select_backends_consistent(const std::string& op, const std::vector<BackendCheck>& checks,
                                                      BackendPolicy policy, const std::string& pinned,
                                                      const std::function<std::string(int bucket)>& fixed,
                                                      bool per_token) {
  std::vector<int> buckets;
  for (const BackendCheck& c : checks)
    if (std::find(buckets.begin(), buckets.end(), c.bucket) == buckets.end()) buckets.push_back(c.bucket);
  std::sort(buckets.begin(), buckets.end());
  // Per fingerprint: the passing checks; a fingerprint serves only if it covers every bucket.
  std::map<std::string, std::vector<BackendCheck>> classes;
  for (const BackendCheck& c : checks)
    if (c.passed) classes[c.fingerprint].push_back(c);
  std::string best;
  double best_ms = 0;
  std::string rule_class;
  bool rule_ok = bool(fixed);
  for (const int b : buckets) {
    const std::string rule = fixed ? fixed(b) : "";
    auto it = std::find_if(checks.begin(), checks.end(),
                           [&](const BackendCheck& c) { return c.bucket == b && c.candidate == rule && c.passed; });
    if (it == checks.end()) rule_ok = false;
    else if (rule_class.empty()) rule_class = it->fingerprint;
    else if (rule_class != it->fingerprint) rule_ok = false;
  }
  for (const auto& [fp, cs] : classes) {
    double total = 0;
    bool covers = true;
    for (const int b : buckets) {
      double fastest = -1;
      for (const BackendCheck& c : cs)
        if (c.bucket == b && (fastest < 0 || c.ms < fastest)) fastest = c.ms;
      if (fastest < 0) covers = false;
      else total += per_token ? fastest / std::max(b, 1) : fastest;
    }
    if (!covers) continue;
    if (best.empty() || total < best_ms) best = fp, best_ms = total;
  }
  std::vector<BackendCheck> pool;
  std::string why;
  if (!pinned.empty()) {
    return select_backends(op, checks, policy, pinned, fixed);  // one candidate everywhere: consistent by itself
  } else if (policy == BackendPolicy::Fixed && rule_ok) {
    pool = classes[rule_class];
    why = "fixed rule";
  } else if (!best.empty()) {
    pool = classes[best];
    char buf[96];
    std::snprintf(buf, sizeof buf, per_token ? "fastest bit-consistent set of %zu verified (%.3g ms a token over the buckets)"
                                             : "fastest bit-consistent set of %zu verified (%.3f ms over the buckets)",
                  classes.size(), best_ms);
    why = buf;
  } else {
    // No bit class covers every bucket: each bucket still gets its fastest verified candidate
    // (correct, but a verify step may then round differently from a plain decode step).
    std::vector<BackendChoice> out = select_backends(op, checks, policy, "", fixed);
    for (BackendChoice& ch : out)
      if (!ch.candidate.empty()) ch.why += "; no bit-consistent set passed at every size";
    return out;
  }
  std::vector<BackendChoice> out;
  for (const int b : buckets) {
    BackendChoice ch{op, b, "", pool.empty() ? "no candidate passed at every bucket" : why};
    if (why == "fixed rule") {
      ch.candidate = fixed(b);
    } else {
      double fastest = -1;
      for (const BackendCheck& c : pool)
        if (c.bucket == b && (fastest < 0 || c.ms < fastest)) fastest = c.ms, ch.candidate = c.candidate;
    }
    out.push_back(ch);
  }
  return out;
}

BackendFault backend_fault_in(const std::string& spec, const std::string& op, const std::string& candidate) {
  size_t at = 0;
  while (at < spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string entry = spec.substr(at, comma - at);
    at = comma + 1;
    if (entry.empty()) continue;
    const size_t c1 = entry.find(':'), c2 = entry.rfind(':');
    FATHOM_CHECK(c1 != std::string::npos && c2 != c1, "FATHOM_BACKEND_FAULT: '", entry,
                 "' is not op:candidate:nan|wrong|crash|oob");
    const std::string kind = entry.substr(c2 + 1);
    BackendFault f = kind == "nan" ? BackendFault::Nan : kind == "wrong" ? BackendFault::Wrong
                   : kind == "crash" ? BackendFault::Crash : kind == "oob" ? BackendFault::Oob : BackendFault::None;
    FATHOM_CHECK(f != BackendFault::None, "FATHOM_BACKEND_FAULT: unknown fault '", kind,
                 "' (nan, wrong, crash or oob)");
    if (entry.substr(0, c1) == op && entry.substr(c1 + 1, c2 - c1 - 1) == candidate) return f;
  }
  return BackendFault::None;
}

BackendFault backend_fault(const std::string& op, const std::string& candidate) {
  const char* spec = std::getenv("FATHOM_BACKEND_FAULT");
  return spec ? backend_fault_in(spec, op, candidate) : BackendFault::None;
}

}  // namespace fathom
