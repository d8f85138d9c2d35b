// FP8 (E4M3) dense linears (issue 31): linear() at step sizes on both sides of the GEMV limit for
// every scaling (per tensor, per output row, per 128 x 128 block; weight-only and W8A8) against
// a double-precision host reference of the exact semantics (core/dtype.h's E4M3 decode and
// quantizer); the W8A8 GEMV against cuBLASLt's FP8 product; the GEMV's batch invariance;
// fp8_quantize and fp8_dequantize bit for bit against the host; the buffer checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

enum class Mode { PerTensor, PerTensorW8A8, PerChannel, PerChannelW8A8, Block, BlockW8A8 };
const char* name_of(Mode m) {
  switch (m) {
    case Mode::PerTensor: return "per-tensor";
    case Mode::PerTensorW8A8: return "per-tensor W8A8";
    case Mode::PerChannel: return "per-channel";
    case Mode::PerChannelW8A8: return "per-channel W8A8";
    case Mode::Block: return "block";
    case Mode::BlockW8A8: return "block W8A8";
  }
  return "?";
}
constexpr Mode kModes[] = {Mode::PerTensor, Mode::PerTensorW8A8, Mode::PerChannel, Mode::PerChannelW8A8, Mode::Block,
                           Mode::BlockW8A8};

int blocks(int n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// An FP8 weight on the host and the device, with the DeviceLinear that describes it.
struct Fp8Matrix {
  int n = 0, k = 0;
  Mode mode = Mode::PerTensor;
  std::vector<uint8_t> codes;  // [n, k]
  float scale = 1.f;           // per tensor
  std::vector<float> scales;   // per channel [n] or block [blocks(n), blocks(k)]
  float input_scale = 0.f;
  cuda::DeviceBuffer d_codes, d_scales;
  cuda::DeviceLinear lin;

  float scale_of(int r, int c) const {
    switch (mode) {
      case Mode::PerChannel:
      case Mode::PerChannelW8A8: return scales[size_t(r)];
      case Mode::Block:
      case Mode::BlockW8A8:
        return scales[size_t(r / kFp8BlockSize) * blocks(k) + c / kFp8BlockSize];
      default: return scale;
    }
  }
  bool w8a8() const { return input_scale > 0.f; }
};

Fp8Matrix random_fp8(int n, int k, Mode mode, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> spread(0.5f, 1.5f);
  Fp8Matrix m;
  m.n = n, m.k = k, m.mode = mode;
  m.codes.resize(size_t(n) * k);
  for (auto& c : m.codes) {
    do c = uint8_t(rng());
    while ((c & 0x7f) == 0x7f);  // no NaN codes (every other code, subnormals included)
  }
  const float base = 1.f / (64.f * std::sqrt(float(k)));
  m.scale = base;
  if (mode == Mode::PerChannel || mode == Mode::PerChannelW8A8) m.scales.resize(size_t(n));
  if (mode == Mode::Block || mode == Mode::BlockW8A8) m.scales.resize(size_t(blocks(n)) * blocks(k));
  for (auto& s : m.scales) s = base * spread(rng);
  if (mode == Mode::PerTensorW8A8 || mode == Mode::PerChannelW8A8 || mode == Mode::BlockW8A8)
    m.input_scale = 0.02f;  // |x| > 8.96 saturates
  m.d_codes = cuda::DeviceBuffer::from_host(m.codes);
  if (!m.scales.empty()) m.d_scales = cuda::DeviceBuffer::from_host(m.scales);
  m.lin.out = n, m.lin.in = k;
  m.lin.fp8 = m.d_codes.as<uint8_t>();
  m.lin.fp8_scaling = (mode == Mode::PerChannel || mode == Mode::PerChannelW8A8) ? Fp8Scaling::PerChannel
                      : (mode == Mode::Block || mode == Mode::BlockW8A8) ? Fp8Scaling::Block
                                                                           : Fp8Scaling::PerTensor;
  m.lin.fp8_scale = m.scale;
  m.lin.fp8_scales = m.scales.empty() ? nullptr : m.d_scales.as<float>();
  m.lin.fp8_input_scale = m.input_scale;
  return m;
}

// Activations ~N(0, 1) as bf16, every 37th ten times larger (W8A8: some saturate at +-448).
std::vector<uint16_t> random_x(int rows, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(rows) * k);
  for (size_t i = 0; i < x.size(); ++i) x[i] = to_bf16(nd(rng) * (i % 37 == 0 ? 10.f : 1.f));
  return x;
}

