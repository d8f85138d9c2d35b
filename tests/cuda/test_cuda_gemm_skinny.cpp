// The skinny GEMM's two forms (kernels/cuda/gemm_skinny.cu on mma.sync, gemm_skinny_wgmma.cu on
// wgmma, where the GPU runs it) against a double-precision host reference, at
// shapes that fill its cluster, leave slices or row groups partial (N not a multiple of 128, K
// not of 64, K of one step), and at every token tile: each token's row has the same bits at
// every T (its order is fixed by N and K), rows past T are never written, gemm_bf16 takes it past
// the GEMV's sizes where the plan says so, and shapes outside its limits are declined with nothing
// launched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/gemm_skinny.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

std::vector<float> download_f32(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), n * 4, cudaMemcpyDeviceToHost));
  return v;
}

using SkinnyFn = bool (*)(const cuda::bf16_t*, const cuda::bf16_t*, float*, int, int, int, cudaStream_t);
struct Form {
  const char* name;  // the test's name suffix
  SkinnyFn run;
  cuda::DenseBatchKernel kernel;
};
const Form kForms[] = {{"mma_sync", cuda::gemm_skinny, cuda::DenseBatchKernel::Skinny},
                       {"wgmma", cuda::gemm_skinny_wgmma, cuda::DenseBatchKernel::SkinnyWgmma}};

struct Shape {
  int N, K;
};

// `form` at each shape against the double reference at 64 tokens, then at each T of `Ts`: the same
// bits as at 64, rows past T untouched, and the same through gemm_bf16 with the plan naming it.
void check_form(const Form& form, std::initializer_list<Shape> shapes, std::initializer_list<int> Ts) {
  const int T_max = cuda::kSkinnyMaxTokens;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const Shape sh : shapes) {
    const int N = sh.N, K = sh.K;
    std::vector<uint16_t> wb(size_t(N) * K), xb(size_t(T_max) * K);
    for (auto& v : wb) v = to_bf16(nd(rng));
    for (auto& v : xb) v = to_bf16(nd(rng));
    const auto w = cuda::DeviceBuffer::from_host(wb), x = cuda::DeviceBuffer::from_host(xb);
    cuda::DeviceBuffer y(size_t(T_max) * N * 4);
    ASSERT_TRUE(form.run(x.as<cuda::bf16_t>(), w.as<cuda::bf16_t>(), y.as<float>(), T_max, N, K, nullptr))
        << "N=" << N << " K=" << K;
    const std::vector<float> full = download_f32(y, size_t(T_max) * N);
    double worst = 0;
    for (int t = 0; t < T_max; ++t)
      for (int n = t % 7; n < N; n += 7) {
        double ref = 0;
        for (int k = 0; k < K; ++k)
          ref += double(from_bf16(wb[size_t(n) * K + k])) * double(from_bf16(xb[size_t(t) * K + k]));
        worst = std::max(worst, std::fabs(ref - double(full[size_t(t) * N + n])) / std::sqrt(double(K)));
      }
    EXPECT_LT(worst, 1e-4) << "N=" << N << " K=" << K;
    for (const int T : Ts) {
      FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
      ASSERT_TRUE(form.run(x.as<cuda::bf16_t>(), w.as<cuda::bf16_t>(), y.as<float>(), T, N, K, nullptr));
      const std::vector<float> got = download_f32(y, size_t(T_max) * N);
      ASSERT_EQ(std::memcmp(got.data(), full.data(), size_t(T) * N * 4), 0) << "N=" << N << " K=" << K << " T=" << T;
      const std::vector<unsigned char> untouched(size_t(T_max - T) * N * 4, 0xFF);
      ASSERT_EQ(std::memcmp(got.data() + size_t(T) * N, untouched.data(), untouched.size()), 0)
          << "rows past T written: N=" << N << " K=" << K << " T=" << T;
      // gemm_bf16 past the GEMV's sizes is this kernel where the plan says so (the tuner's choice).
      FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
      cuda::KernelPlan plan;
      plan.dense_batch = {{cuda::kSkinnyMaxTokens, form.kernel}};
      cuda::gemm_bf16(x.as<cuda::bf16_t>(), w.as<cuda::bf16_t>(), y.as<float>(), T, N, K, nullptr, plan);
      const std::vector<float> via = download_f32(y, size_t(T) * N);
      ASSERT_EQ(std::memcmp(via.data(), full.data(), via.size() * 4), 0) << "gemm_bf16, N=" << N << " T=" << T;
    }
  }
}

