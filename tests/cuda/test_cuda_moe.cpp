// The tensor-core expert kernels on packed NVFP4 and FP8 weights (src/kernels/cuda/moe_packed.cu)
// against a double-precision host product of the same quantized weights, and their batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_fp4_rig.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using testing::from_bf16;
using testing::to_bf16;

using cuda::MoeFp4Rig;
using MoeCase = cuda::MoeFp4Shape;
using cuda::moe_row_error;

// Both packed formats: NVFP4 (per-16 e4m3 scales, a global scale) and FP8 with 128 x 128 block
// scales (Qwen's FP8 releases), every decode and prefill variant.
void expect_matches_host_reference(cuda::PackedFormat format) {
  // The fixtures' shape (k of down = 32, padded to a 64-wide slab), a mid shape, uneven widths
  // (rows and k not multiples of the 16 x 64 slab or the 128 x 128 scale block), and 397B's
  // widths with few experts (host memory for the reference).
  for (const MoeCase mc : {MoeCase{8, 2, 64, 32}, MoeCase{16, 4, 256, 128}, MoeCase{6, 3, 208, 336},
                           MoeCase{4, 2, 4096, 1024}}) {
    const int max_T = 150;
    MoeFp4Rig rig(mc, max_T, 7, true, format);
    for (const int T : {1, 5, 64, 150}) {  // decode kernels up to kMoeFp4SmallT, prefill kernels above
     const bool small = T <= cuda::kMoeFp4SmallT;
     for (int v = 0; v < (small ? cuda::moe_fp4_small_variants() : cuda::moe_fp4_large_variants()); ++v) {
      rig.plan = small ? cuda::MoeFp4Plan::decode_variant(v) : cuda::MoeFp4Plan::prefill_variant(v);
      const std::vector<float> y = rig.run(T);
      double worst = 0;
      for (int t = 0; t < T; t += (T > 8 ? 7 : 1)) {
        for (int n = 0; n < rig.H(); ++n) ASSERT_TRUE(std::isfinite(y[size_t(t) * rig.H() + n]));
        worst = std::max(worst, moe_row_error(y.data() + size_t(t) * rig.H(), rig.reference(t)));
      }
      // fp32 sums of exact bf16 products; the bf16 rounding of h is the only loss (2^-9 relative).
      EXPECT_LT(worst, 1e-2) << "H=" << mc.H << " I=" << mc.I << " E=" << mc.E << " T=" << T << " variant " << v;
      if (v == 0) printf("H=%d I=%d E=%d K=%d T=%d: max row error %.2e\n", mc.H, mc.I, mc.E, mc.K, T, worst);
     }
     rig.plan = {};
    }
  }
}

TEST(CudaMoeFp4, MatchesHostReference) { expect_matches_host_reference(cuda::PackedFormat::Nvfp4); }
TEST(CudaMoeFp8, MatchesHostReference) { expect_matches_host_reference(cuda::PackedFormat::Fp8); }

// A token's output has the same bits whatever the other tokens of the step, for every step up to
// kMoeFp4SmallT tokens (decode and speculative verify steps).
TEST(CudaMoePacked, DecodeStepsAreBatchInvariant) {
  for (const cuda::PackedFormat format : {cuda::PackedFormat::Nvfp4, cuda::PackedFormat::Fp8}) {
    MoeFp4Rig rig(MoeCase{32, 8, 512, 256}, cuda::kMoeFp4SmallT, 11, true, format);
    const std::vector<float> full = rig.run(cuda::kMoeFp4SmallT);
    for (const int T : {1, 2, 5, 17}) {
      const std::vector<float> y = rig.run(T);
      ASSERT_EQ(std::memcmp(y.data(), full.data(), y.size() * 4), 0) << "T=" << T << " fp8 " << (format == cuda::PackedFormat::Fp8);
    }
  }
}