// The exact product of the semantics (double): y and sum |x * w| (the error scale) per token row.
struct Reference {
  std::vector<double> y, magnitude;  // [T, n]
};
Reference reference(const Fp8Matrix& m, const std::vector<uint16_t>& xb, int T) {
  Reference ref;
  ref.y.resize(size_t(T) * m.n);
  ref.magnitude.resize(size_t(T) * m.n);
  std::vector<double> xv(size_t(m.k));
  for (int t = 0; t < T; ++t) {
    for (int c = 0; c < m.k; ++c) {
      const float x = from_bf16(xb[size_t(t) * m.k + c]);
      // W8A8: e4m3(x * (1 / input_scale)), in fp32 as the kernels; the input scale
      // multiplies the sum below.
      xv[size_t(c)] = m.w8a8() ? double(fp8_e4m3_to_f32(fp8_quantize_activation(x, m.input_scale))) : double(x);
    }
    for (int r = 0; r < m.n; ++r) {
      double acc = 0, mag = 0;
      for (int c = 0; c < m.k; ++c) {
        const double p = xv[size_t(c)] * double(fp8_e4m3_to_f32(m.codes[size_t(r) * m.k + c])) * double(m.scale_of(r, c));
        acc += p;
        mag += std::fabs(p);
      }
      const double in = m.w8a8() ? double(m.input_scale) : 1.0;
      ref.y[size_t(t) * m.n + r] = acc * in;
      ref.magnitude[size_t(t) * m.n + r] = mag * in;
    }
  }
  return ref;
}

std::vector<float> download_f32(const cuda::DeviceBuffer& b, size_t elems) {
  std::vector<float> v(elems);
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), elems * 4, cudaMemcpyDeviceToHost));
  return v;
}

// Largest |got - ref| / sum |x * w| over the first T token rows (non-finite: 1e30).
double worst_error(const std::vector<float>& got, const Reference& ref, int T, int n) {
  double worst = 0;
  for (size_t i = 0; i < size_t(T) * n; ++i) {
    const double g = got[i];
    const double e = std::isfinite(g) ? std::fabs(g - ref.y[i]) / std::max(ref.magnitude[i], 1e-30) : 1e30;
    worst = std::max(worst, e);
  }
  return worst;
}

TEST(CudaFp8Linear, MatchesReferenceAtEveryScalingAndStepSize) {
  struct Shape {
    int n, k;
  };
  const int steps[] = {1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 200};
  constexpr int kMaxT = 200;
  double worst_w8a8_gemv = 0;  // reported: the tensor-core GEMV's error on the sum's magnitude
  for (const Shape sh : {Shape{96, 256}, Shape{130, 400}, Shape{1000, 1024}}) {
    const std::vector<uint16_t> xb = random_x(kMaxT, sh.k, uint32_t(sh.n + sh.k));
    auto x = cuda::DeviceBuffer::from_host(xb);
    cuda::DeviceBuffer y(size_t(kMaxT) * sh.n * 4);
    for (Mode mode : kModes) {
      const Fp8Matrix m = random_fp8(sh.n, sh.k, mode, uint32_t(sh.n * 131 + sh.k + int(mode)));
      const Reference ref = reference(m, xb, kMaxT);  // a token's row does not depend on T
      cuda::DeviceBuffer scratch(size_t(std::max<int64_t>(cuda::linear_scratch_elems(m.lin, kMaxT), 1)) * 2);
      for (int T : steps) {
        FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xff, y.bytes()));  // NaN: every output must be written
        cuda::linear(m.lin, x.as<cuda::bf16_t>(), y.array<float>(), T, scratch.array<cuda::bf16_t>(), nullptr,
                     cuda::KernelPlan{});
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        const double err = worst_error(download_f32(y, size_t(T) * sh.n), ref, T, sh.n);
        // W8A8 runs on E4M3 tensor cores at every size (the GEMV's mma.sync, cuBLASLt past it):
        // exact products, summed inside the tensor core with less than fp32's precision.
        // Weight-only: the GEMV's fp32 sums of exact products; past it cuBLASLt's bf16 product of
        // the exact codes (scales after), block scales folded into weights rounded to bf16 (2^-9).
        const bool block = mode == Mode::Block || mode == Mode::BlockW8A8;
        const double tol = m.w8a8()                         ? 1e-3
                           : T <= cuda::kFp8GemvMaxTokens ? 1e-5
                           : block                         ? 4e-3
                                                           : 1e-4;
        EXPECT_LT(err, tol) << name_of(mode) << " N=" << sh.n << " K=" << sh.k << " T=" << T;
        if (m.w8a8() && T <= cuda::kFp8GemvMaxTokens) worst_w8a8_gemv = std::max(worst_w8a8_gemv, err);
      }
    }
  }
  std::cout << "W8A8 GEMV (E4M3 mma) worst error / magnitude: " << worst_w8a8_gemv << "\n";
}

