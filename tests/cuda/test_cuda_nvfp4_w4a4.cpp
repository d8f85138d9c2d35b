// NVFP4 W4A4 (src/kernels/cuda/nvfp4_w4a4*.cu): the activation quantizer bit for bit against a
// host reference (any GPU), the block-scaled FP4 GEMM against a double-precision host product
// (SM100 / SM120 only, skipped elsewhere), and, on the host, the W4A4 product against the W4A16
// one within the activation quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nvfp4_w4a4.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

// ---- host reference of the NVFP4 formats

constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e2m1_value(uint8_t code) { return (code & 8 ? -1.0 : 1.0) * kE2M1[code & 7]; }

double e4m3_value(uint8_t b) {  // finite codes (0x7f / 0xff are NaN and never produced)
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
  return b & 0x80 ? -v : v;
}

// Nearest E4M3 code of f >= 0, ties to the even code (= even mantissa), saturating at 448.
uint8_t e4m3_round(float f) {
  if (!(f > 0.f)) return 0;
  const double v = f;
  int best = 0;
  double best_err = v;
  for (int c = 1; c <= 0x7e; ++c) {
    const double err = std::fabs(e4m3_value(uint8_t(c)) - v);
    if (err < best_err || (err == best_err && c % 2 == 0)) best = c, best_err = err;
  }
  return uint8_t(best);
}

// Nearest E2M1 code of q, ties to the even code, saturating at 6; the sign bit is kept.
uint8_t e2m1_round(float q) {
  const double a = std::fabs(double(q));
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double err = std::fabs(kE2M1[c] - a), best_err = std::fabs(kE2M1[best] - a);
    if (err < best_err || (err == best_err && c % 2 == 0)) best = c;
  }
  return uint8_t(best | (std::signbit(q) ? 8 : 0));
}

struct Fp4Matrix {
  int rows = 0, k = 0;
  std::vector<uint8_t> codes, scales;  // [rows, k/2], [rows, k/16]
  float global = 1.f;
  double value(int r, int i) const {
    const uint8_t b = codes[size_t(r) * (k / 2) + i / 2];
    return e2m1_value(i % 2 ? b >> 4 : b & 15) * e4m3_value(scales[size_t(r) * (k / 16) + i / 16]) * double(global);
  }
};

// The quantizer's specification, operation by operation: the scale and the quotients are the
// fp32 results that the kernel computes (correctly rounded divisions and product), and the two
// roundings to E4M3 / E2M1 are decided exactly.
Fp4Matrix quantize_ref(const std::vector<cuda::bf16_t>& x, int T, int K, float input_global) {
  Fp4Matrix q;
  q.rows = T, q.k = K, q.global = input_global;
  q.codes.assign(size_t(T) * K / 2, 0);
  q.scales.assign(size_t(T) * K / 16, 0);
  for (size_t b = 0; b < size_t(T) * K / 16; ++b) {
    float v[16], amax = 0.f;
    for (int i = 0; i < 16; ++i) v[i] = from_bf16(x[b * 16 + i]), amax = std::max(amax, std::fabs(v[i]));
    const float sf = (amax / 6.f) / input_global;
    const uint8_t sc = e4m3_round(sf);
    const float scale = float(e4m3_value(sc)) * input_global;
    q.scales[b] = sc;
    if (scale > 0.f)
      for (int i = 0; i < 16; ++i) q.codes[b * 8 + i / 2] |= uint8_t(e2m1_round(v[i] / scale) << (4 * (i % 2)));
  }
  return q;
}

std::vector<double> dequantize(const Fp4Matrix& m) {
  std::vector<double> out(size_t(m.rows) * m.k);
  for (int r = 0; r < m.rows; ++r)
    for (int i = 0; i < m.k; ++i) out[size_t(r) * m.k + i] = m.value(r, i);
  return out;
}

