// The tensor-core NVFP4 expert kernels (src/kernels/cuda/moe_fp4.cu) against a double-precision
// host product of the same NVFP4 weights, and their batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

float e4m3_value(uint8_t b) {
  const int E = (b >> 3) & 0xF, M = b & 7;
  const float v = E == 0 ? std::ldexp(float(M) / 8.f, -6) : std::ldexp(1.f + float(M) / 8.f, E - 7);
  return (b & 0x80) ? -v : v;
}
float e2m1_value(int code) {
  static const float lut[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -lut[code & 7] : lut[code & 7];
}

// One NVFP4 matrix on the host: codes, scales, and its exact dequantized values.
struct HostFp4 {
  int rows, k;
  std::vector<uint8_t> codes, scales;
  float global;
  std::vector<float> w;  // [rows, k] (exact: code x scale, times the global scale)
};

HostFp4 random_fp4(int rows, int k, std::mt19937& rng) {
  HostFp4 m{rows, k, std::vector<uint8_t>(size_t(rows) * k / 2), std::vector<uint8_t>(size_t(rows) * k / 16), 0.f, {}};
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 99);
  for (auto& c : m.codes) c = uint8_t(byte(rng));
  // Mostly normal scales around 1, some e4m3 subnormals, a few zeros and the largest value.
  for (auto& s : m.scales) {
    const int r = pick(rng);
    s = r < 4 ? 0 : r < 12 ? uint8_t(1 + byte(rng) % 7) : r < 14 ? 0x7e : uint8_t(0x30 + byte(rng) % 16);
  }
  m.global = 0.02f;
  m.w.resize(size_t(rows) * k);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < k; ++i) {
      const int code = (m.codes[(size_t(r) * k + i) / 2] >> ((i & 1) * 4)) & 0xF;
      m.w[size_t(r) * k + i] = e2m1_value(code) * e4m3_value(m.scales[size_t(r) * (k / 16) + i / 16]) * m.global;
    }
  return m;
}

struct DeviceFp4 {
  cuda::DeviceBuffer codes, scales;
  cuda::PackedFp4 desc;
};