// The same W8A8 tokens through the GEMV (in slices of 16) and through fp8_quantize + cuBLASLt's
// FP8 product (gemm_fp8, also directly).
TEST(CudaFp8Linear, W8A8GemvAndGemmAgree) {
  constexpr int N = 1000, K = 1024, T = 48;
  const Fp8Matrix m = random_fp8(N, K, Mode::PerTensorW8A8, 11);
  const std::vector<uint16_t> xb = random_x(T, K, 12);
  const Reference ref = reference(m, xb, T);
  auto x = cuda::DeviceBuffer::from_host(xb);
  cuda::DeviceBuffer y_gemv(size_t(T) * N * 4), y_gemm(size_t(T) * N * 4), y_direct(size_t(T) * N * 4);
  for (int t0 = 0; t0 < T; t0 += 16)
    cuda::fp8_gemv(m.lin, x.as<cuda::bf16_t>() + size_t(t0) * K, y_gemv.as<float>() + size_t(t0) * N, 16, nullptr);
  cuda::DeviceBuffer scratch(size_t(cuda::linear_scratch_elems(m.lin, T)) * 2);
  cuda::KernelPlan gemm_only;
  gemm_only.fp8_gemv_max_tokens = 0;
  FATHOM_CUDA_CHECK(cudaMemset(y_gemm.data(), 0xff, y_gemm.bytes()));
  cuda::linear(m.lin, x.as<cuda::bf16_t>(), y_gemm.array<float>(), T, scratch.array<cuda::bf16_t>(), nullptr, gemm_only);
  cuda::DeviceBuffer xq(size_t(T) * K);
  cuda::fp8_quantize(x.as<cuda::bf16_t>(), m.input_scale, xq.as<uint8_t>(), int64_t(T) * K, nullptr);
  FATHOM_CUDA_CHECK(cudaMemset(y_direct.data(), 0xff, y_direct.bytes()));
  cuda::gemm_fp8(xq.as<uint8_t>(), m.lin.fp8, y_direct.as<float>(), T, N, K, m.input_scale * m.scale, nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> gv = download_f32(y_gemv, size_t(T) * N), gm = download_f32(y_gemm, size_t(T) * N),
                           gd = download_f32(y_direct, size_t(T) * N);
  EXPECT_LT(worst_error(gv, ref, T, N), 1e-3);
  EXPECT_LT(worst_error(gm, ref, T, N), 1e-3);
  EXPECT_LT(worst_error(gd, ref, T, N), 1e-3);
  double worst = 0;  // the two products against each other, on the reference's scale
  for (size_t i = 0; i < gv.size(); ++i)
    worst = std::max(worst, std::fabs(double(gv[i]) - gm[i]) / std::max(ref.magnitude[i], 1e-30));
  EXPECT_LT(worst, 2e-3);
}

// A token's row has the same bits whatever the step's size (1..16) and its place in the step.
TEST(CudaFp8Linear, GemvIsBatchInvariant) {
  constexpr int T = cuda::kFp8GemvMaxTokens;
  for (const auto& [n, k] : {std::pair{1000, 1024}, std::pair{130, 400}, std::pair{64, 4096}}) {
    const std::vector<uint16_t> xb = random_x(T, k, 5);
    auto x = cuda::DeviceBuffer::from_host(xb);
    cuda::DeviceBuffer full(size_t(T) * n * 4), part(size_t(T) * n * 4);
    for (Mode mode : kModes) {
      const Fp8Matrix m = random_fp8(n, k, mode, 9);
      cuda::fp8_gemv(m.lin, x.as<cuda::bf16_t>(), full.as<float>(), T, nullptr);
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> all = download_f32(full, size_t(T) * n);
      for (int steps = 1; steps < T; ++steps) {
        // Tokens [T - steps, T) as a step of their own.
        const int t0 = T - steps;
        cuda::fp8_gemv(m.lin, x.as<cuda::bf16_t>() + size_t(t0) * k, part.as<float>(), steps, nullptr);
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got = download_f32(part, size_t(steps) * n);
        EXPECT_EQ(std::memcmp(got.data(), all.data() + size_t(t0) * n, got.size() * 4), 0)
            << name_of(mode) << " N=" << n << " K=" << k << ": " << steps << " tokens from token " << t0;
      }
    }
  }
}

// fp8_quantize gives the host quantizer's codes (core/dtype.h) bit for bit: vector and scalar
// paths (aligned and unaligned starts, a tail), saturation, subnormals, NaN.
TEST(CudaFp8Linear, QuantizeMatchesHostRounding) {
  constexpr int n = 4099;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> xb(n + 1);
  for (size_t i = 0; i < xb.size(); ++i) {
    const float scale = i % 5 == 0 ? 1e-3f : i % 7 == 0 ? 100.f : 1.f;  // subnormal and saturating codes
    xb[i] = to_bf16(nd(rng) * scale);
  }
  xb[17] = 0x7fc0;  // NaN
  xb[18] = 0x7f80;  // +Inf: saturates
  xb[19] = 0x8000;  // -0
  const float qscale = 0.05f;
  auto x = cuda::DeviceBuffer::from_host(xb);
  cuda::DeviceBuffer q(size_t(n) + 16);
  for (int offset : {0, 1}) {  // element 1: neither x nor q 16-byte aligned (the scalar path)
    FATHOM_CUDA_CHECK(cudaMemset(q.data(), 0xAA, q.bytes()));
    cuda::fp8_quantize(x.as<cuda::bf16_t>() + offset, qscale, q.as<uint8_t>() + offset, n, nullptr);
    std::vector<uint8_t> got(q.bytes());
    FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), q.data(), got.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      const uint8_t want = fp8_quantize_activation(from_bf16(xb[size_t(i + offset)]), qscale);
      const uint8_t g = got[size_t(i + offset)];
      const bool same = (want & 0x7f) == 0x7f ? (g & 0x7f) == 0x7f : g == want;  // any NaN code for NaN
      if (!same && bad++ < 5) ADD_FAILURE() << "offset " << offset << " element " << i << ": got " << int(g) << ", want " << int(want);
    }
    EXPECT_EQ(bad, 0) << "offset " << offset;
    // Nothing written outside [offset, offset + n).
    for (size_t i = 0; i < got.size(); ++i) {
      if (i < size_t(offset) || i >= size_t(offset + n)) {
        EXPECT_EQ(got[i], 0xAA) << "byte " << i;
      }
    }
  }
}