// y[t, n] = sum_k a[t, k] w[n, k] in double, for the rows listed.
std::vector<double> product(const std::vector<double>& a, const std::vector<double>& w, int N, int K,
                            const std::vector<int>& rows) {
  std::vector<double> y(rows.size() * size_t(N));
  for (size_t i = 0; i < rows.size(); ++i)
    for (int n = 0; n < N; ++n) {
      const double* ap = a.data() + size_t(rows[i]) * K;
      const double* wp = w.data() + size_t(n) * K;
      double s = 0;
      for (int k = 0; k < K; ++k) s += ap[k] * wp[k];
      y[i * N + n] = s;
    }
  return y;
}

// Random NVFP4 weights: every code (including -0), scales over a wide range with some
// subnormal ones, global scale as in checkpoints.
Fp4Matrix random_weights(int N, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp4Matrix w;
  w.rows = N, w.k = K, w.global = 0.0123f;
  w.codes.resize(size_t(N) * K / 2);
  w.scales.resize(size_t(N) * K / 16);
  for (auto& c : w.codes) c = uint8_t(rng());
  for (auto& s : w.scales) s = rng() % 16 == 0 ? uint8_t(1 + rng() % 7) : uint8_t(0x20 + rng() % 0x28);
  return w;
}

// Activations like a norm's output: normal values, a few outliers, some all-zero blocks.
std::vector<cuda::bf16_t> random_activations(int T, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<cuda::bf16_t> x(size_t(T) * K);
  for (int t = 0; t < T; ++t) {
    const float row_scale = std::exp(nd(rng));
    for (int k = 0; k < K; ++k) {
      float v = nd(rng) * row_scale;
      if (rng() % 97 == 0) v *= 20.f;
      x[size_t(t) * K + k] = to_bf16(v);
    }
    if (rng() % 3 == 0) std::fill_n(x.begin() + size_t(t) * K + 16 * (rng() % (K / 16)), 16, to_bf16(0.f));
  }
  return x;
}

// ModelOpt's calibration: input_scale = amax / (448 * 6).
float input_scale_for(const std::vector<cuda::bf16_t>& x) {
  float amax = 0.f;
  for (const auto v : x) amax = std::max(amax, std::fabs(from_bf16(v)));
  return amax > 0.f ? amax / (448.f * 6.f) : 1.f;
}

template <class T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// ---- the quantizer

void expect_quantizer_matches(const std::vector<cuda::bf16_t>& x, int T, int K, float input_global,
                              const char* what) {
  const Fp4Matrix ref = quantize_ref(x, T, K, input_global);
  auto dx = cuda::DeviceBuffer::from_host(x);
  cuda::DeviceBuffer codes(ref.codes.size()), scales(ref.scales.size());
  FATHOM_CUDA_CHECK(cudaMemset(codes.data(), 0xAA, codes.bytes()));
  FATHOM_CUDA_CHECK(cudaMemset(scales.data(), 0xAA, scales.bytes()));
  cuda::nvfp4_quantize_activations(dx.as<cuda::bf16_t>(), T, K, input_global, codes.as<uint8_t>(),
                                   scales.as<uint8_t>(), nullptr);
  const auto got_codes = download<uint8_t>(codes, ref.codes.size());
  const auto got_scales = download<uint8_t>(scales, ref.scales.size());
  size_t bad_codes = 0, bad_scales = 0;
  for (size_t i = 0; i < ref.codes.size(); ++i) bad_codes += got_codes[i] != ref.codes[i];
  for (size_t i = 0; i < ref.scales.size(); ++i) bad_scales += got_scales[i] != ref.scales[i];
  EXPECT_EQ(bad_codes, 0u) << what << ": code bytes differing from the reference";
  EXPECT_EQ(bad_scales, 0u) << what << ": scales differing from the reference";
}

TEST(CudaNvfp4W4A4, QuantizerMatchesHostReference) {
  const struct {
    int T, K;
  } shapes[] = {{1, 16}, {3, 64}, {7, 4096}, {300, 1024}};
  for (const auto& sh : shapes) {
    const auto x = random_activations(sh.T, sh.K, uint32_t(sh.T * 131 + sh.K));
    const float g = input_scale_for(x);
    expect_quantizer_matches(x, sh.T, sh.K, g, "random activations");
    // A per-tensor scale 50x too small: block scales past 448 saturate, and so do the codes.
    expect_quantizer_matches(x, sh.T, sh.K, g / 50.f, "saturating scales");
    // One 1000x too large: small blocks' scales round to E4M3 subnormals or to zero.
    expect_quantizer_matches(x, sh.T, sh.K, g * 1000.f, "underflowing scales");
  }
}

