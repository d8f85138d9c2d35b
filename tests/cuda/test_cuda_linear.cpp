// linear() on NVFP4 weights at every step size 1..40 (the GEMV up to 16 tokens, dequantize then
// cuBLASLt past it) and widths that are multiples of 16 but not of 32, against a host reference;
// and its buffer checks: an output or a dequantization scratch too small for the launch is
// refused before anything is written. And a bf16 product captured into a graph by a thread that
// has not used cuBLASLt before (gemm_prepare).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

struct Fp4Matrix {
  int n = 0, k = 0;
  std::vector<uint8_t> codes, scales;
  float global = 0.f;
  std::vector<double> dequantized;  // [n, k]
};

Fp4Matrix random_fp4(int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp4Matrix m;
  m.n = n, m.k = k;
  m.codes.resize(size_t(n) * k / 2);
  m.scales.resize(size_t(n) * k / 16);
  for (auto& c : m.codes) c = uint8_t(rng());
  for (auto& s : m.scales) s = uint8_t(0x30 + rng() % 16);  // E4M3 around 1
  m.global = 1.f / (3.f * std::sqrt(float(k)));
  m.dequantized.resize(size_t(n) * k);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < k; ++c) {
      const uint8_t byte = m.codes[(size_t(r) * k + c) / 2];
      const uint8_t code = c % 2 == 0 ? byte & 0xf : byte >> 4;
      m.dequantized[size_t(r) * k + c] = double(fp4_e2m1_to_f32(code)) *
                                         double(fp8_e4m3_to_f32(m.scales[size_t(r) * (k / 16) + c / 16])) * m.global;
    }
  return m;
}

TEST(CudaLinear, Nvfp4AtEveryStepSizeMatchesReference) {
  struct Shape {
    int n, k;
  };
  for (const Shape sh : {Shape{96, 48}, Shape{37, 96}, Shape{512, 80}, Shape{48, 64}}) {
    const Fp4Matrix m = random_fp4(sh.n, sh.k, uint32_t(sh.n * 131 + sh.k));
    auto codes = cuda::DeviceBuffer::from_host(m.codes);
    auto scales = cuda::DeviceBuffer::from_host(m.scales);
    cuda::DeviceLinear w;
    w.out = sh.n, w.in = sh.k;
    w.fp4 = codes.as<uint8_t>();
    w.fp4_scale = scales.as<uint8_t>();
    w.fp4_global = m.global;
    constexpr int kMaxT = 40;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> xb(size_t(kMaxT) * sh.k);
    for (auto& v : xb) v = to_bf16(nd(rng));
    auto x = cuda::DeviceBuffer::from_host(xb);
    cuda::DeviceBuffer y(size_t(kMaxT) * sh.n * 4), scratch(size_t(sh.n) * sh.k * 2);
    for (int T = 1; T <= kMaxT; ++T) {
      FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xff, y.bytes()));  // NaN: every output must be written
      cuda::linear(w, x.as<cuda::bf16_t>(), y.array<float>(), T, scratch.array<cuda::bf16_t>(), nullptr, cuda::KernelPlan{});
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> got(size_t(T) * sh.n);
      FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), y.data(), got.size() * 4, cudaMemcpyDeviceToHost));
      double worst = 0, scale = 0;
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < sh.n; ++r) {
          double ref = 0;
          for (int c = 0; c < sh.k; ++c)
            ref += m.dequantized[size_t(r) * sh.k + c] * double(from_bf16(xb[size_t(t) * sh.k + c]));
          const double g = got[size_t(t) * sh.n + r];
          worst = std::max(worst, std::isfinite(g) ? std::fabs(g - ref) : 1e30);
          scale = std::max(scale, std::fabs(ref));
        }
      // Past 16 tokens the weights are rounded to bf16 (2^-9 relative) before the product.
      EXPECT_LT(worst / scale, T <= 16 ? 1e-5 : 1e-2) << "N=" << sh.n << " K=" << sh.k << " T=" << T;
    }
  }
}