DeviceFp4 pack(const HostFp4& m) {
  DeviceFp4 d;
  auto src_codes = cuda::DeviceBuffer::from_host(m.codes);
  auto src_scales = cuda::DeviceBuffer::from_host(m.scales);
  d.codes = cuda::DeviceBuffer(size_t(cuda::packed_fp4_code_bytes(m.rows, m.k)));
  d.scales = cuda::DeviceBuffer(size_t(cuda::packed_fp4_scale_bytes(m.rows, m.k)));
  d.desc = cuda::pack_fp4(src_codes.as<uint8_t>(), src_scales.as<uint8_t>(), m.global, m.rows, m.k,
                          d.codes.as<uint8_t>(), d.scales.as<uint16_t>(), nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

struct MoeCase {
  int E, K, H, I;
};

class MoeFp4Rig {
 public:
  MoeFp4Rig(const MoeCase& mc, int max_tokens, uint32_t seed) : c_(mc), max_T_(max_tokens), rng_(seed) {
    std::vector<cuda::PackedFp4> g, u, d;
    for (int e = 0; e < c_.E; ++e) {
      host_.push_back({random_fp4(c_.I, c_.H, rng_), random_fp4(c_.I, c_.H, rng_), random_fp4(c_.H, c_.I, rng_)});
      for (int m = 0; m < 3; ++m) dev_.push_back(pack(host_.back()[m]));
      g.push_back(dev_[dev_.size() - 3].desc);
      u.push_back(dev_[dev_.size() - 2].desc);
      d.push_back(dev_[dev_.size() - 1].desc);
    }
    tables_[0] = cuda::DeviceBuffer::from_host(g);
    tables_[1] = cuda::DeviceBuffer::from_host(u);
    tables_[2] = cuda::DeviceBuffer::from_host(d);
    ex_.num = c_.E;
    ex_.inter = c_.I;
    ex_.hidden = c_.H;
    ex_.gate = tables_[0].as<cuda::PackedFp4>();
    ex_.up = tables_[1].as<cuda::PackedFp4>();
    ex_.down = tables_[2].as<cuda::PackedFp4>();
    // Inputs for max_T tokens: bf16 activations, distinct experts per token, positive weights.
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> uw(0.05f, 1.f);
    x_.resize(size_t(max_T_) * c_.H);
    for (auto& v : x_) v = to_bf16(nd(rng_));
    ids_.resize(size_t(max_T_) * c_.K);
    w_.resize(ids_.size());
    std::vector<int> perm(c_.E);
    for (int t = 0; t < max_T_; ++t) {
      for (int e = 0; e < c_.E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int k = 0; k < c_.K; ++k) ids_[size_t(t) * c_.K + k] = perm[k], w_[size_t(t) * c_.K + k] = uw(rng_);
    }
    const int P = max_T_ * c_.K;
    group_buf_ = cuda::DeviceBuffer(size_t(cuda::moe_group_scratch_ints(P, c_.E)) * 4);
    group_ = cuda::moe_group_scratch(group_buf_.as<int32_t>(), P, c_.E);
    dx_ = cuda::DeviceBuffer::from_host(x_);
    dids_ = cuda::DeviceBuffer::from_host(ids_);
    dw_ = cuda::DeviceBuffer::from_host(w_);
    h_ = cuda::DeviceBuffer(size_t(P) * c_.I * 2);
    pair_out_ = cuda::DeviceBuffer(size_t(P) * c_.H * 4);
    y_ = cuda::DeviceBuffer(size_t(max_T_) * c_.H * 4);
  }

  // The kernels' output for the first T tokens, [T, H].
  std::vector<float> run(int T) {
    cuda::moe_experts_fp4(ex_, dx_.as<cuda::bf16_t>(), dids_.as<int32_t>(), dw_.as<float>(), h_.as<cuda::bf16_t>(),
                          pair_out_.as<float>(), y_.as<float>(), T, c_.K, nullptr, nullptr, 1, group_, nullptr);
    std::vector<float> y(size_t(T) * c_.H);
    FATHOM_CUDA_CHECK(cudaMemcpy(y.data(), y_.data(), y.size() * 4, cudaMemcpyDeviceToHost));
    return y;
  }

  // Host reference of token t: h rounded to bf16 as the kernels store it (cached: every kernel
  // variant is checked against it).
  const std::vector<double>& reference(int t) {
    auto it = ref_cache_.find(t);
    if (it == ref_cache_.end()) it = ref_cache_.emplace(t, compute_reference(t)).first;
    return it->second;
  }
  std::vector<double> compute_reference(int t) const {
    std::vector<double> y(c_.H, 0.0);
    std::vector<double> h(c_.I);
    for (int k = 0; k < c_.K; ++k) {
      const int e = ids_[size_t(t) * c_.K + k];
      const auto& m = host_[e];
      for (int i = 0; i < c_.I; ++i) {
        double g = 0, u = 0;
        for (int j = 0; j < c_.H; ++j) {
          const double xv = from_bf16(x_[size_t(t) * c_.H + j]);
          g += m[0].w[size_t(i) * c_.H + j] * xv;
          u += m[1].w[size_t(i) * c_.H + j] * xv;
        }
        h[i] = from_bf16(to_bf16(float(g / (1.0 + std::exp(-g)) * u)));
      }
      for (int n = 0; n < c_.H; ++n) {
        double acc = 0;
        for (int i = 0; i < c_.I; ++i) acc += m[2].w[size_t(n) * c_.I + i] * h[i];
        y[n] += w_[size_t(t) * c_.K + k] * acc;
      }
    }
    return y;
  }

  int H() const { return c_.H; }

 private:
  MoeCase c_;
  int max_T_;
  std::mt19937 rng_;
  std::vector<std::array<HostFp4, 3>> host_;
  std::vector<DeviceFp4> dev_;
  cuda::DeviceBuffer tables_[3];
  cuda::PackedExperts ex_;
  std::vector<uint16_t> x_;
  std::vector<int32_t> ids_;
  std::vector<float> w_;
  cuda::MoeGroupScratch group_;
  std::map<int, std::vector<double>> ref_cache_;
  cuda::DeviceBuffer group_buf_, dx_, dids_, dw_, h_, pair_out_, y_;
};

// Error of a token row: max |got - ref| / max |ref|.
double row_error(const float* got, const std::vector<double>& ref) {
  double worst = 0, scale = 1e-30;
  for (size_t n = 0; n < ref.size(); ++n) {
    worst = std::max(worst, std::fabs(double(got[n]) - ref[n]));
    scale = std::max(scale, std::fabs(ref[n]));
  }
  return worst / scale;
}

TEST(CudaMoeFp4, MatchesHostReference) {
  // The fixtures' shape (k of down = 32, padded to a 64-wide slab), a mid shape, and 397B's widths
  // with few experts (host memory for the reference).
  for (const MoeCase mc : {MoeCase{8, 2, 64, 32}, MoeCase{16, 4, 256, 128}, MoeCase{4, 2, 4096, 1024}}) {
    const int max_T = 150;
    MoeFp4Rig rig(mc, max_T, 7);
    for (const int T : {1, 5, 64, 150}) {  // decode kernels up to kMoeFp4SmallT, prefill kernels above
     const bool small = T <= cuda::kMoeFp4SmallT;
     for (int v = 0; v < (small ? cuda::moe_fp4_small_variants() : cuda::moe_fp4_large_variants()); ++v) {
      if (small) cuda::set_moe_fp4_small_variant(v);
      else cuda::set_moe_fp4_large_variant(v);
      const std::vector<float> y = rig.run(T);
      double worst = 0;
      for (int t = 0; t < T; t += (T > 8 ? 7 : 1)) {
        for (int n = 0; n < rig.H(); ++n) ASSERT_TRUE(std::isfinite(y[size_t(t) * rig.H() + n]));
        worst = std::max(worst, row_error(y.data() + size_t(t) * rig.H(), rig.reference(t)));
      }
      // fp32 sums of exact bf16 products; the bf16 rounding of h is the only loss (2^-9 relative).
      EXPECT_LT(worst, 1e-2) << "H=" << mc.H << " I=" << mc.I << " E=" << mc.E << " T=" << T << " variant " << v;
      if (v == 0) printf("H=%d I=%d E=%d K=%d T=%d: max row error %.2e\n", mc.H, mc.I, mc.E, mc.K, T, worst);
     }
     cuda::set_moe_fp4_small_variant(-1);
     cuda::set_moe_fp4_large_variant(0);
    }
  }
}

// A token's output has the same bits whatever the other tokens of the step, for every step up to
// kMoeFp4SmallT tokens (decode and speculative verify steps).
TEST(CudaMoeFp4, DecodeStepsAreBatchInvariant) {
  MoeFp4Rig rig(MoeCase{32, 8, 512, 256}, cuda::kMoeFp4SmallT, 11);
  const std::vector<float> full = rig.run(cuda::kMoeFp4SmallT);
  for (const int T : {1, 2, 5, 17}) {
    const std::vector<float> y = rig.run(T);
    ASSERT_EQ(std::memcmp(y.data(), full.data(), y.size() * 4), 0) << "T=" << T;
  }
}


// The routers' prefill product: fp32 weights and activations split into bf16 parts, one bf16
// GEMM over three times the width. It must stay within about 2^-16 of the exact product (a
// plain bf16 product is off by about 2^-9, enough to flip near-tied expert choices).
TEST(CudaRouter, SplitBf16ProductMatchesFp32) {
  const int E = 512, H = 4096, T = 64;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(size_t(E) * H), x(size_t(T) * H);
  for (float& v : w) v = nd(rng) / 64.f;
  for (float& v : x) v = nd(rng);
  auto dw = cuda::DeviceBuffer::from_host(w), dx = cuda::DeviceBuffer::from_host(x);
  cuda::DeviceBuffer w3(size_t(E) * 3 * H * 2), x3(size_t(T) * 3 * H * 2), y(size_t(T) * E * 4);
  cuda::split_bf16x3(dw.as<float>(), w3.as<cuda::bf16_t>(), E, H, /*weights=*/true, nullptr);
  cuda::split_bf16x3(dx.as<float>(), x3.as<cuda::bf16_t>(), T, H, /*weights=*/false, nullptr);
  cuda::gemm_bf16(x3.as<cuda::bf16_t>(), w3.as<cuda::bf16_t>(), y.as<float>(), T, E, 3 * H, nullptr);
  std::vector<float> got(size_t(T) * E);
  FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), y.data(), got.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0, scale = 0;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double ref = 0;
      for (int k = 0; k < H; ++k) ref += double(x[size_t(t) * H + k]) * double(w[size_t(e) * H + k]);
      worst = std::max(worst, std::fabs(ref - double(got[size_t(t) * E + e])));
      scale = std::max(scale, std::fabs(ref));
    }
  printf("split bf16 router product: max error %.2e of max |logit| %.2e (%.2e relative)\n", worst, scale,
         worst / scale);
  EXPECT_LT(worst / scale, 1e-4);
}