// Hand-made blocks: exact E2M1 ties (scale 1), zero and negative-zero blocks, a block of
// subnormal scale, values past saturation, mixed signs.
TEST(CudaNvfp4W4A4, QuantizerEdgeCases) {
  const int K = 16 * 6;
  std::vector<float> v = {6.f,   0.25f, 0.75f, 1.25f, 1.75f, 2.5f,  3.5f,  5.f,  // ties (amax 6 -> scale 1)
                          -6.f,  -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.f};
  for (int i = 0; i < 16; ++i) v.push_back(i % 2 ? -0.f : 0.f);               // zero block
  for (int i = 0; i < 16; ++i) v.push_back(1e-3f * float(i - 8));              // subnormal E4M3 scale
  for (int i = 0; i < 16; ++i) v.push_back(i == 3 ? 30000.f : float(i) - 7.f);  // block scale past 448
  for (int i = 0; i < 16; ++i) v.push_back(0.1f * float(i) - 0.8f);
  for (int i = 0; i < 16; ++i) v.push_back(i == 0 ? 1e-30f : 0.f);             // scale rounds to zero
  ASSERT_EQ(int(v.size()), K);
  std::vector<cuda::bf16_t> x;
  for (const float f : v) x.push_back(to_bf16(f));
  expect_quantizer_matches(x, 1, K, 1.f, "edge cases");
  // The reference itself on the ties: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4 (ties to even), and the saturated block's largest value -> code 7 (6.0).
  const Fp4Matrix q = quantize_ref(x, 1, K, 1.f);
  const double want[8] = {6, 0, 1, 1, 2, 2, 4, 4};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(q.value(0, i), want[i]) << "tie " << i;
    EXPECT_EQ(q.value(0, 8 + i), -want[i]) << "negative tie " << i;
  }
  EXPECT_EQ(q.scales[2], 0x01) << "a subnormal E4M3 scale (2^-9)";
  EXPECT_EQ(q.scales[3], 0x7e) << "block scale saturates at 448";
  EXPECT_EQ(q.codes[3 * 8 + 1] >> 4, 7) << "value past 6 x scale saturates";
  EXPECT_EQ(q.scales[5], 0) << "a scale that rounds to zero";
}

// ---- the GEMM

TEST(CudaNvfp4W4A4, GemmThrowsWhereUnsupported) {
  if (cuda::nvfp4_w4a4_supported()) GTEST_SKIP() << "not run: this GPU has a W4A4 kernel";
  const Fp4Matrix w = random_weights(64, 64, 1);
  auto dc = cuda::DeviceBuffer::from_host(w.codes), ds = cuda::DeviceBuffer::from_host(w.scales);
  cuda::DeviceBuffer y(64 * 4);
  cuda::DeviceLinear lin;
  lin.out = 64, lin.in = 64, lin.fp4 = dc.as<uint8_t>(), lin.fp4_scale = ds.as<uint8_t>(), lin.fp4_global = w.global;
  EXPECT_THROW(cuda::nvfp4_w4a4_gemm(dc.as<uint8_t>(), ds.as<uint8_t>(), 1.f, lin, y.as<float>(), 1, nullptr),
               Error);
}

// The products of E2M1 codes and E4M3 scales are exact in fp32; only the fp32 sums round, so a
// row's outputs are expected within ~1e-6..1e-5 of its largest |y|. The bound leaves a margin
// for the tensor cores' internal summation (its order and width are not documented); a wrong
// fragment or scale layout gives errors of order 1.
constexpr double kGemmTolerance = 1e-4;

