// Verified backend selection on CPU stand-ins: three implementations of a dot product, checked in
// child processes against a double-precision reference with an error bound from fp32 rounding;
// faults injected into the preferred one (NaN, wrong values, a crash, a write past its output)
// get it rejected with the failed check named, and the selection falls to the next verified
// candidate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend_selection.h"

namespace fathom {
namespace {

// The canary after a result, as the GPU checks' guard zones (kernels/cuda/guarded_buffer.h).
constexpr float kCanary = -12345.f;

// y = sum x[i] * w[i] three ways into out[0]; out[1] is past the result (a guard the check
// compares); `spec` injects faults as FATHOM_BACKEND_FAULT would.
void dot(const std::string& cand, const std::vector<float>& x, const std::vector<float>& w, const std::string& spec,
         float* out) {
  float y = 0;
  if (cand == "simple") {
    for (size_t i = 0; i < x.size(); ++i) y += x[i] * w[i];
  } else if (cand == "pairwise") {
    std::vector<float> v(x.size());
    for (size_t i = 0; i < x.size(); ++i) v[i] = x[i] * w[i];
    for (size_t n = v.size(); n > 1; n = (n + 1) / 2) {
      for (size_t i = 0; i < n / 2; ++i) v[i] = v[2 * i] + v[2 * i + 1];
      if (n % 2) v[n / 2] = v[n - 1];
    }
    y = v.empty() ? 0.f : v[0];
  } else {  // "blocked": four partial sums
    float s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < x.size(); ++i) s[i % 4] += x[i] * w[i];
    y = (s[0] + s[1]) + (s[2] + s[3]);
  }
  out[0] = y;
  switch (backend_fault_in(spec, "dot", cand)) {
    case BackendFault::Nan: out[0] = std::numeric_limits<float>::quiet_NaN(); break;
    case BackendFault::Wrong: out[0] = y * 1.5f + 1.f; break;
    case BackendFault::Crash: std::abort();
    case BackendFault::Oob: out[1] = y; break;  // the result stays right
    case BackendFault::None: break;
  }
}

// A check as the engine's would be: random inputs of the bucket's size, NaN/Inf, then the error
// against the reference within n * eps * sum|x w| (fp32 accumulation), and a median time.
BackendCheck check_dot(const std::string& cand, int n, const std::string& spec) {
  std::mt19937 rng(1234 + n);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(n));
  for (auto& v : x) v = d(rng);
  for (auto& v : w) v = d(rng);
  double ref = 0, mag = 0;
  for (int i = 0; i < n; ++i) ref += double(x[size_t(i)]) * w[size_t(i)], mag += std::fabs(double(x[size_t(i)]) * w[size_t(i)]);
  BackendCheck c;
  c.candidate = cand;
  c.bucket = n;
  float out[2] = {0.f, kCanary};
  dot(cand, x, w, spec, out);
  const float y = out[0];
  c.bound = n * double(std::numeric_limits<float>::epsilon()) * mag;
  if (out[1] != kCanary) {  // before the values, as the GPU checks' guards
    c.failure = "out-of-bounds write: dot candidate " + cand + " wrote past the end of output 'y'";
    return c;
  }
  if (!std::isfinite(y)) {
    c.failure = "NaN/Inf in the output";
    return c;
  }
  c.max_error = std::fabs(double(y) - ref);
  if (c.max_error > c.bound) {
    c.failure = "max error " + std::to_string(c.max_error) + " > bound " + std::to_string(c.bound);
    return c;
  }
  c.passed = true;
  c.fingerprint = std::to_string(::getpid());  // here: which child ran it
  const auto t0 = std::chrono::steady_clock::now();
  volatile float sink = 0;
  for (int r = 0; r < 50; ++r) {
    dot(cand, x, w, spec, out);
    sink = sink + out[0];
  }
  c.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 50;
  if (cand == "simple") c.ms *= 10;  // make "simple" the slowest, so that faults hit the preferred one
  return c;
}

const std::vector<std::string> kCands = {"simple", "pairwise", "blocked"};

std::vector<BackendCheck> verify(const std::string& spec) {
  return verify_isolated(kCands, {64, 4096}, [&](const std::string& c) {
    return std::vector<BackendCheck>{check_dot(c, 64, spec), check_dot(c, 4096, spec)};
  }, 30);
}

const BackendCheck& find(const std::vector<BackendCheck>& v, const std::string& cand, int bucket) {
  for (const BackendCheck& c : v)
    if (c.candidate == cand && c.bucket == bucket) return c;
  throw std::runtime_error("no check of " + cand);
}