class CudaGemmSkinnyForm : public ::testing::TestWithParam<Form> {
 protected:
  void SetUp() override {
    if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
    if (GetParam().kernel == cuda::DenseBatchKernel::SkinnyWgmma && !cuda::wgmma_available())
      GTEST_SKIP() << "no wgmma here (an SM90 GPU with the binary's sm_90a code)";
  }
};

// 2048x4096: 8 slices of 512 (the 35B's output projections); 1024x2048 and 2048x512: slices of
// 256 and 64; 300x528: 5 slices, the last one step of one lane quad; 12352x2048: 97 row groups
// (the 35B's DeltaNet input projection); 4099x8192: slices of 1,024 and a partial row group;
// 16384x16: a single step of 16 k (the slices named are the mma.sync form's).
TEST_P(CudaGemmSkinnyForm, MatchesReferenceAndIsBatchInvariant) {
  check_form(GetParam(),
             {Shape{2048, 4096}, Shape{1024, 2048}, Shape{2048, 512}, Shape{300, 528}, Shape{12352, 2048},
              Shape{4099, 8192}, Shape{16384, 16}},
             {6, 7, 8, 9, 16, 17, 33, 63});
}

// The same checks at a few small shapes and sizes, for the sanitizers (racecheck takes minutes over
// the full set): full clusters of 8 slices, a partial row group with a partial last slice, every
// token tiling.
TEST_P(CudaGemmSkinnyForm, SmallShapesForSanitizers) {
  check_form(GetParam(), {Shape{1024, 2048}, Shape{300, 528}}, {6, 9, 17, 63});
}

INSTANTIATE_TEST_SUITE_P(Forms, CudaGemmSkinnyForm, ::testing::ValuesIn(kForms),
                         [](const ::testing::TestParamInfo<Form>& i) { return std::string(i.param.name); });

TEST(CudaGemmSkinny, DeclinesShapesOutsideItsLimits) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const int N = 256, K = 8256;  // K: 129 steps of 64, past 8 slices of 1,024
  cuda::DeviceBuffer w(size_t(cuda::kSkinnyMaxRows + 1) * 64 * 2), x(size_t(cuda::kSkinnyMaxTokens + 1) * K * 2);
  cuda::DeviceBuffer y(size_t(cuda::kSkinnyMaxTokens + 1) * (cuda::kSkinnyMaxRows + 1) * 4);
  FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
  const auto* xp = x.as<cuda::bf16_t>();
  const auto* wp = w.as<cuda::bf16_t>();
  for (const Form& form : kForms) {  // the wgmma form declines every shape where the GPU lacks it
    SCOPED_TRACE(form.name);
    EXPECT_FALSE(form.run(xp, wp, y.as<float>(), cuda::kSkinnyMaxTokens + 1, 64, 64, nullptr));
    EXPECT_FALSE(form.run(xp, wp, y.as<float>(), 0, 64, 64, nullptr));
    EXPECT_FALSE(form.run(xp, wp, y.as<float>(), 8, cuda::kSkinnyMaxRows + 1, 64, nullptr));
    EXPECT_FALSE(form.run(xp, wp, y.as<float>(), 8, 64, 24, nullptr));  // K % 16
    EXPECT_FALSE(form.run(xp, wp, y.as<float>(), 8, N, K, nullptr));
    EXPECT_FALSE(form.run(xp + 1, wp, y.as<float>(), 8, 64, 64, nullptr));  // x not 16-byte aligned
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> after = download_f32(y, y.bytes() / 4);
  const std::vector<unsigned char> untouched(y.bytes(), 0xFF);
  EXPECT_EQ(std::memcmp(after.data(), untouched.data(), untouched.size()), 0) << "a declined call wrote its output";
}

}  // namespace
}  // namespace fathom