TEST(CudaLinear, RefusesLaunchesThatDoNotFitTheirBuffers) {
  const Fp4Matrix m = random_fp4(64, 96, 3);
  auto codes = cuda::DeviceBuffer::from_host(m.codes);
  auto scales = cuda::DeviceBuffer::from_host(m.scales);
  cuda::DeviceLinear w;
  w.out = 64, w.in = 96;
  w.fp4 = codes.as<uint8_t>();
  w.fp4_scale = scales.as<uint8_t>();
  w.fp4_global = m.global;
  cuda::DeviceBuffer x(size_t(33) * 96 * 2), y(size_t(33) * 64 * 4);
  FATHOM_CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  // The dequantization scratch one element short of the weights ([64, 96]): refused at 33 tokens.
  cuda::DeviceBuffer small_scratch(size_t(64 * 96 - 1) * 2);
  EXPECT_THROW(cuda::linear(w, x.as<cuda::bf16_t>(), y.array<float>(), 33, small_scratch.array<cuda::bf16_t>(), nullptr, cuda::KernelPlan{}),
               Error);
  // The output one row short.
  cuda::DeviceBuffer scratch(size_t(64) * 96 * 2);
  const cuda::DeviceArray<float> short_y{y.as<float>(), 32 * 64};
  EXPECT_THROW(cuda::linear(w, x.as<cuda::bf16_t>(), short_y, 33, scratch.array<cuda::bf16_t>(), nullptr, cuda::KernelPlan{}), Error);
  // At GEMV sizes (16 tokens) no scratch is needed, and 16 rows fit.
  EXPECT_NO_THROW(cuda::linear(w, x.as<cuda::bf16_t>(), short_y, 16, cuda::DeviceArray<cuda::bf16_t>{}, nullptr, cuda::KernelPlan{}));
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
}

// A thread's cuBLASLt context is made on its first product; made inside a stream capture it would
// allocate there and invalidate the capture (a decode graph whose bucket first reaches cuBLASLt,
// stop 73). gemm_prepare() before the capture: the captured product runs and is right.
TEST(CudaLinear, CublasLtProductCapturedByAFreshThread) {
  const int T = 64, N = 96, K = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<cuda::bf16_t> x(size_t(T) * K), w(size_t(N) * K);
  for (auto& v : x) v = to_bf16(normal(rng));
  for (auto& v : w) v = to_bf16(normal(rng));
  const cuda::DeviceBuffer dx = cuda::DeviceBuffer::from_host(x), dw = cuda::DeviceBuffer::from_host(w);
  cuda::DeviceBuffer dy(size_t(T) * N * sizeof(float));
  std::string failure;
  std::thread([&] {
    try {
      cudaStream_t s;
      FATHOM_CUDA_CHECK(cudaStreamCreate(&s));
      cuda::gemm_prepare();
      cudaGraph_t g;
      FATHOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      cuda::gemm_bf16(dx.as<cuda::bf16_t>(), dw.as<cuda::bf16_t>(), dy.as<float>(), T, N, K, s);  // cuBLASLt at 64
      FATHOM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t exec;
      FATHOM_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      FATHOM_CUDA_CHECK(cudaGraphLaunch(exec, s));
      FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
      cudaStreamDestroy(s);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }).join();
  ASSERT_EQ(failure, "");
  std::vector<float> y(size_t(T) * N);
  FATHOM_CUDA_CHECK(cudaMemcpy(y.data(), dy.data(), y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += double(from_bf16(x[size_t(t) * K + k])) * from_bf16(w[size_t(n) * K + k]);
      worst = std::max(worst, std::abs(ref - y[size_t(t) * N + n]));
    }
  EXPECT_LT(worst, 1e-3) << "the captured product";
}

}  // namespace
}  // namespace fathom
