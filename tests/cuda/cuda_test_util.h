// Helpers of the CUDA kernel tests: bf16 conversions on the host, reading a bf16 device buffer
// back, NaN-filled outputs, and comparing a bf16 result with a reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom::testing {

// Whether a CUDA device is present (tests that can run without one skip, saying so).
inline bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

inline cuda::bf16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return cuda::bf16_t(u >> 16);
}

inline float from_bf16(cuda::bf16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::vector<cuda::bf16_t> download(const cuda::DeviceBuffer& b) {
  std::vector<cuda::bf16_t> v(b.bytes() / sizeof(cuda::bf16_t));
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// Outputs start as NaN (all bits set), so a row the kernel never writes fails the comparison.
inline cuda::DeviceBuffer nan_output(size_t elems) {
  cuda::DeviceBuffer b(elems * sizeof(cuda::bf16_t));
  FATHOM_CUDA_CHECK(cudaMemset(b.data(), 0xFF, b.bytes()));
  return b;
}

// Compares a kernel's output against the reference: no NaN/Inf (in either), largest |got - ref|
// over the largest |ref| below `tolerance`. Prints the errors under the label `what`.
inline void expect_close(const std::vector<cuda::bf16_t>& got, const std::vector<cuda::bf16_t>& ref, const char* what,
                         double tolerance) {
  ASSERT_EQ(got.size(), ref.size());
  double max_ref = 0, max_diff = 0;
  size_t bad = 0, bad_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float r = from_bf16(ref[i]), g = from_bf16(got[i]);
    bad_ref += !std::isfinite(r);
    if (!std::isfinite(g)) {
      ++bad;
      continue;
    }
    max_ref = std::max(max_ref, double(std::fabs(r)));
    max_diff = std::max(max_diff, double(std::fabs(g - r)));
  }
  const double rel = max_ref > 0 ? max_diff / max_ref : 1.0;
  std::printf("  %s: max |diff| %.3e, max |ref| %.3e, relative %.3e, non-finite %zu\n", what, max_diff, max_ref, rel,
              bad);
  EXPECT_EQ(bad_ref, 0u) << what << ": the reference itself is not finite";
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_LT(rel, tolerance) << what;
}

}  // namespace fathom::testing
