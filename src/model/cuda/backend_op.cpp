#include "model/cuda/backend_op.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/kernel_timer.h"

namespace fathom::cuda {

static_assert(kOobFaultBytes <= GuardedBuffer::kGuardBytes, "an oob fault must land inside the guard it hits");

std::string bits_fingerprint(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

double relative_error(const float* got, const double* ref, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

std::string error_failure(const float* got, size_t n, double max_error, double bound) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(got[i])) return "NaN/Inf in the output";
  if (!(max_error <= bound)) {  // NaN errors fail too
    char buf[112];
    std::snprintf(buf, sizeof buf, "max error %.3g of a row's largest value > bound %.0e", max_error, bound);
    return buf;
  }
  return "";
}

std::vector<BackendCheck> checks_at(const std::vector<int>& buckets, const std::string& failure, double max_error,
                                    double bound, const std::string& fingerprint,
                                    const std::function<double(int bucket)>& time) {
  std::vector<BackendCheck> out;
  for (int bucket : buckets) {
    BackendCheck c;
    c.bucket = bucket;
    c.failure = failure;
    c.passed = failure.empty();
    c.max_error = max_error;
    c.bound = bound;
    c.fingerprint = fingerprint;
    if (c.passed && time) {
      try {
        c.ms = time(bucket);
      } catch (const OutOfBounds& e) {
        c.passed = false;
        c.failure = e.what();
      }
    }
    out.push_back(c);
  }
  return out;
}

std::string bounds_failure(const std::string& op, const std::string& candidate, const std::string& step,
                           std::initializer_list<GuardedBuffers*> buffers) {
  std::string first;
  for (GuardedBuffers* b : buffers) {
    const std::string v = b->check();
    if (first.empty()) first = v;
  }
  return first.empty() ? "" : "out-of-bounds write: " + op + " candidate " + candidate + " at " + step + " " + first;
}

double timed_within_bounds(const std::function<void()>& launch, int reps, GuardedBuffers& buffers,
                           const std::string& op, const std::string& candidate, const std::string& step) {
  const double ms = median_launch_ms(launch, reps);
  const std::string outside = bounds_failure(op, candidate, step + " (timed)", {&buffers});
  if (!outside.empty()) throw OutOfBounds(outside);
  return ms;
}

std::string count_of(int n, const std::string& unit) {
  return std::to_string(n) + " " + unit + (n == 1 ? "" : "s");
}

}  // namespace fathom::cuda