TEST(CudaNvfp4W4A4, GemmMatchesHostReference) {
  if (!cuda::nvfp4_w4a4_supported()) GTEST_SKIP() << "not run: no sm_100/sm_120 GPU";
  const struct {
    int T, N, K;
  } shapes[] = {{1, 64, 64},    {7, 128, 256},   {64, 192, 320}, {300, 256, 512},
                {1, 4096, 1024}, {300, 4096, 1024}, {7, 1024, 4096}, {64, 1024, 4096}};
  for (const auto& sh : shapes) {
    const int T = sh.T, N = sh.N, K = sh.K;
    const Fp4Matrix w = random_weights(N, K, uint32_t(N + K));
    const auto x = random_activations(T, K, uint32_t(T * 7 + K));
    const Fp4Matrix a = quantize_ref(x, T, K, input_scale_for(x));
    auto dwc = cuda::DeviceBuffer::from_host(w.codes), dws = cuda::DeviceBuffer::from_host(w.scales);
    auto dac = cuda::DeviceBuffer::from_host(a.codes), das = cuda::DeviceBuffer::from_host(a.scales);
    cuda::DeviceBuffer dy(size_t(T) * N * 4);
    FATHOM_CUDA_CHECK(cudaMemset(dy.data(), 0xFF, dy.bytes()));  // NaN: an output never written fails
    cuda::DeviceLinear lin;
    lin.out = N, lin.in = K, lin.fp4 = dwc.as<uint8_t>(), lin.fp4_scale = dws.as<uint8_t>(), lin.fp4_global = w.global;
    cuda::nvfp4_w4a4_gemm(dac.as<uint8_t>(), das.as<uint8_t>(), a.global, lin, dy.as<float>(), T, nullptr);
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y = download<float>(dy, size_t(T) * N);
    size_t non_finite = 0;
    for (const float v : y) non_finite += !std::isfinite(v);
    EXPECT_EQ(non_finite, 0u) << "T=" << T << " N=" << N << " K=" << K;

    std::vector<int> rows;  // every row of small steps; every 7th (and the last) of large ones
    for (int t = 0; t < T; t += (size_t(T) * N * K > (size_t(1) << 28) ? 7 : 1)) rows.push_back(t);
    if (rows.back() != T - 1) rows.push_back(T - 1);
    const auto ref = product(dequantize(a), dequantize(w), N, K, rows);
    double worst = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      double max_ref = 0, max_diff = 0;
      for (int n = 0; n < N; ++n) {
        const double r = ref[i * N + n], g = y[size_t(rows[i]) * N + n];
        max_ref = std::max(max_ref, std::fabs(r));
        max_diff = std::max(max_diff, std::isfinite(g) ? std::fabs(g - r) : INFINITY);
      }
      worst = std::max(worst, max_ref > 0 ? max_diff / max_ref : max_diff);
    }
    std::printf("  W4A4 T=%d N=%d K=%d: max row error %.2e of the row's max |y|\n", T, N, K, worst);
    EXPECT_LT(worst, kGemmTolerance) << "T=" << T << " N=" << N << " K=" << K;
  }
}

// The whole path on the device: quantizer, then GEMM, against the host's quantization and product.
TEST(CudaNvfp4W4A4, QuantizeThenGemm) {
  if (!cuda::nvfp4_w4a4_supported()) GTEST_SKIP() << "not run: no sm_100/sm_120 GPU";
  const int T = 37, N = 512, K = 2048;
  const Fp4Matrix w = random_weights(N, K, 5);
  const auto x = random_activations(T, K, 6);
  const float g = input_scale_for(x);
  auto dx = cuda::DeviceBuffer::from_host(x);
  auto dwc = cuda::DeviceBuffer::from_host(w.codes), dws = cuda::DeviceBuffer::from_host(w.scales);
  cuda::DeviceBuffer dac(size_t(T) * K / 2), das(size_t(T) * K / 16), dy(size_t(T) * N * 4);
  cuda::nvfp4_quantize_activations(dx.as<cuda::bf16_t>(), T, K, g, dac.as<uint8_t>(), das.as<uint8_t>(), nullptr);
  cuda::DeviceLinear lin;
  lin.out = N, lin.in = K, lin.fp4 = dwc.as<uint8_t>(), lin.fp4_scale = dws.as<uint8_t>(), lin.fp4_global = w.global;
  cuda::nvfp4_w4a4_gemm(dac.as<uint8_t>(), das.as<uint8_t>(), g, lin, dy.as<float>(), T, nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto y = download<float>(dy, size_t(T) * N);
  std::vector<int> rows(T);
  for (int t = 0; t < T; ++t) rows[t] = t;
  const auto ref = product(dequantize(quantize_ref(x, T, K, g)), dequantize(w), N, K, rows);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    double max_ref = 0, max_diff = 0;
    for (int n = 0; n < N; ++n) {
      max_ref = std::max(max_ref, std::fabs(ref[size_t(t) * N + n]));
      const double d = std::fabs(double(y[size_t(t) * N + n]) - ref[size_t(t) * N + n]);
      max_diff = std::max(max_diff, std::isfinite(d) ? d : INFINITY);
    }
    worst = std::max(worst, max_diff / max_ref);
  }
  std::printf("  quantize + W4A4 T=%d N=%d K=%d: max row error %.2e\n", T, N, K, worst);
  EXPECT_LT(worst, kGemmTolerance);
}