// fp8_dequantize: bf16(e4m3 x scale), the product in fp32, bit for bit; 16-wide rows and rows
// that are not (the scalar path), partial scale blocks.
TEST(CudaFp8Linear, DequantizeMatchesHost) {
  for (const auto& [n, k] : {std::pair{130, 400}, std::pair{200, 136}, std::pair{33, 40}}) {
    for (Mode mode : {Mode::PerTensor, Mode::PerChannel, Mode::Block}) {
      const Fp8Matrix m = random_fp8(n, k, mode, 4);
      cuda::DeviceBuffer out(size_t(n) * k * 2 + 32);
      FATHOM_CUDA_CHECK(cudaMemset(out.data(), 0xAA, out.bytes()));
      cuda::fp8_dequantize(m.lin, out.as<cuda::bf16_t>(), nullptr);
      std::vector<uint16_t> got(out.bytes() / 2);
      FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), out.data(), out.bytes(), cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < k; ++c) {
          const uint16_t want = to_bf16(fp8_e4m3_to_f32(m.codes[size_t(r) * k + c]) * m.scale_of(r, c));
          if (got[size_t(r) * k + c] != want && bad++ < 5)
            ADD_FAILURE() << name_of(mode) << " [" << n << ", " << k << "] at " << r << ", " << c;
        }
      EXPECT_EQ(bad, 0) << name_of(mode) << " [" << n << ", " << k << "]";
      for (size_t i = size_t(n) * k; i < got.size(); ++i) EXPECT_EQ(got[i], 0xAAAA) << "past the end: " << i;
    }
  }
}