TEST(BackendSelection, AllPassWithoutFaultsAndTheFastestIsChosen) {
  const auto checks = verify("");
  ASSERT_EQ(checks.size(), 6u);
  for (const BackendCheck& c : checks) EXPECT_TRUE(c.passed) << c.candidate << " " << c.bucket << ": " << c.failure;
  for (const BackendCheck& c : checks) EXPECT_EQ(c.fingerprint, checks[0].fingerprint) << "one child for all";
  EXPECT_NE(checks[0].fingerprint, std::to_string(::getpid()));
  const auto choices = select_backends("dot", checks, BackendPolicy::VerifiedFastest, "", nullptr);
  ASSERT_EQ(choices.size(), 2u);
  for (const BackendChoice& ch : choices) {
    EXPECT_NE(ch.candidate, "simple") << ch.why;
    EXPECT_NE(ch.why.find("fastest of 3 verified"), std::string::npos) << ch.why;
  }
}

TEST(BackendSelection, EachInjectedFaultIsRejectedAndTheNextCandidateServes) {
  const auto clean = select_backends("dot", verify(""), BackendPolicy::VerifiedFastest, "", nullptr);
  for (const char* kind : {"nan", "wrong", "crash", "oob"}) {
    std::string spec;
    for (const BackendChoice& ch : clean) spec += "dot:" + ch.candidate + ":" + kind + ",";
    const auto checks = verify(spec);
    for (const BackendChoice& was : clean) {
      const BackendCheck& bad = find(checks, was.candidate, was.bucket);
      EXPECT_FALSE(bad.passed) << kind;
      const std::string k = kind;
      const std::string expect = k == "nan" ? "NaN/Inf" : k == "wrong" ? "max error" : k == "oob" ? "out-of-bounds" : "crashed";
      EXPECT_NE(bad.failure.find(expect), std::string::npos) << kind << ": " << bad.failure;
    }
    if (std::string(kind) == "crash") {  // the shared child died: each candidate then ran alone
      const auto& a = find(checks, "simple", 64);
      for (const BackendCheck& c : checks)
        if (c.passed && c.candidate != a.candidate) {
          EXPECT_NE(c.fingerprint, a.fingerprint);
        }
    }
    for (const BackendChoice& ch : select_backends("dot", checks, BackendPolicy::VerifiedFastest, "", nullptr)) {
      EXPECT_FALSE(ch.candidate.empty()) << ch.why;
      EXPECT_TRUE(find(checks, ch.candidate, ch.bucket).passed) << kind;
      for (const BackendChoice& was : clean)
        if (was.bucket == ch.bucket) {
          EXPECT_NE(ch.candidate, was.candidate) << kind;
        }
    }
  }
}

TEST(BackendSelection, PinnedAndFixedPolicies) {
  const auto checks = verify("dot:blocked:wrong");
  auto ch = select_backends("dot", checks, BackendPolicy::VerifiedFastest, "simple", nullptr);
  EXPECT_EQ(ch[0].candidate, "simple");
  EXPECT_EQ(ch[0].why, "pinned");
  try {
    select_backends("dot", checks, BackendPolicy::VerifiedFastest, "blocked", nullptr);
    ADD_FAILURE() << "a pinned candidate that failed was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("failed verification"), std::string::npos) << e.what();
  }
  ch = select_backends("dot", checks, BackendPolicy::Fixed, "", [](int) { return std::string("simple"); });
  EXPECT_EQ(ch[0].candidate, "simple");
  EXPECT_EQ(ch[0].why, "fixed rule");
  ch = select_backends("dot", checks, BackendPolicy::Fixed, "", [](int) { return std::string("blocked"); });
  EXPECT_NE(ch[0].candidate, "blocked");  // the fixed rule's choice failed: the fastest verified one
  EXPECT_NE(ch[0].why.find("did not pass"), std::string::npos) << ch[0].why;
}

// A candidate that throws (as a CUDA error would) fails with its message; the candidates after
// it go on in a fresh child, those before it keep their results.
TEST(BackendSelection, AThrowingCandidateFailsAloneWithItsMessage) {
  const auto checks = verify_isolated(kCands, {64}, [](const std::string& c) {
    if (c == "pairwise") throw std::runtime_error("an illegal memory access was encountered");
    return std::vector<BackendCheck>{check_dot(c, 64, "")};
  }, 30);
  ASSERT_EQ(checks.size(), 3u);
  const BackendCheck& bad = find(checks, "pairwise", 64);
  EXPECT_FALSE(bad.passed);
  EXPECT_EQ(bad.failure, "failed: an illegal memory access was encountered");
  EXPECT_TRUE(find(checks, "simple", 64).passed);
  EXPECT_TRUE(find(checks, "blocked", 64).passed);
  EXPECT_NE(find(checks, "simple", 64).fingerprint, find(checks, "blocked", 64).fingerprint);  // two children
}

