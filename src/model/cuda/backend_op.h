// One heavy op as the backend tuner sees it (issue 19): its candidate implementations, the shape
// buckets it is chosen per, the check that verifies and times one candidate on the GPU in use
// (run in a child process: core/backend_selection.h), and how a choice is applied. Each family
// of ops builds its own (backend_check_*.cpp); backend_tuning.cpp runs them all.
#pragma once
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend_selection.h"
#include "io/model_config.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/kernel_plan.h"

namespace fathom::cuda {

struct TunableOp {
  std::string op;                       // "attention.decode", ...
  std::vector<std::string> candidates;  // "tensor-core", "cuda-core", ...
  std::vector<int> buckets;             // step sizes (tokens or rows) it is chosen per
  // Decode-side ops whose buckets must give a token the same bits (speculative verify steps
  // against plain decode): one bit class serves all buckets (select_backends_consistent).
  bool consistent = false;
  // Bit consistency across sizes matters only to speculative decoding (verify steps against the
  // plain decode steps they stand for): without it, ops that apply a choice per bucket take the
  // fastest candidate at each (TuneOptions::speculative).
  bool per_bucket_without_speculation = false;
  // With `consistent`: weigh the buckets per token (select_backends_consistent's per_token), so
  // that a candidate fast only at the largest size does not win over the sizes served most.
  bool consistent_per_token = false;
  std::function<std::string(int bucket)> fixed;  // the fixed rule's candidate
  std::string shapes;                   // the model shapes checked at (part of the cache key)
  // Child side: the candidate's checks at every bucket (BackendCheck::candidate is filled in by
  // the tuner). A check that cannot run here says so in `failure` ("unsupported: ...").
  std::function<std::vector<BackendCheck>(const std::string& candidate)> check;
  // Parent side: the choices into the kernel plan (every bucket has a candidate).
  std::function<void(const std::vector<BackendChoice>&, KernelPlan&)> apply;
  std::function<std::string(const std::string& candidate)> describe;  // a longer name (may be empty)
};

// The families (each empty when the model has no such op).
std::vector<TunableOp> moe_fp4_ops(const ModelConfig& cfg, bool nvfp4_experts);
// `fp8`: the model has FP8 (E4M3) dense linears (adds gemm.fp8).
std::vector<TunableOp> dense_gemm_ops(const ModelConfig& cfg, bool nvfp4, bool fp8 = false);
std::vector<TunableOp> attention_ops(const ModelConfig& cfg);
std::vector<TunableOp> gdn_ops(const ModelConfig& cfg);
std::vector<TunableOp> sampling_ops(const ModelConfig& cfg);

// Helpers of the checks.
// A hash of an output's bits (candidates with equal ones give a token the same bits).
std::string bits_fingerprint(const void* data, size_t bytes);
// max |got - ref| / max |ref| over n values.
double relative_error(const float* got, const double* ref, size_t n);
// The checks of one candidate at every bucket: `failure` (empty: passed, then `time(bucket)`
// gives its median ms), the error and bound, the fingerprint. A `time` that throws OutOfBounds
// fails that bucket with the message.
std::vector<BackendCheck> checks_at(const std::vector<int>& buckets, const std::string& failure, double max_error,
                                    double bound, const std::string& fingerprint,
                                    const std::function<double(int bucket)>& time);
// "" when fine, else "NaN/Inf in the output" or "max error E of a row's largest value > bound B".
std::string error_failure(const float* got, size_t n, double max_error, double bound);

// The guard check after a candidate ran (kernels/cuda/guarded_buffer.h), before its values are
// compared: "" when no buffer of `buffers` was written outside, else "out-of-bounds write: <op>
// candidate <candidate> at <step> wrote 64 bytes past the end of output 'y' (first at +0)". Every
// set is checked (and its changed guards armed again), the first violation reported.
std::string bounds_failure(const std::string& op, const std::string& candidate, const std::string& step,
                           std::initializer_list<GuardedBuffers*> buffers);
// Thrown by a timing callback whose runs (at shapes the value check did not run) wrote outside
// their buffers: checks_at fails that bucket with what().
struct OutOfBounds : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A timing callback's body: the median ms of `reps` launches, then the guards of `buffers`
// (OutOfBounds naming "<step> (timed)" when the launches wrote outside them).
double timed_within_bounds(const std::function<void()>& launch, int reps, GuardedBuffers& buffers,
                           const std::string& op, const std::string& candidate, const std::string& step);
// "1 token", "8 tokens": a step's size in a message.
std::string count_of(int n, const std::string& unit);

}  // namespace fathom::cuda