// NVIDIA's V2 layout: a W8A8 FP8 projection and bf16 rows of the same input (DeltaNet's [b | a],
// the shared expert's gate logit) in one launch at GEMV sizes. The FP8 rows have the bits of
// fp8_gemv alone; the bf16 rows match a double-precision reference, have the same bits at every
// step size, and nothing past either output is written. Past the GEMV, two linears.
// W8A8 (V2's per-row scaled projections) and weight-only with block scales (Qwen's FP8 releases).
TEST(CudaFp8Linear, PairWithBf16TailMatchesSeparateProducts) {
  constexpr int kMaxT = 20;
  for (const Mode mode : {Mode::PerChannelW8A8, Mode::Block})
  for (const auto& [n, k, tail_n] : {std::tuple{96, 256, 1}, std::tuple{130, 400, 130}, std::tuple{1000, 4096, 128}}) {
    const Fp8Matrix m = random_fp8(n, k, mode, uint32_t(n + k));
    const std::vector<uint16_t> xb = random_x(kMaxT, k, 21), tb = random_x(tail_n, k, 22);
    auto x = cuda::DeviceBuffer::from_host(xb);
    auto tw = cuda::DeviceBuffer::from_host(tb);
    cuda::DeviceLinear tail;
    tail.out = tail_n, tail.in = k, tail.bf16 = tw.as<cuda::bf16_t>();
    constexpr size_t kGuard = 64;  // floats past each output that must stay untouched
    cuda::DeviceBuffer y((size_t(kMaxT) * n + kGuard) * 4), ty((size_t(kMaxT) * tail_n + kGuard) * 4),
        alone(size_t(kMaxT) * n * 4);
    cuda::DeviceBuffer scratch(size_t(cuda::linear_scratch_elems(m.lin, kMaxT)) * 2);
    std::vector<float> first_tail;  // token 0's tail row at T = 1
    for (int T : {1, 3, 8, 9, 16, 17, 20}) {
      FATHOM_CUDA_CHECK(cudaMemset(y.data(), 0xff, y.bytes()));
      FATHOM_CUDA_CHECK(cudaMemset(ty.data(), 0xff, ty.bytes()));
      cuda::linear_pair(m.lin, tail, x.as<cuda::bf16_t>(), {y.as<float>(), int64_t(T) * n},
                        {ty.as<float>(), int64_t(T) * tail_n}, T, scratch.array<cuda::bf16_t>(), nullptr,
                        cuda::KernelPlan{});
      cuda::linear(m.lin, x.as<cuda::bf16_t>(), alone.array<float>(), T, scratch.array<cuda::bf16_t>(), nullptr,
                   cuda::KernelPlan{});
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = download_f32(y, size_t(T) * n + kGuard),
                               want = download_f32(alone, size_t(T) * n),
                               got_tail = download_f32(ty, size_t(T) * tail_n + kGuard);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
          << name_of(mode) << " FP8 rows, T=" << T << " N=" << n;
      double worst = 0;
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < tail_n; ++r) {
          double ref = 0, mag = 0;
          for (int c = 0; c < k; ++c) {
            const double p = double(from_bf16(xb[size_t(t) * k + c])) * from_bf16(tb[size_t(r) * k + c]);
            ref += p, mag += std::fabs(p);
          }
          const double g = got_tail[size_t(t) * tail_n + r];
          worst = std::max(worst, std::isfinite(g) ? std::fabs(g - ref) / std::max(mag, 1e-30) : 1e30);
        }
      EXPECT_LT(worst, 1e-5) << name_of(mode) << " bf16 tail, T=" << T << " rows=" << tail_n;
      const uint32_t* gb = reinterpret_cast<const uint32_t*>(got.data());
      const uint32_t* tbits = reinterpret_cast<const uint32_t*>(got_tail.data());
      for (size_t i = 0; i < kGuard; ++i) {
        EXPECT_EQ(gb[size_t(T) * n + i], 0xffffffffu) << "past the FP8 output, T=" << T;
        EXPECT_EQ(tbits[size_t(T) * tail_n + i], 0xffffffffu) << "past the tail output, T=" << T;
      }
      const std::vector<float> t0(got_tail.begin(), got_tail.begin() + tail_n);
      if (T == 1) first_tail = t0;
      else if (T <= cuda::kFp8GemvMaxTokens)
        EXPECT_EQ(std::memcmp(t0.data(), first_tail.data(), t0.size() * 4), 0) << "tail bits at T=" << T;
    }
  }
}