// Ops whose step sizes must agree bit for bit: one fingerprint serves every bucket.
TEST(BackendSelection, ConsistentSelectionKeepsOneFingerprint) {
  auto check = [](const char* cand, int bucket, double ms, const char* fp, bool passed = true) {
    BackendCheck c;
    c.candidate = cand, c.bucket = bucket, c.ms = ms, c.fingerprint = fp, c.passed = passed;
    return c;
  };
  std::vector<BackendCheck> checks = {check("a", 1, 1.0, "x"), check("a", 8, 5.0, "x"), check("b", 1, 3.0, "x"),
                                      check("b", 8, 2.0, "x"), check("c", 1, 0.9, "y"), check("c", 8, 4.0, "y")};
  auto ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr);
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[0].candidate, "a");  // x: 1.0 + 2.0 beats y: 0.9 + 4.0, though c is fastest at 1
  EXPECT_EQ(ch[1].candidate, "b");
  checks[3].passed = false;  // b fails at 8: x costs 1.0 + 5.0 now, y wins both buckets
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr);
  EXPECT_EQ(ch[0].candidate, "c");
  EXPECT_EQ(ch[1].candidate, "c");
  // The fixed rule (a then b) keeps its choices while they pass; not once b has failed.
  checks[3].passed = true;
  auto rule = [](int bucket) { return std::string(bucket == 1 ? "a" : "b"); };
  ch = select_backends_consistent("op", checks, BackendPolicy::Fixed, "", rule);
  EXPECT_EQ(ch[0].candidate, "a");
  EXPECT_EQ(ch[1].candidate, "b");
  EXPECT_EQ(ch[0].why, "fixed rule");
  checks[3].passed = false;
  ch = select_backends_consistent("op", checks, BackendPolicy::Fixed, "", rule);
  EXPECT_EQ(ch[1].candidate, "c");
  // Per token: x costs 1.0 / 1 + 2.0 / 8 = 1.25, y 0.9 / 1 + 4.0 / 8 = 1.4 (x); with c at 0.5 at
  // bucket 1, y costs 1.0 and wins, though its sum of ms (4.5) is larger than x's (3.0).
  checks[3].passed = true;
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr, true);
  EXPECT_EQ(ch[0].candidate, "a");
  checks[4].ms = 0.5;
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr, false);
  EXPECT_EQ(ch[0].candidate, "a");  // by the sum of ms x still wins: 3.0 against 4.5
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr, true);
  EXPECT_EQ(ch[0].candidate, "c");
  EXPECT_EQ(ch[1].candidate, "c");
  checks[4].ms = 0.9;
  // No class covers both buckets (a passes at 1 only, c at 8 only): each bucket its own, said so.
  for (auto& c : checks) c.passed = false;
  checks[0].passed = checks[5].passed = true;
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr);
  EXPECT_EQ(ch[0].candidate, "a");
  EXPECT_EQ(ch[1].candidate, "c");
  EXPECT_NE(ch[1].why.find("no bit-consistent set"), std::string::npos);
  for (auto& c : checks) c.passed = false;
  ch = select_backends_consistent("op", checks, BackendPolicy::VerifiedFastest, "", nullptr);
  EXPECT_TRUE(ch[0].candidate.empty());
}

TEST(BackendSelection, FaultSpecsAndPolicyNames) {
  EXPECT_EQ(backend_fault_in("a:b:nan,c:d:crash", "c", "d"), BackendFault::Crash);
  EXPECT_EQ(backend_fault_in("a:b:nan", "a", "c"), BackendFault::None);
  EXPECT_EQ(backend_fault_in("a:b:nan,gemm.fp4:dequant-cublaslt:oob", "gemm.fp4", "dequant-cublaslt"), BackendFault::Oob);
  EXPECT_EQ(backend_fault_in("gemm.fp4:dequant-cublaslt:oob", "gemm.fp4", "gemv"), BackendFault::None);
  try {
    backend_fault_in("a:b:explode", "a", "b");
    ADD_FAILURE() << "an unknown fault kind was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("oob"), std::string::npos) << e.what();  // the kinds are listed
  }
  EXPECT_THROW(backend_fault_in("nonsense", "a", "b"), std::exception);
  EXPECT_EQ(parse_backend_policy("fixed"), BackendPolicy::Fixed);
  EXPECT_THROW(parse_backend_policy("fastest"), std::exception);
}

}  // namespace
}  // namespace fathom