// ---- W4A4 against W4A16 (host only)

// The same NVFP4 weights times the bf16 activations (W4A16, as nvfp4_gemv / the dequantized
// cuBLAS path compute it) and times their NVFP4 quantization (W4A4): the difference is the
// activation quantization error carried through the weights, bounded elementwise by
// sum_k |deq(q(x))_k - x_k| |w_k|; each quantized value is within one block scale of x (half
// an E2M1 step, or the saturation at 6 when the E4M3 scale rounded down).
TEST(CudaNvfp4W4A4, W4A4WithinActivationErrorOfW4A16) {
  const int T = 9, N = 256, K = 1024;
  const Fp4Matrix w = random_weights(N, K, 17);
  const auto x = random_activations(T, K, 18);
  const Fp4Matrix a = quantize_ref(x, T, K, input_scale_for(x));
  const auto xa = dequantize(a), wd = dequantize(w);
  std::vector<double> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = from_bf16(x[i]);

  size_t beyond_scale = 0, checked = 0;
  for (size_t b = 0; b < x.size() / 16; ++b) {
    // Normal E4M3 scales below 448 are within 1/16 of amax / 6 (subnormal or saturated ones are not).
    if (a.scales[b] < 0x08 || a.scales[b] == 0x7e) continue;
    ++checked;
    const double scale = e4m3_value(a.scales[b]) * double(a.global);
    for (int i = 0; i < 16; ++i) beyond_scale += std::fabs(xa[b * 16 + i] - xb[b * 16 + i]) > scale * (1 + 1e-12);
  }
  EXPECT_GT(checked, x.size() / 32);
  EXPECT_EQ(beyond_scale, 0u) << "quantized values further than one block scale from x";

  std::vector<int> rows(T);
  for (int t = 0; t < T; ++t) rows[t] = t;
  const auto y16 = product(xb, wd, N, K, rows), y4 = product(xa, wd, N, K, rows);
  double rel_rms_num = 0, rel_rms_den = 0;
  size_t beyond_bound = 0;
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double bound = 0;
      for (int k = 0; k < K; ++k)
        bound += std::fabs(xa[size_t(t) * K + k] - xb[size_t(t) * K + k]) * std::fabs(wd[size_t(n) * K + k]);
      const double d = y4[size_t(t) * N + n] - y16[size_t(t) * N + n];
      beyond_bound += std::fabs(d) > bound * (1 + 1e-9) + 1e-12;
      rel_rms_num += d * d;
      rel_rms_den += y16[size_t(t) * N + n] * y16[size_t(t) * N + n];
    }
  EXPECT_EQ(beyond_bound, 0u) << "outputs differing by more than the activation error allows";
  const double rel_rms = std::sqrt(rel_rms_num / rel_rms_den);
  std::printf("  W4A4 vs W4A16: relative RMS difference %.3f\n", rel_rms);
  // NVFP4 activations carry ~2 bits of mantissa: a few percent, not tens.
  EXPECT_LT(rel_rms, 0.2);
}

}  // namespace
}  // namespace fathom