TEST(CudaFp8Linear, ScratchSizes) {
  cuda::DeviceLinear w;
  w.out = 100, w.in = 64;
  EXPECT_EQ(cuda::linear_scratch_elems(w, 200), 0);  // bf16 weights
  uint8_t dummy = 0;
  w.fp8 = &dummy;  // never read
  EXPECT_EQ(cuda::linear_scratch_elems(w, 200), 100 * 64);  // the dequantized weight
  EXPECT_EQ(cuda::linear_scratch_elems(w, 1), 100 * 64);    // a plan may dequantize at any size
  EXPECT_EQ(cuda::linear_scratch_elems(w, 0), 0);
  w.fp8_input_scale = 0.5f;
  EXPECT_EQ(cuda::linear_scratch_elems(w, 200), 200 * 64 / 2);  // the quantized activations' bytes
  w.in = 48;
  EXPECT_EQ(cuda::linear_scratch_elems(w, 3), (3 * 48 + 1) / 2);
}

TEST(CudaFp8Linear, RefusesLaunchesThatDoNotFitTheirBuffers) {
  constexpr int N = 64, K = 96, T = 33;
  cuda::DeviceBuffer x(size_t(T) * K * 2), y(size_t(T) * N * 4);
  FATHOM_CUDA_CHECK(cudaMemset(x.data(), 0, x.bytes()));
  const cuda::DeviceArray<float> short_y{y.as<float>(), (T - 1) * N};
  for (Mode mode : {Mode::PerTensor, Mode::PerTensorW8A8}) {
    const Fp8Matrix m = random_fp8(N, K, mode, 3);
    const int64_t need = cuda::linear_scratch_elems(m.lin, T);
    ASSERT_EQ(need, mode == Mode::PerTensor ? N * K : (T * K + 1) / 2);
    // The scratch one element short: refused at 33 tokens.
    cuda::DeviceBuffer small_scratch(size_t(need - 1) * 2), scratch(size_t(need) * 2);
    EXPECT_THROW(cuda::linear(m.lin, x.as<cuda::bf16_t>(), y.array<float>(), T, small_scratch.array<cuda::bf16_t>(),
                              nullptr, cuda::KernelPlan{}),
                 Error)
        << name_of(mode);
    // The output one row short.
    EXPECT_THROW(cuda::linear(m.lin, x.as<cuda::bf16_t>(), short_y, T, scratch.array<cuda::bf16_t>(), nullptr,
                              cuda::KernelPlan{}),
                 Error)
        << name_of(mode);
    // At GEMV sizes no scratch is needed.
    EXPECT_NO_THROW(cuda::linear(m.lin, x.as<cuda::bf16_t>(), short_y, 16, cuda::DeviceArray<cuda::bf16_t>{}, nullptr,
                                 cuda::KernelPlan{}))
        << name_of(mode);
    // The GEMV's own limits: 17 tokens, widths that are not a multiple of 16.
    EXPECT_THROW(cuda::fp8_gemv(m.lin, x.as<cuda::bf16_t>(), y.as<float>(), 17, nullptr), Error);
    cuda::DeviceLinear narrow = m.lin;
    narrow.in = 88;
    EXPECT_THROW(cuda::fp8_gemv(narrow, x.as<cuda::bf16_t>(), y.as<float>(), 1, nullptr), Error);
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fathom