// Prefill steps take the router's split activations from the norm before the MoE block: they must
// be split_bf16x3 of the norm's fp32 output, bit for bit, on the vectorised path (n = 4096) and
// the scalar one (n = 102).
TEST(CudaRouter, NormWritesTheSplit) {
  for (const int n : {4096, 102}) {
    const int rows = 5;
    std::mt19937 rng(n);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(size_t(rows) * n), d(x.size()), w(n);
    for (float& v : x) v = nd(rng);
    for (float& v : d) v = nd(rng);
    for (float& v : w) v = 1.f + 0.1f * nd(rng);
    auto dx = cuda::DeviceBuffer::from_host(x), dd = cuda::DeviceBuffer::from_host(d);
    auto dw = cuda::DeviceBuffer::from_host(w);
    cuda::DeviceBuffer y(size_t(rows) * n * 2), y32(size_t(rows) * n * 4), y3(size_t(rows) * 3 * n * 2),
        ref3(size_t(rows) * 3 * n * 2);
    cuda::add_rms_norm(dx.as<float>(), dd.as<float>(), dw.as<float>(), y.as<cuda::bf16_t>(), rows, n, 1e-6f, false,
                       nullptr, y32.as<float>(), y3.as<cuda::bf16_t>());
    cuda::split_bf16x3(y32.as<float>(), ref3.as<cuda::bf16_t>(), rows, n, /*weights=*/false, nullptr);
    std::vector<uint16_t> got(size_t(rows) * 3 * n), want(got.size());
    FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), y3.data(), got.size() * 2, cudaMemcpyDeviceToHost));
    FATHOM_CUDA_CHECK(cudaMemcpy(want.data(), ref3.data(), want.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << "n " << n;
  }
}

