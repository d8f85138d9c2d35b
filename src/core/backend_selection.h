// The one selection point of a heavy op (issue 19): its candidate implementations are checked on
// the GPU in use against a trusted reference (NaN/Inf, and error within a bound derived from the
// precision) and timed per shape bucket; this picks, per bucket, what serves it and says why. A
// candidate that failed a check is never chosen. Also the fault-injection switch that tests use
// to make a chosen candidate misbehave (the engine must reject it and pick the next).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace fathom {

// One candidate checked (and timed) at one bucket (the largest step, in tokens, it stands for).
struct BackendCheck {
  std::string candidate;
  int bucket = 0;
  bool passed = false;
  std::string failure;  // which check failed: "NaN/Inf in the output", "max error 0.3 > bound 0.01", "crashed: ..."
  double max_error = 0, bound = 0;
  double ms = 0;        // median time when it passed (0: not timed)
  // The bits a candidate gives (a hash of its output rows for fixed inputs, the same for all its
  // buckets): candidates with equal fingerprints give a token the same bits, which ops whose
  // steps must agree bit for bit across sizes (decode and speculative verify) require.
  std::string fingerprint;
};

struct BackendChoice {
  std::string op;
  int bucket = 0;
  std::string candidate;  // empty: nothing passed (the op cannot run at that size)
  std::string why;        // "pinned", "fastest of 3 verified (0.41 ms)", "fixed rule", ...
};

// Runs check(candidate) (its checks at every bucket) for every candidate in child processes
// (core/isolated_run.h: call before this process initialises CUDA): first all in one child (a
// setup such as test data can then be shared, e.g. made on first use in a static); if that child
// crashes, throws or hangs, each candidate again in a child of its own, so that one that
// crashes, throws or hangs fails all its buckets, the failure named, and nothing else.
std::vector<BackendCheck> verify_isolated(
    const std::vector<std::string>& candidates, const std::vector<int>& buckets,
    const std::function<std::vector<BackendCheck>(const std::string& candidate)>& check, double timeout_s);

// The checks as text lines (what a child sends back), and back.
std::string serialize_checks(const std::vector<BackendCheck>& checks);
std::vector<BackendCheck> parse_checks(const std::string& text);

enum class BackendPolicy { VerifiedFastest, Fixed };
// "verified-fastest" or "fixed"; throws naming the value otherwise.
BackendPolicy parse_backend_policy(const std::string& s);

// Per bucket of `checks`: the pinned candidate if set (it must have passed there: else an error
// naming its failed check), else by policy among the passing ones: the fastest, or the fixed
// rule's candidate (`fixed(bucket)`) when it passed, else the fastest of the others.
std::vector<BackendChoice> select_backends(const std::string& op, const std::vector<BackendCheck>& checks,
                                           BackendPolicy policy, const std::string& pinned,
                                           const std::function<std::string(int bucket)>& fixed);

// As select_backends, for ops whose buckets must give a token the same bits (consistent): only
// candidates of one fingerprint serve the op, the fingerprint whose candidates (the fastest of
// them at each bucket) take the least time over all buckets; the fixed rule's fingerprint under
// BackendPolicy::Fixed when all its rule choices passed. When no fingerprint covers every bucket,
// each bucket gets what select_backends gives it (its why says the set is not bit-consistent).
// `per_token`: the time over the buckets is the sum of ms / bucket (every step size counts alike
// per token) instead of the sum of ms, which the largest bucket dominates.
std::vector<BackendChoice> select_backends_consistent(const std::string& op, const std::vector<BackendCheck>& checks,
                                                      BackendPolicy policy, const std::string& pinned,
                                                      const std::function<std::string(int bucket)>& fixed,
                                                      bool per_token = false);

// Fault injection (tests): FATHOM_BACKEND_FAULT="op:candidate:nan|wrong|crash|oob[,...]" makes
// that candidate's output NaN or wrong, abort the process, or write just past the end of its
// output (oob: the values stay right, so only the checks' guard zones see it), whenever it runs.
enum class BackendFault { None, Nan, Wrong, Crash, Oob };
BackendFault backend_fault(const std::string& op, const std::string& candidate);
// The same from a spec string (what the environment variable holds); throws on a bad entry.
BackendFault backend_fault_in(const std::string& spec, const std::string& op, const std::string& candidate);

}  // namespace fathom