// The decode variants' sums run in an order fixed by their warp splits (warp w of W takes slabs
// w, w + W, ...): how many slabs a warp has in flight and how many blocks share an SM must not
// change a bit (the tuner groups candidates by their bits; speculative decoding needs one group).
// Variants are grouped by their gate/up and down warp counts (from their names) and compared
// within each group.
TEST(CudaMoePacked, VariantsOfOneWarpSplitHaveTheSameBits) {
  for (const cuda::PackedFormat format : {cuda::PackedFormat::Nvfp4, cuda::PackedFormat::Fp8}) {
    MoeFp4Rig rig(MoeCase{32, 8, 512, 256}, 8, 13, true, format);
    for (const int T : {1, 5}) {
      std::map<std::string, std::pair<int, std::vector<float>>> first;  // warp split -> (variant, output)
      int compared = 0;
      for (int v = 0; v < cuda::moe_fp4_small_variants(); ++v) {
        const std::string name = cuda::moe_fp4_small_variant_name(v);
        const size_t down = name.find(" down ");
        int gate_warps = 0, down_warps = 0;
        ASSERT_TRUE(down != std::string::npos && std::sscanf(name.c_str(), "gate %dw/", &gate_warps) == 1 &&
                    std::sscanf(name.c_str() + down, " down %dw/", &down_warps) == 1)
            << name;
        rig.plan = cuda::MoeFp4Plan::decode_variant(v);
        std::vector<float> y = rig.run(T);
        auto [it, fresh] = first.try_emplace(std::to_string(gate_warps) + "/" + std::to_string(down_warps), v, y);
        if (fresh) continue;
        ++compared;
        EXPECT_EQ(std::memcmp(y.data(), it->second.second.data(), y.size() * 4), 0)
            << "variant " << v << " (" << name << ") against variant " << it->second.first << ", T=" << T;
      }
      EXPECT_GE(compared, 4) << "too few variants share a warp split to compare";
      rig.plan = {};
    }
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

// Softmax + top-k (moe_topk, whose per-token routine moe_route and moe_topk_group share) against a
// double-precision host softmax: the ids in the order of larger probability, ties to the lower id
// (logits on a coarse grid, so ties are common), the weights within float rounding, with and
// without renormalisation. Expert counts at and around the sizes where a lane holds 4, 8 or 32
// logits, and K past a warp's 32 lanes.
TEST(CudaRouter, TopkMatchesHostSoftmaxTopk) {
  std::mt19937 rng(77);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int T = 5;
  for (const int E : {3, 64, 100, 128, 129, 256, 257, 512, 513, 1000, 1024})
    for (const int K : {1, 3, 8, 10, 33})
      for (const bool renorm : {true, false}) {
        if (K > E) continue;
        SCOPED_TRACE("E=" + std::to_string(E) + " K=" + std::to_string(K) + " renorm " + std::to_string(renorm));
        std::vector<float> logits(size_t(T) * E);
        for (float& v : logits) v = std::round(nd(rng) * 4.f) / 4.f;
        auto dl = cuda::DeviceBuffer::from_host(logits);
        cuda::DeviceBuffer ids(size_t(T) * K * 4), w(size_t(T) * K * 4);
        FATHOM_CUDA_CHECK(cudaMemset(ids.data(), 0xFF, ids.bytes()));
        cuda::moe_topk(dl.as<float>(), ids.as<int32_t>(), w.as<float>(), T, E, K, renorm, nullptr);
        std::vector<int32_t> got_ids(size_t(T) * K);
        std::vector<float> got_w(got_ids.size());
        FATHOM_CUDA_CHECK(cudaMemcpy(got_ids.data(), ids.data(), ids.bytes(), cudaMemcpyDeviceToHost));
        FATHOM_CUDA_CHECK(cudaMemcpy(got_w.data(), w.data(), w.bytes(), cudaMemcpyDeviceToHost));
        for (int t = 0; t < T; ++t) {
          const float* row = logits.data() + size_t(t) * E;
          const float mx = *std::max_element(row, row + E);
          std::vector<double> p(E);
          double sum = 0;
          for (int e = 0; e < E; ++e) sum += p[e] = std::exp(double(row[e]) - mx);
          std::vector<int> order(E);
          for (int e = 0; e < E; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
          double picked = 0;
          for (int k = 0; k < K; ++k) picked += p[order[k]] / sum;
          for (int k = 0; k < K; ++k) {
            ASSERT_EQ(got_ids[size_t(t) * K + k], order[k]) << "token " << t << " pick " << k;
            const double want = p[order[k]] / sum / (renorm ? picked : 1.0);
            EXPECT_NEAR(got_w[size_t(t) * K + k], want, 1e-5 * want) << "token " << t << " pick " << k;
          }
        }
      }
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
  std::vector<cuda::PackedMatrix> g, u, d;
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
  cuda::PackedExperts ex{E, I, H, tg.as<cuda::PackedMatrix>(), tu.as<cuda::PackedMatrix>(), td.as<cuda::PackedMatrix>()};
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
    const double combine_ms = median_ms([&](int) {
      cuda::moe_combine_pairs(po.as<float>(), y.as<float>(), T, K, H, nullptr, nullptr, 1, nullptr);
    });
    const bool small = T <= cuda::kMoeFp4SmallT;
    const int variants = small ? cuda::moe_fp4_small_variants() : cuda::moe_fp4_large_variants();
    for (int v = 0; v < variants; ++v) {
      const cuda::MoeFp4Plan plan = small ? cuda::MoeFp4Plan::decode_variant(v) : cuda::MoeFp4Plan::prefill_variant(v);
      const int tile = cuda::moe_fp4_tile_tokens(ex, T, K, plan);  // the variant's own tiles (p4: 128 tokens)
      const double group_ms = median_ms([&](int r) {
        cuda::moe_group_pairs(dids.as<int32_t>() + size_t(r) * P_max, P, E, gs, tile, nullptr);
      });
      const double ms = median_ms([&](int r) {
        cuda::moe_experts_packed(ex, dx.as<cuda::bf16_t>(), dids.as<int32_t>() + size_t(r) * P_max, dw.as<float>(),
                              h.as<cuda::bf16_t>(), po.as<float>(), y.as<float>(), T, K, nullptr, nullptr, 1, gs,
                              nullptr, plan);
      });
      const double gemm_ms = ms - group_ms - combine_ms;
      printf("T=%4d %-22s all %.4f ms (group %.4f, combine %.4f, GEMMs %.4f): %.1f MB of experts -> %.2f TB/s "
             "(GEMMs alone %.2f TB/s), %.1f TFLOP/s\n",
             T, (small ? cuda::moe_fp4_small_variant_name(v) : cuda::moe_fp4_large_variant_name(v)).c_str(), ms,
             group_ms, combine_ms, gemm_ms, bytes / 1e6, bytes / ms / 1e9, bytes / gemm_ms / 1e9,
             2.0 * P * 3.0 * H * I / ms / 1e9);
    }
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fathom