// Not a test: a benchmark of the expert kernels alone at Qwen3.5-397B's expert shapes (512
// experts, 4096 x 1024, top-10), every small-kernel variant, random routing per repetition (so
// the selected experts come from HBM, not L2). Run on the GPU machine with
//   test_cuda --gtest_also_run_disabled_tests --gtest_filter='*KernelThroughput*'
TEST(CudaMoeFp4Bench, DISABLED_KernelThroughput) {
  const int E = 512, K = 10, H = 4096, I = 1024, reps = 21;
  std::vector<cuda::DeviceBuffer> store;
  std::vector<cuda::PackedFp4> g, u, d;
  cuda::DeviceBuffer stage(size_t(H) * I / 2 + size_t(H) * I / 16 + 256);
  uint64_t seed = 1;
  auto make = [&](int rows, int k) {
    cuda::fill_random_bytes(stage.as<uint8_t>(), int64_t(rows) * k / 2, seed++, 0xff, 0, nullptr);
    uint8_t* sc = stage.as<uint8_t>() + size_t(rows) * k / 2;
    cuda::fill_random_bytes(sc, int64_t(rows) * k / 16, seed++, 0x07, 0x30, nullptr);
    store.emplace_back(size_t(cuda::packed_fp4_code_bytes(rows, k)));
    cuda::DeviceBuffer& q = store.back();
    store.emplace_back(size_t(cuda::packed_fp4_scale_bytes(rows, k)));
    return cuda::pack_fp4(stage.as<uint8_t>(), sc, 0.01f, rows, k, q.as<uint8_t>(),
                          store.back().as<uint16_t>(), nullptr);
  };
  store.reserve(size_t(E) * 6);
  for (int e = 0; e < E; ++e) g.push_back(make(I, H)), u.push_back(make(I, H)), d.push_back(make(H, I));
  auto tg = cuda::DeviceBuffer::from_host(g), tu = cuda::DeviceBuffer::from_host(u);
  auto td = cuda::DeviceBuffer::from_host(d);
  cuda::PackedExperts ex{E, I, H, tg.as<cuda::PackedFp4>(), tu.as<cuda::PackedFp4>(), td.as<cuda::PackedFp4>()};
  const int T_max = 4096, P_max = T_max * K;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(size_t(reps) * P_max);
  std::vector<int> perm(E);
  for (size_t t = 0; t < ids.size() / K; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int k = 0; k < K; ++k) std::swap(perm[k], perm[k + rng() % (E - k)]), ids[t * K + k] = perm[k];
  }
  std::vector<float> w(size_t(P_max), 0.1f);
  std::vector<uint16_t> x(size_t(T_max) * H, to_bf16(0.5f));
  auto dids = cuda::DeviceBuffer::from_host(ids), dw = cuda::DeviceBuffer::from_host(w);
  auto dx = cuda::DeviceBuffer::from_host(x);
  cuda::DeviceBuffer h(size_t(P_max) * I * 2), po(size_t(P_max) * H * 4), y(size_t(T_max) * H * 4);
  cuda::DeviceBuffer gb(size_t(cuda::moe_group_scratch_ints(P_max, E)) * 4);
  const cuda::MoeGroupScratch gs = cuda::moe_group_scratch(gb.as<int32_t>(), P_max, E);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const double expert_bytes = 3.0 * (double(H) * I / 2 + double(H) * I / 16);
  auto median_ms = [&](auto&& fn) {
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(a);
      fn(r);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  std::vector<int> sizes = {1, 2, 5, 8, 16, 32, 64, 1024, 4096};
  if (const char* only = std::getenv("FATHOM_MOE_BENCH_T")) {  // "1,4096": some sizes (e.g. for a profiler)
    sizes.clear();
    for (const char* p = only; *p;) {
      sizes.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
  }
  for (const int T : sizes) {
    const int P = T * K;
    const double distinct = E * (1.0 - std::pow(1.0 - double(K) / E, T));
    const double bytes = distinct * expert_bytes;
    const double group_ms = median_ms([&](int r) {
      const int tile = T <= cuda::kMoeFp4SmallT ? 8 : 64;
      cuda::moe_group_pairs(dids.as<int32_t>() + size_t(r) * P_max, P, E, gs, tile, nullptr);
    });
    const double combine_ms = median_ms([&](int) {
      cuda::moe_combine_pairs(po.as<float>(), y.as<float>(), T, K, H, nullptr, nullptr, 1, nullptr);
    });
    const bool small = T <= cuda::kMoeFp4SmallT;
    const int variants = small ? cuda::moe_fp4_small_variants() : cuda::moe_fp4_large_variants();
    for (int v = 0; v < variants; ++v) {
      if (small) cuda::set_moe_fp4_small_variant(v);
      else cuda::set_moe_fp4_large_variant(v);
      const double ms = median_ms([&](int r) {
        cuda::moe_experts_fp4(ex, dx.as<cuda::bf16_t>(), dids.as<int32_t>() + size_t(r) * P_max, dw.as<float>(),
                              h.as<cuda::bf16_t>(), po.as<float>(), y.as<float>(), T, K, nullptr, nullptr, 1, gs,
                              nullptr);
      });
      const double gemm_ms = ms - group_ms - combine_ms;
      printf("T=%4d %-22s all %.4f ms (group %.4f, combine %.4f, GEMMs %.4f): %.1f MB of experts -> %.2f TB/s "
             "(GEMMs alone %.2f TB/s), %.1f TFLOP/s\n",
             T, (small ? cuda::moe_fp4_small_variant_name(v) : cuda::moe_fp4_large_variant_name(v)).c_str(), ms,
             group_ms, combine_ms, gemm_ms, bytes / 1e6, bytes / ms / 1e9, bytes / gemm_ms / 1e9,
             2.0 * P * 3.0 * H * I / ms / 1e9);
    }
  }
  cuda::set_moe_fp4_small_variant(-1);
  cuda::set_moe_fp4_large_variant(0);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fathom
